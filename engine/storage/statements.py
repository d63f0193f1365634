"""Compiled statements: SQL compiled once per dialect and run on the driver, for the hot paths.

SQLAlchemy's execution machinery costs more than SQLite itself on the engine's hot paths: building
a statement and per-row parameter dicts for a 10,000-row batch, or ~0.1 ms of overhead for a
point statement whose query takes a few microseconds. So those paths compile their statements
once per dialect and hand the DBAPI plain tuples: ``BulkStatement`` (``executemany`` of table
upserts, versions, the replication queue), ``FastStatement`` (the few statements on the latency
path of every commit), ``system_upsert`` (INSERT ... ON CONFLICT DO UPDATE of a system table).

What is tricky: the SQL is whatever the dialect compiles, so these paths stay dialect-neutral, but
the parameters' style is the dialect's too (positional or named): a statement keeps the order its
compilation gave and maps the caller's values onto it, handing them over untouched when the order
already matches. A dialect whose driver takes named parameters (psycopg's ``%(name)s``) is
compiled in its positional form instead (``%s``, :func:`positional`): tuples cost less than a dict
per row. The caches are filled without a lock: two threads compiling the same statement at once
both store an equal result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

_POSITIONAL: dict[str, sa.Dialect] = {}


def positional(dialect: sa.Dialect) -> sa.Dialect:
    """``dialect``, or the same dialect with positional parameters (``format``) when its default is
    named: what the hot paths compile with, so they can hand the driver tuples."""
    if dialect.positional:
        return dialect
    found = _POSITIONAL.get(dialect.name)
    if found is None:
        found = _POSITIONAL[dialect.name] = type(dialect)(paramstyle="format")  # type: ignore[call-arg]
    return found


class BulkStatement:
    """A statement compiled once for a dialect and run with ``executemany`` on plain tuples.

    Building SQLAlchemy statements and per-row parameter dicts costs more than SQLite itself for a
    10,000-row batch; the hot write paths (table upserts, versions, the replication queue) compile
    their statements once and hand the DBAPI tuples in table-column order. The SQL is whatever the
    dialect compiles, so the path stays dialect-neutral.
    """

    def __init__(self, stmt: sa.ClauseElement, dialect: sa.Dialect) -> None:
        compiled = cast(SQLCompiler, stmt.compile(dialect=positional(dialect)))
        self.sql = str(compiled)
        self.positional = bool(compiled.positional)
        self.names: list[str] = list(compiled.positiontup or []) if self.positional else list(compiled.params)
        #: the values the statement itself gives its parameters (a LIMIT's, say)
        self.defaults: dict[str, Any] = dict(compiled.params)
        #: PostgreSQL: the INSERT with one array per column (see :func:`_array_form`), or None
        self.arrays: _ArrayForm | None = _array_form(stmt, compiled, self.names) \
            if dialect.name == "postgresql" and self.positional else None
        #: PostgreSQL: a plain INSERT (no ON CONFLICT, no RETURNING) as a binary COPY (see
        #: :class:`_CopyForm`), or None
        self.copy: _CopyForm | None = _copy_form(stmt, compiled, self.names) \
            if self.arrays is not None and self.arrays.keys is None else None

    def params(self, values: tuple[Any, ...], columns: list[str]) -> tuple[Any, ...] | dict[str, Any]:
        """Parameters for one execution, ``values`` in the order of ``columns``."""
        if self.positional and self.names == columns:
            return values
        by_name = dict(zip(columns, values, strict=True))
        return tuple(by_name[n] for n in self.names) if self.positional else {n: by_name[n] for n in self.names}

    def query(self, conn: sa.Connection, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[Any]:
        """Run a query once on the driver (:func:`on_driver`) and return its rows."""
        return on_driver(conn, self.sql, params)

    def renamed(self, old: str, new: str) -> BulkStatement:
        """The same statement over tables named with ``new`` in place of ``old`` (see
        :class:`SharedSql`); only for a statement without PostgreSQL forms."""
        assert self.arrays is None and self.copy is None
        other = copy.copy(self)
        other.sql = self.sql.replace(old, new)
        return other

    def first(self, conn: sa.Connection, values: dict[str, Any]) -> Any:
        """Run a query once on the driver with the named ``values`` (a parameter not among them takes
        the value the statement gave it, a LIMIT's say) and return its first row, or None."""
        params = tuple(values[n] if n in values else self.defaults[n] for n in self.names) \
            if self.positional else {n: values[n] if n in values else self.defaults[n] for n in self.names}
        return next(on_driver_each(conn, self.sql, [params]))

    def count(self, conn: sa.Connection, values: dict[str, Any]) -> int:
        """Run a write (an UPDATE or DELETE) once on the driver with the named ``values`` (a name may
        stand at several places of the statement) and return the number of rows it changed."""
        params = tuple(values[n] for n in self.names) if self.positional else {n: values[n] for n in self.names}
        return on_driver_count(conn, self.sql, params)

    def run(self, conn: sa.Connection, rows: list[tuple[Any, ...]], columns: list[str]) -> None:
        """``rows`` are tuples in the order of ``columns``."""
        if not rows:
            return
        if self.copy is not None and len(rows) >= COPY_FORM_ROWS:
            self.copy.run(conn, rows, None if self.names == columns else [columns.index(n) for n in self.names])
            return
        if self.arrays is not None and len(rows) >= ARRAY_FORM_ROWS:
            self.arrays.run(conn, rows, None if self.names == columns else [columns.index(n) for n in self.names])
            return
        if self.positional and self.names == columns:
            on_driver(conn, self.sql, rows, many=True)
            return
        index = {name: i for i, name in enumerate(columns)}
        if self.positional:
            order = [index[n] for n in self.names]
            on_driver(conn, self.sql, [tuple(r[i] for i in order) for r in rows], many=True)
        else:
            on_driver(conn, self.sql, [{n: r[index[n]] for n in self.names} for r in rows], many=True)


class SharedSql:
    """Compiled SQL shared by the tables of one shape, on SQLite.

    Every dynamic table has its own SQL tables (``rt_t<n>``, ``rt_t<n>_versions``) and so its own
    compiled statements. Compiling one costs SQLAlchemy a millisecond or more (an IN list of keys,
    an upsert); a thousand tables written for the first time paid it a thousand times over on every
    engine (the first push into each replica table spent most of its time compiling). Tables of one
    shape (the same columns, keys and types) differ in SQLite's SQL by their name only, so the SQL
    compiled for the first is kept with its name replaced by a mark, and the others take it with
    their own name. Only where no column name holds the table's name or the mark (the replacement
    could otherwise touch a column), and not on PostgreSQL (its array and COPY forms are built from
    the table's types and names: compiled per table, as before). A plain dict: a race compiles a
    statement twice, harmlessly."""

    MARK = "rt_tshared_mark"

    def __init__(self) -> None:
        self._sql: dict[tuple[Any, ...], Any] = {}

    @classmethod
    def applies(cls, conn: sa.Connection, sql_name: str, column_names: Iterable[str]) -> bool:
        return conn.dialect.name == "sqlite" and sql_name != cls.MARK and \
            not any(sql_name in c or cls.MARK in c for c in column_names)

    def get(self, key: tuple[Any, ...]) -> Any:
        return self._sql.get(key)

    def statement(self, conn: sa.Connection, table: sa.Table, name: str,
                  build: Callable[[], sa.ClauseElement]) -> BulkStatement:
        """``build()`` (a statement over ``table`` alone) compiled once per table (kept in its
        ``info``) and, where it :meth:`applies`, once per shape of table."""
        cache = table.info.setdefault("rt_statements", {})
        key = (name, conn.dialect.name)
        found = cache.get(key)
        if found is not None:
            return cast(BulkStatement, found)
        sharing = self.applies(conn, table.name, table.columns.keys())
        shape = ("table", name, conn.dialect.name, columns_shape(table))
        shared = self._sql.get(shape) if sharing else None
        if shared is not None:
            stmt = cache[key] = shared.renamed(self.MARK, table.name)
            return cast(BulkStatement, stmt)
        stmt = cache[key] = BulkStatement(build(), conn.dialect)
        if sharing:
            self._sql[shape] = stmt.renamed(table.name, self.MARK)
        return stmt

    def put(self, key: tuple[Any, ...], value: Any) -> None:
        self._sql[key] = value


def columns_shape(table: sa.Table) -> tuple[tuple[str, str, bool], ...]:
    """What the SQL of a statement over ``table`` depends on besides its name (``SharedSql``): each
    column with its type and whether it is a key."""
    return tuple((c.name, repr(c.type), c.primary_key) for c in table.columns)


#: the one registry of shared SQL (keys name the statement, the dialect and the tables' shape)
SHARED_SQL = SharedSql()


#: from this many rows on, a PostgreSQL INSERT runs once with an array per column
ARRAY_FORM_ROWS = 4
#: from this many rows on, a plain PostgreSQL INSERT is a binary COPY (below it a COPY's own round
#: trips - start, data, end - cost more than the array form's one statement)
COPY_FORM_ROWS = 64


class _CopyForm:
    """A PostgreSQL INSERT of many new rows as ``COPY t (a, b) FROM STDIN (FORMAT BINARY)``.

    The server's bulk-load path: no statement to parse or plan, no executor run per row or array to
    unnest, and rows arrive in the binary form psycopg writes in C. engine_bench's raw ceilings of
    the engine's sorted-table layout (10,000-row batches, the move of replaced images included):
    422,832 rows/s this way against 137,567 for the array form (9379c2f). Only for a plain INSERT:
    a COPY cannot say ON CONFLICT, so an upsert of keys that may exist stays in the array form
    (``sorted_rows.apply`` upserts the keys the move found with a row and COPYs the others).
    Runs on the DBAPI connection of ``conn``, inside its open transaction; the driver's errors are
    raised as SQLAlchemy's (a refused value is a ``DataError``, a lost connection an
    ``OperationalError``), as a statement's would be."""

    def __init__(self, sql: str, types: list[str], floats: list[int], booleans: list[int]) -> None:
        self.sql, self.types, self.floats, self.booleans = sql, types, floats, booleans

    def run(self, conn: sa.Connection, rows: list[tuple[Any, ...]], order: list[int] | None) -> None:
        """``rows`` in the statement's column order, or in another that ``order`` maps to it."""
        import psycopg  # (PostgreSQL only: the driver a PostgreSQL-backed engine has)

        if order is not None:
            rows = [tuple(r[i] for i in order) for r in rows]
        if self.floats or self.booleans:
            fixed = [(i, float) for i in self.floats] + [(i, bool) for i in self.booleans]
            converted = []
            for r in rows:
                values = list(r)
                for i, kind in fixed:
                    if values[i] is not None:
                        values[i] = kind(values[i])
                converted.append(tuple(values))
            rows = converted
        raw = cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)
        try:
            with raw.cursor() as cursor, cursor.copy(self.sql) as copy:
                copy.set_types(self.types)
                write = copy.write_row
                for row in rows:
                    write(row)
        except psycopg.Error as exc:
            raise _wrapped(conn, None, self.sql, exc) from exc


