"""The replicator pool in-process: replicas are fed by a few workers, when something makes them due.

What a user relies on here: a commit reaches an async replica at once, however many replicas the
engine has, without a thread or a timer per replica; an idle engine does nothing for its replicas
but the rare heartbeat; a busy table does not starve the others; a replica backing off after an
error is not pushed before its backoff ends; a replica's pass is never run twice at once (its
pushes stay in order); the replica tables' freshness moves on while someone reads it, and its lag
counts from the first change it lacks, however long its table was idle before. The fakes are those
of ``test_units.py`` (real storage, tables and transactions; the network in process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.replica_types import ReplicaState
from reptables.engine.replication.registry import Replica
from reptables.engine.replication.sink import replica_freshness
from reptables.engine.tablets import DynamicTable, RowWrite, WriteKind
from reptables.engine.transactions import Participant
from reptables.testing import wait_for

from .test_units import SORTED, FakeClient, FakeNetwork, World, make_world, rows

__all__ = ["make_world"]  # (the fixture, for pytest)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("replicator-")]


def _more_table(world: World, name: str) -> DynamicTable:
    return world.meta.make_table(name, SORTED, replicated=True)


def _replica_of(world: World, table: str, name: str) -> Replica:
    replica_id = world.manager.create_replica({"table_path": f"//{table}", "cluster_name": "remote",
                                               "replica_path": f"//{name}"})
    world.replica_tables[replica_id] = world.remote.make_table(name, SORTED, upstream_replica_id=replica_id)
    world.manager.alter_replica(replica_id, enabled=True, mode=None)
    return world.manager.replica(replica_id)


def _commit_to(world: World, table: DynamicTable, path: str, values: list[dict[str, Any]]) -> None:
    part = Participant(table, path, 0, [RowWrite(WriteKind.WRITE, row, 1) for row in values])
    ts = world.meta.timestamps.generate()
    with world.meta.storage.write() as conn:
        table.apply(conn, part.writes, ts, 0)
        world.manager.after_queue_append(conn, part, ts, [])


def _freshness(world: World, replica: Replica) -> int:
    """The replica table's freshness as its cluster tells it (without counting as a read of it)."""
    with world.remote.storage.read() as conn:
        return replica_freshness(conn, replica.id)


def _heartbeats(network: FakeNetwork) -> int:
    return sum(len(c[2]["heartbeats"]) for c in network.calls if c[1] == "push" and "heartbeats" in c[2])


def _heartbeat_requests(network: FakeNetwork) -> int:
    return sum(1 for c in network.calls if c[1] == "push" and "heartbeats" in c[2])


def test_a_commit_reaches_an_async_replica_at_once_with_threads_bounded_by_the_pool(
        make_world: Callable[..., World]) -> None:
    world = make_world(replicator_threads=2, replica_heartbeat_interval=0.05, replica_idle_heartbeat_interval=3600.0)
    replicas = [world.add_replica(f"replica{i}") for i in range(20)]
    world.manager.start()
    wait_for(lambda: all(r.state is ReplicaState.ENABLED for r in replicas), 10, "every replica enabled")
    assert len(_workers()) == 2  # not one per replica

    # idle: after the first heartbeat of every replica (a few requests for all), nothing is sent,
    # however long (the replicas wake on commits, not on timers)
    wait_for(lambda: _heartbeats(world.network) >= len(replicas), 10, "the first heartbeats")
    assert _heartbeat_requests(world.network) < len(replicas)
    calls = len(world.network.calls)
    time.sleep(1.0)
    assert len(world.network.calls) == calls

    world.commit(rows(0, 3))
    wait_for(lambda: all(r.progress_of(0).row_index == 3 for r in replicas), 10, "the commit on every replica",
             interval=0.01)
    for replica in replicas:
        assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(3)]

    world.manager.close()
    assert _workers() == []  # close joins the pool


