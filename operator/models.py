"""The reptables API (group ``reptables.io``, version ``v1alpha1``) as pydantic models.

These models are the single source of truth for the custom resources, as the ``api/v1`` Go types
are in CloudNativePG: ``crdgen`` turns them into the CRD manifests (field docstrings become the
CRD ``description``\\ s, ``Field`` constraints become ``minimum``/``pattern``/..., defaults become
CRD defaults, and the CEL rules attached through ``json_schema_extra`` become
``x-kubernetes-validations``), and the operator and the local runner parse every object with
them (:func:`parse_resource`), so a manifest that the API server accepts is the manifest the
operator understands.

Field names are the YTsaurus attribute names in camelCase (``min_sync_replica_count`` ->
``minSyncReplicaCount``): users move between the YT docs and ours, identical names are a feature.

The tricky parts:

* **Two validators, one contract.** The API server checks the CRD schema and the CEL rules; a
  manifest read from a file by the local runner never meets an API server. So every rule that
  needs only the new object is written twice: as CEL for the API server and as a pydantic
  validator here. Transition rules (``self == oldSelf``: identity fields cannot change) exist only
  as CEL, since a model sees one object at a time; the operator keeps its own copy of what it
  created and reports a drift, the API server refuses it first.
* **CEL must stay portable.** Rules use only standard CEL (``has``, ``all``/``exists``/``filter``,
  ``size``, comparisons) and no Kubernetes library functions, so tests evaluate them with
  cel-python against example objects. Lists that a rule iterates carry ``maxItems`` so that the
  API server's cost estimator accepts the rule.
* **Null means unset.** Optional fields are ``X | None = None`` here and plain (not ``nullable``)
  in the CRD: the API server prunes an explicit ``null`` before defaulting, so ``field: null`` and
  an absent field mean the same thing on both sides and CEL ``has()`` is exact.
* **Scalars are strict.** YAML already types values; ``enabled: "yes"`` or ``clusterId: "5"`` is
  refused here exactly as the API server refuses it, instead of being coerced.
* **Durations** are Kubernetes-style strings (``90s``, ``10m``, ``1h30m``, ``500ms``) in manifests
  and :class:`~datetime.timedelta` in Python; they render back canonically (``90s`` -> ``1m30s``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, TypeVar, overload

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from reptables.engine.replica_types import ReplicaMode, ReplicaState

GROUP = "reptables.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "reptables"

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
YPATH_PATTERN = r"^//[^/\s][^\s]*$"
URL_PATTERN = r"^https?://[^/?#\s]+(/[^\s]*)?$"
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_COLUMNS = 1024
MAX_TABLETS = 10_000
MAX_TIMESTAMP = 2**63 - 1

# --- shared building blocks ---------------------------------------------------------------------


class _Model(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python, docstrings as docs."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True,
                              extra="forbid")


class _StatusModel(_Model):
    """Status is written by the operator; an older or newer operator's extra fields are ignored."""

    model_config = ConfigDict(extra="ignore")


def _immutable(field: str) -> dict[str, Any]:
    """The CloudNativePG idiom: a transition rule that refuses any change of an identity field."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{field} is immutable"}]}


def _unique(values: list[str] | None) -> list[str] | None:
    if values is not None:
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"duplicate entries: {', '.join(duplicates)}")
    return values


_SET = {"x-kubernetes-list-type": "set"}
ObjectName = Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""The name of another reptables resource (a Kubernetes DNS subdomain name)."""
NameSet = Annotated[list[ObjectName], AfterValidator(_unique)]
YPath = Annotated[StrictStr, Field(max_length=1024, pattern=YPATH_PATTERN)]
IntOrString = Annotated[StrictInt | StrictStr, WithJsonSchema({"x-kubernetes-int-or-string": True})]

