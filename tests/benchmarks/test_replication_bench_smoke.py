"""Smoke test of benchmarks/replication_vs_pg.py: its reptables half, at tiny sizes.

It starts real engines (meta + 2 replicas, then meta + 1 sync replica), writes 20,000 rows through
the benchmark's own code paths and asserts that every replica ends with exactly the rows written
(read back and compared row by row), that the figures are sane, and that the table renders. The
PostgreSQL half is covered by ``test_pg_logical_smoke.py``.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest

from benchmarks import replication_vs_pg as bench

pytestmark = pytest.mark.timeout(120)

ROWS = 20_000
BATCH = 5_000


@pytest.mark.parametrize("sync_replica, threads", [(False, 2), (True, 1)], ids=["2-async-2-threads", "sync-async"])
def test_every_replica_has_exactly_the_rows_written(tmp_path: Path, sync_replica: bool, threads: int) -> None:
    batches = bench.make_batches(ROWS, BATCH)
    assert sum(len(b) for b in batches) == ROWS
    run = bench.run_reptables_throughput(batches, ROWS, BATCH, sync_replica, threads, tmp_path, timeout=60)
    assert [(c.cluster, c.mode) for c in run.replicas] == [
        ("replica_0", "sync" if sync_replica else "async"), ("replica_1", "async")]
    for check in run.replicas:
        assert check.count == ROWS, check
        assert check.rows_compared == ROWS and check.mismatches == 0, check.first_mismatch
        assert 0 < check.replicated_seconds <= run.replicated_seconds
    assert run.verified
    assert run.queue_rows >= ROWS
    assert 0 < run.insert_seconds <= run.replicated_seconds
    assert run.insert_rows_per_s > 0 and math.isfinite(run.end_to_end_rows_per_s)
    assert not list(tmp_path.iterdir()), "the engines' temporary directory must be removed"


def test_sync_commit_latency_and_report(tmp_path: Path) -> None:
    lat = bench.run_reptables_latency(20, tmp_path, timeout=60)
    assert lat.verified and lat.replica_count == 20 + bench.LATENCY_WARMUP
    assert 0 < lat.min_ms <= lat.p50_ms <= lat.p99_ms <= lat.max_ms
    rows = 100
    run = bench.run_reptables_throughput(bench.make_batches(rows, 50), rows, 50, False, 1, tmp_path, timeout=60)
    lines, _ = bench.build_lines({"2 async": [run], "latency": lat}, None, None)
    out = io.StringIO()
    bench.print_lines(lines, out)
    text = out.getvalue()
    assert "end-to-end rows/s, 2 async" in text and "single-row commit p50 ms" in text
    assert ("PASS" in text) == (lat.p50_ms <= bench.TARGET_COMMIT_P50_MS)
