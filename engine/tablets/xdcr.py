"""XDCR (seed 001) at the row level: row versions and the conflict rules.

Every row of an XDCR table has a *version*: the commit timestamp and the cluster id of its last
change (a delete leaves a versioned tombstone). Versions compare by timestamp, then cluster id, so
two clusters never tie. They live in ``_rt_xdcr_rows`` beside the table's rows, written in the same
SQL transaction as the change (``DynamicTable._apply_sorted``).

A change shipped to a peer carries its kind, the new row, its own version and the version the row
had before it on the origin (the *expected* version). The receiver resolves it with
:func:`resolve` against the row it has, the seed's rules per action:

* no conflict when the row is at the expected version: the change applies;
* a conflict is a *missing row* (MISS: an update or delete of a row that is not there), a
  *timestamp mismatch* (MSMT: the row is there at another version), or a *constraint violation*
  (CNST: an insert of a key that exists; the key is the primary key);
* DELETE always wins; otherwise the later version wins; an accepted action overwrites the whole row.

One refinement makes every cluster converge when three or more write: an update whose row is
missing *without a tombstone* has not met a delete, only a row whose insert has not arrived from
a third cluster yet, so it is accepted as the whole row it carries; and an action whose expected
version is newer than the tombstone it meets was made after that delete (a re-insert), so the
delete does not beat it. Both are resolved the same way on every cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from ..storage import system_upsert, xdcr_rows_table

#: (timestamp, cluster id): ordered by timestamp, then cluster id
Version = tuple[int, int]


class VersionClock:
    """The timestamps of XDCR versions: a hybrid logical clock in microseconds since the epoch.

    Commit timestamps cannot order changes across clusters: their low bits count commits within a
    second, so two clusters' commits of one second compare by how busy each was. A version's
    timestamp is the wall clock instead, never going back and always past every version this
    cluster has seen (``observe``): a change made after seeing another is later than it, on every
    cluster. ``_lock`` guards ``_last``: a **leaf**, taken under the storage writer by commits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0

    def next(self) -> int:
        with self._lock:
            self._last = max(time.time_ns() // 1000, self._last + 1)
            return self._last

    def observe(self, ts: int) -> None:
        with self._lock:
            if ts > self._last:
                self._last = ts


@dataclass(frozen=True)
class RowVersion:
    version: Version
    deleted: bool
    #: the version this change was made on (None: on no row)
    parent: Version | None = None


def key_text(key: Iterable[Any]) -> str:
    """A row key as the text that identifies it in ``_rt_xdcr_rows`` (JSON: keys are scalars)."""
    return orjson.dumps(list(key)).decode()


_READ = sa.select(xdcr_rows_table.c.row_key, xdcr_rows_table.c.timestamp, xdcr_rows_table.c.cluster_id,
                  xdcr_rows_table.c.deleted, xdcr_rows_table.c.parent_timestamp,
                  xdcr_rows_table.c.parent_cluster_id).where(
    xdcr_rows_table.c.table_id == sa.bindparam("table_id"),
    xdcr_rows_table.c.row_key.in_(sa.bindparam("keys", expanding=True)))
_COLUMNS = ["table_id", "row_key", "cluster_id", "timestamp", "deleted", "parent_timestamp", "parent_cluster_id"]


def read_versions(conn: sa.Connection, table_id: str, keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], RowVersion]:
    """The stored versions of ``keys`` (absent: the key never had a row here). One statement per
    500 keys, compiled once (an expanding IN list)."""
    out: dict[tuple[Any, ...], RowVersion] = {}
    if not keys:
        return out
    by_text = {key_text(k): k for k in keys}
    texts = list(by_text)
    for i in range(0, len(texts), 500):
        for row in conn.execute(_READ, {"table_id": table_id, "keys": texts[i:i + 500]}):
            parent = None if row[4] is None else (int(row[4]), int(row[5]))
            out[by_text[row[0]]] = RowVersion((int(row[1]), int(row[2])), bool(row[3]), parent)
    return out


def write_versions(conn: sa.Connection, table_id: str, versions: dict[tuple[Any, ...], RowVersion]) -> None:
    """Store the new version of each changed row (inside the commit's SQL transaction): one upsert,
    compiled once, run on plain tuples."""
    if not versions:
        return
    rows = [(table_id, key_text(k), v.version[1], v.version[0], v.deleted,
             None if v.parent is None else v.parent[0], None if v.parent is None else v.parent[1])
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


def resolve(kind: str, version: Version, expected: RowVersion | None, current: RowVersion | None) -> Resolution:
    """The seed's rules for one action (``kind`` insert/update/delete, its ``version``, the
    ``expected`` version it was made on, None for a row the origin never had) against the
    ``current`` version here (None: never a row here)."""
    here = current if current is not None and not current.deleted else None
    if _same(expected, current):
        return Resolution(True, "NONE")
    if kind == "delete":
        if here is None:
            return Resolution(True, "MISS")  # deleted already: a no-op (the later tombstone stays)
        # DELETE always wins - over changes it did not see, not over one made after it
        made_after = here.parent is not None and here.parent >= version
        return Resolution(not made_after, "MSMT")
    if here is not None:
        if kind == "insert":
            return Resolution(version > here.version, "CNST", on_primary_key=True)
        return Resolution(version > here.version, "MSMT")
    # the row is missing here
    if current is None:
        # no delete was ever seen here: the row's insert has not arrived yet (three or more clusters)
        return Resolution(True, "MISS")
    # a tombstone: DELETE wins, unless the action was made after that delete
    made_after = expected is not None and expected.version >= current.version
    return Resolution(made_after, "MISS")


def _same(expected: RowVersion | None, current: RowVersion | None) -> bool:
    """Whether the row here is what the action was made on."""
    if expected is None:
        return current is None
    return current is not None and current.deleted == expected.deleted and current.version == expected.version


def newer(a: Version, b: Version) -> Version:
    return a if a > b else b