def test_a_busy_table_does_not_starve_another_and_a_pass_never_runs_twice_at_once(
        make_world: Callable[..., World]) -> None:
    world = make_world(replicator_threads=1, batch_rows=10)
    in_flight: dict[str, int] = {}
    overlaps: list[str] = []
    order: list[str] = []
    lock = threading.Lock()
    network_client = world.network.client

    class SlowClient(FakeClient):
        def call(self, method: str, body: dict[str, Any] | None = None, timeout: float | None = None,
                 raw_body: bytes | None = None) -> dict[str, Any]:
            if method != "push" or raw_body is None or b'"heartbeats"' in raw_body:
                return network_client(self.cluster).call(method, body, timeout, raw_body)
            replica_id = raw_body.split(b'"upstream_replica_id": "', 1)[1].split(b'"', 1)[0].decode()
            with lock:
                in_flight[replica_id] = in_flight.get(replica_id, 0) + 1
                if in_flight[replica_id] > 1:
                    overlaps.append(replica_id)
                order.append(replica_id)
            try:
                time.sleep(0.01)
                return network_client(self.cluster).call(method, body, timeout, raw_body)
            finally:
                with lock:
                    in_flight[replica_id] -= 1

    world.network.client = lambda name: SlowClient(world.network, name)  # type: ignore[method-assign]
    busy = world.add_replica("busy")
    quiet_table = _more_table(world, "other")
    quiet = _replica_of(world, "other", "quiet")
    world.commit(rows(0, 500))  # 50 batches of 10 rows
    world.manager.start()
    time.sleep(0.05)
    for i in range(20):  # commits keep waking the busy replica while its pushes are in flight
        world.commit(rows(500 + i, 1))
    _commit_to(world, quiet_table, "//other", [{"k": 1, "v": "quiet"}])
    wait_for(lambda: quiet.progress_of(0).row_index == 1, 10, "the quiet table's row", interval=0.01)
    # the quiet replica took its turn while the busy one still had most of its rows to push
    assert busy.progress_of(0).row_index < 400, busy.progress_of(0).row_index
    wait_for(lambda: busy.progress_of(0).row_index == 520, 30, "the busy table's rows", interval=0.02)
    assert overlaps == []
    assert world.remote.rows(world.replica_tables[busy.id]) == [(k, f"v{k}") for k in range(520)]
    # its batches went one after the other, each from where the one before ended
    batches = [(c[2]["prev_row_index"], c[2]["row_index"]) for c in world.network.calls
               if c[1] == "push" and c[2].get("upstream_replica_id") == busy.id and
               (c[2].get("entries") or c[2].get("columnar"))]
    assert batches[0][0] == 0 and batches[-1][1] == 520
    assert all(a[1] == b[0] for a, b in zip(batches, batches[1:], strict=False))


def test_a_commit_during_a_backoff_is_pushed_once_the_backoff_ends(make_world: Callable[..., World]) -> None:
    world = make_world(soft_backoff=1.0)
    replica = world.add_replica("replica")
    world.manager.start()
    wait_for(lambda: replica.state is ReplicaState.ENABLED, 10, "the replica enabled")
    world.network.down.add("remote")
    world.commit(rows(0, 1))
    wait_for(lambda: replica.errors, 10, "the failed push recorded", interval=0.01)
    failed = len(world.network.pushes())
    world.network.down.clear()
    world.commit(rows(1, 1))  # the backoff goes on: this commit does not cut it short
    time.sleep(0.3)
    assert len(world.network.pushes()) == failed
    wait_for(lambda: replica.progress_of(0).row_index == 2, 10, "both rows after the backoff", interval=0.02)
    assert replica.errors == []


def test_enabling_and_disabling_end_promptly_even_during_a_backoff(make_world: Callable[..., World]) -> None:
    world = make_world(soft_backoff=60.0)
    world.commit(rows(0, 2))
    replica = world.add_replica("replica", enable=False)
    world.manager.start()
    world.manager.alter_replica(replica.id, enabled=True, mode=None)
    wait_for(lambda: replica.state is ReplicaState.ENABLED, 5, "enabled", interval=0.01)
    wait_for(lambda: replica.progress_of(0).row_index == 2, 5, "the rows", interval=0.01)
    world.network.down.add("remote")
    world.commit(rows(2, 1))
    wait_for(lambda: replica.errors, 5, "the failed push recorded", interval=0.01)
    # a minute of backoff: disabling ends at once all the same, and so does enabling again
    world.manager.alter_replica(replica.id, enabled=False, mode=None)
    wait_for(lambda: replica.state is ReplicaState.DISABLED, 5, "disabled", interval=0.01)
    world.network.down.clear()
    world.manager.alter_replica(replica.id, enabled=True, mode=None)
    wait_for(lambda: replica.progress_of(0).row_index == 3, 5, "the row once enabled again", interval=0.01)
    assert replica.state is ReplicaState.ENABLED


def test_freshness_heartbeats_go_on_while_it_is_read_and_slow_down_when_nobody_does(
        make_world: Callable[..., World]) -> None:
    world = make_world(replica_heartbeat_interval=0.1, replica_idle_heartbeat_interval=2.0)
    replica = world.add_replica("replica")
    sink = world.network.sinks["remote"]
    world.manager.start()
    committed = world.commit(rows(0, 1))
    wait_for(lambda: replica.progress_of(0).row_index == 1, 10, "the row", interval=0.01)
    # after the traffic a heartbeat follows: the replica table is fresh past the commit
    wait_for(lambda: _freshness(world, replica) >= committed, 5, "freshness past the row", interval=0.02)
    # nobody reads it: heartbeats come at the idle interval only
    time.sleep(0.5)
    quiet_from = _heartbeat_requests(world.network)
    time.sleep(1.0)
    assert _heartbeat_requests(world.network) - quiet_from <= 1
    # someone reads it (a change stream, an event token): at the short interval again, after the
    # next idle heartbeat has told the meta-cluster so
    reader = threading.Event()

    def read() -> None:
        while not reader.is_set():
            sink.freshness_read(replica.id)
            time.sleep(0.05)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        before = _freshness(world, replica)
        # (at most one a second: timestamps count whole seconds, and a tablet whose last barrier is of
        # this second is passed over)
        wait_for(lambda: _heartbeat_requests(world.network) - quiet_from >= 5, 15, "heartbeats at the short interval",
                 interval=0.05)
        assert _freshness(world, replica) > before
    finally:
        reader.set()
        thread.join()


