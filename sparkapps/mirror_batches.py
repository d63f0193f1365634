"""The stream half of a mirror: each micro-batch of changes into PostgreSQL in one transaction.

``BatchApplier`` is the ``foreachBatch`` function of the mirror job's streaming query
(``mirror.py``): it folds a micro-batch's changes into one net change per key (:func:`fold`) and
applies those in one PostgreSQL transaction (:func:`apply_changes`) with the statements of
``mirror_pg.py``, where the newest token wins.

What is tricky:

* Order. Spark hands a micro-batch's rows in no particular order; they are sorted by their stream
  position (the first 32 hex digits of the event token) before they are folded.
* Partial rows. An update that names only some columns, of a key this batch has not seen before,
  stays partial: only those columns are written, onto whatever the row holds. A full-row write,
  or a write after a delete in the same batch, is a whole new row: the columns it lacks are null.
* Replays. A batch applied in PostgreSQL but not yet recorded in Spark's checkpoint is replayed
  after a restart; every change in it is then a no-op (newest token wins). A batch that fails on
  a broken connection closes it: the replay of the batch gets a new one.
* A change the mirror cannot hold (a column the mirrored schema does not have, a change without
  a key, a kind other than insert, update, upsert or delete) fails the job, naming the change.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from .mirror_pg import PgLayout
from .options import ReptablesSparkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: the mirror job's logger (its lines name the job, whichever of its modules writes them)
log = logging.getLogger("reptables.sparkapps.mirror")


@dataclass
class NetChange:
    """What the changes of one key in one micro-batch amount to, at the token of the last of them."""

    token: str
    #: None: the key ends deleted; else the columns written (all of them unless ``partial``)
    values: dict[str, Any] | None
    #: only some columns are known (a partial-row write onto a row this batch did not see)
    partial: bool = False


def fold(changes: Iterable[Mapping[str, Any]], layout: PgLayout, path: str) -> dict[tuple[Any, ...], NetChange]:
    """The net change per key of a micro-batch's changes (in stream order)."""
    out: dict[tuple[Any, ...], NetChange] = {}
    keys = layout.keys
    known = set(layout.names)
    for change in changes:
        kind = str(change["kind"])
        token = str(change["event_token"])
        key_values = json.loads(change["key"]) if change["key"] is not None else None
        if not isinstance(key_values, dict) or any(k not in key_values for k in keys):
            raise ReptablesSparkError(f"mirror: change {token} of {path} ({kind}) has no key "
                                      f"{list(keys)}: only sorted tables can be mirrored")
        key = tuple(key_values[k] for k in keys)
        if kind == "delete":
            out[key] = NetChange(token, None)
            continue
        if kind not in ("insert", "update", "upsert"):
            raise ReptablesSparkError(f"mirror: change {token} of {path} has kind {kind!r}, which a mirror of a "
                                      "sorted table cannot apply")
        row = json.loads(change["row"]) if change["row"] is not None else {}
        written = {n: v for n, v in row.items() if not n.startswith("$")}
        unknown = sorted(set(written) - known)
        if unknown:
            raise ReptablesSparkError(f"mirror: change {token} of {path} writes columns {unknown} that the mirrored "
                                      "schema does not have: the table's schema changed; start a new mirror")
        values = {n: v for n, v in written.items() if n not in keys}
        before = out.get(key)
        if not change["update"]:  # a full row: columns it lacks are null
            out[key] = NetChange(token, {c: values.get(c) for c in layout.names if c not in keys})
        elif before is None:
            out[key] = NetChange(token, values, partial=True)
        elif before.values is None:  # written after a delete: a new row, the other columns null
            out[key] = NetChange(token, {c: values.get(c) for c in layout.names if c not in keys})
        else:
            out[key] = NetChange(token, {**before.values, **values}, partial=before.partial)
    return out


def apply_changes(conn: psycopg.Connection[Any], layout: PgLayout, net: Mapping[tuple[Any, ...], NetChange]) -> None:
    """Apply the net changes in the connection's current transaction (one statement kind at a time)."""
    writes: dict[tuple[str, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    deletes: list[dict[str, Any]] = []
    for key, change in net.items():
        at: dict[str, Any] = {f"k{i}": v for i, v in enumerate(key)}
        at["t"] = change.token
        if change.values is None:
            deletes.append(at)
            continue
        names = tuple(sorted(change.values))
        values = {f"c{i}": layout.value(n, change.values[n]) for i, n in enumerate(names)}
        writes.setdefault(names, []).append((at, values))
    with conn.cursor() as cur:
        for names, rows in writes.items():
            cur.executemany(layout.write_statement(names), [{**at, **values} for at, values in rows])
            cur.executemany(layout.clear_tombstone_statement(), [at for at, _ in rows])
        if deletes:
            delete, tombstone = layout.delete_statements()
            cur.executemany(delete, deletes)
            cur.executemany(tombstone, deletes)


class BatchApplier:
    """The ``foreachBatch`` function: each micro-batch's changes in one PostgreSQL transaction."""

    def __init__(self, dsn: str, layout: PgLayout, path: str) -> None:
        self.dsn, self.layout, self.path = dsn, layout, path
        self._conn: psycopg.Connection[Any] | None = None
        self.changes_applied = 0
        #: monotonic time of the last batch that had changes (or of the start)
        self.last_change = time.monotonic()
        self.last_token: str | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, connect_timeout=30)
        return self._conn

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        changes = sorted((r.asDict() for r in batch.collect()), key=lambda c: str(c["event_token"])[:32])
        if not changes:
            return
        net = fold(changes, self.layout, self.path)
        conn = self._connection()
        try:
            with conn.transaction():
                apply_changes(conn, self.layout, net)
        except psycopg.OperationalError:
            conn.close()  # a new connection for the replay of this batch
            raise
        self.changes_applied += len(changes)
        self.last_token = str(changes[-1]["event_token"])
        self.last_change = time.monotonic()
        log.info("batch %d: applied %d changes of %d keys to %s (up to %s)", batch_id, len(changes), len(net),
                 self.layout.pg_table, self.last_token)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