def _copy_form(stmt: sa.ClauseElement, compiled: SQLCompiler, names: list[str]) -> _CopyForm | None:
    """The binary COPY of a compiled PostgreSQL INSERT ... VALUES of one row into a table (no ON
    CONFLICT, no RETURNING), or None."""
    sql = str(compiled)
    if not isinstance(stmt, sa.sql.dml.Insert) or " ON CONFLICT " in sql or " RETURNING " in sql:
        return None
    table = stmt.table
    if not isinstance(table, sa.Table):
        return None
    dialect = compiled.dialect
    preparer = dialect.identifier_preparer
    types: list[str] = []
    floats: list[int] = []
    booleans: list[int] = []
    for i, name in enumerate(names):
        if name not in table.c:
            return None  # a parameter that is not one column's value
        placeholder = array_parameter(compiled.binds[name].type, dialect)
        if placeholder is None:
            return None
        # "%b::VARCHAR(16)[]" -> "varchar": the name psycopg knows the type by
        types.append(placeholder[len("%b::"):-len("[]")].split("(")[0].strip().lower())
        sql_type = compiled.binds[name].type
        if isinstance(sql_type, sa.Float):
            floats.append(i)
        elif isinstance(sql_type, sa.Boolean):
            booleans.append(i)
    target = preparer.format_table(table)
    columns = ", ".join(preparer.quote(n) for n in names)
    return _CopyForm(f"COPY {target} ({columns}) FROM STDIN (FORMAT BINARY)", types, floats, booleans)


