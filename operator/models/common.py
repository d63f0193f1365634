"""What every reptables API kind shares: the group, wire conventions, field types, conditions.

Each kind's models live in their own module (``models_table_cluster`` ...); ``models`` re-exports
them all. This module holds what those modules build on, so that a convention is decided once:

* :class:`ApiModel` is camelCase on the wire and snake_case in Python, refuses unknown fields and
  is strict about scalars (``enabled: "yes"`` is refused as the API server refuses it); field
  docstrings become the CRD descriptions. :class:`StatusModel` ignores unknown fields instead,
  because an older or newer operator may have written the status.
* Schema fragments that Kubernetes reads from ``json_schema_extra`` (list types, CEL rules) are
  typed :data:`~pydantic.json_schema.JsonDict`, so a typo in their shape fails type checking.
* :class:`BaseResource` is the envelope (apiVersion, metadata) of a kind; the CRD facts that are not
  schema (plural, scope, printer columns) ride on it as :class:`ResourceInfo`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict

GROUP = "reptables.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "reptables"

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
YPATH_PATTERN = r"^//[^/\s][^\s]*$"
URL_PATTERN = r"^https?://[^/?#\s]+(/[^\s]*)?$"
#: a PostgreSQL database URL as the engine's ``--storage`` takes it (SQLAlchemy's form, a database named)
POSTGRESQL_URL_PATTERN = r"^postgresql(\+[a-z0-9]+)?://[^\s/?#]*/[^\s/?#]+(\?\S*)?$"
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_COLUMNS = 1024
MAX_TABLETS = 10_000
MAX_TIMESTAMP = 2**63 - 1

# --- shared building blocks ---------------------------------------------------------------------


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python, docstrings as docs."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True,
                              extra="forbid")


class StatusModel(ApiModel):
    """Status is written by the operator; an older or newer operator's extra fields are ignored."""

    model_config = ConfigDict(extra="ignore")


def immutable(field: str) -> JsonDict:
    """The CloudNativePG idiom: a transition rule that refuses any change of an identity field."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{field} is immutable"}]}


def unique_entries(values: list[str] | None) -> list[str] | None:
    """Refuse a list that names an entry twice (the API server's ``x-kubernetes-list-type: set``)."""
    if values is not None:
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"duplicate entries: {', '.join(duplicates)}")
    return values


#: the type of a validation error whose input must not be echoed in its message (a URL with a password)
HIDDEN_INPUT_ERROR = "hidden_input"

SET_LIST: JsonDict = {"x-kubernetes-list-type": "set"}
"""``json_schema_extra`` of a list whose entries are unique (``x-kubernetes-list-type: set``)."""
ObjectName = Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
"""The name of another reptables resource (a Kubernetes DNS subdomain name)."""
NameSet = Annotated[list[ObjectName], AfterValidator(unique_entries)]
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


def now_text(now: datetime | None = None) -> str:
    """A time as Kubernetes writes it in a status (RFC 3339, UTC, whole seconds): ``now`` or the present."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> datetime | None:
    """A time as ``now_text`` writes it (Kubernetes' form); None when absent or malformed."""
    if not text:
        return None
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


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
    #: XdcrGroup only: a member, a table or a pair is not as it should be
    DEGRADED = "Degraded"


class Condition(StatusModel):
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


CONDITIONS_LIST: JsonDict = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class Unreachable(StatusModel):
    """A cluster the status could not be read from: what the status does not claim to know, and since when."""

    cluster: StrictStr
    """The TableCluster that does not answer."""
    since: datetime
    """When the operator first found it unreachable (it has not answered since)."""
    message: StrictStr | None = None
    """The last error."""


class BaseStatus(StatusModel):
    """The fields every kind's status has (each kind's status model adds its own)."""

    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=CONDITIONS_LIST)
    """Conditions of the resource; Ready means healthy, not merely reconciled."""
    observed_generation: StrictInt | None = Field(default=None, ge=0)
    """The metadata.generation the operator last acted on."""


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


READY_COLUMN = PrinterColumn("Ready", "string", '.status.conditions[?(@.type=="Ready")].status',
                             "Whether replication is healthy")
AGE_COLUMN = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation")


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


class BaseResource(ApiModel):
    """The envelope of every kind: apiVersion and metadata; each kind adds kind, spec and status."""

    info: ClassVar[ResourceInfo]

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reptables.io/v1alpha1"]
    metadata: ObjectMeta

