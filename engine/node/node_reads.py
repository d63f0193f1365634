"""Reading the tree: get, list, exists, and the attribute handlers per object type.

The attributes of a table, a replicated table, a replica or a collocation are computed here from
the objects that own them (tablets, replication status); reads take no engine lock of their own:
they read snapshots (the replication layer hands out copies) and SQL in a read transaction. The
one place node values leave the tree (``node_value``) masks the tokens of ``//sys/clusters``.

Collaborators (given by the composition root, ``cluster.py``): the tree, the node's tables, the
replication manager (replica and replicated-table attributes) and the peers (the directory in use).
"""

from __future__ import annotations

import builtins
import logging
from typing import Any

from .. import yson_util
from ..cypress import (
    INTERNAL_PREFIX,
    MAP_NODE,
    Cypress,
    Node,
    parse_ypath,
)
from ..errors import ErrorCode, ResolveError, YtError
from ..peers import MASKED_TOKEN, Peers, parse_directory
from ..replication import (
    DEFAULT_MIN_REPLICATION_LOG_TTL_MS,
    ReplicationManager,
)
from ..tablets import (
    tablet_id,
)
from .tables import (
    DEFAULT_CHANGE_RETENTION_MS,
    DEFAULT_MIN_DATA_TTL_MS,
    TABLE_TYPES,
    Tables,
)

log = logging.getLogger("reptables.engine")


