"""Async replication (meta-cluster side): a ``Replicator`` per replica, one *pass* at a time.

A pass reads, for each tablet, a batch from the replication queue at the replica's progress and
pushes it with the row index it starts at; the replica applies it only if its own record agrees
(``sink.py``) and answers with the index it stores. Progress moves only after such an answer, and
only to what the replica says it has: a lost answer makes the same batch go again and be
recognised; an error is recorded on the tablet and the replica backs off.

A replica switching to sync is also driven from here: it catches up while fed asynchronously,
drains (writes fail with the retriable 1732) once few rows are missing, and turns in sync under
the storage writer lock once the queue tail is fully replicated, so that no commit slips between.

A pass also ends the state transitions ``alter_table_replica`` begins, so that the states users
wait on (seed 002: "the replica will switch to enabling state and after it is successfully
enabled, it will switch to enabled") mean what they say: an ``enabling`` replica becomes
``enabled`` once a pass has gone over every tablet (a sync replica: once it has caught up and
starts draining), and a ``disabling`` one becomes ``disabled`` at the pass after the push in flight,
its progress saved.

Who runs passes, and when, is the pool's (``scheduler.py``): a pass runs in one of a few worker
threads, never in two at once for one replica, and says when it wants to run again
(:class:`PassResult`). Heartbeats of idle tablets (the replica tables' freshness) are not part of a
pass: ``heartbeats.py`` sends them for many replicas at once.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from operator import attrgetter

import orjson

from ..config import EngineConfig
from ..errors import YtError
from ..peers import Peers
from ..replica_types import ReplicaMode, ReplicaState
from ..storage import on_commit
from ..storage.outages import outage
from ..tablets import DynamicTable, QueueRun, run_size
from .host import ReplicationHost
from .registry import ReplicaRegistry, save_progress
from .replica import Replica, SyncPhase, TabletProgress

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


@dataclass(frozen=True)
class PassResult:
    """What a pass tells the pool: when to run the replica again, and what happened."""

    #: run again at this monotonic time (0.0: at once, behind the other replicas waiting); None:
    #: only when woken (a commit to its table, ``alter_table_replica``)
    due: float | None = None
    #: ``due`` is a backoff after an error: a commit does not cut it short (``alter_table_replica`` does)
    hold: bool = False
    #: the pass pushed rows (their last commit is in the replica table's freshness only after a heartbeat)
    pushed: bool = False
    #: the replica is gone (removed): the pool forgets it
    removed: bool = False


#: ``PassResult.due`` of a replica with more rows waiting
AT_ONCE = 0.0


class Replicator:
    """Feeds one replica: its passes, its pushes, its throttle, its way to in sync. Not reentrant:
    the pool runs one pass of a replica at a time (``scheduler.py``)."""

    def __init__(self, replica: Replica, host: ReplicationHost, peers: Peers, registry: ReplicaRegistry,
                 config: EngineConfig) -> None:
        self.replica = replica
        self.host = host
        self.peers = peers
        self.registry = registry
        self.config = config
        #: tablet -> (monotonic time the next push may start, size of the last batch); only the pass uses it
        self._throttle: dict[int, tuple[float, float]] = {}
        #: during a pass: the earliest time a throttled tablet may push again, and whether rows went out
        self._throttled_until: float | None = None
        self._pushed = False

    # -- a pass ------------------------------------------------------------------------------------

    def run_once(self) -> PassResult:
        """One pass: end a transition, or push what is waiting; says when to run again."""
        replica = self.replica
        if self.registry.find(replica.id) is not replica:
            return PassResult(removed=True)
        state = replica.state
        if state is ReplicaState.DISABLING:
            # the push in flight (the previous pass) is done and its progress saved
            self.registry.finish_transition(replica, replica.finish_disabling)
            return PassResult()
        if state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
            return PassResult()
        backoff = replica.backoff_until
        if time.monotonic() < backoff:
            return PassResult(due=backoff, hold=True)
        self._throttled_until, self._pushed = None, False
        try:
            busy = self.replicate_once()
        except Exception as exc:  # noqa: BLE001 - any failure is recorded and backed off
            away = outage(exc)
            if away is None:
                log.exception("replicator failed", extra={"replica_id": replica.id})
            else:
                log.warning("replicator waits for the database", extra={"replica_id": replica.id, "error": away})
            self.record_error(None, YtError(f"Replicator failed: {exc}"), self.config.soft_backoff)
            return PassResult(due=replica.backoff_until, hold=True, pushed=self._pushed)
        if state is ReplicaState.ENABLING:
            # a first pass over every tablet is done (a push or a recorded push error each)
            self.registry.finish_transition(replica, replica.finish_enabling)
        state, mode, phase = replica.flags()
        if busy or state is ReplicaState.DISABLING:
            return PassResult(due=AT_ONCE, pushed=self._pushed)
        now = time.monotonic()
        backoff = replica.backoff_until
        if backoff > now:
            return PassResult(due=backoff, hold=True, pushed=self._pushed)
        due = self._throttled_until
        if mode is ReplicaMode.SYNC and phase is not SyncPhase.IN_SYNC and \
                state in (ReplicaState.ENABLED, ReplicaState.ENABLING):
            # catching up or draining: look again soon, as long as it takes
            due = min(due, now + self.config.replicator_tick) if due is not None else now + self.config.replicator_tick
        return PassResult(due=due, pushed=self._pushed)

    def table(self) -> DynamicTable | None:
        node = self.host.cypress.by_id.get(self.replica.table_id)
        return node.table if node is not None else None

    def replicate_once(self) -> bool:
        """Push at most one batch per tablet; returns True when more work is waiting."""
        table = self.table()
        if table is None:
            return False
        if self.replica.writes_synchronously:
            return False  # fed by the commits themselves (idle tablets' heartbeats: heartbeats.py)
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
            return False
        if not self.throttle_allows(tablet):
            return False
        runs = table.read_queue_tail(tablet, progress.row_index, config.batch_rows)
        if runs is None:  # behind the in-memory tail: from SQL
            with self.host.storage.read() as conn:
                runs = table.read_queue(conn, tablet, progress.row_index, config.batch_rows)
        # the batch is cut at batch_rows rows (the read), batch_bytes bytes or batch_timestamps commits;
        # under a replication_throttler also at its limit, so that no period sends more than the limit
        # (the seed's limit is an average over the period: a burst bigger than one period's budget is not one)
        limit, _ = self.throttler(table)
        byte_cap = min(config.batch_bytes, limit) if limit else config.batch_bytes
        batch, size = cut_batch(runs, byte_cap, config.batch_timestamps)
        if not batch:
            return False
        end = batch[-1].end
        revision, tablet_count = layout(table)
        header = json.dumps({"upstream_replica_id": replica.id, "replica_path": replica.replica_path,
                             "tablet_index": tablet, "prev_row_index": progress.row_index, "row_index": end,
                             "preserve_timestamps": replica.preserve_timestamps, "table_id": table.table_id,
                             "tablet_count": tablet_count, "layout_revision": revision})
        columnar = render_columns(batch, replica.start_replication_timestamp)
        if columnar is not None:
            body = b"".join((header[:-1].encode(), b',"columnar":', columnar, b"}"))
        else:
            changes = render_changes(batch, replica.start_replication_timestamp)
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
        # no fsync of its own (the next durable commit carries it, both storages write one ordered
        # log): a crash may lose it, and then the batch is pushed again from the older position,
        # which the replica answers with its sink record, durable in the transaction that applied
        # the rows. A trim (durable) only follows progress this write made durable with it. One
        # fsync per push per replica was most of the meta's fsyncs: about 8 % of a single-row
        # commit to a table with two async replicas (scale_bench.py, benchmarks/README.md)
        with self.host.storage.write(durable=False, harmless_if_lost=True) as conn:
            save_progress(conn, replica.id, tablet, new_progress.row_index, new_progress.timestamp)
            # in memory once committed (still under the storage writer, as every row index change)
            on_commit(conn, lambda: replica.set_progress(tablet, new_progress))
        self._pushed = True
        self.account_throttle(table, tablet, size)
        metrics.pushes.labels(*labels).inc()
        metrics.rows_pushed.labels(*labels).inc(max(0, new_progress.row_index - progress.row_index))
        replica.clear_errors()
        return new_progress.row_index < queue_end(table, tablet)

    def throttle_allows(self, tablet: int) -> bool:
        budget = self._throttle.get(tablet)
        if budget is None or time.monotonic() >= budget[0]:
            return True
        if self._throttled_until is None or budget[0] < self._throttled_until:
            self._throttled_until = budget[0]  # the pass runs again when the first window opens
        return False

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


_TIMESTAMP = attrgetter("timestamp")


def cut_batch(runs: list[QueueRun], byte_cap: int, max_timestamps: int) -> tuple[list[QueueRun], int]:
    """The batch a push sends of ``runs`` (read from the queue, in order) and its payload size: cut
    at ``byte_cap`` characters of payloads or ``max_timestamps`` commits, but never empty. Most
    reads fit whole: that is told by two passes over the runs (a handful: a run is a commit's
    changes of one kind) before a run is split into its changes."""
    if not runs:
        return [], 0
    size = sum(map(run_size, runs))
    if size <= byte_cap and len(set(map(_TIMESTAMP, runs))) <= max_timestamps:
        return runs, size
    out: list[QueueRun] = []
    size = 0
    stamps: set[int] = set()
    for run in runs:
        if run.timestamp not in stamps and len(stamps) >= max_timestamps:
            break
        whole = run_size(run)
        if size + whole <= byte_cap:
            out.append(run)
            size += whole
            stamps.add(run.timestamp)
            continue
        taken = 0  # the run's changes that fit (the first change of a batch always goes)
        for payload in run.payloads():
            if (out or taken) and size + len(payload) > byte_cap:
                break
            taken += 1
            size += len(payload)
        if taken:
            out.append(run.cut(run.start, run.start + taken))
        break
    return out, size


def render_columns(batch: list[QueueRun], after: int) -> bytes | None:
    """The ``columnar`` form of a push (JSON, ``sink.parse_columnar``), when every change of the
    batch committed after ``after`` is a whole-row write still in the queue's in-memory tail, of
    commits with the same columns (``QueueRun.block``): ``{"columns": [names], "values": [[one
    list per column]], "commits": [[timestamp, count], ...]}``, the commits in order, their changes
    in the order of the values. None for any other batch (it goes as ``entries``).

    Each commit's columns are kept as lists, so a batch's are slices of them (a copy in C) and one
    orjson call; the replica decodes flat lists and checks each column at once instead of a map per
    change (about a fifth of the bytes and a twentieth of the decoding of ``entries``). A column
    null in every row is left out: a whole-row write sets a column it does not name to null, and a
    replica whose schema does not have that column yet takes the batch, as it takes ``entries``
    whose rows do not name it."""
    batch = [run for run in batch if run.timestamp > after]
    if not batch:
        return None
    first = batch[0].block
    if first is None:
        return None
    names = first.names
    rows = sum(run.rows for run in batch)
    if len(batch) == 1:  # (one commit: the usual case)
        lo = batch[0].start - first.start
        values = [column[lo:lo + rows] for column in first.values]
        commits = [[batch[0].timestamp, rows]]
    else:
        values = [[] for _ in names]
        commits = []
        for run in batch:
            block = run.block
            if block is None or block.names != names:
                return None
            lo = run.start - block.start
            for into, column in zip(values, block.values, strict=True):
                into.extend(column[lo:lo + run.rows])
            if commits and commits[-1][0] == run.timestamp:
                commits[-1][1] += run.rows  # (never two runs of one commit; and if so, one commit)
            else:
                commits.append([run.timestamp, run.rows])
    kept = [i for i, column in enumerate(values) if column[0] is not None or column.count(None) != rows]
    if len(kept) != len(names):
        names, values = tuple(names[i] for i in kept), [values[i] for i in kept]
    return orjson.dumps({"columns": names, "values": values, "commits": commits})


def render_changes(batch: list[QueueRun], after: int) -> str:
    """The ``entries`` of a push (without the brackets): ``{"timestamp": T, "kind": K, "payload": P}``
    per change committed after ``after`` (the replica's ``start_replication_timestamp``).

    Queue payloads are JSON already: they are spliced in, never decoded. The changes of a run share
    their timestamp and kind, so each run is one ``str.replace`` of the newlines between its
    payloads (``QueueRun.text``) with the text between two changes, not one format per change."""
    parts: list[str] = []
    for run in batch:
        if run.timestamp <= after:
            continue
        head = f'{{"timestamp":{run.timestamp},"kind":"{run.kind}","payload":'
        parts.append(head + run.text.replace("\n", "}," + head) + "}")
    return ",".join(parts)
