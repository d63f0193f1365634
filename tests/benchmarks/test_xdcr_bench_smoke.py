"""Smoke test of benchmarks/xdcr_bench.py: its --quick mode end to end, in a subprocess.

The benchmark starts two engines (cluster ids 1 and 2) connected both ways, runs flat-out writers
on both sides into a plain table and into an XDCR table, then paced writers into a fresh XDCR
table while a consumer process per side follows its change stream. This test asserts what a
reader of the benchmark relies on: it exits 0, the JSON holds every figure the README describes,
both sides converged to identical contents (the cost runs' XDCR tables too), every version a side
made was applied on the other side or rejected there in its conflict log, the shared keys did
conflict, and no engine, writer or consumer process nor the data directory is left behind.
Timing is not asserted: the machine is shared.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import regression

from .quick import alive, run_quick

pytestmark = pytest.mark.timeout(180)  # a ratio beyond its limit runs the benchmark twice

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "xdcr_bench.py"


def test_quick_run_converges_and_accounts_for_every_conflict(tmp_path: Path) -> None:
    out = tmp_path / "xdcr.json"
    proc, data = run_quick(BENCH, out, tmp_path, timeout=85)

    paced = data["paced"]
    conv = paced["convergence"]
    assert conv["passed"] and conv["same_contents"], conv
    assert len(set(conv["sha256"].values())) == 1
    assert set(conv["rows"].values()) == {conv["expected_rows"]} == {19_000}  # 2 x 9,000 own keys + 1,000 shared

    assert paced["accounting_passed"], paced["accounting"]
    assert len(paced["accounting"]) == 2
    for direction in paced["accounting"].values():
        assert direction["versions_made"] == direction["rows_written"] == 10_000
        assert direction["applied"] + direction["rejected"] == direction["versions_made"]
        assert direction["missing"] == direction["unexpected"] == direction["applied_and_rejected"] == 0
    sides = paced["sides"]
    assert set(sides) == {"east", "west"}
    # each shared key was written on both sides: the one of the two writes that lost is in a conflict log
    assert sum(a["rejected"] for a in paced["accounting"].values()) > 0
    for side in sides.values():
        assert side["rows"] == 10_000 and side["rows_per_s"] > 0
        assert side["conflicts"] == sum(v for k, v in side["conflict_log_rows"].items() if k.endswith(("/NEW", "/DEL")))
        assert side["stream"]["token_order_violations"] == 0

    lag = paced["lag_ms"]
    assert lag["samples"] == sum(a["applied"] for a in paced["accounting"].values())
    for name in ("p50", "p99", "max"):
        assert math.isfinite(lag[name]), name
    assert lag["p50"] <= lag["p99"] <= lag["max"]

    cost = data["cost"]
    assert cost["converged"]
    assert [len(cost["runs"][m]) for m in ("plain", "xdcr")] == [2, 2]
    for value in (cost["plain_rows_per_s"], cost["xdcr_rows_per_s"], cost["sustained_per_side"]):
        assert value > 0
    assert math.isfinite(cost["difference_pct"])
    assert cost["cpu_ratio"] == cost["xdcr_cpu_ms_per_1000_rows"] / cost["plain_cpu_ms_per_1000_rows"] > 1.0

    names = [f["name"] for f in data["figures"]]
    for name in ("paced writes, east", "paced writes, west", "convergence lag p50", "convergence lag p99",
                 "convergence lag max", "catch-up after the last write", "converged (identical contents)",
                 "conflicts logged, east", "conflicts logged, west", "every rejected action accounted for",
                 "flat-out writes, plain table, no connections (median)",
                 "flat-out writes, XDCR table replicating (median)", "write cost of XDCR",
                 "engine CPU per row, XDCR over plain",
                 "sustained XDCR rate per side (median)"):
        assert name in names
    assert "convergence lag p99" in proc.stdout and "write cost of XDCR" in proc.stdout

    assert len(data["engine_pids"]) == 2
    assert not [pid for pid in data["engine_pids"] if alive(pid)], "the benchmark must stop its engines"
    # two consumers, and two writers for the paced run and each of the four cost runs
    assert len(data["child_pids"]) == 2 + 2 * 5
    assert not [pid for pid in data["child_pids"] if alive(pid)], "the benchmark must stop its children"
    assert not list(tmp_path.glob("reptables-xdcr-bench-*")), "the data directory must be removed"

    # no ratio of the run fell beyond the recorded spread (benchmarks/regression.py, baselines.json)
    def again() -> dict[str, float]:  # a ratio beyond its limit is measured once more before it fails
        return regression.xdcr_bench_ratios(run_quick(BENCH, tmp_path / "again.json", tmp_path, timeout=85)[1])

    drops = regression.check("xdcr_bench", regression.xdcr_bench_ratios(data), again=again)
    assert not drops, regression.explain(drops)
