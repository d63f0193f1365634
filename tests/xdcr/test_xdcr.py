"""Active-active replication between real engines (seed 001, docs/xdcr.md).

Cluster ids; XDCR tables; changes flowing both ways exactly once and never echoed; the seed's two
worked examples; the conflict log (CSV and ``//sys/xdcr_conflicts``, the seed's columns in its row
order); concurrent writers on the same keys converging, with every rejected action in the log;
pause, schema change and resume; reset and drop; a paused standby.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.errors import LockConflict, YtError
from reptables.testing import EngineProcess, wait_for

from .conftest import SCHEMA, XdcrGroup

_n = iter(range(1_000_000))


def fresh_path() -> str:
    return f"//tmp/users{next(_n)}"


def disconnect(group: XdcrGroup) -> None:
    for name in group.names:
        group.client(name).set("//sys/@xdcr_connections", [])
    time.sleep(0.7)  # the shippers notice and stop


def conflicts(group: XdcrGroup, name: str, path: str) -> list[dict[str, Any]]:
    return [r for r in group.client(name).select_rows(
        "* from [//sys/xdcr_conflicts]", output_row_limit=1_000_000) if r["TABLE_NAME"] == path]


def test_a_cluster_id_is_kept_and_cannot_change(tmp_path: Path) -> None:
    engine = EngineProcess("solo", tmp_path / "solo", extra_args=["--cluster-id", "7"]).start()
    try:
        engine.stop()
        storage = engine.extra_args[2:]  # the run's backend (--storage URL on PostgreSQL)
        engine.extra_args = ["--cluster-id", "8", *storage]
        with pytest.raises(RuntimeError, match="XDCR cluster id 7"):
            engine.start()
        engine.extra_args = storage
        engine.start()  # without the option: the stored id
        from reptables.engine.client import Client

        with Client(engine.url, engine.token) as c:
            assert c.call("dr_status", {})["cluster_id"] == 7
    finally:
        engine.stop()


def test_only_an_empty_sorted_table_becomes_an_xdcr_table(pair: XdcrGroup, tmp_path: Path) -> None:
    a = pair.client("a")
    path = fresh_path()
    a.create("table", path, attributes={"dynamic": True, "schema": SCHEMA})
    a.mount_table(path)
    a.insert_rows(path, [{"id": 1, "name": "x", "password": "y"}])
    with pytest.raises(YtError, match=f"Cannot make {path} an XDCR table: it holds rows"):
        a.set(f"{path}/@xdcr", True)
    with pytest.raises(YtError, match="only a sorted table"):
        a.create("table", fresh_path(), attributes={"dynamic": True, "xdcr": True,
                                                    "schema": [{"name": "m", "type": "string"}]})
    empty = fresh_path()
    a.create("table", empty, attributes={"dynamic": True, "schema": SCHEMA})
    a.set(f"{empty}/@xdcr", True)
    assert a.get(f"{empty}/@xdcr") is True
    plain = EngineProcess("noid", tmp_path / "noid").start()
    try:
        from reptables.engine.client import Client

        with Client(plain.url, plain.token) as c, pytest.raises(YtError, match="no XDCR cluster id"):
            c.create("table", "//tmp/x", attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True})
    finally:
        plain.stop()


def test_changes_flow_both_ways_once_and_are_never_echoed(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    a, b = pair.client("a"), pair.client("b")
    # (commit timestamps are each cluster's own: a stream starts from its cluster's timestamp)
    starts = {"a": a.generate_timestamp(), "b": b.generate_timestamp()}
    a.insert_rows(path, [{"id": i, "name": f"a{i}", "password": "p"} for i in range(5)])
    b.insert_rows(path, [{"id": 10 + i, "name": f"b{i}", "password": "p"} for i in range(5)])
    a.delete_rows(path, [{"id": 0}])
    wait_for(lambda: pair.converged(path) and len(pair.rows("a", path)) == 9, 20, "both clusters to converge")
    # each cluster's stream: its own changes, then the peer's once (origin says whose), nothing echoed
    for name, own, peer in (("a", 1, 2), ("b", 2, 1)):
        events = pair.client(name).pull_changes(path, from_timestamp=starts[name], wait_timeout=0,
                                                max_row_count=1000)["events"]
        origins = [(e["origin_cluster_id"], e["origin_timestamp"], e["key"]["id"]) for e in events
                   if e["kind"] != "heartbeat"]
        assert len(origins) == len(set(origins)) == 11
        assert sum(1 for o in origins if o[0] == own) == (6 if own == 1 else 5)
        assert sum(1 for o in origins if o[0] == peer) == (5 if own == 1 else 6)
    # (a saves b's progress once b answered: a moment after b shows the rows)
    wait_for(lambda: (lambda peer: peer["state"] == "connected" and peer["queued_rows"] == 0)(
        a.call("dr_status", {})["peers"]["b"]), 10, "a's queue to b empty")


def test_changes_ship_as_logged_with_infinite_doubles(pair: XdcrGroup) -> None:
    """A shipper passes each logged change on as it was logged; a row with an infinity is logged by
    the standard encoder (orjson would write null), and arrives as written."""
    schema = [{"name": "id", "type": "int64", "sort_order": "ascending"}, {"name": "x", "type": "double"}]
    path = pair.table(fresh_path(), schema=schema)
    a = pair.client("a")
    a.insert_rows(path, [{"id": 1, "x": float("inf")}, {"id": 2, "x": float("-inf")}, {"id": 3, "x": 1.5}])
    a.delete_rows(path, [{"id": 3}])
    a.insert_rows(path, [{"id": 1, "x": 2.5}])
    wait_for(lambda: pair.rows("b", path) == [{"id": 1, "x": 2.5}, {"id": 2, "x": float("-inf")}], 20,
             "b to have a's rows")
    a.insert_rows(path, [{"id": 1, "x": float("inf")}])
    wait_for(lambda: pair.rows("b", path)[0]["x"] == float("inf"), 20, "b to have the infinity again")
    # b received them: never shipped back, so a's rows stay as a wrote them
    assert pair.rows("a", path) == [{"id": 1, "x": float("inf")}, {"id": 2, "x": float("-inf")}]


def test_an_xdcr_table_nobody_streams_logs_only_what_its_shippers_need(pair: XdcrGroup) -> None:
    """``@enable_change_log %false`` on an XDCR table (docs/xdcr.md): changes still flow both ways and
    its stream is refused; switched on again, a stream starts at the switch and shows the peer's
    changes as well as its own, and the shippers go on as before (the log kept every change of its
    own, so nothing looks trimmed to them)."""
    path = pair.table(fresh_path())
    a, b = pair.client("a"), pair.client("b")
    a.set(f"{path}/@enable_change_log", False)
    assert a.get(f"{path}/@enable_change_log") is False and b.get(f"{path}/@enable_change_log") is True
    before_switch = a.generate_timestamp()
    a.insert_rows(path, [{"id": i, "name": "from-a", "password": "p"} for i in range(5)])
    b.insert_rows(path, [{"id": 10 + i, "name": "from-b", "password": "p"} for i in range(5)])
    a.delete_rows(path, [{"id": 0}])
    wait_for(lambda: pair.converged(path) and len(pair.rows("a", path)) == 9, 20, "both clusters to converge")
    with pytest.raises(YtError) as refused:
        a.pull_changes(path, wait_timeout=0)
    assert refused.value.code == 1762 and "enable_change_log" in refused.value.message

    a.set(f"{path}/@enable_change_log", True)
    with pytest.raises(YtError) as too_early:
        a.pull_changes(path, from_timestamp=before_switch, wait_timeout=0)
    assert too_early.value.code == 1760
    token = a.pull_changes(path, wait_timeout=0)["event_token"]
    b.insert_rows(path, [{"id": 20, "name": "from-b", "password": "p"}])
    a.insert_rows(path, [{"id": 21, "name": "from-a", "password": "p"}])
    wait_for(lambda: pair.converged(path) and len(pair.rows("b", path)) == 11, 20, "both clusters to converge again")
    events = [e for e in a.pull_changes(path, from_event_token=token, wait_timeout=0)["events"]
              if e["kind"] != "heartbeat"]
    assert sorted((e["key"]["id"], e["origin_cluster_id"]) for e in events) == [(20, 2), (21, 1)]
    wait_for(lambda: all(c.call("dr_status", {})["peers"][p]["state"] == "connected" and
                         c.call("dr_status", {})["peers"][p]["queued_rows"] == 0 for c, p in ((a, "b"), (b, "a"))),
             10, "both shippers connected, nothing queued")
    # removing the attribute restores an XDCR table's default: every change logged, its stream served
    a.set(f"{path}/@enable_change_log", False)
    a.remove(f"{path}/@enable_change_log")
    assert a.get(f"{path}/@enable_change_log") is True
    token = a.pull_changes(path, wait_timeout=0)["event_token"]
    b.insert_rows(path, [{"id": 22, "name": "from-b", "password": "p"}])
    wait_for(lambda: any(e["kind"] != "heartbeat" for e in
                         a.pull_changes(path, from_event_token=token, wait_timeout=0)["events"]), 20,
             "b's change in a's stream after the attribute was removed")


def test_a_cluster_that_only_receives_owes_its_peer_nothing(pair: XdcrGroup) -> None:
    """What b only received from a is never shipped back, so b's status never shows it queued for a,
    nor a lag, nor does b's drain wait for it (docs/xdcr.md: the peer's record of b's log passes
    such changes only every half second)."""
    path = pair.table(fresh_path())
    a, b = pair.client("a"), pair.client("b")
    seen: list[dict[str, Any]] = []
    for i in range(20):
        a.insert_rows(path, [{"id": 100 * i + j, "name": "from-a", "password": "p"} for j in range(10)])
        if i >= 2:
            seen.append(b.call("dr_status", {})["peers"]["a"])
        time.sleep(0.05)
    wait_for(lambda: len(pair.rows("b", path)) == 200, 20, "a's rows on b")
    seen.append(b.call("dr_status", {})["peers"]["a"])
    assert all(s["queued_rows"] == 0 and s["queued_bytes"] == 0 and s["lag_seconds"] == 0.0 for s in seen), seen
    started = time.monotonic()
    b.call("dr_pause", {})  # drained at once: b owes a nothing
    try:
        assert time.monotonic() - started < 5
        assert b.call("dr_status", {})["paused"]
    finally:
        b.call("dr_resume", {})
    # b's own change is owed until a has it
    b.insert_rows(path, [{"id": 5, "name": "from-b", "password": "p"}])
    wait_for(lambda: {"id": 5, "name": "from-b", "password": "p"} in pair.rows("a", path), 20, "b's row on a")
    wait_for(lambda: b.call("dr_status", {})["peers"]["a"]["queued_rows"] == 0, 10, "b's queue to a empty")


def _seed_row(pair: XdcrGroup, path: str) -> None:
    pair.client("a").insert_rows(path, [{"id": 12345, "name": "Joe Smith", "password": "abalone"}])
    wait_for(lambda: pair.rows("b", path) == [{"id": 12345, "name": "Joe Smith", "password": "abalone"}], 20,
             "the row on both clusters")


def test_seed_example_name_and_password_updates_converge(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    _seed_row(pair, path)
    disconnect(pair)
    try:
        # B changes the password first (earlier timestamp), A the name just after (later timestamp)
        pair.client("b").insert_rows(path, [{"id": 12345, "name": "Joe Smith", "password": "flounder"}])
        time.sleep(0.01)
        pair.client("a").insert_rows(path, [{"id": 12345, "name": "Joseph Smith", "password": "abalone"}])
    finally:
        pair.connect()
    final = [{"id": 12345, "name": "Joseph Smith", "password": "abalone"}]
    wait_for(lambda: pair.rows("a", path) == final and pair.rows("b", path) == final, 20,
             "the later update to win on both clusters")
    wait_for(lambda: len(conflicts(pair, "a", path)) == len(conflicts(pair, "b", path)) == 3, 20,
             "both clusters to log the conflict")
    # B accepted A's update (timestamp mismatch, A's is later); A rejected B's
    at_b, at_a = conflicts(pair, "b", path), conflicts(pair, "a", path)
    assert [(r["ROW_TYPE"], r["ACTION_TYPE"], r["CONFLICT_TYPE"], r["DECISION"]) for r in at_b] == [
        ("EXT", "U", "MSMT", "A"), ("EXP", "U", "MSMT", "A"), ("NEW", "U", "NONE", "A")]
    assert [(r["ROW_TYPE"], r["ACTION_TYPE"], r["CONFLICT_TYPE"], r["DECISION"]) for r in at_a] == [
        ("EXT", "U", "MSMT", "R"), ("EXP", "U", "MSMT", "R"), ("NEW", "U", "NONE", "R")]
    ext_b, exp_b, new_b = at_b
    assert ext_b["CLUSTER_ID"] == 2 and '"flounder"' in ext_b["TUPLE"]   # the row B had, B's own write
    assert exp_b["CLUSTER_ID"] == 1 and '"abalone"' in exp_b["TUPLE"]    # what A's update expected
    assert new_b["CLUSTER_ID"] == 1 and '"Joseph Smith"' in new_b["TUPLE"]
    assert new_b["TIMESTAMP"] > ext_b["TIMESTAMP"]
    assert ext_b["LOSING_WRITE"] == "local" and at_a[0]["LOSING_WRITE"] == "replicated"
    assert {r["CURRENT_CLUSTER_ID"] for r in at_b} == {2} and {r["DIVERGENCE"] for r in at_a + at_b} == {"C"}


def test_seed_example_delete_beats_a_later_update(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    _seed_row(pair, path)
    disconnect(pair)
    try:
        pair.client("b").delete_rows(path, [{"id": 12345}])               # earlier
        time.sleep(0.01)
        pair.client("a").insert_rows(path, [{"id": 12345, "name": "Joseph Smith", "password": "abalone"}])
    finally:
        pair.connect()
    wait_for(lambda: pair.rows("a", path) == [] and pair.rows("b", path) == [], 20, "the delete to win everywhere")
    wait_for(lambda: len(conflicts(pair, "a", path)) == len(conflicts(pair, "b", path)) == 3, 20,
             "both clusters to log the conflict")
    at_b, at_a = conflicts(pair, "b", path), conflicts(pair, "a", path)
    # B: A's update found no row (it was deleted): missing row, rejected
    assert [(r["ROW_TYPE"], r["CONFLICT_TYPE"], r["DECISION"]) for r in at_b] == [
        ("EXT", "MISS", "R"), ("EXP", "MISS", "R"), ("NEW", "NONE", "R")]
    # A: B's delete met A's newer row: a timestamp mismatch, and DELETE wins
    assert [(r["ROW_TYPE"], r["ACTION_TYPE"], r["CONFLICT_TYPE"], r["DECISION"]) for r in at_a] == [
        ("EXT", "D", "MSMT", "A"), ("EXP", "D", "MSMT", "A"), ("DEL", "D", "NONE", "A")]
    assert at_a[0]["LOSING_WRITE"] == "local"


def test_conflicts_are_written_as_csv_under_the_data_directory(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    _seed_row(pair, path)
    disconnect(pair)
    try:
        pair.client("b").insert_rows(path, [{"id": 12345, "name": "x", "password": "1"}])
        time.sleep(0.01)
        pair.client("a").insert_rows(path, [{"id": 12345, "name": "y", "password": "2"}])
    finally:
        pair.connect()
    wait_for(lambda: len(conflicts(pair, "b", path)) == 3, 20, "the conflict at B")
    files = sorted((pair.engines["b"].data_dir / "xdcr_conflicts").glob("LOG_*.csv"))
    assert files
    with files[-1].open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["TABLE_NAME"] == path]
    assert list(rows[0]) == ["ROW_TYPE", "ACTION_TYPE", "CONFLICT_TYPE", "CONFLICTS_ON_PRIMARY_KEY", "DECISION",
                             "CLUSTER_ID", "TIMESTAMP", "DIVERGENCE", "TABLE_NAME", "CURRENT_CLUSTER_ID",
                             "CURRENT_TIMESTAMP", "TUPLE", "LOSING_WRITE", "KEY"]
    assert [r["ROW_TYPE"] for r in rows] == ["EXT", "EXP", "NEW"]
    # the row's key in a column of its own; both timestamps in one unit (microseconds since the epoch)
    assert {r["KEY"] for r in rows} == {'{"id": 12345}'}
    now_us = time.time() * 1e6
    for r in rows:
        assert now_us - 120e6 < int(r["TIMESTAMP"]) <= now_us and now_us - 120e6 < int(r["CURRENT_TIMESTAMP"]) <= now_us
    # the file holds whole rows: only the engine's user reads it
    assert files[-1].stat().st_mode & 0o777 == 0o600


def _writer(group: XdcrGroup, name: str, path: str, keys: range, stop: threading.Event, seen: list[int]) -> None:
    client = group.client(name)
    i = 0
    while not stop.is_set():
        key = keys[i % len(keys)]
        try:
            if i % 11 == 5:
                client.delete_rows(path, [{"id": key}])
            else:
                client.insert_rows(path, [{"id": key, "name": f"{name}{i}", "password": str(i)},
                                          {"id": 1000 + key + 100 * ord(name), "name": name, "password": str(i)}])
        except LockConflict:
            continue  # a peer's change to the key was applied meanwhile (1700): retried, as a client does
        seen.append(i)
        i += 1


def _concurrent_run(group: XdcrGroup, path: str, seconds: float) -> int:
    stop = threading.Event()
    counts: dict[str, list[int]] = {n: [] for n in group.names}
    threads = [threading.Thread(target=_writer, args=(group, n, path, range(20), stop, counts[n]))
               for n in group.names]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(len(c) for c in counts.values())


def _starts(group: XdcrGroup) -> dict[str, int]:
    """Each cluster's current timestamp (commit timestamps are per cluster)."""
    return {name: group.client(name).generate_timestamp() for name in group.names}


