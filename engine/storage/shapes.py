"""The SQL shape of user tables: the SQLAlchemy tables a dynamic table is stored in.

Why SQL tables per user table: a replica stored on PostgreSQL (or SQLite) must be readable by any SQL
tool, so a sorted dynamic table is a real table (key columns as the primary key, the schema's value
columns, and two hidden columns: ``_rt_ts``, the commit timestamp of the row's latest write, and
``_rt_lock_mask``, the lock groups that write took). Older versions live beside it in
``<table>_versions``: when a commit overwrites or deletes a row, the image it replaces moves there
(with its own timestamp and lock mask), and a delete leaves a tombstone there. A write of a new key
therefore costs one SQL row, not two - the bulk load of a table writes no version rows at all - and
the newest version of every key is always in the data table. An ordered table is one SQL table
keyed by (tablet, row index); a replicated table's replication queue is one too, its changes kept
as payloads (``UserTables.queue``).

What is tricky: a ``UserTables`` is one shape of a table, never changed once made: ``alter_table``
makes a new, wider one (``add_columns`` alters the SQL tables in the caller's transaction) and the
table publishes it after the commit, so a reader without the writer lock takes the shape and its
schema together and never names a column its SQL table lacks. Its compiled statements
(``UserTables.bulk``) are cached on the shape for the same reason.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.schema import CreateColumn

from ..schema import ColumnType, TableSchema
from .statements import SHARED_SQL, BulkStatement, SharedSql, columns_shape, upsert

TS = "_rt_ts"
DELETED = "_rt_deleted"
LOCK_MASK = "_rt_lock_mask"
TABLET_INDEX = "_rt_tablet_index"
ROW_INDEX = "_rt_row_index"
KIND = "_rt_kind"
PAYLOAD = "_rt_payload"
#: a replication queue row holds a run of this many changes of one commit (tablets/queue.py)
ROW_COUNT = "_rt_row_count"


#: strings compare byte by byte, as YT compares them (and as SQLite's BINARY collation does): on
#: PostgreSQL a column takes the database's collation unless told otherwise, and a database made with
#: en_US puts "B" after "a" - key order, range scans and tablet pivots would disagree with YT's
_BYTE_ORDER_TEXT = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


def sql_type(col_type: ColumnType) -> sa.types.TypeEngine[Any]:
    types: dict[ColumnType, sa.types.TypeEngine[Any]] = {
        ColumnType.INT64: sa.BigInteger(),
        ColumnType.UINT64: sa.BigInteger(),
        ColumnType.DOUBLE: sa.Double(),
        ColumnType.BOOLEAN: sa.Boolean(),
        ColumnType.STRING: _BYTE_ORDER_TEXT,
        ColumnType.ANY: _BYTE_ORDER_TEXT,
    }
    return types[col_type]


class UserTables:
    """The SQLAlchemy ``Table`` objects of one dynamic table (data, and versions when sorted)."""

    def __init__(self, sql_name: str, schema: TableSchema) -> None:
        self.sql_name = sql_name
        self.schema = schema
        self.metadata = sa.MetaData()
        if schema.is_sorted:
            cols = [sa.Column(c.name, sql_type(c.type), primary_key=c.is_key,
                              nullable=not c.is_key, autoincrement=False) for c in schema.columns]
            self.data = sa.Table(sql_name, self.metadata, *cols,
                                 sa.Column(TS, sa.BigInteger, nullable=False),
                                 sa.Column(LOCK_MASK, sa.Integer, nullable=False), sqlite_with_rowid=False)
            vcols = [sa.Column(c.name, sql_type(c.type), primary_key=c.is_key,
                               nullable=not c.is_key, autoincrement=False) for c in schema.columns]
            self.versions: sa.Table | None = sa.Table(
                f"{sql_name}_versions", self.metadata, *vcols,
                sa.Column(TS, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(DELETED, sa.Boolean, nullable=False),
                sa.Column(LOCK_MASK, sa.Integer, nullable=False),
                sa.Index(f"{sql_name}_versions_ts", TS),
                sqlite_with_rowid=False,
            )
        else:
            cols = [sa.Column(c.name, sql_type(c.type), nullable=True) for c in schema.columns]
            self.data = sa.Table(
                sql_name, self.metadata,
                sa.Column(TABLET_INDEX, sa.Integer, primary_key=True, autoincrement=False),
                sa.Column(ROW_INDEX, sa.BigInteger, primary_key=True, autoincrement=False),
                sa.Column(TS, sa.BigInteger, nullable=False),
                *cols,
                sqlite_with_rowid=False,
            )
            self.versions = None

    @classmethod
    def queue(cls, sql_name: str, schema: TableSchema) -> UserTables:
        """The replication queue of a replicated table: (tablet, row index) -> timestamped change."""
        tables = cls.__new__(cls)
        tables.sql_name = sql_name
        tables.schema = schema
        tables.metadata = sa.MetaData()
        tables.data = sa.Table(
            sql_name, tables.metadata,
            sa.Column(TABLET_INDEX, sa.Integer, primary_key=True, autoincrement=False),
            sa.Column(ROW_INDEX, sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column(TS, sa.BigInteger, nullable=False),
            sa.Column(KIND, sa.String(16), nullable=False),
            sa.Column(PAYLOAD, sa.Text, nullable=False),
            sa.Column(ROW_COUNT, sa.Integer, nullable=False, server_default=sa.text("1")),
            sqlite_with_rowid=False,
        )
        tables.versions = None
        return tables

    def bulk(self, name: str, conn: sa.Connection) -> BulkStatement:
        """A cached compiled statement: "insert:data", "upsert:data", "insert:versions", "point:data"
        (one row by its key), "max:data" (the largest value of the first key column), "compact:versions"
        (the compaction's delete of the versions no read at or after ``horizon`` can see: see
        :meth:`_compaction`)."""
        cache = self.__dict__.setdefault("_bulk", {})
        key = (name, conn.dialect.name)
        stmt = cache.get(key)
        if stmt is None and self.shares_sql(conn):
            shared = SHARED_SQL.get(("bulk", name, conn.dialect.name, self.shape))
            if shared is not None:
                stmt = cache[key] = shared.renamed(SharedSql.MARK, self.sql_name)
                return stmt
        if stmt is None:
            kind, which = name.split(":")
            table = self.data if which == "data" else self.versions
            assert table is not None
            if kind == "point":
                keys = [c for c in table.primary_key.columns]
                statement: sa.ClauseElement = sa.select(*[c for c in table.columns if c.name in self.schema.by_name]) \
                    .where(*[c == sa.bindparam(c.name) for c in keys])
            elif kind == "max":
                statement = sa.select(sa.func.max(table.c[self.schema.key_names[0]]))
            elif kind == "upsert":
                statement = upsert(table, conn.dialect)
            elif kind == "compact":
                statement = self._compaction()
            else:
                statement = table.insert()
            stmt = cache[key] = BulkStatement(statement, conn.dialect)
            if self.shares_sql(conn):
                SHARED_SQL.put(("bulk", name, conn.dialect.name, self.shape),
                               stmt.renamed(self.sql_name, SharedSql.MARK))
        return stmt

    @property
    def shape(self) -> tuple[Any, ...]:
        """What the SQL of this table's statements depends on besides its name (``SharedSql``): whether
        it keeps versions, and each column of its SQL table with its type and whether it is a key."""
        found = self.__dict__.get("_shape")
        if found is None:
            found = self.__dict__["_shape"] = (self.versions is not None, columns_shape(self.data))
        return cast(tuple[Any, ...], found)

    def shares_sql(self, conn: sa.Connection) -> bool:
        """Whether this table's statements may be shared with the tables of its shape (``SharedSql``)."""
        return SharedSql.applies(conn, self.sql_name, (c.name for c in self.data.columns))

    def _compaction(self) -> sa.ClauseElement:
        """DELETE the versions at or before ``:horizon`` that are tombstones or superseded at or before
        it (by a newer version, or by the data row): a read at or after the horizon sees, per key, the
        newest version at or before it, so it never sees them again. Compiled once per table (the
        compaction pass visits every table written since its last pass: built anew each time,
        SQLAlchemy's compiled cache, 500 statements, did not hold them at 1,000 tables)."""
        data, versions = self.data, self.versions
        assert versions is not None
        names = self.schema.key_names
        horizon = sa.bindparam("horizon", type_=sa.BigInteger)
        newer = versions.alias("newer")
        superseded = sa.or_(
            sa.exists().where(*[newer.c[k] == versions.c[k] for k in names],
                              newer.c[TS] > versions.c[TS], newer.c[TS] <= horizon),
            sa.exists().where(*[data.c[k] == versions.c[k] for k in names], data.c[TS] <= horizon))
        return versions.delete().where(versions.c[TS] <= horizon,
                                       sa.or_(versions.c[DELETED] == sa.true(), superseded))

    @property
    def data_columns(self) -> list[str]:
        return [c.name for c in self.data.columns]

    @property
    def version_columns(self) -> list[str]:
        assert self.versions is not None
        return [c.name for c in self.versions.columns]

    def create(self, conn: sa.Connection) -> None:
        self.metadata.create_all(conn)

    def add_columns(self, conn: sa.Connection, names: list[str]) -> None:
        """``ALTER TABLE ... ADD COLUMN`` for the columns ``names`` of this (new, wider) shape, on the
        data table and the versions table: in the caller's transaction, so a failure adds none.

        Rows already stored read the new columns as NULL. SQLAlchemy Core has no construct for an
        ALTER; the column's SQL is the dialect's own (``CreateColumn``), so this stays dialect-neutral.
        A replication queue stores changes as payloads and has no user columns: nothing to alter."""
        if KIND in self.data.c:
            return
        preparer = conn.dialect.identifier_preparer
        for table in (self.data, self.versions):
            if table is None:
                continue
            for name in names:
                spec = CreateColumn(table.c[name]).compile(dialect=conn.dialect)
                conn.execute(sa.text(f"ALTER TABLE {preparer.format_table(table)} ADD COLUMN {spec}"))

    def drop(self, conn: sa.Connection) -> None:
        self.metadata.drop_all(conn)

    # -- the SQL view of a table (docs/storage.md, "Reading tables with SQL") ------------------------------

    def create_view(self, conn: sa.Connection, path: str) -> str | None:
        """The view that shows this table's latest committed rows with the schema's columns only,
        named after the table's path (:func:`view_name`), so that ``psql`` or any SQL tool reads a
        table (a replica, say) as ``SELECT * FROM "//home/users"``; replaced if it exists. A
        replication queue (a replicated table keeps no rows) has none: None."""
        if KIND in self.data.c:
            return None
        name = view_name(path)
        preparer = conn.dialect.identifier_preparer
        columns = ", ".join(preparer.quote(c.name) for c in self.schema.columns)
        quoted = preparer.quote(name)
        conn.execute(sa.text(f"DROP VIEW IF EXISTS {quoted}"))
        conn.execute(sa.text(f"CREATE VIEW {quoted} AS SELECT {columns} FROM {preparer.format_table(self.data)}"))
        return name

    @staticmethod
    def drop_view(conn: sa.Connection, path: str) -> None:
        conn.execute(sa.text(f"DROP VIEW IF EXISTS {conn.dialect.identifier_preparer.quote(view_name(path))}"))


#: PostgreSQL's longest identifier, in bytes
MAX_VIEW_NAME_BYTES = 63


def view_name(path: str) -> str:
    """A table's view: its path (``//home/users``); a path longer than an identifier may be is cut
    and ends with ``~`` and 8 hex digits of its hash, so that two long paths never share a view."""
    if len(path.encode()) <= MAX_VIEW_NAME_BYTES:
        return path
    digest = hashlib.sha256(path.encode()).hexdigest()[:8]
    head = path.encode()[:MAX_VIEW_NAME_BYTES - 9].decode("utf-8", "ignore")
    return f"{head}~{digest}"

