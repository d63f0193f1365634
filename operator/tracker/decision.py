"""The replicated table tracker's decision: which replicas of a table should be sync.

Why a pure function. The tracker is a loop — probe clusters, read ``@replicas``, decide, send
``alter_table_replica`` — and every interesting bug lives in the "decide" step. Keeping it free of
I/O and clocks lets each rule from YTsaurus be pinned by a test that builds plain values and checks
the exact commands; the operator owns the probing and the API calls around it. The few facts that
must survive between checks (warm-up, the lag cap, how long a cluster has been bad) live in
``TrackerState``, which is still pure: the caller passes the time in.

The tricky parts, all reproduced from YTsaurus:

* Effective counts: neither option set means exactly one sync replica; only ``max`` means
  ``min = max``; only ``min`` means ``max`` = the number of replicas that can be sync (the tracked
  ones and the sync ones it does not own). Only tracked replicas (enabled, with their own
  ``enable_replicated_table_tracker``) are ever switched.
* Replicas the tracker does not own (opted out with ``enable_replicated_table_tracker = false``, or
  non-atomic) are left in the mode their owner chose, but a *sync* one (enabled or enabling: it takes
  part in every commit) holds one of the table's sync slots. The tracker fills only the slots left
  (``max`` minus those), so the table never has more than ``max_sync_replica_count`` sync replicas
  because of the tracker; when the pinned ones alone exceed ``max``, every tracked sync replica is
  demoted and the summary says so. They count towards ``min`` too. In a collocation a pinned sync
  replica fixes its table's cluster, and the collocated tables follow it there.
* One decision per check, in a fixed order: promote good async replicas, smallest lag first, up to
  ``max``; keep just enough bad sync replicas to stay at ``min`` and demote the rest; demote good
  sync replicas above ``max``; never promote a bad async replica.
* Ranking then swaps sync slots between good replicas only when a better cluster exists — preferred
  clusters first, then the current sync ones — so an empty preference list (or one naming every
  cluster) never moves anything, and a lag change alone never flips a choice.
* Collocated tables are ranked with cluster priorities computed over the whole collocation, so
  they keep their sync replicas on the same clusters and move together. Ties go to the cluster
  whose name sorts first (YTsaurus picks the one that sorts last; either converges).

Where this differs from the letter of YTsaurus, on purpose:

* A warming-up replica (its first check) ignores failures: a sync one counts as good and is kept;
  an async one is not promoted until a real check says it is good. YTsaurus gets the same effect by
  starting every replica "bad" until its first real check, which can demote an extra sync replica
  right after a tracker restart; here nothing moves on a first look.
* With only ``min_sync_replica_count`` set and fewer tracked replicas than ``min``, ``min`` is
  clamped to the tracked count instead of rejected; a disabled replica must not stop the tracker.
* Preferred clusters "set on all tables of a collocation" means: without a collocation option,
  the clusters preferred by every table of the collocation (the intersection) are used, and none at
  all unless each table sets a non-empty list. Collocated tables never diverge because of it.
* The grace for bad health (``max_iterations_without_acceptable_bundle_health``) is applied to the
  whole cluster health result, which here folds bundle health in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple

from reptables.engine.replica_types import ReplicaMode

DEFAULT_SYNC_REPLICA_LAG_THRESHOLD = 600.0
"""Seconds; YTsaurus' default ``sync_replica_lag_threshold`` (10 minutes)."""

DEFAULT_MAX_ITERATIONS_WITHOUT_ACCEPTABLE_HEALTH = 1
"""YTsaurus' default ``max_iterations_without_acceptable_bundle_health``."""


