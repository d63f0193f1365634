"""One table cluster: the commands of the YT API as plain Python methods.

Every public method here is one YT command (``create``, ``insert_rows``, ``select_rows``...), takes
already-decoded parameters and returns plain Python values. The HTTP layer decodes requests and
encodes results; nothing here knows about HTTP. Each mutating command validates everything first
and then changes state in one SQL transaction, so a failed command leaves nothing behind.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..config import DEFAULT_CONFIG, EngineConfig
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
from ..faults import Faults
from ..metrics import EngineMetrics
from ..peers import MASKED_TOKEN, Peers, mask_tokens, parse_directory
from ..query import compile_query, parse_query
from ..replication import (
    DEFAULT_MIN_REPLICATION_LOG_TTL_MS,
    ReplicationManager,
    validate_replicated_table_options,
    validate_throttler,
)
from ..schema import MAX_ROW_WEIGHT, TableSchema, row_weight, validate_row, validate_rows
from ..storage import Storage, UserTables, meta_table, read_locks_table, tablets_table
from ..tablets import (
    DynamicTable,
    RowWrite,
    TabletState,
    WriteKind,
    parse_pivot_keys,
    tablet_id,
    validate_key_not_null,
)
from ..timestamps import (
    ASYNC_LAST_COMMITTED_TIMESTAMP,
    COUNTER_BITS,
    MAX_TIMESTAMP,
    SYNC_LAST_COMMITTED_TIMESTAMP,
    ReservationFile,
    TimestampProvider,
    unix_to_timestamp,
)
from ..transactions import (
    Atomicity,
    Durability,
    TabletTransaction,
    TransactionManager,
    make_object_id,
)

log = logging.getLogger("reptables.engine")

#: the SQL layout of user tables (2: older versions only in <table>_versions, the latest in the table)
STORAGE_FORMAT = "2"
#: YT's default min_data_ttl: versions younger than this are kept for reads at a timestamp
DEFAULT_MIN_DATA_TTL_MS = 30 * 60 * 1000
#: a read timestamp may run ahead of this cluster's clock by at most this much
MAX_FUTURE_READ_SECONDS = 60
DEFAULT_OUTPUT_ROW_LIMIT = 1_000_000
DEFAULT_INPUT_ROW_LIMIT = 1_000_000
TABLE_TYPES = ("table", "replicated_table")
CLUSTERS_PATH = "//sys/clusters"
SCALAR_TYPES = {bool: "boolean_node", int: "int64_node", float: "double_node", str: "string_node",
                list: "list_node"}
READ_ONLY_ATTRIBUTES = {"id", "type", "path", "key", "parent_id", "dynamic", "sorted", "key_columns",
                        "tablet_state", "tablet_count", "pivot_keys", "tablets", "count", "schema",
                        "expected_tablet_state"}


def _retarget_query(query: str, path: str, new_path: str) -> str:
    for old, new in ((f"[{path}]", f"[{new_path}]"), (f"`{path}`", f"`{new_path}`")):
        if old in query:
            return query.replace(old, new, 1)
    raise YtError(f"Cannot redirect query to a replica: table {path} is not written as [path]",
                  code=ErrorCode.INVALID_PARAMETER)


def _is_storage_outage(exc: sa.exc.DBAPIError) -> bool:
    """Errors that mean "the database is busy or gone", as opposed to "this query is invalid"."""
    text = str(exc.orig).lower()
    return any(s in text for s in ("database is locked", "disk i/o error", "unable to open", "connection"))


def _flag(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.lower() in ("true", "1", "yes")
    return bool(value)


class Cluster:
    """All state of one engine: storage, timestamps, Cypress, tables, transactions."""

    def __init__(self, name: str, storage: Storage, state_dir: Path, config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.name = name
        self.config = config
        self.metrics = EngineMetrics()
        self.faults = Faults(config.crash_points)
        self.storage = storage
        self.cypress = Cypress()
        reservation = ReservationFile(state_dir / "timestamp.reservation")
        self.timestamps = TimestampProvider(reservation.read(), reservation.write)
        self.transactions = TransactionManager(storage, self.timestamps, self._table_by_id, self.metrics,
                                               self.faults, config)
        self.peers = Peers(timeout=config.sync_timeout)
        self.replication = ReplicationManager(self, self.peers, self.config)
        self.transactions.register_commit_hooks(self.replication)
        self._stop = threading.Event()  # set once by close(): the background loop ends
        self._background: threading.Thread | None = None
        self._load()

    @classmethod
    def open(cls, name: str, data_dir: Path, config: EngineConfig = DEFAULT_CONFIG) -> Cluster:
        return cls(name, Storage.for_data_dir(data_dir), data_dir, config)

    # -- start-up --------------------------------------------------------------------------------

    def _load(self) -> None:
        with self.storage.write() as conn:
            nodes = self.cypress.load(conn)
            tablets = conn.execute(sa.select(tablets_table)).all()
            stored_format = conn.execute(sa.select(meta_table.c.value).where(
                meta_table.c.name == "storage_format")).scalar()
            if nodes and stored_format != STORAGE_FORMAT:
                raise YtError(f"The data directory of cluster {self.name} was written by an older reptables "
                              f"(storage format {stored_format or 1}, this engine reads format {STORAGE_FORMAT});"
                              " export its tables and load them into a new data directory",
                              code=ErrorCode.INVALID_PARAMETER)
            self.storage.set_meta(conn, "storage_format", STORAGE_FORMAT)
            if not nodes:
                for name in ("tmp", "home", "sys"):
                    self._new_node(conn, self.cypress.root, name, MAP_NODE, {})
                self._new_node(conn, self.cypress.by_id[self.cypress.root.children["sys"].id], "clusters",
                               MAP_NODE, {})
            self.storage.set_meta(conn, "cluster_name", self.name)
        counts: dict[str, dict[int, list[int]]] = {}
        for t in tablets:
            counts.setdefault(t.table_id, {})[t.tablet_index] = [t.row_count, t.trimmed_row_count]
        with self.storage.read() as conn:
            locked = {r[0] for r in conn.execute(sa.select(read_locks_table.c.table_id).distinct())}
        for node in self.cypress.by_id.values():
            if node.type in TABLE_TYPES:
                node.table = self._make_table(node)
                node.table.tablet_rows = counts.get(node.id, {})
                node.table.has_read_locks = node.id in locked
        with self.storage.read() as conn:
            self.replication.load(conn)
        self._refresh_directory()
        held, aborted = self.transactions.recover()
        if held or aborted:
            log.info("recovered prepared transactions", extra={"in_doubt": held, "aborted": aborted})

    def _make_table(self, node: Node) -> DynamicTable:
        attrs = node.attributes
        path = node.path
        schema = TableSchema.parse(attrs["schema"], path)
        sql_name = attrs[f"{INTERNAL_PREFIX}sql_name"]
        replicated = node.type == "replicated_table"
        table = DynamicTable(
            table_id=node.id, schema=schema,
            sql=UserTables.queue(sql_name, schema) if replicated else UserTables(sql_name, schema),
            replicated=replicated, upstream_replica_id=attrs.get("upstream_replica_id") or None,
            pivot_keys=attrs.get("pivot_keys") or [[]],
            tablet_count_ordered=int(attrs.get(f"{INTERNAL_PREFIX}tablet_count", 1)),
            state=TabletState(attrs.get(f"{INTERNAL_PREFIX}tablet_state", "unmounted")),
            atomicity=attrs.get("atomicity", "full"),
            pinned_by=self.transactions.oldest_active_start_timestamp,
            config=self.config,
        )
        # every commit from now on is remembered for conflict checks; earlier ones are in SQL
        table.recent_floor = self.timestamps.generate()
        return table

    def _table_by_id(self, table_id: str) -> tuple[DynamicTable, str] | None:
        node = self.cypress.by_id.get(table_id)
        if node is None or node.table is None:
            return None
        return node.table, node.path

    # -- the cluster directory ------------------------------------------------------------------------

    def _clusters_node(self) -> Node | None:
        return self.cypress.resolve(parse_ypath(CLUSTERS_PATH), missing_ok=True)

    def _refresh_directory(self) -> None:
        node = self._clusters_node()
        value = self._node_value(node, None) if node is not None else {}
        try:
            self.peers.update(parse_directory(value))
        except YtError as exc:
            log.error("invalid cluster directory", extra={"error": exc.message})

    def _under_directory(self, node: Node) -> bool:
        clusters = self._clusters_node()
        while node is not None:
            if node is clusters:
                return True
            node = node.parent  # type: ignore[assignment]
        return False

    def load_directory(self, value: Any) -> None:
        """Merge a directory (e.g. from a config file at start-up) into //sys/clusters."""
        directory = parse_directory(yson_util.to_python(value))
        for name, conn in directory.items():
            self.set(f"{CLUSTERS_PATH}/{name}", {"proxy_url": conn.proxy_url, "token": conn.token})

    def start_background(self) -> None:
        """Expire abandoned transactions and compact old versions, until ``close``."""
        period = self.config.background_period

        def loop() -> None:
            last_compaction = 0.0
            while not self._stop.wait(period):
                try:
                    self.transactions.expire()
                    if time.monotonic() - last_compaction > 30:
                        self.compact()
                        last_compaction = time.monotonic()
                except Exception:  # noqa: BLE001 - a background pass must never kill the engine
                    log.exception("background maintenance failed")

        self._background = threading.Thread(target=loop, name="engine-maintenance", daemon=True)
        self._background.start()
        self.replication.start()

    def close(self) -> None:
        self._stop.set()
        self.replication.close()
        self.peers.close()
        if self._background is not None:
            self._background.join(timeout=5)
        self.storage.close()

    def compact(self) -> int:
        """Drop versions older than each table's min_data_ttl, never past an active snapshot."""
        removed = 0
        pinned = self.transactions.oldest_active_start_timestamp()
        for node in list(self.cypress.by_id.values()):
            if node.table is None or not node.table.sorted:
                continue
            ttl_ms = int(node.attributes.get("min_data_ttl", DEFAULT_MIN_DATA_TTL_MS))
            # timestamps are (seconds << 30) | counter, so a duration shifts them by seconds << 30
            horizon = self.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
            if pinned is not None:
                horizon = min(horizon, pinned)
            with self.storage.write() as conn:
                removed += node.table.compact(conn, horizon)
        return removed

    # -- helpers ---------------------------------------------------------------------------------

    def _new_node(self, conn: sa.Connection, parent: Node, name: str, node_type: str,
                  attributes: dict[str, Any], value: Any = None) -> Node:
        node = Node(id=make_object_id(OBJECT_TYPES.get(node_type, 0x12F)), type=node_type, name=name,
                    parent=parent, attributes=attributes, value=value)
        self.cypress.attach(node)
        self.cypress.save(conn, node)
        return node

    def _resolve(self, path: Any) -> tuple[Node, YPath]:
        ypath = parse_ypath(path)
        node = self.cypress.resolve(ypath)
        assert node is not None
        return node, ypath

    def _table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        node, ypath = self._resolve(path)
        if ypath.attribute_path is not None:
            raise YtError(f"Path {ypath.text} names an attribute, not a table", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": ypath.text})
        if node.table is None:
            raise YtError(f"Node {node.path} is a {node.type}, not a dynamic table",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        return node.table, node.path, node

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        """The dynamic table at ``path``, its path and node (``ReplicationHost.resolve_table``)."""
        return self._table(path)

    def is_plain_table(self, path: Any) -> bool:
        """Whether ``path`` names a dynamic table whose reads and writes stay on this cluster and wait
        for nothing (not a replicated table, which forwards reads and runs sync replica commits
        elsewhere; not a replica table while sync writes to it are in flight)."""
        try:
            table, _, _ = self._table(path)
        except YtError:
            return False
        # a replica table with prepared writes in flight may make a read wait for them
        return not table.replicated and not self.transactions.has_remote_prepared(table.table_id)

    def _save_table_state(self, conn: sa.Connection, node: Node) -> None:
        assert node.table is not None
        node.attributes[f"{INTERNAL_PREFIX}tablet_state"] = node.table.state.value
        self.cypress.save(conn, node)

    def _read_timestamp(self, timestamp: Any) -> int | None:
        """Validate a read timestamp; None means "latest committed"."""
        if timestamp is None:
            return None
        if isinstance(timestamp, bool) or not isinstance(timestamp, int):
            raise YtError(f"Invalid timestamp {timestamp!r}: expected an unsigned 64-bit integer",
                          code=ErrorCode.INVALID_PARAMETER)
        if timestamp in (SYNC_LAST_COMMITTED_TIMESTAMP, ASYNC_LAST_COMMITTED_TIMESTAMP):
            return None
        if timestamp < (1 << COUNTER_BITS) or timestamp > MAX_TIMESTAMP:
            raise YtError(f"Invalid timestamp {timestamp}: out of range", code=ErrorCode.INVALID_PARAMETER)
        limit = unix_to_timestamp(time.time() + MAX_FUTURE_READ_SECONDS)
        if timestamp > limit:
            raise YtError(f"Invalid timestamp {timestamp:x}: it is more than {MAX_FUTURE_READ_SECONDS} s "
                          "ahead of this cluster's clock", code=ErrorCode.INVALID_PARAMETER)
        # later commits here must get larger timestamps, or this read would not be repeatable
        self.timestamps.observe(timestamp)
        self.transactions.wait_visible(timestamp)
        return timestamp

    # -- Cypress commands ------------------------------------------------------------------------

    def create(self, type: str, path: Any, attributes: dict[str, Any] | None = None, recursive: bool = False,
               ignore_existing: bool = False, force: bool = False) -> str:
        attributes = yson_util.to_python(attributes or {})
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
        with self.storage.write() as conn:
            existing = self.cypress.resolve(ypath, missing_ok=True)
            if existing is not None:
                if ignore_existing and existing.type == type:
                    return existing.id
                if not force:
                    raise AlreadyExistsError(f"Node {ypath.text} already exists",
                                             attributes={"path": ypath.text})
                self._remove_node(conn, existing, recursive=True)
            parent, name, missing = self.cypress.resolve_parent(ypath, recursive=recursive)
            if type in TABLE_TYPES:
                if type == "replicated_table":
                    attributes["dynamic"] = attributes.get("dynamic", True)
                self._validate_table_attributes(attributes, ypath.text, replicated=type == "replicated_table")
            if parent is self._clusters_node() or self._under_directory(parent):
                raise YtError(f"Use set to change {CLUSTERS_PATH}", code=ErrorCode.INVALID_PARAMETER)
            for seg in missing:
                parent = self._new_node(conn, parent, seg, MAP_NODE, {})
            if type in TABLE_TYPES:
                node = self._create_table(conn, parent, name, attributes, ypath.text, type)
            else:
                node = self._new_node(conn, parent, name, type, attributes,
                                      value=None if type == MAP_NODE else attributes.pop("value", None))
            return node.id

    def _validate_table_attributes(self, attrs: dict[str, Any], path: str, replicated: bool = False) -> None:
        if not _flag(attrs.get("dynamic")):
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
        for name in ("min_data_ttl", "min_replication_log_ttl"):
            ttl = attrs.get(name, 0)
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
                raise YtError(f"Cannot create table {path}: {name} must be a non-negative number of "
                              "milliseconds", code=ErrorCode.INVALID_PARAMETER)
        upstream = attrs.get("upstream_replica_id")
        if upstream is not None and not isinstance(upstream, str):
            raise YtError(f"Cannot create table {path}: upstream_replica_id must be a replica id string",
                          code=ErrorCode.INVALID_PARAMETER)
        if replicated:
            if attrs.get("atomicity", "full") != "full":
                raise YtError(f"Cannot create replicated table {path}: atomicity must be full",
                              code=ErrorCode.INVALID_PARAMETER)
            if upstream:
                raise YtError(f"Cannot create replicated table {path} with upstream_replica_id",
                              code=ErrorCode.INVALID_PARAMETER)
            validate_replicated_table_options(attrs.get("replicated_table_options"), path)
            validate_throttler(attrs.get("replication_throttler"), path)

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
        node = self._new_node(conn, parent, name, node_type, stored)
        node.table = self._make_table(node)
        node.table.has_read_locks = False
        node.table.sql.create(conn)
        if not schema.is_sorted or node.table.replicated:
            for i in range(node.table.tablet_count):
                conn.execute(tablets_table.insert().values(table_id=node.id, tablet_index=i, row_count=0,
                                                           trimmed_row_count=0))
                node.table.tablet_rows[i] = [0, 0]
        return node

    def _remove_node(self, conn: sa.Connection, node: Node, recursive: bool) -> None:
        if node.id == ROOT_ID:
            raise YtError("Cannot remove the root node", code=ErrorCode.INVALID_PARAMETER)
        if node is self._clusters_node() or (node.parent is not None and node.parent.id == ROOT_ID
                                              and node.name == "sys"):
            raise YtError(f"Cannot remove {node.path}: it is a system node", code=ErrorCode.INVALID_PARAMETER)
        if node.type == "table_replica":
            self.replication.remove_replica(conn, node.id)
            self.cypress.delete(conn, self.cypress.detach(node))
            return
        if node.type == "table_collocation":
            self._drop_collocation(conn, node)
            return
        if node.children and not recursive:
            raise YtError(f"Cannot remove non-empty composite node {node.path} (use recursive=%true)",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        subtree: list[Node] = []

        def walk(n: Node) -> None:
            subtree.append(n)
            for c in n.children.values():
                walk(c)

        walk(node)
        for n in subtree:
            if n.table is not None and n.table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot remove table {n.path}: it is {n.table.state.value}; "
                                       "unmount it first", attributes={"path": n.path})
        for n in subtree:
            if n.table is not None:
                for replica in self.replication.replicas_of(n.id):
                    self.replication.remove_replica(conn, replica.id)
                    self.cypress.delete(conn, self.cypress.detach(replica.node))
                collocation = self._collocation_of(n)
                if collocation is not None:
                    self._leave_collocation(conn, collocation, n)
                n.table.sql.drop(conn)
                conn.execute(tablets_table.delete().where(tablets_table.c.table_id == n.id))
        removed = self.cypress.detach(node)
        self.cypress.delete(conn, removed)

    def remove(self, path: Any, recursive: bool = False, force: bool = False) -> None:
        ypath = parse_ypath(path)
        with self.storage.write() as conn:
            node = self.cypress.resolve(ypath, missing_ok=force)
            if node is None:
                return
            if ypath.attribute_path is not None:
                if ypath.attribute_path == ("replication_collocation_id",) and node.table is not None:
                    collocation = self._collocation_of(node)
                    if collocation is None and not force:
                        raise ResolveError(f"Table {node.path} is in no collocation", attributes={"path": node.path})
                    if collocation is not None:
                        self._leave_collocation(conn, collocation, node)
                    return
                self._remove_attribute(conn, node, ypath, force)
                return
            directory = self._under_directory(node)
            self._remove_node(conn, node, recursive)
        if directory:
            self._refresh_directory()

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
        if not isinstance(container, dict) or attr[-1] not in container:
            if force:
                return
            raise ResolveError(f"Attribute {'/'.join(attr)!r} of {node.path} is not found",
                               attributes={"path": ypath.text})
        del container[attr[-1]]
        self.cypress.save(conn, node)

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
            self._get_attribute(node, ypath.attribute_path)
        except YtError:
            return False
        return True

    def list(self, path: Any, attributes: list[str] | None = None) -> list[Any]:
        node, ypath = self._resolve(path)
        if ypath.attribute_path is not None:
            value = self._get_attribute(node, ypath.attribute_path)
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
                out.append(yson_util.with_attributes(name, self._pick_attributes(child, attributes)))
            else:
                out.append(name)
        return out

    def get(self, path: Any, attributes: list[str] | None = None) -> Any:
        node, ypath = self._resolve(path)
        if ypath.attribute_path is not None:
            return self._get_attribute(node, ypath.attribute_path)
        value = self._node_value(node, attributes)
        if self._under_directory(node):
            # tokens of other clusters are secrets: never returned in clear
            value = MASKED_TOKEN if node.name == "token" and value else mask_tokens(value)
        return value

    def _node_value(self, node: Node, attributes: list[str] | None) -> Any:
        if node.type == MAP_NODE:
            value: Any = {name: self._node_value(c, attributes) for name, c in node.children.items()}
        elif node.type in TABLE_TYPES:
            value = None
        else:
            value = node.value
        if attributes:
            return yson_util.with_attributes(value if value is not None else yson_util.yson.YsonEntity(),
                                             self._pick_attributes(node, attributes))
        return value

    def _pick_attributes(self, node: Node, names: list[str]) -> dict[str, Any]:
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
            if table.sorted:
                attrs["pivot_keys"] = table.pivot_keys
            else:
                attrs.pop("pivot_keys", None)
            attrs["tablets"] = self._tablets_attribute(node)
            if table.upstream_replica_id:
                attrs["upstream_replica_id"] = table.upstream_replica_id
            if table.replicated:
                attrs["replicas"] = self.replication.replicas_attribute(node.id)
                options = dict(node.attributes.get("replicated_table_options") or {})
                options.setdefault("enable_replicated_table_tracker", False)
                attrs["replicated_table_options"] = options
                attrs.setdefault("min_replication_log_ttl", DEFAULT_MIN_REPLICATION_LOG_TTL_MS)
            collocation = self._collocation_of(node)
            if collocation is not None:
                attrs["replication_collocation_id"] = collocation.id
                attrs["replication_collocation_table_paths"] = [
                    self.cypress.by_id[i].path for i in collocation.attributes.get("table_ids", [])
                    if i in self.cypress.by_id]
        return attrs

    def _tablets_attribute(self, node: Node) -> list[dict[str, Any]]:
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

    def _get_attribute(self, node: Node, attr_path: tuple[str, ...]) -> Any:
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

    def set(self, path: Any, value: Any, recursive: bool = False, force: bool = False) -> None:
        ypath = parse_ypath(path)
        value = yson_util.to_python(value)
        if ypath.attribute_path is None and ypath.start is None and ypath.segments[:2] == ("sys", "clusters"):
            self._set_directory(ypath.segments[2:], value)
            return
        with self.storage.write() as conn:
            if ypath.attribute_path is not None:
                node = self.cypress.resolve(ypath)
                assert node is not None
                self._set_attribute(conn, node, ypath.attribute_path, value)
                return
            node = self.cypress.resolve(ypath, missing_ok=True)
            if node is not None:
                self._replace_node_value(conn, node, value)
                return
            parent, name, missing = self.cypress.resolve_parent(ypath, recursive=recursive)
            for seg in missing:
                parent = self._new_node(conn, parent, seg, MAP_NODE, {})
            self._build_value_node(conn, parent, name, value)

    def _set_directory(self, relative: tuple[str, ...], value: Any) -> None:
        """Change //sys/clusters as a whole: validated first, masked tokens keep their secret."""
        clusters = self._clusters_node()
        assert clusters is not None
        current = self._node_value(clusters, None) or {}
        updated = copy.deepcopy(current)
        if not relative:
            updated = value
        else:
            target = updated
            for key in relative[:-1]:
                if not isinstance(target, dict) or key not in target:
                    raise ResolveError(f"Error resolving path {CLUSTERS_PATH}/{'/'.join(relative)}: "
                                       f"{key!r} does not exist")
                target = target[key]
            if not isinstance(target, dict):
                raise YtError(f"Cannot set {CLUSTERS_PATH}/{'/'.join(relative)}", code=ErrorCode.INVALID_PARAMETER)
            target[relative[-1]] = value
        if isinstance(updated, dict):
            for name, entry in updated.items():
                if isinstance(entry, dict) and entry.get("token") == MASKED_TOKEN:
                    entry["token"] = (current.get(name) or {}).get("token", "")
        parse_directory(updated)
        with self.storage.write() as conn:
            self._replace_node_value(conn, clusters, updated)
        self._refresh_directory()

    def _build_value_node(self, conn: sa.Connection, parent: Node, name: str, value: Any) -> Node:
        if isinstance(value, dict):
            node = self._new_node(conn, parent, name, MAP_NODE, {})
            for k, v in value.items():
                self._build_value_node(conn, node, k, v)
            return node
        node_type = "document" if value is None else SCALAR_TYPES.get(type(value), "document")
        return self._new_node(conn, parent, name, node_type, {}, value=value)

    def _replace_node_value(self, conn: sa.Connection, node: Node, value: Any) -> None:
        if node.type in TABLE_TYPES:
            raise YtError(f"Cannot set the value of table {node.path}; write rows with insert_rows",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        if node.type == MAP_NODE:
            if not isinstance(value, dict):
                raise YtError(f"Cannot set a {yson_util.type_name(value)} value to map node {node.path}",
                              code=ErrorCode.INVALID_PARAMETER)
            for child in list(node.children.values()):
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
            current = self._collocation_of(node)
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
            table.atomicity = value
        if table is not None and name == "min_data_ttl" and (
                len(attr_path) != 1 or isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise YtError("Attribute \"min_data_ttl\" must be a non-negative number of milliseconds",
                          code=ErrorCode.INVALID_PARAMETER)
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
        container: Any = node.attributes
        for key in attr_path[:-1]:
            container = container.setdefault(key, {})
        container[attr_path[-1]] = value
        self.cypress.save(conn, node)

    # -- collocations --------------------------------------------------------------------------------

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
            table, table_path, node = self._table(path)
            if not table.replicated:
                raise YtError(f"Cannot collocate {table_path}: it is not a replicated_table",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
            if self._collocation_of(node) is not None:
                raise YtError(f"Table {table_path} already belongs to collocation {self._collocation_of(node).id}",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
            nodes.append(node)
        stored = {k: v for k, v in attrs.items() if k not in ("table_paths", "table_ids")}
        with self.storage.write() as conn:
            collocation = Node(id=make_object_id(OBJECT_TYPES["table_collocation"]), type="table_collocation",
                               name=None, parent=None, attributes={**stored, "table_ids": [n.id for n in nodes]})
            self.cypress.attach(collocation)
            self.cypress.save(conn, collocation)
        return collocation.id

    def _collocation_of(self, table_node: Node) -> Node | None:
        for node in self.cypress.by_id.values():
            if node.type == "table_collocation" and table_node.id in node.attributes.get("table_ids", []):
                return node
        return None

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
        self.cypress.delete(conn, self.cypress.detach(collocation))

    # -- tablet state ----------------------------------------------------------------------------

    def _transition(self, path: Any, allowed: tuple[TabletState, ...], target: TabletState, verb: str) -> None:
        """Move a table to ``target``; the change is complete when the command returns, so the
        transient states of YT (mounting, freezing...) are never observed here."""
        table, table_path, node = self._table(path)
        with self.storage.write() as conn:
            if table.state == target:
                return
            if table.state not in allowed:
                raise TabletStateError(f"Cannot {verb} table {table_path}: tablet state is {table.state.value!r}",
                                       attributes={"path": table_path, "tablet_state": table.state.value})
            table.state = target
            self._save_table_state(conn, node)

    def mount_table(self, path: Any, freeze: bool = False) -> None:
        target = TabletState.FROZEN if freeze else TabletState.MOUNTED
        self._transition(path, (TabletState.UNMOUNTED,), target, "mount")

    def unmount_table(self, path: Any, force: bool = False) -> None:
        self._transition(path, (TabletState.MOUNTED, TabletState.FROZEN), TabletState.UNMOUNTED, "unmount")

    def remount_table(self, path: Any) -> None:
        table, table_path, _ = self._table(path)
        if table.state not in (TabletState.MOUNTED, TabletState.FROZEN):
            raise TabletStateError(f"Cannot remount table {table_path}: it is not mounted")

    def freeze_table(self, path: Any) -> None:
        self._transition(path, (TabletState.MOUNTED,), TabletState.FROZEN, "freeze")

    def unfreeze_table(self, path: Any) -> None:
        self._transition(path, (TabletState.FROZEN,), TabletState.MOUNTED, "unfreeze")

    def reshard_table(self, path: Any, pivot_keys: Any = None, tablet_count: Any = None) -> None:
        table, table_path, node = self._table(path)
        if (pivot_keys is None) == (tablet_count is None):
            raise YtError(f"Cannot reshard table {table_path}: give exactly one of pivot_keys and tablet_count",
                          code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write() as conn:
            if table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot reshard table {table_path}: table must be unmounted "
                                       f"(tablet state is {table.state.value!r})", attributes={"path": table_path})
            if pivot_keys is not None:
                if not table.sorted:
                    raise YtError(f"Cannot reshard ordered table {table_path} by pivot keys; use tablet_count",
                                  code=ErrorCode.INVALID_PARAMETER)
                pivots = parse_pivot_keys(pivot_keys, table.schema, table_path)
                table.pivot_keys = pivots
                node.attributes["pivot_keys"] = pivots
            else:
                count = yson_util.to_python(tablet_count)
                if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
                    raise YtError(f"Cannot reshard table {table_path}: tablet_count must be in [1, 10000]",
                                  code=ErrorCode.INVALID_PARAMETER)
                if table.sorted:
                    raise YtError(f"Cannot reshard sorted table {table_path} by tablet_count: give pivot_keys",
                                  code=ErrorCode.INVALID_PARAMETER)
                for i in range(count, table.tablet_count):
                    rows, trimmed = table.tablet_rows.get(i, [0, 0])
                    if rows > trimmed:
                        raise YtError(f"Cannot reshard table {table_path} to {count} tablets: tablet {i} "
                                      "still holds rows", code=ErrorCode.INVALID_PARAMETER)
                for i in range(count, table.tablet_count):
                    conn.execute(tablets_table.delete().where(tablets_table.c.table_id == node.id,
                                                              tablets_table.c.tablet_index == i))
                    table.tablet_rows.pop(i, None)
                for i in range(table.tablet_count, count):
                    conn.execute(tablets_table.insert().values(table_id=node.id, tablet_index=i, row_count=0,
                                                               trimmed_row_count=0))
                    table.tablet_rows[i] = [0, 0]
                table.tablet_count_ordered = count
                node.attributes[f"{INTERNAL_PREFIX}tablet_count"] = count
            self.cypress.save(conn, node)

    # -- timestamps and transactions --------------------------------------------------------------

    def generate_timestamp(self) -> int:
        return self.timestamps.generate()

    def start_transaction(self, type: str = "tablet", atomicity: str | None = None,
                          durability: str | None = None, timeout: int | None = None,
                          start_timestamp: int | None = None) -> str:
        if type != "tablet":
            raise YtError(f"Transaction type {type!r} is not supported: reptables serves tablet "
                          "transactions only: use yt.wrapper.Transaction(type=\"tablet\") or "
                          "`yt execute start_transaction '{type=tablet}'`", code=ErrorCode.INVALID_PARAMETER)
        try:
            atom = Atomicity(atomicity or "full")
            dur = Durability(durability or "sync")
        except ValueError:
            raise YtError(f"Invalid atomicity {atomicity!r} or durability {durability!r}",
                          code=ErrorCode.INVALID_PARAMETER) from None
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
            raise YtError(f"Invalid transaction timeout {timeout!r}: expected milliseconds > 0",
                          code=ErrorCode.INVALID_PARAMETER)
        tx = self.transactions.start(atom, dur, timeout / 1000.0 if timeout else None, start_timestamp)
        return tx.id

    def ping_transaction(self, transaction_id: str) -> None:
        self.transactions.ping(transaction_id)

    def commit_transaction(self, transaction_id: str) -> int:
        tx = self.transactions.get(transaction_id)
        return self.transactions.commit(tx)

    def abort_transaction(self, transaction_id: str) -> None:
        self.transactions.abort(transaction_id)

    def _tx_for_write(self, transaction_id: str | None, atomicity: str | None,
                      durability: str | None) -> tuple[TabletTransaction, bool]:
        if transaction_id:
            tx = self.transactions.get(transaction_id)
            tx.check_active()
            return tx, False
        tx_id = self.start_transaction("tablet", atomicity, durability)
        return self.transactions.get(tx_id), True

    def _run_write(self, tx: TabletTransaction, implicit: bool, fill: Any) -> None:
        try:
            with tx.lock:
                tx.check_active()
                fill()
        except BaseException:
            if implicit:
                self.transactions.abort(tx.id)
            raise
        if implicit:
            self.transactions.commit(tx)

    # -- rows ------------------------------------------------------------------------------------

    def insert_rows(self, path: Any, rows: list[Any], update: bool = False, transaction_id: str | None = None,
                    atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool = True, input_bytes: int | None = None) -> None:
        """``input_bytes`` is the size of the request body when known: no row of a smaller body can
        reach the row weight limit, so the per-row weight check is skipped."""
        table, table_path, _ = self._table(path)
        self._check_direct_write(table, table_path)
        table.check_writable(table_path)
        # an ordered table's rows without $tablet_index all go to one randomly chosen tablet, so a
        # batch stays one participant and keeps its order
        batch_tablet = None if table.sorted else random.randrange(table.tablet_count)
        schema = table.schema
        sorted_ = table.sorted
        single_tablet = sorted_ and len(table.pivot_keys) == 1
        checked = validate_rows(schema, rows, table_path, update=update, keys_not_null=sorted_)
        if input_bytes is None or input_bytes > MAX_ROW_WEIGHT:
            for row in checked:
                if row_weight(row) > MAX_ROW_WEIGHT:
                    raise YtError(f"Row of table {table_path} is too large: its weight exceeds "
                                  f"{MAX_ROW_WEIGHT} bytes", code=ErrorCode.ROW_WEIGHT_LIMIT_EXCEEDED)
        full_mask = schema.full_lock_mask if sorted_ else 1
        validated: list[tuple[int, RowWrite]]
        if single_tablet and not update:
            # the hot path: one tablet, whole-row writes
            write = WriteKind.WRITE
            validated = [(0, RowWrite(write, row, full_mask)) for row in checked]
        else:
            validated = []
            for raw, row in zip(rows, checked, strict=True):
                if single_tablet:
                    tablet = 0
                else:
                    explicit = yson_util.to_python(raw.get("$tablet_index")) if isinstance(raw, dict) else None
                    tablet = table.tablet_for_row(row, batch_tablet if explicit is None else explicit)
                mask = schema.lock_mask(list(row)) if update and sorted_ else full_mask
                validated.append((tablet, RowWrite(WriteKind.WRITE, row, mask, update=update)))
        tx, implicit = self._tx_for_write(transaction_id, atomicity, durability)

        def fill() -> None:
            tx.require_sync_replica[table.table_id] = require_sync_replica
            tx.add_many(table, table_path, validated)

        self._run_write(tx, implicit, fill)

    @staticmethod
    def _check_direct_write(table: DynamicTable, path: str) -> None:
        if table.upstream_replica_id:
            raise YtError(f"Table {path} is a replica table (upstream_replica_id {table.upstream_replica_id}): "
                          "direct writes are refused; write to its replicated table on the meta-cluster",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH,
                          attributes={"path": path, "upstream_replica_id": table.upstream_replica_id})

    def delete_rows(self, path: Any, keys: list[Any], transaction_id: str | None = None,
                    atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool = True) -> None:
        table, table_path, _ = self._table(path)
        if not table.sorted:
            raise YtError(f"Cannot delete rows from ordered table {table_path}: use trim_rows",
                          code=ErrorCode.TABLE_MUST_BE_SORTED, attributes={"path": table_path})
        self._check_direct_write(table, table_path)
        table.check_writable(table_path)
        validated = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            validated.append((table.tablet_for_row(key_row), RowWrite(WriteKind.DELETE, key_row, 1)))
        tx, implicit = self._tx_for_write(transaction_id, atomicity, durability)

        def fill() -> None:
            tx.require_sync_replica[table.table_id] = require_sync_replica
            for tablet, w in validated:
                tx.add(table, table_path, tablet, w)

        self._run_write(tx, implicit, fill)

    def lock_rows(self, path: Any, keys: list[Any], transaction_id: str | None = None,
                  locks: list[str] | None = None, lock_type: str = "shared_strong") -> None:
        if not transaction_id:
            raise YtError("lock_rows requires a tablet transaction (transaction_id)", code=ErrorCode.INVALID_PARAMETER)
        table, table_path, _ = self._table(path)
        if not table.sorted:
            raise YtError(f"Cannot lock rows of ordered table {table_path}", code=ErrorCode.TABLE_MUST_BE_SORTED)
        if lock_type not in ("shared_weak", "shared_strong", "exclusive"):
            raise YtError(f"Invalid lock_type {lock_type!r}: expected shared_weak, shared_strong or exclusive",
                          code=ErrorCode.INVALID_PARAMETER)
        groups = table.schema.lock_groups
        mask = 0
        for name in locks or []:
            if name not in groups[1:]:
                raise YtError(f"Lock {name!r} is not defined in the schema of table {table_path}",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path, "lock": name})
            mask |= 1 << groups.index(name)
        mask = mask or 1
        validated = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            validated.append((table.tablet_for_row(key_row), RowWrite(
                WriteKind.LOCK, key_row, mask, shared=lock_type != "exclusive",
                strong=lock_type == "shared_strong")))
        tx, _ = self._tx_for_write(transaction_id, None, None)

        def fill() -> None:
            for tablet, w in validated:
                tx.add(table, table_path, tablet, w)

        self._run_write(tx, False, fill)

    def trim_rows(self, path: Any, tablet_index: int, trimmed_row_count: int) -> None:
        table, table_path, _ = self._table(path)
        for name, value in (("tablet_index", tablet_index), ("trimmed_row_count", trimmed_row_count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise YtError(f"Invalid {name} {value!r}: expected a non-negative integer",
                              code=ErrorCode.INVALID_PARAMETER)
        table.check_readable(table_path)
        with self.storage.write() as conn:
            table.trim_rows(conn, tablet_index, trimmed_row_count, table_path)

    def _snapshot_timestamp(self, timestamp: Any, transaction_id: str | None) -> int | None:
        if transaction_id:
            tx = self.transactions.get(transaction_id)
            tx.check_active()
            if timestamp is None and tx.atomicity is Atomicity.FULL:
                self.transactions.wait_visible(tx.start_timestamp)
                return tx.start_timestamp
        return self._read_timestamp(timestamp)

    def lookup_rows(self, path: Any, keys: list[Any], column_names: list[str] | None = None,
                    timestamp: Any = None, keep_missing_rows: bool = False,
                    transaction_id: str | None = None) -> list[dict[str, Any] | None]:
        table, table_path, _ = self._table(path)
        if not table.sorted:
            raise YtError(f"Cannot lookup rows in ordered table {table_path}: use select_rows",
                          code=ErrorCode.TABLE_MUST_BE_SORTED, attributes={"path": table_path})
        table.check_readable(table_path)
        if column_names is not None:
            for name in column_names:
                if name not in table.schema.by_name:
                    raise YtError(f"Column {name!r} is not found in the schema of table {table_path}",
                                  code=ErrorCode.COLUMN_NOT_FOUND, attributes={"column": name, "path": table_path})
        ts = self._snapshot_timestamp(timestamp, transaction_id)
        if ts is None and not table.replicated:
            self.transactions.wait_prepared_writes(table.table_id)
        key_tuples = []
        key_rows = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            key_tuples.append(table.key_of(key_row))
            key_rows.append(key_row)
        if table.replicated:
            replica = self.replication.in_sync_read_replica(table, table_path)
            return self._from_replica(replica, lambda c: c.lookup_rows(
                replica.replica_path, key_rows, column_names=column_names, timestamp=ts,
                keep_missing_rows=keep_missing_rows))
        with self.storage.read() as conn:
            found = table.lookup(conn, key_tuples, ts)
        self.decode_any_columns(table, found)
        out: list[dict[str, Any] | None] = []
        for row in found:
            if row is None:
                if keep_missing_rows:
                    out.append(None)
                continue
            if column_names is not None:
                row = {n: row[n] for n in column_names}
            out.append(row)
        return out

    def select_rows(self, query: str, timestamp: Any = None, transaction_id: str | None = None,
                    input_row_limit: int | None = None, output_row_limit: int | None = None,
                    fail_on_incomplete_result: bool = True) -> list[dict[str, Any]]:
        if not isinstance(query, str):
            raise YtError("Parameter \"query\" must be a string", code=ErrorCode.INVALID_PARAMETER)
        parsed = parse_query(query)
        table, table_path, _ = self._table(parsed.table_path)
        table.check_readable(table_path)
        ts = self._snapshot_timestamp(timestamp, transaction_id)
        if table.replicated:
            replica = self.replication.in_sync_read_replica(table, table_path)
            rewritten = _retarget_query(query, parsed.table_path, replica.replica_path)
            return self._from_replica(replica, lambda c: c.select_rows(
                rewritten, timestamp=ts, output_row_limit=output_row_limit))
        if ts is None:
            self.transactions.wait_prepared_writes(table.table_id)
        compiled = compile_query(parsed, table.query_source(ts))
        limit = output_row_limit or DEFAULT_OUTPUT_ROW_LIMIT
        statement = compiled.statement
        if statement._limit_clause is None:
            statement = statement.limit(limit + 1)
        try:
            with self.storage.read() as conn:
                result = conn.execute(statement)
                rows = [dict(zip(compiled.output_columns, r, strict=True)) for r in result.fetchmany(limit + 1)]
        except sa.exc.DBAPIError as exc:
            if _is_storage_outage(exc):
                raise
            # the storage refused to evaluate this query (overflow, expression too deep...)
            raise YtError(f"Query cannot be evaluated: {exc.orig}", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"query": query}) from None
        if len(rows) > limit:
            if fail_on_incomplete_result:
                raise YtError(f"Query result exceeds the output row limit of {limit} rows; add a limit or "
                              "raise output_row_limit", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"output_row_limit": limit})
            rows = rows[:limit]
        any_columns = {n for n, t in compiled.output_types.items() if t == "any"}
        if any_columns:
            for row in rows:
                for n in any_columns:
                    if row.get(n) is not None:
                        row[n] = yson_util.loads_text(row[n])
        return rows

    def _from_replica(self, replica: Any, read: Any) -> Any:
        """Serve a read of a replicated table from its in-sync replica (seed 002, "Reading data")."""
        try:
            return read(self.peers.public_client(replica.cluster_name))
        except YtError as exc:
            raise YtError(f"Cannot read replicated table {replica.table_path} from its sync replica "
                          f"{replica.cluster_name}:{replica.replica_path}: {exc.message}", code=exc.code,
                          attributes={"replica_id": replica.id}, inner_errors=[exc]) from None

    def decode_any_columns(self, table: DynamicTable, rows: list[dict[str, Any] | None]) -> None:
        """``any`` values are stored as YSON text; turn them back into structures for output."""
        any_cols = [c.name for c in table.schema.columns if c.type.value == "any"]
        if not any_cols:
            return
        for row in rows:
            if row is None:
                continue
            for n in any_cols:
                if row.get(n) is not None:
                    row[n] = yson_util.loads_text(row[n])

    def table_for_path(self, path: Any) -> DynamicTable:
        return self._table(path)[0]

    # -- replication commands --------------------------------------------------------------------

    def alter_table(self, path: Any, upstream_replica_id: Any = None, schema: Any = None) -> None:
        table, table_path, node = self._table(path)
        if schema is not None:
            raise YtError(f"Cannot alter the schema of {table_path}: schema changes are not supported yet",
                          code=ErrorCode.INVALID_PARAMETER)
        if upstream_replica_id is None:
            return
        if not isinstance(upstream_replica_id, str):
            raise YtError("upstream_replica_id must be a replica id string", code=ErrorCode.INVALID_PARAMETER)
        if table.replicated:
            raise YtError(f"Cannot set upstream_replica_id of replicated table {table_path}",
                          code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write() as conn:
            if table.state != TabletState.UNMOUNTED:
                raise TabletStateError(f"Cannot alter table {table_path}: table must be unmounted",
                                       attributes={"path": table_path})
            value = None if upstream_replica_id in ("", "0-0-0-0") else upstream_replica_id
            table.upstream_replica_id = value
            if value is None:
                node.attributes.pop("upstream_replica_id", None)
            else:
                node.attributes["upstream_replica_id"] = value
            self.cypress.save(conn, node)

    def alter_table_replica(self, replica_id: str, enabled: bool | None = None, mode: str | None = None) -> None:
        self.replication.alter_replica(replica_id, enabled, mode)

    def get_in_sync_replicas(self, path: Any, timestamp: Any, keys: list[Any] | None = None) -> list[str]:
        table, table_path, _ = self._table(path)
        if not table.replicated:
            raise YtError(f"Table {table_path} is not replicated", code=ErrorCode.INVALID_PARAMETER)
        if timestamp is None:
            raise YtError("get_in_sync_replicas requires a timestamp", code=ErrorCode.INVALID_PARAMETER)
        ts = self._read_timestamp(timestamp)
        if ts is None:
            ts = self.timestamps.generate()
        for raw in keys or []:
            validate_row(table.schema, raw, table_path, key_only=True)
        return self.replication.in_sync_replicas(table, ts)
