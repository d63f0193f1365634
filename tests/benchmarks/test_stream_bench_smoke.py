"""Smoke test of benchmarks/stream_bench.py: its --quick mode end to end, in a subprocess.

The benchmark starts its own engine, writes at a paced rate from several writer threads while a
consumer process streams the table, drains the history again, and runs the alternated write-cost
rounds. This test asserts what a reader of the benchmark relies on: it exits 0, the JSON holds every
figure the README describes, the exactly-once check passed (every written row seen once, in per-key
commit order), the drain saw the same rows, and no engine or consumer process is left behind. Timing
is not asserted: the machine is shared.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import regression

from .quick import alive, run_quick

pytestmark = pytest.mark.timeout(180)  # a ratio beyond its limit runs the benchmark twice

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "stream_bench.py"


def test_quick_run_reports_every_figure_and_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    proc, data = run_quick(BENCH, out, tmp_path, timeout=80)

    once = data["exactly_once"]
    assert once["passed"], once
    assert once["rows_written"] == once["rows_received"] == data["write"]["rows"] > 0
    assert once["duplicates"] == once["missing"] == once["order_violations"] == once["kind_violations"] == 0
    assert data["drain"]["same_rows"] and data["drain"]["rows"] == data["write"]["rows"]
    assert data["cost"]["all_delivered"]

    lat = data["latency_ms"]
    assert lat["samples"] == data["write"]["rows"]
    for name in ("p50", "p99", "max", "min", "mean"):
        assert math.isfinite(lat[name]), name
    assert lat["p50"] <= lat["p99"] <= lat["max"]
    for value in (data["write"]["rows_per_s"], data["drain"]["rows_per_s"], data["cost"]["without_rows_per_s"],
                  data["cost"]["with_rows_per_s"]):
        assert value > 0
    assert math.isfinite(data["cost"]["difference_pct"]) and math.isfinite(data["cost"]["cpu_pct"])
    assert [len(data["cost"]["runs"][m]) for m in ("without", "with")] == [2, 2]
    follow = data["follow"]  # (5 rounds of 10 commits of 100 rows, each round pulled right after it)
    assert follow["rows"] == 5 * 10 * 100 and follow["pulls"] >= 5
    assert math.isfinite(follow["pull_cpu_us_per_row"]) and follow["pull_cpu_us_per_row"] >= 0

    names = [f["name"] for f in data["figures"]]
    for name in ("paced write rate", "delivery latency p50", "delivery latency p99", "delivery latency max",
                 "drain of the whole history", "write cost of one open stream",
                 "engine CPU per row of one open stream", "engine CPU per change pulled, consumer keeping up",
                 "exactly once, in per-key commit order"):
        assert name in names
    assert "exactly once" in proc.stdout and "delivery latency p99" in proc.stdout

    assert not alive(data["engine_pid"]), "the benchmark must stop its engine"
    assert len(data["consumer_pids"]) == 3  # the latency consumer and one per cost round
    assert not [pid for pid in data["consumer_pids"] if alive(pid)], "the benchmark must stop its consumers"
    assert not list(tmp_path.glob("reptables-stream-bench-*")), "the data directory must be removed"

    # no ratio of the run fell beyond the recorded spread (benchmarks/regression.py, baselines.json)
    def again() -> dict[str, float]:  # a ratio beyond its limit is measured once more before it fails
        return regression.stream_bench_ratios(run_quick(BENCH, tmp_path / "again.json", tmp_path, timeout=80)[1])

    drops = regression.check("stream_bench", regression.stream_bench_ratios(data), again=again)
    assert not drops, regression.explain(drops)
