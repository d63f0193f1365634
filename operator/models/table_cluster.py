"""TableCluster: an engine cluster the operator connects to (cluster-scoped).

A kind of its own module because its spec is what the operator needs to reach an engine (endpoint,
token Secret, cluster id) and its status is what the health probe found; nothing else in the API
depends on its fields, only on its name.

Where an engine keeps its data (SQLite in its data directory, or a PostgreSQL database) is the
engine's business, not the operator's: on Kubernetes the Helm chart's values say it. Only
``reptables up``, which starts the engines itself, needs to be told, so that is ``spec.local``, which
the operator ignores. Its URL never carries a password (the engine gets ``--storage`` on a command
line any user of the machine can read; the models refuse it as the API server's CEL rule does): the
password is in the user's ``$PGPASSWORD``/``~/.pgpass``, or the whole URL is in a Secret
(``storageSecret``) that ``up`` hands to that engine alone, in its environment.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .common import (
    AGE_COLUMN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    HIDDEN_INPUT_ERROR,
    POSTGRESQL_URL_PATTERN,
    READY_COLUMN,
    SET_LIST,
    URL_PATTERN,
    ApiModel,
    BaseResource,
    BaseStatus,
    PrinterColumn,
    ResourceInfo,
    Scope,
    StatusModel,
    immutable,
    unique_entries,
)

__all__ = ["MAX_MEMBERS", "DatabaseClusterRef", "Leadership", "LocalEngineSpec", "MemberUnreachable",
           "SecretKeySelector", "StorageSecretSelector", "TableCluster", "TableClusterSpec", "TableClusterStatus"]

#: engines of one HA table cluster the operator asks who leads (a leader and standbys)
MAX_MEMBERS = 9
EngineUrl = Annotated[StrictStr, Field(max_length=2048, pattern=URL_PATTERN)]


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


class StorageSecretSelector(ApiModel):
    """A key of a Secret holding a whole PostgreSQL URL, password included."""

    name: StrictStr = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """Name of the Secret (one of the manifests ``reptables up`` reads)."""
    namespace: StrictStr | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace of the Secret; defaults to the namespace ``reptables up`` runs in (default)."""
    key: StrictStr = Field(default="uri", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key of the Secret holding the URL (``uri``, as in CloudNativePG's application Secrets)."""


# a password in the URL's user part (user:password@), or as a query parameter (?password=...)
_PASSWORD_IN_USERINFO = r"^[^:/]+://[^/@]*:[^/@]*@"
_PASSWORD_IN_QUERY = r"[?&]password="
_NO_PASSWORD = ("storage must not carry a password (the engine gets it on its command line, which every user "
                "of the machine can read): give the password in $PGPASSWORD or a ~/.pgpass, or the whole URL "
                "in a Secret named by storageSecret")
_ONE_STORAGE = "set storage or storageSecret, not both"


class LocalEngineSpec(ApiModel):
    """How ``reptables up`` runs this cluster's engine on the local machine; the operator ignores it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.storage) || !has(self.storageSecret)", "message": _ONE_STORAGE}]})

    storage: StrictStr | None = Field(default=None, max_length=2048, pattern=POSTGRESQL_URL_PATTERN,
                                      json_schema_extra={"x-kubernetes-validations": [{
                                          "rule": f"!self.matches('{_PASSWORD_IN_USERINFO}') && "
                                                  f"!self.matches('{_PASSWORD_IN_QUERY}')",
                                          "message": _NO_PASSWORD}]})
    """The cluster's PostgreSQL database, postgresql://USER@HOST:PORT/DB, instead of SQLite in the
    engine's data directory: given to the engine as --storage. No password here: the engine takes it
    from $PGPASSWORD or a ~/.pgpass of the user running ``reptables up``; or use storageSecret. One
    database per TableCluster."""
    storage_secret: StorageSecretSelector | None = None
    """A Secret key holding the cluster's whole PostgreSQL URL, password included: handed to this
    engine alone, in its environment (REPTABLES_STORAGE), never on a command line."""

    @field_validator("storage", mode="before")
    @classmethod
    def _no_password(cls, url: object) -> object:
        """Before the pattern, so that no error message repeats a URL that holds a password."""
        if isinstance(url, str) and (re.search(_PASSWORD_IN_USERINFO, url) or re.search(_PASSWORD_IN_QUERY, url)):
            raise PydanticCustomError(HIDDEN_INPUT_ERROR, _NO_PASSWORD)
        return url

    @model_validator(mode="after")
    def _one_storage(self) -> LocalEngineSpec:
        if self.storage is not None and self.storage_secret is not None:
            raise ValueError(_ONE_STORAGE)
        return self


class DatabaseClusterRef(ApiModel):
    """A CloudNativePG Cluster (``postgresql.cnpg.io/v1``) holding the table cluster's database."""

    name: StrictStr = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Name of the Cluster (the chart's: the engine's StatefulSet name and ``-pg``)."""
    namespace: StrictStr | None = Field(default=None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace of the Cluster; defaults to the namespace the operator runs in."""


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
    members: Annotated[list[EngineUrl], Field(min_length=1, max_length=MAX_MEMBERS),
                       AfterValidator(unique_entries)] | None = Field(default=None, json_schema_extra=SET_LIST)
    """An HA table cluster (docs/ha.md): the address of each of its engines, the leader and the
    standbys (each one's ``--advertise-url``). The operator asks each which one leads and shows it in
    ``status.leadership``; requests still go to ``endpoint``, which must reach the leader (a Service
    over the engines). ``reptables up`` starts one engine per member, with ``--standby``, and listens on
    ``endpoint`` itself, forwarding to the leader (``local`` must name a PostgreSQL database)."""
    database_cluster: DatabaseClusterRef | None = None
    """The CloudNativePG Cluster holding this table cluster's database: ``status.leadership``
    shows its ``status.currentPrimary`` as the database's primary (the operator needs ``get`` on it).
    Without it, the primary shown is the server the leader engine's sessions reached."""
    local: LocalEngineSpec | None = None
    """``reptables up`` only: how it runs this cluster's engine (its storage). The operator on Kubernetes
    ignores it; there, the Helm chart's engine values say where an engine keeps its data."""


class MemberUnreachable(StatusModel):
    """A member that neither leads nor stands by: what it answered, and since when."""

    member: StrictStr
    """The member's address (``spec.members``)."""
    since: datetime
    """When the operator first found it so (it has not led nor stood by since)."""
    message: StrictStr | None = None
    """Its last answer or error."""


class Leadership(StatusModel):
    """Who serves an HA table cluster (``spec.members``): the leader, the standbys, the database's
    primary. Read on every status refresh; what could not be read is absent, never the last value
    seen."""

    leader: StrictStr | None = None
    """The address of the engine that serves (its ``/readyz`` answers 200 and it holds the lease);
    absent while none does (a takeover under way, every member down)."""
    epoch: StrictInt | None = Field(default=None, ge=0)
    """The leader's lease epoch, the fencing token: it moves on at every takeover."""
    standbys: list[StrictStr] = Field(default_factory=list, max_length=MAX_MEMBERS, json_schema_extra=SET_LIST)
    """The members standing by (``/readyz`` 503 ``standby``), ready to take over."""
    database_primary: StrictStr | None = None
    """The PostgreSQL primary: the CloudNativePG Cluster's ``currentPrimary`` (``spec.databaseCluster``),
    else the server (``host:port``) the leader's database sessions reached."""
    database_cluster_error: StrictStr | None = None
    """Why the CloudNativePG Cluster's primary could not be read (then ``databasePrimary`` is the
    server the leader reached, if it said)."""
    unreachable: list[MemberUnreachable] = Field(default_factory=list, max_length=MAX_MEMBERS)
    """Members that did not answer, or answered that they serve nothing (a leader whose lease ran
    out, one that stepped down)."""
    observed_at: datetime | None = None
    """When the operator last asked the members (written at least once a minute, at once on a change)."""


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
    leadership: Leadership | None = None
    """An HA table cluster (``spec.members``): the leader, the standbys and the database's primary."""


class TableCluster(BaseResource):
    """An engine cluster reptables replicates between (cluster-scoped)."""

    info: ClassVar[ResourceInfo] = ResourceInfo("tableclusters", Scope.CLUSTER, ("tcl",), (
        PrinterColumn("Endpoint", "string", ".spec.endpoint", "URL of the engine's HTTP proxy"),
        PrinterColumn("ID", "integer", ".spec.clusterId", "Cluster id", priority=1),
        PrinterColumn("Version", "string", ".status.version", "Engine version", priority=1),
        PrinterColumn("Leader", "string", ".status.leadership.leader", "The engine that serves an HA table cluster",
                      priority=1),
        READY_COLUMN, AGE_COLUMN))

    kind: Literal["TableCluster"]
    spec: TableClusterSpec
    status: TableClusterStatus = Field(default_factory=TableClusterStatus)