def _accounted(group: XdcrGroup, path: str, starts: dict[str, int]) -> None:
    """Every action a cluster received was applied (its stream shows it) or rejected in its log."""
    versions: dict[str, set[tuple[int, int]]] = {}
    applied: dict[str, set[tuple[int, int]]] = {}
    for name in group.names:
        client = group.client(name)
        events: list[dict[str, Any]] = []
        # read the stream up to a timestamp taken now, not only until an answer without events: a
        # commit in flight with an earlier timestamp holds the stream's bound before a commit that
        # already landed (a heartbeat below ``until`` says nothing of what comes after it)
        until, deadline = client.generate_timestamp(), time.monotonic() + 30
        answer = client.pull_changes(path, from_timestamp=starts[name], wait_timeout=0, max_row_count=100_000)
        while True:
            found = [e for e in answer["events"] if e["kind"] != "heartbeat"]
            events += found
            if not found and answer["timestamp"] >= until:
                break
            assert time.monotonic() < deadline, f"the stream of {name} did not reach {until}"
            answer = client.pull_changes(path, from_event_token=answer["event_token"],
                                         wait_timeout=0 if found else 500, max_row_count=100_000)
        own = group.names.index(name) + 1
        versions[name] = {(e["origin_cluster_id"], e["origin_timestamp"]) for e in events
                          if e["origin_cluster_id"] == own}
        applied[name] = {(e["origin_cluster_id"], e["origin_timestamp"]) for e in events
                         if e["origin_cluster_id"] != own}
    for name in group.names:
        rejected = {(r["CLUSTER_ID"], r["TIMESTAMP"]) for r in conflicts(group, name, path)
                    if r["ROW_TYPE"] in ("NEW", "DEL") and r["DECISION"] == "R"}
        for other in group.names:
            if other == name:
                continue
            missing = versions[other] - applied[name] - rejected
            assert not missing, f"{len(missing)} actions of {other} neither applied at {name} nor in its conflict log"


