"""The node's tables: from a path (or an id) to a table, and a Cypress node to a table object.

Every service of the node (``cypress_service``, ``tablet_service``, ``row_service``,
``stream_service``, XDCR) starts a command the same way: resolve a path, insist it names a dynamic
table, and get its ``DynamicTable``. That, the making of a ``DynamicTable`` from its Cypress node
(at start-up and on ``create``), and the checks every read shares (a read timestamp) live here, in
one object the composition root (``cluster.py``) builds and hands to each service: a service never
reaches another service for them.

Cypress nodes and table objects change only under the storage writer lock; resolving takes no lock
(the tree is read as it stands, as every command did before).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..config import EngineConfig
from ..cypress import INTERNAL_PREFIX, OBJECT_TYPES, Cypress, Node, YPath, parse_ypath
from ..errors import ErrorCode, YtError
from ..query import ParsedQuery
from ..replication import TRIMMED_TIMESTAMP_ATTRIBUTE
from ..schema import TableSchema
from ..storage import Storage, UserTables, on_rollback
from ..tablets import DynamicTable, TabletState, changes
from ..tablets.changes import ChangeFeed
from ..tablets.xdcr import VersionClock
from ..timestamps import (
    ASYNC_LAST_COMMITTED_TIMESTAMP,
    COUNTER_BITS,
    MAX_TIMESTAMP,
    SYNC_LAST_COMMITTED_TIMESTAMP,
    TimestampProvider,
    unix_to_timestamp,
)
from ..transactions import TransactionManager, make_object_id

log = logging.getLogger("reptables.engine")

#: the SQL layout of user tables (2: older versions only in <table>_versions, the latest in the table)
STORAGE_FORMAT = "2"
#: YT's default min_data_ttl: versions younger than this are kept for reads at a timestamp
DEFAULT_MIN_DATA_TTL_MS = 30 * 60 * 1000
#: a sorted table's node attribute holding ``DynamicTable.compacted_until``
COMPACTED_UNTIL_ATTRIBUTE = "_rt_compacted_until"
#: a table's node attribute holding ``DynamicTable.changes_trimmed`` (change streams)
CHANGES_TRIMMED_ATTRIBUTE = "_rt_changes_trimmed"
#: a table's node attribute holding ``DynamicTable.stream_start`` (an XDCR table's log switched on)
STREAM_START_ATTRIBUTE = "_rt_stream_start"
#: a table's node attribute holding ``DynamicTable.layout_revision`` (how many reshards it had)
LAYOUT_REVISION_ATTRIBUTE = "_rt_layout_revision"
#: the attribute that switches a sorted or ordered table's change log on (``switch_change_log``)
CHANGE_LOG_ATTRIBUTE = "enable_change_log"
#: the default ``change_retention`` of sorted and ordered tables (ms): changes are streamed from this far back
DEFAULT_CHANGE_RETENTION_MS = 60 * 60 * 1000
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


def retarget_query(query: ParsedQuery, new_paths: dict[str, str]) -> str:
    """The text of ``query`` with each table path written in it replaced by ``new_paths[path]``.

    Used to send a query over replicated tables to the cluster of their replicas. Only the table
    tokens of FROM and JOIN are rewritten (found by their position in the parsed text), so a string
    literal or an alias that happens to spell a path is left alone.
    """
    text = query.text
    pieces: list[str] = []
    last = 0
    for table in sorted(query.tables, key=lambda t: t.span.start):
        if table.path not in new_paths:
            continue
        if table.span.start < last or text[table.span.start:table.span.end] == "":
            raise YtError(f"Cannot redirect query to a replica: table {table.path} is not written in it",
                          code=ErrorCode.INVALID_PARAMETER)
        new = new_paths[table.path]
        token = f"[{new}]" if "]" not in new else "`" + new.replace("\\", "\\\\").replace("`", "\\`") + "`"
        pieces += [text[last:table.span.start], token]
        last = table.span.end
    return "".join(pieces) + text[last:]


def is_storage_outage(exc: sa.exc.DBAPIError) -> bool:
    """Errors that mean "the database is busy or gone", as opposed to "this query is invalid"."""
    text = str(exc.orig).lower()
    return any(s in text for s in ("database is locked", "disk i/o error", "unable to open", "connection"))


def flag(value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.lower() in ("true", "1", "yes")
    return bool(value)


def table_by_id(cypress: Cypress, table_id: str) -> tuple[DynamicTable, str] | None:
    """The table with ``table_id`` and its path (the transaction manager's ``resolve_table``)."""
    node = cypress.by_id.get(table_id)
    if node is None or node.table is None:
        return None
    return node.table, node.path


class Tables:
    """Paths and ids to tables, Cypress nodes to table objects, and the checks reads share."""

    def __init__(self, name: str, config: EngineConfig, storage: Storage, cypress: Cypress,
                 timestamps: TimestampProvider, transactions: TransactionManager, change_feed: ChangeFeed,
                 xdcr_clock: VersionClock) -> None:
        self.name = name
        self.config = config
        self.storage = storage
        self.cypress = cypress
        self.timestamps = timestamps
        self.transactions = transactions
        self.change_feed = change_feed
        self.xdcr_clock = xdcr_clock
        #: this cluster's XDCR id (``--cluster-id``, kept in the data directory), None without one;
        #: set once at start-up, before any table is made
        self.cluster_id: int | None = None

    # -- making table objects ------------------------------------------------------------------------

    def make_table(self, node: Node, new: bool = False) -> DynamicTable:
        """The ``DynamicTable`` of a table's Cypress node (at start-up, and on ``create`` with ``new``)."""
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
            layout_revision=int(attrs.get(LAYOUT_REVISION_ATTRIBUTE, 0)),
            state=TabletState(attrs.get(f"{INTERNAL_PREFIX}tablet_state", "unmounted")),
            atomicity=attrs.get("atomicity", "full"),
            trimmed_timestamp=int(attrs.get(TRIMMED_TIMESTAMP_ATTRIBUTE, 0)),
            compacted_until=int(attrs.get(COMPACTED_UNTIL_ATTRIBUTE, 0)),
            pinned_by=self.transactions.oldest_active_start_timestamp,
            config=self.config,
        )
        # every commit from now on is remembered for conflict checks; earlier ones are in SQL
        table.recent_floor = self.timestamps.generate()
        # change streams (stream_service.py): where the log goes on, what was trimmed, who waits
        trimmed = attrs.get(CHANGES_TRIMMED_ATTRIBUTE)
        if isinstance(trimmed, list) and len(trimmed) == 2:
            table.changes_trimmed = (int(trimmed[0]), int(trimmed[1]))
        if new:
            # nothing applied, no version kept: no compaction pass until a commit (a thousand tables
            # created at once would otherwise each get a write transaction from the next pass), and
            # nothing logged: no read of the log (on SQLite it would be a reader connection's first
            # statement after this create's DDL, which re-parses the whole schema - 20 ms at 1,000 tables)
            table.compaction_due = False
        elif not replicated:
            with self.storage.read() as conn:
                table.change_seq = changes.next_seq(conn, node.id)
            table.note_start(table.recent_floor)
        table.on_change = self.change_feed.notify
        table.xdcr_clock = self.xdcr_clock
        if flag(attrs.get("xdcr")) and table.sorted and not replicated:
            table.xdcr_cluster_id = self.cluster_id
        # an XDCR table ships its own changes from its log, and logs every change unless it was told not
        # to (``@enable_change_log`` %false: then only its own, which is all its shippers read)
        explicit = attrs.get(CHANGE_LOG_ATTRIBUTE)
        table.change_log = not replicated and (flag(explicit) if explicit is not None else flag(attrs.get("xdcr")))
        start = attrs.get(STREAM_START_ATTRIBUTE)
        if isinstance(start, list) and len(start) == 2:
            table.stream_start = (int(start[0]), int(start[1]))
        return table

    def switch_change_log(self, conn: sa.Connection, node: Node, on: bool) -> None:
        """Switch a sorted or ordered table's change log on or off (``@enable_change_log``), inside
        the caller's write transaction (under Storage.write_lock, so no commit applies meanwhile).

        On: commits from now on log their changes, and a stream may start only after every
        timestamp this engine has given or applied so far (``changes_trimmed``): a commit applied
        later has a later timestamp, or one a stream from that start skips as before it - never a
        gap after the start. Off: the log is dropped (the callers refuse while a consumer is
        registered).

        An XDCR table's log holds its own changes whatever this says (its shippers read them from
        it): off keeps them and stops logging the changes it receives; on moves the start of its
        streams (``stream_start``), not ``changes_trimmed``, which tells its shippers what the log
        no longer holds."""
        table = node.table
        assert table is not None and not table.replicated
        before = (table.change_log, table.changes_trimmed, table.stream_start)
        xdcr = table.xdcr_cluster_id is not None
        if on and not table.change_log:
            start = changes.heartbeat_position(max(self.timestamps.last, table.applied_ts))
            if xdcr:
                table.stream_start = max(table.stream_start, start)
                node.attributes[STREAM_START_ATTRIBUTE] = list(table.stream_start)
            else:
                table.changes_trimmed = max(table.changes_trimmed, start)
                node.attributes[CHANGES_TRIMMED_ATTRIBUTE] = list(table.changes_trimmed)
        elif not on and table.change_log and not xdcr:
            changes.drop_changes(conn, table.table_id)
        table.change_log = on
        changes.drop_tail(table)  # (a pull makes it again, from now on)
        node.attributes[CHANGE_LOG_ATTRIBUTE] = on

        def undo() -> None:
            table.change_log, table.changes_trimmed, table.stream_start = before

        on_rollback(conn, undo)
        self.cypress.save(conn, node)

    def new_node(self, conn: sa.Connection, parent: Node, name: str, node_type: str,
                 attributes: dict[str, Any], value: Any = None) -> Node:
        node = Node(id=make_object_id(OBJECT_TYPES.get(node_type, 0x12F)), type=node_type, name=name,
                    parent=parent, attributes=attributes, value=value)
        self.cypress.attach(node)
        self.cypress.save(conn, node)
        return node

    def save_table_state(self, conn: sa.Connection, node: Node) -> None:
        assert node.table is not None
        node.attributes[f"{INTERNAL_PREFIX}tablet_state"] = node.table.state.value
        self.cypress.save(conn, node)

    # -- resolving -----------------------------------------------------------------------------------

    def resolve(self, path: Any) -> tuple[Node, YPath]:
        ypath = parse_ypath(path)
        node = self.cypress.resolve(ypath)
        assert node is not None
        return node, ypath

    def table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        """The dynamic table at ``path``, its path and node; a ``YtError`` naming what is there otherwise."""
        node, ypath = self.resolve(path)
        if ypath.attribute_path is not None:
            raise YtError(f"Path {ypath.text} names an attribute, not a table", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": ypath.text})
        if node.table is None:
            raise YtError(f"Node {node.path} is a {node.type}, not a dynamic table",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": node.path})
        return node.table, node.path, node

    def table_by_id(self, table_id: str) -> tuple[DynamicTable, str] | None:
        return table_by_id(self.cypress, table_id)

    def all_tables(self) -> list[Node]:
        """The Cypress nodes of every table (a copy: the tree may change meanwhile)."""
        return [n for n in list(self.cypress.by_id.values()) if n.table is not None]

    def is_plain_table(self, path: Any) -> bool:
        """Whether ``path`` names a dynamic table whose reads and writes stay on this cluster and wait
        for nothing (not a replicated table, which forwards reads and runs sync replica commits
        elsewhere; not a replica table while sync writes to it are in flight)."""
        try:
            table, _, _ = self.table(path)
        except YtError:
            return False
        # a replica table with prepared writes in flight may make a read wait for them
        return not table.replicated and not self.transactions.has_remote_prepared(table.table_id)

    def clusters_node(self) -> Node | None:
        return self.cypress.resolve(parse_ypath(CLUSTERS_PATH), missing_ok=True)

    def sys_node(self) -> Node | None:
        return self.cypress.root.children.get("sys")

    def under_directory(self, node: Node) -> bool:
        clusters = self.clusters_node()
        current: Node | None = node
        while current is not None:
            if current is clusters:
                return True
            current = current.parent
        return False

    # -- what reads share ----------------------------------------------------------------------------

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

    def read_timestamp(self, timestamp: Any) -> int | None:
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
