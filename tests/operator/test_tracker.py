"""The replicated table tracker's decision, one behaviour per test (scenarios from YTsaurus' tests first)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reptables.operator.tracker.decision import (
    ClusterHealth,
    Decision,
    ModeChange,
    ReplicaMode,
    TableOptions,
    TrackedReplica,
    TrackedTable,
    TrackerState,
    decide,
    effective_sync_counts,
)

SYNC, ASYNC = ReplicaMode.SYNC, ReplicaMode.ASYNC
TRACKED = TableOptions(tracker_enabled=True)


def rep(replica_id: str, cluster: str, mode: ReplicaMode = ASYNC, lag: float | None = 0.0, *, enabled: bool = True,
        tracker_enabled: bool = True, table_exists: bool = True) -> TrackedReplica:
    return TrackedReplica(replica_id, cluster, mode, enabled, tracker_enabled, lag, table_exists)


def table(*replicas: TrackedReplica, table_id: str = "t", options: TableOptions = TRACKED,
          collocation_id: str | None = None,
          collocation_preferred_clusters: tuple[str, ...] | None = None) -> TrackedTable:
    return TrackedTable(table_id, options, replicas, collocation_id, collocation_preferred_clusters)


def healthy(*names: str, down: dict[str, str] | None = None) -> dict[str, ClusterHealth]:
    health = {name: ClusterHealth(True) for name in names}
    health.update({name: ClusterHealth(False, reason) for name, reason in (down or {}).items()})
    return health


def moves(decision: Decision) -> set[tuple[str, ReplicaMode]]:
    return {(c.replica_id, c.new_mode) for c in decision.changes}


def applied(tables: tuple[TrackedTable, ...], decision: Decision) -> tuple[TrackedTable, ...]:
    """The tables as they are once the decision's commands have run."""
    new_mode = {(c.table_id, c.replica_id): c.new_mode for c in decision.changes}
    return tuple(
        replace(t, replicas=tuple(replace(r, mode=new_mode.get((t.table_id, r.replica_id), r.mode))
                                  for r in t.replicas))
        for t in tables
    )


def sync_count(decision: Decision, table_id: str = "t") -> int:
    return len(decision.sync_replicas[table_id])


# Scenarios asserted by YTsaurus' own tests


def test_healthy_async_replica_is_promoted_when_there_is_no_sync_replica():
    decision = decide([table(rep("r1", "a"))], healthy("a"))

    assert decision.changes == (ModeChange("t", "r1", "a", SYNC, decision.changes[0].reason),)
    assert "promoted" in decision.changes[0].reason
    assert decision.sync_replicas == {"t": ("r1",)}


def test_removed_or_unmounted_sync_replica_table_is_demoted_and_another_promoted():
    t = table(rep("r1", "a", SYNC, table_exists=False), rep("r2", "b"))

    decision = decide([t], healthy("a", "b"))

    assert moves(decision) == {("r1", ASYNC), ("r2", SYNC)}
    assert decision.sync_replicas == {"t": ("r2",)}
    demotion = next(c for c in decision.changes if c.replica_id == "r1")
    assert demotion.reason == "replica table on cluster a is missing or unmounted"


def test_sync_replica_cluster_down_demotes_it_and_promotes_another():
    t = table(rep("r0", "remote_0", SYNC), rep("r1", "remote_1"))

    decision = decide([t], healthy("remote_1", down={"remote_0": "probe timed out"}))

    assert moves(decision) == {("r0", ASYNC), ("r1", SYNC)}
    assert decision.sync_replicas == {"t": ("r1",)}
    demotion = next(c for c in decision.changes if c.replica_id == "r0")
    assert demotion == ModeChange("t", "r0", "remote_0", ASYNC, "cluster remote_0 unhealthy: probe timed out")


def test_min_sync_replica_count_two_makes_two_sync_replicas():
    t = table(rep("r1", "a"), rep("r2", "b"), options=replace(TRACKED, min_sync_replica_count=2))

    decision = decide([t], healthy("a", "b"))

    assert moves(decision) == {("r1", SYNC), ("r2", SYNC)}


