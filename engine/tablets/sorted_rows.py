"""Sorted tables in SQL: the latest image of every row, its older versions, and reads at a timestamp.

A sorted table keeps two SQL tables (see ``storage``): the latest image of every row (what SQL
tools see) and the older versions and tombstones. A commit moves the images it replaces into the
versions, then writes the new ones; a read at a timestamp takes a row from the first when its
latest write is old enough, else the newest older version from the second; compaction drops the
versions no read at or after a horizon can see. An XDCR table's rows also get versions of their
own (``xdcr.py``), written in the same SQL transaction.

These are functions of a ``DynamicTable`` rather than methods so that ``table.py`` reads as "what
a table is and which kind of storage serves a call"; the ordered tables' rows are in
``ordered_rows.py``, the replication queue in ``queue.py``, the conflict memory in
``conflicts.py``. The table keeps thin methods for its callers.

What is tricky:

* Key lists. A commit or a conflict check binds thousands of keys; :func:`run_with_keys` compiles
  ``key IN (...)`` once per list length (a few lengths only: short lists are padded with their
  last key) and runs it straight on the driver. The compiled statements live on the table (its
  ``_key_statements``), filled only under the writer lock; an ``alter_table`` drops them
  (:func:`drop_compiled`), since the move of replaced images names every column.
* Lock-free readers (:func:`fetch_latest`, :func:`fetch_at`, :func:`query_source`) are given one
  ``UserTables`` shape and take the schema from it, never from the table: an ``alter_table`` may
  publish a new shape meanwhile, and a reader must not name a column its SQL table lacks.

Locking: :func:`apply` and :func:`compact` run inside a write transaction under
``Storage.write_lock`` (rollbacks undo their in-memory changes, ``on_rollback``); reads take a
read connection and no lock.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any, Protocol, cast

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from .. import yson_util
from ..query import QuerySource
from ..schema import ColumnType, TableSchema
from ..storage import (
    COPY_FORM_ROWS,
    DELETED,
    LOCK_MASK,
    SHARED_SQL,
    TS,
    SharedSql,
    UserTables,
    array_parameter,
    on_driver,
    on_driver_each,
    on_rollback,
    positional,
    read_locks_table,
)
from . import changes, xdcr
from .queue import QueueRun
from .writes import ImageRun, RowWrite, WriteKind

#: rows per SQL statement when we bind key lists
_CHUNK = 500
#: up to this many keys, a lookup runs one prepared point query per key
_POINT_LOOKUPS = 8
#: the table's attribute holding its compiled key-list statements (see :func:`run_with_keys`)
_KEY_STATEMENTS = "_key_statements"


class KeyedTable(Protocol):
    """What :func:`run_with_keys` uses of a table: its key columns (and its ``__dict__``, where the
    compiled statements are kept)."""

    schema: TableSchema


class SortedTable(Protocol):
    """What this module uses of a sorted table (``DynamicTable`` is one; the change log's part,
    ``changes.ChangeTable``, included): the module needs no import of ``table.py``, which imports it."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    replicated: bool
    tablet_rows: dict[int, list[int]]
    change_seq: int
    change_log: bool
    change_tail: changes.ChangeTail | None
    queue_tail: dict[int, list[QueueRun]]
    pivot_keys: list[list[Any]]
    compacted_until: int
    has_read_locks: bool
    xdcr_cluster_id: int | None
    xdcr_clock: Any

    @property
    def sorted(self) -> bool: ...

    @property
    def tablet_count(self) -> int: ...

    def key_of(self, row: dict[str, Any]) -> tuple[Any, ...]: ...

    def tablet_of_key(self, key: tuple[Any, ...]) -> int: ...


# -- applying writes -------------------------------------------------------------------------------

