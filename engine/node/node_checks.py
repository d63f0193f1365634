"""Checks of what a Cypress command is given, made before anything changes: values, names, depths,
and the attributes of a table to be created (an XDCR table's among them).

A request's value is checked whole first (``yson_util.checked_python``: integer range, lone
surrogates, ``$`` keys, depth), names and the depth a node would have too, so a command that fails
changes nothing. Pure functions: the Cypress service (``cypress_service.py``) calls them.
"""

from __future__ import annotations

from typing import Any

from .. import yson_util
from ..errors import ErrorCode, YtError
from ..replication import validate_replicated_table_options, validate_throttler
from ..schema import TableSchema
from ..tablets import parse_pivot_keys
from .tables import flag


def xdcr_flag(value: Any, path: str) -> bool:
    """The value of a table's ``@xdcr``: a boolean (``%true``), nothing else."""
    if not isinstance(value, bool):
        raise YtError(f"Attribute \"xdcr\" of {path} must be a boolean (%true or %false), not "
                      f"{yson_util.type_name(value)}", code=ErrorCode.INVALID_PARAMETER,
                      attributes={"path": path, "attribute": "xdcr"})
    return value


def checked(value: Any, action: str, max_depth: int, *, node_keys: bool = False) -> Any:
    """A request's value as plain Python, or a 4xx naming ``action`` (\"Cannot set //tmp/x\") and
    the reason: too deep, an integer out of range, a lone surrogate, a ``$`` key."""
    try:
        return yson_util.checked_python(value, max(max_depth, 0), node_keys=node_keys)
    except yson_util.InvalidValue as exc:
        raise YtError(f"{action}: {exc.reason}", code=ErrorCode.INVALID_PARAMETER) from None


def check_depth(value: Any, max_depth: int, action: str, what: str = "the value", extra: int = 0) -> None:
    """Refuse a (checked) value nested deeper than the tree has room for at its place."""
    if yson_util.depth(value) - extra > max_depth:
        raise YtError(f"{action}: depth limit of {yson_util.MAX_DEPTH} exceeded ({what} would nest "
                      f"deeper than the tree allows there)", code=ErrorCode.INVALID_PARAMETER)


def check_node_depth(depth: int, action: str) -> int:
    if depth > yson_util.MAX_DEPTH:
        raise YtError(f"{action}: depth limit of {yson_util.MAX_DEPTH} exceeded (the node would be at "
                      f"depth {depth})", code=ErrorCode.INVALID_PARAMETER)
    return depth


def check_names(names: tuple[str, ...], action: str, kind: str = "node name") -> None:
    """Names a path gives to nodes (or attributes): each one storable and addressable."""
    for name in names:
        try:
            yson_util.check_key(name, node_name=True, kind=kind)
        except yson_util.InvalidValue as exc:
            raise YtError(f"{action}: {exc.reason}", code=ErrorCode.INVALID_PARAMETER) from None


def validate_table_attributes(attrs: dict[str, Any], path: str, cluster_name: str, cluster_id: int | None,
                              replicated: bool = False) -> None:
    """The attributes of a table to be created, every one checked before anything is made."""
    if not flag(attrs.get("dynamic")):
        raise YtError(f"Cannot create table {path}: only dynamic tables are supported "
                      "(set attribute dynamic=%true)", code=ErrorCode.INVALID_PARAMETER)
    if "schema" not in attrs:
        raise YtError(f"Cannot create dynamic table {path}: attribute \"schema\" is required",
                      code=ErrorCode.INVALID_PARAMETER)
    schema = TableSchema.parse(attrs["schema"], path)
    if "pivot_keys" in attrs:
        if not schema.is_sorted:
            raise YtError(f"Cannot create table {path}: pivot_keys are for sorted tables; "
                          "use tablet_count for ordered tables", code=ErrorCode.INVALID_PARAMETER)
        parse_pivot_keys(attrs["pivot_keys"], schema, path)
    if "tablet_count" in attrs:
        count = attrs["tablet_count"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
            raise YtError(f"Cannot create table {path}: tablet_count must be an integer in [1, 10000]",
                          code=ErrorCode.INVALID_PARAMETER)
        if schema.is_sorted:
            raise YtError(f"Cannot create sorted table {path} with tablet_count: give pivot_keys",
                          code=ErrorCode.INVALID_PARAMETER)
    if attrs.get("atomicity", "full") not in ("full", "none"):
        raise YtError(f"Cannot create table {path}: atomicity must be \"full\" or \"none\"",
                      code=ErrorCode.INVALID_PARAMETER)
    for name in ("min_data_ttl", "min_replication_log_ttl", "change_retention"):
        ttl = attrs.get(name, 0)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
            raise YtError(f"Cannot create table {path}: {name} must be a non-negative number of "
                          "milliseconds", code=ErrorCode.INVALID_PARAMETER)
    if "enable_change_log" in attrs:
        if not isinstance(attrs["enable_change_log"], bool):
            raise YtError(f"Cannot create table {path}: enable_change_log must be %true or %false",
                          code=ErrorCode.INVALID_PARAMETER)
        if replicated:
            raise YtError(f"Cannot create replicated table {path} with enable_change_log: a replicated table "
                          "streams its replication queue, which it always keeps", code=ErrorCode.INVALID_PARAMETER)
    upstream = attrs.get("upstream_replica_id")
    if upstream is not None and not isinstance(upstream, str):
        raise YtError(f"Cannot create table {path}: upstream_replica_id must be a replica id string",
                      code=ErrorCode.INVALID_PARAMETER)
    if xdcr_flag(attrs.get("xdcr", False), path):
        check_xdcr_table(schema, attrs, path, cluster_name, cluster_id, replicated)
    if replicated:
        if attrs.get("atomicity", "full") != "full":
            raise YtError(f"Cannot create replicated table {path}: atomicity must be full",
                          code=ErrorCode.INVALID_PARAMETER)
        if upstream:
            raise YtError(f"Cannot create replicated table {path} with upstream_replica_id",
                          code=ErrorCode.INVALID_PARAMETER)
        validate_replicated_table_options(attrs.get("replicated_table_options"), path)
        validate_throttler(attrs.get("replication_throttler"), path)


def check_xdcr_table(schema: TableSchema, attrs: dict[str, Any], path: str, cluster_name: str, cluster_id: int | None,
                     replicated: bool) -> None:
    """An XDCR table (seed 001's DR TABLE): sorted, written here, on a cluster with an id."""
    if cluster_id is None:
        raise YtError(f"Cannot make {path} an XDCR table: cluster {cluster_name} has no XDCR cluster id (start "
                      "its engine with --cluster-id N, 0-127)", code=ErrorCode.INVALID_PARAMETER,
                      attributes={"path": path})
    if not schema.is_sorted or replicated or attrs.get("upstream_replica_id"):
        raise YtError(f"Cannot make {path} an XDCR table: only a sorted table written on this cluster can be "
                      "(conflicts are resolved by primary key; not a replicated or a replica table)",
                      code=ErrorCode.INVALID_PARAMETER, attributes={"path": path})
    if attrs.get("atomicity", "full") != "full":
        raise YtError(f"Cannot make {path} an XDCR table: its atomicity must be full",
                      code=ErrorCode.INVALID_PARAMETER, attributes={"path": path})
