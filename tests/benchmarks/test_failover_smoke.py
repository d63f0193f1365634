"""Smoke test of benchmarks/failover_bench.py: one failover trial at small settings, < 60 s.

It starts the three engines of the benchmark (meta + two replicas) under the local runner and its
tracker, SIGKILLs the engine holding the sync replica while the writer commits, and asserts that a
commit succeeded after the kill, that the new sync replica is the surviving cluster, that no
acknowledged write is lost, and that every engine the benchmark started is stopped again.

No ratio of this run is held to benchmarks/baselines.json: the window of one trial over the tracker's
probe period was 1.3-8.5 in five recorded runs under load (the failing probe sometimes a whole check
period late), too wide to catch the regression it would be for; benchmarks/regression.py says more.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from benchmarks import failover_bench as bench

from .quick import alive

pytestmark = pytest.mark.timeout(90)


def test_one_failover_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    cfg = bench.Config(trials=1, warmup_s=0.5, after_s=0.3, recovery_timeout_s=20, settle_timeout_s=30,
                       workdir=str(tmp_path))
    started = time.monotonic()
    result = bench.run(cfg, progress=io.StringIO())
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"one trial took {elapsed:.1f} s"

    (trial,) = result.trials
    assert trial.problem == "", trial.problem
    # a write succeeded after the kill (the window ends with the first ack of a commit started after it)
    assert trial.window_s is not None and 0 < trial.window_s < 20
    assert trial.acked_trial > 0
    # the tracker moved the sync replica to the surviving cluster, and the status says so
    assert trial.killed in bench.REMOTES and trial.survivor in bench.REMOTES and trial.killed != trial.survivor
    assert trial.new_sync == trial.survivor
    assert trial.status_s is not None and trial.status_s > 0
    # no acknowledged write lost: on the replicated table (read via its sync replica) and on the survivor
    assert trial.lost_meta == 0 and trial.lost_survivor == 0
    assert trial.ok and result.summary["all_ok"] and result.summary["lost_writes"] == 0
    # the phases add up to the window
    assert sum(trial.phases[p] for p in bench.PHASES) == pytest.approx(trial.window_s, abs=1e-6)

    assert len(result.engine_pids) == 3 and not any(alive(pid) for pid in result.engine_pids)
    assert not list(tmp_path.iterdir()), "the benchmark's temporary directory must be removed"

    out = io.StringIO()
    bench.render(result, out)
    text = out.getvalue()
    assert "write-unavailability window" in text and ("PASS" in text) == result.summary["window_ok"]
    assert set(bench.to_json(result)) >= {"config", "summary", "trials", "analysis"}
