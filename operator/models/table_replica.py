"""TableReplica: one replica of a ReplicatedTable on a TableCluster, and its bootstrap copy.

Replica mode and state are the engine's :mod:`reptables.engine.replica_types`, the words the engine
stores and ``@replicas`` reports, so status copies them without translation.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from reptables.engine.replica_types import ReplicaMode, ReplicaState

from .common import (
    AGE_COLUMN,
    MAX_TIMESTAMP,
    READY_COLUMN,
    ApiModel,
    BaseResource,
    BaseStatus,
    DeletionPolicy,
    ObjectName,
    PrinterColumn,
    ResourceInfo,
    Scope,
    StatusModel,
    Unreachable,
    YPath,
    immutable,
)

__all__ = [
    "Atomicity", "Bootstrap", "BootstrapPhase", "BootstrapStatus", "ReplicaError", "TableReplica", "TableReplicaSpec",
    "TableReplicaStatus", "TabletsSummary",
]


class Atomicity(StrEnum):
    FULL = "full"
    NONE = "none"


class Bootstrap(ApiModel):
    """Copying the existing rows into a new replica before it is enabled."""

    enabled: StrictBool = True
    """Bootstrap a new replica of a table that already holds rows, from another enabled replica: always
    when the table's replication queue was trimmed (the engine refuses to enable a replica whose
    history is gone), and when the operator can run jobs also for an untrimmed queue (the copy
    replaces replaying it). When false the replica starts from the queue and receives only what it
    still holds."""
    always: StrictBool = False
    """Bootstrap even a table that holds no rows yet."""
    parallelism: StrictInt = Field(default=2, ge=1, le=1024)
    """Number of parallel Spark partitions (and executors) of the copy."""
    verify: StrictBool = True
    """Compare the copy with its source at the snapshot timestamp (the verify job) before enabling."""
    max_attempts: StrictInt = Field(default=3, ge=1, le=100)
    """Attempts of the copy (and verification) before the bootstrap is Failed."""
    backoff_seconds: StrictInt = Field(default=10, ge=1, le=3600)
    """Wait before the second attempt; doubled before each further one (at most 10 minutes)."""


class TableReplicaSpec(ApiModel):
    """A replica of a ReplicatedTable on a TableCluster (YT's table_replica)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.preserveTimestamps || (self.mode == 'async' && !self.enableReplicatedTableTracker)",
         "message": "a replica with preserveTimestamps: false can only be asynchronous: set mode: async and "
                    "enableReplicatedTableTracker: false"},
        {"rule": "has(self.startReplicationTimestamp) == has(oldSelf.startReplicationTimestamp) && "
                 "(!has(self.startReplicationTimestamp) || "
                 "self.startReplicationTimestamp == oldSelf.startReplicationTimestamp)",
         "message": "startReplicationTimestamp is immutable"},
        {"rule": "self.atomicity == 'full' || (self.mode == 'async' && !self.enableReplicatedTableTracker)",
         "message": "a replica with atomicity: none can only be asynchronous: set mode: async and "
                    "enableReplicatedTableTracker: false"},
    ]})

    table: ObjectName = Field(json_schema_extra=immutable("table"))
    """Name of the ReplicatedTable (same namespace); immutable."""
    cluster: ObjectName = Field(json_schema_extra=immutable("cluster"))
    """Name of the TableCluster holding the replica table; immutable."""
    replica_path: YPath = Field(json_schema_extra=immutable("replicaPath"))
    """Path of the replica table on that cluster; immutable."""
    enabled: StrictBool = True
    """Replicate to this replica (disabled replicas keep their position and catch up when enabled)."""
    mode: ReplicaMode = ReplicaMode.ASYNC
    """sync or async; applies when the tracker does not own the replica (tracking disabled on the table
    or on this replica); otherwise only the initial mode."""
    enable_replicated_table_tracker: StrictBool = True
    """Let the tracker switch this replica's mode (when the table enables the tracker)."""
    preserve_timestamps: StrictBool = Field(default=True, json_schema_extra=immutable("preserveTimestamps"))
    """Write rows with the meta-cluster's commit timestamps; false writes with the replica cluster's own
    timestamps into a table without upstream_replica_id (async only); immutable."""
    atomicity: Atomicity = Atomicity.FULL
    """full or none: the atomicity of the replication writes and of the replica table (created so; an
    existing one must match). ``none`` only for asynchronous replicas the tracker leaves alone."""
    start_replication_timestamp: StrictInt | None = Field(default=None, ge=0, le=MAX_TIMESTAMP,
                                                         json_schema_extra={"format": "int64"})
    """Replicate only changes committed after this meta-cluster timestamp; immutable. Usually left unset:
    the bootstrap chooses it."""
    bootstrap: Bootstrap = Field(default_factory=Bootstrap, json_schema_extra={"default": {}})
    """The initial copy of existing rows."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """Retain keeps the replica object on the meta-cluster and the replica table with its rows when the
    resource is deleted (a TableReplica for the same cluster and path adopts them again; until then the
    replica gets no changes and holds the table's queue); Delete removes both."""

    @model_validator(mode="after")
    def _timestamps_preserved_or_async(self) -> TableReplicaSpec:
        if not self.preserve_timestamps and (self.mode is not ReplicaMode.ASYNC or
                                             self.enable_replicated_table_tracker):
            raise ValueError("a replica with preserveTimestamps: false can only be asynchronous: "
                             "set mode: async and enableReplicatedTableTracker: false")
        if self.atomicity.value == "none" and (self.mode is not ReplicaMode.ASYNC or
                                               self.enable_replicated_table_tracker):
            raise ValueError("a replica with atomicity: none can only be asynchronous: "
                             "set mode: async and enableReplicatedTableTracker: false")
        return self


class TabletsSummary(StatusModel):
    """Per-tablet replication progress, summarised (the details are metrics)."""

    count: StrictInt | None = Field(default=None, ge=0)
    """Number of tablets."""
    max_lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """Largest tablet lag in seconds."""
    errors: StrictInt | None = Field(default=None, ge=0)
    """Number of tablets with a replication error."""
    rows_behind: StrictInt | None = Field(default=None, ge=0)
    """Queue rows not yet replicated to this replica, summed over tablets (``flushed_row_count`` minus
    ``current_replication_row_index`` of each tablet of ``#<replica id>/@tablets``)."""


class ReplicaError(StatusModel):
    """A replication error, as the engine reports it."""

    code: StrictInt | None = None
    """YT error code."""
    message: StrictStr
    """Error message."""


class BootstrapPhase(StrEnum):
    PENDING = "Pending"
    COPYING = "Copying"
    VERIFYING = "Verifying"
    ENABLING = "Enabling"
    DONE = "Done"
    FAILED = "Failed"


class BootstrapStatus(StatusModel):
    """Progress of the initial copy."""

    phase: BootstrapPhase | None = None
    """Pending (the replica exists, disabled; the next attempt is about to start), Copying, Verifying,
    Enabling, Done, or Failed (every attempt failed; the message is in the Bootstrapped condition)."""
    snapshot_timestamp: StrictInt | None = Field(default=None, ge=0, le=MAX_TIMESTAMP,
                                                json_schema_extra={"format": "int64"})
    """The snapshot timestamp copied; the replica's start_replication_timestamp."""
    source_replica_id: StrictStr | None = None
    """The replica copied from (enabled, in sync at the snapshot timestamp)."""
    attempts: StrictInt | None = Field(default=None, ge=0)
    """Attempts started so far."""
    rows_copied: StrictInt | None = Field(default=None, ge=0)
    """Rows the last successful copy wrote (the job's log)."""
    job_ref: StrictStr | None = None
    """The running (or last) job: ``local:<name>`` for a local run."""
    next_attempt_time: StrictStr | None = None
    """When a failed attempt is retried (RFC 3339)."""
    last_error: StrictStr | None = None
    """The failed job's error line."""


class TableReplicaStatus(BaseStatus):
    """The replica as the meta-cluster reports it."""

    replica_id: StrictStr | None = None
    """Object id of the table_replica on the meta-cluster (the replica table's upstream_replica_id)."""
    replica_table_id: StrictStr | None = None
    """Object id of the replica table the replica fills. If that table is removed or replaced, the
    replica starts over as a new one that gets every row (reason ReplicaTableLost)."""
    state: ReplicaState | None = None
    """disabled, enabling, enabled or disabling."""
    mode: ReplicaMode | None = None
    """Current mode, as the meta-cluster reports it (the tracker may have changed it); absent while the
    meta-cluster does not answer."""
    lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """Replication lag in seconds (YT's replication_lag_time, coarse), as the meta-cluster reports it."""
    tablets: TabletsSummary | None = None
    """Tablet summary."""
    errors: list[ReplicaError] = Field(default_factory=list, max_length=100)
    """Current replication errors."""
    bootstrap: BootstrapStatus | None = None
    """The initial copy."""
    unreachable: Unreachable | None = None
    """Set while the replica's cluster (or the meta-cluster) does not answer. With the replica cluster
    down, mode, lag and rows behind still come from the meta-cluster; with the meta-cluster down they
    are unknown (absent), never the last ones seen."""


class TableReplica(BaseResource):
    """A replica of a ReplicatedTable on a TableCluster."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tablereplicas", Scope.NAMESPACED, ("trep",), (
        PrinterColumn("Table", "string", ".spec.table", "The ReplicatedTable"),
        PrinterColumn("Cluster", "string", ".spec.cluster", "The replica cluster"),
        PrinterColumn("Mode", "string", ".status.mode", "Current mode: sync or async"),
        PrinterColumn("State", "string", ".status.state", "disabled, enabling, enabled or disabling"),
        PrinterColumn("Lag", "integer", ".status.lagSeconds", "Replication lag in seconds"),
        READY_COLUMN, AGE_COLUMN))

    kind: Literal["TableReplica"]
    spec: TableReplicaSpec
    status: TableReplicaStatus = Field(default_factory=TableReplicaStatus)

