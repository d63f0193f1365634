"""Trimming the replication queues (meta-cluster side): rows every replica has, once old enough.

A queue row goes once every replica that holds the queue back has it and it is older than the
table's ``min_replication_log_ttl`` (and than what change streams hold: ``ReplicationHost.stream_hold``).
The floor (the least progress of the table's replicas) is taken again under the storage writer, so
a replica created meanwhile (it starts at the oldest row still queued) is counted. A replica never
enabled counts for ``bootstrap_pin_ttl`` after its creation (it pins the history while its
bootstrap copy runs); an abandoned one stops holding the queue back then, and once rows it needs
are trimmed it is marked as missing history (it cannot be enabled, and says why) instead of
silently missing rows.

The replication maintenance runs this once a second over every replicated table, so what an idle
table costs is what matters at thousands of tables: an empty queue is passed over with two reads of
memory; a queue whose rows every replica has but which are younger than the table's
``min_replication_log_ttl`` is passed over by the timestamp of its oldest row, read once (a read
connection) and remembered until that row is trimmed; a table whose every queued row is that young
is passed over whole until the clock reaches its oldest row's second plus the ttl. The change
streams' hold (a read of the vital consumers) is asked only of a queue with rows that old, and no
write transaction is opened for a queue with nothing to drop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import sqlalchemy as sa

from ..config import EngineConfig
from ..replica_types import ReplicaState
from ..tablets import DynamicTable
from ..timestamps import COUNTER_BITS
from .host import ReplicationHost
from .options import DEFAULT_MIN_REPLICATION_LOG_TTL_MS, TRIMMED_TIMESTAMP_ATTRIBUTE
from .registry import ReplicaRegistry
from .replica import Replica, history_trimmed_error

log = logging.getLogger("reptables.engine.replication")


class QueueTrimmer:
    """``trim_queues``, with what it learnt of the oldest rows of the queues it passed over."""

    def __init__(self, host: ReplicationHost, registry: ReplicaRegistry, config: EngineConfig) -> None:
        self.host = host
        self.registry = registry
        self.config = config
        #: (table id, layout revision, tablet) -> (trimmed row count, commit timestamp of the oldest row
        #: still queued); only the maintenance thread uses it (one pass at a time)
        self._oldest: dict[tuple[str, int, int], tuple[int, int]] = {}
        #: table id -> a table whose every queued row was too young to drop at the last pass: until
        #: when (``time.time()``) that holds, for which ``min_replication_log_ttl`` and layout, and its
        #: entries of ``_oldest``. Passes before then skip the table without looking at its tablets
        #: (a thousand tables written in the last 5 minutes cost a pass a fifth of its time otherwise)
        self._young: dict[str, _Young] = {}

    def trim_queues(self) -> None:
        """Drop queue rows every replica has, once older than min_replication_log_ttl."""
        host, registry = self.host, self.registry
        now = time.time()
        seen: dict[tuple[str, int, int], tuple[int, int]] = {}
        young: dict[str, _Young] = {}
        for node in list(host.cypress.by_id.values()):
            table = node.table
            if table is None or not table.replicated:
                continue
            ttl_ms = int(node.attributes.get("min_replication_log_ttl", DEFAULT_MIN_REPLICATION_LOG_TTL_MS))
            known = self._young.get(table.table_id)
            if known is not None and now < known.until and known.ttl_ms == ttl_ms and \
                    known.layout_revision == table.layout_revision:
                # (rows queued since are younger still; a trim of the table's rows is this pass's own)
                young[table.table_id] = known
                seen.update(known.oldest)
                continue
            ttl_horizon: int | None = None
            horizon: int | None = None
            # whether every tablet with rows was passed over as too young, and its oldest row's time
            all_young, youngest_until = True, float("inf")
            own: list[tuple[tuple[str, int, int], tuple[int, int]]] = []

            def holding(table: DynamicTable = table) -> tuple[list[Replica], list[Replica]]:
                """(replicas that hold the queue back, abandoned ones that no longer do)."""
                hold, expired = [], []
                for replica in registry.replicas_of(table.table_id):
                    snap = replica.snapshot()
                    if not snap.enabled_once and snap.state is ReplicaState.DISABLED and \
                            now - snap.created_at > self.config.bootstrap_pin_ttl:
                        expired.append(replica)
                    else:
                        hold.append(replica)
                return hold, expired

            def floor(tablet: int, hold: list[Replica], table: DynamicTable = table) -> tuple[int, int]:
                rows, trimmed = table.tablet_rows.get(tablet, [0, 0])
                low = min((r.progress_of(tablet).row_index for r in hold), default=rows)
                return low, trimmed

            # (the tablets with a row count at all; an idle table's pass is a look at each of them)
            for tablet, (rows, trimmed) in list(table.tablet_rows.items()):
                if rows <= trimmed or tablet >= table.tablet_count:
                    continue  # an empty queue (or a tablet of an earlier layout: never trimmed here)
                if ttl_horizon is None:
                    ttl_horizon = host.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
                key = (table.table_id, table.layout_revision, tablet)
                oldest = self._oldest.get(key)
                if oldest is None or oldest[0] != trimmed:
                    with host.storage.read() as conn:
                        ts = table.first_timestamp_from(conn, tablet, trimmed)
                    oldest = (trimmed, ts) if ts is not None else None
                if oldest is not None:
                    seen[key] = oldest
                    own.append((key, oldest))
                    if oldest[1] > ttl_horizon:
                        # the oldest row queued is too young: nothing to drop yet, whoever has it (until
                        # the clock passes its second + the ttl; timestamps are (seconds << 30) | counter)
                        youngest_until = min(youngest_until, (oldest[1] >> COUNTER_BITS) + ttl_ms / 1000)
                        continue
                all_young = False
                hold, expired = holding()
                low, trimmed = floor(tablet, hold)
                if low <= trimmed:
                    continue
                if horizon is None:
                    # change streams (retention, vital consumers) may hold it back further: a read,
                    # asked only of a queue that has rows old enough
                    held = host.stream_hold(table, node)
                    horizon = ttl_horizon if held is None else min(ttl_horizon, held)
                if oldest is not None and oldest[1] > horizon:
                    continue
                with host.storage.write() as conn:
                    hold, expired = holding()
                    low, trimmed = floor(tablet, hold)
                    if low > trimmed and table.trim_queue(conn, tablet, low, horizon):
                        node.attributes[TRIMMED_TIMESTAMP_ATTRIBUTE] = table.trimmed_timestamp
                        host.cypress.save(conn, node)
                        _mark_missing_history(registry, expired, table, tablet, conn)
            if all_young and own:
                young[table.table_id] = _Young(youngest_until, ttl_ms, table.layout_revision, own)
        self._oldest = seen
        self._young = young


@dataclass(frozen=True)
class _Young:
    """A replicated table whose queued rows are all younger than its ttl until ``until``."""

    until: float
    ttl_ms: int
    layout_revision: int
    oldest: list[tuple[tuple[str, int, int], tuple[int, int]]]


def _mark_missing_history(registry: ReplicaRegistry, expired: list[Replica], table: DynamicTable, tablet: int,
                          conn: sa.Connection) -> None:
    """Replicas whose pin expired and whose rows were just trimmed: they miss history now, and say so."""
    trimmed_rows = table.tablet_rows.get(tablet, [0, 0])[1]
    for replica in expired:
        if replica.progress_of(tablet).row_index >= trimmed_rows or \
                table.trimmed_timestamp <= replica.start_replication_timestamp or replica.history_trimmed:
            continue
        replica.mark_history_trimmed(table.trimmed_timestamp)
        error = history_trimmed_error(replica, table.trimmed_timestamp)
        replica.record_error(None, {"code": error.code, "message": error.message, "attributes": error.attributes}, 0.0)
        registry.save(conn, replica)
        log.warning("bootstrap pin expired: replica misses trimmed history", extra={
            "replica_id": replica.id, "path": replica.table_path, "trimmed_timestamp": table.trimmed_timestamp})
