"""The replicator pool: a few worker threads run every replica's passes and heartbeats, when due.

A thread per replica, each waking every ``replicator_tick`` to look at its queue, cost what the
number of replicas costs even with nothing written: 1,000 replicated tables with two async replicas
were 2,000 threads and most of a core, idle. Here the threads are ``replicator_threads`` workers,
and a replica's pass (``Replicator.run_once``: pushes, ends of ``enabling``/``disabling``, the sync
phases) runs only when something makes it due:

* a commit appended rows to its table's queue (``ReplicationManager.after_queue_append`` calls
  :meth:`ReplicatorPool.appended` once the commit is durable): at once, unless it is backing off;
* its last pass left rows waiting: again at once, *behind* the replicas already waiting (the ready
  queue is first in, first out: a busy table takes turns with the others instead of starving them);
* a time its last pass named: its backoff after an error ends, a throttled tablet's window opens,
  a sync replica catching up or draining looks again (``replicator_tick``);
* ``alter_table_replica`` (:meth:`wake`), even during a backoff, so that ``enabling`` and
  ``disabling`` end promptly; and at start, every enabled, enabling or disabling replica once.

A replica is never run by two workers at once: its entry is *queued* (in the ready queue) or
*running* (a worker runs its pass), never both; a wake while it runs marks it to run again once
the pass is over. Times wait in one heap, and idle workers sleep until the earliest of them (or
until woken): with nothing written and nothing due, nothing runs.

Heartbeats (``heartbeats.py``) have due times of their own, on a grid of
``replica_heartbeat_interval`` (its ticks just after the wall clock's whole seconds, which
timestamps count) so that replicas due at about the same time share one *sweep* (one barrier, one
request per replica cluster): at the next tick of the grid after a commit or a push
(a sweep passes over a tablet that got a change within the interval: the heartbeat follows once it
is quiet), then again at that interval while there was traffic since the last barrier or the
replica cluster reports reads of the table's freshness, else ``replica_idle_heartbeat_interval``
later. Sweeps and their requests are jobs for the same workers, taken before passes.

The maintenance jobs (decision delivery, in-doubt resolution, queue trimming) run once a second
on a thread of their own: they wait on the network, and must not hold up the passes.

Locking: ``ReplicatorPool._lock`` (docs/architecture.md, "Lock order") guards the schedule: the
entries, the ready queue, the jobs, the timers, the heartbeat grid and every field of an
``_Entry`` but its replicator. A leaf: nothing is acquired while holding it (the replicas' state is
read before taking it), and it is never held while a pass, a sweep, a request or a maintenance job
runs. It is taken while holding the storage writer (the ``on_commit`` hook of a commit waking the
replicas of its table) or nothing.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..config import EngineConfig
from ..peers import Peers
from ..replica_types import ReplicaState
from ..storage.outages import outage
from . import heartbeats
from .host import ReplicationHost
from .registry import ReplicaRegistry
from .replica import Replica
from .replicator import AT_ONCE, PassResult, Replicator

log = logging.getLogger("reptables.engine.replication")

#: how long after a whole second of the wall clock the ticks of the heartbeat grid fall
_TICK_LAG = 0.02


class _Entry:
    """One replica's place in the schedule; every field but ``replicator`` guarded by the pool's lock."""

    __slots__ = ("replicator", "queued", "running", "again", "urgent", "due", "hold_until", "heartbeat_at",
                 "last_activity", "freshness_wanted")

    def __init__(self, replicator: Replicator) -> None:
        self.replicator = replicator
        #: in the ready queue / a worker runs its pass (never both)
        self.queued = False
        self.running = False
        #: woken while running: run again after the pass (``urgent``: even if it backs off)
        self.again = False
        self.urgent = False
        #: the pass timer (monotonic) in the heap, if any; while backing off, commits do not wake
        #: it before ``hold_until``
        self.due: float | None = None
        self.hold_until = 0.0
        #: the heartbeat grid slot it is in, if any
        self.heartbeat_at: float | None = None
        #: the last commit to its table or push of its rows (monotonic)
        self.last_activity = 0.0
        #: the last heartbeat's answer said its table's freshness is read on its cluster
        self.freshness_wanted = False


class ReplicatorPool:
    """Worker threads running replicas' passes and heartbeats when due; the maintenance thread."""

    def __init__(self, host: ReplicationHost, peers: Peers, registry: ReplicaRegistry, config: EngineConfig,
                 maintenance: Sequence[Callable[[], None]] = ()) -> None:
        self.host = host
        self.peers = peers
        self.registry = registry
        self.config = config
        self.maintenance = list(maintenance)
        #: guards the schedule (every field below up to the threads); a leaf (module docstring)
        self._lock = threading.Lock()
        #: idle workers wait on it for a task or the earliest due time
        self._work = threading.Condition(self._lock)
        self._entries: dict[str, _Entry] = {}
        #: replicas whose pass is due now, first in first out
        self._ready: deque[_Entry] = deque()
        #: other work for the workers (sweeps, requests of heartbeats), taken before passes
        self._jobs: deque[Callable[[], None]] = deque()
        #: (due, sequence, replica id) of pass timers; an entry whose ``due`` differs is stale
        self._timers: list[tuple[float, int, str]] = []
        self._sequence = itertools.count()
        #: heartbeat grid: slot time -> replica ids, and the heap of slot times
        self._slots: dict[float, set[str]] = {}
        self._slot_heap: list[float] = []
        #: replicas whose heartbeat is due, for the next sweep; whether that sweep is queued
        self._sweep_ids: set[str] = set()
        self._sweep_queued = False
        #: wall clock minus monotonic clock when the pool was made (aligns the heartbeat grid)
        self._wall_offset = time.time() - time.monotonic()
        self._stopping = False
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._maintainer: threading.Thread | None = None

    # -- what the manager calls ----------------------------------------------------------------------

    def replicator(self, replica: Replica) -> Replicator:
        """The one replicator of ``replica`` (made on first use)."""
        with self._lock:
            return self._entry(replica).replicator

    def start(self) -> None:
        """Start the workers and the maintenance thread; every replica with something to do is due."""
        now = time.monotonic()
        replicas = [(r, r.state) for r in self.registry.all()]  # (replica locks: before the pool's)
        with self._lock:
            for replica, state in replicas:
                if state in (ReplicaState.ENABLED, ReplicaState.ENABLING, ReplicaState.DISABLING):
                    entry = self._entry(replica)
                    self._wake_entry(entry, urgent=True)
                    if state is not ReplicaState.DISABLING:
                        self._schedule_heartbeat(entry, now)
        for i in range(max(1, self.config.replicator_threads)):
            worker = threading.Thread(target=self._run_worker, name=f"replicator-{i}", daemon=True)
            worker.start()
            self._workers.append(worker)
        self._maintainer = threading.Thread(target=self._maintain, name="replication-maintenance", daemon=True)
        self._maintainer.start()

    def wake(self, replica_id: str) -> None:
        """After ``alter_table_replica``: the replica's pass runs now (even while it backs off), so
        that ``enabling``/``disabling`` end promptly, and its heartbeat is due soon."""
        replica = self.registry.find(replica_id)
        if replica is None:
            self.forget(replica_id)
            return
        with self._lock:
            entry = self._entry(replica)
            self._wake_entry(entry, urgent=True)
            self._schedule_heartbeat(entry, time.monotonic())

    def forget(self, replica_id: str) -> None:
        """A removed replica: no pass of it is started again (one running notices the removal)."""
        with self._lock:
            self._entries.pop(replica_id.lstrip("#"), None)

    def appended(self, fed: Sequence[Replica], synced: Sequence[Replica]) -> None:
        """A commit appended rows to the queue of the table of these replicas, and is durable (the
        ``on_commit`` hook, storage writer held): ``fed`` (replicas fed from the queue, enabled or
        enabling) have rows to push; each is due at once unless it backs off. All of them are due
        for a heartbeat at the next tick of the grid (their freshness after this commit)."""
        now = time.monotonic()
        at = now
        with self._lock:
            if self._stopping:
                return
            for replica in fed:
                entry = self._entry(replica)
                entry.last_activity = now
                self._schedule_heartbeat(entry, at)
                if entry.running:
                    entry.again = True
                elif not entry.queued and entry.hold_until <= now:
                    self._enqueue(entry)
            for replica in synced:
                entry = self._entry(replica)
                entry.last_activity = now
                self._schedule_heartbeat(entry, at)

    def close(self) -> None:
        """Stop: no pass or job starts any more; the workers end after the one they run (each joined)."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        self._stop.set()
        for thread in [*self._workers, *([self._maintainer] if self._maintainer is not None else [])]:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    # -- the schedule (the caller holds _lock) ---------------------------------------------------------

    def _entry(self, replica: Replica) -> _Entry:
        entry = self._entries.get(replica.id)
        if entry is None or entry.replicator.replica is not replica:
            entry = self._entries[replica.id] = _Entry(
                Replicator(replica, self.host, self.peers, self.registry, self.config))
        return entry

    def _enqueue(self, entry: _Entry) -> None:
        entry.queued = True
        self._ready.append(entry)
        self._work.notify()

    def _wake_entry(self, entry: _Entry, urgent: bool) -> None:
        if entry.running:
            entry.again = True
            entry.urgent = entry.urgent or urgent
        elif not entry.queued:
            self._enqueue(entry)

    def _earliest(self) -> float | None:
        timer = self._timers[0][0] if self._timers else None
        slot = self._slot_heap[0] if self._slot_heap else None
        if timer is None or slot is None:
            return slot if timer is None else timer
        return min(timer, slot)

    def _notify_if_earlier(self, due: float) -> None:
        earliest = self._earliest()
        if earliest is None or due < earliest:
            self._work.notify()  # a waiting worker sleeps until this due time instead

    def _set_timer(self, entry: _Entry, due: float) -> None:
        self._notify_if_earlier(due)
        entry.due = due
        heapq.heappush(self._timers, (due, next(self._sequence), entry.replicator.replica.id))

    def _schedule_heartbeat(self, entry: _Entry, at: float) -> None:
        """Due for a heartbeat by ``at`` (its grid slot, the first at or after it); an earlier slot stays."""
        if not entry.replicator.replica.preserve_timestamps:
            return  # its rows take its cluster's timestamps: no freshness to tell
        interval, offset = self.config.replica_heartbeat_interval, self._wall_offset
        # (the grid's ticks fall just after whole seconds of the wall clock, as timestamps count:
        # the commits of the second before a tick are no longer "just sent" at the tick)
        slot = math.ceil((at + offset) / interval) * interval - offset + _TICK_LAG if interval > 0 else at
        if entry.heartbeat_at is not None and entry.heartbeat_at <= slot:
            return
        replica_id = entry.replicator.replica.id
        if entry.heartbeat_at is not None:
            self._slots.get(entry.heartbeat_at, set()).discard(replica_id)
        ids = self._slots.get(slot)
        if ids is None:
            self._notify_if_earlier(slot)
            ids = self._slots[slot] = set()
            heapq.heappush(self._slot_heap, slot)
        ids.add(replica_id)
        entry.heartbeat_at = slot

    def _promote(self, now: float) -> None:
        """Timers that are due make their replicas ready; heartbeat slots that are due, a sweep."""
        while self._timers and self._timers[0][0] <= now:
            due, _, replica_id = heapq.heappop(self._timers)
            entry = self._entries.get(replica_id)
            if entry is None or entry.due != due:
                continue  # stale: the replica ran (or was rescheduled) since
            entry.due, entry.hold_until = None, 0.0
            self._wake_entry(entry, urgent=True)
        while self._slot_heap and self._slot_heap[0] <= now:
            slot = heapq.heappop(self._slot_heap)
            for replica_id in self._slots.pop(slot, ()):
                entry = self._entries.get(replica_id)
                if entry is not None and entry.heartbeat_at == slot:
                    entry.heartbeat_at = None
                    self._sweep_ids.add(replica_id)
        if self._sweep_ids and not self._sweep_queued:
            self._sweep_queued = True
            self._jobs.append(self._sweep)

    def _next_task(self) -> _Entry | Callable[[], None] | None:
        """The next pass or job, waiting for one (None: the pool is stopping)."""
        while not self._stopping:
            now = time.monotonic()
            self._promote(now)
            if self._jobs:
                return self._jobs.popleft()
            if self._ready:
                entry = self._ready.popleft()
                entry.queued, entry.running = False, True
                entry.due, entry.hold_until = None, 0.0  # (the pass says when it is due next)
                return entry
            earliest = self._earliest()
            self._work.wait(None if earliest is None else max(0.0, earliest - now))
        return None

    # -- the workers -----------------------------------------------------------------------------------

    def _run_worker(self) -> None:
        while True:
            with self._lock:
                task = self._next_task()
            if task is None:
                return
            if isinstance(task, _Entry):
                self._run_pass(task)
            else:
                try:
                    task()
                except Exception:  # noqa: BLE001 - a job's failure must not end the worker
                    log.exception("replication job failed")

    def _run_pass(self, entry: _Entry) -> None:
        replicator = entry.replicator
        try:
            result = replicator.run_once()
        except Exception as exc:  # noqa: BLE001 - e.g. saving a transition while the database is away
            away = outage(exc)
            if away is None:
                log.exception("replicator pass failed", extra={"replica_id": replicator.replica.id})
            else:
                log.warning("replicator waits for the database", extra={"replica_id": replicator.replica.id,
                                                                         "error": away})
            result = PassResult(due=time.monotonic() + self.config.soft_backoff, hold=True)
        now = time.monotonic()
        with self._lock:
            entry.running = False
            again, urgent = entry.again, entry.urgent
            entry.again = entry.urgent = False
            if self._stopping:
                return
            if result.removed:
                if self._entries.get(replicator.replica.id) is entry:
                    del self._entries[replicator.replica.id]
                return
            if result.pushed:
                entry.last_activity = now
                self._schedule_heartbeat(entry, now)
            if result.due == AT_ONCE or urgent or (again and not result.hold):
                self._enqueue(entry)
            elif result.due is not None:
                entry.hold_until = result.due if result.hold else 0.0
                self._set_timer(entry, result.due)

    # -- heartbeats --------------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """A job: the heartbeats of every replica due, one barrier for all, a request per cluster."""
        with self._lock:
            ids, self._sweep_ids, self._sweep_queued = self._sweep_ids, set(), False
            entries = {i: self._entries[i] for i in ids if i in self._entries}
        started = time.monotonic()
        try:
            sweep = heartbeats.collect([e.replicator for e in entries.values()], self.host, self.registry,
                                       self.config.replica_heartbeat_interval)
        except Exception as exc:  # noqa: BLE001 - a barrier that timed out, the database away: later
            log.warning("replica heartbeats skipped", extra={"error": outage(exc) or str(exc)[:300]})
            with self._lock:
                for entry in entries.values():
                    self._schedule_heartbeat(entry, started + self.config.replica_heartbeat_interval)
            return
        with self._lock:
            for replica_id in sweep.recent:
                # a tablet passed over for a change just sent: traffic, the next heartbeat soon
                entries[replica_id].last_activity = max(entries[replica_id].last_activity, started)
            for replicator in sweep.waiting:
                self._after_heartbeat(entries[replicator.replica.id], started, None)
            for cluster, items in sweep.batches.items():
                for first in range(0, len(items), heartbeats.HEARTBEATS_PER_REQUEST):
                    chunk = items[first:first + heartbeats.HEARTBEATS_PER_REQUEST]
                    self._jobs.append(functools.partial(self._send, cluster, chunk, started))
                    self._work.notify()

    def _send(self, cluster: str, items: list[tuple[Replicator, dict[str, Any]]], started: float) -> None:
        """A job: one request of heartbeats, then each replica's next heartbeat by its answers."""
        try:
            answers = heartbeats.send(self.peers, cluster, items)
        except Exception:  # noqa: BLE001 - the replicas must get their next heartbeat all the same
            log.exception("replica heartbeats failed", extra={"cluster": cluster})
            answers = None
        within = self.config.replica_idle_heartbeat_interval
        wanted: dict[str, bool | None] = {}
        for i, (replicator, _) in enumerate(items):
            replica_id = replicator.replica.id
            if answers is None:
                wanted.setdefault(replica_id, None)  # unknown: as it was
            else:
                wanted[replica_id] = bool(wanted.get(replica_id)) or heartbeats.freshness_wanted(answers[i], within)
        with self._lock:
            for replica_id, want in wanted.items():
                entry = self._entries.get(replica_id)
                if entry is not None:
                    self._after_heartbeat(entry, started, want)

    def _after_heartbeat(self, entry: _Entry, started: float, wanted: bool | None) -> None:
        """(lock held) The next heartbeat of a replica swept at ``started``: soon while there was
        traffic since (not covered by the barrier) or its freshness is read, else at the idle interval."""
        if wanted is not None:
            entry.freshness_wanted = wanted
        soon = entry.last_activity >= started or entry.freshness_wanted
        # (soon: the next tick of the grid, about one interval after this sweep's)
        interval = self.config.replica_heartbeat_interval / 2 if soon else self.config.replica_idle_heartbeat_interval
        self._schedule_heartbeat(entry, time.monotonic() + interval)

    # -- maintenance -------------------------------------------------------------------------------------

    def _maintain(self) -> None:
        """Decision delivery, in-doubt resolution and queue trimming, once a second."""
        while True:
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
            if self._stop.wait(1.0):
                return