def test_min_two_max_four_keeps_four_sync_while_four_are_healthy_then_never_drops_below_two():
    options = replace(TRACKED, min_sync_replica_count=2, max_sync_replica_count=4)
    clusters = healthy("c0", "c1", "c2", "c3", "c4")
    tables = (table(*(rep(f"r{i}", f"c{i}") for i in range(5)), options=options),)

    decision = decide(tables, clusters)
    assert moves(decision) == {("r0", SYNC), ("r1", SYNC), ("r2", SYNC), ("r3", SYNC)}
    tables = applied(tables, decision)

    def break_tables(*ids: str) -> None:
        nonlocal tables
        tables = (replace(tables[0], replicas=tuple(replace(r, table_exists=False) if r.replica_id in ids else r
                                                    for r in tables[0].replicas)),)

    break_tables("r0")
    decision = decide(tables, clusters)
    assert moves(decision) == {("r0", ASYNC), ("r4", SYNC)}
    assert sync_count(decision) == 4
    tables = applied(tables, decision)

    break_tables("r1", "r2")
    decision = decide(tables, clusters)
    assert moves(decision) == {("r1", ASYNC), ("r2", ASYNC)}
    assert decision.sync_replicas == {"t": ("r3", "r4")}
    tables = applied(tables, decision)

    break_tables("r3")
    decision = decide(tables, clusters)
    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r3", "r4")}
    assert "kept bad sync r3 to reach min 2" in decision.reasons["t"]


def test_min_three_max_four_with_three_broken_keeps_two_healthy_and_one_bad_sync_stable():
    options = replace(TRACKED, min_sync_replica_count=3, max_sync_replica_count=4)
    replicas = [rep(f"r{i}", f"c{i}", SYNC if i < 4 else ASYNC) for i in range(5)]
    broken = {"r0", "r1", "r2"}
    tables = (table(*(replace(r, table_exists=r.replica_id not in broken) for r in replicas), options=options),)
    clusters = healthy("c0", "c1", "c2", "c3", "c4")

    decision = decide(tables, clusters)
    assert moves(decision) == {("r1", ASYNC), ("r2", ASYNC), ("r4", SYNC)}
    assert decision.sync_replicas == {"t": ("r0", "r3", "r4")}

    decision = decide(applied(tables, decision), clusters)
    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r0", "r3", "r4")}
    assert "kept bad sync r0 to reach min 3" in decision.reasons["t"]


def test_sync_replica_moves_to_preferred_cluster_and_follows_option_change():
    clusters = healthy("a", "b", "c")
    replicas = (rep("ra", "a", SYNC), rep("rb", "b"), rep("rc", "c"))
    tables = (table(*replicas, options=replace(TRACKED, preferred_sync_replica_clusters=("b",))),)

    decision = decide(tables, clusters)
    assert moves(decision) == {("ra", ASYNC), ("rb", SYNC)}
    assert {c.reason for c in decision.changes} == {
        "cluster b ranks higher (preferred_sync_replica_clusters)",
        "sync moves to cluster b (preferred_sync_replica_clusters)",
    }
    tables = applied(tables, decision)
    assert decide(tables, clusters).changes == ()

    tables = (replace(tables[0], options=replace(TRACKED, preferred_sync_replica_clusters=("c",))),)
    decision = decide(tables, clusters)
    assert moves(decision) == {("rb", ASYNC), ("rc", SYNC)}


