"""Crash safety: SIGKILL the engine process and check that nothing acknowledged is lost.

Each test runs a real engine, kills its process group with SIGKILL (no clean shutdown, no
flush), restarts it on the same data directory and checks the data. Named crash points
(``REPTABLES_CRASH_AT``) kill the engine between the phases of a two-phase commit.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import YtError
from reptables.testing import EngineProcess, wait_for

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"},
          {"name": "batch", "type": "int64"}, {"name": "v", "type": "string"}]


def _create_table(client: Client, path: str, pivots: list[list[int]] | None = None) -> None:
    attrs = {"dynamic": True, "schema": SCHEMA}
    if pivots:
        attrs["pivot_keys"] = pivots
    client.create("table", path, attributes=attrs)
    client.mount_table(path)


def _all_rows(client: Client, path: str) -> list[dict]:
    return client.select_rows(f"k, batch, v from [{path}]", output_row_limit=1_000_000)


def test_sigkill_under_concurrent_writes_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    engine = EngineProcess("crash", tmp_path / "crash").start()
    path = "//tmp/load"
    with Client(engine.url, engine.token, timeout=10) as client:
        _create_table(client, path, pivots=[[], [1_000_000], [2_000_000]])
    acknowledged: list[int] = []
    attempted: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        with Client(engine.url, engine.token, timeout=10) as client:
            for n in range(100_000):
                if stop.is_set():
                    return
                batch = worker * 100_000 + n
                # each batch spans all three tablets: a two-phase commit
                rows = [{"k": tablet * 1_000_000 + batch * 4 + i, "batch": batch, "v": f"w{worker}"}
                        for tablet in range(3) for i in range(4)]
                with lock:
                    attempted.append(batch)
                try:
                    client.insert_rows(path, rows)
                except YtError:
                    return
                with lock:
                    acknowledged.append(batch)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acknowledged) >= 60, 30, "the write load to get going (60 acknowledged batches)")
    finally:
        engine.kill()
        stop.set()
        for t in threads:
            t.join(timeout=30)

    engine.start()
    try:
        with Client(engine.url, engine.token, timeout=30) as client:
            rows = _all_rows(client, path)
        by_batch: dict[int, int] = {}
        for row in rows:
            by_batch[row["batch"]] = by_batch.get(row["batch"], 0) + 1
        missing = [b for b in acknowledged if by_batch.get(b) != 12]
        assert not missing, f"acknowledged batches lost or partial after SIGKILL: {missing[:10]}"
        partial = {b: c for b, c in by_batch.items() if c != 12}
        assert not partial, f"partially applied transactions visible: {partial}"
        assert set(by_batch) <= set(attempted)
    finally:
        engine.stop()


@pytest.mark.parametrize("point, expect_committed", [("after_prepare", False), ("after_commit_decision", True)])
def test_crash_inside_two_phase_commit_is_all_or_nothing(tmp_path: Path, point: str,
                                                         expect_committed: bool) -> None:
    data = tmp_path / "twopc"
    engine = EngineProcess("twopc", data).start()
    path = "//tmp/twopc"
    with Client(engine.url, engine.token) as client:
        _create_table(client, path, pivots=[[], [100]])
        client.insert_rows(path, [{"k": 1, "batch": 0, "v": "before"}])
    engine.stop()

    engine.env = {"REPTABLES_CRASH_AT": point}
    engine.start()
    with Client(engine.url, engine.token, timeout=10) as client, pytest.raises(YtError):
        client.insert_rows(path, [{"k": 1, "batch": 1, "v": "tx"}, {"k": 150, "batch": 1, "v": "tx"}])
    engine.proc.wait(timeout=10)

    engine.env = {}
    engine.start()
    try:
        with Client(engine.url, engine.token) as client:
            rows = {r["k"]: r["v"] for r in _all_rows(client, path)}
            if expect_committed:
                assert rows == {1: "tx", 150: "tx"}
            else:
                assert rows == {1: "before"}
            # the recovered or aborted transaction holds no locks: the same keys are writable
            client.insert_rows(path, [{"k": 1, "batch": 2, "v": "after"}, {"k": 150, "batch": 2, "v": "after"}])
            assert {r["k"]: r["v"] for r in _all_rows(client, path)} == {1: "after", 150: "after"}
    finally:
        engine.stop()


def test_timestamps_monotonic_after_sigkill(tmp_path: Path) -> None:
    engine = EngineProcess("ts", tmp_path / "ts").start()
    with Client(engine.url, engine.token) as client:
        before = max(client.generate_timestamp() for _ in range(50))
    engine.kill()
    engine.start()
    try:
        with Client(engine.url, engine.token) as client:
            assert client.generate_timestamp() > before
    finally:
        engine.stop()