def apply(table: SortedTable, conn: sa.Connection, writes: list[RowWrite], commit_ts: int,
          keyed: dict[Any, RowWrite]) -> int:
    """Apply merged writes with ``commit_ts`` (``keyed``: the same writes by key); returns the number
    of data rows written. The caller remembers the commit for conflict checks (``conflicts.py``)."""
    data = table.sql.data
    versions = table.sql.versions
    assert versions is not None
    keys = table.schema.key_names
    names = [c.name for c in table.schema.columns]
    updates = [w for w in writes if w.kind is WriteKind.WRITE and w.update]
    current: dict[tuple[Any, ...], dict[str, Any]] = {}
    if updates:
        current = fetch_latest(table.sql, conn, [table.key_of(w.row) for w in updates])
    upserts: list[tuple[Any, ...]] = []
    deletes: list[tuple[Any, ...]] = []
    tombstones: list[tuple[Any, ...]] = []
    lock_rows: list[dict[str, Any]] = []
    locks_only: set[Any] = set()
    #: the change log (``changes.py``): (key, image or None for a delete), in write order
    logged: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]] = []
    nkeys = len(keys)
    key_positions = [names.index(k) for k in keys]
    # a whole-row write of every column is one C call from dict to tuple
    image_of = operator.itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],))
    write_kind = WriteKind.WRITE
    versioned = table.xdcr_cluster_id is not None
    # the change log's list is made only for a table that keeps one (most do not: changes.py)
    log = table.change_log or versioned
    keys_lead = key_positions == list(range(nkeys))
    for w in writes:
        row = w.row
        if w.kind is write_kind and not w.update:
            try:
                image = image_of(row)
            except KeyError:
                image = tuple(row.get(n) for n in names)
            upserts.append(image + (commit_ts, w.mask))
            if log:
                logged.append((image[:nkeys] if keys_lead else tuple(image[i] for i in key_positions), image))
            continue
        if w.kind is WriteKind.LOCK:
            locks_only.add(table.key_of(row))
            if w.strong or not w.shared:
                lock_rows.append({"table_id": table.table_id,
                                  "row_key": yson_util.dumps_text(list(table.key_of(row))),
                                  "lock_mask": w.mask, "timestamp": commit_ts})
            continue
        if w.kind is WriteKind.DELETE:
            deletes.append(tuple(row[k] for k in keys))
            tombstones.append((*(row[n] if n in keys else None for n in names), commit_ts, True, w.mask))
            logged.append((deletes[-1], None))
            continue
        merged = dict(current.get(table.key_of(row)) or {})
        merged.update(row)
        image = tuple(merged.get(n) for n in names)
        upserts.append((*image, commit_ts, w.mask))
        logged.append((tuple(image[i] for i in key_positions), image))
    changed = [k for k in keyed if k not in locks_only] if locks_only else list(keyed)
    existed: set[tuple[Any, ...]] = set()
    before: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    if changed and not _past_every_row(table, conn, changed):
        # the images this commit replaces become older versions (and tell the log which keys
        # had a row: an update, not an insert; an XDCR table's log also gets the whole image)
        if versioned:
            for result in run_with_keys(table, conn, "move_full", data,
                                        lambda key_in: _move_full_statement(table, key_in), changed):
                for image in result:
                    key = tuple(image[i] for i in key_positions)
                    existed.add(key)
                    before[key] = tuple(image)
        else:
            for result in run_with_keys(table, conn, "move", data,
                                        lambda key_in: _move_statement(table, key_in), changed):
                existed.update(map(tuple, result))
    if deletes:
        for _ in run_with_keys(table, conn, "remove", data, lambda key_in: data.delete().where(key_in), deletes):
            pass
        table.sql.bulk("insert:versions", conn).run(conn, tombstones, [*names, TS, DELETED, LOCK_MASK])
    _write_images(table, conn, upserts, [*names, TS, LOCK_MASK], existed, key_positions)
    if logged and log:
        single = len(table.pivot_keys) == 1
        extras = _xdcr_versions(table, conn, keyed, logged, commit_ts, before, names) if versioned else None
        if extras is not None and not table.change_log:
            # an XDCR table nobody streams: its shippers need its own changes only (docs/xdcr.md)
            own = [i for i, (key, _) in enumerate(logged) if getattr(keyed.get(key), "origin", None) is None]
            if len(own) < len(logged):
                logged, extras = [logged[i] for i in own], [extras[i] for i in own]
        changes.record(table, conn, commit_ts, (
            (0 if single else table.tablet_of_key(key),
             "delete" if image is None else "update" if key in existed else "insert",
             None if image is None else dict(zip(names, image, strict=True)),
             list(key) if image is None else None, None)
            for key, image in logged), extras)
    if lock_rows:
        _record_locks(conn, lock_rows)
        table.has_read_locks = True
    return len(upserts) + len(deletes)


