"""XdcrGroup: TableClusters that replicate tables active-active (XDCR, seed 001; docs/xdcr.md).

A kind of its own because a group is a cluster-level setting, not a table's: the engine keeps one
``//sys/@xdcr_connections`` per cluster, so an XdcrGroup is cluster-scoped like TableCluster (a
cluster belongs to at most one group; of two groups naming one cluster the oldest wins). It names
its clusters by TableCluster name, the XDCR tables by path and schema (created on every member,
``xdcr=%true``, mounted), and the group-wide operations of seed 001 as desired state: ``paused``
(``dr_pause``/``dr_resume`` on every member) and ``reset`` (``dr_reset`` of one member on the
others). Its status is ``dr_status`` of every member as ordered pairs.

A cluster added to a group that holds data joins from a snapshot when its peers' change logs no
longer hold everything (seed 001): the operator runs the join job for it (``controllers/xdcr_join.py``),
taking the snapshot from ``preferredSource`` when one is named, and reports each join in
``status.joins``.

The column type is the one of ReplicatedTable (:class:`~.replicated_table.Column`): an
XDCR table is an ordinary sorted dynamic table with the ``xdcr`` flag, and its schema reads the same.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator, model_validator

from .common import (
    AGE_COLUMN,
    MAX_COLUMNS,
    READY_COLUMN,
    SET_LIST,
    ApiModel,
    BaseResource,
    BaseStatus,
    NameSet,
    ObjectName,
    PrinterColumn,
    ResourceInfo,
    Scope,
    StatusModel,
    YPath,
)
from .replicated_table import Column

__all__ = ["XdcrGroup", "XdcrGroupSpec", "XdcrGroupStatus", "XdcrJoin", "XdcrJoinPhase", "XdcrPair", "XdcrReset",
           "XdcrTable"]

#: at most this many clusters in a group (cluster ids are 0-127; CEL rules iterate the list)
MAX_GROUP_CLUSTERS = 16
#: at most this many XDCR tables in one group
MAX_GROUP_TABLES = 256


class XdcrTable(ApiModel):
    """An XDCR table: created on every cluster of the group with xdcr=%true, then mounted."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "self.schema.exists(c, has(c.sortOrder))",
        "message": "an XDCR table needs key columns (sortOrder): conflicts are resolved by primary key"}]})

    path: YPath
    """Path of the table on every cluster of the group, e.g. //home/shop/users."""
    table_schema: list[Column] = Field(alias="schema", min_length=1, max_length=MAX_COLUMNS, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """Columns, key columns (with sortOrder) first; the same on every cluster (replication waits
    while the schemas differ)."""

    @field_validator("table_schema")
    @classmethod
    def _sorted(cls, columns: list[Column]) -> list[Column]:
        names = [c.name for c in columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate column names: {', '.join(duplicates)}")
        if not any(c.sort_order is not None for c in columns):
            raise ValueError("an XDCR table needs key columns (sortOrder): conflicts are resolved by primary key")
        for before, after in zip(columns, columns[1:], strict=False):
            if before.sort_order is None and after.sort_order is not None:
                raise ValueError(f"key column {after.name!r} follows value column {before.name!r}; "
                                 "key columns (with sortOrder) come first")
        return columns


class XdcrReset(ApiModel):
    """Break replication with one cluster of the group (seed 001's ``dr reset --cluster``)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "self.force == true",
        "message": "reset drops the changes the cluster has not received and the group may diverge: "
                   "set force: true to confirm"}]})

    cluster: ObjectName
    """The TableCluster the other members stop replicating with (dr_reset on each of them); while
    it is named here it stays out of the group. Remove reset to let it join again: its connections
    then ship the change logs from their beginning (within @change_retention)."""
    force: StrictBool
    """Must be true: the cluster's undelivered changes are dropped and the group may diverge."""

    @field_validator("force")
    @classmethod
    def _forced(cls, force: bool) -> bool:
        if not force:
            raise ValueError("reset drops the changes the cluster has not received and the group may diverge: "
                             "set force: true to confirm")
        return force


class XdcrGroupSpec(ApiModel):
    """The clusters of an active-active group, its XDCR tables and the group-wide operations."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.reset) || self.clusters.exists(c, c == self.reset.cluster)",
        "message": "reset.cluster must be one of clusters"}, {
        "rule": "!has(self.preferredSource) || self.clusters.exists(c, c == self.preferredSource)",
        "message": "preferredSource must be one of clusters"}]})

    clusters: NameSet = Field(min_length=2, max_length=MAX_GROUP_CLUSTERS, json_schema_extra=SET_LIST)
    """Names of the TableClusters of the group (at least two). Each one's engine must run with
    --cluster-id equal to its spec.clusterId, and the ids must differ."""
    tables: list[XdcrTable] = Field(default_factory=list, max_length=MAX_GROUP_TABLES, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["path"]})
    """XDCR tables, created on every cluster of the group (existing ones are adopted)."""
    paused: StrictBool = False
    """Refuse client writes on every cluster (dr_pause; changes from peers are still applied);
    false takes them again (dr_resume)."""
    reset: XdcrReset | None = None
    """Break replication with one cluster (dr_reset --force on every other cluster)."""
    preferred_source: ObjectName | None = None
    """The member a joining cluster takes its snapshot from (seed 001's `preferred-source`; it matters
    among three or more clusters): a cluster added to a group whose change logs were trimmed first
    loads a snapshot of every XDCR table from this member, then the change logs. Unset, or when it
    is the joining cluster itself or is being reset, the joining cluster's engine picks the donor
    (its `//sys/@xdcr_preferred_source`, else its first connection)."""
    conflict_event_threshold: StrictInt = Field(default=1, ge=1)
    """A Warning event is posted when the conflicts a cluster resolved for changes from one peer
    grew by at least this many since the last reconcile."""

    @field_validator("tables")
    @classmethod
    def _unique_paths(cls, tables: list[XdcrTable]) -> list[XdcrTable]:
        paths = [t.path for t in tables]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise ValueError(f"duplicate table paths: {', '.join(duplicates)}")
        return tables

    @model_validator(mode="after")
    def _reset_is_a_member(self) -> XdcrGroupSpec:
        if self.reset is not None and self.reset.cluster not in self.clusters:
            raise ValueError(f"reset.cluster must be one of clusters (got {self.reset.cluster!r})")
        return self

    @model_validator(mode="after")
    def _preferred_source_is_a_member(self) -> XdcrGroupSpec:
        if self.preferred_source is not None and self.preferred_source not in self.clusters:
            raise ValueError(f"preferredSource must be one of clusters (got {self.preferred_source!r}; clusters: "
                             f"{', '.join(self.clusters)})")
        return self

    @property
    def members(self) -> list[str]:
        """The clusters that replicate: ``clusters`` without the one being reset."""
        return [c for c in self.clusters if self.reset is None or c != self.reset.cluster]


class XdcrPairState(StrEnum):
    """The states of an XdcrPair: those ``dr_status`` of the sending cluster reports for the receiving one
    (the engine's words), and ``unknown`` when the sending cluster did not answer. The CRD's field stays
    a plain string: an engine newer than the operator may report a state this list lacks."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    #: the sender refuses client writes (dr_pause); its changes still flow
    PAUSED = "paused"
    WAITING_FOR_PEER = "waiting_for_peer"
    WAITING_FOR_SCHEMA = "waiting_for_schema"
    #: the receiver must join from a snapshot first (the members' change logs were trimmed)
    WAITING_FOR_SNAPSHOT = "waiting_for_snapshot"
    ERROR = "error"
    RESET = "reset"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


class XdcrPair(StatusModel):
    """Replication from one cluster to another, as dr_status of the sending cluster reports it."""

    from_: StrictStr = Field(alias="from")
    """The sending cluster."""
    to: StrictStr
    """The receiving cluster."""
    state: StrictStr
    """connected, paused, connecting, waiting_for_peer, waiting_for_schema, error or unknown (the
    sending cluster did not answer)."""
    lag_seconds: float | None = Field(default=None, ge=0)
    """Age of the oldest change not delivered yet (0 when none waits)."""
    queued_rows: StrictInt | None = Field(default=None, ge=0)
    """Changes waiting to be delivered."""
    conflicts: StrictInt | None = Field(default=None, ge=0)
    """Conflicts the receiving cluster resolved applying changes from the sending cluster (since the
    receiving cluster's engine started; each is logged in its //sys/xdcr_conflicts)."""
    paused: StrictBool | None = None
    """Whether the sending cluster refuses client writes."""
    last_error: StrictStr | None = None
    """Why the pair is not connected, if it is not."""


class XdcrJoinPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class XdcrJoin(StatusModel):
    """One cluster joining one XDCR table from a snapshot (the join job, one attempt at a time)."""

    cluster: StrictStr
    """The joining cluster (a TableCluster of the group)."""
    path: StrictStr
    """The XDCR table it joins."""
    phase: XdcrJoinPhase
    """Pending (about to start), Running (the job runs), Succeeded, or Failed (the last attempt
    failed: `message` says why; it is tried again at `nextAttemptTime`)."""
    source: StrictStr | None = None
    """The member the snapshot comes from (as asked; the engine's choice once the join has begun)."""
    job_ref: StrictStr | None = None
    """The running (or last) job: `local:<name>` or `sparkapplication:<namespace>/<name>`."""
    attempts: StrictInt = Field(default=0, ge=0)
    """Attempts started so far."""
    round: StrictInt = Field(default=1, ge=1)
    """Which join of this cluster to this table it is: 2 and up when it joined before and was reset
    since (each round's jobs have their own names)."""
    message: StrictStr | None = None
    """What the join is doing, or why its last attempt failed."""
    next_attempt_time: StrictStr | None = None
    """When a failed attempt is retried (RFC 3339)."""
    start_time: StrictStr | None = None
    """When the current (or last) attempt started (RFC 3339)."""
    completion_time: StrictStr | None = None
    """When the join succeeded (RFC 3339)."""


class XdcrGroupStatus(BaseStatus):
    """The group as the dr_status of its members reports it."""

    pairs: list[XdcrPair] = Field(default_factory=list)
    """Every ordered pair of the group's replicating clusters."""
    paused: StrictBool | None = None
    """Whether every cluster of the group refuses client writes."""
    conflicts: StrictInt | None = Field(default=None, ge=0)
    """Conflicts resolved on all clusters (the sum over the pairs)."""
    tables: list[StrictStr] = Field(default_factory=list, json_schema_extra=SET_LIST)
    """Paths of the XDCR tables present on every cluster."""
    joins: list[XdcrJoin] = Field(default_factory=list)
    """Clusters joining XDCR tables from a snapshot, at most one running at a time (and the joins
    done, until the cluster or the table leaves the group)."""


class XdcrGroup(BaseResource):
    """Clusters that replicate XDCR tables to each other, every one taking writes (cluster-scoped)."""

    info: ClassVar[ResourceInfo] = ResourceInfo("xdcrgroups", Scope.CLUSTER, ("xg",), (
        READY_COLUMN,
        PrinterColumn("Clusters", "string", ".spec.clusters", "TableClusters of the group"),
        PrinterColumn("Paused", "boolean", ".status.paused", "Whether client writes are refused on every cluster"),
        PrinterColumn("Conflicts", "integer", ".status.conflicts", "Conflicts resolved on all clusters"),
        AGE_COLUMN))

    kind: Literal["XdcrGroup"]
    spec: XdcrGroupSpec
    status: XdcrGroupStatus = Field(default_factory=XdcrGroupStatus)