class _ArrayForm:
    """A PostgreSQL INSERT of many rows as one statement: ``INSERT INTO t (a, b) SELECT * FROM
    unnest(%s::bigint[], %s::text[]) [ON CONFLICT ...]``, one array per column.

    ``executemany`` runs the statement once per row on the server (psycopg pipelines the round
    trips, but each row is still parsed into an executor run of its own): for a 10,000-row batch
    the server's per-statement work was most of an insert's time. One statement over arrays
    costs a fraction of it and keeps the ``ON CONFLICT`` of an upsert. Each column's values become
    one array of the column's SQL type; doubles are handed over as floats (a JSON ``1`` arrives as
    an int, and an array holds one type)."""

    def __init__(self, sql: str, floats: list[int], booleans: list[int], keys: list[int] | None) -> None:
        self.sql, self.floats, self.booleans, self.keys = sql, floats, booleans, keys

    def run(self, conn: sa.Connection, rows: list[tuple[Any, ...]], order: list[int] | None) -> None:
        """``rows`` in the statement's column order, or in another that ``order`` maps to it."""
        if self.keys is not None:
            # an upsert: one statement may not update a row twice, as executemany's rows in turn
            # did (the last one stays): keep each key's last row
            keys = self.keys if order is None else [order[i] for i in self.keys]
            last = {tuple(r[i] for i in keys): r for r in rows}
            if len(last) != len(rows):
                rows = list(last.values())
        arrays: list[Any] = [list(c) for c in zip(*rows, strict=True)]
        if order is not None:
            arrays = [arrays[i] for i in order]
        for i in self.floats:
            arrays[i] = [None if v is None else float(v) for v in arrays[i]]
        for i in self.booleans:
            arrays[i] = [None if v is None else bool(v) for v in arrays[i]]
        on_driver(conn, self.sql, tuple(arrays))


