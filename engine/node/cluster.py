"""The composition root of one table node: builds every piece from one ``EngineConfig`` and wires it.

``Cluster`` owns the storage, timestamps, Cypress, the transaction manager, the peers and the
replication manager; it registers replication's commit hooks with the transaction manager, loads
state at start-up and runs the background jobs (transaction expiry, compaction, replication
maintenance). Its commands come from the classes it extends (see ``base``).

``open`` serves a data directory only after its checks (``storage.open_data_dir``: marker, files,
``PRAGMA quick_check``, system tables, metadata) and ``_load`` found every table's SQL tables; a
directory that fails them is refused with a ``DataDirError`` and one log line, never started
empty. Once loaded, the directory is marked as holding this cluster and running, until ``close``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG, EngineConfig
from ..cypress import (
    MAP_NODE,
    Cypress,
)
from ..errors import DataDirError, ErrorCode, StorageCorruptedError, YtError
from ..faults import Faults
from ..httpconn import client_ssl_context
from ..metrics import EngineMetrics
from ..peers import Peers
from ..replication import (
    ReplicationManager,
)
from ..storage import DataDir, Storage, meta_table, new_database_id, open_data_dir, read_locks_table, tablets_table
from ..tablets import MAX_LEASE_SECONDS, SnapshotLeases
from ..tablets.changes import ChangeFeed
from ..tablets.xdcr import VersionClock
from ..timestamps import (
    COUNTER_BITS,
    MAX_TIMESTAMP,
    ReservationFile,
    TimestampProvider,
)
from ..transactions import (
    TransactionManager,
)
from .base import (
    COMPACTED_UNTIL_ATTRIBUTE,
    DEFAULT_MIN_DATA_TTL_MS,
    STORAGE_FORMAT,
    TABLE_TYPES,
    log,
)
from .xdcr import PeerState
from .xdcr_join import XdcrJoinCommands


class Cluster(XdcrJoinCommands):
    """All state of one engine: storage, timestamps, Cypress, tables, transactions."""

    def __init__(self, name: str, storage: Storage, state_dir: Path, config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.name = name
        self.config = config
        self.metrics = EngineMetrics()
        self.faults = Faults(config.crash_points, config.delay_points)
        self.storage = storage
        self.cypress = Cypress()
        reservation = ReservationFile(state_dir / "timestamp.reservation")
        self.timestamps = TimestampProvider(reservation.read(), reservation.write)
        self.transactions = TransactionManager(storage, self.timestamps, self._table_by_id, self.metrics,
                                               self.faults, config)
        self.peers = Peers(timeout=config.sync_timeout, ssl_context=client_ssl_context(config.peer_ca_file)
                           if config.peer_ca_file else None)
        self.replication = ReplicationManager(self, self.peers, self.config)
        self.transactions.register_commit_hooks(self.replication)
        #: long reads at one timestamp (bootstrap copies) hold compaction back while they renew
        self.snapshot_leases = SnapshotLeases()
        #: wakes change-stream pulls waiting for commits (node/streams.py)
        self.change_feed = ChangeFeed(config.max_waiting_pulls)
        #: XDCR (node/xdcr.py): set by _load from the data directory and --cluster-id
        self.cluster_id: int | None = None
        self.xdcr_paused = config.start_paused
        self.xdcr_clock = VersionClock()
        self._xdcr_shippers: dict[str, threading.Thread] = {}
        self._xdcr_peer_state: dict[str, PeerState] = {}
        self._xdcr_advanced: dict[tuple[str, str], float] = {}
        self._xdcr_progress: dict[tuple[str, str], tuple[int, int]] = {}
        self._xdcr_stop = threading.Event()
        self._xdcr_identities: dict[tuple[str, str], int] = {}
        self.metrics.register_state(self.consumer_samples)
        self._stop = threading.Event()  # set once by close(): the background loop ends
        self._background: threading.Thread | None = None
        #: the checked data directory when opened through ``open`` (marked stopped by ``close``)
        self.data_dir: DataDir | None = None
        self._load()

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
        directory.mark_running(name, storage.get_meta("database_id") or "")
        return cluster

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
            if conn.execute(sa.select(meta_table.c.value).where(meta_table.c.name == "database_id")).scalar() is None:
                self.storage.set_meta(conn, "database_id", new_database_id())
            if not nodes:
                for name in ("tmp", "home", "sys"):
                    self._new_node(conn, self.cypress.root, name, MAP_NODE, {})
                self._new_node(conn, self.cypress.by_id[self.cypress.root.children["sys"].id], "clusters",
                               MAP_NODE, {})
            self.storage.set_meta(conn, "cluster_name", self.name)
            self.cluster_id = self._check_cluster_id(conn)
        counts: dict[str, dict[int, list[int]]] = {}
        for t in tablets:
            counts.setdefault(t.table_id, {})[t.tablet_index] = [t.row_count, t.trimmed_row_count]
        with self.storage.read() as conn:
            locked = {r[0] for r in conn.execute(sa.select(read_locks_table.c.table_id).distinct())}
        present = self.storage.table_names()
        lost: list[str] = []
        for node in self.cypress.by_id.values():
            if node.type in TABLE_TYPES:
                node.table = self._make_table(node)
                node.table.tablet_rows = counts.get(node.id, {})
                node.table.has_read_locks = node.id in locked
                sql = [t.name for t in (node.table.sql.data, node.table.sql.versions) if t is not None]
                lost += [f"{node.path} ({name})" for name in sql if name not in present]
        if lost:
            raise DataDirError(f"the database of cluster {self.name} lacks the SQL tables of "
                               f"{', '.join(lost[:5])}{' and more' if len(lost) > 5 else ''}",
                               attributes={"tables": lost[:100]})
        with self.storage.read() as conn:
            self.replication.load(conn)
        self._refresh_directory()
        held, aborted = self.transactions.recover()
        if held or aborted:
            log.info("recovered prepared transactions", extra={"in_doubt": held, "aborted": aborted})

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
        """Expire abandoned transactions and compact old versions, until ``close``."""
        period = self.config.background_period

        def loop() -> None:
            last_compaction = 0.0
            while not self._stop.wait(period):
                try:
                    self.transactions.expire()
                    # (one indexed query per table when nothing is old enough)
                    self.trim_changes()
                    if time.monotonic() - last_compaction > self.config.compaction_period:
                        self.compact()
                        last_compaction = time.monotonic()
                except Exception:  # noqa: BLE001 - a background pass must never kill the engine
                    log.exception("background maintenance failed")

        self._background = threading.Thread(target=loop, name="engine-maintenance", daemon=True)
        self._background.start()
        self.replication.start()
        self.start_xdcr()

    def begin_stop(self) -> None:
        """The engine is about to stop (SIGTERM): waiting stream pulls answer now, and later ones at
        once, so that in-flight requests end within the server's grace period."""
        self.change_feed.close()

    def close(self) -> None:
        self.change_feed.close()
        self._stop.set()
        self._xdcr_stop.set()
        self.replication.close()
        self.peers.close()
        if self._background is not None:
            self._background.join(timeout=5)
        self.storage.close()
        if self.data_dir is not None:
            self.data_dir.mark_stopped()

    # -- snapshot leases (/internal/v1/lease_snapshot, release_snapshot) ----------------------------------

    def lease_snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """Hold compaction of a table at ``timestamp`` for ``seconds`` (a new lease, or ``lease_id``
        renewed). A peer leases only its own replica tables, as it reads them."""
        path = body.get("path")
        if caller is not None:
            self.check_peer_read(caller, "lookup_rows", {"path": path})
        table, table_path, _ = self._table(path)
        ts, seconds, lease_id = body.get("timestamp"), body.get("seconds", 600), body.get("lease_id")
        if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= MAX_TIMESTAMP:
            raise YtError(f"lease_snapshot: timestamp must be a timestamp, an integer in [0, {MAX_TIMESTAMP:#x}]",
                          code=ErrorCode.INVALID_PARAMETER)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_LEASE_SECONDS:
            raise YtError(f"lease_snapshot: seconds must be in (0, {MAX_LEASE_SECONDS:g}]",
                          code=ErrorCode.INVALID_PARAMETER)
        if lease_id is not None and not isinstance(lease_id, str):
            raise YtError("lease_snapshot: lease_id must be a string", code=ErrorCode.INVALID_PARAMETER)
        with self.storage.write():
            # under the writer, as compaction: a snapshot already compacted away cannot be leased back
            table.check_snapshot(ts, table_path)
            lease = self.snapshot_leases.grant(table.table_id, ts, float(seconds), lease_id, holder=caller or "")
        return {"lease_id": lease.lease_id, "timestamp": lease.timestamp, "seconds": float(seconds)}

    def release_snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        lease_id = body.get("lease_id")
        if not isinstance(lease_id, str):
            raise YtError("release_snapshot: lease_id must be a string", code=ErrorCode.INVALID_PARAMETER)
        self.snapshot_leases.release(lease_id, holder=caller or "")
        return {}

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
                # (under the writer: a lease granted meanwhile is checked against compacted_until)
                leased = self.snapshot_leases.pinned(node.id)
                before = node.table.compacted_until
                removed += node.table.compact(conn, horizon if leased is None else min(horizon, leased))
                if node.table.compacted_until != before:
                    node.attributes[COMPACTED_UNTIL_ATTRIBUTE] = node.table.compacted_until
                    self.cypress.save(conn, node)
        return removed