#: from this many keys on, a commit asks whether they all sort after every row before the move
#: (below it the move's own probe is as cheap as the question)
PAST_ROWS_KEYS = 64


def _past_every_row(table: SortedTable, conn: sa.Connection, keys: list[tuple[Any, ...]]) -> bool:
    """Whether no key of a big batch can have a row: its first key column is an int64 and its
    smallest value there is above the largest the table holds (the batch of a table whose ids
    only grow - an append - and of an empty table). Then the move that turns replaced images into
    versions has nothing to move and is not run: on PostgreSQL its ``k = ANY(array)`` probe of
    10,000 keys costs the server about 8 ms, the largest of them about 0.1 ms (an index end).
    The writer lock is held: no other commit adds a row in between. Ints compare alike in Python
    and SQL; other types (collations, NaN, bigint-stored uint64) are not asked."""
    if len(keys) < PAST_ROWS_KEYS:
        return False
    first = table.schema.key_columns[0]
    if first.type is not ColumnType.INT64:
        return False
    lowest = min(map(_FIRST, keys))
    # compiled once per table and run on the driver: SQLAlchemy's building and execution of the
    # statement cost more than the index probe (a fifth of an XDCR table's commit of 100 rows)
    largest = table.sql.bulk("max:data", conn).query(conn)[0][0]
    return largest is None or lowest > largest


_FIRST = operator.itemgetter(0)


def apply_images(table: SortedTable, conn: sa.Connection, run: ImageRun, commit_ts: int) -> int:
    """:func:`apply` of whole-row writes given as images (an async replica's push in the columnar
    form): the same SQL - the replaced images moved to the versions, the new ones upserted - from
    the images as they came. Only for a table without a change log and without XDCR versions (the
    caller checks): those need each change's row."""
    names = [c.name for c in table.schema.columns]
    key_positions = [names.index(k) for k in table.schema.key_names]
    upserts = list(map(tuple.__add__, run.images, repeat((commit_ts, run.mask))))
    changed = list(dict.fromkeys(run.keys))
    existed: set[tuple[Any, ...]] = set()
    if changed and not _past_every_row(table, conn, changed):
        data = table.sql.data
        for result in run_with_keys(table, conn, "move", data, lambda key_in: _move_statement(table, key_in), changed):
            existed.update(map(tuple, result))
    _write_images(table, conn, upserts, [*names, TS, LOCK_MASK], existed, key_positions)
    return len(upserts)


def _write_images(table: SortedTable, conn: sa.Connection, upserts: list[tuple[Any, ...]], columns: list[str],
                  existed: set[tuple[Any, ...]], key_positions: list[int]) -> None:
    """Write the latest images: an upsert, except on PostgreSQL for a batch of many keys that had no
    row (the move just found which had one): those go in by COPY (``BulkStatement``'s copy form,
    about 3x the rows a second of the upsert's array form in engine_bench's raw ceilings), the
    others by the upsert. The writer lock is held, so no other commit can add one of those keys
    meanwhile."""
    if conn.dialect.name == "postgresql" and len(upserts) >= COPY_FORM_ROWS:
        fresh: list[tuple[Any, ...]] = []
        known: list[tuple[Any, ...]] = []
        for image in upserts:
            (known if tuple(image[i] for i in key_positions) in existed else fresh).append(image)
        if len(fresh) >= COPY_FORM_ROWS:
            table.sql.bulk("upsert:data", conn).run(conn, known, columns)  # (no rows: no statement)
            table.sql.bulk("insert:data", conn).run(conn, fresh, columns)
            return
    table.sql.bulk("upsert:data", conn).run(conn, upserts, columns)


