"""Async replication (meta-cluster side): one ``Replicator`` per enabled replica.

A replicator reads, for each tablet, a batch from the replication queue at the replica's progress
and pushes it with the row index it starts at; the replica applies it only if its own record
agrees (``sink.py``) and answers with the index it stores. Progress moves only after such an
answer, and only to what the replica says it has: a lost answer makes the same batch go again and
be recognised; an error is recorded on the tablet and the replicator backs off.

A replica switching to sync is also driven from here: it catches up while fed asynchronously,
drains (writes fail with the retriable 1732) once few rows are missing, and turns in sync under
the storage writer lock once the queue tail is fully replicated, so that no commit slips between.

The replicator also ends the state transitions ``alter_table_replica`` begins, so that the states
users wait on (seed 002: "the replica will switch to enabling state and after it is successfully
enabled, it will switch to enabled") mean what they say: an ``enabling`` replica becomes
``enabled`` once its replicator runs and has made a first pass over every tablet (a sync replica:
once it has caught up and starts draining), and a ``disabling`` one becomes ``disabled`` once its
replicator has finished the push in flight, saved its progress and stopped.

``ReplicatorPool`` starts a replicator thread per enabled or enabling replica (at once when
``alter_table_replica`` wakes it), ends ``disabling`` for a replica without a running replicator
(one never started, or an engine restarted mid-transition), and runs the maintenance jobs (decision
delivery, in-doubt resolution, queue trimming) once a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from ..config import EngineConfig
from ..errors import YtError
from ..peers import Peers
from ..replica_types import ReplicaMode, ReplicaState
from ..storage import on_commit
from ..storage.outages import outage
from ..tablets import DynamicTable
from ..timestamps import COUNTER_BITS
from .host import ReplicationHost
from .options import DEFAULT_MIN_REPLICATION_LOG_TTL_MS, TRIMMED_TIMESTAMP_ATTRIBUTE
from .registry import ReplicaRegistry, save_progress
from .replica import Replica, SyncPhase, TabletProgress, history_trimmed_error

log = logging.getLogger("reptables.engine.replication")


def queue_end(table: DynamicTable, tablet: int) -> int:
    """The row index after the last change in a tablet's queue."""
    return table.tablet_rows.get(tablet, [0, 0])[0]


def layout(table: DynamicTable) -> tuple[int, int]:
    """(layout revision, tablet count) of a table, for a push or a heartbeat to send after reading
    the changes it carries: a replica table's freshness is the least recorded timestamp over that
    many tablets of the meta table (``sink.replica_freshness``), so every push tells the count, a
    busy tablet's as an idle one's. A change read from the queue was committed after any reshard
    before it, so the count read after it is that reshard's, or a later one's. The revision is read
    first: a reshard publishes its tablets before its revision (``TabletService.reshard_table``), so
    a new revision is never sent with an old count, and a replica cluster never goes back to the
    count of an older revision, whatever order pushes arrive in (a late one after a timeout)."""
    revision = table.layout_revision
    return revision, table.tablet_count