def _array_form(stmt: sa.ClauseElement, compiled: SQLCompiler, names: list[str]) -> _ArrayForm | None:
    """The array form of a compiled PostgreSQL INSERT ... VALUES of one row, or None if ``stmt`` is
    not one (a SELECT, a DELETE, an INSERT of expressions)."""
    if not isinstance(stmt, sa.sql.dml.Insert) or not names:
        return None
    sql = str(compiled)
    values = _values_clause(sql)
    if values is None or values.count("%s") != len(names):
        return None
    dialect = compiled.dialect
    casts: list[str] = []
    floats: list[int] = []
    booleans: list[int] = []
    for i, name in enumerate(names):
        cast_to = array_parameter(compiled.binds[name].type, dialect)
        if cast_to is None:
            return None
        casts.append(cast_to)
        sql_type = compiled.binds[name].type
        if isinstance(sql_type, sa.Float):
            floats.append(i)
        elif isinstance(sql_type, sa.Boolean):
            booleans.append(i)
    keys: list[int] | None = None
    if " ON CONFLICT " in sql:
        key_names = [c.name for c in stmt.table.primary_key.columns]  # type: ignore[attr-defined]
        if not key_names or not set(key_names) <= set(names):
            return None
        keys = [names.index(n) for n in key_names]
    return _ArrayForm(sql.replace(values, f"SELECT * FROM unnest({', '.join(casts)})"), floats, booleans, keys)


def array_parameter(sql_type: sa.types.TypeEngine[Any], dialect: sa.Dialect) -> str | None:
    """PostgreSQL: the placeholder of an array of ``sql_type`` values (``%b::BIGINT[]``), or None for
    a type that has no plain array form here. Binary (``%b``): psycopg dumps binary arrays in C, text
    ones in Python (a 10,000-element list costs milliseconds)."""
    sql_type = sql_type._variant_mapping.get(dialect.name, sql_type)  # with_variant(..., "postgresql")
    if isinstance(sql_type, sa.types.NullType | sa.JSON | sa.ARRAY):
        return None
    if getattr(sql_type, "collation", None):  # the column's collation is the table's business
        sql_type = sql_type.copy()
        sql_type.collation = None  # type: ignore[attr-defined]
    return f"%b::{sql_type.compile(dialect=dialect)}[]"


