"""Cypress-lite: the tree of nodes (``//tmp``, ``//home/...``, ``//sys``) with attributes and ids.

The tree is small, so it lives in memory and every mutation is written through to ``_rt_nodes``
in the same SQL transaction as whatever else the command changes (creating a table creates its SQL
tables and its node atomically). Paths follow YPath: ``//a/b``, ``#<id>``, ``#<id>/child``,
``//a/@attr/sub`` for attributes, with ``\\`` escapes.

Memory never outlives a rolled-back transaction: :meth:`Cypress.save` and :meth:`Cypress.detach`
register undos (``storage.on_rollback``) that put the nodes back as the last commit left them, so
a command that fails half-way (a value YSON cannot write, a check after a first change) leaves
the tree in memory equal to the tree in SQL. Each node remembers the text of its last saved row
(``Node.persisted``) for that: restoring it needs no SQL read, and it covers every caller that
changes a node in place and then saves it, in whatever module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..errors import ErrorCode, ResolveError, YtError
from ..storage import nodes_table, on_rollback
from ..tablets import DynamicTable

ROOT_ID = "0-0-12f-0"
MAP_NODE = "map_node"
#: attributes kept in the node row but never shown to users
INTERNAL_PREFIX = "_rt_"

OBJECT_TYPES = {
    "map_node": 0x12F, "document": 0x132, "string_node": 0x12A, "int64_node": 0x12B, "uint64_node": 0x12C,
    "double_node": 0x12D, "boolean_node": 0x13A, "list_node": 0x130, "table": 0x191,
    "replicated_table": 0x2C4, "table_replica": 0x2C5, "table_collocation": 0x3F5,
}


@dataclass(eq=False)
class Node:
    id: str
    type: str
    name: str | None
    parent: Node | None
    attributes: dict[str, Any] = field(default_factory=dict)
    children: dict[str, Node] = field(default_factory=dict)
    value: Any = None
    table: DynamicTable | None = None
    #: (type, attributes, value) as last written to SQL, None for a node not saved yet; changes only
    #: under Storage.write_lock, with the row
    persisted: tuple[str, str, str | None] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        if self.parent is None:
            return "/" if self.id == ROOT_ID else f"#{self.id}"
        parent_path = self.parent.path
        escaped = (self.name or "").replace("\\", "\\\\").replace("/", "\\/").replace("@", "\\@")
        return f"/{parent_path.rstrip('/')}/{escaped}" if parent_path == "/" else f"{parent_path}/{escaped}"

    @property
    def depth(self) -> int:
        """How many nodes lie above this one (the root is at 0, ``//tmp`` at 1)."""
        depth, node = 0, self.parent
        while node is not None:
            depth, node = depth + 1, node.parent
        return depth

    def user_attributes(self) -> dict[str, Any]:
        return {k: v for k, v in self.attributes.items() if not k.startswith(INTERNAL_PREFIX)}


@dataclass(frozen=True)
class YPath:
    text: str
    start: str | None
    segments: tuple[str, ...]
    attribute_path: tuple[str, ...] | None


def parse_ypath(raw: Any) -> YPath:
    """Split a YPath into its anchor (root or ``#id``), node segments and attribute path."""
    if type(raw) is str:
        return _parse_ypath_text(raw)  # the usual case, parsed once per distinct path
    return _parse_ypath(yson_util.to_str(yson_util.strip(raw)))


@functools.lru_cache(maxsize=4096)
def _parse_ypath_text(text: str) -> YPath:
    return _parse_ypath(text)


def _parse_ypath(text: str) -> YPath:
    text = text.strip()
    if not text:
        raise YtError("YPath cannot be empty", code=ErrorCode.RESOLVE_ERROR)
    if text in ("/", "//"):
        start, rest = None, ""
    elif text.startswith("//"):
        start, rest = None, text[1:]
    elif text == "/":
        start, rest = None, ""
    elif text.startswith("#"):
        end = text.find("/")
        start, rest = (text[1:], "") if end < 0 else (text[1:end], text[end:])
        if not start:
            raise YtError(f"Malformed YPath {text!r}: empty object id", code=ErrorCode.RESOLVE_ERROR)
    else:
        raise YtError(f"Malformed YPath {text!r}: it must start with \"//\" or \"#\"",
                      code=ErrorCode.RESOLVE_ERROR)
    tokens: list[tuple[str, bool]] = []
    i = 0
    while i < len(rest):
        if rest[i] != "/":
            raise YtError(f"Malformed YPath {text!r}: expected \"/\" at position {i}", code=ErrorCode.RESOLVE_ERROR)
        i += 1
        buf: list[str] = []
        is_attr = i < len(rest) and rest[i] == "@"
        if is_attr:
            i += 1
        while i < len(rest) and rest[i] != "/":
            if rest[i] == "\\" and i + 1 < len(rest):
                buf.append(rest[i + 1])
                i += 2
                continue
            buf.append(rest[i])
            i += 1
        tokens.append(("".join(buf), is_attr))
    segments: list[str] = []
    attr_path: list[str] | None = None
    for token, is_attr in tokens:
        if attr_path is not None:
            attr_path.append(token)
        elif is_attr:
            attr_path = [token] if token else []
        else:
            if not token:
                raise YtError(f"Malformed YPath {text!r}: empty path segment", code=ErrorCode.RESOLVE_ERROR)
            segments.append(token)
    return YPath(text=text, start=start, segments=tuple(segments),
                 attribute_path=tuple(attr_path) if attr_path is not None else None)


class Cypress:
    """The node tree; callers hold the storage writer lock around mutations."""

    def __init__(self) -> None:
        self.root = Node(id=ROOT_ID, type=MAP_NODE, name=None, parent=None)
        #: every node by id. Nodes, their children and attributes change only under
        #: Storage.write_lock (inside the write transaction that persists them); readers (get, the
        #: replicators) read without a lock and iterate over copies (``list(by_id.values())``)
        self.by_id: dict[str, Node] = {ROOT_ID: self.root}

    def resolve(self, path: YPath, *, missing_ok: bool = False) -> Node | None:
        node = self.root
        if path.start is not None:
            found = self.by_id.get(path.start)
            if found is None:
                if missing_ok:
                    return None
                raise ResolveError(f"No such object #{path.start}", attributes={"path": path.text})
            node = found
        for i, seg in enumerate(path.segments):
            child = node.children.get(seg) if node.type == MAP_NODE else None
            if child is None:
                if missing_ok:
                    return None
                so_far = "/".join(path.segments[:i])
                parent = f"{_prefix(path)}{so_far}" if i else (f"#{path.start}" if path.start else "/")
                raise ResolveError(f"Error resolving path {path.text}: node {parent} has no child with key {seg!r}",
                                   attributes={"path": path.text})
            node = child
        return node

    def resolve_parent(self, path: YPath, *, recursive: bool) -> tuple[Node, str, list[str]]:
        """Parent node of a path to create, the new name, and missing intermediate names."""
        if not path.segments:
            raise YtError(f"Cannot create node {path.text}: it already exists", code=ErrorCode.ALREADY_EXISTS)
        parent = self.resolve(YPath(path.text, path.start, (), None))
        assert parent is not None
        missing: list[str] = []
        for seg in path.segments[:-1]:
            if missing:
                missing.append(seg)
                continue
            child = parent.children.get(seg) if parent.type == MAP_NODE else None
            if child is None:
                if not recursive:
                    raise ResolveError(f"Cannot create {path.text}: parent node {_prefix(path)}"
                                       f"{'/'.join(path.segments[:-1])} does not exist "
                                       "(use recursive=%true)", attributes={"path": path.text})
                missing.append(seg)
                continue
            parent = child
        if parent.type != MAP_NODE:
            raise YtError(f"Cannot create {path.text}: {parent.path} is a {parent.type}, not a map node",
                          code=ErrorCode.RESOLVE_ERROR)
        return parent, path.segments[-1], missing

    # -- persistence -----------------------------------------------------------------------------

    def attach(self, node: Node) -> None:
        """Link a node into the tree (a new node is unlinked again if its first save rolls back)."""
        self.by_id[node.id] = node
        if node.parent is not None and node.name is not None:
            node.parent.children[node.name] = node

    def _unattach(self, node: Node) -> None:
        if self.by_id.get(node.id) is node:
            del self.by_id[node.id]
        if node.parent is not None and node.name is not None and node.parent.children.get(node.name) is node:
            del node.parent.children[node.name]

    def detach(self, node: Node, conn: sa.Connection | None = None) -> list[Node]:
        """Remove a subtree from memory; returns the removed nodes, deepest first.

        With ``conn`` (a write transaction) the subtree comes back if that transaction rolls back."""
        removed: list[Node] = []

        def walk(n: Node) -> None:
            for child in list(n.children.values()):
                walk(child)
            removed.append(n)

        walk(node)
        for n in removed:
            self.by_id.pop(n.id, None)
        if node.parent is not None and node.name is not None:
            node.parent.children.pop(node.name, None)
        if conn is not None:
            on_rollback(conn, lambda: self._reattach(removed))
        return removed

    def _reattach(self, removed: list[Node]) -> None:
        for n in reversed(removed):  # the subtree's root first; links inside the subtree were kept
            self.attach(n)

    def save(self, conn: sa.Connection, node: Node) -> None:
        """Write a node's row; if the transaction rolls back, the node in memory goes back to its
        last saved row (a node never saved before leaves the tree).

        A value YSON cannot write or read back is refused with a YT error naming the node; the
        caller's transaction rolls back, and with it whatever it changed in memory."""
        previous = node.persisted
        on_rollback(conn, lambda: self._restore(node, previous))
        try:
            if node.name is not None:
                yson_util.check_key(node.name, node_name=True, kind="node name")
            attributes = yson_util.dumps_stored(node.attributes)
            value = None if node.value is None else yson_util.dumps_stored(node.value)
        except yson_util.InvalidValue as exc:
            raise YtError(f"Cannot store node {node.path}: {exc.reason}", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": node.path}) from None
        values = {"parent_id": node.parent.id if node.parent else None, "name": node.name, "type": node.type,
                  "attributes": attributes, "value": value}
        updated = conn.execute(nodes_table.update().where(nodes_table.c.id == node.id).values(**values))
        if updated.rowcount == 0:
            conn.execute(nodes_table.insert().values(id=node.id, **values))
        node.persisted = (node.type, attributes, value)

    def _restore(self, node: Node, saved: tuple[str, str, str | None] | None) -> None:
        """Undo of :meth:`save`: the node as its last saved row has it. The attributes are a new
        map, not the old one cleared: a reader iterating the old one (no lock) is not disturbed."""
        if saved is None:
            if node.id == ROOT_ID:
                node.attributes = {}
            else:
                self._unattach(node)
            node.persisted = None
            return
        node_type, attributes, value = saved
        node.type = node_type
        node.attributes = yson_util.loads_text(attributes) or {}
        node.value = None if value is None else yson_util.loads_text(value)
        node.persisted = saved

    @staticmethod
    def delete(conn: sa.Connection, nodes: list[Node]) -> None:
        ids = [n.id for n in nodes]
        for i in range(0, len(ids), 500):
            conn.execute(nodes_table.delete().where(nodes_table.c.id.in_(ids[i:i + 500])))

    def load(self, conn: sa.Connection) -> list[Node]:
        rows = conn.execute(sa.select(nodes_table)).all()
        nodes: dict[str, Node] = {}
        for r in rows:
            attrs = yson_util.loads_text(r.attributes) or {}
            value = yson_util.loads_text(r.value) if r.value is not None else None
            nodes[r.id] = Node(id=r.id, type=r.type, name=r.name, parent=None, attributes=attrs, value=value,
                               persisted=(r.type, r.attributes, r.value))
        for r in rows:
            node = nodes[r.id]
            if r.id == ROOT_ID:
                self.root.attributes = node.attributes
                self.root.persisted = node.persisted
                continue
            parent = self.root if r.parent_id == ROOT_ID else nodes.get(r.parent_id)
            node.parent = parent
        for node in nodes.values():
            if node.id != ROOT_ID:
                self.attach(node)
        return [n for n in nodes.values() if n.id != ROOT_ID]


def _prefix(path: YPath) -> str:
    return f"#{path.start}/" if path.start else "//"