class Replicator:
    """Feeds one replica: its thread, its pushes, its throttle, its way to in sync."""

    def __init__(self, replica: Replica, host: ReplicationHost, peers: Peers, registry: ReplicaRegistry,
                 config: EngineConfig, stop: threading.Event, wake: threading.Event) -> None:
        self.replica = replica
        self.host = host
        self.peers = peers
        self.registry = registry
        self.config = config
        self._stop = stop
        self._wake = wake
        #: tablet -> (monotonic time the next push may start, size of the last batch); only this
        #: replicator's thread uses it
        self._throttle: dict[int, tuple[float, float]] = {}
        #: set by ``ensure_running`` (the supervisor's thread only), read by ``join``
        self._thread: threading.Thread | None = None

    # -- the thread --------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def ensure_running(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self.run, name=f"replicator-{self.replica.id}", daemon=True)
            self._thread.start()

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=timeout)

    def run(self) -> None:
        """Until the replica is disabled or removed, or the engine stops; ends its transitions."""
        while not self._stop.is_set():
            if self.registry.find(self.replica.id) is not self.replica:
                return
            state = self.replica.state
            if state is ReplicaState.DISABLING:
                # the push in flight is done and its progress saved (push_tablet is synchronous)
                self.registry.finish_transition(self.replica, self.replica.finish_disabling)
                return
            if state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                return
            busy = False
            if time.monotonic() >= self.replica.backoff_until:
                try:
                    busy = self.replicate_once()
                except Exception as exc:  # noqa: BLE001 - any failure is recorded and backed off
                    away = outage(exc)
                    if away is None:
                        log.exception("replicator failed", extra={"replica_id": self.replica.id})
                    else:
                        log.warning("replicator waits for the database", extra={"replica_id": self.replica.id,
                                                                                 "error": away})
                    self.record_error(None, YtError(f"Replicator failed: {exc}"), self.config.soft_backoff)
                else:
                    if state is ReplicaState.ENABLING:
                        # a first pass over every tablet is done (a push or a recorded push error each)
                        self.registry.finish_transition(self.replica, self.replica.finish_enabling)
            if not busy:
                self._wake.wait(self.config.replicator_tick)
                self._wake.clear()

    # -- one pass ----------------------------------------------------------------------------------

    def table(self) -> DynamicTable | None:
        node = self.host.cypress.by_id.get(self.replica.table_id)
        return node.table if node is not None else None

    def replicate_once(self) -> bool:
        """Push at most one batch per tablet; returns True when more work is waiting."""
        table = self.table()
        if table is None:
            return False
        if self.replica.writes_synchronously:
            # fed by the commits themselves; idle tablets still tell the replica how fresh it is
            for tablet in range(table.tablet_count):
                progress = self.replica.progress_of(tablet)
                if progress.row_index >= queue_end(table, tablet):
                    self.barrier(table, tablet, progress)
            return False
        busy = False
        for tablet in range(table.tablet_count):
            if self.replica.state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                return False  # disabling: stop after the push in flight
            busy |= self.push_tablet(table, tablet)
        _, mode, phase = self.replica.flags()
        if mode is ReplicaMode.SYNC and phase is not SyncPhase.IN_SYNC:
            self.advance_sync_phase(table)
        if not busy:
            self.replica.reset_backoff_if_healthy()
        return busy

    def push_tablet(self, table: DynamicTable, tablet: int) -> bool:
        """Push one batch of ``tablet``; True when more rows are waiting after it."""
        replica, config = self.replica, self.config
        progress = replica.progress_of(tablet)
        if progress.row_index >= queue_end(table, tablet):
            replica.clear_tablet_error(tablet)
            self.barrier(table, tablet, progress)
            return False
        if not self.throttle_allows(tablet):
            return False
        with self.host.storage.read() as conn:
            entries = table.read_queue(conn, tablet, progress.row_index, config.batch_rows)
        # the batch is cut at batch_rows rows (the read), batch_bytes bytes or batch_timestamps commits;
        # under a replication_throttler also at its limit, so that no period sends more than the limit
        # (the seed's limit is an average over the period: a burst bigger than one period's budget is not one)
        limit, _ = self.throttler(table)
        byte_cap = min(config.batch_bytes, limit) if limit else config.batch_bytes
        count, size = 0, 0
        stamps: set[int] = set()
        for entry in entries:
            if count and (size + len(entry.payload) > byte_cap or
                          (entry.timestamp not in stamps and len(stamps) >= config.batch_timestamps)):
                break
            count += 1
            size += len(entry.payload)
            stamps.add(entry.timestamp)
        batch = entries[:count]
        if not batch:
            return False
        end = batch[-1].row_index + 1
        revision, tablet_count = layout(table)
        header = json.dumps({"upstream_replica_id": replica.id, "replica_path": replica.replica_path,
                             "tablet_index": tablet, "prev_row_index": progress.row_index, "row_index": end,
                             "preserve_timestamps": replica.preserve_timestamps, "table_id": table.table_id,
                             "tablet_count": tablet_count, "layout_revision": revision})
        # queue payloads are JSON already: splice them in instead of encoding JSON inside JSON
        changes = ",".join(f'{{"timestamp":{e.timestamp},"kind":"{e.kind}","payload":{e.payload}}}'
                           for e in batch if e.timestamp > replica.start_replication_timestamp)
        body = f'{header[:-1]},"entries":[{changes}]}}'.encode()
        metrics = self.host.transactions.metrics
        labels = (replica.table_path, replica.id, replica.cluster_name)
        try:
            # network: no lock held
            answer = self.peers.client(replica.cluster_name).call("push", raw_body=body, timeout=config.push_timeout)
        except YtError as exc:
            metrics.push_errors.labels(*labels).inc()
            self.record_error(tablet, exc, config.soft_backoff)
            return False
        stored = int(answer["row_index"])
        if stored < progress.row_index:
            metrics.push_errors.labels(*labels).inc()
            # the replica still misses sync commits in flight to it: wait for them
            self.record_error(tablet, YtError(
                f"Replica {replica.id} is behind: it has row {stored}, the batch starts at {progress.row_index}"),
                config.replicator_tick * 5)
            return False
        new_progress = TabletProgress(stored, batch[-1].timestamp if stored == end else progress.timestamp)
        if stored != end and stored > progress.row_index:
            with self.host.storage.read() as conn:
                ts = table.first_timestamp_from(conn, tablet, stored - 1)
            new_progress.timestamp = max(progress.timestamp, ts or 0)
        with self.host.storage.write() as conn:
            save_progress(conn, replica.id, tablet, new_progress.row_index, new_progress.timestamp)
            # in memory once durable (still under the storage writer, as every row index change)
            on_commit(conn, lambda: replica.set_progress(tablet, new_progress))
        self.account_throttle(table, tablet, size)
        metrics.pushes.labels(*labels).inc()
        metrics.rows_pushed.labels(*labels).inc(max(0, new_progress.row_index - progress.row_index))
        replica.clear_errors()
        return new_progress.row_index < queue_end(table, tablet)

    def barrier(self, table: DynamicTable, tablet: int, progress: TabletProgress) -> None:
        """An idle, caught-up tablet's replication timestamp moves on with time (at most once a second).

        Without it a replica whose tablet saw no writes for an hour would look an hour behind the
        moment a new row arrives. The barrier is a fresh timestamp below which every commit is
        applied, taken only while the replica has every queued row.
        """
        if time.time() - (progress.timestamp >> COUNTER_BITS) < 1.0:
            return
        barrier = self.host.timestamps.generate()
        self.host.transactions.faults.delay_point("replicator_barrier")  # (fault tests: widen the race)
        self.host.transactions.wait_visible(barrier)  # no replication lock held while waiting
        end = queue_end(table, tablet)
        if self.replica.progress_of(tablet).row_index < end:
            # a commit landed since the caller looked: the replica lacks its rows, so neither the
            # barrier nor a heartbeat claiming row ``end`` may go out (a sink with no record yet
            # would take that claim and then skip the rows as already applied); the next pass pushes
            return
        self.replica.advance_timestamp(tablet, barrier, end)
        self.heartbeat(table, tablet, end, barrier)

    def heartbeat(self, table: DynamicTable, tablet: int, end: int, barrier: int) -> None:
        """Tell the replica cluster that it has every change of ``tablet`` up to ``barrier``: an
        empty push the sink records like a batch (exactly once: only while it holds row ``end``).
        A replica table's freshness (reads' event tokens, its change stream) is the least of these
        over the meta-cluster's tablets, so an idle tablet must not hold it back."""
        replica = self.replica
        if not replica.preserve_timestamps:
            return  # its rows take this cluster's timestamps: no freshness to speak of
        revision, tablet_count = layout(table)
        body = json.dumps({"upstream_replica_id": replica.id, "replica_path": replica.replica_path,
                           "tablet_index": tablet, "prev_row_index": end, "row_index": end,
                           "preserve_timestamps": True, "entries": [], "barrier_timestamp": barrier,
                           "tablet_count": tablet_count, "layout_revision": revision,
                           "table_id": table.table_id}).encode()
        try:
            # network: no lock held; short, so that a slow replica cluster never holds up the
            # replicator's loop (its transitions, its next batch) for a heartbeat
            self.peers.client(replica.cluster_name).call("push", raw_body=body,
                                                         timeout=min(self.config.push_timeout, 2.0))
        except YtError as exc:
            log.debug("replica heartbeat failed", extra={"replica_id": replica.id, "error": exc.message})

    def throttle_allows(self, tablet: int) -> bool:
        budget = self._throttle.get(tablet)
        return budget is None or time.monotonic() >= budget[0]

    def throttler(self, table: DynamicTable) -> tuple[int | None, int]:
        """The table's ``replication_throttler``: (limit in bytes per period or None, period in ms)."""
        node = self.host.cypress.by_id.get(table.table_id)
        options = (node.attributes.get("replication_throttler") if node is not None else None) or {}
        return options.get("limit") or None, int(options.get("period", 1000))

    def account_throttle(self, table: DynamicTable, tablet: int, size: int) -> None:
        limit, period = self.throttler(table)
        if not limit:
            return
        # the batch used size bytes of a budget of `limit` bytes per `period` ms: wait accordingly
        delay = size / float(limit) * (float(period) / 1000.0)
        self._throttle[tablet] = (time.monotonic() + delay, float(size))

    def advance_sync_phase(self, table: DynamicTable) -> None:
        """catching_up -> draining when few rows are missing; draining -> in_sync when none are."""
        replica = self.replica
        pending = sum(max(0, queue_end(table, t) - replica.progress_of(t).row_index)
                      for t in range(table.tablet_count))
        if pending <= self.config.drain_threshold_rows and replica.phase is SyncPhase.CATCHING_UP:
            # (an enabling sync replica becomes enabled here, saved with the phase change)
            self.registry.finish_transition(replica, replica.start_draining)
        if replica.phase is SyncPhase.DRAINING:
            # lock order: the storage writer, then the replica; no commit appends while we check
            with self.host.storage.write_lock:
                flipped = replica.finish_draining(table.tablet_count, lambda t: queue_end(table, t))
            if flipped:
                log.info("sync replica in sync", extra={"replica_id": replica.id, "path": replica.table_path})

    def record_error(self, tablet: int | None, error: YtError, backoff: float) -> None:
        entry = {"code": error.code, "message": error.message, "attributes": error.attributes}
        self.replica.record_error(tablet, entry, time.monotonic() + backoff)
        log.warning("replication error", extra={"replica_id": self.replica.id, "path": self.replica.table_path,
                                                "cluster": self.replica.cluster_name, "tablet": tablet,
                                                "error": error.message})