_DURATION_UNITS_MS = {"h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_DURATION_PART = re.compile(r"([0-9]+)(ms|h|m|s)")


def parse_duration(text: str) -> timedelta:
    """``"1h30m"`` -> ``timedelta(hours=1, minutes=30)``; units ``h``, ``m``, ``s``, ``ms``."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 500ms, 90s, 10m or 1h30m")
    return timedelta(milliseconds=sum(int(n) * _DURATION_UNITS_MS[u] for n, u in _DURATION_PART.findall(text)))


def format_duration(value: timedelta) -> str:
    """The canonical text of a duration: ``timedelta(seconds=90)`` -> ``"1m30s"``, zero -> ``"0s"``."""
    remaining = round(value.total_seconds() * 1000)
    if remaining < 0:
        raise ValueError(f"negative duration {value}")
    parts = []
    for unit, size in _DURATION_UNITS_MS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _duration_from_text(value: Any) -> Any:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, timedelta):
        return value
    raise ValueError("a duration is a string such as 90s, 10m or 1h30m")


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration_from_text),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]
"""A Kubernetes-style duration string (``500ms``, ``90s``, ``10m``, ``1h30m``)."""


class DeletionPolicy(StrEnum):
    """What happens to the engine objects when the resource is deleted."""

    RETAIN = "Retain"
    DELETE = "Delete"


# --- conditions and status ----------------------------------------------------------------------


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """The condition types the operator reports (see docs/crds.md for which kind has which)."""

    READY = "Ready"
    REPLICATING = "Replicating"
    WRITABLE = "Writable"
    BOOTSTRAPPED = "Bootstrapped"


class Condition(_StatusModel):
    """One aspect of the resource's state, in the Kubernetes convention (metav1.Condition)."""

    type: StrictStr = Field(max_length=316, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                                                     r"[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")
    """Type of the condition in CamelCase: Ready, Replicating, Writable, Bootstrapped."""
    status: ConditionStatus
    """True, False or Unknown."""
    observed_generation: StrictInt | None = Field(default=None, ge=0)
    """The metadata.generation the condition was computed from."""
    last_transition_time: datetime
    """When the status last changed (not when it was last checked)."""
    reason: StrictStr = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON_PATTERN)
    """A CamelCase word for the reason of the last transition."""
    message: StrictStr = Field(max_length=32768)
    """A human readable message naming the table, replica or cluster concerned."""


_CONDITIONS_LIST = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class _Status(_StatusModel):
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_CONDITIONS_LIST)
    """Conditions of the resource; Ready means healthy, not merely reconciled."""
    observed_generation: StrictInt | None = Field(default=None, ge=0)
    """The metadata.generation the operator last acted on."""


# --- TableCluster -------------------------------------------------------------------------------


