"""TableCollocation: replicated tables whose sync replicas stay on the same clusters.

Its own module like every kind; it refers to ReplicatedTables by name only, so it needs nothing from
the table models.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, StrictStr

from .common import (
    AGE_COLUMN,
    READY_COLUMN,
    SET_LIST,
    ApiModel,
    BaseResource,
    BaseStatus,
    NameSet,
    PrinterColumn,
    ResourceInfo,
    Scope,
)

__all__ = ["TableCollocation", "TableCollocationSpec", "TableCollocationStatus"]


class TableCollocationSpec(ApiModel):
    """Replicated tables whose sync replicas must live on the same clusters."""

    tables: NameSet = Field(min_length=1, json_schema_extra=SET_LIST)
    """Names of ReplicatedTables (same namespace) in the collocation."""
    preferred_sync_replica_clusters: NameSet | None = Field(default=None, json_schema_extra=SET_LIST)
    """Preferred sync clusters for all tables of the collocation; when unset, the tables' own
    replicatedTableOptions.preferredSyncReplicaClusters apply."""


class TableCollocationStatus(BaseStatus):
    """The collocation as the meta-cluster reports it."""

    collocation_id: StrictStr | None = None
    """Object id of the table_collocation on the meta-cluster."""


class TableCollocation(BaseResource):
    """Replicated tables that keep their sync replicas on the same clusters."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tablecollocations", Scope.NAMESPACED, ("tcol",), (
        PrinterColumn("Tables", "string", ".spec.tables", "Tables of the collocation"),
        READY_COLUMN, AGE_COLUMN))

    kind: Literal["TableCollocation"]
    spec: TableCollocationSpec
    status: TableCollocationStatus = Field(default_factory=TableCollocationStatus)