def trim_queues(host: ReplicationHost, registry: ReplicaRegistry, config: EngineConfig) -> None:
    """Drop queue rows every replica has, once older than min_replication_log_ttl.

    The floor (the least progress of the table's replicas) is taken again under the storage
    writer, so a replica created meanwhile (it starts at the oldest row still queued) is counted.
    A replica never enabled counts for ``bootstrap_pin_ttl`` after its creation (it pins the
    history while its bootstrap copy runs); an abandoned one stops holding the queue back then, and
    once rows it needs are trimmed it is marked as missing history (it cannot be enabled, and says
    why) instead of silently missing rows.
    """
    now = time.time()
    for node in list(host.cypress.by_id.values()):
        table = node.table
        if table is None or not table.replicated:
            continue
        ttl_ms = int(node.attributes.get("min_replication_log_ttl", DEFAULT_MIN_REPLICATION_LOG_TTL_MS))
        horizon = host.timestamps.last - (ttl_ms << COUNTER_BITS) // 1000
        held = host.stream_hold(table, node)  # change streams: retention and vital consumers
        if held is not None:
            horizon = min(horizon, held)

        def holding(table: DynamicTable = table) -> tuple[list[Replica], list[Replica]]:
            """(replicas that hold the queue back, abandoned ones that no longer do)."""
            hold, expired = [], []
            for replica in registry.replicas_of(table.table_id):
                snap = replica.snapshot()
                if not snap.enabled_once and snap.state is ReplicaState.DISABLED and \
                        now - snap.created_at > config.bootstrap_pin_ttl:
                    expired.append(replica)
                else:
                    hold.append(replica)
            return hold, expired

        def floor(tablet: int, hold: list[Replica], table: DynamicTable = table) -> tuple[int, int]:
            rows, trimmed = table.tablet_rows.get(tablet, [0, 0])
            low = min((r.progress_of(tablet).row_index for r in hold), default=rows)
            return low, trimmed

        for tablet in range(table.tablet_count):
            hold, expired = holding()
            low, trimmed = floor(tablet, hold)
            if low <= trimmed:
                continue
            with host.storage.write() as conn:
                hold, expired = holding()
                low, trimmed = floor(tablet, hold)
                if low > trimmed and table.trim_queue(conn, tablet, low, horizon):
                    node.attributes[TRIMMED_TIMESTAMP_ATTRIBUTE] = table.trimmed_timestamp
                    host.cypress.save(conn, node)
                    _mark_missing_history(registry, expired, table, tablet, conn)