def _xdcr_versions(table: SortedTable, conn: sa.Connection, keyed: dict[Any, RowWrite],
                   logged: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]], commit_ts: int,
                   before: dict[tuple[Any, ...], tuple[Any, ...]], names: list[str]) -> list[dict[str, Any]]:
    """XDCR: the new version of every changed row (stored beside it, ``tablets/xdcr.py``) and
    what the log carries to the peers: the change's version, the version it was made on
    (``e``: [timestamp, cluster id, deleted], None on no row), its delete horizon (``h``) and the
    image it replaced."""
    own = table.xdcr_cluster_id
    assert own is not None
    unread = [key for key, _ in logged if not ((w := keyed.get(key)) is not None and w.here_known)]
    current = xdcr.read_versions(conn, table.table_id, unread)
    versions: dict[tuple[Any, ...], xdcr.RowVersion] = {}
    extras: list[dict[str, Any]] = []
    for key, image in logged:
        write = keyed.get(key)
        origin = write.origin if write is not None else None
        cur = write.here if write is not None and write.here_known else current.get(key)
        deleted = image is None
        if origin is None:
            # after the version it replaces (stored here, so within the bound every peer checks)
            version: xdcr.Version = (table.xdcr_clock.next(0 if cur is None else cur.version[0]), own)
            stored = xdcr.local_version(version, deleted, cur)
        else:
            version = origin
            horizon = write.origin_horizon if write is not None else None
            stored = xdcr.RowVersion(version, deleted, version if deleted else horizon)
        versions[key] = stored
        replaced = before.get(key)
        extras.append({"o": list(version),
                       "e": None if cur is None else [cur.version[0], cur.version[1], cur.deleted],
                       "h": None if stored.horizon is None else list(stored.horizon),
                       "b": None if replaced is None else dict(zip(names, replaced, strict=False))})
    xdcr.write_versions(conn, table.table_id, versions)
    return extras


def _move_full_statement(table: SortedTable, key_in: sa.ColumnElement[bool]) -> sa.ClauseElement:
    """The move of replaced images, returning each whole image (XDCR: the log carries it)."""
    data, versions = table.sql.data, table.sql.versions
    assert versions is not None
    names = [c.name for c in table.schema.columns]
    image = sa.select(*[data.c[n] for n in names], data.c[TS], sa.false(), data.c[LOCK_MASK]).where(key_in)
    return versions.insert().from_select([*names, TS, DELETED, LOCK_MASK], image).returning(
        *[versions.c[n] for n in names])


def _move_statement(table: SortedTable, key_in: sa.ColumnElement[bool]) -> sa.ClauseElement:
    """INSERT INTO versions SELECT the current images of :keys (with their timestamps and masks)."""
    data, versions = table.sql.data, table.sql.versions
    assert versions is not None
    names = [c.name for c in table.schema.columns]
    image = sa.select(*[data.c[n] for n in names], data.c[TS], sa.false(), data.c[LOCK_MASK]).where(key_in)
    return versions.insert().from_select([*names, TS, DELETED, LOCK_MASK], image).returning(
        *[versions.c[k] for k in table.schema.key_names])