def test_collocated_tables_converge_to_the_same_sync_cluster_and_move_together():
    def collocated(table_id: str, sync_cluster: str, lags: dict[str, float]) -> TrackedTable:
        return table(*(rep(f"{table_id}-{c}", c, SYNC if c == sync_cluster else ASYNC, lag) for c, lag in lags.items()),
                     table_id=table_id, collocation_id="col")

    clusters = healthy("a", "b", "c")
    tables = (collocated("t1", "a", {"a": 0, "b": 1, "c": 1}), collocated("t2", "b", {"a": 1, "b": 0, "c": 1}))

    decision = decide(tables, clusters)
    assert moves(decision) == {("t2-b", ASYNC), ("t2-a", SYNC)}
    assert decision.sync_replicas == {"t1": ("t1-a",), "t2": ("t2-a",)}
    tables = applied(tables, decision)
    assert decide(tables, clusters).changes == ()

    # t1's replica on a disappears: t1 leaves a, and t2 follows it although its own replica on a is fine.
    # t1's replica on c has the smaller lag, but the collocation's tie goes to cluster b for both.
    tables = (replace(tables[0], replicas=tuple(
        replace(r, table_exists=r.cluster != "a", lag={"a": 0, "b": 5, "c": 1}[r.cluster])
        for r in tables[0].replicas)), tables[1])
    decision = decide(tables, clusters)
    assert moves(decision) == {("t1-a", ASYNC), ("t1-b", SYNC), ("t2-a", ASYNC), ("t2-b", SYNC)}
    assert decision.sync_replicas == {"t1": ("t1-b",), "t2": ("t2-b",)}
    assert decide(applied(tables, decision), clusters).changes == ()


def test_disabled_replica_is_never_switched():
    t = table(rep("r1", "a", enabled=False), rep("r2", "b", SYNC, enabled=False))

    decision = decide([t], healthy("a", down={"b": "probe timed out"}))

    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r2",)}
    assert decision.reasons["t"].startswith("no tracked replicas")


def test_replica_with_tracking_disabled_is_never_switched_but_its_sync_mode_counts():
    """r1 is pinned sync (its owner's choice, even on a bad cluster): it holds the one sync slot, so the
    tracker demotes its own sync replica rather than keep two."""
    t = table(rep("r1", "a", SYNC, tracker_enabled=False), rep("r2", "b", SYNC), rep("r3", "c"))

    decision = decide([t], healthy("b", "c", down={"a": "safe mode"}))

    assert moves(decision) == {("r2", ASYNC)}
    assert decision.changes[0].reason == ("above max_sync_replica_count 1 (counting 1 sync replica(s) the tracker "
                                          "does not own)")
    assert decision.sync_replicas == {"t": ("r1",)}


def test_table_with_tracking_disabled_is_never_switched():
    t = table(rep("r1", "a", SYNC), rep("r2", "b"), options=TableOptions())

    decision = decide([t], healthy("b", down={"a": "probe timed out"}))

    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r1",)}
    assert decision.reasons["t"] == "replicated table tracker disabled for this table"


def test_lower_lag_async_replica_is_promoted_and_not_flipped_later():
    clusters = healthy("a", "b")
    tables = (table(rep("ra", "a", lag=30.0), rep("rb", "b", lag=5.0)),)

    decision = decide(tables, clusters)
    assert moves(decision) == {("rb", SYNC)}
    tables = applied(tables, decision)

    tables = (replace(tables[0], replicas=(rep("ra", "a", lag=0.0), rep("rb", "b", SYNC, lag=20.0))),)
    assert decide(tables, clusters).changes == ()


def test_recovered_cluster_replica_is_promoted_again_when_needed():
    tables = (table(rep("ra", "a", SYNC), rep("rb", "b")),)

    decision = decide(tables, healthy("b", down={"a": "probe timed out"}))
    assert moves(decision) == {("ra", ASYNC), ("rb", SYNC)}
    tables = applied(tables, decision)

    assert decide(tables, healthy("a", "b")).changes == ()

    decision = decide(tables, healthy("a", down={"b": "read-only"}))
    assert moves(decision) == {("rb", ASYNC), ("ra", SYNC)}


# Effective sync counts


def test_counts_default_to_exactly_one_sync_replica():
    assert effective_sync_counts(TableOptions(), tracked=5) == (1, 1)


def test_only_max_sets_min_to_max():
    assert effective_sync_counts(TableOptions(max_sync_replica_count=3), tracked=5) == (3, 3)


def test_only_min_sets_max_to_the_tracked_replica_count():
    assert effective_sync_counts(TableOptions(min_sync_replica_count=2), tracked=5) == (2, 5)


