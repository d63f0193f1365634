"""Smoke test of benchmarks/scale_bench.py: a few tiny points of two dimensions, and the quick point of
the operator dimension, each run in a subprocess.

What a reader of the benchmark relies on: it exits 0, every point it measured holds the figures the
README's table shows (threads, RSS and idle CPU per engine, creation time, commit and lookup p50, the
fan-out time of one row into every table or member, verified), the goals are printed against the
largest point of ``tables``, and every engine it started is gone. For the operator: every
TableReplica and ReplicatedTable it applied was Ready (and the engines hold the replicas), the
operator's figures are there, positive and finite, and the operator, the API emulator and the
engines are gone afterwards. Timing is not asserted: the machine is shared.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from .quick import alive

pytestmark = pytest.mark.timeout(150)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "scale_bench.py"


def test_tiny_points_report_every_figure_and_stop_their_engines(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--dimensions", "tables,members", "--tables", "2,4",
                           "--members", "2", "--batch", "2", "--settle-seconds", "0.5", "--idle-seconds", "1",
                           "--idle-after-seconds", "1",
                           "--samples", "10", "--json", str(out), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    points = data["points"]
    assert [(p["dimension"], p["size"]) for p in points] == [("tables", 2), ("tables", 4), ("members", 2)]
    for p in points:
        assert p["verified"] and not p["notes"], p
        names = {"meta", "r0", "r1"} if p["dimension"] == "tables" else {"x0", "x1"}
        assert set(p["threads"]) == set(p["rss_mib"]) == set(p["idle_cpu_pct"]) == set(p["pids"]) == names
        assert all(t > 0 for t in p["threads"].values()) and all(r > 0 for r in p["rss_mib"].values())
        assert all(c >= 0 for c in p["idle_cpu_pct"].values())
        assert p["create_s"] > 0 and 0 < p["commit_p50_ms"] and 0 < p["lookup_p50_ms"] and 0 < p["fan_out_s"] < 60
        assert not any(alive(pid) for pid in p["pids"].values())
    tables = [p for p in points if p["dimension"] == "tables"]
    assert all(p["first_batch_s_per_table"] > 0 and p["last_batch_s_per_table"] > 0 for p in tables)
    # and the idle CPU once every table was written
    assert all(set(p["idle_after_cpu_pct"]) == {"meta", "r0", "r1"} and
               all(c >= 0 for c in p["idle_after_cpu_pct"].values()) for p in tables)
    # the goals are judged at the largest tables point, one line each
    assert "at 4 tables" in proc.stdout and proc.stdout.count("PASS  ") + proc.stdout.count("MISS  ") == 7
    assert isinstance(data["goals_met"], bool)
    assert not list(tmp_path.glob("reptables-scale-*")), "the benchmark's temporary directory must be removed"


@pytest.mark.timeout(150)
def test_the_quick_operator_point_brings_every_object_to_ready_and_reports_the_operators_cost(
        tmp_path: Path) -> None:
    out = tmp_path / "operator.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--dimensions", "operator", "--json", str(out),
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (point,) = json.loads(out.read_text())["points"]
    assert (point["dimension"], point["verified"], point["notes"]) == ("operator", True, []), point
    figures = point["operator"]
    n = figures["replica_objects"]
    assert point["size"] == n and figures["table_objects"] == math.ceil(n / 2)
    # every object applied was Ready, and still is after the idle window
    assert (figures["ready_replicas"], figures["ready_tables"]) == (n, figures["table_objects"])
    positive = ("apply_s", "replicas_ready_s", "tables_ready_s", "operator_cpu_s", "emulator_cpu_s", "api_requests",
                "api_writes", "threads", "rss_mib", "status_refresh_s")
    for name in positive:
        assert math.isfinite(figures[name]) and figures[name] > 0, (name, figures)
    for name in ("engines_cpu_s", "idle_cpu_pct", "emulator_idle_cpu_pct", "idle_api_requests_per_s"):
        assert math.isfinite(figures[name]) and figures[name] >= 0, (name, figures)
    assert figures["api_writes"] <= figures["api_requests"]
    assert set(point["threads"]) == set(point["idle_cpu_pct"]) == set(point["pids"]) == {"meta", "r0", "r1"}
    # the table shows the point; nothing the benchmark started is left running
    row = next(line for line in proc.stdout.splitlines() if line.split()[:2] == [str(n), str(figures["table_objects"])])
    assert f"{figures['api_requests']} ({figures['api_writes']})" in row
    assert set(figures["pids"]) == {"operator", "emulator"}
    assert not any(alive(pid) for pid in [*figures["pids"].values(), *point["pids"].values()])
    assert not list(tmp_path.glob("reptables-scale-*")), "the benchmark's temporary directory must be removed"