class SecretKeySelector(_Model):
    """A key of a Secret."""

    name: StrictStr = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret."""
    namespace: StrictStr | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace of the Secret; defaults to the namespace the operator runs in."""
    key: StrictStr = Field(default="token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the Secret holding the cluster token."""


class TableClusterSpec(_Model):
    """An engine cluster: where it listens, how to authenticate, and its cluster id."""

    endpoint: StrictStr = Field(max_length=2048, pattern=URL_PATTERN)
    """http(s) URL of the engine's HTTP proxy, e.g. http://primary.reptables-system.svc:9012."""
    credentials_secret: SecretKeySelector
    """The Secret key holding the cluster's token."""
    cluster_id: StrictInt = Field(ge=0, le=127, json_schema_extra=_immutable("clusterId"))
    """Cluster id (0-127), unique among clusters that replicate to each other; immutable (used by
    active-active replication to tag rows with their origin)."""
    read_only: StrictBool = False
    """A read-only cluster receives no writes; the replicated table tracker treats it as unhealthy."""


class TableClusterStatus(_Status):
    """What the operator's last health probe found."""

    version: StrictStr | None = None
    """Engine version reported by the cluster."""
    latency_ms: StrictInt | None = Field(default=None, ge=0)
    """Round-trip time of the last health probe in milliseconds."""
    last_probe_time: datetime | None = None
    """When the cluster was last probed."""
    healthy: StrictBool | None = None
    """Whether the last probe succeeded and the cluster is writable."""
    directory_fingerprint: StrictStr | None = None
    """Fingerprint of the //sys/clusters directory last written to this engine (tokens included)."""


# --- ReplicatedTable ----------------------------------------------------------------------------


class ColumnType(StrEnum):
    INT64 = "int64"
    UINT64 = "uint64"
    DOUBLE = "double"
    BOOLEAN = "boolean"
    STRING = "string"
    ANY = "any"


class SortOrder(StrEnum):
    ASCENDING = "ascending"


class Column(_Model):
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


class ReplicatedTableOptions(_Model):
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
    preferred_sync_replica_clusters: NameSet | None = Field(default=None, json_schema_extra=_SET)
    """TableCluster names the tracker prefers for sync replicas."""
    sync_replica_lag_threshold: Duration = Field(default="10m", validate_default=True)
    """A replica lagging more than this is unhealthy for the tracker (e.g. 90s, 10m)."""

    @model_validator(mode="after")
    def _min_not_above_max(self) -> ReplicatedTableOptions:
        low, high = self.min_sync_replica_count, self.max_sync_replica_count
        if low is not None and high is not None and low > high:
            raise ValueError(f"minSyncReplicaCount ({low}) must not exceed maxSyncReplicaCount ({high})")
        return self


class ReplicationThrottler(_Model):
    """Per-tablet replication bandwidth limit (YT's replication_throttler)."""

    period: StrictInt = Field(default=1000, ge=1)
    """Averaging window in milliseconds."""
    limit: StrictInt = Field(ge=1)
    """Bytes per period, per tablet."""


_KEY_COLUMNS = "filter(c, has(c.sortOrder))"
_IS_SORTED = "self.schema.exists(c, has(c.sortOrder))"


class ReplicatedTableSpec(_Model):
    """A replicated table on its meta-cluster, and the options of its replication."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!has(self.pivotKeys) || {_IS_SORTED}",
         "message": "pivotKeys apply to sorted tables (with key columns); use tabletCount for ordered tables"},
        {"rule": f"!has(self.tabletCount) || !{_IS_SORTED}",
         "message": "tabletCount applies to ordered tables (without key columns); use pivotKeys for sorted tables"},
    ]})

    cluster: ObjectName = Field(json_schema_extra=_immutable("cluster"))
    """The meta-cluster: name of the TableCluster that holds the replicated table; immutable."""
    path: YPath = Field(json_schema_extra=_immutable("path"))
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


class ReplicaSummary(_StatusModel):
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


class TrackerStatus(_StatusModel):
    """The replicated table tracker's last change for this table."""

    last_decision: StrictStr | None = None
    """The mode changes made, e.g. "orders-remote-1: sync -> async; orders-remote-0: async -> sync"."""
    reason: StrictStr | None = None
    """Why, e.g. which replica turned bad."""
    time: datetime | None = None
    """When the decision was applied."""


class ReplicatedTableStatus(_Status):
    """The replicated table as the meta-cluster reports it."""

    table_id: StrictStr | None = None
    """Object id of the replicated table on the meta-cluster."""
    sync_replicas: list[StrictStr] = Field(default_factory=list, json_schema_extra=_SET)
    """Names of the TableReplicas currently in sync mode."""
    replicas: list[ReplicaSummary] = Field(default_factory=list, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """Every replica with its mode, state and lag."""
    max_lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """The largest replication lag of the enabled replicas, in seconds."""
    tracker: TrackerStatus | None = None
    """The tracker's last decision."""


# --- TableReplica -------------------------------------------------------------------------------


class Atomicity(StrEnum):
    FULL = "full"
    NONE = "none"


class Bootstrap(_Model):
    """Copying the existing rows into a new replica before it is enabled."""

    enabled: StrictBool = True
    """Copy a snapshot with a Spark job when the table already holds data; when false the replica
    starts empty and receives only new changes."""
    parallelism: StrictInt = Field(default=2, ge=1, le=1024)
    """Number of parallel Spark partitions (and executors) of the copy."""


class TableReplicaSpec(_Model):
    """A replica of a ReplicatedTable on a TableCluster (YT's table_replica)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.preserveTimestamps || (self.mode == 'async' && !self.enableReplicatedTableTracker)",
         "message": "a replica with preserveTimestamps: false can only be asynchronous: set mode: async and "
                    "enableReplicatedTableTracker: false"},
        {"rule": "has(self.startReplicationTimestamp) == has(oldSelf.startReplicationTimestamp) && "
                 "(!has(self.startReplicationTimestamp) || "
                 "self.startReplicationTimestamp == oldSelf.startReplicationTimestamp)",
         "message": "startReplicationTimestamp is immutable"},
    ]})

    table: ObjectName = Field(json_schema_extra=_immutable("table"))
    """Name of the ReplicatedTable (same namespace); immutable."""
    cluster: ObjectName = Field(json_schema_extra=_immutable("cluster"))
    """Name of the TableCluster holding the replica table; immutable."""
    replica_path: YPath = Field(json_schema_extra=_immutable("replicaPath"))
    """Path of the replica table on that cluster; immutable."""
    enabled: StrictBool = True
    """Replicate to this replica (disabled replicas keep their position and catch up when enabled)."""
    mode: ReplicaMode = ReplicaMode.ASYNC
    """sync or async; applies when the tracker does not own the replica (tracking disabled on the table
    or on this replica); otherwise only the initial mode."""
    enable_replicated_table_tracker: StrictBool = True
    """Let the tracker switch this replica's mode (when the table enables the tracker)."""
    preserve_timestamps: StrictBool = Field(default=True, json_schema_extra=_immutable("preserveTimestamps"))
    """Write rows with the meta-cluster's commit timestamps; false writes with the replica cluster's own
    timestamps into a table without upstream_replica_id (async only); immutable."""
    atomicity: Atomicity = Atomicity.FULL
    """full or none (the replica table's atomicity)."""
    start_replication_timestamp: StrictInt | None = Field(default=None, ge=0, le=MAX_TIMESTAMP,
                                                         json_schema_extra={"format": "int64"})
    """Replicate only changes committed after this meta-cluster timestamp; immutable. Usually left unset:
    the bootstrap chooses it."""
    bootstrap: Bootstrap = Field(default_factory=Bootstrap, json_schema_extra={"default": {}})
    """The initial copy of existing rows."""
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN
    """Retain keeps the replica table and its rows when the resource is deleted (the replica object on
    the meta-cluster is always removed); Delete removes the replica table too."""

    @model_validator(mode="after")
    def _timestamps_preserved_or_async(self) -> TableReplicaSpec:
        if not self.preserve_timestamps and (self.mode is not ReplicaMode.ASYNC or
                                             self.enable_replicated_table_tracker):
            raise ValueError("a replica with preserveTimestamps: false can only be asynchronous: "
                             "set mode: async and enableReplicatedTableTracker: false")
        return self


class TabletsSummary(_StatusModel):
    """Per-tablet replication progress, summarised (the details are metrics)."""

    count: StrictInt | None = Field(default=None, ge=0)
    """Number of tablets."""
    max_lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """Largest tablet lag in seconds."""
    errors: StrictInt | None = Field(default=None, ge=0)
    """Number of tablets with a replication error."""


class ReplicaError(_StatusModel):
    """A replication error, as the engine reports it."""

    code: StrictInt | None = None
    """YT error code."""
    message: StrictStr
    """Error message."""


class BootstrapPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SKIPPED = "Skipped"


class BootstrapStatus(_StatusModel):
    """Progress of the initial copy."""

    phase: BootstrapPhase | None = None
    """Pending, Running, Succeeded, Failed, or Skipped (nothing to copy, or bootstrap disabled)."""
    spark_application: StrictStr | None = None
    """Name of the SparkApplication of the current attempt."""
    snapshot_timestamp: StrictInt | None = Field(default=None, ge=0, le=MAX_TIMESTAMP,
                                                json_schema_extra={"format": "int64"})
    """The snapshot timestamp copied; the replica's start_replication_timestamp."""


class TableReplicaStatus(_Status):
    """The replica as the meta-cluster reports it."""

    replica_id: StrictStr | None = None
    """Object id of the table_replica on the meta-cluster (the replica table's upstream_replica_id)."""
    state: ReplicaState | None = None
    """disabled, enabling, enabled or disabling."""
    mode: ReplicaMode | None = None
    """Current mode (the tracker may have changed it)."""
    lag_seconds: StrictInt | None = Field(default=None, ge=0)
    """Replication lag in seconds (YT's replication_lag_time, coarse)."""
    tablets: TabletsSummary | None = None
    """Tablet summary."""
    errors: list[ReplicaError] = Field(default_factory=list, max_length=100)
    """Current replication errors."""
    bootstrap: BootstrapStatus | None = None
    """The initial copy."""


# --- TableCollocation ---------------------------------------------------------------------------


class TableCollocationSpec(_Model):
    """Replicated tables whose sync replicas must live on the same clusters."""

    tables: NameSet = Field(min_length=1, json_schema_extra=_SET)
    """Names of ReplicatedTables (same namespace) in the collocation."""
    preferred_sync_replica_clusters: NameSet | None = Field(default=None, json_schema_extra=_SET)
    """Preferred sync clusters for all tables of the collocation; when unset, the tables' own
    replicatedTableOptions.preferredSyncReplicaClusters apply."""


class TableCollocationStatus(_Status):
    """The collocation as the meta-cluster reports it."""

    collocation_id: StrictStr | None = None
    """Object id of the table_collocation on the meta-cluster."""


# --- resources ----------------------------------------------------------------------------------


class Scope(StrEnum):
    CLUSTER = "Cluster"
    NAMESPACED = "Namespaced"


@dataclass(frozen=True)
class PrinterColumn:
    """An ``additionalPrinterColumns`` entry: what ``kubectl get`` shows."""

    name: str
    type: Literal["integer", "number", "string", "boolean", "date"]
    json_path: str
    description: str
    priority: int = 0


@dataclass(frozen=True)
class ResourceInfo:
    """The CRD facts that are not part of the schema: names, scope, columns."""

    plural: str
    scope: Scope
    short_names: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    categories: tuple[str, ...] = (CATEGORY,)


_READY = PrinterColumn("Ready", "string", '.status.conditions[?(@.type=="Ready")].status',
                       "Whether replication is healthy")
_AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation")


class ObjectMeta(BaseModel):
    """The metadata fields reptables reads; everything else is kept as is."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: StrictStr = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    namespace: StrictStr | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: StrictInt | None = None
    uid: StrictStr | None = None
    resource_version: StrictStr | None = None


class _Resource(_Model):
    info: ClassVar[ResourceInfo]

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reptables.io/v1alpha1"]
    metadata: ObjectMeta


class TableCluster(_Resource):
    """An engine cluster reptables replicates between (cluster-scoped)."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tableclusters", Scope.CLUSTER, ("tcl",), (
        PrinterColumn("Endpoint", "string", ".spec.endpoint", "URL of the engine's HTTP proxy"),
        PrinterColumn("ID", "integer", ".spec.clusterId", "Cluster id", priority=1),
        PrinterColumn("Version", "string", ".status.version", "Engine version", priority=1),
        _READY, _AGE))

    kind: Literal["TableCluster"]
    spec: TableClusterSpec
    status: TableClusterStatus = Field(default_factory=TableClusterStatus)


class ReplicatedTable(_Resource):
    """A replicated table: written on its meta-cluster, replicated to its TableReplicas."""

    info: ClassVar[ResourceInfo] = ResourceInfo("replicatedtables", Scope.NAMESPACED, ("rt",), (
        PrinterColumn("Cluster", "string", ".spec.cluster", "The meta-cluster"),
        PrinterColumn("Path", "string", ".spec.path", "Path on the meta-cluster"),
        PrinterColumn("Sync", "string", ".status.syncReplicas", "TableReplicas in sync mode"),
        PrinterColumn("Lag", "integer", ".status.maxLagSeconds", "Largest replica lag in seconds"),
        _READY, _AGE))

    kind: Literal["ReplicatedTable"]
    spec: ReplicatedTableSpec
    status: ReplicatedTableStatus = Field(default_factory=ReplicatedTableStatus)


class TableReplica(_Resource):
    """A replica of a ReplicatedTable on a TableCluster."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tablereplicas", Scope.NAMESPACED, ("trep",), (
        PrinterColumn("Table", "string", ".spec.table", "The ReplicatedTable"),
        PrinterColumn("Cluster", "string", ".spec.cluster", "The replica cluster"),
        PrinterColumn("Mode", "string", ".status.mode", "Current mode: sync or async"),
        PrinterColumn("State", "string", ".status.state", "disabled, enabling, enabled or disabling"),
        PrinterColumn("Lag", "integer", ".status.lagSeconds", "Replication lag in seconds"),
        _READY, _AGE))

    kind: Literal["TableReplica"]
    spec: TableReplicaSpec
    status: TableReplicaStatus = Field(default_factory=TableReplicaStatus)


class TableCollocation(_Resource):
    """Replicated tables that keep their sync replicas on the same clusters."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tablecollocations", Scope.NAMESPACED, ("tcol",), (
        PrinterColumn("Tables", "string", ".spec.tables", "Tables of the collocation"),
        _READY, _AGE))

    kind: Literal["TableCollocation"]
    spec: TableCollocationSpec
    status: TableCollocationStatus = Field(default_factory=TableCollocationStatus)


