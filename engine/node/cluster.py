"""The composition root of one table node: builds every part from one ``EngineConfig`` and wires it.

Like a Vitess tablet server's constructor, ``Cluster.__init__`` builds the pieces in one place and
hands each service only what it needs: the storage, timestamps, the Cypress tree, the transaction
manager, the peers, replication (behind ``ReplicationHost``) and XDCR (behind ``XdcrHost``), then
the node's services - ``nodes`` (create/set/remove) and ``reads`` (get/list/exists), ``tablets``
(mount, freeze, reshard, schema, replica commands), ``rows`` (transactions, writes, reads),
``streams`` (change streams and consumers), ``snapshots`` (compaction and leases) and ``xdcr``. No
service reaches another through a shared object: where one needs another's answer it is handed the
other (``rows`` gets ``streams`` for the freshness of reads), or the other registers a hook (XDCR
registers its settings check with ``nodes`` and its log hold with ``streams``). ``Cluster`` holds no
command logic: the API binds each command to a service method (``api/commands.py``).

It also owns the node's life: ``open`` serves a data directory only after its checks
(``storage.open_data_dir``: marker, files, ``PRAGMA quick_check``, system tables, metadata) and
``_load`` found every table's SQL tables; a directory that fails them is refused with a
``DataDirError`` and one log line, never started empty. Once loaded, the directory is marked as
holding this cluster and running, until ``close``. ``start_background`` starts the background work
(transaction expiry, change-log trimming, compaction, replication, XDCR) in a fixed order, and
``close`` stops it.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG, EngineConfig
from ..cypress import MAP_NODE, Cypress, Node
from ..errors import DataDirError, ErrorCode, StorageCorruptedError, YtError
from ..faults import Faults
from ..httpconn import client_ssl_context
from ..metrics import EngineMetrics
from ..peers import Peers
from ..replication import ReplicationManager
from ..storage import (
    DatabaseReservation,
    DataDir,
    Storage,
    meta_table,
    new_database_id,
    open_data_dir,
    open_database,
    read_locks_table,
    tablets_table,
    view_name,
    xdcr_rows_table,
)
from ..storage.leadership import Leadership
from ..storage.migrations import migrate
from ..storage.outages import outage
from ..tablets import DynamicTable, RowWrite, SnapshotLeases
from ..tablets.changes import ChangeFeed
from ..tablets.xdcr import VersionClock
from ..timestamps import ReservationFile, TimestampProvider
from ..transactions import TransactionManager
from ..xdcr import XdcrService
from .cypress_service import CypressService
from .node_reads import NodeReads
from .row_service import RowService
from .serving import ServingState
from .snapshots import SnapshotService
from .stream_service import StreamService
from .tables import STORAGE_FORMAT, TABLE_TYPES, Tables, log, table_by_id
from .tablet_service import TabletService


@dataclass
class _ReplicationHost:
    """``ReplicationHost``: what replication needs of the node, and nothing more."""

    name: str
    storage: Storage
    timestamps: TimestampProvider
    transactions: TransactionManager
    cypress: Cypress
    tables: Tables
    serving: ServingState
    #: the stream service, once built (it needs replication first): its hold on a replicated
    #: table's queue
    streams: StreamService | None = None

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        return self.tables.table(path)

    def stream_hold(self, table: DynamicTable, node: Node) -> int | None:
        assert self.streams is not None
        return self.streams.stream_hold(table, node)

    def check_accepts_writes(self, path: str) -> None:
        self.serving.check_accepts_writes(path)


@dataclass
class _XdcrHost:
    """``XdcrHost``: what the XDCR subsystem needs of the node, and nothing more."""

    name: str
    config: EngineConfig
    storage: Storage
    cypress: Cypress
    timestamps: TimestampProvider
    transactions: TransactionManager
    peers: Peers
    xdcr_clock: VersionClock
    change_feed: ChangeFeed
    serving: ServingState
    tables: Tables
    replication: ReplicationManager
    nodes: CypressService
    tablets: TabletService
    streams: StreamService
    #: the data directory (set by ``Cluster.open``; None for a cluster built on a bare storage)
    data_dir: Path | None = None

    @property
    def cluster_id(self) -> int | None:
        return self.tables.cluster_id

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        return self.tables.table(path)

    def stream_bound(self, table: DynamicTable) -> int:
        return self.streams.stream_bound(table)

    def check_peer_writes(self, table: DynamicTable, path: str, writes: list[RowWrite], what: str) -> None:
        self.replication.check_peer_writes(table, path, writes, what)

    def create_system_table(self, conn: sa.Connection, name: str, schema: list[dict[str, Any]]) -> Node:
        return self.nodes.create_system_table(conn, name, schema)

    def alter_schema(self, path: Any, schema: Any) -> None:
        self.tablets.alter_schema(path, schema)


class Cluster:
    """One engine: the parts it is built of, its services, and its life (see the module docstring)."""

    def __init__(self, name: str, storage: Storage, state_dir: Path, config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.name = name
        self.config = config
        self.metrics = EngineMetrics()
        self.faults = Faults(config.crash_points, config.delay_points)
        self.storage = storage
        self.cypress = Cypress()
        # the durable timestamp reservation lives with the data: in the database for PostgreSQL (every
        # engine that ever serves it continues above it), in the data directory for SQLite
        self._reservation: DatabaseReservation | None = None
        if storage.is_postgresql:
            self._reservation = DatabaseReservation(storage)
            self.timestamps = TimestampProvider(self._reservation.read(), self._reservation.write)
        else:
            reservation = ReservationFile(state_dir / "timestamp.reservation")
            self.timestamps = TimestampProvider(reservation.read(), reservation.write)
        self.peers = Peers(timeout=config.sync_timeout, ssl_context=client_ssl_context(config.peer_ca_file)
                           if config.peer_ca_file else None)
        #: wakes change-stream pulls waiting for commits (stream_service.py)
        self.change_feed = ChangeFeed(config.max_waiting_pulls)
        #: XDCR's row versions (tablets/xdcr.py)
        self.xdcr_clock = VersionClock()
        #: long reads at one timestamp (bootstrap copies) hold compaction back while they renew
        self.snapshot_leases = SnapshotLeases()
        self.serving = ServingState(name, self.cypress, paused=config.start_paused)
        self.transactions = TransactionManager(storage, self.timestamps, functools.partial(table_by_id, self.cypress),
                                               self.metrics, self.faults, config)
        self.tables = Tables(name, config, storage, self.cypress, self.timestamps, self.transactions,
                             self.change_feed, self.xdcr_clock)
        replication_host = _ReplicationHost(name, storage, self.timestamps, self.transactions, self.cypress,
                                            self.tables, self.serving)
        self.replication = ReplicationManager(replication_host, self.peers, config)
        self.transactions.register_commit_hooks(self.replication)
        # the services
        self.reads = NodeReads(self.cypress, self.tables, self.replication, self.peers)
        self.nodes = CypressService(name, storage, self.cypress, self.tables, self.reads, self.replication,
                                    self.change_feed)
        self.tablets = TabletService(name, storage, self.cypress, self.tables, self.transactions, self.replication,
                                     self.serving)
        self.streams = StreamService(name, config, storage, self.cypress, self.tables, self.timestamps,
                                     self.transactions, self.replication, self.change_feed)
        replication_host.streams = self.streams
        self.rows = RowService(name, config, storage, self.cypress, self.tables, self.timestamps, self.transactions,
                               self.replication, self.peers, self.serving, self.streams)
        self.snapshots = SnapshotService(storage, self.cypress, self.tables, self.timestamps, self.transactions,
                                         self.snapshot_leases, self.rows.check_peer_read)
        self.xdcr_host = _XdcrHost(name, config, storage, self.cypress, self.timestamps, self.transactions,
                                   self.peers, self.xdcr_clock, self.change_feed, self.serving, self.tables,
                                   self.replication, self.nodes, self.tablets, self.streams)
        self.xdcr = XdcrService(self.xdcr_host)
        # the hooks: XDCR's settings are checked when set, and its peers hold the change log
        self.nodes.add_setting_check(self.xdcr.check_setting)
        self.streams.add_log_hold(self.xdcr.log_hold)
        self.metrics.register_state(self.streams.consumer_samples)
        self._stop = threading.Event()  # set once by close(): the background loop ends
        self._background: threading.Thread | None = None
        #: the checked data directory when opened through ``open`` (marked stopped by ``close``)
        self.data_dir: DataDir | None = None
        self._load()

    @property
    def cluster_id(self) -> int | None:
        """This cluster's XDCR id (``--cluster-id``, kept in the data directory), None without one."""
        return self.tables.cluster_id

    @classmethod
    def open(cls, name: str, data_dir: Path, config: EngineConfig = DEFAULT_CONFIG) -> Cluster:
        """The cluster of ``data_dir``; a ``DataDirError`` (logged, nothing created) if the directory
        held a cluster whose database is missing, empty, damaged or incomplete."""
        directory = DataDir(data_dir)
        try:
            storage = open_data_dir(directory)
            try:
                cluster = cls(name, storage, data_dir, config)
            except BaseException:
                storage.close()
                directory.release()  # refused after its checks: the directory is free again
                raise
        except (DataDirError, StorageCorruptedError) as exc:
            # every refusal names the directory: _load's errors and a damaged page met while loading
            # get it here
            refused = exc if "data_dir" in exc.attributes else directory.refuse(
                exc.message if isinstance(exc, DataDirError)
                else f"its database is damaged ({exc.attributes.get('reason')})")
            log.error("data directory refused", extra={"cluster": name, "data_dir": str(data_dir),
                                                       "reason": refused.message})
            if refused is exc:
                raise
            raise refused from exc
        cluster.data_dir = directory
        cluster.xdcr_host.data_dir = data_dir
        directory.mark_running(name, storage.get_meta("database_id") or "")
        return cluster

    @classmethod
    def open_database(cls, name: str, url: str, data_dir: Path, config: EngineConfig = DEFAULT_CONFIG,
                      leadership: Leadership | None = None) -> Cluster:
        """The cluster whose state is in the PostgreSQL database at ``url`` (``engine serve --storage``);
        ``data_dir`` holds only the engine's own files (token, conflict CSVs, snapshot pages) and its
        lock. A database that is another cluster's, a newer format's or incomplete is refused
        (``DatabaseRefused``, one line naming it, its password never). ``leadership``: the lease this
        engine won as a standby (``storage/leadership.py``; by default it claims the database as a
        single engine); the node is built from the database exactly as at a restart."""
        directory = DataDir(data_dir)
        directory.prepare_local()
        try:
            storage = open_database(url, name, STORAGE_FORMAT, leadership)
            try:
                cluster = cls(name, storage, data_dir, config)
            except BaseException:
                storage.close()
                raise
        except BaseException as exc:
            directory.release()
            if isinstance(exc, DataDirError):
                log.error("database refused", extra={"cluster": name, "reason": exc.message})
            raise
        cluster.data_dir = directory
        cluster.xdcr_host.data_dir = data_dir
        return cluster

    def _load(self) -> None:
        migrate(self.storage)
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
            if conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == "database_id")).scalar() is None:
                self.storage.set_meta(conn, "database_id", new_database_id())
            if not nodes:
                for name in ("tmp", "home", "sys"):
                    self.tables.new_node(conn, self.cypress.root, name, MAP_NODE, {})
                self.tables.new_node(conn, self.cypress.by_id[self.cypress.root.children["sys"].id], "clusters",
                                     MAP_NODE, {})
            self.storage.set_meta(conn, "cluster_name", self.name)
            self.tables.cluster_id = self._check_cluster_id(conn)
        counts: dict[str, dict[int, list[int]]] = {}
        for t in tablets:
            counts.setdefault(t.table_id, {})[t.tablet_index] = [t.row_count, t.trimmed_row_count]
        with self.storage.read() as conn:
            locked = {r[0] for r in conn.execute(sa.select(read_locks_table.c.table_id).distinct())}
            # XDCR versions go on after every version stored here, whatever the wall clock says
            # now (a restart with the clock set back): versions stay unique and causal per cluster
            newest_version = conn.execute(sa.select(sa.func.max(xdcr_rows_table.c.timestamp))).scalar()
        self.xdcr_clock.observe(int(newest_version or 0))
        present = self.storage.table_names()
        lost: list[str] = []
        for node in self.cypress.by_id.values():
            if node.type in TABLE_TYPES:
                node.table = self.tables.make_table(node)
                node.table.tablet_rows = counts.get(node.id, {})
                node.table.has_read_locks = node.id in locked
                sql = [t.name for t in (node.table.sql.data, node.table.sql.versions) if t is not None]
                lost += [f"{node.path} ({name})" for name in sql if name not in present]
        if lost:
            raise DataDirError(f"the database of cluster {self.name} lacks the SQL tables of "
                               f"{', '.join(lost[:5])}{' and more' if len(lost) > 5 else ''}",
                               attributes={"tables": lost[:100]})
        self._ensure_views()
        with self.storage.read() as conn:
            self.replication.load(conn)
        # (after the replicas: their acknowledged progress tells where a queue trimmed empty ends)
        self.tablets.restore_tablet_counts()
        self.reads.refresh_directory()
        held, aborted = self.transactions.recover()
        if held or aborted:
            log.info("recovered prepared transactions", extra={"in_doubt": held, "aborted": aborted})

    def _ensure_views(self) -> None:
        """Every table has its SQL view (``UserTables.create_view``): the tables of a database made
        before views existed get theirs at the first start."""
        with self.storage.read() as conn:
            present = set(sa.inspect(conn).get_view_names())
        missing = [n for n in self.tables.all_tables()
                   if n.table is not None and not n.table.replicated and view_name(n.path) not in present]
        if missing:
            with self.storage.write() as conn:
                for node in missing:
                    assert node.table is not None
                    node.table.sql.create_view(conn, node.path)

    def _check_cluster_id(self, conn: sa.Connection) -> int | None:
        """The XDCR cluster id: the stored one, or ``--cluster-id`` stored at the first start; a
        different ``--cluster-id`` than the stored one is refused (rows carry it: it cannot change)."""
        stored = conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == "cluster_id")).scalar()
        wanted = self.config.cluster_id
        if stored is not None and wanted is not None and int(stored) != wanted:
            raise DataDirError(f"cluster {self.name} has XDCR cluster id {stored}: it cannot start with --cluster-id "
                               f"{wanted} (every row of its XDCR tables carries the id; start it with "
                               f"--cluster-id {stored}, or without the option)",
                               attributes={"cluster_id": int(stored), "requested_cluster_id": wanted})
        if stored is None and wanted is not None:
            self.storage.set_meta(conn, "cluster_id", str(wanted))
            return wanted
        return None if stored is None else int(stored)

    def start_background(self) -> None:
        """Expire abandoned transactions, trim change logs and compact old versions until ``close``;
        then replication and XDCR."""
        period = self.config.background_period

        def loop() -> None:
            last_compaction = 0.0
            while not self._stop.wait(period):
                try:
                    self.transactions.expire()
                    # (one indexed query per table when nothing is old enough)
                    self.streams.trim_changes()
                    if time.monotonic() - last_compaction > self.config.compaction_period:
                        self.snapshots.compact()
                        last_compaction = time.monotonic()
                except Exception as exc:  # noqa: BLE001 - a background pass must never kill the engine
                    away = outage(exc)
                    if away is None:
                        log.exception("background maintenance failed")
                    else:
                        log.warning("background maintenance waits for the database", extra={"error": away})

        self._background = threading.Thread(target=loop, name="engine-maintenance", daemon=True)
        self._background.start()
        self.replication.start()
        self.xdcr.start()

    def begin_stop(self) -> None:
        """The engine is about to stop (SIGTERM): waiting stream pulls answer now, and later ones at
        once, so that in-flight requests end within the server's grace period."""
        self.change_feed.close()

    def close(self) -> None:
        self.change_feed.close()
        self._stop.set()
        self.xdcr.stop()
        self.replication.close()
        self.peers.close()
        if self._background is not None:
            self._background.join(timeout=5)
        if self._reservation is not None:
            self._reservation.close()
        self.storage.close()
        if self.data_dir is not None:
            self.data_dir.mark_stopped()
