"""A replica object: one ``table_replica``'s identity, its mutable state and the transitions of it.

A replica's state (mode, state, sync phase, per-tablet progress, errors, backoff) is changed from
several threads: its replicator pushes batches and advances the sync phase, the commit path
advances the progress of sync replicas under the storage writer lock, and ``alter_table_replica``
flips mode and begins a state transition (``enabling``, ``disabling``) that the replicator ends.
So each ``Replica`` owns its state behind its own lock and changes it only through the methods
below; readers (status, ``get_in_sync_replicas``, queue trimming) take copies
(``Replica.snapshot``, ``Replica.progress_of``) instead of iterating dictionaries another thread
is changing. Which replicas exist, and saving a replica's state on its Cypress node, is the
registry's (``registry.py``), which also orders the transitions with the storage writer.

The transitions, each one step under ``Replica._lock`` that checks where the replica stands and
returns whether it moved (a replicator racing an ``alter_table_replica`` finds it moved on):

* ``enabling`` (from ``disabled`` or ``disabling``: :meth:`Replica.begin_enabling`) -> ``enabled``
  after the replicator's first full pass (:meth:`Replica.finish_enabling`); a sync replica is
  ``enabled`` when it starts draining instead (:meth:`Replica.start_draining`);
* ``disabling`` (from ``enabled`` or ``enabling``: :meth:`Replica.begin_disabling`) ->
  ``disabled`` once the replicator has stopped (:meth:`Replica.finish_disabling`);
* a sync replica's phase: catching up (fed from the queue like an async one) -> draining (every
  commit refuses with the retriable 1732) -> in sync (a participant of every commit,
  :meth:`Replica.finish_draining`, checked under the storage writer so that no commit appends
  between the check and the flip). A new mode starts the phase over (:meth:`Replica.set_mode`).

What is tricky: a tablet's ``row_index`` progress changes only while ``Storage.write_lock`` is held
too (the commit path's :meth:`Replica.commit_sync` and its undo on rollback, a replicator's saved
progress), so that the draining check of a sync replica and the commit path see the same queue
tail.

Locking: ``Replica._lock`` is a leaf (docs/architecture.md, "Lock order"): taken while holding the
storage writer and/or ``ReplicaRegistry._lock``, or nothing; nothing is acquired and no I/O is done
while holding it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ..cypress import Node
from ..errors import ErrorCode, YtError
from ..replica_types import ReplicaMode, ReplicaState


class SyncPhase(StrEnum):
    """Where a sync replica is on its way from async feeding to being a commit participant."""

    CATCHING_UP = "catching_up"
    DRAINING = "draining"
    IN_SYNC = "in_sync"


@dataclass
class TabletProgress:
    """How far one replica has one tablet of the replication queue (and its last push error)."""

    row_index: int = 0
    timestamp: int = 0
    error: dict[str, Any] | None = None

    def copy(self) -> TabletProgress:
        # the error dict is replaced, never changed in place: sharing it is safe
        return replace(self)


def history_trimmed_error(replica: Replica | ReplicaSnapshot, trimmed: int) -> YtError:
    """Why a replica that misses history cannot be enabled, and what to do."""
    return YtError(
        f"Cannot enable replica {replica.id} of {replica.table_path}: the history it needs was trimmed — changes "
        f"up to timestamp {trimmed:#x} left the replication queue, and the replica's "
        f"start_replication_timestamp is {replica.start_replication_timestamp:#x}. The replica table needs a "
        "bootstrap copy: copy the table as of a timestamp T >= the trimmed one into the replica table and "
        "create the replica with start_replication_timestamp=T (a TableReplica with spec.bootstrap does this)",
        code=ErrorCode.REPLICA_HISTORY_TRIMMED,
        attributes={"replica_id": replica.id, "trimmed_timestamp": trimmed,
                    "start_replication_timestamp": replica.start_replication_timestamp})


def sync_not_in_sync(replica: Replica | ReplicaSnapshot) -> YtError:
    """The retriable 1732: a sync replica is catching up or draining."""
    return YtError(f"Sync replica {replica.id} of table {replica.table_path} on cluster {replica.cluster_name} "
                   "is not in sync yet; retry", code=ErrorCode.SYNC_REPLICA_NOT_IN_SYNC,
                   attributes={"replica_id": replica.id, "path": replica.table_path, "retriable": True})


def _writes_synchronously(state: ReplicaState, mode: ReplicaMode, phase: SyncPhase | None) -> bool:
    return state is ReplicaState.ENABLED and mode is ReplicaMode.SYNC and phase is SyncPhase.IN_SYNC


@dataclass(frozen=True)
class ReplicaSnapshot:
    """A consistent copy of one replica's state at one moment (what readers work from)."""

    id: str
    table_id: str
    cluster_name: str
    replica_path: str
    table_path: str
    start_replication_timestamp: int
    preserve_timestamps: bool
    atomicity: str
    mode: ReplicaMode
    state: ReplicaState
    phase: SyncPhase | None
    tracker_enabled: bool
    progress: Mapping[int, TabletProgress] = field(default_factory=dict)
    errors: tuple[dict[str, Any], ...] = ()
    backoff_until: float = 0.0
    history_trimmed: int = 0
    created_at: float = 0.0
    enabled_once: bool = False

    @property
    def writes_synchronously(self) -> bool:
        return _writes_synchronously(self.state, self.mode, self.phase)

    def progress_of(self, tablet: int) -> TabletProgress:
        return self.progress.get(tablet) or TabletProgress()

    def attributes(self) -> dict[str, Any]:
        """The user-visible attributes stored on the replica's Cypress node."""
        return {"table_path": self.table_path, "cluster_name": self.cluster_name, "replica_path": self.replica_path,
                "mode": self.mode.value, "state": self.state.value,
                "start_replication_timestamp": self.start_replication_timestamp,
                "preserve_timestamps": self.preserve_timestamps, "atomicity": self.atomicity,
                "enable_replicated_table_tracker": self.tracker_enabled}