def test_only_min_above_the_tracked_count_is_clamped_not_rejected():
    assert effective_sync_counts(TableOptions(min_sync_replica_count=3), tracked=2) == (2, 2)


def test_min_above_max_is_rejected():
    with pytest.raises(ValueError, match=r"min_sync_replica_count \(3\) must not exceed max_sync_replica_count \(2\)"):
        effective_sync_counts(TableOptions(min_sync_replica_count=3, max_sync_replica_count=2), tracked=5)


def test_negative_count_is_rejected():
    with pytest.raises(ValueError, match="max_sync_replica_count must not be negative"):
        effective_sync_counts(TableOptions(max_sync_replica_count=-1), tracked=5)


def test_table_with_invalid_counts_is_left_alone_and_says_why():
    options = replace(TRACKED, min_sync_replica_count=3, max_sync_replica_count=2)
    decision = decide([table(rep("r1", "a"), options=options)], healthy("a"))

    assert decision.changes == ()
    assert decision.reasons["t"].startswith("invalid replicated_table_options: min_sync_replica_count (3)")


# Health and the count steps


def test_lag_above_threshold_or_unknown_makes_a_replica_bad():
    options = replace(TRACKED, sync_replica_lag_threshold=60.0)
    t = table(rep("r1", "a", SYNC, lag=61.0), rep("r2", "b", lag=None), rep("r3", "c", lag=60.0), options=options)

    decision = decide([t], healthy("a", "b", "c"))

    assert moves(decision) == {("r1", ASYNC), ("r3", SYNC)}
    assert decision.changes[0].reason == "replication lag 61s above sync_replica_lag_threshold 60s"


def test_cluster_without_health_result_is_bad():
    decision = decide([table(rep("r1", "a", SYNC), rep("r2", "b"))], healthy("b"))

    assert decision.changes[0] == ModeChange("t", "r1", "a", ASYNC, "cluster a has no health result")


def test_bad_async_replica_is_never_promoted():
    t = table(rep("r1", "a", SYNC, table_exists=False), rep("r2", "b", lag=None))

    decision = decide([t], healthy("a", "b"))

    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r1",)}


def test_good_sync_replicas_above_max_are_demoted():
    t = table(rep("r1", "a", SYNC), rep("r2", "b", SYNC), rep("r3", "c", SYNC),
              options=replace(TRACKED, max_sync_replica_count=2))

    decision = decide([t], healthy("a", "b", "c"))

    assert decision.changes == (ModeChange("t", "r3", "c", ASYNC, "above max_sync_replica_count 2"),)


# No churn without a health change


@pytest.mark.parametrize("preferred", [(), ("a", "b", "c")], ids=["empty", "every-cluster"])
def test_preferred_list_that_is_empty_or_names_every_cluster_causes_no_churn(preferred: tuple[str, ...]):
    t = table(rep("rb", "b", SYNC, lag=0.0), rep("ra", "a", lag=0.0), rep("rc", "c", lag=0.0),
              options=replace(TRACKED, preferred_sync_replica_clusters=preferred))

    assert decide([t], healthy("a", "b", "c")).changes == ()


def test_lag_changes_alone_never_switch_a_healthy_sync_replica():
    clusters = healthy("a", "b", "c")
    for lags in [(0.0, 0.0, 0.0), (50.0, 0.0, 0.0), (500.0, 1.0, 2.0), (599.0, 0.0, 600.0)]:
        t = table(*(rep(f"r{c}", c, SYNC if c == "b" else ASYNC, lag) for c, lag in zip("bac", lags, strict=True)))
        assert decide([t], clusters).changes == (), lags


