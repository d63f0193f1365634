"""ReplicatedTable: a replicated table on its meta-cluster, its schema and replication options.

The column types are the engine's own :class:`~reptables.engine.schema.ColumnType`: a manifest may
name exactly the types the engine stores, and a type added to the engine appears in the CRD's
``enum`` the next time ``hack/gen-crds`` runs (the CRD test then says the files are stale).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from reptables.engine.replica_types import ReplicaMode, ReplicaState
from reptables.engine.schema import ColumnType

from .common import (
    AGE_COLUMN,
    MAX_COLUMNS,
    MAX_TABLETS,
    READY_COLUMN,
    SET_LIST,
    ApiModel,
    BaseResource,
    BaseStatus,
    DeletionPolicy,
    Duration,
    IntOrString,
    NameSet,
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
    "Column", "ColumnType", "ReplicaSummary", "ReplicatedTable", "ReplicatedTableOptions", "ReplicatedTableSpec",
    "ReplicatedTableStatus", "ReplicationThrottler", "SchemaMigrationPhase", "SchemaMigrationStatus", "SortOrder",
    "TrackerStatus", "TrackerSwitch", "MAX_TRACKER_SWITCHES",
]


class SortOrder(StrEnum):
    ASCENDING = "ascending"


class Column(ApiModel):
    """A column of the table schema; columns with sortOrder are the key and come first."""

    name: StrictStr = Field(min_length=1, max_length=256, pattern=r"^[^$]")
    """Column name (names starting with $ are reserved for system columns)."""
    type: ColumnType
    """Column type."""
    sort_order: SortOrder | None = None
    """ascending for a key column; absent for a value column."""
    required: StrictBool = False
    """Refuse nulls in this column."""
    lock: StrictStr | None = Field(default=None, min_length=1, max_length=256)
    """Lock group: writes to columns of different lock groups do not conflict."""


class ReplicatedTableOptions(ApiModel):
    """Options of the replicated table tracker (YT's replicated_table_options)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.minSyncReplicaCount) || !has(self.maxSyncReplicaCount) || "
                "self.minSyncReplicaCount <= self.maxSyncReplicaCount",
        "message": "minSyncReplicaCount must not exceed maxSyncReplicaCount"}]})

    enable_replicated_table_tracker: StrictBool = False
    """Let the tracker choose the sync replicas automatically."""
    min_sync_replica_count: StrictInt | None = Field(default=None, ge=0)
    """The tracker keeps at least this many sync replicas, even bad ones (default: maxSyncReplicaCount,
    or 1 when neither is set)."""
    max_sync_replica_count: StrictInt | None = Field(default=None, ge=0)
    """Maximum and desired number of sync replicas (default: the number of tracked replicas when only
    minSyncReplicaCount is set, else 1)."""
    preferred_sync_replica_clusters: NameSet | None = Field(default=None, json_schema_extra=SET_LIST)
    """TableCluster names the tracker prefers for sync replicas."""
    sync_replica_lag_threshold: Duration = Field(default="10m", validate_default=True)
    """A replica lagging more than this is unhealthy for the tracker (e.g. 90s, 10m)."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> ReplicatedTableOptions:
        low, high = self.min_sync_replica_count, self.max_sync_replica_count
        if low is not None and high is not None and low > high:
            raise ValueError(f"minSyncReplicaCount ({low}) must not exceed maxSyncReplicaCount ({high})")
        return self


class ReplicationThrottler(ApiModel):
    """Per-tablet replication bandwidth limit (YT's replication_throttler)."""

    period: StrictInt = Field(default=1000, ge=1)
    """Averaging window in milliseconds."""
    limit: StrictInt = Field(ge=1)
    """Bytes per period, per tablet."""


_KEY_COLUMNS = "filter(c, has(c.sortOrder))"
_IS_SORTED = "self.schema.exists(c, has(c.sortOrder))"


class ReplicatedTableSpec(ApiModel):
    """A replicated table on its meta-cluster, and the options of its replication."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!has(self.pivotKeys) || {_IS_SORTED}",
         "message": "pivotKeys apply to sorted tables (with key columns); use tabletCount for ordered tables"},
        {"rule": f"!has(self.tabletCount) || !{_IS_SORTED}",
         "message": "tabletCount applies to ordered tables (without key columns); use pivotKeys for sorted tables"},
    ]})

    cluster: ObjectName = Field(json_schema_extra=immutable("cluster"))
    """The meta-cluster: name of the TableCluster that holds the replicated table; immutable."""
    path: YPath = Field(json_schema_extra=immutable("path"))
    """Path of the replicated table on the meta-cluster, e.g. //home/shop/orders; immutable."""
    table_schema: list[Column] = Field(
        alias="schema", min_length=1, max_length=MAX_COLUMNS,
        json_schema_extra={
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [{
                "rule": f"self.{_KEY_COLUMNS} == oldSelf.{_KEY_COLUMNS}",
                "message": "key columns (the columns with sortOrder) are immutable"}]})
    """Columns, key columns first; a table without key columns is ordered. Value columns may change,
    key columns are immutable."""
    pivot_keys: list[list[IntOrString]] | None = Field(default=None, min_length=1, max_length=MAX_TABLETS,
                                                      json_schema_extra={"x-kubernetes-validations": [{
                                                          "rule": "size(self[0]) == 0",
                                                          "message": "the first pivot key must be []"}]})
    """Sorted tables: tablet boundaries, starting with [] (e.g. [[], [1000], [2000]])."""
    tablet_count: StrictInt | None = Field(default=None, ge=1, le=MAX_TABLETS)
    """Ordered tables: number of tablets."""
    replicated_table_options: ReplicatedTableOptions = Field(default_factory=ReplicatedTableOptions,
                                                             json_schema_extra={"default": {}})
    """Automatic sync replica switching."""
    replication_throttler: ReplicationThrottler | None = None
    """Limit the bandwidth replication uses, per tablet."""
    min_replication_log_ttl: Duration = Field(default="5m", validate_default=True)
    """Replicated rows stay in the replication log at least this long."""
    frozen: StrictBool = False
    """Freeze the table: writes are refused and every tablet is flushed."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """Retain keeps the replicated table on the meta-cluster when the resource is deleted; Delete
    removes it."""

    @field_validator("table_schema")
    @classmethod
    def _keys_first(cls, columns: list[Column]) -> list[Column]:
        names = [c.name for c in columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate column names: {', '.join(duplicates)}")
        for before, after in zip(columns, columns[1:], strict=False):
            if before.sort_order is None and after.sort_order is not None:
                raise ValueError(f"key column {after.name!r} follows value column {before.name!r}; "
                                 "key columns (with sortOrder) come first")
        return columns

    @property
    def key_columns(self) -> list[Column]:
        return [c for c in self.table_schema if c.sort_order is not None]

    @property
    def is_sorted(self) -> bool:
        return bool(self.key_columns)

    @model_validator(mode="after")
    def _sharding_matches_kind(self) -> ReplicatedTableSpec:
        if self.pivot_keys is not None:
            if not self.is_sorted:
                raise ValueError("pivotKeys apply to sorted tables (with key columns); "
                                 "use tabletCount for ordered tables")
            if self.pivot_keys[0]:
                raise ValueError(f"pivotKeys: the first pivot key must be [], not {self.pivot_keys[0]}")
            for pivot in self.pivot_keys[1:]:
                if not pivot or len(pivot) > len(self.key_columns):
                    raise ValueError(f"pivotKeys: {pivot} must be a non-empty prefix of the key columns "
                                     f"{[c.name for c in self.key_columns]}")
        if self.tablet_count is not None and self.is_sorted:
            raise ValueError("tabletCount applies to ordered tables (without key columns); "
                             "use pivotKeys for sorted tables")
        return self


class ReplicaSummary(StatusModel):
    """One replica of the table, as the meta-cluster reports it."""

    name: StrictStr
    """Name of the TableReplica."""
    cluster: StrictStr
    """Replica cluster."""
    mode: ReplicaMode | None = None
    """Current mode."""
    state: ReplicaState | None = None
    """Current state."""
    lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """Replication lag in seconds (0 for a sync replica)."""


class TrackerSwitch(StatusModel):
    """One mode change the replicated table tracker made."""

    time: datetime
    """When it was applied."""
    replica: StrictStr
    """The TableReplica (its replica object id when no TableReplica names it)."""
    replica_id: StrictStr | None = None
    """Object id of the table_replica on the meta-cluster."""
    cluster: StrictStr | None = None
    """The replica's cluster."""
    mode: ReplicaMode
    """The mode it was switched to."""
    reason: StrictStr | None = None
    """Why, e.g. the replica's cluster is unhealthy."""


MAX_TRACKER_SWITCHES = 10
"""``status.tracker.recentSwitches`` keeps at most this many switches, the newest first."""


class TrackerStatus(StatusModel):
    """The replicated table tracker's last change for this table, its recent switches and its latest check."""

    last_decision: StrictStr | None = None
    """The mode changes of the last decision that changed something, e.g. "orders-remote-1: sync -> async;
    orders-remote-0: async -> sync"."""
    reason: StrictStr | None = None
    """Why, e.g. which replica turned bad."""
    time: datetime | None = None
    """When that decision was applied."""
    recent_switches: list[TrackerSwitch] = Field(default_factory=list, max_length=MAX_TRACKER_SWITCHES)
    """The last mode changes the tracker made, newest first."""
    summary: StrictStr | None = None
    """What the latest check saw: the sync replicas, the minimum and maximum it keeps (counting sync
    replicas it does not own), and why nothing moved."""


class SchemaMigrationPhase(StrEnum):
    REPLICAS = "Replicas"
    TABLE = "Table"
    DONE = "Done"
    REFUSED = "Refused"


class SchemaMigrationStatus(StatusModel):
    """A schema edit of the manifest, applied in seed 002's order: replica tables first, then the
    replicated table."""

    phase: SchemaMigrationPhase
    """Replicas: the replica tables are being widened; Table: the replicated table is next; Done:
    the engine has the manifest's schema; Refused: the edit cannot be applied (see message)."""
    pending: list[StrictStr] = Field(default_factory=list, json_schema_extra=SET_LIST)
    """TableReplicas (or replica ids) whose replica table does not have the new schema yet."""
    message: StrictStr | None = None
    """What was done last, or why the edit is refused."""
    observed_generation: StrictInt | None = Field(default=None, ge=0)
    """The metadata.generation whose schema this migration applies."""


class ReplicatedTableStatus(BaseStatus):
    """The replicated table as the meta-cluster reports it."""

    table_id: StrictStr | None = None
    """Object id of the replicated table on the meta-cluster."""
    sync_replicas: list[StrictStr] = Field(default_factory=list, json_schema_extra=SET_LIST)
    """Names of the TableReplicas currently in sync mode."""
    replicas: list[ReplicaSummary] = Field(default_factory=list, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """Every replica with its mode, state and lag."""
    max_lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """The largest replication lag of the enabled replicas, in seconds."""
    tracker: TrackerStatus | None = None
    """The tracker's last decision, recent switches and latest check."""
    unreachable: Unreachable | None = None
    """Set while the meta-cluster does not answer: the replicas' modes and lags are unknown then (absent),
    never the last ones seen."""
    schema_migration: SchemaMigrationStatus | None = None
    """Progress of the last schema edit (value columns added, required relaxed)."""


class ReplicatedTable(BaseResource):
    """A replicated table: written on its meta-cluster, replicated to its TableReplicas."""

    info: ClassVar[ResourceInfo] = ResourceInfo("replicatedtables", Scope.NAMESPACED, ("rt",), (
        PrinterColumn("Cluster", "string", ".spec.cluster", "The meta-cluster"),
        PrinterColumn("Path", "string", ".spec.path", "Path on the meta-cluster"),
        PrinterColumn("Sync", "string", ".status.syncReplicas", "TableReplicas in sync mode"),
        PrinterColumn("Lag", "integer", ".status.maxLagSeconds", "Largest replica lag in seconds"),
        READY_COLUMN, AGE_COLUMN))

    kind: Literal["ReplicatedTable"]
    spec: ReplicatedTableSpec
    status: ReplicatedTableStatus = Field(default_factory=ReplicatedTableStatus)

