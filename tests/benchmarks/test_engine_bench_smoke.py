"""Smoke test of benchmarks/engine_bench.py: one tiny run on SQLite and on PostgreSQL, side by side.

The benchmark is only worth its figures if its PostgreSQL half really puts the engine on PostgreSQL
and the side-by-side ratios come out of the same run, so this runs ``main`` end to end at tiny
sizes (seconds) with ``--storage sqlite,postgresql`` on the test run's PostgreSQL server
(``--pg-server``: no second server is started), and checks what it reports: the rows arrived (through
the engine and in the engine's own database), every figure is a positive finite number, the
PostgreSQL-backed / SQLite-backed ratios are there, the server's durability is PostgreSQL's default,
and the databases it made are dropped again. Timings are never asserted: this machine's load decides
them.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import engine_bench, regression
from reptables.testing import backends

pytestmark = pytest.mark.timeout(300)  # a ratio beyond its limit runs the benchmark twice

#: ten 10,000-row batches: the engine's CPU during them (``/proc``, 10 ms ticks) is ~300 ms, enough for the
#: ratio of the two backends' CPU that benchmarks/regression.py checks (at five batches, ~150 ms, one 10 ms tick
#: moved the ratio by ~7 %); the raw ceilings stay tiny
ROWS = 100_000
RAW_ROWS = 3_000


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    """``main`` turns SIGTERM into KeyboardInterrupt for its own run: give pytest its handler back."""
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _run(server: backends.RunServer, data_dir: Path, out: Path) -> int:
    return engine_bench.main([
        "--storage", "sqlite,postgresql", "--pg-server", f"{server.host}:{server.port}",
        "--rows", str(ROWS), "--wrapper-rows", "1000", "--raw-rows", str(RAW_ROWS), "--latency-samples", "10",
        "--composite-rows", "2000",
        "--phase-timeout", "60", "--data-dir", str(data_dir), "--json", str(out)])


def test_sqlite_and_postgresql_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            sigterm_restored: None) -> None:
    server = backends.run_server()
    out = tmp_path / "figures.json"
    code = _run(server, tmp_path / "data", out)
    assert code == 0
    text = capsys.readouterr().out
    assert "side by side" in text and "insert rate PostgreSQL-backed / SQLite-backed, Client" in text

    data = json.loads(out.read_text())
    assert data["config"]["storage"] == ["sqlite", "postgresql"]
    for backend in ("sqlite", "postgresql"):
        run = data["backends"][backend]
        details, figures = run["details"], run["figures"]
        # the rows arrived: counted through the engine and in the engine's own database beside it
        assert details["rows_in_table"] == ROWS and details["rows_in_database"] == ROWS, details
        for key in ("insert_client", "insert_wrapper", "raw_minimal", "raw_layout", "commit_p50", "commit_p99",
                    "raw_commit_p50", "lookup_p50"):
            assert _positive(figures[key]["value"]), (backend, key, figures[key])
        assert figures["commit_p50"]["value"] <= figures["commit_p99"]["value"]
        # commits into a table keyed by two columns, by tenths of the rows (the table's size must not matter)
        composite = details["composite"]
        assert composite["rows"] == 2000 and len(composite["segments"]) == 10, composite
        assert all(_positive(x["rows_per_s"]) for x in composite["segments"]), composite
        assert figures["composite_growth"]["status"] in ("PASS", "MISS"), figures["composite_growth"]
        assert details["cpu_insert_client"]["engine_s"] >= 0 and details["cpu_insert_client"]["wall_s"] > 0
    # the engine's own work with no HTTP (SQLite): what a commit and a lookup split into
    sqlite_figures = data["backends"]["sqlite"]["figures"]
    for key in ("commit_in_process_p50", "lookup_in_process_p50"):
        assert _positive(sqlite_figures[key]["value"]) and "request layer" in sqlite_figures[key]["note"], \
            sqlite_figures[key]
    pg_run = data["backends"]["postgresql"]
    assert pg_run["details"]["storage_url"].startswith(f"postgresql://reptables@{server.host}:{server.port}/")
    assert _positive(pg_run["figures"]["raw_unnest"]["value"]) and _positive(pg_run["figures"]["raw_copy"]["value"])
    assert pg_run["details"]["cpu_insert_client"]["postgres_s"] is not None
    settings = data["details"]["postgresql"]["settings"]
    assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on", settings

    ratios = {f["name"]: f for f in data["comparison"]}
    client = ratios["insert rate PostgreSQL-backed / SQLite-backed, Client"]
    assert _positive(client["value"]) and client["target"] == ">= 0.70" and client["status"] in ("PASS", "MISS")
    assert _positive(ratios["insert rate PostgreSQL-backed / SQLite-backed, yt.wrapper"]["value"])
    assert _positive(ratios["single-row commit p50 PostgreSQL-backed / SQLite-backed"]["value"])

    # the databases the run made on the given server are gone, and the data directory with them
    left = server.psql(f"SELECT count(*) FROM pg_database WHERE datname LIKE '%\\_{os.getpid()}\\_%' "
                       "AND (datname LIKE 'bench\\_engine%' OR datname LIKE 'raw\\_%')")
    assert left == "0"
    assert not list((tmp_path / "data").iterdir())

    # no ratio of the run fell beyond the recorded spread (benchmarks/regression.py, baselines.json)
    def again() -> dict[str, float]:  # a ratio beyond its limit is measured once more before it fails
        second = tmp_path / "again.json"
        assert _run(server, tmp_path / "again", second) == 0
        return regression.engine_bench_ratios(json.loads(second.read_text()))

    drops = regression.check("engine_bench", regression.engine_bench_ratios(data), again=again)
    assert not drops, regression.explain(drops)