@pytest.mark.parametrize("tables", [
    (table(rep("r1", "a"), rep("r2", "b"), rep("r3", "c")),),
    (table(rep("r1", "a", SYNC, table_exists=False), rep("r2", "b"), rep("r3", "c", lag=None)),),
    (table(rep("r1", "a"), rep("r2", "b"), rep("r3", "c"), options=replace(TRACKED, min_sync_replica_count=2)),),
    (table(rep("r1", "a", SYNC), rep("r2", "b", SYNC), rep("r3", "c"),
           options=replace(TRACKED, preferred_sync_replica_clusters=("c",))),),
    (table(rep("x1", "a", SYNC), rep("x2", "b"), table_id="x", collocation_id="col"),
     table(rep("y1", "a"), rep("y2", "b", SYNC), table_id="y", collocation_id="col")),
], ids=["promote", "replace-bad", "min-two", "preferred", "collocation"])
def test_an_applied_decision_is_stable(tables: tuple[TrackedTable, ...]):
    clusters = healthy("a", "b", "c")
    decision = decide(tables, clusters)
    assert decision.changes

    again = decide(applied(tables, decision), clusters)

    assert again.changes == ()
    assert again.sync_replicas == decision.sync_replicas


# Collocations and preferred clusters


def test_preferred_clusters_on_only_some_collocated_tables_have_no_effect():
    preferring_b = replace(TRACKED, preferred_sync_replica_clusters=("b",))
    tables = (table(rep("x1", "a", SYNC), rep("x2", "b"), table_id="x", collocation_id="col", options=preferring_b),
              table(rep("y1", "a", SYNC), rep("y2", "b"), table_id="y", collocation_id="col"))

    assert decide(tables, healthy("a", "b")).changes == ()

    tables = (tables[0], replace(tables[1], options=preferring_b))
    assert moves(decide(tables, healthy("a", "b"))) == {("x1", ASYNC), ("x2", SYNC), ("y1", ASYNC), ("y2", SYNC)}


def test_collocation_preferred_clusters_override_the_tables_option():
    options = replace(TRACKED, preferred_sync_replica_clusters=("a",))
    tables = tuple(table(rep(f"{n}1", "a", SYNC), rep(f"{n}2", "b"), table_id=n, options=options,
                         collocation_id="col", collocation_preferred_clusters=("b",)) for n in "xy")

    decision = decide(tables, healthy("a", "b"))

    assert moves(decision) == {("x1", ASYNC), ("x2", SYNC), ("y1", ASYNC), ("y2", SYNC)}


def test_collocation_avoids_a_cluster_that_is_bad_for_one_of_its_tables():
    tables = (table(rep("x1", "a"), rep("x2", "b"), table_id="x", collocation_id="col"),
              table(rep("y1", "a", lag=None), rep("y2", "b", lag=9.0), table_id="y", collocation_id="col"))

    decision = decide(tables, healthy("a", "b"))

    assert decision.sync_replicas == {"x": ("x2",), "y": ("y2",)}


# Warm-up


def test_first_check_of_a_replica_only_clears_its_warm_up():
    state = TrackerState()
    tables = [table(rep("r1", "a", SYNC), rep("r2", "b"))]
    clusters = healthy("b", down={"a": "probe timed out"})

    first = state.observe(tables, clusters, now=0.0)
    assert first.warming_up == {"r1", "r2"}
    assert state.observe(tables, clusters, now=1.0).warming_up == set()


def test_warming_up_sync_replica_on_a_bad_cluster_is_not_demoted():
    t = table(rep("r1", "a", SYNC), rep("r2", "b"))

    decision = decide([t], healthy("b", down={"a": "probe timed out"}), warming_up={"r1", "r2"})

    assert decision.changes == ()
    assert "warming up: r1, r2" in decision.reasons["t"]


def test_warming_up_async_replica_is_not_promoted_before_its_first_check():
    t = table(rep("r1", "a"), rep("r2", "b"))

    assert decide([t], healthy("a", "b"), warming_up={"r1", "r2"}).changes == ()
    assert moves(decide([t], healthy("a", "b"), warming_up={"r1"})) == {("r2", SYNC)}


def test_replica_added_later_warms_up_on_its_own_first_check():
    state = TrackerState()
    state.observe([table(rep("r1", "a", SYNC))], healthy("a"), now=0.0)

    observed = state.observe([table(rep("r1", "a", SYNC), rep("r2", "b"))], healthy("a", "b"), now=1.0)

    assert observed.warming_up == {"r2"}