def test_two_clusters_writing_the_same_keys_converge(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    starts = _starts(pair)
    written = _concurrent_run(pair, path, 4.0)
    assert written > 50
    wait_for(lambda: pair.converged(path), 60, "the two clusters to converge")
    _accounted(pair, path, starts)
    assert conflicts(pair, "a", path) or conflicts(pair, "b", path), "same keys written on both: conflicts expected"


def test_three_clusters_writing_the_same_keys_converge(tmp_path: Path) -> None:
    group = XdcrGroup(tmp_path, names=("a", "b", "c")).start()
    try:
        group.connect()
        path = group.table(fresh_path())
        starts = _starts(group)
        _concurrent_run(group, path, 4.0)
        wait_for(lambda: group.converged(path), 60, "the three clusters to converge")
        _accounted(group, path, starts)
        # dr_drop: c leaves; a and b forget it and go on together
        status = group.client("c").call("dr_drop", {})
        assert status["connections"] == []
        wait_for(lambda: "c" not in group.client("a").call("dr_status", {})["connections"], 10, "a to forget c")
        assert "c" not in group.client("b").call("dr_status", {})["connections"]
        group.client("c").insert_rows(path, [{"id": 999, "name": "c only", "password": "-"}])
        group.client("a").insert_rows(path, [{"id": 998, "name": "a", "password": "-"}])
        wait_for(lambda: any(r["id"] == 998 for r in group.rows("b", path)), 20, "a's change to reach b")
        time.sleep(1.0)
        assert all(r["id"] != 999 for r in group.rows("a", path) + group.rows("b", path))
    finally:
        group.stop()


def test_a_peer_down_for_a_while_catches_up(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    b_engine = pair.engines["b"]
    pair.clients.pop("b").close()
    b_engine.stop()
    try:
        for i in range(40):
            pair.client("a").insert_rows(path, [{"id": i, "name": "while b was down", "password": str(i)}])
        time.sleep(20)  # the issue's outage: the shipper keeps trying, the log keeps every change
        status = pair.client("a").call("dr_status", {})["peers"]["b"]
        assert status["queued_rows"] >= 40 and status["last_error"]
    finally:
        b_engine.start()
    wait_for(lambda: len(pair.rows("b", path)) == 40 and pair.converged(path), 30, "b to catch up")


def test_sigkill_under_load_loses_and_duplicates_nothing(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    starts = _starts(pair)
    stop = threading.Event()
    acknowledged: list[int] = []

    def write_b() -> None:
        client = pair.client("b")
        i = 0
        while not stop.is_set():
            try:
                client.insert_rows(path, [{"id": 10_000 + i, "name": "b", "password": str(i)}])
                acknowledged.append(10_000 + i)
            except Exception:  # noqa: BLE001 - a write may fail while its peer is down, never while b is up
                pass
            i += 1

    thread = threading.Thread(target=write_b)
    thread.start()
    for i in range(30):
        pair.client("a").insert_rows(path, [{"id": i, "name": "a", "password": str(i)}])
    pair.restart("a", kill=True)  # a SIGKILL while b ships to it and a ships to b
    for i in range(30, 60):
        pair.client("a").insert_rows(path, [{"id": i, "name": "a", "password": str(i)}])
    stop.set()
    thread.join()
    expected = set(range(60)) | set(acknowledged)
    wait_for(lambda: {r["id"] for r in pair.rows("a", path)} == expected and pair.converged(path), 60,
             "both clusters to hold every acknowledged row")
    _accounted(pair, path, starts)
    events = pair.client("a").pull_changes(path, from_timestamp=starts["a"], wait_timeout=0,
                                           max_row_count=100_000)["events"]
    received = [(e["origin_cluster_id"], e["origin_timestamp"], e["key"]["id"]) for e in events
                if e["kind"] != "heartbeat" and e["origin_cluster_id"] == 2]
    assert len(received) == len(set(received)) == len(acknowledged)  # each of b's changes applied once


def test_pause_change_the_schema_and_resume(pair: XdcrGroup) -> None:
    path = pair.table(fresh_path())
    a, b = pair.client("a"), pair.client("b")
    a.insert_rows(path, [{"id": 1, "name": "before", "password": "p"}])
    wider = [*SCHEMA, {"name": "email", "type": "string"}]
    with pytest.raises(YtError, match="pause and drain every cluster"):
        a.call("alter_table", {"path": path, "schema": wider})
    for client in (a, b):
        status = client.call("dr_pause", {})
        assert status["paused"] is True
    assert pair.rows("b", path) == [{"id": 1, "name": "before", "password": "p"}]  # drained before it returned
    with pytest.raises(YtError) as refused:
        a.insert_rows(path, [{"id": 2, "name": "x", "password": "y"}])
    assert refused.value.code == 605 and "paused" in str(refused.value)
    for client in (a, b):
        client.call("alter_table", {"path": path, "schema": wider})
        client.call("dr_resume", {})
    a.insert_rows(path, [{"id": 2, "name": "after", "password": "p", "email": "e@x"}])
    wait_for(lambda: pair.rows("b", path)[-1].get("email") == "e@x", 20, "the new column to replicate")


def test_a_schema_mismatch_waits_and_says_why(pair: XdcrGroup) -> None:
    path = fresh_path()
    pair.client("a").create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True})
    pair.client("a").mount_table(path)
    other = [*SCHEMA, {"name": "extra", "type": "int64"}]
    pair.client("b").create("table", path, attributes={"dynamic": True, "schema": other, "xdcr": True})
    pair.client("b").mount_table(path)
    pair.client("a").insert_rows(path, [{"id": 1, "name": "n", "password": "p"}])
    wait_for(lambda: pair.client("a").call("dr_status", {})["peers"]["b"]["state"] == "waiting_for_schema", 20,
             "the shipper to wait for the schema")
    assert "differs" in pair.client("a").call("dr_status", {})["peers"]["b"]["last_error"]
    for name in ("a", "b"):  # (a table that never matches would keep a's drain from ending)
        pair.client(name).unmount_table(path)
        pair.client(name).remove(path)


def test_reset_of_one_peer_needs_force(pair: XdcrGroup) -> None:
    with pytest.raises(YtError, match="give --force"):
        pair.client("a").call("dr_reset", {"cluster": "b"})
    with pytest.raises(YtError, match="no XDCR connection to nowhere"):
        pair.client("a").call("dr_reset", {"cluster": "nowhere", "force": True})
    status = pair.client("a").call("dr_reset", {"cluster": "b", "force": True})
    assert status["connections"] == []
    pair.connect()  # (the module's other tests use the pair)


def test_a_cluster_started_paused_is_a_read_only_standby(tmp_path: Path) -> None:
    group = XdcrGroup(tmp_path, names=("a", "s"))
    group.start()
    try:
        engine = group.engines["s"]
        group.clients.pop("s").close()
        engine.stop()
        engine.extra_args = [*engine.extra_args, "--paused"]
        engine.start()
        group.connect()
        path = group.table(fresh_path())
        with pytest.raises(YtError, match="paused"):
            group.client("s").insert_rows(path, [{"id": 1, "name": "n", "password": "p"}])
        group.client("a").insert_rows(path, [{"id": 1, "name": "from a", "password": "p"}])
        wait_for(lambda: group.rows("s", path) == [{"id": 1, "name": "from a", "password": "p"}], 20,
                 "the standby to apply a's change")
    finally:
        group.stop()


def test_reptables_dr_commands(pair: XdcrGroup) -> None:
    import json
    import os
    import subprocess
    import sys

    engine = pair.engines["a"]
    env = {**os.environ, "YT_PROXY": engine.url, "YT_TOKEN": engine.token or ""}

    def dr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reptables.operator.cli", "dr", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    status = json.loads(dr("status").stdout)
    assert status["cluster_id"] == 1 and "b" in status["peers"]
    paused = dr("pause")
    assert paused.returncode == 0 and json.loads(paused.stdout)["paused"] is True
    assert json.loads(dr("resume").stdout)["paused"] is False
    refused = dr("reset", "--cluster", "b")
    assert refused.returncode == 1 and "--force" in refused.stderr


def test_a_peer_sending_a_bad_row_is_refused_and_nothing_is_applied(pair: XdcrGroup) -> None:
    import httpx

    from reptables.engine.credentials import peer_credential

    path = pair.table(fresh_path())
    engine = pair.engines["a"]
    body = {"path": path, "origin_cluster": "b", "origin_cluster_id": 2,
            "schema": [{"name": "id", "type": "int64", "sort_order": "ascending", "required": False},
                       {"name": "name", "type": "string", "sort_order": None, "required": False},
                       {"name": "password", "type": "string", "sort_order": None, "required": False}],
            "end": [1, 1],
            "actions": [{"p": [1, 0], "k": "insert", "key": None, "row": {"id": 1, "name": "ok", "password": "p"},
                         "o": [1, 2], "e": None, "b": None},
                        {"p": [1, 1], "k": "insert", "key": None, "row": {"id": "not a number", "name": "x"},
                         "o": [2, 2], "e": None, "b": None}]}
    answer = httpx.post(f"{engine.url}/internal/v1/xdcr_apply", json=body, timeout=10,
                        headers={"Authorization": f"OAuth {peer_credential(engine.token, 'b')}"})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["code"] == 307 and error["attributes"] == {"column": "id", "path": path}, answer.text
    assert pair.rows("a", path) == []  # the valid row of the batch was not applied either
