"""What users see of replication: ``@replicas``, a replica's attributes, lag, in-sync replicas.

Everything here reads; nothing changes a replica. Each answer is computed from one
``ReplicaSnapshot`` per replica (a copy taken under the replica's lock), so an attribute map never
mixes a progress from before a push with an error from after it, and no reader iterates state a
replicator's pass is changing.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
import yt.yson as yson

from ..errors import ErrorCode, YtError
from ..metrics import QueueTabletSample, ReplicaInfoSample, ReplicaTabletSample, StateSamples, TableSample
from ..replica_types import ReplicaMode, ReplicaState
from ..tablets import DynamicTable, tablet_id
from ..timestamps import COUNTER_BITS
from .host import ReplicationHost
from .registry import ReplicaRegistry
from .replica import Replica, ReplicaSnapshot

#: the keys of each replica in a replicated table's ``@replicas``
REPLICAS_ATTRIBUTE_KEYS = ("cluster_name", "replica_path", "state", "mode", "replication_lag_time", "errors",
                           "preserve_timestamps", "atomicity", "replicated_table_tracker_enabled")


class ReplicationStatus:
    """Reads of replica state for attributes, reads of replicated tables and get_in_sync_replicas."""

    def __init__(self, host: ReplicationHost, registry: ReplicaRegistry) -> None:
        self.host = host
        self.registry = registry

    def _table_of(self, table_id: str) -> DynamicTable | None:
        node = self.host.cypress.by_id.get(table_id)
        return node.table if node is not None else None

    def in_sync_read_replica(self, table: DynamicTable, path: str) -> Replica:
        """The replica that serves reads of a replicated table: a sync replica in sync."""
        for replica in self.registry.replicas_of(table.table_id):
            if replica.writes_synchronously:
                return replica
        raise YtError(f"No in-sync replicas found for table {path}", code=ErrorCode.NO_IN_SYNC_REPLICAS,
                      attributes={"path": path})

    def in_sync_replicas(self, table: DynamicTable, timestamp: int) -> list[str]:
        """Sync replicas in sync, and async replicas with every change up to ``timestamp``."""
        out = []
        snapshots = [r.snapshot() for r in self.registry.replicas_of(table.table_id)]
        with self.host.storage.read() as conn:
            for snap in snapshots:
                if snap.state is not ReplicaState.ENABLED or snap.history_trimmed:
                    continue  # (a replica missing history is never enabled: belt and braces)
                if snap.mode is ReplicaMode.SYNC:
                    # a sync replica still catching up is not in sync, whatever it has already
                    if snap.writes_synchronously:
                        out.append(snap.id)
                    continue
                ok = True
                for tablet in range(table.tablet_count):
                    progress = snap.progress_of(tablet)
                    if progress.row_index >= table.tablet_rows.get(tablet, [0, 0])[0]:
                        continue
                    # the oldest change the replica misses decides, not a timestamp moved by traffic
                    first = table.first_timestamp_from(conn, tablet, progress.row_index)
                    if first is not None and first <= timestamp:
                        ok = False
                        break
                if ok:
                    out.append(snap.id)
        return out

    @staticmethod
    def tablet_lag_ms(snap: ReplicaSnapshot, table: DynamicTable, tablet: int, conn: sa.Connection) -> int:
        if snap.mode is ReplicaMode.SYNC and snap.writes_synchronously:
            return 0
        progress = snap.progress_of(tablet)
        end = table.tablet_rows.get(tablet, [0, 0])[0]
        if progress.row_index >= end:
            return 0
        # rows are waiting: the replica is as old as its replication timestamp (moved to just before
        # the first change it lacks by the commit that queued it, Replica.note_queued, however long
        # the tablet was idle before), so a stuck replica's lag keeps growing, as in YT
        since = progress.timestamp or table.first_timestamp_from(conn, tablet, progress.row_index) or 0
        now = time.time()
        return max(0, int((now - (since >> COUNTER_BITS)) * 1000)) if since else 0

    def describe(self, replica: Replica, with_tablets: bool = True) -> dict[str, Any]:
        """The attributes of a ``table_replica`` object (``yt get '#<id>/@'``)."""
        snap = replica.snapshot()
        table = self._table_of(snap.table_id)
        attrs = snap.attributes()
        attrs["replicated_table_tracker_enabled"] = snap.tracker_enabled
        attrs["errors"] = list(snap.errors)
        tablets = []
        lag = 0
        if table is not None:
            with self.host.storage.read() as conn:
                for t in range(table.tablet_count):
                    progress = snap.progress_of(t)
                    rows, trimmed = table.tablet_rows.get(t, [0, 0])
                    tablet_lag = self.tablet_lag_ms(snap, table, t, conn)
                    lag = max(lag, tablet_lag)
                    tablet: dict[str, Any] = {
                        "tablet_id": tablet_id(table.table_id, t), "state": snap.state.value,
                        "current_replication_row_index": progress.row_index,
                        "current_replication_timestamp": yson.YsonUint64(progress.timestamp),
                        "replication_lag_time": tablet_lag, "flushed_row_count": rows, "trimmed_row_count": trimmed}
                    if progress.error is not None:
                        # seed 002: "If there is no error, this tag will also be missing"
                        tablet["replication_error"] = progress.error
                    tablets.append(tablet)
        attrs["replication_lag_time"] = lag
        if with_tablets:
            attrs["tablets"] = tablets
        return attrs

    def metric_samples(self) -> StateSamples:
        """The replication figures of ``/metrics`` (``metrics.StateCollector``), read at scrape time.

        The same numbers as ``describe`` (one snapshot per replica, so lag and rows behind agree),
        for every replicated table of this meta-cluster. No lock is held while reading SQL (the
        snapshots are copies; ``tablet_rows`` is read as ``describe`` reads it)."""
        out = StateSamples()
        by_table: dict[str, list[ReplicaSnapshot]] = {}
        for replica in self.registry.all():
            snap = replica.snapshot()
            by_table.setdefault(snap.table_id, []).append(snap)
        with self.host.storage.read() as conn:
            for node in list(self.host.cypress.by_id.values()):
                table = node.table
                if table is None or not table.replicated:
                    continue
                path = node.path
                snaps = by_table.get(table.table_id, [])
                out.tables.append(TableSample(path, sum(1 for s in snaps if s.writes_synchronously)))
                for t in range(table.tablet_count):
                    rows, trimmed = table.tablet_rows.get(t, [0, 0])
                    out.queue_tablets.append(QueueTabletSample(path, t, max(0, rows - trimmed), trimmed, rows))
                for snap in snaps:
                    out.replicas.append(ReplicaInfoSample(path, snap.id, snap.cluster_name, snap.mode.value,
                                                          snap.state.value))
                    for t in range(table.tablet_count):
                        rows = table.tablet_rows.get(t, [0, 0])[0]
                        out.replica_tablets.append(ReplicaTabletSample(
                            path, snap.id, snap.cluster_name, t, self.tablet_lag_ms(snap, table, t, conn) / 1000.0,
                            max(0, rows - snap.progress_of(t).row_index)))
        return out

    def replicas_attribute(self, table_id: str) -> dict[str, Any]:
        """A replicated table's ``@replicas``."""
        out = {}
        for replica in self.registry.replicas_of(table_id):
            full = self.describe(replica, with_tablets=False)
            out[replica.id] = {k: full[k] for k in REPLICAS_ATTRIBUTE_KEYS}
        return out