def test_untracked_replica_does_not_use_up_its_warm_up():
    state = TrackerState()
    state.observe([table(rep("r1", "a", enabled=False))], healthy("a"), now=0.0)

    assert state.observe([table(rep("r1", "a"))], healthy("a"), now=1.0).warming_up == {"r1"}


# Lag cap


def test_lag_is_capped_at_previous_lag_plus_elapsed_time():
    state = TrackerState()
    state.observe([table(rep("r1", "a", lag=2.0))], healthy("a"), now=100.0)

    observed = state.observe([table(rep("r1", "a", lag=3600.0))], healthy("a"), now=103.0)
    assert observed.tables[0].replicas[0].lag == 5.0

    observed = state.observe([table(rep("r1", "a", lag=1.0))], healthy("a"), now=104.0)
    assert observed.tables[0].replicas[0].lag == 1.0


def test_unknown_lag_passes_through_and_resets_the_cap():
    state = TrackerState()
    state.observe([table(rep("r1", "a", lag=2.0))], healthy("a"), now=0.0)
    assert state.observe([table(rep("r1", "a", lag=None))], healthy("a"), now=1.0).tables[0].replicas[0].lag is None

    assert state.observe([table(rep("r1", "a", lag=900.0))], healthy("a"), now=2.0).tables[0].replicas[0].lag == 900.0


def test_capped_lag_keeps_an_idle_replica_in_sync():
    state = TrackerState()
    tables = [table(rep("r1", "a", SYNC, lag=0.0), rep("r2", "b", lag=0.0))]
    state.observe(tables, healthy("a", "b"), now=0.0)

    tables = [table(rep("r1", "a", SYNC, lag=7200.0), rep("r2", "b", lag=0.0))]
    assert decide(*state.observe(tables, healthy("a", "b"), now=3.0)).changes == ()


# Health persistence


def test_bad_cluster_health_is_acted_on_only_after_it_persists():
    state = TrackerState()
    tables = [table(rep("r1", "a", SYNC), rep("r2", "b"))]
    state.observe(tables, healthy("a", "b"), now=0.0)
    down = healthy("b", down={"a": "probe timed out"})

    first_bad = state.observe(tables, down, now=1.0)
    assert first_bad.clusters["a"].healthy
    assert decide(*first_bad).changes == ()

    decision = decide(*state.observe(tables, down, now=2.0))
    assert moves(decision) == {("r1", ASYNC), ("r2", SYNC)}
    assert next(c for c in decision.changes if c.replica_id == "r1").reason == (
        "cluster a unhealthy: probe timed out")


def test_one_good_check_resets_the_bad_health_streak():
    state = TrackerState()
    down, up = healthy(down={"a": "safe mode"}), healthy("a")

    assert state.observe([], down, now=0.0).clusters["a"].healthy
    assert state.observe([], up, now=1.0).clusters["a"].healthy
    assert state.observe([], down, now=2.0).clusters["a"].healthy
    assert not state.observe([], down, now=3.0).clusters["a"].healthy


def test_a_refused_connection_is_acted_on_at_once():
    """A cluster whose engine refuses connections is certainly down (no process at its address): the
    first such probe demotes its sync replica, where a timeout is tolerated once."""
    state = TrackerState()
    tables = [table(rep("r1", "a", SYNC), rep("r2", "b"))]
    state.observe(tables, healthy("a", "b"), now=0.0)
    refused = {"a": ClusterHealth(False, "probe failed: ConnectError (connection refused)", definitive=True),
               "b": ClusterHealth(True)}
    decision = decide(*state.observe(tables, refused, now=0.2))
    assert moves(decision) == {("r1", ASYNC), ("r2", SYNC)}


def test_health_grace_is_configurable():
    state = TrackerState(max_iterations_without_acceptable_health=0)

    assert not state.observe([], healthy(down={"a": "read-only"}), now=0.0).clusters["a"].healthy