class ReplicaStanding(StrEnum):
    """Where a tracked replica stands in one check: its health crossed with its (target) mode.

    Not the replica's state (``reptables.engine.replica_types.ReplicaState``: enabled, disabled...):
    only enabled replicas are tracked, and the steps of a decision move them between these classes."""

    GOOD_SYNC = "good_sync"
    BAD_SYNC = "bad_sync"
    GOOD_ASYNC = "good_async"
    BAD_ASYNC = "bad_async"

    @property
    def mode(self) -> ReplicaMode:
        return ReplicaMode.SYNC if self in (ReplicaStanding.GOOD_SYNC, ReplicaStanding.BAD_SYNC) else ReplicaMode.ASYNC

    @classmethod
    def of(cls, mode: ReplicaMode, good: bool) -> ReplicaStanding:
        if mode is ReplicaMode.SYNC:
            return cls.GOOD_SYNC if good else cls.BAD_SYNC
        return cls.GOOD_ASYNC if good else cls.BAD_ASYNC


@dataclass(frozen=True)
class TrackedReplica:
    replica_id: str
    cluster: str
    mode: ReplicaMode
    enabled: bool
    tracker_enabled: bool
    """The replica's own ``enable_replicated_table_tracker`` (``replicated_table_tracker_enabled``)."""
    lag: float | None
    """Seconds of ``replication_lag_time``; ``None`` when unknown."""
    table_exists: bool = True
    """The replica table exists on its cluster and is mounted."""
    enabling: bool = False
    """The engine is enabling it (not tracked yet; a sync one already takes part in commits)."""


@dataclass(frozen=True)
class TableOptions:
    """The tracker's part of ``replicated_table_options``."""

    tracker_enabled: bool = False
    min_sync_replica_count: int | None = None
    max_sync_replica_count: int | None = None
    preferred_sync_replica_clusters: tuple[str, ...] = ()
    sync_replica_lag_threshold: float = DEFAULT_SYNC_REPLICA_LAG_THRESHOLD


@dataclass(frozen=True)
class TrackedTable:
    table_id: str
    options: TableOptions
    replicas: tuple[TrackedReplica, ...]
    collocation_id: str | None = None
    collocation_preferred_clusters: tuple[str, ...] | None = None
    """The collocation's own ``preferred_sync_replica_clusters``; when set it overrides the tables'."""


@dataclass(frozen=True)
class ClusterHealth:
    healthy: bool
    """Probe succeeded, not read-only or in safe mode, incoming replication allowed."""
    reason: str = ""
    #: the failure leaves no doubt (the engine's address refused the connection: no process serves
    #: there), so it is not tolerated for a check as a slow or lost probe is
    definitive: bool = False


@dataclass(frozen=True)
class ModeChange:
    table_id: str
    replica_id: str
    cluster: str
    new_mode: ReplicaMode
    reason: str


@dataclass(frozen=True)
class Decision:
    changes: tuple[ModeChange, ...]
    sync_replicas: dict[str, tuple[str, ...]]
    """Table id -> ids of the replicas that are sync once ``changes`` are applied."""
    reasons: dict[str, str]
    """Table id -> a one-line summary for the table's status."""