def _values_clause(sql: str) -> str | None:
    """The ``VALUES (...)`` of an INSERT of one row as SQLAlchemy compiled it (its placeholders may
    carry casts: ``%s::BIGINT``, ``%s::VARCHAR(16) COLLATE "C"``), or None."""
    start = sql.find(" VALUES (")
    if start < 0 or sql.find(" VALUES (", start + 1) >= 0:
        return None
    depth, quoted = 0, False
    for i in range(start + len(" VALUES "), len(sql)):
        ch = sql[i]
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return sql[start + 1:i + 1]
    return None


def bulk_insert(table: sa.Table, columns: list[str], conn: sa.Connection) -> BulkStatement:
    """INSERT of ``columns`` of ``table`` (rows as tuples in that order), compiled once per dialect."""
    key = (table.name, tuple(columns), conn.dialect.name)
    stmt = _BULK_INSERTS.get(key)
    if stmt is None:
        stmt = _BULK_INSERTS[key] = BulkStatement(
            table.insert().values({table.c[n]: sa.bindparam(n) for n in columns}), conn.dialect)
    return stmt


_BULK_INSERTS: dict[tuple[str, tuple[str, ...], str], BulkStatement] = {}


class FastStatement:
    """A statement compiled once per dialect and run on the DBAPI cursor of a connection.

    For the few statements on the latency path of every commit (prepare records, decisions,
    replication progress): SQLAlchemy's execution machinery costs ~0.1 ms a statement here, the
    query itself a few microseconds. ``build`` makes the statement with named bind parameters; the
    SQL is whatever the dialect compiles, so the path stays dialect-neutral. Bind parameters are
    named ``p_<name>`` (SQLAlchemy reserves column names in INSERT and UPDATE); ``run`` takes
    ``<name>=value``."""

    def __init__(self, build: Callable[[], sa.ClauseElement]) -> None:
        self._build = build
        self._compiled: dict[str, tuple[str, list[str] | None]] = {}

    @staticmethod
    def _keys_match(table: sa.Table, keys: tuple[str, ...]) -> list[sa.ColumnElement[bool]]:
        return [table.c[k] == sa.bindparam(f"p_{k}") for k in keys]

    @classmethod
    def insert(cls, table: sa.Table) -> FastStatement:
        """INSERT of one row (every column a parameter)."""
        return cls(lambda: table.insert().values({c.name: sa.bindparam(f"p_{c.name}") for c in table.columns}))

    @classmethod
    def update(cls, table: sa.Table, *keys: str, columns: tuple[str, ...] | None = None) -> FastStatement:
        """UPDATE of ``columns`` (default: every column but the keys) of the rows matching ``keys``."""
        names = columns or tuple(c.name for c in table.columns if c.name not in keys)
        return cls(lambda: table.update().where(*cls._keys_match(table, keys)).values(
            {n: sa.bindparam(f"p_{n}") for n in names}))

    @classmethod
    def delete(cls, table: sa.Table, *keys: str) -> FastStatement:
        return cls(lambda: table.delete().where(*cls._keys_match(table, keys)))

    @classmethod
    def select(cls, table: sa.Table, columns: tuple[str, ...], *keys: str) -> FastStatement:
        return cls(lambda: sa.select(*[table.c[n] for n in columns]).where(*cls._keys_match(table, keys)))

    def run(self, conn: sa.Connection, **params: Any) -> Any:
        """Execute with ``params``; returns the DBAPI cursor (``fetchone``, ``rowcount``)."""
        entry = self._compiled.get(conn.dialect.name)
        if entry is None:
            compiled = cast(SQLCompiler, self._build().compile(dialect=positional(conn.dialect)))
            entry = self._compiled[conn.dialect.name] = (
                str(compiled), list(compiled.positiontup or []) if compiled.positional else None)
        sql, order = entry
        cursor = conn.connection.cursor()
        try:
            if order is not None:
                cursor.execute(sql, tuple(params[n[2:]] for n in order))
            else:
                cursor.execute(sql, {f"p_{k}": v for k, v in params.items()})
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _wrapped(conn, cursor, sql, exc) from exc
        return cursor