def _mark_missing_history(registry: ReplicaRegistry, expired: list[Replica], table: DynamicTable, tablet: int,
                          conn: sa.Connection) -> None:
    """Replicas whose pin expired and whose rows were just trimmed: they miss history now, and say so."""
    trimmed_rows = table.tablet_rows.get(tablet, [0, 0])[1]
    for replica in expired:
        if replica.progress_of(tablet).row_index >= trimmed_rows or \
                table.trimmed_timestamp <= replica.start_replication_timestamp or replica.history_trimmed:
            continue
        replica.mark_history_trimmed(table.trimmed_timestamp)
        error = history_trimmed_error(replica, table.trimmed_timestamp)
        replica.record_error(None, {"code": error.code, "message": error.message, "attributes": error.attributes}, 0.0)
        registry.save(conn, replica)
        log.warning("bootstrap pin expired: replica misses trimmed history", extra={
            "replica_id": replica.id, "path": replica.table_path, "trimmed_timestamp": table.trimmed_timestamp})


class ReplicatorPool:
    """A replicator thread per enabled replica, and the periodic maintenance jobs."""

    def __init__(self, host: ReplicationHost, peers: Peers, registry: ReplicaRegistry, config: EngineConfig,
                 maintenance: Sequence[Callable[[], None]] = ()) -> None:
        self.host = host
        self.peers = peers
        self.registry = registry
        self.config = config
        self.maintenance = list(maintenance)
        self._stop = threading.Event()
        #: set to cut a replicator's idle tick short (after alter_table_replica)
        self._wake = threading.Event()
        #: set to cut the supervisor's tick short (a replica began enabling or disabling)
        self._kick = threading.Event()
        #: guards _replicators; a leaf (nothing is acquired, no thread is joined under it)
        self._lock = threading.Lock()
        self._replicators: dict[str, Replicator] = {}
        self._supervisor: threading.Thread | None = None

    def replicator(self, replica: Replica) -> Replicator:
        """The one replicator of ``replica`` (made on first use)."""
        with self._lock:
            current = self._replicators.get(replica.id)
            if current is None or current.replica is not replica:
                current = self._replicators[replica.id] = Replicator(
                    replica, self.host, self.peers, self.registry, self.config, self._stop, self._wake)
            return current

    def start(self) -> None:
        self._supervisor = threading.Thread(target=self._supervise, name="replication-supervisor", daemon=True)
        self._supervisor.start()

    def wake(self) -> None:
        """After ``alter_table_replica``: replicators look at their replica's state, and the
        supervisor starts the replicator of an enabling one, now rather than at their next tick."""
        self._wake.set()
        self._kick.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._kick.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        with self._lock:
            replicators = list(self._replicators.values())
        for replicator in replicators:
            replicator.join(timeout=5)

    def _supervise(self) -> None:
        last_maintenance = 0.0
        while not self._stop.is_set():
            self._kick.clear()
            replicas = self.registry.all()
            for replica in replicas:
                state = replica.state
                if state in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                    self.replicator(replica).ensure_running()
                elif state is ReplicaState.DISABLING and not self.replicator(replica).running:
                    # no replicator to stop (only this thread starts them): disabled now
                    try:
                        self.registry.finish_transition(replica, replica.finish_disabling)
                    except Exception:  # noqa: BLE001 - tried again at the next tick
                        log.exception("ending disabling failed", extra={"replica_id": replica.id})
            present = {r.id for r in replicas}
            with self._lock:
                for gone in [i for i in self._replicators if i not in present]:
                    del self._replicators[gone]  # its thread notices the removal and ends
            if time.monotonic() - last_maintenance > 1.0:
                last_maintenance = time.monotonic()
                for job in self.maintenance:
                    try:
                        job()
                    except Exception as exc:  # noqa: BLE001 - maintenance must keep running
                        job_name = getattr(job, "__name__", repr(job))
                        away = outage(exc)
                        if away is None:
                            log.exception("replication maintenance failed", extra={"job": job_name})
                        else:
                            log.warning("replication maintenance waits for the database",
                                        extra={"job": job_name, "error": away})
            self._kick.wait(0.5)