def effective_sync_counts(options: TableOptions, tracked: int) -> tuple[int, int]:
    """``(min, max)`` sync replicas the tracker maintains for a table with ``tracked`` replicas that can be
    sync (tracked ones, and sync ones it does not own)."""
    low, high = options.min_sync_replica_count, options.max_sync_replica_count
    for name, value in (("min_sync_replica_count", low), ("max_sync_replica_count", high)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
    if high is None:
        return (1, 1) if low is None else (min(low, tracked), tracked)
    if low is None:
        return high, high
    if low > high:
        raise ValueError(f"min_sync_replica_count ({low}) must not exceed max_sync_replica_count ({high})")
    return low, high


def decide(
    tables: Sequence[TrackedTable],
    clusters: Mapping[str, ClusterHealth],
    warming_up: Set[str] = frozenset(),
) -> Decision:
    """Decide the mode of every tracked replica of ``tables``; one call is one tracker check.

    ``clusters`` holds the health of each replica cluster (a cluster missing from it is bad);
    ``warming_up`` the ids of replicas on their first check (see ``TrackerState``). A table whose
    options are invalid gets no changes and says why in ``reasons``.
    """
    plans = [_plan(table, clusters, warming_up) for table in tables]

    collocations: dict[str, list[_Plan]] = {}
    for plan in plans:
        if plan.decided and (plan.candidates or plan.pinned) and plan.table.collocation_id is not None:
            # (also a table whose replicas are all pinned: its sync cluster binds the others)
            collocations.setdefault(plan.table.collocation_id, []).append(plan)
        elif plan.candidates:
            _rank(plan, _cluster_priorities([plan]), frozenset(plan.table.options.preferred_sync_replica_clusters))
    for members in collocations.values():
        priorities = _cluster_priorities(members)
        preferred = _collocation_preferred_clusters(members)
        for plan in members:
            if plan.candidates:
                _rank(plan, priorities, preferred)

    changes: list[ModeChange] = []
    sync_replicas: dict[str, tuple[str, ...]] = {}
    reasons: dict[str, str] = {}
    for plan in plans:
        table_changes = plan.changes()
        changes.extend(table_changes)
        sync_replicas[plan.table.table_id] = plan.sync_replica_ids()
        reasons[plan.table.table_id] = plan.summary(table_changes)
    return Decision(changes=tuple(changes), sync_replicas=sync_replicas, reasons=reasons)


class Observation(NamedTuple):
    """What ``TrackerState.observe`` hands to ``decide``, in ``decide``'s argument order."""

    tables: tuple[TrackedTable, ...]
    clusters: dict[str, ClusterHealth]
    warming_up: frozenset[str]


class TrackerState:
    """The memory of the tracker between checks; call ``observe`` once per check, then ``decide``.

    * Warm-up: a tracked replica seen for the first time is reported in ``warming_up`` once.
    * Lag cap: a replica's lag may grow at most by the time elapsed since its previous value
      (a write to a long-idle tablet makes the raw lag jump although the replica was caught up).
      An unknown lag is passed through and forgets the previous value.
    * Health grace: a cluster's bad health is reported as healthy until it has been bad for more
      than ``max_iterations_without_acceptable_health`` consecutive checks; one good check resets it.
      A definitive failure (a refused connection) is not tolerated.

    State of replicas and clusters no longer observed is dropped.

        state = TrackerState()
        decision = decide(*state.observe(tables, clusters, now=time.monotonic()))
    """

    def __init__(
        self, max_iterations_without_acceptable_health: int = DEFAULT_MAX_ITERATIONS_WITHOUT_ACCEPTABLE_HEALTH
    ) -> None:
        self.max_iterations_without_acceptable_health = max_iterations_without_acceptable_health
        self._checked: set[str] = set()
        self._lags: dict[str, tuple[float, float]] = {}
        self._bad_streaks: dict[str, int] = {}

    def observe(
        self, tables: Iterable[TrackedTable], clusters: Mapping[str, ClusterHealth], now: float
    ) -> Observation:
        present: set[str] = set()
        warming_up: set[str] = set()
        adjusted_tables: list[TrackedTable] = []
        for table in tables:
            adjusted_replicas: list[TrackedReplica] = []
            for replica in table.replicas:
                present.add(replica.replica_id)
                if _is_tracked(table, replica) and replica.replica_id not in self._checked:
                    self._checked.add(replica.replica_id)
                    warming_up.add(replica.replica_id)
                lag = self._cap_lag(replica.replica_id, replica.lag, now)
                adjusted_replicas.append(replica if lag == replica.lag else replace(replica, lag=lag))
            adjusted_tables.append(replace(table, replicas=tuple(adjusted_replicas)))
        self._checked &= present
        self._lags = {replica_id: lag for replica_id, lag in self._lags.items() if replica_id in present}

        adjusted_clusters = {name: self._grace(name, health) for name, health in clusters.items()}
        self._bad_streaks = {name: n for name, n in self._bad_streaks.items() if name in clusters}
        return Observation(tuple(adjusted_tables), adjusted_clusters, frozenset(warming_up))

    def _cap_lag(self, replica_id: str, lag: float | None, now: float) -> float | None:
        if lag is None:
            self._lags.pop(replica_id, None)
            return None
        if replica_id in self._lags:
            previous, at = self._lags[replica_id]
            lag = min(lag, previous + max(0.0, now - at))
        self._lags[replica_id] = (lag, now)
        return lag

    def _grace(self, name: str, health: ClusterHealth) -> ClusterHealth:
        if health.healthy:
            self._bad_streaks[name] = 0
            return health
        streak = self._bad_streaks.get(name, 0) + 1
        self._bad_streaks[name] = streak
        if streak > self.max_iterations_without_acceptable_health or health.definitive:
            return health
        return ClusterHealth(
            healthy=True,
            reason=f"tolerated bad health ({streak} of {self.max_iterations_without_acceptable_health}): "
            f"{health.reason}",
        )


def _is_tracked(table: TrackedTable, replica: TrackedReplica) -> bool:
    return table.options.tracker_enabled and replica.enabled and replica.tracker_enabled


def _is_pinned_sync(table: TrackedTable, replica: TrackedReplica) -> bool:
    """A sync replica the tracker does not own that takes part in commits: it holds a sync slot."""
    return (not _is_tracked(table, replica) and replica.mode is ReplicaMode.SYNC
            and (replica.enabled or replica.enabling))


@dataclass
class _Candidate:
    """A tracked replica while its table is being decided; ``state`` moves as the steps run."""

    replica: TrackedReplica
    state: ReplicaStanding
    problem: str
    """Why the replica is bad (empty when good)."""
    why: str = ""
    """Why ``state`` differs from the replica's current mode, once a step has moved it."""

    def move(self, state: ReplicaStanding, why: str) -> None:
        self.state = state
        self.why = why


@dataclass
class _Plan:
    table: TrackedTable
    note: str = ""
    """Set when the table is not decided at all (tracker off, invalid options, nothing tracked)."""
    counts: tuple[int, int] = (0, 0)
    """The effective ``(min, max)`` of the table, counting the sync replicas it does not own."""
    candidates: list[_Candidate] = field(default_factory=list)
    warming_up: tuple[str, ...] = ()
    pinned: list[TrackedReplica] = field(default_factory=list)
    """Sync replicas the tracker does not own (each holds a sync slot; never switched)."""
    decided: bool = False
    """The tracker applies to the table (on, valid options): its replicas, owned or not, bind a collocation."""

    @property
    def slots(self) -> tuple[int, int]:
        """``(min, max)`` sync replicas among the tracked ones: the counts less the pinned sync replicas."""
        low, high = self.counts
        return max(0, low - len(self.pinned)), max(0, high - len(self.pinned))

    def sync_clusters(self) -> set[str]:
        """Clusters where the table has a sync replica after the count steps (good tracked, or pinned)."""
        return {c.replica.cluster for c in self.in_state(ReplicaStanding.GOOD_SYNC)} | \
            {r.cluster for r in self.pinned}

    def good_clusters(self) -> set[str]:
        """Clusters that could hold the table's sync replica: its sync ones, and its good async ones when
        the tracker has a sync slot to give (with every slot pinned, the table stays where it is pinned)."""
        spare = {c.replica.cluster for c in self.in_state(ReplicaStanding.GOOD_ASYNC)} if self.slots[1] else set()
        return self.sync_clusters() | spare

    def in_state(self, state: ReplicaStanding) -> list[_Candidate]:
        return [c for c in self.candidates if c.state is state]

    def changes(self) -> list[ModeChange]:
        return [
            ModeChange(self.table.table_id, c.replica.replica_id, c.replica.cluster, c.state.mode, c.why)
            for c in self.candidates
            if c.state.mode is not c.replica.mode
        ]

    def sync_replica_ids(self) -> tuple[str, ...]:
        targets = {c.replica.replica_id: c.state.mode for c in self.candidates}
        return tuple(
            r.replica_id for r in self.table.replicas if targets.get(r.replica_id, r.mode) is ReplicaMode.SYNC
        )

    def summary(self, changes: Sequence[ModeChange]) -> str:
        if self.note:
            return self.note
        low, high = self.counts
        clusters = {r.replica_id: r.cluster for r in self.table.replicas}
        sync = ", ".join(f"{rid}@{clusters[rid]}" for rid in self.sync_replica_ids()) or "none"
        parts = [f"sync: {sync} (min {low}, max {high})"]
        if self.pinned:
            pinned = ", ".join(f"{r.replica_id}@{r.cluster}" for r in self.pinned)
            parts.append(f"not owned by the tracker: {pinned} (sync, counted)")
            if len(self.pinned) > high:
                parts.append(f"the {len(self.pinned)} sync replicas the tracker does not own exceed "
                             f"max_sync_replica_count {high}: only their owner can change their mode")
        parts += [f"{c.replica_id} -> {c.new_mode}: {c.reason}" for c in changes]
        parts += [
            f"kept bad sync {c.replica.replica_id} to reach min {low}: {c.problem}"
            for c in self.in_state(ReplicaStanding.BAD_SYNC)
        ]
        if self.warming_up:
            parts.append(f"warming up: {', '.join(self.warming_up)}")
        if not changes:
            parts.append("no changes")
        return "; ".join(parts)


def _plan(table: TrackedTable, clusters: Mapping[str, ClusterHealth], warming_up: Set[str]) -> _Plan:
    """Classify the table's tracked replicas and run the count steps (everything but ranking)."""
    if not table.options.tracker_enabled:
        return _Plan(table, note="replicated table tracker disabled for this table")
    tracked = [r for r in table.replicas if _is_tracked(table, r)]
    pinned = [r for r in table.replicas if _is_pinned_sync(table, r)]
    try:
        low, high = effective_sync_counts(table.options, len(tracked) + len(pinned))
    except ValueError as error:
        return _Plan(table, note=f"invalid replicated_table_options: {error}")
    if not tracked:
        note = "no tracked replicas (all disabled or opted out of the tracker)"
        if pinned:
            note += "; sync, not owned by the tracker: " + ", ".join(f"{r.replica_id}@{r.cluster}" for r in pinned)
        return _Plan(table, note=note, counts=(low, high), pinned=pinned, decided=True)

    plan = _Plan(
        table,
        counts=(low, high),
        candidates=[_assess(r, table.options, clusters, r.replica_id in warming_up) for r in tracked],
        warming_up=tuple(r.replica_id for r in tracked if r.replica_id in warming_up),
        pinned=pinned,
        decided=True,
    )
    # the tracker fills the sync slots its replicas may have: the counts less the pinned sync replicas
    low_slots, high_slots = plan.slots
    because = f" {high} (counting {len(pinned)} sync replica(s) the tracker does not own)" if pinned else f" {high}"

    sync_count = min(high_slots, len(plan.in_state(ReplicaStanding.GOOD_SYNC)))
    promoted = sorted(plan.in_state(ReplicaStanding.GOOD_ASYNC), key=_by_lag)[: max(0, high_slots - sync_count)]
    for c in promoted:
        c.move(ReplicaStanding.GOOD_SYNC,
               f"promoted to reach max_sync_replica_count{because} (lag {c.replica.lag:g}s)")
    sync_count += len(promoted)

    kept_bad = max(0, low_slots - sync_count)
    for c in sorted(plan.in_state(ReplicaStanding.BAD_SYNC), key=_by_lag)[kept_bad:]:
        c.move(ReplicaStanding.BAD_ASYNC, c.problem)

    for c in sorted(plan.in_state(ReplicaStanding.GOOD_SYNC), key=_by_lag)[high_slots:]:
        c.move(ReplicaStanding.GOOD_ASYNC, f"above max_sync_replica_count{because}")
    return plan


def _assess(
    replica: TrackedReplica, options: TableOptions, clusters: Mapping[str, ClusterHealth], warming_up: bool
) -> _Candidate:
    """Health checks in YTsaurus' order; the first failure is the replica's problem."""
    if warming_up:
        if replica.mode is ReplicaMode.SYNC:
            return _Candidate(replica, ReplicaStanding.GOOD_SYNC, "")
        return _Candidate(replica, ReplicaStanding.BAD_ASYNC, "warming up: not promoted before its first check")

    health = clusters.get(replica.cluster)
    threshold = options.sync_replica_lag_threshold
    if health is None:
        problem = f"cluster {replica.cluster} has no health result"
    elif not health.healthy:
        problem = f"cluster {replica.cluster} unhealthy" + (f": {health.reason}" if health.reason else "")
    elif replica.lag is None:
        problem = "replication lag unknown"
    elif replica.lag > threshold:
        problem = f"replication lag {replica.lag:g}s above sync_replica_lag_threshold {threshold:g}s"
    elif not replica.table_exists:
        problem = f"replica table on cluster {replica.cluster} is missing or unmounted"
    else:
        problem = ""
    return _Candidate(replica, ReplicaStanding.of(replica.mode, good=not problem), problem)


def _by_lag(c: _Candidate) -> tuple[bool, float, str, str]:
    lag = c.replica.lag
    return lag is None, lag or 0.0, c.replica.cluster, c.replica.replica_id


def _cluster_priorities(plans: Sequence[_Plan]) -> dict[str, int]:
    """2 for a cluster that is good sync for every table, 1 for one that is good for every table."""
    good: set[str] | None = None
    good_sync: set[str] | None = None
    for plan in plans:
        table_sync = plan.sync_clusters()
        table_good = plan.good_clusters()
        good = table_good if good is None else good & table_good
        good_sync = table_sync if good_sync is None else good_sync & table_sync
    return {cluster: 2 if cluster in (good_sync or set()) else 1 for cluster in good or set()}


def _collocation_preferred_clusters(members: Sequence[_Plan]) -> frozenset[str]:
    for plan in members:
        if plan.table.collocation_preferred_clusters is not None:
            return frozenset(plan.table.collocation_preferred_clusters)
    lists = [frozenset(plan.table.options.preferred_sync_replica_clusters) for plan in members]
    if not all(lists):
        return frozenset()
    return frozenset.intersection(*lists)


def _rank(plan: _Plan, priorities: Mapping[str, int], preferred: frozenset[str]) -> None:
    """Give the sync slots of good replicas to the best-ranked clusters.

    Rank: good sync on a preferred cluster (4) > good async on a preferred cluster (3) > good sync (2)
    > good async (1) > a cluster not good for the whole collocation (0); ties by cluster name. The
    number of sync slots is the one the count steps settled on; bad replicas take no part.
    """
    sync = plan.in_state(ReplicaStanding.GOOD_SYNC)
    spare = plan.in_state(ReplicaStanding.GOOD_ASYNC)
    if not sync or not spare:
        return

    def score(c: _Candidate) -> int:
        base = priorities.get(c.replica.cluster, 0)
        return base + 2 if base and c.replica.cluster in preferred else base

    ranked = sorted(
        sync + spare,
        key=lambda c: (-score(c), c.replica.cluster, c.state is not ReplicaStanding.GOOD_SYNC, c.replica.replica_id),
    )
    winners, losers = ranked[: len(sync)], ranked[len(sync) :]
    promoted = [c for c in winners if c.state is ReplicaStanding.GOOD_ASYNC]
    if not promoted:
        return
    new_clusters = ", ".join(sorted({c.replica.cluster for c in promoted}))
    if any(c.replica.cluster in preferred for c in promoted):
        basis = "preferred_sync_replica_clusters"
    else:
        basis = f"collocation {plan.table.collocation_id} keeps its sync replicas together"
    for c in promoted:
        c.move(ReplicaStanding.GOOD_SYNC, f"cluster {c.replica.cluster} ranks higher ({basis})")
    for c in losers:
        if c.state is ReplicaStanding.GOOD_SYNC:
            c.move(ReplicaStanding.GOOD_ASYNC, f"sync moves to cluster {new_clusters} ({basis})")
