"""Changing the tree: create, set, remove, the cluster directory, collocations (``CypressService``).

Every command validates and prepares everything before it changes memory, and changes memory and
SQL together inside one write transaction (under the storage writer lock). Values from a request
are checked whole first (``yson_util.checked_python``: integer range, lone surrogates, ``$`` keys,
depth), names and the depth a node would have too, and every node a removal would take is checked
before the first goes: removing a replicated table also forgets its replicas, which no rollback
brings back. Whatever still fails half-way (SQL, a value the tree refuses to store) rolls back
with the transaction: the tree's own undos put the nodes back (``cypress/tree.py``).

``//sys/clusters`` is changed only as a whole, validated (``peers.parse_directory``), whichever
path or object id names it; a masked token written back keeps the stored one only while the
cluster's ``proxy_url`` is unchanged (``peers.keep_stored_tokens``).

Collaborators (given by the composition root, ``cluster.py``): the storage and the tree, the node's
tables, the read side (``NodeReads``: values and attributes as they leave the tree), replication
(replica objects, the options of replicated tables) and the change feed (a removed table wakes the
pulls waiting on it). Settings that another subsystem owns are checked by the checks it registers
(``add_setting_check``: XDCR's ``//sys/@xdcr_*``), before the writer lock is taken.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..cypress import (
    INTERNAL_PREFIX,
    MAP_NODE,
    OBJECT_TYPES,
    ROOT_ID,
    Cypress,
    Node,
    YPath,
    parse_ypath,
)
from ..errors import AlreadyExistsError, ErrorCode, ResolveError, TabletStateError, YtError
from ..peers import parse_directory
from ..peers.directory import keep_stored_tokens
from ..replication import (
    ReplicationManager,
    validate_replicated_table_options,
    validate_throttler,
)
from ..schema import TableSchema
from ..storage import Storage, consumers_table, meta_table, on_commit, on_rollback, tablets_table
from ..tablets import (
    TabletState,
    parse_pivot_keys,
)
from ..tablets.changes import ChangeFeed, drop_log
from ..transactions import (
    make_object_id,
)
from .node_checks import (
    check_depth,
    check_names,
    check_node_depth,
    check_xdcr_table,
    checked,
    validate_table_attributes,
    xdcr_flag,
)
from .node_reads import NodeReads
from .tables import (
    CHANGE_LOG_ATTRIBUTE,
    CLUSTERS_PATH,
    READ_ONLY_ATTRIBUTES,
    SCALAR_TYPES,
    TABLE_TYPES,
    Tables,
)

#: a check of an attribute set, run before the writer lock: (the path, the value) -> None or a YtError
SettingCheck = Callable[[YPath, Any], None]




class CypressService:
    """create, set, remove, the directory and collocations."""

    def __init__(self, name: str, storage: Storage, cypress: Cypress, tables: Tables, reads: NodeReads,
                 replication: ReplicationManager, change_feed: ChangeFeed) -> None:
        self.name = name
        self.storage = storage
        self.cypress = cypress
        self.tables = tables
        self.reads = reads
        self.replication = replication
        self.change_feed = change_feed
        self._setting_checks: list[SettingCheck] = []

    def add_setting_check(self, check: SettingCheck) -> None:
        """Register a check of attribute sets (a subsystem's settings: XDCR's ``//sys/@xdcr_*``)."""
        self._setting_checks.append(check)

    def create(self, type: str, path: Any, attributes: dict[str, Any] | None = None, recursive: bool = False,
               ignore_existing: bool = False, force: bool = False) -> str:
        where = "" if path is None else f" {yson_util.printable(yson_util.to_str(yson_util.strip(path)))}"
        attributes = checked(attributes or {}, f"Cannot create {type}{where}", yson_util.MAX_DEPTH)
        if not isinstance(attributes, dict):
            raise YtError("Parameter \"attributes\" must be a map", code=ErrorCode.INVALID_PARAMETER)
        if type == "table_replica":
            return self.replication.create_replica(attributes)
        if type == "table_collocation":
            return self._create_collocation(attributes)
        ypath = parse_ypath(path)
        for name in attributes:
            if name in READ_ONLY_ATTRIBUTES - {"schema", "pivot_keys", "tablet_count", "dynamic"} or \
                    name.startswith(INTERNAL_PREFIX):
                raise YtError(f"Attribute {name!r} is read-only and cannot be given to create",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": name})
        if type not in ("map_node", "table", "replicated_table", "document", "string_node", "int64_node",
                        "uint64_node", "double_node", "boolean_node", "list_node"):
            raise YtError(f"Unknown or unsupported object type {type!r}", code=ErrorCode.INVALID_PARAMETER)
        check_names(ypath.segments, f"Cannot create {yson_util.printable(ypath.text)}")
        with self.storage.write() as conn:
            existing = self.cypress.resolve(ypath, missing_ok=True)
            if existing is not None:
                if ignore_existing and existing.type == type:
                    return existing.id
                if not force:
                    raise AlreadyExistsError(f"Node {ypath.text} already exists",
                                             attributes={"path": ypath.text})
            parent, name, missing = self.cypress.resolve_parent(ypath, recursive=recursive)
            # everything is checked before the first change (a forced create removes the old node)
            action = f"Cannot create {yson_util.printable(ypath.text)}"
            depth = check_node_depth(parent.depth + len(missing) + 1, action)
            check_depth(attributes, yson_util.MAX_DEPTH - depth, action, what="its attributes", extra=1)
            if type in TABLE_TYPES:
                if type == "replicated_table":
                    attributes["dynamic"] = attributes.get("dynamic", True)
                validate_table_attributes(attributes, ypath.text, self.name, self.tables.cluster_id,
                                          replicated=type == "replicated_table")
            if parent is self.tables.clusters_node() or self.tables.under_directory(parent):
                raise YtError(f"Use set to change {CLUSTERS_PATH}", code=ErrorCode.INVALID_PARAMETER)
            if existing is not None:
                self._remove_node(conn, existing, recursive=True)
            for seg in missing:
                parent = self.tables.new_node(conn, parent, seg, MAP_NODE, {})
            if type in TABLE_TYPES:
                node = self._create_table(conn, parent, name, attributes, ypath.text, type)
            else:
                node = self.tables.new_node(conn, parent, name, type, attributes,
                                      value=None if type == MAP_NODE else attributes.pop("value", None))
            return node.id

    # -- checks of input, before anything changes ----------------------------------------------------







    def _set_xdcr(self, conn: sa.Connection, node: Node, table: Any, value: Any) -> None:
        """``set @xdcr %true`` makes a table an XDCR table, only while it is empty (seed 001)."""
        wanted = xdcr_flag(value, node.path)
        if wanted == (table.xdcr_cluster_id is not None):
            return
        if not wanted:
            raise YtError(f"Cannot turn XDCR off for {node.path}: leave the group with dr_drop or dr_reset instead",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        check_xdcr_table(table.schema, {"atomicity": table.atomicity, "upstream_replica_id": table.upstream_replica_id},
                         node.path, self.name, self.tables.cluster_id, table.replicated)
        if not table.is_empty(conn):
            raise YtError(f"Cannot make {node.path} an XDCR table: it holds rows (only an empty table can become "
                          "one; load data on one cluster after the group is set up)", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": node.path})
        before = (table.xdcr_cluster_id, table.change_log)
        had = node.attributes.get(CHANGE_LOG_ATTRIBUTE)
        table.xdcr_cluster_id = self.tables.cluster_id
        # its changes are shipped from its log (empty: nothing was left out of it); every change is
        # logged, as on an XDCR table made so, until @enable_change_log is set to %false
        table.change_log = True
        node.attributes[CHANGE_LOG_ATTRIBUTE] = True

        def undo() -> None:
            table.xdcr_cluster_id, table.change_log = before
            if had is None:
                node.attributes.pop(CHANGE_LOG_ATTRIBUTE, None)
            else:
                node.attributes[CHANGE_LOG_ATTRIBUTE] = had

        on_rollback(conn, undo)

    def create_system_table(self, conn: sa.Connection, name: str, schema: list[dict[str, Any]]) -> Node:
        """A table under //sys the engine keeps itself (XDCR's conflict log), mounted; inside the
        caller's write transaction."""
        sys_node = self.cypress.root.children["sys"]
        node = self._create_table(conn, sys_node, name, {"dynamic": True, "schema": schema},
                                  f"//sys/{name}")
        assert node.table is not None
        node.table.state = TabletState.MOUNTED
        self.tables.save_table_state(conn, node)
        return node

    def _create_table(self, conn: sa.Connection, parent: Node, name: str, attrs: dict[str, Any],
                      path: str, node_type: str = "table") -> Node:
        schema = TableSchema.parse(attrs.pop("schema"), path)
        attrs.pop("dynamic", None)
        counter = int(conn.execute(sa.select(meta_table.c.value).where(
            meta_table.c.name == "table_counter")).scalar() or 0) + 1
        self.storage.set_meta(conn, "table_counter", str(counter))
        sql_name = f"rt_t{counter}"
        stored: dict[str, Any] = dict(attrs)
        stored["schema"] = [c.to_yt() for c in schema.columns]
        stored[f"{INTERNAL_PREFIX}schema_attrs"] = {"strict": schema.strict, "unique_keys": schema.unique_keys}
        stored[f"{INTERNAL_PREFIX}sql_name"] = sql_name
        stored[f"{INTERNAL_PREFIX}tablet_state"] = TabletState.UNMOUNTED.value
        stored.setdefault("atomicity", "full")
        if schema.is_sorted:
            stored["pivot_keys"] = parse_pivot_keys(attrs["pivot_keys"], schema, path) \
                if "pivot_keys" in attrs else [[]]
        else:
            stored[f"{INTERNAL_PREFIX}tablet_count"] = int(stored.pop("tablet_count", 1))
        if stored.get("upstream_replica_id") in ("0-0-0-0", ""):
            stored.pop("upstream_replica_id")
        node = self.tables.new_node(conn, parent, name, node_type, stored)
        node.table = self.tables.make_table(node, new=True)
        node.table.has_read_locks = False
        node.table.sql.create(conn)
        node.table.sql.create_view(conn, path)  # readable by any SQL tool under its path (docs/storage.md)
        if not schema.is_sorted or node.table.replicated:
            for i in range(node.table.tablet_count):
                conn.execute(tablets_table.insert().values(table_id=node.id, tablet_index=i, row_count=0,
                                                           trimmed_row_count=0))
                node.table.tablet_rows[i] = [0, 0]
        return node

    def _check_removable(self, node: Node, recursive: bool) -> None:
        """Refuse the removal of ``node`` before anything is removed: the root, a system node, a
        non-empty node without ``recursive``, a subtree holding a table that is not unmounted."""
        if node.id == ROOT_ID:
            raise YtError("Cannot remove the root node", code=ErrorCode.INVALID_PARAMETER)
        if node is self.tables.clusters_node() or (node.parent is not None and node.parent.id == ROOT_ID
                                              and node.name == "sys"):
            raise YtError(f"Cannot remove {node.path}: it is a system node", code=ErrorCode.INVALID_PARAMETER)
        if node.type in ("table_replica", "table_collocation"):
            return
        if node.children and not recursive:
            raise YtError(f"Cannot remove non-empty composite node {node.path} (use recursive=%true)",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        for n in self._subtree(node):
            if n.table is not None and n.table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot remove table {n.path}: it is {n.table.state.value}; "
                                       "unmount it first", attributes={"path": n.path})

    @staticmethod
    def _subtree(node: Node) -> list[Node]:
        subtree: list[Node] = []
        pending = [node]
        while pending:
            n = pending.pop()
            subtree.append(n)
            pending.extend(n.children.values())
        return subtree

    def _remove_node(self, conn: sa.Connection, node: Node, recursive: bool) -> None:
        self._check_removable(node, recursive)
        if node.type == "table_replica":
            self.replication.remove_replica(conn, node.id)
            self.cypress.delete(conn, self.cypress.detach(node, conn))
            return
        if node.type == "table_collocation":
            self._drop_collocation(conn, node)
            return
        for n in self._subtree(node):
            if n.table is not None:
                for replica in self.replication.replicas_of(n.id):
                    self.replication.remove_replica(conn, replica.id)
                    self.cypress.delete(conn, self.cypress.detach(replica.node, conn))
                collocation = self.reads.collocation_of(n)
                if collocation is not None:
                    self._leave_collocation(conn, collocation, n)
                n.table.sql.drop_view(conn, n.path)
                n.table.sql.drop(conn)
                conn.execute(tablets_table.delete().where(tablets_table.c.table_id == n.id))
                drop_log(conn, n.id)
                # stream pulls waiting on the table wake up and answer that it is gone
                on_commit(conn, self.change_feed.notify)
        removed = self.cypress.detach(node, conn)
        self.cypress.delete(conn, removed)

    def remove(self, path: Any, recursive: bool = False, force: bool = False) -> None:
        ypath = parse_ypath(path)
        directory = False
        with self.storage.write() as conn:
            node = self.cypress.resolve(ypath, missing_ok=force)
            if node is None:
                return
            if ypath.attribute_path is not None:
                if ypath.attribute_path == ("replication_collocation_id",) and node.table is not None:
                    collocation = self.reads.collocation_of(node)
                    if collocation is None and not force:
                        raise ResolveError(f"Table {node.path} is in no collocation", attributes={"path": node.path})
                    if collocation is not None:
                        self._leave_collocation(conn, collocation, node)
                    return
                self._remove_attribute(conn, node, ypath, force)
                return
            relative = self._directory_relative(ypath)
            if relative:
                # the directory left behind must be valid, or the engine would keep using the old one
                updated = self.reads.node_value(self._directory(), None, reveal_secrets=True) or {}
                target = updated
                for key in relative[:-1]:
                    target = target[key]
                del target[relative[-1]]
                parse_directory(updated)
                directory = True
            self._remove_node(conn, node, recursive)
        if directory:
            self.reads.refresh_directory()

    def _remove_attribute(self, conn: sa.Connection, node: Node, ypath: YPath, force: bool) -> None:
        attr = ypath.attribute_path or ()
        if not attr:
            raise YtError(f"Cannot remove all attributes of {node.path}", code=ErrorCode.INVALID_PARAMETER)
        if attr[0] in READ_ONLY_ATTRIBUTES or attr[0].startswith(INTERNAL_PREFIX):
            raise YtError(f"Attribute {attr[0]!r} of {node.path} cannot be removed",
                          code=ErrorCode.INVALID_PARAMETER)
        container: Any = node.attributes
        for key in attr[:-1]:
            container = container.get(key) if isinstance(container, dict) else None
        if attr == (CHANGE_LOG_ATTRIBUTE,) and node.table is not None and not node.table.replicated:
            # removed: back to the default - a log on an XDCR table (docs/xdcr.md), none elsewhere -
            # and no longer stored, so the default decides again at the next start
            self._switch_change_log(conn, node, node.table.xdcr_cluster_id is not None)
            del node.attributes[CHANGE_LOG_ATTRIBUTE]
            self.cypress.save(conn, node)
            return
        if not isinstance(container, dict) or attr[-1] not in container:
            if force:
                return
            raise ResolveError(f"Attribute {'/'.join(attr)!r} of {node.path} is not found",
                               attributes={"path": ypath.text})
        del container[attr[-1]]
        self.cypress.save(conn, node)

    def set(self, path: Any, value: Any, recursive: bool = False, force: bool = False) -> None:
        ypath = parse_ypath(path)
        action = f"Cannot set {yson_util.printable(ypath.text)}"
        if ypath.attribute_path is None:
            check_names(ypath.segments, action)
        elif ypath.attribute_path:
            check_names(ypath.attribute_path, action, kind="attribute name")
        # the value is checked whole before the writer lock, its depth at its place below
        value = checked(value, action, yson_util.MAX_DEPTH, node_keys=ypath.attribute_path is None)
        if ypath.attribute_path:
            # settings whose check asks other clusters: before the writer lock (network, no lock held)
            self._check_setting(ypath, value)
        directory = False
        with self.storage.write() as conn:
            if ypath.attribute_path is not None:
                node = self.cypress.resolve(ypath)
                assert node is not None
                # an attribute's value nests below the node's map of attributes
                check_depth(value, yson_util.MAX_DEPTH - node.depth - max(len(ypath.attribute_path) - 1, 0),
                                  action)
                self._set_attribute(conn, node, ypath.attribute_path, value)
                return
            relative = self._directory_relative(ypath)
            if relative is not None:
                self._set_directory(conn, relative, value)
                directory = True
            else:
                node = self.cypress.resolve(ypath, missing_ok=True)
                if node is not None:
                    check_depth(value, yson_util.MAX_DEPTH - node.depth, action)
                    self._replace_node_value(conn, node, value)
                    return
                parent, name, missing = self.cypress.resolve_parent(ypath, recursive=recursive)
                depth = check_node_depth(parent.depth + len(missing) + 1, action)
                check_depth(value, yson_util.MAX_DEPTH - depth, action)
                for seg in missing:
                    parent = self.tables.new_node(conn, parent, seg, MAP_NODE, {})
                self._build_value_node(conn, parent, name, value)
        if directory:
            self.reads.refresh_directory()

    def _check_setting(self, ypath: YPath, value: Any) -> None:
        """The registered checks of an attribute set (``add_setting_check``), before the writer lock."""
        for check in self._setting_checks:
            check(ypath, value)

    def _directory(self) -> Node:
        clusters = self.tables.clusters_node()
        assert clusters is not None
        return clusters

    def _directory_relative(self, ypath: YPath) -> tuple[str, ...] | None:
        """Where a node path lands in ``//sys/clusters`` (``()`` for the directory itself), or None.

        Found by the nodes the path walks, not by its text: ``#<id>/b`` or ``#<id of b>/token``
        are the directory as much as ``//sys/clusters/b/token`` is."""
        clusters = self._directory()
        node = self.cypress.root if ypath.start is None else self.cypress.by_id.get(ypath.start)
        if node is None:
            return None
        names: list[str] | None = None
        above: Node | None = node
        trail: list[str] = []
        while above is not None:
            if above is clusters:
                names = trail[::-1]
                break
            trail.append(above.name or "")
            above = above.parent
        for seg in ypath.segments:
            if names is not None:
                names.append(seg)
                continue
            child = node.children.get(seg) if node.type == MAP_NODE else None
            if child is None:
                return None
            node = child
            if node is clusters:
                names = []
        return tuple(names) if names is not None else None

    def _set_directory(self, conn: sa.Connection, relative: tuple[str, ...], value: Any) -> None:
        """Change //sys/clusters as a whole: validated first; a masked token keeps its secret only
        while its cluster's proxy_url is unchanged (peers.keep_stored_tokens)."""
        clusters = self._directory()
        stored = self.reads.node_value(clusters, None, reveal_secrets=True) or {}
        updated: Any = self.reads.node_value(clusters, None) or {}  # as users see it: tokens masked
        where = f"{CLUSTERS_PATH}/{'/'.join(relative)}".rstrip("/")
        if not relative:
            updated = value
        else:
            target = updated
            for key in relative[:-1]:
                if not isinstance(target, dict) or key not in target:
                    raise ResolveError(f"Error resolving path {where}: {key!r} does not exist",
                                       attributes={"path": where})
                target = target[key]
            if not isinstance(target, dict):
                raise YtError(f"Cannot set {where}: its parent is not a map", code=ErrorCode.INVALID_PARAMETER)
            target[relative[-1]] = value
        updated = keep_stored_tokens(stored, copy.deepcopy(updated))
        parse_directory(updated)
        check_depth(updated, yson_util.MAX_DEPTH - clusters.depth, f"Cannot set {where}")
        self._replace_node_value(conn, clusters, updated)

    def _build_value_node(self, conn: sa.Connection, parent: Node, name: str, value: Any) -> Node:
        if isinstance(value, dict):
            node = self.tables.new_node(conn, parent, name, MAP_NODE, {})
            for k, v in value.items():
                self._build_value_node(conn, node, k, v)
            return node
        node_type = "document" if value is None else SCALAR_TYPES.get(type(value), "document")
        return self.tables.new_node(conn, parent, name, node_type, {}, value=value)

    def _replace_node_value(self, conn: sa.Connection, node: Node, value: Any) -> None:
        if node.type in TABLE_TYPES:
            raise YtError(f"Cannot set the value of table {node.path}; write rows with insert_rows",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        if node.type == MAP_NODE:
            if not isinstance(value, dict):
                raise YtError(f"Cannot set a {yson_util.type_name(value)} value to map node {node.path}",
                              code=ErrorCode.INVALID_PARAMETER)
            children = list(node.children.values())
            for child in children:  # all checked before the first is removed
                self._check_removable(child, recursive=True)
            for child in children:
                self._remove_node(conn, child, recursive=True)
            for k, v in value.items():
                self._build_value_node(conn, node, k, v)
            return
        node.value = value
        if node.type != "document":
            node.type = "document" if value is None else SCALAR_TYPES.get(type(value), "document")
        self.cypress.save(conn, node)

    def _set_attribute(self, conn: sa.Connection, node: Node, attr_path: tuple[str, ...], value: Any) -> None:
        if not attr_path:
            raise YtError(f"Cannot set all attributes of {node.path} at once", code=ErrorCode.INVALID_PARAMETER)
        name = attr_path[0]
        if name.startswith(INTERNAL_PREFIX):
            raise YtError(f"Attribute {name!r} is reserved", code=ErrorCode.INVALID_PARAMETER)
        if name in READ_ONLY_ATTRIBUTES:
            hint = {"schema": "use alter_table", "pivot_keys": "use reshard_table",
                    "tablet_count": "use reshard_table", "tablet_state": "use mount_table/unmount_table"}
            raise YtError(f"Attribute {name!r} of {node.path} cannot be set"
                          + (f": {hint[name]}" if name in hint else ""),
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path, "attribute": name})
        if node.type == "table_replica":
            self._set_replica_attribute(conn, node, attr_path, value)
            return
        table = node.table
        if table is not None and name == "upstream_replica_id":
            raise YtError(f"Attribute \"upstream_replica_id\" of {node.path} cannot be set: use alter_table on "
                          "the unmounted table", code=ErrorCode.INVALID_PARAMETER)
        if table is not None and name == "replication_collocation_id":
            collocation = self.cypress.by_id.get(str(value).lstrip("#"))
            if collocation is None or collocation.type != "table_collocation":
                raise ResolveError(f"No such table collocation {value!r}", attributes={"path": node.path})
            current = self.reads.collocation_of(node)
            if current is not None and current is not collocation:
                self._leave_collocation(conn, current, node)
            self._join_collocation(conn, collocation, node)
            return
        if table is not None and table.replicated and name in ("replicated_table_options", "replication_throttler"):
            updated = copy.deepcopy(node.attributes.get(name) or {})
            if len(attr_path) == 1:
                updated = value
            else:
                target = updated
                for key in attr_path[1:-1]:
                    target = target.setdefault(key, {})
                target[attr_path[-1]] = value
            (validate_replicated_table_options if name == "replicated_table_options" else validate_throttler)(
                updated, node.path)
            node.attributes[name] = updated
            self.cypress.save(conn, node)
            return
        if table is not None and name == "atomicity":
            if len(attr_path) != 1 or value not in ("full", "none"):
                raise YtError("Attribute \"atomicity\" must be \"full\" or \"none\"", code=ErrorCode.INVALID_PARAMETER)
            if table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot change atomicity of table {node.path}: table must be unmounted",
                                       attributes={"path": node.path})
            previous = table.atomicity
            on_rollback(conn, lambda: setattr(table, "atomicity", previous))
            table.atomicity = value
        if table is not None and name == "xdcr":
            self._set_xdcr(conn, node, table, value)
        if table is not None and name == CHANGE_LOG_ATTRIBUTE:
            if len(attr_path) != 1 or not isinstance(value, bool):
                raise YtError(f"Attribute \"{name}\" of {node.path} must be %true or %false",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
            self._switch_change_log(conn, node, value)
            return
        if table is not None and name in ("min_data_ttl", "change_retention") and (
                len(attr_path) != 1 or isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise YtError(f"Attribute \"{name}\" of {node.path} must be a non-negative number of milliseconds",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        self._set_in_attributes(conn, node, attr_path, value)

    def _switch_change_log(self, conn: sa.Connection, node: Node, on: bool) -> None:
        """``@enable_change_log`` of a sorted or ordered table (docs/streams.md, "Which tables keep a
        change log"): switched off only when nothing needs the log."""
        table = node.table
        assert table is not None
        if table.replicated:
            raise YtError(f"Attribute \"{CHANGE_LOG_ATTRIBUTE}\" of {node.path} cannot be set: a replicated table "
                          "streams its replication queue, which it always keeps", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": node.path})
        if not on:
            c = consumers_table.c
            consumers = conn.execute(sa.select(c.consumer_path).where(c.table_id == table.table_id)
                                     .order_by(c.consumer_path).limit(3)).scalars().all()
            if consumers:
                raise YtError(f"Cannot switch off the change log of {node.path}: consumers are registered "
                              f"({', '.join(consumers)}); unregister them first", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"path": node.path, "consumer_paths": list(consumers)})
        self.tables.switch_change_log(conn, node, on)

    def _set_in_attributes(self, conn: sa.Connection, node: Node, attr_path: tuple[str, ...], value: Any) -> None:
        """Set a user attribute (or a key inside one); the parents it names must exist as maps."""
        container: Any = node.attributes
        for key in attr_path[:-1]:
            if not isinstance(container, dict) or key not in container:
                raise ResolveError(f"Attribute {'/'.join(attr_path)!r} of {node.path}: "
                                   f"{key!r} does not exist", attributes={"path": node.path})
            container = container[key]
        if not isinstance(container, dict):
            raise YtError(f"Cannot set {'/'.join(attr_path)!r} of {node.path}: parent is not a map",
                          code=ErrorCode.INVALID_PARAMETER)
        container[attr_path[-1]] = value
        self.cypress.save(conn, node)

    def _set_replica_attribute(self, conn: sa.Connection, node: Node, attr_path: tuple[str, ...],
                               value: Any) -> None:
        replica = self.replication.replica(node.id)
        if attr_path == ("enable_replicated_table_tracker",):
            if not isinstance(value, bool):
                raise YtError("enable_replicated_table_tracker must be a boolean", code=ErrorCode.INVALID_PARAMETER)
            replica.tracker_enabled = value
            node.attributes["enable_replicated_table_tracker"] = value
            self.cypress.save(conn, node)
            return
        if attr_path[0] in ("mode", "state", "table_path", "cluster_name", "replica_path", "tablets",
                            "replication_lag_time", "errors", "start_replication_timestamp", "preserve_timestamps",
                            "atomicity", "replicated_table_tracker_enabled"):
            hint = " use alter_table_replica" if attr_path[0] in ("mode", "state") else ""
            raise YtError(f"Attribute {attr_path[0]!r} of replica {node.id} cannot be set;{hint}".rstrip(";"),
                          code=ErrorCode.INVALID_PARAMETER, attributes={"replica_id": node.id})
        self._set_in_attributes(conn, node, attr_path, value)

    def load_directory(self, value: Any) -> None:
        """Merge a directory (e.g. from a config file at start-up) into //sys/clusters."""
        directory = parse_directory(yson_util.to_python(value))
        for name, conn in directory.items():
            self.set(f"{CLUSTERS_PATH}/{name}", {"proxy_url": conn.proxy_url, "token": conn.token})

    def _create_collocation(self, attrs: dict[str, Any]) -> str:
        if attrs.get("collocation_type") != "replication":
            raise YtError("Cannot create table_collocation: collocation_type must be \"replication\"",
                          code=ErrorCode.INVALID_PARAMETER)
        paths = attrs.get("table_paths")
        if not isinstance(paths, list) or not paths:
            raise YtError("Cannot create table_collocation: table_paths must be a non-empty list of replicated tables",
                          code=ErrorCode.INVALID_PARAMETER)
        nodes = []
        for path in paths:
            table, table_path, node = self.tables.table(path)
            if not table.replicated:
                raise YtError(f"Cannot collocate {table_path}: it is not a replicated_table",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
            existing = self.reads.collocation_of(node)
            if existing is not None:
                raise YtError(f"Table {table_path} already belongs to collocation {existing.id}",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
            nodes.append(node)
        stored = {k: v for k, v in attrs.items() if k not in ("table_paths", "table_ids")}
        with self.storage.write() as conn:
            collocation = Node(id=make_object_id(OBJECT_TYPES["table_collocation"]), type="table_collocation",
                               name=None, parent=None, attributes={**stored, "table_ids": [n.id for n in nodes]})
            self.cypress.attach(collocation)
            self.cypress.save(conn, collocation)
        return collocation.id

    def _join_collocation(self, conn: sa.Connection, collocation: Node, table_node: Node) -> None:
        assert table_node.table is not None
        if not table_node.table.replicated:
            raise YtError(f"Cannot collocate {table_node.path}: it is not a replicated_table",
                          code=ErrorCode.INVALID_PARAMETER)
        ids = list(collocation.attributes.get("table_ids", []))
        if table_node.id not in ids:
            collocation.attributes["table_ids"] = [*ids, table_node.id]
            self.cypress.save(conn, collocation)

    def _leave_collocation(self, conn: sa.Connection, collocation: Node, table_node: Node) -> None:
        collocation.attributes["table_ids"] = [i for i in collocation.attributes.get("table_ids", [])
                                               if i != table_node.id]
        self.cypress.save(conn, collocation)

    def _drop_collocation(self, conn: sa.Connection, collocation: Node) -> None:
        self.cypress.delete(conn, self.cypress.detach(collocation, conn))
