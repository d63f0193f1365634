"""Change streams (seed 004): the change log of a table, its positions, and reading it back.

Every commit that changes a sorted or ordered table that keeps a change log (``@enable_change_log``,
always an XDCR table) appends one row per changed row to ``_rt_changes`` in the same SQL
transaction, so the log holds exactly the committed history, in commit order, from the moment the
log was switched on (``Tables.switch_change_log``: a stream can start no earlier). A table nobody
streams keeps no log: it would double the rows each commit writes (measured: about two fifths of a
replica's apply). A change's *position* is ``(commit timestamp, seq)``: the meta-cluster's commit
timestamp first (two changes of one key always have different timestamps, so per key the stream
is in commit order whatever happened to the tablets), then ``seq``, which grows per table. The log
is per table, not per tablet, so a reshard changes nothing a consumer can see: positions are
stored, never recomputed from pivot keys.

A replicated table keeps no rows (seed 002): its stream is its replication queue, per tablet in
commit order; a position there is ``(timestamp, tablet << 40 | row_index)``, and the tablets are
merged by position, so a reshard is invisible there too.

An *event token* is the position as 32 hex digits followed by the table id: tokens of one table
compare as strings in stream order, and the first 16 digits are the commit timestamp, which is
what a token is compared by across a meta-cluster and its replicas (their rows keep the
meta-cluster's timestamps).

What may be read: everything on a table written only here (commits are applied under the writer
lock in timestamp order, so the committed log is a prefix in stream order) below the in-flight
bound; on a replica table, only below its replication freshness (changes arrive per meta tablet,
so a later arrival may carry an earlier timestamp than one already here). The caller passes the
bound; this module never waits.

Locking: :func:`record` runs inside a write transaction under ``Storage.write_lock``; reads take
a read connection and no lock.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..schema import ColumnType, TableSchema
from ..storage import (
    UserTables,
    bulk_insert,
    changes_table,
    consumers_table,
    on_commit,
)
from . import queue
from .queue import QueueRun

#: a position: (commit timestamp, seq)
Position = tuple[int, int]

#: the seq of a heartbeat's position: after every change at its timestamp
HEARTBEAT_SEQ = (1 << 64) - 1
#: seqs in SQL are signed 64-bit: a heartbeat's seq binds as this (no change has a seq as large)
_SQL_SEQ_MAX = (1 << 63) - 1
#: a queue position's seq: tablet index in the high bits, row index in the low 40
_ROW_BITS = 40

_TOKEN = re.compile(r"^([0-9a-f]{16})([0-9a-f]{16})(.+)$")


def encode_token(position: Position, table_id: str) -> str:
    return f"{position[0]:016x}{position[1]:016x}{table_id}"


def decode_token(token: object, what: str = "event token") -> tuple[Position, str]:
    """(position, table id) of a token; a clear error for anything else."""
    match = _TOKEN.match(token) if isinstance(token, str) else None
    if match is None:
        raise YtError(f"Invalid {what} {str(token)[:100]!r}: expected a token from a change stream or a read "
                      "(32 hex digits and a table id)", code=ErrorCode.INVALID_PARAMETER)
    return (int(match.group(1), 16), int(match.group(2), 16)), match.group(3)


def heartbeat_position(ts: int) -> Position:
    return (ts, HEARTBEAT_SEQ)


@dataclass
class Change:
    """One change read back from a log or a queue, before it becomes an event."""

    position: Position
    tablet_index: int
    kind: str
    payload: dict[str, Any]


class ChangeTable(Protocol):
    """What this module uses of a table (``DynamicTable`` is one)."""

    table_id: str
    schema: TableSchema
    sql: UserTables
    replicated: bool
    tablet_rows: dict[int, list[int]]
    change_seq: int
    change_log: bool
    change_tail: ChangeTail | None
    queue_tail: dict[int, list[QueueRun]]

    @property
    def sorted(self) -> bool: ...

    @property
    def tablet_count(self) -> int: ...


class ChangeFeed:
    """Wakes stream pulls waiting for changes: every commit that changes a table bumps a counter.

    ``_cond`` guards ``_version`` and ``_closed`` only: a **leaf** lock, taken by ``notify`` after a
    commit (an ``on_commit`` hook, under ``Storage.write_lock``), by ``close`` and by waiting pulls
    holding nothing else.

    A waiting pull holds a request's worker thread for up to ``MAX_WAIT_MS``: at most
    ``max_waiting`` pulls may wait at once, whatever the table (a replica table's pull, which also
    polls its freshness, included). A pull takes a slot with ``waiting()`` for its whole wait; one
    that finds none answers at once with what it has. The engine's own followers of the log (XDCR
    shippers) wait without a slot: they are a bounded set of threads of their own.

    ``close`` (the engine is stopping) wakes every waiting pull and makes later waits return at once:
    a pull answers with what it has (a heartbeat at the least) instead of holding its connection,
    and the engine's stop, up to ``MAX_WAIT_MS`` later, until then."""

    def __init__(self, max_waiting: int) -> None:
        self._cond = threading.Condition()
        #: moved by notify (its callers hold the storage writer; were two to race, the version would
        #: still change, and a waiter only asks whether it changed); read by waiters under _cond
        self._version = 0
        #: waiters inside wait_after; guarded by _cond. A commit takes _cond only when some wait
        #: (a Condition's notify_all costs a share of a single-row commit for nobody): a waiter
        #: counts itself before it compares versions, and notify moves the version before it
        #: looks at the count, so either the waiter sees the new version or notify sees the waiter
        self._sleepers = 0
        #: guarded by _cond; set once, never cleared
        self._closed = False
        #: pulls that may wait at once (each holds a worker thread); more answer at once instead
        self._waiting = threading.BoundedSemaphore(max_waiting)

    def notify(self) -> None:
        self._version += 1
        if self._sleepers:
            with self._cond:
                self._cond.notify_all()

    def close(self) -> None:
        """The engine is stopping: wake every waiting pull; later waits return at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def version(self) -> int:
        return self._version

    @contextlib.contextmanager
    def waiting(self) -> Iterator[bool]:
        """A slot to wait in, held until the block ends: True if one was free (the caller may wait,
        ``wait_after``), False if ``max_waiting`` pulls wait already (the caller answers at once)."""
        held = self._waiting.acquire(blocking=False)
        try:
            yield held
        finally:
            if held:
                self._waiting.release()

    def wait_after(self, version: int, deadline: float) -> bool:
        """Wait until a commit after ``version``, ``deadline`` (monotonic) or ``close``; False if the
        feed is closed (the caller answers at once). A pull calls it holding a slot (``waiting``)."""
        with self._cond:
            if self._closed:
                return False
            self._sleepers += 1
            try:
                while self._version == version and not self._closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                self._sleepers -= 1
        return True


#: a change kept in a :class:`ChangeTail`: (position, tablet index, kind, row, key (a deletion's),
#: row index (an append's), XDCR's version ``o`` (its origin), whether the row holds a NaN or an
#: infinite double), each as logged
TailEntry = tuple[Position, int, str, dict[str, Any] | None, list[Any] | None, int | None, Any, bool]


class ChangeTail:
    """The latest logged changes of a table that a stream reads, in memory, as ``record`` built them.

    A pull of a table's log builds each event from its logged payload: in SQLite's JSON functions
    (``read_json``) that was about three quarters of a pull's CPU (15-17 µs a change on a slow
    machine), the rest a few strings per change. A consumer keeping up reads what was committed a
    moment ago, whose payloads the commit had as maps: the tail keeps them (references, no copy),
    and a pull of positions it covers renders events from them (:meth:`render`), never reading SQL.

    What it covers: every change after ``start`` (a position) that was committed, in stream order.
    It is made under ``Storage.write_lock`` (no commit in flight) with ``start`` at the clock's
    last timestamp, and each commit adds its changes in an ``on_commit`` hook, under the writer and
    before the commit is visible to reads: a pull bounded by the visible timestamp finds in it
    every change up to that bound. So it holds only for a table whose commits apply in timestamp
    order under the writer (not a replica table, whose pushes carry their meta-cluster's timestamps
    per tablet). At ``capacity`` changes it drops its older half (``start`` moves past them: a pull
    from before then reads SQL). A tail no pull has used for ``IDLE_SECONDS`` is let go by its
    table (``ChangeTail.idle``): a table nobody streams keeps nothing.

    ``_lock`` guards ``_start``, ``_entries`` and ``_used``: a leaf, taken by ``extend`` (under
    ``Storage.write_lock``) and by readers holding nothing else (docs/architecture.md, lock order).
    """

    #: seconds without a pull after which a commit lets the tail go
    IDLE_SECONDS = 60.0

    def __init__(self, start: Position, capacity: int) -> None:
        self._lock = threading.Lock()
        self._start = start
        self._entries: list[TailEntry] = []
        self.capacity = max(2, capacity)
        self._used = time.monotonic()
        self._closed = False

    def idle(self, now: float) -> bool:
        return now - self._used > self.IDLE_SECONDS

    def close(self) -> None:
        """Its table let it go (under the writer): the commits from now on are not added, so a pull
        that still holds it must read SQL, not answer from what it has."""
        with self._lock:
            self._closed = True

    def extend(self, entries: list[TailEntry]) -> None:
        """A commit's changes (an ``on_commit`` hook: under the writer, in commit order)."""
        with self._lock:
            kept = self._entries
            kept.extend(entries)
            if len(kept) > self.capacity:
                cut = len(kept) - self.capacity // 2
                self._start = kept[cut - 1][0]
                self._entries = kept[cut:]

    def take(self, after: Position, bound_ts: int, limit: int) -> list[TailEntry] | None:
        """The changes after ``after`` up to ``bound_ts``, as :func:`read` would return them (at
        least ``limit`` if there are as many, and every change of the last commit returned); None
        when the tail does not cover ``after`` (a read of SQL must answer)."""
        with self._lock:
            self._used = time.monotonic()
            if self._closed or after < self._start:
                return None
            entries = self._entries
            first = bisect.bisect_right(entries, after, key=_POSITION)
            out = entries[first:first + limit]
            if out:
                end = first + len(out)
                last_ts = out[-1][0][0]
                while end < len(entries) and entries[end][0][0] == last_ts:
                    out.append(entries[end])
                    end += 1
        if out and out[-1][0][0] > bound_ts:
            out = [e for e in out if e[0][0] <= bound_ts]
        return out

    @staticmethod
    def render(entries: list[TailEntry], table_id: str, path: str,
               keys: tuple[str, ...] | list[str]) -> list[tuple[int, str]] | None:
        """The events of ``entries`` in the form of :func:`read_json` (the same text, built here
        from the maps); None if one of them holds a NaN or an infinite double (SQL's path answers)."""
        quoted = json.dumps(path)
        out: list[tuple[int, str]] = []
        dumps = orjson.dumps
        for (ts, seq), tablet, kind, row, key, row_index, origin, special in entries:
            if special:
                return None
            head = (f'{{"event_token":"{ts:016x}{seq:016x}{table_id}","timestamp":{ts},"kind":"{kind}",'
                    f'"path":{quoted},"tablet_index":{tablet}')
            if keys:
                if kind == "delete":
                    text = head + ',"key":' + dumps(dict(zip(keys, key or (), strict=False))).decode()
                else:
                    assert row is not None
                    text = (head + ',"key":' + dumps({k: row.get(k) for k in keys}).decode()
                            + ',"row":' + dumps(row).decode())
            else:
                text = (head + ',"row":' + dumps(row).decode() + f',"$$tablet_index":{tablet}'
                        + ',"$$row_index":' + dumps(row_index).decode())
            if origin is not None:
                text += (f',"origin_cluster_id":{dumps(origin[1]).decode()},'
                         f'"origin_timestamp":{dumps(origin[0]).decode()}')
            out.append((ts, text))
        return out