# Replicas the tracker does not own (docs/operations.md, "Replicas the tracker does not own")


def test_a_pinned_sync_replica_fills_max_so_the_tracked_replica_is_not_promoted():
    """Issue 26: two replicas managed by hand (one sync, one async) and a tracked third, max 1."""
    options = replace(TRACKED, min_sync_replica_count=1, max_sync_replica_count=1)
    t = table(rep("r0", "c0", SYNC, tracker_enabled=False), rep("r1", "c1", tracker_enabled=False), rep("r2", "c2"),
              options=options)

    decision = decide([t], healthy("c0", "c1", "c2"))

    assert decision.changes == ()
    assert decision.sync_replicas == {"t": ("r0",)}
    assert "not owned by the tracker: r0@c0 (sync, counted)" in decision.reasons["t"]


def test_pinned_async_replicas_leave_the_sync_slot_to_the_tracker():
    t = table(rep("r0", "c0", tracker_enabled=False), rep("r1", "c1", tracker_enabled=False), rep("r2", "c2"))

    decision = decide([t], healthy("c0", "c1", "c2"))

    assert moves(decision) == {("r2", SYNC)}


def test_a_tracked_sync_replica_is_demoted_when_a_pinned_one_takes_the_slot():
    """The owner of r1 makes it sync by hand while the tracker's r0 is sync: r0 goes back to async."""
    t = table(rep("r0", "a", SYNC), rep("r1", "b", SYNC, tracker_enabled=False), rep("r2", "c"))

    decision = decide([t], healthy("a", "b", "c"))

    assert moves(decision) == {("r0", ASYNC)}
    assert decide(applied((t,), decision), healthy("a", "b", "c")).changes == ()


def test_pinned_sync_replicas_above_max_demote_every_tracked_one_and_say_why():
    options = replace(TRACKED, max_sync_replica_count=1)
    t = table(rep("p0", "a", SYNC, tracker_enabled=False), rep("p1", "b", SYNC, tracker_enabled=False),
              rep("r2", "c", SYNC), rep("r3", "d"), options=options)

    decision = decide([t], healthy("a", "b", "c", "d"))

    assert moves(decision) == {("r2", ASYNC)}
    assert decision.sync_replicas == {"t": ("p0", "p1")}
    assert ("the 2 sync replicas the tracker does not own exceed max_sync_replica_count 1: only their owner can "
            "change their mode") in decision.reasons["t"]


def test_pinned_sync_replicas_count_towards_min():
    """min = max = 2 with one pinned sync: the tracker keeps one more, a good one before a bad one."""
    options = replace(TRACKED, min_sync_replica_count=2, max_sync_replica_count=2)
    t = table(rep("p", "a", SYNC, tracker_enabled=False), rep("bad", "b", SYNC, table_exists=False), rep("good", "c"),
              options=options)

    decision = decide([t], healthy("a", "b", "c"))

    assert moves(decision) == {("good", SYNC), ("bad", ASYNC)}
    assert decision.sync_replicas == {"t": ("p", "good")}


def test_a_pinned_sync_replica_being_enabled_already_holds_its_slot():
    enabling = replace(rep("p", "a", SYNC, enabled=False, tracker_enabled=False), enabling=True)
    t = table(enabling, rep("r", "b"))

    assert decide([t], healthy("a", "b")).changes == ()


def test_a_disabled_pinned_sync_replica_holds_no_slot():
    t = table(rep("p", "a", SYNC, enabled=False, tracker_enabled=False), rep("r", "b"))

    assert moves(decide([t], healthy("a", "b"))) == {("r", SYNC)}


def test_only_min_counts_pinned_sync_replicas_in_the_default_max():
    """Only min set: max is every replica that can be sync, the pinned sync ones included."""
    options = replace(TRACKED, min_sync_replica_count=1)
    t = table(rep("p", "a", SYNC, tracker_enabled=False), rep("r1", "b"), rep("r2", "c"), options=options)

    decision = decide([t], healthy("a", "b", "c"))

    assert moves(decision) == {("r1", SYNC), ("r2", SYNC)}
    assert "(min 1, max 3)" in decision.reasons["t"]