def _record_locks(conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
    rl = read_locks_table
    for row in rows:
        updated = conn.execute(rl.update().where(
            rl.c.table_id == row["table_id"], rl.c.row_key == row["row_key"],
            rl.c.lock_mask == row["lock_mask"]).values(timestamp=row["timestamp"]))
        if updated.rowcount == 0:
            conn.execute(rl.insert().values(**row))


# -- reads -----------------------------------------------------------------------------------------

def fetch_latest(sql: UserTables, conn: sa.Connection, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict]:
    """The latest images of ``keys`` (those that have one), by key, from the shape ``sql``."""
    schema = sql.schema
    data = sql.data
    names = schema.key_names
    result: dict[tuple[Any, ...], dict[str, Any]] = {}
    colnames = [c.name for c in schema.columns]
    if len(keys) <= _POINT_LOOKUPS:
        # a few keys: a point query compiled once per table, run straight on the driver
        point = sql.bulk("point:data", conn)
        # on the DBAPI cursor: SQLAlchemy's result machinery costs more than the query (a driver
        # error raised as SQLAlchemy's, a dropped connection invalidated: a 503, never a 500)
        found = on_driver_each(conn, point.sql, (point.params(key, names) for key in keys))
        for key, row in zip(keys, found, strict=True):
            if row is not None:
                result[key] = dict(zip(colnames, row, strict=True))
        return result
    cols = [data.c[c.name] for c in schema.columns]
    key_cols_ = [data.c[k] for k in names]
    composite = len(names) > 1 and conn.dialect.name == "sqlite"
    for chunk in chunks(keys, _OR_TERMS if composite else _CHUNK):
        match = composite_key_in(key_cols_, chunk) if composite else sa.tuple_(*key_cols_).in_(chunk)
        stmt = sa.select(*cols).where(match)
        for row in conn.execute(stmt):
            d = dict(zip(colnames, row, strict=True))
            result[tuple(d[k] for k in names)] = d
    return result


def fetch_at(sql: UserTables, conn: sa.Connection, keys: list[tuple[Any, ...]],
             ts: int) -> dict[tuple[Any, ...], dict]:
    """Rows as of ``ts``: the data row if its latest write is that old, else the newest older version."""
    data, versions = sql.data, sql.versions
    assert versions is not None
    names = sql.schema.key_names
    colnames = [c.name for c in sql.schema.columns]
    result: dict[tuple[Any, ...], dict[str, Any]] = {}
    for key in keys:
        row = conn.execute(sa.select(*[data.c[n] for n in colnames], data.c[TS]).where(
            *[data.c[k] == v for k, v in zip(names, key, strict=True)])).first()
        if row is not None and row[-1] <= ts:
            result[key] = dict(zip(colnames, row[:-1], strict=True))
            continue
        row = conn.execute(
            sa.select(*[versions.c[n] for n in colnames], versions.c[DELETED])
            .where(*[versions.c[k] == v for k, v in zip(names, key, strict=True)], versions.c[TS] <= ts)
            .order_by(versions.c[TS].desc()).limit(1)).first()
        if row is not None and not row[-1]:
            result[key] = dict(zip(colnames, row[:-1], strict=True))
    return result


def query_source(sql: UserTables, ts: int | None) -> QuerySource:
    """The relation a query of a sorted table reads: latest data, or the rows visible at ``ts``."""
    schema = sql.schema
    types = {c.name: c.type.value for c in schema.columns}
    if ts is None:
        data = sql.data
        return QuerySource(from_clause=data, columns={c.name: data.c[c.name] for c in schema.columns},
                           column_types=types, key_columns=tuple(schema.key_names))
    # rows whose latest write is old enough, plus the newest older version of the others
    data, versions = sql.data, sql.versions
    assert versions is not None
    names = schema.key_names
    colnames = [c.name for c in schema.columns]
    current = sa.select(*[data.c[n] for n in colnames]).where(data.c[TS] <= ts)
    latest = (sa.select(*[versions.c[k] for k in names], sa.func.max(versions.c[TS]).label("m"))
              .where(versions.c[TS] <= ts).group_by(*[versions.c[k] for k in names]).subquery("latest"))
    newer_current = sa.exists().where(*[data.c[k] == versions.c[k] for k in names], data.c[TS] <= ts)
    older = (sa.select(*[versions.c[n] for n in colnames])
             .join(latest, sa.and_(*[versions.c[k] == latest.c[k] for k in names],
                                   versions.c[TS] == latest.c["m"]))
             .where(versions.c[DELETED] == sa.false(), ~newer_current))
    visible = sa.union_all(current, older).subquery("visible")
    return QuerySource(from_clause=visible, columns={c.name: visible.c[c.name] for c in schema.columns},
                       column_types=types, key_columns=tuple(schema.key_names))


# -- compaction ------------------------------------------------------------------------------------

def compact(table: SortedTable, conn: sa.Connection, horizon: int) -> int:
    """Drop versions no read at or after ``horizon`` can see; returns the number removed.

    Such a read sees, per key, the newest version at or before it: an older version superseded
    at or before ``horizon`` (by a newer one here or by the data row) is never seen again, and
    a tombstone at or before ``horizon`` reads the same as no version at all."""
    if table.sql.versions is None:
        return 0
    removed = table.sql.bulk("compact:versions", conn).count(conn, {"horizon": horizon})
    if table.has_read_locks:
        # (a table that never recorded a read lock since the start has no row there to drop)
        rl = read_locks_table
        conn.execute(rl.delete().where(rl.c.table_id == table.table_id, rl.c.timestamp < horizon))
    if removed and horizon > table.compacted_until:
        before = table.compacted_until
        table.compacted_until = horizon
        on_rollback(conn, lambda: setattr(table, "compacted_until", before))
    return int(removed or 0)


# -- SQL helpers: key lists ------------------------------------------------------------------------

def key_cols(table: KeyedTable, sql_table: sa.Table) -> list[sa.Column[Any]]:
    """The key columns of ``sql_table`` (the data or the versions of ``table``)."""
    return [sql_table.c[k] for k in table.schema.key_names]


def _chunk_size(table: KeyedTable) -> int:
    """Keys per ``IN`` list: a few thousand bound values, well inside every dialect's limit; for a
    key of several columns on SQLite, the terms of one OR (``composite_key_in``)."""
    nkeys = len(table.schema.key_names)
    return max(1, 4000 // nkeys) if nkeys == 1 else min(_OR_TERMS, max(1, 4000 // nkeys))


#: keys of several columns matched by one statement on SQLite (``composite_key_in``): SQLite nests an
#: OR chain one level per term and refuses an expression 1,000 levels deep
_OR_TERMS = 256


def composite_key_in(cols: list[Any], keys: list[list[Any]] | list[tuple[Any, ...]]) -> sa.ColumnElement[bool]:
    """``(a, b) IN ((?, ?), ...)`` as SQLite can use the primary key for: ``(a = ? AND b = ?) OR ...``.
    SQLite (3.40) answers a row-value IN list by scanning the whole table (its plan: ``SCAN t USING
    COVERING INDEX``), so every commit to a table with a key of several columns cost in proportion
    to the table's size (100 rows into a table of 110,000: 30 ms of CPU, 6 ms at 10,000); each OR
    term is an index search (``MULTI-INDEX OR``). At most ``_OR_TERMS`` keys per statement."""
    return sa.or_(*[sa.and_(*[c == v for c, v in zip(cols, key, strict=True)]) for key in keys])


def drop_compiled(table: KeyedTable) -> None:
    """Forget the table's compiled key-list statements (its columns changed: they are stale)."""
    table.__dict__.pop(_KEY_STATEMENTS, None)


def run_with_keys(table: KeyedTable, conn: sa.Connection, name: str, sql_table: sa.Table,
                  build: Callable[[sa.ColumnElement[bool]], sa.ClauseElement], keys: list[tuple[Any, ...]],
                  extra: dict[str, Any] | None = None) -> Iterator[list[Any]]:
    """Run ``build(key IN (...))`` (the key columns of ``sql_table``) once per chunk of ``keys``;
    yields the rows each returns (tuples).

    The statement is compiled once per chunk length and run straight on the driver: SQLAlchemy
    would otherwise render and process thousands of bound values on every execution."""
    # compiled statements by (name, list length, dialect); filled only under Storage.write_lock
    # (every caller is a commit or a conflict check)
    cache = table.__dict__.setdefault(_KEY_STATEMENTS, {})
    if conn.dialect.name == "postgresql":
        if keys:
            yield _run_with_key_arrays(table, conn, name, sql_table, build, keys, extra or {}, cache)
        return
    nkeys = len(table.schema.key_names)
    extra = extra or {}
    per_chunk = _chunk_size(table)
    # the SQL tables' own statements (a DynamicTable's ``sql``) are shared by the tables of one shape
    own = getattr(table, "sql", None)
    shared = own if isinstance(own, UserTables) and sql_table.name.startswith(own.sql_name) and \
        own.shares_sql(conn) else None
    for chunk in chunks(keys, per_chunk):
        # a few list lengths only (powers of two, and the full chunk): a short list is padded
        # with its last key, which changes nothing in an IN list
        size = len(chunk) if len(chunk) == per_chunk else 1 << (len(chunk) - 1).bit_length()
        chunk = chunk + [chunk[-1]] * (size - len(chunk))
        entry = cache.get((name, size, conn.dialect.name))
        if entry is None and shared is not None:
            found = SHARED_SQL.get(("keys", name, size, conn.dialect.name, shared.shape))
            if found is not None:
                entry = cache[(name, size, conn.dialect.name)] = (
                    found[0].replace(SharedSql.MARK, shared.sql_name), *found[1:])
        if entry is None:
            cols = key_cols(table, sql_table)
            binds: list[list[sa.BindParameter[Any]]] = [
                [sa.bindparam(f"k{i}_{j}") for j in range(nkeys)] for i in range(size)]
            key_in = cols[0].in_([b[0] for b in binds]) if nkeys == 1 else composite_key_in(cols, binds)
            compiled = cast(SQLCompiler, build(key_in).compile(dialect=positional(conn.dialect)))
            order = list(compiled.positiontup or []) if compiled.positional else None
            keys_first = order is not None and order[:size * nkeys] == [
                f"k{i}_{j}" for i in range(size) for j in range(nkeys)]
            entry = cache[(name, size, conn.dialect.name)] = (str(compiled), order, keys_first)
            if shared is not None:
                SHARED_SQL.put(("keys", name, size, conn.dialect.name, shared.shape),
                               (entry[0].replace(shared.sql_name, SharedSql.MARK), order, keys_first))
        sql, order, keys_first = entry
        if keys_first:
            # positional, keys first (the usual shape): a flat tuple
            flat = [v for key in chunk for v in key]
            params: Any = tuple(flat) + tuple(extra[n] for n in order[len(flat):])
        else:
            values = dict(extra)
            for i, key in enumerate(chunk):
                for j, value in enumerate(key):
                    values[f"k{i}_{j}"] = value
            params = tuple(values[n] for n in order) if order is not None else values
        yield on_driver(conn, sql, params)


#: where the key list goes in a statement compiled for PostgreSQL (replaced by its arrays)
_KEYS_MARKER = "rt_keys_marker"


def _run_with_key_arrays(table: KeyedTable, conn: sa.Connection, name: str, sql_table: sa.Table,
                         build: Callable[[sa.ColumnElement[bool]], sa.ClauseElement], keys: list[tuple[Any, ...]],
                         extra: dict[str, Any], cache: dict[Any, Any]) -> list[Any]:
    """:func:`run_with_keys` on PostgreSQL: every key in one statement, one array per key column
    (``k = ANY(%b::BIGINT[])``, or ``(a, b) IN (SELECT * FROM unnest(...))`` for a composite key).
    An IN list of thousands of placeholders is parsed and planned anew by the server at every
    execution, and too long for psycopg's query cache; arrays are one parameter each, and the
    statement is prepared once."""
    entry = cache.get((name, "arrays", conn.dialect.name))
    if entry is None:
        cols = key_cols(table, sql_table)
        placeholders = [array_parameter(c.type, conn.dialect) for c in cols]
        assert all(placeholders), f"no array form for the key columns of {sql_table.name}"
        marker: sa.ColumnElement[Any] = sa.literal_column(_KEYS_MARKER)
        if len(cols) == 1:
            key_in: sa.ColumnElement[bool] = cols[0] == sa.func.any(marker)
            fragment = str(placeholders[0])
        else:
            key_in = sa.tuple_(*cols).op("IN")(marker)
            fragment = f"(SELECT * FROM unnest({', '.join(map(str, placeholders))}))"
        compiled = cast(SQLCompiler, build(key_in).compile(dialect=positional(conn.dialect)))
        sql = str(compiled)
        assert sql.count(_KEYS_MARKER) == 1, sql
        at = sql.index(_KEYS_MARKER)
        entry = cache[(name, "arrays", conn.dialect.name)] = (
            sql.replace(_KEYS_MARKER, fragment), list(compiled.positiontup or []),
            sql[:at].replace("%%", "").count("%s"))
    sql, order, at = entry
    params: list[Any] = [extra[n] for n in order]
    # one array per key column (a single-column key, the usual one, without zip(*keys)'s 10,000 arguments)
    params[at:at] = [[k for (k,) in keys]] if len(keys[0]) == 1 else [list(c) for c in zip(*keys, strict=True)]
    return on_driver(conn, sql, tuple(params))


def chunks(items: list[Any], size: int = _CHUNK) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