def _position_of(entry: TailEntry) -> Position:
    return entry[0]


_POSITION = _position_of


def tail_for(table: ChangeTable, write_lock: contextlib.AbstractContextManager[Any], last_ts: Callable[[], int],
             capacity: int) -> ChangeTail:
    """The table's tail, made if it has none (under ``write_lock``: no commit in flight, so every
    change after the clock's last timestamp will be added to it)."""
    tail = table.change_tail
    if tail is not None:
        return tail
    with write_lock:
        tail = table.change_tail
        if tail is None:
            tail = table.change_tail = ChangeTail(heartbeat_position(last_ts()), capacity)
    return tail


def drop_tail(table: ChangeTable) -> None:
    """Let the table's tail go (under ``Storage.write_lock``); a pull makes a new one."""
    tail = table.change_tail
    if tail is not None:
        table.change_tail = None
        tail.close()


# -- writing ---------------------------------------------------------------------------------------

def _not_finite(doubles: list[str], row: dict[str, Any] | None) -> bool:
    """Whether a double of ``row`` is NaN or infinite (its payload takes the standard encoder, which
    keeps them; orjson would write null)."""
    if row is not None:
        for name in doubles:
            v = row.get(name)
            if v is not None and not math.isfinite(v):
                return True
    return False


def decode_payload(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = json.loads(text)
    return value if isinstance(value, dict) else {}


def record(table: ChangeTable, conn: sa.Connection, commit_ts: int,
           changes: Iterable[tuple[int, str, dict[str, Any] | None, list[Any] | None, int | None]],
           extras: list[dict[str, Any]] | None = None) -> int:
    """Append ``(tablet, kind, row, key, row_index)`` changes of one commit to the table's log
    (``extras``: more fields of each change's payload, in the same order: XDCR's versions).

    The extras come first in each payload's text, and XDCR's version ``o`` first of them: XDCR's
    shippers and ``dr_status`` read whose change it is from the head of the payload, without
    parsing the rest (``xdcr/shipper.py``, ``_ORIGIN`` and ``owed``).

    Under the writer lock, inside the commit's SQL transaction; ``table.change_seq`` moves on
    (and back on rollback, by the caller's undo of the whole apply: see ``DynamicTable.apply``)."""
    doubles = [c.name for c in table.schema.columns if c.type is ColumnType.DOUBLE]
    # a value read back from SQL (an update merged with the stored row, an XDCR before-image) has a
    # boolean as the integer SQLite keeps: the log carries the column's own type
    booleans = [c.name for c in table.schema.columns if c.type is ColumnType.BOOLEAN]
    seq = table.change_seq
    rows = []
    table_id = table.table_id
    tail = table.change_tail
    if tail is not None and tail.idle(time.monotonic()):
        drop_tail(table)  # no pull for a while: nobody streams it now
        tail = None
    kept: list[TailEntry] | None = [] if tail is not None else None
    for i, (tablet, kind, row, key, row_index) in enumerate(changes):
        body: dict[str, Any] = dict(extras[i]) if extras is not None else {}
        if booleans:
            for image in (row, body.get("b")):
                if isinstance(image, dict):
                    for name in booleans:
                        value = image.get(name)
                        if value is not None and type(value) is not bool:
                            image[name] = bool(value)
        if row is not None:
            body["row"] = row
        if key is not None:
            body["key"] = key
        if row_index is not None:
            body["row_index"] = row_index
        special = bool(doubles) and _not_finite(doubles, row)
        text = json.dumps(body) if special else orjson.dumps(body).decode()
        rows.append((table_id, commit_ts, seq, tablet, kind, text))
        if kept is not None:
            kept.append(((commit_ts, seq), tablet, kind, row, key, row_index, body.get("o"), special))
        seq += 1
    if rows:
        bulk_insert(changes_table, _COLUMNS, conn).run(conn, rows, _COLUMNS)
        table.change_seq = seq
        if tail is not None and kept:
            on_commit(conn, lambda: tail.extend(kept))  # (under the writer, before the commit is visible)
    return len(rows)


#: the columns of a change's row, in the order record() builds them
_COLUMNS = ["table_id", "timestamp", "seq", "tablet_index", "kind", "payload"]


def next_seq(conn: sa.Connection, table_id: str) -> int:
    """The seq after the newest logged change of a table (at start-up)."""
    c = changes_table.c
    newest = conn.execute(sa.select(sa.func.max(c.seq)).where(c.table_id == table_id)).scalar()
    return 0 if newest is None else int(newest) + 1


# -- reading ---------------------------------------------------------------------------------------

def read(table: ChangeTable, conn: sa.Connection, after: Position, bound_ts: int, limit: int) -> list[Change]:
    """Changes after ``after`` with a timestamp at most ``bound_ts``, in stream order: at least
    ``limit`` if there are as many, and always every change of the last commit returned (a commit
    is never split between two reads)."""
    if bound_ts <= after[0] and after[1] == HEARTBEAT_SEQ:
        return []
    if table.replicated:
        return _read_queue(table, conn, after, bound_ts, limit)
    rows = read_logged(table, conn, after, bound_ts, limit)
    return [Change((r[0], r[1]), r[2], r[3], decode_payload(r[4])) for r in rows]


def read_logged(table: ChangeTable, conn: sa.Connection, after: Position, bound_ts: int,
                limit: int) -> list[Any]:
    """:func:`read` of a table's log (not a queue) as its SQL rows: (timestamp, seq, tablet index,
    kind, payload as logged). For a reader that passes payloads on as they are (XDCR's shippers)."""
    if bound_ts <= after[0] and after[1] == HEARTBEAT_SEQ:
        return []
    assert not table.replicated, "a replicated table streams its queue, not a log"
    c = changes_table.c
    base = sa.select(c.timestamp, c.seq, c.tablet_index, c.kind, c.payload).where(
        c.table_id == table.table_id, c.timestamp <= bound_ts)
    # (the redundant ``timestamp >= after`` is the index's lower bound: SQLite cannot take one from the OR)
    stmt = base.where(c.timestamp >= after[0],
                      sa.or_(c.timestamp > after[0],
                             sa.and_(c.timestamp == after[0], c.seq > min(after[1], _SQL_SEQ_MAX)))) \
        .order_by(c.timestamp, c.seq).limit(limit)
    rows = list(conn.execute(stmt).all())
    if len(rows) == limit:
        last_ts, last_seq = rows[-1][0], rows[-1][1]
        rows += conn.execute(base.where(c.timestamp == last_ts, c.seq > last_seq).order_by(c.seq)).all()
    return rows


def can_read_json(table: ChangeTable, conn: sa.Connection) -> bool:
    """Whether :func:`read_json` serves this table: a log (not a queue) in SQLite (its JSON
    functions), and no ``any`` column (whose YSON text must be parsed into the event)."""
    return (not table.replicated and conn.dialect.name == "sqlite"
            and all(c.type is not ColumnType.ANY for c in table.schema.columns))


def read_json(table: ChangeTable, conn: sa.Connection, after: Position, bound_ts: int, limit: int,
              path: str) -> list[tuple[int, str]]:
    """:func:`read` with each change already an event in the JSON form of YSON, built by SQLite
    (its JSON functions) from the logged payload: (timestamp, the event without ``commit_end``
    and its closing brace). A consumer keeping up with a busy table costs the writers' process
    one string per change instead of a parse, a map and an encoding."""
    if bound_ts <= after[0] and after[1] == HEARTBEAT_SEQ:
        return []
    sql = _json_sql(table, conn)
    params = {"tid": table.table_id, "path": json.dumps(path), "table_id": table.table_id, "bound": bound_ts,
              "after_ts": after[0], "after_seq": min(after[1], _SQL_SEQ_MAX), "limit": limit}
    rows = list(conn.execute(sa.text(sql[0]), params).all())
    if len(rows) == limit:
        params["last_ts"], params["last_seq"] = rows[-1][0], rows[-1][1]
        rows += conn.execute(sa.text(sql[1]), params).all()
    return [(int(r[0]), r[2]) for r in rows]


def _json_sql(table: ChangeTable, conn: sa.Connection) -> tuple[str, str]:
    """The two statements of :func:`read_json` (the read, and the rest of the last commit), per key columns."""
    keys = list(table.schema.key_names)
    cache: tuple[list[str], tuple[str, str]] | None = getattr(table, "_json_sql_cache", None)
    if cache is not None and cache[0] == keys:
        return cache[1]
    # ``->`` gives JSON (a boolean stays true/false, a string stays quoted) for json_object to embed
    of_row = ", ".join(f"{_sql_str(k)}, payload -> {_sql_str(_json_member('$.row', k))}" for k in keys)
    of_key = ", ".join(f"{_sql_str(k)}, payload -> '$.key[{i}]'" for i, k in enumerate(keys))
    if keys:
        body = (f"CASE WHEN kind = 'delete' THEN ',\"key\":' || json_object({of_key}) "
                f"ELSE ',\"key\":' || json_object({of_row}) || ',\"row\":' || (payload -> '$.row') END")
    else:
        body = ("',\"row\":' || (payload -> '$.row') || ',\"$$tablet_index\":' || tablet_index || "
                "',\"$$row_index\":' || (payload -> '$.row_index')")
    event = ("'{\"event_token\":\"' || printf('%016x%016x', timestamp, seq) || :tid || '\",\"timestamp\":' || "
             "timestamp || ',\"kind\":\"' || kind || '\",\"path\":' || :path || ',\"tablet_index\":' || "
             f"tablet_index || {body} || CASE WHEN (payload -> '$.o') IS NOT NULL THEN "
             "',\"origin_cluster_id\":' || (payload -> '$.o[1]') || ',\"origin_timestamp\":' || "
             "(payload -> '$.o[0]') ELSE '' END")
    base = f"SELECT timestamp, seq, {event} FROM _rt_changes WHERE table_id = :table_id AND timestamp <= :bound"
    first = (f"{base} AND timestamp >= :after_ts AND (timestamp > :after_ts OR (timestamp = :after_ts AND "
             "seq > :after_seq)) ORDER BY timestamp, seq LIMIT :limit")
    rest = f"{base} AND timestamp = :last_ts AND seq > :last_seq ORDER BY seq"
    setattr(table, "_json_sql_cache", (keys, (first, rest)))  # noqa: B010 - a cache beside the table
    return first, rest


def _json_member(root: str, name: str) -> str:
    """A JSON path to member ``name`` of ``root`` (quoted: a column name may hold any character)."""
    return root + '."' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _queue_tablets(table: ChangeTable) -> list[int]:
    return sorted(set(range(table.tablet_count)) | set(table.tablet_rows))


def _first_row_after(table: ChangeTable, conn: sa.Connection, tablet: int, after: Position) -> int:
    """The first queue row of ``tablet`` whose position is after ``after`` (timestamps grow along a
    tablet's queue: a binary search over the rows this read sees).

    The search covers the rows present in the read, not the in-memory count: an append counts its
    rows before its SQL commit, so the count may include rows the read cannot see, and a row taken
    for "before the start" because it is not there yet would move the start past committed rows not
    yet delivered (found by the 10-minute reshard fault run). A row missing inside the range was
    trimmed meanwhile (PostgreSQL reads each statement afresh): it lies before every row kept."""
    data = table.sql.data
    held = queue.last_row(data, conn, tablet)
    if held is None:
        return table.tablet_rows.get(tablet, [0, 0])[0]  # nothing to read in this tablet now

    def position(row: int) -> Position | None:
        ts = queue.timestamp_at(data, conn, tablet, row)  # (a queue row holds a run of one commit's changes)
        return None if ts is None else (int(ts), tablet << _ROW_BITS | row)

    low, high = held[0], held[1] + 1  # the answer is in [low, high]
    while low < high:
        middle = (low + high) // 2
        at = position(middle)
        if at is None or at <= after:
            low = middle + 1
        else:
            high = middle
    return low


def _read_queue(table: ChangeTable, conn: sa.Connection, after: Position, bound_ts: int,
                limit: int) -> list[Change]:
    data = table.sql.data
    streams = []
    for tablet in _queue_tablets(table):
        start = _first_row_after(table, conn, tablet, after)
        end = table.tablet_rows.get(tablet, [0, 0])[0]
        if start >= end:
            continue
        # (a commit's rows of one tablet are contiguous: read a little past the limit to end it)
        rows = queue.read_sql(data, conn, tablet, start, limit, bound_ts, whole_commits=True)
        streams.append([((int(r[1]), tablet << _ROW_BITS | int(r[0])), tablet, r) for r in rows])
    merged = list(heapq.merge(*streams, key=lambda item: item[0]))
    if len(merged) > limit:
        # cut after the commit of the limit-th change; every tablet read at least that far
        cut_ts = merged[limit - 1][0][0]
        merged = [item for item in merged if item[0][0] <= cut_ts]
    out = []
    for position, tablet, r in merged:
        payload = decode_payload(r[3])
        kind = "delete" if r[2] == "delete" else "upsert"
        out.append(Change(position, tablet, kind, payload))
    return out


# -- trimming --------------------------------------------------------------------------------------

def trim(conn: sa.Connection, table_id: str, up_to: Position) -> int:
    """Drop logged changes at or before ``up_to`` (under the writer lock)."""
    c = changes_table.c
    return int(conn.execute(changes_table.delete().where(
        c.table_id == table_id,
        sa.or_(c.timestamp < up_to[0],
              sa.and_(c.timestamp == up_to[0], c.seq <= min(up_to[1], _SQL_SEQ_MAX))))).rowcount or 0)


def newest_before(conn: sa.Connection, table_id: str, ts: int) -> Position | None:
    """The newest logged position with a timestamp at most ``ts`` (the trim point of a horizon)."""
    c = changes_table.c
    row = conn.execute(sa.select(c.timestamp, c.seq).where(c.table_id == table_id, c.timestamp <= ts)
                       .order_by(c.timestamp.desc(), c.seq.desc()).limit(1)).first()
    return None if row is None else (int(row[0]), int(row[1]))


def drop_changes(conn: sa.Connection, table_id: str) -> None:
    """A table's logged changes (its log switched off)."""
    conn.execute(changes_table.delete().where(changes_table.c.table_id == table_id))


def drop_log(conn: sa.Connection, table_id: str) -> None:
    """A removed table's log and consumers."""
    conn.execute(changes_table.delete().where(changes_table.c.table_id == table_id))
    conn.execute(consumers_table.delete().where(consumers_table.c.table_id == table_id))