def test_a_non_atomic_replica_is_never_switched_and_never_counted_as_async():
    """atomicity none means the tracker leaves the replica alone (tracker_enabled False in the loop)."""
    t = table(rep("na", "a", tracker_enabled=False), rep("r", "b"))

    assert moves(decide([t], healthy("a", "b"))) == {("r", SYNC)}


def test_collocated_tables_follow_a_pinned_sync_replica():
    """events' owner pins its replica on b as sync: events' tracked sync on a is demoted (the slot is
    taken) and audit moves to b with it, in the same check: the collocation is never split."""
    events = table(rep("e-a", "a", SYNC), rep("e-b", "b", SYNC, tracker_enabled=False), table_id="events",
                   collocation_id="col")
    audit = table(rep("a-a", "a", SYNC), rep("a-b", "b"), table_id="audit", collocation_id="col")
    clusters = healthy("a", "b")

    decision = decide([events, audit], clusters)

    assert moves(decision) == {("e-a", ASYNC), ("a-b", SYNC), ("a-a", ASYNC)}
    assert decision.sync_replicas == {"events": ("e-b",), "audit": ("a-b",)}
    assert decide(applied((events, audit), decision), clusters).changes == ()


def test_a_collocated_table_whose_replicas_are_all_pinned_binds_the_others():
    events = table(rep("e-a", "a", tracker_enabled=False), rep("e-b", "b", SYNC, tracker_enabled=False),
                   table_id="events", collocation_id="col")
    audit = table(rep("a-a", "a", SYNC), rep("a-b", "b"), table_id="audit", collocation_id="col")

    decision = decide([events, audit], healthy("a", "b"))

    assert moves(decision) == {("a-b", SYNC), ("a-a", ASYNC)}


@pytest.mark.parametrize("seed", range(40))
def test_the_tracker_never_exceeds_max_nor_splits_a_collocation(seed: int):
    """Random tables of one collocation on three clusters, some replicas pinned (the same pinned sync
    cluster for every table that pins one): after each decision is applied no table has more sync
    replicas than max unless its pinned ones alone do, and once the decisions settle every table has
    its sync replica on one cluster whenever the pins allow it (some cluster where each table either
    is pinned sync or has a replica the tracker owns; with a pinned sync replica, that one's)."""
    import random

    rng = random.Random(seed)
    names = ("a", "b", "c")
    pinned_sync_cluster = rng.choice(names)
    tables = []
    for t in range(rng.randint(1, 3)):
        replicas = []
        for cluster in names:
            pinned = rng.random() < 0.3
            mode = SYNC if (pinned and cluster == pinned_sync_cluster) or rng.random() < 0.3 else ASYNC
            replicas.append(rep(f"t{t}-{cluster}", cluster, mode, lag=rng.choice([0.0, 1.0, 5.0]),
                                tracker_enabled=not pinned))
        tables.append(table(*replicas, table_id=f"t{t}", collocation_id="col"))
    state = tuple(tables)
    clusters = healthy(*names)
    for _ in range(4):
        decision = decide(state, clusters)
        state = applied(state, decision)
        for t in state:
            pinned = [r for r in t.replicas if not r.tracker_enabled and r.mode is SYNC]
            sync = [r for r in t.replicas if r.mode is SYNC]
            assert len(sync) <= max(1, len(pinned)), (seed, t)
    assert decide(state, clusters).changes == (), seed

    def possible(cluster: str, t: TrackedTable) -> bool:
        pinned = {r.cluster for r in t.replicas if not r.tracker_enabled and r.mode is SYNC}
        return pinned == {cluster} if pinned else any(r.tracker_enabled for r in t.replicas if r.cluster == cluster)

    feasible = [c for c in names if all(possible(c, t) for t in tables)]
    placements = {frozenset(r.cluster for r in t.replicas if r.mode is SYNC) for t in state}
    if feasible:
        assert len(placements) == 1 and next(iter(placements)) <= set(feasible), (seed, feasible, state)