class NodeReads:
    """get, list, exists and the attributes of every object type."""

    def __init__(self, cypress: Cypress, tables: Tables, replication: ReplicationManager, peers: Peers) -> None:
        self.cypress = cypress
        self.tables = tables
        self.replication = replication
        self.peers = peers

    def exists(self, path: Any) -> bool:
        try:
            ypath = parse_ypath(path)
        except YtError:
            return False
        node = self.cypress.resolve(ypath, missing_ok=True)
        if node is None:
            return False
        if ypath.attribute_path is None:
            return True
        try:
            self.get_attribute(node, ypath.attribute_path)
        except YtError:
            return False
        return True

    def list(self, path: Any, attributes: builtins.list[str] | None = None) -> builtins.list[Any]:
        node, ypath = self.tables.resolve(path)
        if ypath.attribute_path is not None:
            value = self.get_attribute(node, ypath.attribute_path)
            if isinstance(value, dict):
                return sorted(value)
            raise YtError(f"Attribute at {ypath.text} is not a map and cannot be listed",
                          code=ErrorCode.INVALID_PARAMETER)
        if node.type != MAP_NODE:
            raise YtError(f"Cannot list {node.path}: it is a {node.type}, not a map node",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        out = []
        for name in sorted(node.children):
            child = node.children[name]
            if attributes:
                out.append(yson_util.with_attributes(name, self.pick_attributes(child, attributes)))
            else:
                out.append(name)
        return out

    def get(self, path: Any, attributes: builtins.list[str] | None = None) -> Any:
        node, ypath = self.tables.resolve(path)
        if ypath.attribute_path is not None:
            return self.get_attribute(node, ypath.attribute_path)
        return self.node_value(node, attributes)

    def node_value(self, node: Node, attributes: builtins.list[str] | None, *, reveal_secrets: bool = False) -> Any:
        """The value of a node and its subtree: the one place node values leave the tree.

        Tokens of other clusters (a node named ``token`` anywhere under ``//sys/clusters``) are
        secrets: they come out as ``<hidden>`` whatever the path, object id or attributes asked
        for. Only the engine's own use of the directory passes ``reveal_secrets``."""
        directory = None if reveal_secrets else self.tables.clusters_node()
        return self._subtree_value(node, attributes, directory)

    def _subtree_value(self, node: Node, attributes: builtins.list[str] | None, directory: Node | None) -> Any:
        value: Any
        if directory is not None and node.name == "token" and self._is_below(node, directory):
            value = MASKED_TOKEN if node.value or node.children else node.value
        elif node.type == MAP_NODE:
            value = {name: self._subtree_value(c, attributes, directory) for name, c in list(node.children.items())}
        elif node.type in TABLE_TYPES:
            value = None
        else:
            value = node.value
        if attributes:
            return yson_util.with_attributes(value if value is not None else yson_util.yson.YsonEntity(),
                                             self.pick_attributes(node, attributes))
        return value

    @staticmethod
    def _is_below(node: Node, ancestor: Node) -> bool:
        parent = node.parent
        while parent is not None:
            if parent is ancestor:
                return True
            parent = parent.parent
        return False

    def pick_attributes(self, node: Node, names: builtins.list[str]) -> dict[str, Any]:
        all_attrs = self._all_attributes(node)
        return {n: all_attrs[n] for n in names if n in all_attrs}

    def _all_attributes(self, node: Node) -> dict[str, Any]:
        attrs: dict[str, Any] = node.user_attributes()
        attrs.update({"id": node.id, "type": node.type, "path": node.path})
        if node.parent is not None:
            attrs["parent_id"] = node.parent.id
            attrs["key"] = node.name
        if node.type == MAP_NODE:
            attrs["count"] = len(node.children)
        if node.type == "table_replica":
            replica = self.replication.replica(node.id)
            attrs.update(self.replication.describe(replica))
            attrs.pop("path", None)
        if node.type == "table_collocation":
            ids = list(node.attributes.get("table_ids", []))
            attrs["table_ids"] = ids
            attrs["table_paths"] = [self.cypress.by_id[i].path for i in ids if i in self.cypress.by_id]
            attrs.pop("path", None)
        table = node.table
        if table is not None:
            schema_attrs = node.attributes.get(f"{INTERNAL_PREFIX}schema_attrs", {})
            attrs["schema"] = yson_util.with_attributes(node.attributes["schema"], schema_attrs)
            attrs["dynamic"] = True
            attrs["sorted"] = table.sorted
            attrs["key_columns"] = table.schema.key_names
            attrs["tablet_state"] = table.state.value
            attrs["expected_tablet_state"] = table.state.value
            attrs["tablet_count"] = table.tablet_count
            attrs["atomicity"] = table.atomicity
            attrs.setdefault("min_data_ttl", DEFAULT_MIN_DATA_TTL_MS)
            if not table.replicated:
                # (a replicated table keeps its queue as replication needs it, longer only if set)
                attrs.setdefault("change_retention", DEFAULT_CHANGE_RETENTION_MS)
                attrs["enable_change_log"] = table.change_log
            if table.sorted:
                attrs["pivot_keys"] = table.pivot_keys
            else:
                attrs.pop("pivot_keys", None)
            attrs["tablets"] = self._tablets_attribute(node)
            if table.upstream_replica_id:
                attrs["upstream_replica_id"] = table.upstream_replica_id
                progress = self.replication.bootstrap_progress(table.upstream_replica_id)
                if progress is not None:
                    attrs["bootstrap_progress"] = progress
            if table.replicated:
                attrs["replicas"] = self.replication.replicas_attribute(node.id)
                options = dict(node.attributes.get("replicated_table_options") or {})
                options.setdefault("enable_replicated_table_tracker", False)
                attrs["replicated_table_options"] = options
                attrs.setdefault("min_replication_log_ttl", DEFAULT_MIN_REPLICATION_LOG_TTL_MS)
            collocation = self.collocation_of(node)
            if collocation is not None:
                attrs["replication_collocation_id"] = collocation.id
                attrs["replication_collocation_table_paths"] = [
                    self.cypress.by_id[i].path for i in collocation.attributes.get("table_ids", [])
                    if i in self.cypress.by_id]
        return attrs

    def _tablets_attribute(self, node: Node) -> builtins.list[dict[str, Any]]:
        table = node.table
        assert table is not None
        tablets = []
        for i in range(table.tablet_count):
            info: dict[str, Any] = {"index": i, "tablet_id": tablet_id(node.id, i), "state": table.state.value}
            if table.sorted:
                info["pivot_key"] = table.pivot_keys[i]
            if not table.sorted or table.replicated:
                row_count, trimmed = table.tablet_rows.get(i, [0, 0])
                info["flushed_row_count"] = row_count
                info["trimmed_row_count"] = trimmed
            tablets.append(info)
        return tablets

    def get_attribute(self, node: Node, attr_path: tuple[str, ...]) -> Any:
        value: Any = self._all_attributes(node)
        for i, key in enumerate(attr_path):
            if isinstance(value, dict) and key in value:
                value = value[key]
            elif isinstance(value, list) and key.lstrip("-").isdigit() and -len(value) <= int(key) < len(value):
                value = value[int(key)]
            else:
                raise ResolveError(f"Attribute {'/'.join(attr_path[: i + 1])!r} is not found at {node.path}",
                                   attributes={"path": node.path})
        return value

    def refresh_directory(self) -> None:
        node = self.tables.clusters_node()
        value = self.node_value(node, None, reveal_secrets=True) if node is not None else {}
        try:
            self.peers.update(parse_directory(value))
        except YtError as exc:
            log.error("invalid cluster directory", extra={"error": exc.message})

    def collocation_of(self, table_node: Node) -> Node | None:
        for node in list(self.cypress.by_id.values()):
            if node.type == "table_collocation" and table_node.id in node.attributes.get("table_ids", []):
                return node
        return None
