"""The short mode of the fault runs: a few scenarios with a fixed fault schedule, checked end to end.

Each test builds a scenario's cluster, runs its workloads (set, register, bank, streams; or XDCR)
for about half a minute while a scripted nemesis strikes, heals, lets the cluster converge, and
holds the whole history to the checkers: nothing acknowledged lost, nothing applied twice, no
anomaly. ``hack/chaos.sh`` runs the same scenarios with random faults for as long as asked.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reptables.testing.chaos.history import History
from reptables.testing.chaos.nemesis import ClockOffset, Kill, Partition, scripted
from reptables.testing.chaos.net import HOST
from reptables.testing.chaos.runner import RunContext, Scenario, run_scenario
from reptables.testing.chaos.scenarios import ASYNC, META, SYNC, replicated_cluster
from reptables.testing.chaos.scenarios_xdcr import xdcr_group

from .conftest import needs_netns

pytestmark = needs_netns


def _run(tmp_path: Path, name: str, build: Callable[[RunContext], None], duration: float,
         storage: str = "sqlite") -> tuple[dict[str, Any], History]:
    summary = run_scenario(Scenario(name, name, build, converge_timeout=90.0), tmp_path, duration, seed=1,
                           log=lambda _: None, storage=storage)
    problems = [f"{c['checker']} {c['workload']}: lost {c['lost'][:3]} duplicated {c['duplicated'][:3]} "
                f"anomalies {c['anomalies'][:3]}" for c in summary["checks"] if not c["valid"]]
    assert summary["valid"], json.dumps({"problems": problems, "run": summary["scenario_anomalies"],
                                         "errors": summary["errors"]}, indent=1)
    return summary, History.load(tmp_path / "history.jsonl")


def test_partitions_of_the_sync_replica_and_the_meta_cluster_lose_no_acknowledged_write(tmp_path: Path) -> None:
    def build(ctx: RunContext) -> None:
        replicated_cluster(ctx)
        net = ctx.run.network
        ctx.generator = scripted([
            (lambda: Partition(net, "isolate", [SYNC], note="sync replica"), 12.0),
            (lambda: Partition(net, "isolate", [META], from_host=True, note="meta-cluster, from clients too"), 6.0),
            (lambda: Partition(net, "one_way", [META, ASYNC], note="meta-cluster cannot reach the new sync"), 5.0),
        ])
        ctx.gap = (2.0, 2.0)

    summary, history = _run(tmp_path, "short-partitions", build, 36.0)
    assert summary["faults"] == {"partition": 3}
    cut = next(op.time for op in history if op.process == "nemesis" and op.f == "start")
    healed = next(op.time for op in history if op.process == "nemesis" and op.f == "heal")
    switches = [op for op in history if op.process == "tracker" and op.f == "switch"]
    # while the sync replica is cut off, not after it is back (a check stuck on the cut cluster's tables
    # once switched only after the heal)
    assert any(cut < op.time < healed and op.value["mode"] == "sync" for op in switches), \
        "the tracker did not move the sync replica off the cut one while it was cut off"
    assert summary["operations"]["ok"] > 500 and summary["operations"]["fail"] > 0
    checked = {c["workload"] for c in summary["checks"]}
    assert checked == {"set", "reg", "bank", "stream_reg_r1", "stream_set_r2", "stream_set_meta"}


def test_the_meta_cluster_clock_jumping_forward_and_back_loses_and_reorders_nothing(tmp_path: Path) -> None:
    def build(ctx: RunContext) -> None:
        engines = replicated_cluster(ctx, tracker=False)
        clock = engines.clocks[META]
        ctx.generator = scripted([(lambda: ClockOffset(META, clock, 30.0), 7.0),
                                  (lambda: ClockOffset(META, clock, -30.0), 7.0),
                                  (lambda: ClockOffset(SYNC, engines.clocks[SYNC], 5.0), 5.0)])
        ctx.gap = (2.0, 2.0)

    summary, _ = _run(tmp_path, "short-clock", build, 26.0)
    assert summary["faults"] == {"clock": 3}
    assert summary["operations"]["ok"] > 500


def test_xdcr_members_with_skewed_clocks_converge_after_a_partition_and_account_for_every_change(
        tmp_path: Path) -> None:
    def build(ctx: RunContext) -> None:
        engines = xdcr_group(ctx, clocks={"a": 5.0, "b": -5.0})
        net = ctx.run.network
        ctx.generator = scripted([(lambda: Partition(net, "split", ["c"], ["a", "b"]), 8.0),
                                  (lambda: ClockOffset("b", engines.clocks["b"], -35.0, -5.0), 6.0)])
        ctx.gap = (2.0, 2.0)

    summary, _ = _run(tmp_path, "short-xdcr", build, 22.0)
    assert summary["faults"] == {"partition": 1, "clock": 1}
    (xdcr,) = [c for c in summary["checks"] if c["checker"] == "xdcr"]
    assert xdcr["stats"]["logs"] and xdcr["stats"]["version_pairs"] > 50
    assert xdcr["ops"]["ok"] > 300


def test_engines_on_postgresql_cut_from_their_database_or_losing_it_to_a_crash_lose_nothing(tmp_path: Path) -> None:
    """The same cluster with every engine on a database of the run's PostgreSQL server: the meta-cluster
    cut from its database, then the server crashing (immediate shutdown) and starting again."""
    def build(ctx: RunContext) -> None:
        replicated_cluster(ctx, tracker=False)
        net, database = ctx.run.network, ctx.run.database
        assert database is not None
        ctx.generator = scripted([
            (lambda: Partition(net, "port", [META, HOST], port=database.port, note="meta-cluster cut from its "
                               "database"), 6.0),
            (lambda: Kill("postgresql", database, database.restart), 4.0),
        ])
        ctx.gap = (2.0, 2.0)

    summary, _ = _run(tmp_path, "short-postgresql", build, 20.0, storage="postgresql")
    assert summary["faults"] == {"partition": 1, "kill": 1}
    # (the load did work through the faults: 212 acknowledged operations in the slowest of 14 runs, at
    # load average 10; 600-900 on a quiet machine)
    assert summary["operations"]["ok"] > 100 and summary["operations"]["fail"] + summary["operations"]["unknown"] > 0