class Replica:
    """One ``table_replica``: fixed identity, and mutable state changed only under ``_lock``."""

    def __init__(self, *, id: str, node: Node, table_id: str, cluster_name: str, replica_path: str,
                 mode: ReplicaMode, state: ReplicaState, start_replication_timestamp: int,
                 preserve_timestamps: bool, atomicity: str, tracker_enabled: bool, table_path: str = "",
                 phase: SyncPhase | None = None, progress: dict[int, TabletProgress] | None = None,
                 history_trimmed: int = 0, created_at: float = 0.0, enabled_once: bool = False) -> None:
        # identity: set once, read without a lock
        self.id = id
        self.node = node
        self.table_id = table_id
        self.cluster_name = cluster_name
        self.replica_path = replica_path
        self.start_replication_timestamp = start_replication_timestamp
        self.preserve_timestamps = preserve_timestamps
        self.atomicity = atomicity
        self.table_path = table_path
        #: guards every field below. A leaf: nothing is acquired and no I/O is done while holding it;
        #: it may be taken while holding Storage.write_lock and/or the registry lock.
        self._lock = threading.Lock()
        self._mode = mode
        self._state = state
        self._phase = phase
        self._tracker_enabled = tracker_enabled
        #: tablet -> progress; the objects are replaced or changed only under _lock, and handed out
        #: as copies. Their ``row_index`` changes only while Storage.write_lock is held, too.
        self._progress: dict[int, TabletProgress] = dict(progress or {})
        self._errors: list[dict[str, Any]] = []
        self._backoff_until = 0.0
        #: the timestamp of the newest change after start_replication_timestamp that left the queue
        #: before this replica got it (0: its history is complete). Such a replica cannot be enabled:
        #: its table needs a bootstrap copy (docs/replication.md, "Adding a replica to a table with history")
        self._history_trimmed = history_trimmed
        #: wall-clock creation time; whether it was ever enabled (a replica never enabled pins the
        #: queue for at most bootstrap_pin_ttl)
        self.created_at = created_at
        self._enabled_once = enabled_once

    def __repr__(self) -> str:
        return f"Replica({self.id} of {self.table_path} on {self.cluster_name}:{self.replica_path})"

    # -- reads (consistent copies) ---------------------------------------------------------------------

    def snapshot(self) -> ReplicaSnapshot:
        with self._lock:
            return ReplicaSnapshot(
                id=self.id, table_id=self.table_id, cluster_name=self.cluster_name, replica_path=self.replica_path,
                table_path=self.table_path, start_replication_timestamp=self.start_replication_timestamp,
                preserve_timestamps=self.preserve_timestamps, atomicity=self.atomicity, mode=self._mode,
                state=self._state, phase=self._phase, tracker_enabled=self._tracker_enabled,
                progress={t: p.copy() for t, p in self._progress.items()}, errors=tuple(self._errors),
                backoff_until=self._backoff_until, history_trimmed=self._history_trimmed,
                created_at=self.created_at, enabled_once=self._enabled_once)

    def attributes(self) -> dict[str, Any]:
        return self.snapshot().attributes()

    def progress_of(self, tablet: int) -> TabletProgress:
        with self._lock:
            progress = self._progress.get(tablet)
            return progress.copy() if progress is not None else TabletProgress()

    def flags(self) -> tuple[ReplicaState, ReplicaMode, SyncPhase | None]:
        """State, mode and phase, read together (the commit path's cheap look at a replica)."""
        with self._lock:
            return self._state, self._mode, self._phase

    @property
    def mode(self) -> ReplicaMode:
        with self._lock:
            return self._mode

    @property
    def state(self) -> ReplicaState:
        with self._lock:
            return self._state

    @property
    def phase(self) -> SyncPhase | None:
        with self._lock:
            return self._phase

    @property
    def writes_synchronously(self) -> bool:
        """Enabled, sync and in sync: a participant of every commit to its table."""
        with self._lock:
            return _writes_synchronously(self._state, self._mode, self._phase)

    @property
    def errors(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._errors)

    @property
    def backoff_until(self) -> float:
        with self._lock:
            return self._backoff_until

    @property
    def tracker_enabled(self) -> bool:
        with self._lock:
            return self._tracker_enabled

    @tracker_enabled.setter
    def tracker_enabled(self, value: bool) -> None:
        with self._lock:
            self._tracker_enabled = value

    # -- state changes of alter_table_replica (callers hold the storage writer, then save) ------------

    def set_mode(self, mode: ReplicaMode) -> None:
        """A new mode; a sync replica starts over catching up, an async one has no phase."""
        with self._lock:
            self._mode = mode
            self._phase = SyncPhase.CATCHING_UP if mode is ReplicaMode.SYNC else None

    def begin_enabling(self) -> None:
        """``enabling``, with a clean slate: no errors, no backoff, a sync replica catching up. The
        replicator ends it (:meth:`finish_enabling`, :meth:`start_draining`)."""
        with self._lock:
            self._enabled_once = True
            self._errors = []
            self._backoff_until = 0.0
            self._phase = SyncPhase.CATCHING_UP if self._mode is ReplicaMode.SYNC else None
            self._state = ReplicaState.ENABLING

    def begin_disabling(self) -> None:
        """``disabling``: the replicator ends it once it has stopped (:meth:`finish_disabling`)."""
        with self._lock:
            self._state = ReplicaState.DISABLING

    def finish_enabling(self) -> bool:
        """enabling -> enabled after the replicator's first full pass; False if not enabling, or if
        sync (a sync replica is enabled when it starts draining: :meth:`start_draining`)."""
        with self._lock:
            if self._state is not ReplicaState.ENABLING or self._mode is ReplicaMode.SYNC:
                return False
            self._state = ReplicaState.ENABLED
            return True

    def finish_disabling(self) -> bool:
        """disabling -> disabled once the replicator has stopped; False if not disabling."""
        with self._lock:
            if self._state is not ReplicaState.DISABLING:
                return False
            self._phase = None
            self._state = ReplicaState.DISABLED
            return True

    # -- the replicator's changes ----------------------------------------------------------------------

    def set_progress(self, tablet: int, progress: TabletProgress) -> None:
        """After a push whose new progress is committed (call with the storage writer held)."""
        with self._lock:
            self._progress[tablet] = progress.copy()

    def advance_timestamp(self, tablet: int, barrier: int, queue_end: int) -> None:
        """An idle tablet's replication timestamp moves to ``barrier`` if it still has every row."""
        with self._lock:
            progress = self._progress.setdefault(tablet, TabletProgress())
            if progress.row_index >= queue_end:
                progress.timestamp = max(progress.timestamp, barrier)

    def note_queued(self, tablet: int, start: int, commit_ts: int) -> None:
        """A commit at ``commit_ts`` appended queue rows from ``start`` on to ``tablet`` (call with
        the storage writer held, inside that commit): a replica that had every row before them has
        every change before ``commit_ts`` (commits take their timestamps under the writer, so none
        before it can still append). Its replication timestamp moves to just before the commit, so
        that its lag counts from the first change it lacks, however long the tablet was idle,
        without a timer per replica."""
        with self._lock:
            progress = self._progress.setdefault(tablet, TabletProgress())
            if progress.row_index >= start:
                progress.timestamp = max(progress.timestamp, commit_ts - 1)

    def clear_tablet_error(self, tablet: int) -> None:
        with self._lock:
            progress = self._progress.get(tablet)
            if progress is not None:
                progress.error = None
            else:
                self._progress[tablet] = TabletProgress()

    @property
    def history_trimmed(self) -> int:
        with self._lock:
            return self._history_trimmed

    def mark_history_trimmed(self, timestamp: int) -> None:
        """Changes up to ``timestamp`` this replica needs left the queue (its pin expired)."""
        with self._lock:
            self._history_trimmed = max(self._history_trimmed, timestamp)

    def record_error(self, tablet: int | None, entry: dict[str, Any], backoff_until: float) -> None:
        with self._lock:
            self._errors = [entry]
            if tablet is not None:
                self._progress.setdefault(tablet, TabletProgress()).error = entry
            self._backoff_until = backoff_until

    def clear_errors(self) -> None:
        with self._lock:
            self._errors = []

    def reset_backoff_if_healthy(self) -> None:
        with self._lock:
            if not self._errors:
                self._backoff_until = 0.0

    def start_draining(self) -> bool:
        """catching_up -> draining; False when the replica is no longer catching up.

        An ``enabling`` sync replica becomes ``enabled`` in the same step: from here on every
        commit either fails with the retriable 1732 (draining) or includes it (in sync), so no
        commit passes it by once ``enabled`` is reported. Before, while it catches up, it is fed
        from the queue like an async replica."""
        with self._lock:
            if self._phase is not SyncPhase.CATCHING_UP or \
                    self._state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
                return False
            self._phase = SyncPhase.DRAINING
            self._state = ReplicaState.ENABLED
            return True

    def finish_draining(self, tablet_count: int, queue_end: Callable[[int], int]) -> bool:
        """draining -> in_sync once every tablet has the whole queue. The caller holds the storage
        writer lock, so no commit appends between this check and the flip."""
        with self._lock:
            if self._phase is not SyncPhase.DRAINING or self._mode is not ReplicaMode.SYNC or \
                    self._state is not ReplicaState.ENABLED:
                return False
            if any(self._progress.get(t, TabletProgress()).row_index < queue_end(t) for t in range(tablet_count)):
                return False
            self._phase = SyncPhase.IN_SYNC
            return True

    # -- the commit path's changes (under the storage writer) ---------------------------------------

    def commit_sync(self, tablet: int, start: int, end: int, commit_ts: int) -> tuple[int, int] | None:
        """A commit appended queue rows ``start..end`` of ``tablet`` that this in-sync replica
        received: its progress moves to ``end``. Returns the previous (row index, timestamp), or
        None (nothing changed) if the replica is not in sync or does not stand at ``start``."""
        with self._lock:
            progress = self._progress.setdefault(tablet, TabletProgress())
            if progress.row_index != start or not _writes_synchronously(self._state, self._mode, self._phase):
                return None
            previous = (progress.row_index, progress.timestamp)
            progress.row_index = end
            progress.timestamp = max(progress.timestamp, commit_ts)
            return previous

    def undo_commit_sync(self, tablet: int, previous: tuple[int, int], end: int) -> None:
        """The commit's SQL transaction rolled back: back to where it stood (if still at ``end``)."""
        with self._lock:
            progress = self._progress.get(tablet)
            if progress is not None and progress.row_index == end:
                progress.row_index, progress.timestamp = previous
