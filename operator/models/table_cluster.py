"""TableCluster: an engine cluster the operator connects to (cluster-scoped).

A kind of its own module because its spec is what the operator needs to reach an engine (endpoint,
token Secret, cluster id) and its status is what the health probe found; nothing else in the API
depends on its fields, only on its name.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from .common import (
    AGE_COLUMN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    READY_COLUMN,
    URL_PATTERN,
    ApiModel,
    BaseResource,
    BaseStatus,
    PrinterColumn,
    ResourceInfo,
    Scope,
    immutable,
)

__all__ = ["SecretKeySelector", "TableCluster", "TableClusterSpec", "TableClusterStatus"]


class SecretKeySelector(ApiModel):
    """A key of a Secret."""

    name: StrictStr = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret."""
    namespace: StrictStr | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace of the Secret; defaults to the namespace the operator runs in. The operator takes
    credentials only from its own namespace and those it was given (--credentials-namespace), and
    only from Secrets labelled reptables.io/credentials=true."""
    key: StrictStr = Field(default="token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the Secret holding the cluster token."""


class TableClusterSpec(ApiModel):
    """An engine cluster: where it listens, how to authenticate, and its cluster id."""

    endpoint: StrictStr = Field(max_length=2048, pattern=URL_PATTERN)
    """http(s) URL of the engine's HTTP proxy, e.g. http://primary.reptables-system.svc:9012."""
    credentials_secret: SecretKeySelector
    """The Secret key holding the cluster's token."""
    cluster_id: StrictInt = Field(ge=0, le=127, json_schema_extra=immutable("clusterId"))
    """Cluster id (0-127), unique among clusters that replicate to each other; immutable (used by
    active-active replication to tag rows with their origin)."""
    read_only: StrictBool = False
    """A read-only cluster refuses client row writes (the operator sets the engine's ``//sys/@read_only``;
    ``insert_rows`` and ``delete_rows`` fail with code 605) while replication into its replica tables
    goes on; the replicated table tracker treats it as unhealthy, so no sync replica stays there."""


class TableClusterStatus(BaseStatus):
    """What the operator's last health probe found."""

    version: StrictStr | None = None
    """Engine version reported by the cluster."""
    latency_ms: StrictInt | None = Field(default=None, ge=0)
    """Round-trip time of the last health probe in milliseconds."""
    last_probe_time: datetime | None = None
    """When the cluster was last probed."""
    healthy: StrictBool | None = None
    """Whether the last probe succeeded and the cluster is writable."""


class TableCluster(BaseResource):
    """An engine cluster reptables replicates between (cluster-scoped)."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tableclusters", Scope.CLUSTER, ("tcl",), (
        PrinterColumn("Endpoint", "string", ".spec.endpoint", "URL of the engine's HTTP proxy"),
        PrinterColumn("ID", "integer", ".spec.clusterId", "Cluster id", priority=1),
        PrinterColumn("Version", "string", ".status.version", "Engine version", priority=1),
        READY_COLUMN, AGE_COLUMN))

    kind: Literal["TableCluster"]
    spec: TableClusterSpec
    status: TableClusterStatus = Field(default_factory=TableClusterStatus)