def on_driver(conn: sa.Connection, sql: str, params: Any, many: bool = False) -> list[Any]:
    """Run compiled ``sql`` on the DBAPI cursor of ``conn`` (inside its open transaction): once with
    ``params``, or with each of them (``many``: nothing is returned); returns the rows it produced
    (none for a write without RETURNING).

    For the statements of every commit: SQLAlchemy's execution of a statement already compiled
    (``exec_driver_sql``: its context, result object and row processing) cost about as much Python
    as the rest of an XDCR table's commit of 100 rows. The driver's errors are raised as
    SQLAlchemy's, as a statement's would be (:func:`_wrapped`)."""
    cursor = conn.connection.cursor()
    try:
        if many:
            cursor.executemany(sql, params)
            return []
        cursor.execute(sql, params)
        return cast(list[Any], cursor.fetchall()) if cursor.description is not None else []
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _wrapped(conn, cursor, sql, exc) from exc
    finally:
        cursor.close()


def on_driver_count(conn: sa.Connection, sql: str, params: Any) -> int:
    """:func:`on_driver` of one write, returning the number of rows it changed (the cursor's
    ``rowcount``). Errors as :func:`on_driver`'s."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        return max(0, int(cursor.rowcount))
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _wrapped(conn, cursor, sql, exc) from exc
    finally:
        cursor.close()


def on_driver_each(conn: sa.Connection, sql: str, params: Iterable[Any]) -> Iterator[Any]:
    """Run compiled ``sql`` once with each of ``params`` on one DBAPI cursor of ``conn``, yielding
    the first row of each run (None if it produced none): the point lookups of a few keys, whose
    result objects SQLAlchemy would build at a higher cost than the queries. Errors as
    :func:`on_driver`'s."""
    cursor = conn.connection.cursor()
    try:
        for one in params:
            cursor.execute(sql, one)
            yield cursor.fetchone()
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _wrapped(conn, cursor, sql, exc) from exc
    finally:
        cursor.close()


def _wrapped(conn: sa.Connection, cursor: Any, sql: str, exc: Exception) -> sa.exc.DBAPIError:
    """What SQLAlchemy would have raised for a driver error on ``conn``: the same exception classes
    (``OperationalError``, ``IntegrityError``...) for callers, and a connection the server dropped
    invalidated, so the writer and readers replace it (as SQLAlchemy's own execution does)."""
    lost = conn.dialect.is_disconnect(cast(Any, exc), conn.connection.dbapi_connection, cursor)
    if lost:
        conn.invalidate(exc)
    return cast(sa.exc.DBAPIError, sa.exc.DBAPIError.instance(
        sql, None, exc, conn.dialect.loaded_dbapi.Error, connection_invalidated=lost, dialect=conn.dialect))


_SYSTEM_UPSERTS: dict[tuple[str, str], BulkStatement] = {}


def system_upsert(table: sa.Table, conn: sa.Connection) -> BulkStatement:
    """INSERT ... ON CONFLICT DO UPDATE of a system table, compiled once per dialect (hot paths)."""
    key = (table.name, conn.dialect.name)
    stmt = _SYSTEM_UPSERTS.get(key)
    if stmt is None:
        stmt = _SYSTEM_UPSERTS[key] = BulkStatement(upsert(table, conn.dialect), conn.dialect)
    return stmt


def upsert(table: sa.Table, dialect: sa.Dialect) -> sa.ClauseElement:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE: valid SQL for SQLite and PostgreSQL alike."""
    keys = [c.name for c in table.primary_key.columns]
    if dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        pg = postgresql.insert(table)
        return pg.on_conflict_do_update(index_elements=keys, set_={
            c.name: pg.excluded[c.name] for c in table.columns if c.name not in keys})
    from sqlalchemy.dialects import sqlite

    lite = sqlite.insert(table)
    return lite.on_conflict_do_update(index_elements=keys, set_={
        c.name: lite.excluded[c.name] for c in table.columns if c.name not in keys})