Resource = TableCluster | ReplicatedTable | TableReplica | TableCollocation
RESOURCES: tuple[type[Resource], ...] = (TableCluster, ReplicatedTable, TableReplica, TableCollocation)
KINDS: dict[str, type[Resource]] = {cls.__name__: cls for cls in RESOURCES}
PLURALS: dict[str, str] = {kind: cls.info.plural for kind, cls in KINDS.items()}

# --- parsing ------------------------------------------------------------------------------------


class InvalidResourceError(ValueError):
    """A manifest that does not match the API; the message names the resource and every bad field."""

    def __init__(self, resource: str, problems: list[str]) -> None:
        self.resource = resource
        self.problems = problems
        super().__init__(f"{resource} is invalid: {'; '.join(problems)}")


def _field_path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _problem(error: Mapping[str, Any]) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if error["type"] != "missing" and isinstance(value, str | int | float | bool) and repr(value) not in message:
        message += f" (got {value!r})"
    path = _field_path(tuple(error["loc"]))
    return f"{path}: {message}" if path else message


R = TypeVar("R", TableCluster, ReplicatedTable, TableReplica, TableCollocation)


@overload
def parse_resource(obj: Mapping[str, Any]) -> Resource: ...
@overload
def parse_resource(obj: Mapping[str, Any], kind: type[R]) -> R: ...


def parse_resource(obj: Mapping[str, Any], kind: type[R] | None = None) -> Resource:
    """Validate a manifest (or an object read from the API server) into its model.

    The kind comes from ``obj["kind"]``; pass ``kind`` to also require that kind. Every problem is
    reported at once, each with its field path: ``TableCluster "primary" is invalid:
    spec.clusterId: Input should be less than or equal to 127 (got 200)``.
    """
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    kind_name = obj.get("kind")
    resource = f'{kind_name or "resource"} "{name or "<unnamed>"}"'
    model = KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if model is None:
        raise InvalidResourceError(resource, [f"kind: must be one of {', '.join(KINDS)} (got {kind_name!r})"])
    if kind is not None and model is not kind:
        raise InvalidResourceError(resource, [f"kind: expected {kind.__name__}"])
    if obj.get("apiVersion") != API_VERSION:
        raise InvalidResourceError(resource, [f"apiVersion: must be {API_VERSION} (got {obj.get('apiVersion')!r})"])
    try:
        return model.model_validate(obj)
    except ValidationError as error:
        raise InvalidResourceError(resource, [_problem(e) for e in error.errors()]) from None