def test_a_replica_lags_from_the_first_change_it_lacks_however_long_its_table_was_idle(
        make_world: Callable[..., World]) -> None:
    # no pool running, so no heartbeat's barrier: only the commit tells how fresh the replica was
    world = make_world()
    replica = world.add_replica("replica")
    world.commit(rows(0, 1))
    world.replicate_once(replica)
    time.sleep(3.0)  # idle (a timestamp counts whole seconds: a lag is known to a second)
    world.network.down.add("remote")
    world.commit(rows(1, 1))
    world.replicate_once(replica)  # refused: the replica lacks the new row
    lag = world.manager.describe(replica)["replication_lag_time"]
    assert 0 <= lag < 2_000, lag  # (it was idle 3 s)


def test_heartbeats_of_many_replicas_travel_together_and_claim_no_row_a_replica_lacks(
        make_world: Callable[..., World]) -> None:
    world = make_world()
    first = world.add_replica("first")
    second = world.add_replica("second")
    world.commit(rows(0, 1))
    world.replicate_once(first)
    world.replicate_once(second)
    world.commit(rows(1, 1))
    world.replicate_once(first)  # `second` lacks row 1
    sink = world.network.sinks["remote"]
    barrier = world.meta.timestamps.generate()

    def heartbeat(replica: Replica, row: int) -> dict[str, Any]:
        return {"upstream_replica_id": replica.id, "replica_path": replica.replica_path, "tablet_index": 0,
                "prev_row_index": row, "row_index": row, "preserve_timestamps": True, "entries": [],
                "barrier_timestamp": barrier, "tablet_count": 1, "layout_revision": 0}

    sink.freshness_read(first.id)
    answer = sink.handle_push({"heartbeats": [
        heartbeat(first, 2),
        heartbeat(second, 2),  # a claim of rows it has not got: refused, its record stays
        {"upstream_replica_id": "no-such", "replica_path": "//nowhere"},
    ]}, None)["heartbeats"]
    assert answer[0]["applied"] is True and answer[0]["freshness_read_ago"] < 5
    assert answer[1] == {"row_index": 1, "applied": False}
    assert "error" in answer[2]
    with pytest.raises(YtError) as error:
        sink.handle_push({"heartbeats": "nonsense"}, None)
    assert error.value.code == ErrorCode.PROTOCOL_ERROR
    # the refused claim took nothing from `second`: its rows still arrive, once
    world.replicate_once(second)
    assert world.remote.rows(world.replica_tables[second.id]) == [(0, "v0"), (1, "v1")]


def test_a_replica_cluster_that_takes_one_heartbeat_per_push_gets_them_one_by_one(
        make_world: Callable[..., World]) -> None:
    """An engine from before heartbeats travelled together refuses the batch as malformed: its replica
    tables' freshness moves on all the same, one heartbeat per push, at the short interval."""
    world = make_world(replica_heartbeat_interval=0.1, replica_idle_heartbeat_interval=60.0)
    sink = world.network.sinks["remote"]
    handle_push = sink.handle_push

    def old_engine(body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        if "heartbeats" in body:
            raise YtError("Internal request push misses field 'upstream_replica_id'", code=ErrorCode.PROTOCOL_ERROR)
        return handle_push(body, caller)

    sink.handle_push = old_engine  # type: ignore[method-assign]
    replica = world.add_replica("replica")
    committed = world.commit(rows(0, 1))
    world.manager.start()
    wait_for(lambda: _freshness(world, replica) >= committed, 10, "freshness past the row", interval=0.02)
    singles = [c for c in world.network.calls if c[1] == "push" and not c[2].get("entries") and
               not c[2].get("columnar") and "barrier_timestamp" in c[2]]
    assert singles and all(c[3] is not None and c[3]["applied"] for c in singles)
    # no answer says whether anyone reads it: they go on at the short interval, as before
    count = len(singles)
    wait_for(lambda: sum(1 for c in world.network.calls if "barrier_timestamp" in c[2]) >= count + 2, 10,
             "more heartbeats", interval=0.05)
