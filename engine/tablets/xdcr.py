"""XDCR (seed 001) at the row level: row versions and the conflict rules.

Every row of an XDCR table has a *version*: the commit timestamp and the cluster id of its last
change (a delete leaves a versioned tombstone). Versions compare by timestamp, then cluster id, so
two clusters never tie. They live in ``_rt_xdcr_rows`` beside the table's rows, written in the same
SQL transaction as the change (``sorted_rows.apply``).

A change shipped to a peer carries its kind, the new row, its own version and the version the row
had before it on the origin (the *expected* version). The receiver resolves it with
:func:`resolve` against the row it has, the seed's rules per action:

* no conflict when the row is at the expected version: the change applies;
* a conflict is a *missing row* (MISS: an update or delete of a row that is not there), a
  *timestamp mismatch* (MSMT: the row is there at another version), or a *constraint violation*
  (CNST: an insert of a key that exists; the key is the primary key);
* DELETE always wins; otherwise the later version wins; an accepted action overwrites the whole row.

Which action wins is decided by one total order, so that every cluster ends with the same row
whatever order the changes reach it in, with three or more writers too. Each version carries its
*delete horizon*: the version of the newest delete in the history the change was made on (for a
delete, its own version; None when that history has no delete). Actions compare by horizon, then
by version. So a delete beats every change made without having seen it (whose horizon is older),
however late that change's clock; a change made after the delete (a re-insert, an update of the
re-inserted row) beats the delete; changes of the same history compare by version, the later one
winning, as the seed's rules say. The horizon travels with each change (``h``) and is stored
beside the row's version.

The seed's rules decide by the version a change expected and the row it meets; with three
clusters, and with two when a delete and a re-insert race two updates, the order changes reach a
cluster in changed the outcome (a model of the rules diverged in about 2 % of random histories of
one key between 2 clusters, 5 % between 3; the CI run of 2026-11-28 met one). The order above
agrees with the seed's rules in every two-cluster case its text describes, and where they differ
it is the delete that wins over the changes that did not see it. The conflict log still classifies
each action by the seed's conflict types (MISS, MSMT, CNST) against the row it met.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..storage import BulkStatement, system_upsert, xdcr_rows_table
from ..timestamps import MAX_TIMESTAMP, unix_to_timestamp

#: (timestamp, cluster id): ordered by timestamp, then cluster id
Version = tuple[int, int]


class VersionClock:
    """The timestamps of XDCR versions: a hybrid logical clock in microseconds since the epoch.

    Commit timestamps cannot order changes across clusters: their low bits count commits within a
    second, so two clusters' commits of one second compare by how busy each was. A version's
    timestamp is the wall clock instead, never going back and always past every version this
    cluster has seen (``observe``): a change made after seeing another is later than it, on every
    cluster. At start the engine observes the newest version it stores, so a restart with the clock
    set back neither reuses a version nor goes back. ``_lock`` guards ``_last``: a **leaf**, taken
    under the storage writer by commits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self, after: int = 0) -> int:
        """A new version timestamp: later than every one taken or observed, and than ``after`` - the
        version of the row the change replaces, which every peer checks it is later than
        (``parse_apply``)."""
        with self._lock:
            self._last = max(time.time_ns() // 1000, self._last + 1, after + 1)
            return self._last

    def read(self) -> int:
        """The clock's time now (microseconds), without taking a version."""
        with self._lock:
            return max(time.time_ns() // 1000, self._last)

    def observe(self, ts: int) -> None:
        """Make later versions exceed ``ts``; the caller has bounded it (``parse_apply``, a snapshot
        page's check): an unbounded value would move every later version of every member."""
        with self._lock:
            if ts > self._last:
                self._last = ts


@dataclass(frozen=True)
class RowVersion:
    version: Version
    deleted: bool
    #: the newest delete in the history of the row (a tombstone's own version; None: no delete)
    horizon: Version | None = None

    @property
    def rank(self) -> tuple[Version, Version]:
        """Where this version stands in the order every cluster resolves by (module docstring)."""
        return (NO_HORIZON if self.horizon is None else self.horizon), self.version


#: below every version: the horizon of a history without a delete
NO_HORIZON: Version = (-1, -2)


def local_version(version: Version, deleted: bool, current: RowVersion | None) -> RowVersion:
    """The version of a change made here on ``current``: it inherits the row's delete horizon, or
    is its own (a delete). Always above ``current`` in the order (``version`` is later)."""
    horizon = version if deleted else (None if current is None else current.horizon)
    return RowVersion(version, deleted, horizon)


def key_text(key: Iterable[Any]) -> str:
    """A row key as the text that identifies it in ``_rt_xdcr_rows`` (JSON: keys are scalars)."""
    return orjson.dumps(list(key)).decode()


_COLUMNS = ["table_id", "row_key", "cluster_id", "timestamp", "deleted", "horizon_timestamp", "horizon_cluster_id"]
#: keys per read of stored versions; shorter lists are padded to a power of two (a few statements)
_READ_KEYS = 512
#: the compiled reads of stored versions, by (dialect, number of keys)
_READS: dict[tuple[str, int], BulkStatement] = {}


def _read_statement(conn: sa.Connection, size: int) -> BulkStatement:
    """The read of ``size`` keys' versions of one table, compiled once: on PostgreSQL one array of
    keys (``row_key = ANY(...)``, any size), elsewhere an IN list of ``size`` parameters."""
    pg = conn.dialect.name == "postgresql"
    found = _READS.get((conn.dialect.name, 0 if pg else size))
    if found is None:
        c = xdcr_rows_table.c
        if pg:
            from sqlalchemy.dialects.postgresql import ARRAY

            keys: sa.ColumnElement[bool] = c.row_key == sa.func.any(sa.bindparam("keys", type_=ARRAY(sa.Text)))
        else:
            keys = c.row_key.in_([sa.bindparam(f"k{i}") for i in range(size)])
        found = _READS[(conn.dialect.name, 0 if pg else size)] = BulkStatement(
            sa.select(c.row_key, c.timestamp, c.cluster_id, c.deleted, c.horizon_timestamp, c.horizon_cluster_id)
            .where(c.table_id == sa.bindparam("table_id"), keys), conn.dialect)
        # (the parameters go by position: the table id, then the keys)
        assert found.positional and found.names[0] == "table_id", found.names
    return found


def read_versions(conn: sa.Connection, table_id: str, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], RowVersion]:
    """The stored versions of ``keys`` (absent: the key never had a row here). One statement per
    512 keys, compiled once per list length and run on the driver: an expanding IN list is
    compiled anew by SQLAlchemy at every execution, which cost more than the read."""
    out: dict[tuple[Any, ...], RowVersion] = {}
    if not keys:
        return out
    by_text = {key_text(k): k for k in keys}
    texts = list(by_text)
    pg = conn.dialect.name == "postgresql"
    for i in range(0, len(texts), _READ_KEYS):
        chunk = texts[i:i + _READ_KEYS]
        if pg:
            params: tuple[Any, ...] = (table_id, chunk)
        else:
            # padded with its last key (changes nothing in an IN list)
            size = 1 << (len(chunk) - 1).bit_length()
            params = (table_id, *chunk, *[chunk[-1]] * (size - len(chunk)))
        for row in _read_statement(conn, 0 if pg else size).query(conn, params):
            horizon = None if row[4] is None else (int(row[4]), int(row[5]))
            out[by_text[row[0]]] = RowVersion((int(row[1]), int(row[2])), bool(row[3]), horizon)
    return out


def write_versions(conn: sa.Connection, table_id: str, versions: dict[tuple[Any, ...], RowVersion]) -> None:
    """Store the new version of each changed row (inside the commit's SQL transaction): one upsert,
    compiled once, run on plain tuples."""
    if not versions:
        return
    rows = [(table_id, key_text(k), v.version[1], v.version[0], v.deleted,
             None if v.horizon is None else v.horizon[0], None if v.horizon is None else v.horizon[1])
            for k, v in versions.items()]
    system_upsert(xdcr_rows_table, conn).run(conn, rows, _COLUMNS)


def drop_versions(conn: sa.Connection, table_id: str) -> None:
    conn.execute(xdcr_rows_table.delete().where(xdcr_rows_table.c.table_id == table_id))


# -- the rules -------------------------------------------------------------------------------------

ACTION_TYPES = {"insert": "I", "update": "U", "delete": "D"}


@dataclass(frozen=True)
class Resolution:
    """What to do with one incoming action, and what the conflict log says about it."""

    accept: bool
    #: MISS, MSMT, CNST or NONE (no conflict)
    conflict: str
    #: the conflict is on the primary key (a CNST of an insert)
    on_primary_key: bool = False

    @property
    def is_conflict(self) -> bool:
        return self.conflict != "NONE"


def resolve(kind: str, incoming: RowVersion, expected: RowVersion | None,
            current: RowVersion | None) -> Resolution:
    """One incoming action (``kind`` insert/update/delete; ``incoming``: its version and delete
    horizon; ``expected``: the version it was made on, None for a row the origin never had) against
    the ``current`` version here (None: never a row here). Accepted when it stands above the
    current version in the order (module docstring); classified by the seed's conflict types."""
    accept = current is None or incoming.rank > current.rank
    here = current if current is not None and not current.deleted else None
    if _same(expected, current):
        # made on exactly this row: above it in the order, unless a peer sent a horizon it cannot have
        return Resolution(accept, "NONE" if accept else "MSMT")
    if kind == "delete":
        return Resolution(accept, "MISS" if here is None else "MSMT")
    if here is not None:
        return Resolution(accept, "CNST" if kind == "insert" else "MSMT", on_primary_key=kind == "insert")
    # the row is missing here: never seen (its insert has not arrived from a third cluster yet), or
    # deleted (the delete wins over what did not see it)
    return Resolution(accept, "MISS")


def _same(expected: RowVersion | None, current: RowVersion | None) -> bool:
    """Whether the row here is what the action was made on."""
    if expected is None:
        return current is None
    return current is not None and current.deleted == expected.deleted and current.version == expected.version


# -- what a peer sends (``xdcr_apply``) --------------------------------------------------------------
#
# Everything in an ``xdcr_apply`` body is input from another cluster, and its numbers move state
# that outlives the request: a position becomes the sink record of that origin (a position far in
# the future would make every later change of the origin look applied already), a version moves
# this cluster's version clock (and through it every member's), a before-image is stored in the
# conflict log. So the body is parsed into typed values, and every number is range-checked, before
# anything reads it: a malformed or out-of-range body is one ``PROTOCOL_ERROR`` naming the field.

#: a change-log position: (commit timestamp of the origin, seq)
Position = tuple[int, int]
#: seqs are signed 64-bit in SQL; a heartbeat position's seq (2**64 - 1) is stored as this
MAX_SEQ = (1 << 63) - 1
#: the largest cluster id of seed 001
MAX_CLUSTER_ID = 127
#: the version of a joiner's clean-up deletes (never shipped; ``xdcr/join.py``)
HOUSEKEEPING_CLUSTER_ID = -1


def _bad(message: str, field: str) -> YtError:
    return YtError(f"Malformed xdcr_apply: {message}", code=ErrorCode.PROTOCOL_ERROR, attributes={"field": field})


def _int(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"{field} must be an integer in [{low}, {high}], not {str(value)[:60]!r}", field)
    return value


@dataclass(frozen=True)
class Bounds:
    """How far ahead of this cluster's clocks a peer's numbers may be."""

    #: the largest commit timestamp (YT format) a position may carry
    max_commit_ts: int
    #: the largest version timestamp (microseconds since the epoch)
    max_version_ts: int

    @classmethod
    def ahead_of_now(cls, max_ahead_seconds: float) -> Bounds:
        now = time.time()
        return cls(min(unix_to_timestamp(now + max_ahead_seconds), MAX_TIMESTAMP),
                   int((now + max_ahead_seconds) * 1_000_000))


def parse_position(value: Any, field: str, bounds: Bounds) -> Position:
    """A change-log position ``[timestamp, seq]``: (0, 0) (nothing yet), or a commit timestamp not past
    ``bounds`` with a seq in [0, 2**64) (a heartbeat's seq is kept as :data:`MAX_SEQ`)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise _bad(f"{field} must be a position [timestamp, seq], not {str(value)[:60]!r}", field)
    ts = _int(value[0], f"{field}[0]", 0, bounds.max_commit_ts)
    seq = _int(value[1], f"{field}[1]", 0, (1 << 64) - 1)
    return ts, min(seq, MAX_SEQ)


def parse_version(value: Any, field: str, bounds: Bounds, origin_id: int | None = None) -> Version:
    """A row version ``[timestamp, cluster id]``: a timestamp in microseconds, not past ``bounds``;
    the cluster id of a member (``origin_id``: exactly that one)."""
    if not isinstance(value, list | tuple) or len(value) < 2:
        raise _bad(f"{field} must be a version [timestamp, cluster_id], not {str(value)[:60]!r}", field)
    ts = _int(value[0], f"{field}[0]", 0, bounds.max_version_ts)
    cluster = _int(value[1], f"{field}[1]", HOUSEKEEPING_CLUSTER_ID, MAX_CLUSTER_ID)
    if origin_id is not None and cluster != origin_id:
        raise _bad(f"{field} names cluster id {cluster}: a member ships only its own changes (cluster id "
                   f"{origin_id})", field)
    return ts, cluster


@dataclass
class Action:
    """One shipped change, parsed."""

    position: Position
    kind: str
    #: the key of a delete (the key columns' values, in order)
    key: list[Any] | None
    #: the whole new row of an insert or update
    row: dict[str, Any] | None
    #: its version (the origin's)
    origin: Version
    #: the version of the row it was made on (None: made on no row)
    expected: RowVersion | None
    #: the row it was made on, for the conflict log
    before: dict[str, Any] | None
    #: its version with its delete horizon, as it stands in the order actions are resolved by
    incoming: RowVersion


@dataclass
class ApplyBatch:
    """An ``xdcr_apply`` body, parsed and range-checked (the rows are checked against the table's
    schema by the caller, which knows the table)."""

    path: str
    origin: str
    origin_id: int
    schema: Any
    start: Position | None
    end: Position
    actions: list[Action]


def parse_apply(body: dict[str, Any], bounds: Bounds, max_actions: int) -> ApplyBatch:
    """The typed batch of an ``xdcr_apply`` body, or a ``PROTOCOL_ERROR`` naming what is wrong.

    Positions run strictly after ``start`` and up to ``end``, in order; each action's version is the
    origin's own and not before the version it was made on (versions follow causality)."""
    path = body.get("path")
    origin = body.get("origin_cluster")
    if not isinstance(path, str) or not path:
        raise _bad("path must be a table path", "path")
    if not isinstance(origin, str) or not 0 < len(origin) <= 200:
        raise _bad("origin_cluster must be a cluster name", "origin_cluster")
    origin_id = _int(body.get("origin_cluster_id"), "origin_cluster_id", 0, MAX_CLUSTER_ID)
    end = parse_position(body.get("end"), "end", bounds)
    start = None if body.get("start") is None else parse_position(body.get("start"), "start", bounds)
    if start is not None and start > end:
        raise _bad(f"start {list(start)} is after end {list(end)}", "start")
    raw_actions = body.get("actions")
    if not isinstance(raw_actions, list):
        raise _bad("actions must be a list", "actions")
    if len(raw_actions) > max_actions:
        raise _bad(f"{len(raw_actions)} actions, more than the {max_actions} a batch may carry", "actions")
    actions = []
    previous = start if start is not None else (0, -1)
    for i, raw in enumerate(raw_actions):
        where = f"actions[{i}]"
        if not isinstance(raw, dict):
            raise _bad(f"{where} must be a map", where)
        position = parse_position(raw.get("p"), f"{where}.p", bounds)
        if not previous < position <= end:
            raise _bad(f"{where}.p {list(position)} is not after the previous position {list(previous)} and "
                       f"at most end {list(end)}", f"{where}.p")
        previous = position
        kind = raw.get("k")
        if kind not in ACTION_TYPES:
            raise _bad(f"{where}.k must be one of {sorted(ACTION_TYPES)}, not {str(kind)[:40]!r}", f"{where}.k")
        version = parse_version(raw.get("o"), f"{where}.o", bounds, origin_id)
        if version[0] == 0:
            raise _bad(f"{where}.o has timestamp 0", f"{where}.o")
        expected = None
        if raw.get("e") is not None:
            e = raw["e"]
            parent = parse_version(e, f"{where}.e", bounds)
            if len(e) != 3 or not isinstance(e[2], bool):
                raise _bad(f"{where}.e must be [timestamp, cluster_id, deleted]", f"{where}.e")
            if parent >= version:
                raise _bad(f"{where}.e {list(parent)} is not before the change's version {list(version)}",
                           f"{where}.e")
            expected = RowVersion(parent, e[2])
        incoming = RowVersion(version, kind == "delete", _horizon(raw, kind, version, expected, where, bounds))
        before = raw.get("b")
        if before is not None and not isinstance(before, dict):
            raise _bad(f"{where}.b must be a row (a map) or null", f"{where}.b")
        key = raw.get("key") if kind == "delete" else None
        row = raw.get("row") if kind != "delete" else None
        if kind == "delete" and not isinstance(key, list):
            raise _bad(f"{where}.key must be the key of the deleted row (a list)", f"{where}.key")
        if kind != "delete" and not isinstance(row, dict):
            raise _bad(f"{where}.row must be the new row (a map)", f"{where}.row")
        actions.append(Action(position, kind, key, row, version, expected, before, incoming))
    return ApplyBatch(path, origin, origin_id, body.get("schema"), start, end, actions)


def _horizon(raw: dict[str, Any], kind: str, version: Version, expected: RowVersion | None, where: str,
             bounds: Bounds) -> Version | None:
    """An action's delete horizon (``h``): a delete's own version; for another change, one not after
    the version it was made on. A peer that sends none (an older engine) gets the horizon its
    expected version tells: that of the tombstone it was made on, if it was."""
    if kind == "delete":
        if raw.get("h") is not None and parse_version(raw["h"], f"{where}.h", bounds) != version:
            raise _bad(f"{where}.h of a delete must be its own version {list(version)}", f"{where}.h")
        return version
    if raw.get("h") is None:
        return expected.version if expected is not None and expected.deleted else None
    horizon = parse_version(raw["h"], f"{where}.h", bounds)
    # within the history the change was made on; made on a tombstone, that tombstone's own version
    if expected is None or horizon > expected.version or (expected.deleted and horizon != expected.version):
        raise _bad(f"{where}.h {list(horizon)} is not the delete horizon of the history the change was made on "
                   f"(expected version {None if expected is None else list(expected.version)})", f"{where}.h")
    return horizon
