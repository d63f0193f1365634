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
  ``size``, ``matches``, comparisons) and no Kubernetes library functions, so tests evaluate them with
  cel-python against example objects. Lists that a rule iterates carry ``maxItems`` so that the
  API server's cost estimator accepts the rule.
* **Null means unset.** Optional fields are ``X | None = None`` here and plain (not ``nullable``)
  in the CRD: the API server prunes an explicit ``null`` before defaulting, so ``field: null`` and
  an absent field mean the same thing on both sides and CEL ``has()`` is exact.
* **Scalars are strict.** YAML already types values; ``enabled: "yes"`` or ``clusterId: "5"`` is
  refused here exactly as the API server refuses it, instead of being coerced.
* **Durations** are Kubernetes-style strings (``90s``, ``10m``, ``1h30m``, ``500ms``) in manifests
  and :class:`~datetime.timedelta` in Python; they render back canonically (``90s`` -> ``1m30s``).
Layout: one module per kind (``table_cluster``, ``replicated_table``, ``table_replica``,
``table_collocation``, ``xdcr_group``) on top of ``common`` (conventions, field types, conditions),
and ``crdgen`` that turns them into CRDs. This package re-exports every name, adds the union of the
kinds and :func:`parse_resource`, and is what callers import: ``from reptables.operator.models
import ...``. It is the bottom of the operator: it imports nothing else of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, overload

from pydantic import ValidationError

from reptables.engine.replica_types import ReplicaMode, ReplicaState

from .common import (
    API_VERSION,
    CATEGORY,
    CONDITION_REASON_PATTERN,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    DURATION_PATTERN,
    GROUP,
    HIDDEN_INPUT_ERROR,
    MAX_COLUMNS,
    MAX_TABLETS,
    MAX_TIMESTAMP,
    POSTGRESQL_URL_PATTERN,
    URL_PATTERN,
    VERSION,
    YPATH_PATTERN,
    ApiModel,
    BaseResource,
    BaseStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    DeletionPolicy,
    Duration,
    IntOrString,
    NameSet,
    ObjectMeta,
    ObjectName,
    PrinterColumn,
    ResourceInfo,
    Scope,
    StatusModel,
    Unreachable,
    YPath,
    format_duration,
    parse_duration,
)
from .replicated_table import (
    MAX_TRACKER_SWITCHES,
    Column,
    ColumnType,
    ReplicaSummary,
    ReplicatedTable,
    ReplicatedTableOptions,
    ReplicatedTableSpec,
    ReplicatedTableStatus,
    ReplicationThrottler,
    SchemaMigrationPhase,
    SchemaMigrationStatus,
    SortOrder,
    TrackerStatus,
    TrackerSwitch,
)
from .table_cluster import (
    MAX_MEMBERS,
    DatabaseClusterRef,
    Leadership,
    LocalEngineSpec,
    MemberUnreachable,
    SecretKeySelector,
    StorageSecretSelector,
    TableCluster,
    TableClusterSpec,
    TableClusterStatus,
)
from .table_collocation import TableCollocation, TableCollocationSpec, TableCollocationStatus
from .table_replica import (
    Atomicity,
    Bootstrap,
    BootstrapPhase,
    BootstrapStatus,
    ReplicaError,
    TableReplica,
    TableReplicaSpec,
    TableReplicaStatus,
    TabletsSummary,
)
from .xdcr_group import (
    XdcrGroup,
    XdcrGroupSpec,
    XdcrGroupStatus,
    XdcrJoin,
    XdcrJoinPhase,
    XdcrPair,
    XdcrPairState,
    XdcrReset,
    XdcrTable,
)

__all__ = [
    # the API group and its conventions
    "API_VERSION", "CATEGORY", "GROUP", "VERSION", "CONDITION_REASON_PATTERN", "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN", "DURATION_PATTERN", "POSTGRESQL_URL_PATTERN", "URL_PATTERN", "YPATH_PATTERN",
    "MAX_COLUMNS", "MAX_TABLETS", "MAX_TIMESTAMP", "ApiModel", "StatusModel", "BaseStatus", "BaseResource",
    "ObjectMeta", "PrinterColumn", "ResourceInfo", "Scope", "Duration", "IntOrString", "NameSet", "ObjectName",
    "YPath", "DeletionPolicy", "Condition", "ConditionStatus", "ConditionType", "ReplicaMode", "ReplicaState",
    "Unreachable", "format_duration", "parse_duration",
    # the kinds
    "TableCluster", "TableClusterSpec", "TableClusterStatus", "SecretKeySelector", "LocalEngineSpec",
    "StorageSecretSelector", "DatabaseClusterRef", "Leadership", "MemberUnreachable", "MAX_MEMBERS",
    "ReplicatedTable", "ReplicatedTableSpec", "ReplicatedTableStatus", "ReplicatedTableOptions",
    "ReplicationThrottler", "ReplicaSummary", "TrackerStatus", "TrackerSwitch",
    "MAX_TRACKER_SWITCHES", "Column", "ColumnType", "SortOrder",
    "SchemaMigrationPhase", "SchemaMigrationStatus",
    "TableReplica", "TableReplicaSpec", "TableReplicaStatus", "Atomicity", "Bootstrap", "BootstrapPhase",
    "BootstrapStatus", "ReplicaError", "TabletsSummary",
    "TableCollocation", "TableCollocationSpec", "TableCollocationStatus",
    "XdcrGroup", "XdcrGroupSpec", "XdcrGroupStatus", "XdcrJoin", "XdcrJoinPhase", "XdcrPair", "XdcrPairState",
    "XdcrReset", "XdcrTable",
    # all kinds, and parsing
    "Resource", "RESOURCES", "KINDS", "PLURALS", "R", "InvalidResourceError", "parse_resource",
]

Resource = TableCluster | ReplicatedTable | TableReplica | TableCollocation | XdcrGroup
RESOURCES: tuple[type[Resource], ...] = (TableCluster, ReplicatedTable, TableReplica, TableCollocation, XdcrGroup)
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
    # the input of a HIDDEN_INPUT_ERROR holds a secret (a URL with its password): never repeated
    if error["type"] not in ("missing", HIDDEN_INPUT_ERROR) and isinstance(value, str | int | float | bool) \
            and repr(value) not in message:
        message += f" (got {value!r})"
    path = _field_path(tuple(error["loc"]))
    return f"{path}: {message}" if path else message


R = TypeVar("R", TableCluster, ReplicatedTable, TableReplica, TableCollocation, XdcrGroup)


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
