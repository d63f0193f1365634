"""What the fault runs found in the engine, kept as reproducers now that it is fixed.

Each test is the smallest deterministic form of a failure a fault run showed, with the run's history
excerpt in docs/reliability.md ("Found by the fault runs", which says what fixed it). They were
``xfail(strict=True)`` until the fix landed; now they guard against its return.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.errors import YtError
from reptables.testing import KV_SCHEMA, EngineSet, WaitTimeout, wait_for
from reptables.testing.chaos.cluster import ChaosRun

from .conftest import needs_netns


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[EngineSet]:
    es = EngineSet(tmp_path).start()
    try:
        yield es
    finally:
        es.stop()


def _resharded_table(es: EngineSet) -> str:
    """A sorted replicated table resharded (before its first mount) into tablets [.., 10) and [10, ..)."""
    path = "//tmp/resharded"
    es.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": KV_SCHEMA})
    es.meta.reshard_table(path, pivot_keys=[[], [10]])
    es.meta.mount_table(path)
    return path


def test_a_restarted_meta_cluster_takes_writes_to_every_tablet_of_a_resharded_table(engines: EngineSet) -> None:
    """A sorted replicated table resharded to more tablets had no _rt_tablets row for its new tablets: their
    queue row counts were never saved, and a restarted meta-cluster saw those queues as empty (the
    tracker-switches fault run)."""
    path = _resharded_table(engines)
    sync = engines.replica(path, "remote_0", path, mode="sync")
    engines.wait_in_sync(sync)
    engines.meta.insert_rows(path, [{"k": 11, "v": "before"}])
    engines.restart("primary")
    engines.wait_in_sync(sync)
    # (before the fix: IntegrityError "UNIQUE constraint failed: rt_t1._rt_tablet_index, rt_t1._rt_row_index")
    wait_for(lambda: engines.meta.insert_rows(path, [{"k": 12, "v": "after"}]) is None, 10, "a write to tablet 1")
    assert engines.rows("remote_0", path) == [{"k": 11, "v": "before"}, {"k": 12, "v": "after"}]


def test_an_acknowledged_write_reaches_the_async_replica_after_a_meta_restart(engines: EngineSet) -> None:
    path = _resharded_table(engines)
    sync = engines.replica(path, "remote_0", path, mode="sync")
    engines.replica(path, "remote_1", path, mode="async")
    engines.wait_in_sync(sync)
    engines.engines["remote_1"].stop()
    engines.meta.insert_rows(path, [{"k": 11, "v": "acknowledged"}])  # in tablet 1; remote_1 is down
    engines.restart("primary")
    engines.engines["remote_1"].start()
    # (before the fix: the restarted meta-cluster counted 0 rows in tablet 1's queue, and never sent the row)
    try:
        wait_for(lambda: engines.rows("remote_1", path) == [{"k": 11, "v": "acknowledged"}], 20,
                 "the acknowledged row on the async replica")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; tablets of the queue: {engines.meta.get(f'{path}/@tablets')}") from None


def _stream_after_reshard(engines: EngineSet, path: str, reshard: bool) -> tuple[list[str], list[str]]:
    """The replica's rows, and what its change stream delivered from before the rows were written:
    tablet 1 gets 8 rows (its pushes throttled), tablet 0 then one, while the replica is down."""
    engines.replica(path, "remote_1", path, mode="async", table_attributes={"enable_change_log": True})
    engines.meta.insert_rows(path, [{"k": 1, "v": "first"}], require_sync_replica=False)
    wait_for(lambda: len(engines.rows("remote_1", path)) == 1, 20, "the first row on the replica")
    time.sleep(2.5)  # idle tablets: the heartbeats tell the replica how many tablets the table has
    replica = engines.client("remote_1")
    token = replica.pull_changes(path, from_timestamp=1 << 30, wait_timeout=0)["event_token"]
    engines.engines["remote_1"].stop()
    if reshard:
        engines.meta.unmount_table(path)
        engines.meta.reshard_table(path, pivot_keys=[[], [10]])
        engines.meta.mount_table(path)
    engines.meta.set(f"{path}/@replication_throttler", {"period": 1000, "limit": 50})
    for i in range(8):
        engines.meta.insert_rows(path, [{"k": 10 + i, "v": f"tablet1-{i}"}], require_sync_replica=False)
    engines.meta.insert_rows(path, [{"k": 2, "v": "tablet0"}], require_sync_replica=False)
    engines.engines["remote_1"].start()
    delivered: list[str] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            answer = replica.pull_changes(path, from_event_token=token, wait_timeout=0)
        except YtError:
            time.sleep(0.02)
            continue
        token = answer["event_token"]
        delivered += [e["row"]["v"] for e in answer["events"] if e["kind"] != "heartbeat"]
        time.sleep(0.02)
    return sorted(r["v"] for r in engines.rows("remote_1", path) if r["v"] != "first"), sorted(delivered)


def test_a_replica_table_stream_delivers_the_changes_of_tablets_a_reshard_added(engines: EngineSet) -> None:
    """A replica table learned its upstream's tablet count only from heartbeats, which a busy tablet never sends:
    after a reshard to more tablets its stream passed the new tablets' changes before they arrived and never
    delivered them (the reshard fault run)."""
    path = "//tmp/stream_resharded"
    engines.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": KV_SCHEMA})
    engines.meta.mount_table(path)
    rows, delivered = _stream_after_reshard(engines, path, reshard=True)
    assert len(rows) == 9
    # (before the fix: only "tablet0" was delivered; the 8 rows of tablet 1 were in the table, never in its stream)
    assert delivered == rows


def test_a_replica_table_stream_of_a_table_created_with_its_tablets_delivers_every_change(
        engines: EngineSet) -> None:
    """The same steps without the reshard deliver everything: the difference is the reshard."""
    path = "//tmp/stream_created"
    engines.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": KV_SCHEMA,
                                                              "pivot_keys": [[], [10]]})
    engines.meta.mount_table(path)
    rows, delivered = _stream_after_reshard(engines, path, reshard=False)
    assert len(rows) == 9 and delivered == rows


def test_an_unresharded_replicated_table_keeps_its_queue_across_a_meta_restart(engines: EngineSet) -> None:
    """The same steps on a table created with its two tablets (no reshard) work: the difference is the reshard."""
    path = "//tmp/created_with_tablets"
    engines.meta.create("replicated_table", path, attributes={"dynamic": True, "schema": KV_SCHEMA,
                                                              "pivot_keys": [[], [10]]})
    engines.meta.mount_table(path)
    sync = engines.replica(path, "remote_0", path, mode="sync")
    engines.wait_in_sync(sync)
    engines.meta.insert_rows(path, [{"k": 11, "v": "before"}])
    engines.restart("primary")
    engines.wait_in_sync(sync)
    try:
        engines.meta.insert_rows(path, [{"k": 12, "v": "after"}])
    except YtError as exc:
        pytest.fail(f"a write after the restart failed: {exc}")
    assert engines.rows("remote_0", path) == [{"k": 11, "v": "before"}, {"k": 12, "v": "after"}]


@needs_netns
def test_an_xdcr_write_after_a_restart_with_the_clock_set_back_replaces_the_newer_version(tmp_path: Path) -> None:
    """xdcr-clock (seed 2027, 10 minutes): a member killed and restarted with its clock jumped back
    took its next row versions from the wall clock alone, lower than the versions its rows already
    had; every peer refused those changes ("e ... is not before the change's version") and shipping
    stalled for good. A change's version is now always after the one it replaces."""
    schema = [{"name": "id", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
    with ChaosRun(tmp_path) as run:
        engines = run.engines(["a", "b"], cluster_ids=True, clocks={"a": 0.0, "b": 0.0})
        engines.connect()
        for name in ("a", "b"):
            engines.client(name).create("table", "//tmp/t", recursive=True,
                                        attributes={"dynamic": True, "schema": schema, "xdcr": True})
            engines.client(name).mount_table("//tmp/t")
        a, b = engines.client("a"), engines.client("b")
        b.insert_rows("//tmp/t", [{"id": 1, "v": "first"}])
        wait_for(lambda: a.lookup_rows("//tmp/t", [{"id": 1}]) == [{"id": 1, "v": "first"}], 15, "the insert on a")

        engines.clocks["b"].set(-30.0)  # b's clock set back half a minute, then b crashes
        engines.restart("b")
        b = engines.client("b")
        b.insert_rows("//tmp/t", [{"id": 1, "v": "second"}])
        b.insert_rows("//tmp/t", [{"id": 2, "v": "after it"}])
        wait_for(lambda: a.select_rows("* from [//tmp/t]") == [{"id": 1, "v": "second"}, {"id": 2, "v": "after it"}],
                 15, "b's changes made after the restart on a")
        # (a's rows are visible before a's answer reaches b's shipper, which records a's progress
        # only then: wait for that, boundedly - a stall would leave the rows queued for good)
        seen: list[Any] = []

        def delivered() -> bool:
            seen.append(b.dr_status()["peers"])
            return all(p["queued_rows"] == 0 and p["state"] == "connected" for p in seen[-1].values())

        try:
            wait_for(delivered, 15, "b's shipper to record that a has every change")
        except WaitTimeout:
            pytest.fail(f"b's changes stayed queued for a: {seen[-1]}")
