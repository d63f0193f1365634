"""Change streams of replicated tables and their replicas, and the change-log use of seed 004.

A replicated table's stream is its meta-cluster's replication queue; a replica table streams what
it received, with the meta-cluster's commit timestamps, and tells how fresh it is from the
meta-cluster's heartbeats. ``reptables stream`` written to a file, killed and resumed from its
last line, gives exactly the table's history.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client, token_timestamp
from reptables.testing import EngineSet, wait_for

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineSet]:
    cs = EngineSet(tmp_path_factory.mktemp("rstreams"), names=("primary", "remote_0")).start()
    try:
        yield cs
    finally:
        cs.stop()


_counter = iter(range(1_000_000))


def drain(client: Client, path: str, token: str | None = None, ts: int | None = None) -> tuple[list[dict], str]:
    events: list[dict[str, Any]] = []
    answer = client.pull_changes(path, from_event_token=token, from_timestamp=ts, wait_timeout=0)
    while True:
        changes = [e for e in answer["events"] if e["kind"] != "heartbeat"]
        events += changes
        if not changes:
            return events, answer["event_token"]
        answer = client.pull_changes(path, from_event_token=answer["event_token"], wait_timeout=0)


def replicated(cs: EngineSet, mode: str = "async") -> tuple[str, str, str]:
    n = next(_counter)
    path = cs.replicated_table(f"//tmp/r{n}", SCHEMA)
    replica_path = f"//tmp/r{n}_replica"
    replica_id = cs.replica(path, "remote_0", replica_path, mode=mode, schema=SCHEMA,
                            table_attributes={"enable_change_log": True})
    return path, replica_path, replica_id


def test_the_meta_cluster_streams_its_replication_queue(clusters: EngineSet) -> None:
    path, _, _ = replicated(clusters)
    meta = clusters.meta
    start = meta.generate_timestamp()
    meta.insert_rows(path, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}], require_sync_replica=False)
    meta.insert_rows(path, [{"k": 1, "v": "a2"}], require_sync_replica=False)
    meta.insert_rows(path, [{"k": 2, "v": "b2"}], update=True, require_sync_replica=False)
    meta.delete_rows(path, [{"k": 1}], require_sync_replica=False)
    events, _ = drain(meta, path, ts=start)
    # the meta-cluster keeps no rows (seed 002): a write is an upsert, marked when partial
    assert [(e["kind"], e["key"]["k"], e.get("update")) for e in events] == [
        ("upsert", 1, False), ("upsert", 2, False), ("upsert", 1, False), ("upsert", 2, True), ("delete", 1, None)]
    assert [e["commit_end"] for e in events] == [False, True, True, True, True]
    rest, _ = drain(meta, path, token=events[1]["event_token"])
    assert [e["event_token"] for e in rest] == [e["event_token"] for e in events[2:]]


def test_a_replica_streams_what_it_received_with_the_meta_timestamps(clusters: EngineSet) -> None:
    path, replica_path, _ = replicated(clusters)
    meta, replica = clusters.meta, clusters.client("remote_0")
    start = meta.generate_timestamp()
    meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(5)], require_sync_replica=False)
    meta.insert_rows(path, [{"k": 0, "v": "y"}], require_sync_replica=False)
    meta.delete_rows(path, [{"k": 4}], require_sync_replica=False)
    expected, _ = drain(meta, path, ts=start)
    got: list[dict[str, Any]] = []
    token = None

    def caught_up() -> bool:
        nonlocal token
        events, token = drain(replica, replica_path, token=token, ts=None if token else start)
        got.extend(events)
        return len(got) >= len(expected)

    wait_for(caught_up, 30, "the replica's stream to carry every change")
    assert [(e["kind"], e["key"]["k"]) for e in got] == [("insert", i) for i in range(5)] + [
        ("update", 0), ("delete", 4)]
    assert [e["timestamp"] for e in got] == [e["timestamp"] for e in expected]


def test_replica_reads_say_whether_they_are_fresh_enough(clusters: EngineSet) -> None:
    path, replica_path, _ = replicated(clusters)
    meta, replica = clusters.meta, clusters.client("remote_0")
    start = meta.generate_timestamp()
    meta.insert_rows(path, [{"k": 7, "v": "new"}], require_sync_replica=False)
    [change], _ = drain(meta, path, ts=start)

    def fresh() -> bool:
        params: dict[str, Any] = {}
        rows = replica.lookup_rows(replica_path, [{"k": 7}], compare_event_token=change["event_token"],
                                   include_event_token=True, response_parameters=params)
        if params["fresh"]:
            # fresh means the change is in the data read
            assert rows == [{"k": 7, "v": "new"}]
        return bool(params["fresh"])

    wait_for(fresh, 30, "the replica to be as fresh as the change")
    # while the table is idle the replica's freshness still moves on (the meta-cluster's heartbeats)
    first: dict[str, Any] = {}
    replica.select_rows(f"* from [{replica_path}]", include_event_token=True, response_parameters=first)
    second: dict[str, Any] = {}
    wait_for(lambda: replica.select_rows(f"* from [{replica_path}]", include_event_token=True,
                                         response_parameters=second) is not None
             and second["timestamp"] > first["timestamp"], 10, "freshness to move on while idle")
    # a read of the replicated table (served by a sync replica) answers the same way; none here is sync
    assert token_timestamp(second["event_token"]) == second["timestamp"]


def test_a_replica_stream_during_its_async_catch_up_misses_nothing(clusters: EngineSet) -> None:
    path, replica_path, replica_id = replicated(clusters)
    meta, replica = clusters.meta, clusters.client("remote_0")
    clusters.alter(replica_id, enabled=False)
    start = meta.generate_timestamp()
    for i in range(40):
        meta.insert_rows(path, [{"k": i % 10, "v": f"w{i}"}, {"k": 100 + i, "v": "n"}], require_sync_replica=False)
    expected, _ = drain(meta, path, ts=start)
    token = replica.pull_changes(replica_path, from_timestamp=start, wait_timeout=0)["event_token"]
    clusters.alter(replica_id, enabled=True, wait=False)
    got: list[dict[str, Any]] = []

    def caught_up() -> bool:
        nonlocal token
        events, token = drain(replica, replica_path, token=token)
        got.extend(events)
        return len(got) >= len(expected)

    wait_for(caught_up, 60, "the replica's stream to catch up")
    assert len(got) == len(expected)
    assert [(e["key"]["k"], e["row"]["v"], e["timestamp"]) for e in got] == [
        (e["key"]["k"], e["row"]["v"], e["timestamp"]) for e in expected]


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a change log file (a line cut by a kill is dropped, and the file truncated)."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    return [json.loads(line) for line in data[:end].splitlines()]


def test_reptables_stream_killed_and_resumed_writes_exactly_the_history(clusters: EngineSet,
                                                                        tmp_path: Path) -> None:
    engine = clusters.engines["primary"]
    meta = clusters.meta
    path = f"//tmp/log{next(_counter)}"
    meta.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True})
    meta.mount_table(path)
    start = meta.generate_timestamp()
    log = tmp_path / "changes.jsonl"
    env = {**os.environ, "YT_PROXY": engine.url, "YT_TOKEN": engine.token or ""}
    cli = [sys.executable, "-m", "reptables.operator.cli", "stream", path]

    def run(args: list[str]) -> subprocess.Popen[bytes]:
        out = log.open("ab")
        try:
            return subprocess.Popen([*cli, *args], stdout=out, env=env, start_new_session=True)
        finally:
            out.close()

    proc = run(["--from-timestamp", str(start)])
    written = 0
    try:
        for round_ in range(3):
            for i in range(30):
                meta.insert_rows(path, [{"k": i, "v": f"r{round_}-{i}"}], require_sync_replica=False)
                if i % 7 == 0:
                    meta.delete_rows(path, [{"k": i + 1}], require_sync_replica=False)
                written += 1
            before = len(_read_log(log))
            wait_for(lambda before=before: len(_read_log(log)) > before, 30, "reptables stream to write")
            os.killpg(proc.pid, signal.SIGKILL)  # mid-stream, whatever it was writing
            proc.wait()
            lines = _read_log(log)
            proc = run(["--from-token", lines[-1]["event_token"]])
        expected, _ = drain(meta, path, ts=start)
        wait_for(lambda: len(_read_log(log)) >= len(expected), 30, "the log to catch up")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = _read_log(log)
    assert [e["event_token"] for e in lines] == [e["event_token"] for e in expected]
    assert written == 90 and len({e["event_token"] for e in lines}) == len(lines)


def test_resharding_a_replicated_table_is_invisible_to_its_stream(clusters: EngineSet) -> None:
    path, _, replica_id = replicated(clusters)
    meta = clusters.meta
    start = meta.generate_timestamp()
    meta.insert_rows(path, [{"k": i, "v": "one"} for i in range(10)], require_sync_replica=False)
    before, token = drain(meta, path, ts=start)
    # a replicated table is resharded once its replicas have the whole queue
    meta.unmount_table(path)
    wait_for(lambda: meta.reshard_table(path, pivot_keys=[[], [4]]) is None, 30, "the reshard")
    meta.mount_table(path)
    meta.insert_rows(path, [{"k": i, "v": "two"} for i in range(10)], require_sync_replica=False)
    after, _ = drain(meta, path, token=token)
    assert [(e["key"]["k"], e["row"]["v"]) for e in after] == [(i, "two") for i in range(10)]
    again, _ = drain(meta, path, token=before[3]["event_token"])
    assert [e["event_token"] for e in again] == [e["event_token"] for e in before[4:] + after]


def test_a_replica_stream_misses_nothing_of_the_tablets_a_reshard_added(clusters: EngineSet) -> None:
    """A replica cluster counts the replicated table's tablets from what its meta-cluster pushes, and
    its stream goes up to the least timestamp it recorded over that many tablets. Every push tells
    the count, a busy tablet's as well as an idle one's heartbeat: after a reshard to more tablets,
    the stream waits for the changes of the new tablets instead of passing them while they are still
    on their way (docs/reliability.md, "Found by the fault runs")."""
    path, replica_path, replica_id = replicated(clusters)
    meta, replica = clusters.meta, clusters.client("remote_0")
    start = meta.generate_timestamp()
    meta.insert_rows(path, [{"k": 1, "v": "one tablet"}], require_sync_replica=False)
    known = meta.generate_timestamp()
    token = ""

    def idle_and_counted() -> bool:
        # the idle table's heartbeats told the replica it has one tablet: its stream passes the row
        nonlocal token
        _, token = drain(replica, replica_path, ts=start)
        return token_timestamp(token) >= known

    wait_for(idle_and_counted, 30, "the replica's stream to pass the first row")
    clusters.alter(replica_id, enabled=False)
    meta.unmount_table(path)
    wait_for(lambda: meta.reshard_table(path, pivot_keys=[[], [10]]) is None, 30, "the reshard")
    meta.mount_table(path)
    # the new tablet's changes reach the replica one at a time, the old tablet's change at once
    meta.set(f"{path}/@replication_throttler", {"period": 1000, "limit": 50})
    for i in range(5):
        meta.insert_rows(path, [{"k": 10 + i, "v": f"new tablet {i}"}], require_sync_replica=False)
    meta.insert_rows(path, [{"k": 2, "v": "old tablet"}], require_sync_replica=False)
    expected, _ = drain(meta, path, ts=known)
    assert len(expected) == 6
    clusters.alter(replica_id, enabled=True, wait=False)
    got: list[dict[str, Any]] = []

    def caught_up() -> bool:
        nonlocal token
        events, token = drain(replica, replica_path, token=token)
        got.extend(events)
        return len(got) >= len(expected)

    try:
        wait_for(caught_up, 30, "the replica's stream to deliver every change")
    except AssertionError as exc:
        held = sorted(r["v"] for r in clusters.rows("remote_0", replica_path))
        raise AssertionError(f"{exc}; delivered {[e['row']['v'] for e in got]}, the replica table holds {held}") \
            from None
    assert [(e["key"]["k"], e["row"]["v"], e["timestamp"]) for e in got] == [
        (e["key"]["k"], e["row"]["v"], e["timestamp"]) for e in expected]
