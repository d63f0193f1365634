"""What a replica cluster accepts from its peers over ``/internal/v1``: checked like client input.

A replica applies what its meta-cluster sends (replicator pushes, sync prepares and commits), and
whoever holds the replica cluster's token can send the same requests. These tests post forged
requests with that token, as raw HTTP, and check that the replica answers each with a 4xx YT error
naming the table, column or field, and changes nothing: no row applied, the sink record unmoved
(a correct batch for the same row index still applies), no prepare left holding reads; that a
timestamp near 2^63 cannot poison the replica's clock (it stays writable, also after a restart);
and that a prepared transaction whose coordinator never answers stops blocking reads after
``--in-doubt-timeout``, and is aborted once that coordinator has left ``//sys/clusters``.

Two engines for the whole module (a meta-cluster and a replica cluster with a short in-doubt
bound); every test uses tables and directory entries of its own. The bounds that would need
hundreds of megabytes to reach over HTTP, and a prepare record written before these checks
existed, are checked in-process on a replica's real parts (``FakeHost`` of ``test_units.py``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from reptables.engine.config import EngineConfig
from reptables.engine.credentials import cell_tag, peer_credential
from reptables.engine.cypress import OBJECT_TYPES
from reptables.engine.errors import YtError
from reptables.engine.httpconn import dumps_json
from reptables.engine.process import free_port
from reptables.engine.replication.sink import ReplicaSink, read_sink
from reptables.engine.storage import prepared_table
from reptables.engine.timestamps import COUNTER_BITS
from reptables.engine.transactions import make_object_id
from reptables.testing import wait_for

from .conftest import SCHEMA, ClusterSet
from .test_units import SORTED, FakeHost, host

__all__ = ["host"]  # (the fixture, for pytest)

IN_DOUBT_TIMEOUT = 2.0
META = "primary"
REPLICA = "remote_0"
MAX_ROW_WEIGHT = 16 * 1024 * 1024
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}_{next(_names)}"


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    """The ``clusters`` set of this folder, with two engines and a short in-doubt bound."""
    cs = ClusterSet(Path(tmp_path_factory.mktemp("peers")), names=("primary", REPLICA))
    try:
        yield cs.start(extra_args=["--in-doubt-timeout", str(IN_DOUBT_TIMEOUT)])
    finally:
        cs.stop()


def internal(cs: ClusterSet, method: str, body: dict[str, Any], timeout: float = 30.0,
             caller: str = META) -> httpx.Response:
    """A raw ``/internal/v1`` call to the replica cluster, as ``caller`` (with its peer credential)."""
    engine = cs.engines[REPLICA]
    return httpx.post(f"{engine.url}/internal/v1/{method}", json=body, timeout=timeout,
                      headers={"Authorization": f"OAuth {peer_credential(engine.token, caller)}"})


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    error: dict[str, Any] = response.json()
    return error


def replica_table(cs: ClusterSet, name: str, schema: list[dict[str, Any]] = SCHEMA) -> tuple[str, str]:
    """A replica table on the replica cluster whose replica stays disabled (so no replicator pushes
    beside the test's own): (replica id, path)."""
    meta_path = cs.replicated_table(f"//tmp/{name}_meta", schema)
    path = f"//tmp/{name}"
    return cs.replica(meta_path, REPLICA, path, schema=schema, enable=False), path


def foreign_replica_table(cs: ClusterSet, name: str, meta: str) -> tuple[str, str]:
    """A replica table on the replica cluster fed by a replica of cluster ``meta`` (its id carries
    ``meta``'s cell tag): (replica id, path)."""
    replica_id = make_object_id(OBJECT_TYPES["table_replica"], cell_tag(meta))
    path = f"//tmp/{name}"
    client = cs.client(REPLICA)
    client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "upstream_replica_id": replica_id})
    client.mount_table(path)
    return replica_id, path


def change(ts: int, row: dict[str, Any], kind: str = "write") -> dict[str, Any]:
    return {"timestamp": ts, "kind": kind, "payload": {"row": row, "update": False}}


def push(replica_id: str, path: str, entries: list[dict[str, Any]], prev: int = 0,
         end: int | None = None, **fields: Any) -> dict[str, Any]:
    return {"upstream_replica_id": replica_id, "replica_path": path, "tablet_index": 0, "prev_row_index": prev,
            "row_index": prev + len(entries) if end is None else end, "preserve_timestamps": True,
            "entries": entries, **fields}


def prepare(tx_id: str, replica_id: str, path: str, rows: list[dict[str, Any]], ts: int,
            coordinator: str = "primary", **fields: Any) -> dict[str, Any]:
    return {"transaction_id": tx_id, "coordinator": coordinator, "replica_id": replica_id, "replica_path": path,
            "tablet_index": 0, "start_timestamp": ts, "prepare_timestamp": ts, "rows": rows, "kind": "write",
            "mask": 1, "update": False, "shared": False, "strong": False, **fields}


def seconds_ahead(seconds: float) -> int:
    return int(time.time() + seconds) << COUNTER_BITS


def add_unreachable_cluster(cs: ClusterSet, name: str) -> None:
    """A directory entry on the replica cluster pointing at a loopback port nobody listens on."""
    cs.client(REPLICA).set(f"//sys/clusters/{name}", {"proxy_url": f"http://127.0.0.1:{free_port()}",
                                                      "token": "unused-token"})


def in_doubt_count(cs: ClusterSet, outcome: str) -> float:
    engine = cs.engines[REPLICA]
    text = httpx.get(f"{engine.url}/metrics", timeout=10, headers={"Authorization": f"OAuth {engine.token}"}).text
    for line in text.splitlines():
        if line.startswith(f'reptables_in_doubt_transactions_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


# -- pushed rows ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "code", "words"), [
    ({"k": 1, "v": 5}, 307, ["'v'", "string"]),
    ({"k": 1, "v": "a", "extra": 1}, 1726, ["'extra'"]),
    ({"v": "a"}, 307, ["key column 'k'"]),
    ({"k": None, "v": "a"}, 307, ["'k'", "null"]),
    ({"k": "1", "v": "a"}, 307, ["'k'", "int64"]),
], ids=["number-in-string-column", "unknown-column", "missing-key", "null-key", "string-in-int-key"])
def test_a_pushed_row_is_checked_against_the_replica_schema(peers: ClusterSet, row: dict[str, Any], code: int,
                                                            words: list[str]) -> None:
    replica_id, path = replica_table(peers, unique("forged"))
    ts = peers.meta.generate_timestamp()
    error = error_of(internal(peers, "push", push(replica_id, path, [change(ts, row)])))
    assert error["code"] == code
    assert path in error["message"] and all(w in error["message"] for w in words), error["message"]
    assert peers.rows(REPLICA, path) == []
    # the sink record did not move: the correct batch for row 0 applies
    answer = internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1, "v": "a"})]))
    assert answer.status_code == 200 and answer.json() == {"row_index": 1, "applied": True}
    assert peers.rows(REPLICA, path) == [{"k": 1, "v": "a"}]


def test_a_pushed_row_over_the_row_weight_limit_is_refused(peers: ClusterSet) -> None:
    replica_id, path = replica_table(peers, "heavy")
    ts = peers.meta.generate_timestamp()
    error = error_of(internal(peers, "push", push(replica_id, path, [
        change(ts, {"k": 1, "v": "small"}), change(ts, {"k": 2, "v": "x" * (MAX_ROW_WEIGHT + 1)})])))
    assert error["code"] == 308 and path in error["message"]
    assert peers.rows(REPLICA, path) == []


def test_a_pushed_any_value_keeps_its_structure_and_must_be_yson(peers: ClusterSet) -> None:
    schema = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "a", "type": "any"}]
    replica_id, path = replica_table(peers, "any_values", schema)
    ts = peers.meta.generate_timestamp()
    # an any value travels as the YSON text its meta-cluster stored
    assert error_of(internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1, "a": "{x="})])))[
        "code"] == 307
    assert error_of(internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1, "a": {"x": 1}})])))[
        "code"] == 307
    assert internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1, "a": '{"x"=[1;2]}'})])).status_code \
        == 200
    assert peers.rows(REPLICA, path) == [{"k": 1, "a": {"x": [1, 2]}}]


def test_a_delete_pushed_to_an_ordered_replica_is_refused(peers: ClusterSet) -> None:
    ordered = [{"name": "k", "type": "int64"}, {"name": "v", "type": "string"}]
    replica_id, path = replica_table(peers, "ordered", ordered)
    ts = peers.meta.generate_timestamp()
    error = error_of(internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1}, kind="delete")])))
    assert error["code"] == 1716 and path in error["message"]
    assert peers.rows(REPLICA, path) == []


def test_a_batch_out_of_commit_order_is_refused(peers: ClusterSet) -> None:
    replica_id, path = replica_table(peers, unique("order"))
    first, second = peers.meta.generate_timestamp(), peers.meta.generate_timestamp()
    error = error_of(internal(peers, "push", push(replica_id, path, [
        change(second, {"k": 1, "v": "new"}), change(first, {"k": 1, "v": "old"})])))
    assert error["code"] == 101 and "commit order" in error["message"]
    assert peers.rows(REPLICA, path) == []


@pytest.mark.parametrize("fields", [
    {"prev_row_index": 5, "row_index": 3},
    {"prev_row_index": -1, "row_index": 0},
    {"prev_row_index": 0, "row_index": 0},
    {"tablet_index": -1},
    {"tablet_index": 10**12},
    {"preserve_timestamps": "yes"},
    {"entries": {"not": "a list"}},
    {"upstream_replica_id": 7},
    {"row_index": 10**9},
], ids=["prev-after-end", "negative-index", "more-changes-than-rows", "negative-tablet", "huge-tablet",
        "preserve-not-boolean", "entries-not-a-list", "replica-id-not-a-string", "batch-too-long"])
def test_malformed_push_fields_are_refused(peers: ClusterSet, fields: dict[str, Any]) -> None:
    replica_id, path = replica_table(peers, unique("fields"))
    ts = peers.meta.generate_timestamp()
    body = push(replica_id, path, [change(ts, {"k": 1, "v": "a"})])
    error = error_of(internal(peers, "push", {**body, **fields}))
    assert error["code"] == 101, error
    assert peers.rows(REPLICA, path) == []
    assert internal(peers, "push", body).json() == {"row_index": 1, "applied": True}


@pytest.mark.parametrize(("entry", "words"), [
    ({"timestamp": "1", "kind": "write", "payload": {"row": {"k": 1}, "update": False}}, "integer"),
    ({"timestamp": 1, "kind": "lock", "payload": {"row": {"k": 1}, "update": False}}, "kind"),
    ({"timestamp": 1, "kind": ["write"], "payload": {"row": {"k": 1}, "update": False}}, "kind"),
    ({"timestamp": 1, "kind": "write", "payload": "{not json"}, "payload"),
    ({"timestamp": 1, "kind": "write", "payload": {"update": False}}, "payload"),
    ({"timestamp": 1, "kind": "write", "payload": {"row": {"k": 1}, "update": "no"}}, "update"),
], ids=["timestamp-not-integer", "lock-kind", "kind-not-a-string", "payload-not-json", "no-row",
        "update-not-boolean"])
def test_a_malformed_change_is_refused(peers: ClusterSet, entry: dict[str, Any], words: str) -> None:
    replica_id, path = replica_table(peers, unique("change"))
    ts = peers.meta.generate_timestamp()
    if entry["timestamp"] == 1:
        entry = {**entry, "timestamp": ts}
    error = error_of(internal(peers, "push", push(replica_id, path, [entry])))
    assert words in error["message"], error["message"]
    assert peers.rows(REPLICA, path) == []


# -- timestamps ----------------------------------------------------------------------------------------


def test_a_pushed_timestamp_near_2_63_is_refused_and_the_replica_stays_writable(peers: ClusterSet) -> None:
    replica_id, path = replica_table(peers, "poison")
    for ts in (2**63 - 1, seconds_ahead(3600)):
        error = error_of(internal(peers, "push", push(replica_id, path, [change(ts, {"k": 1, "v": "a"})])))
        assert error["code"] == 1802 and "timestamp" in error["message"], error["message"]
    assert peers.rows(REPLICA, path) == []
    # a change an hour old is fine: a replica catching up receives old changes
    old = int(time.time() - 3600) << COUNTER_BITS
    assert internal(peers, "push", push(replica_id, path, [change(old, {"k": 1, "v": "a"})])).json()["applied"]

    replica = peers.client(REPLICA)
    plain = "//tmp/poison_plain"
    replica.create("table", plain, attributes={"dynamic": True, "schema": SCHEMA})
    replica.mount_table(plain)
    replica.insert_rows(plain, [{"k": 1, "v": "before restart"}])
    assert replica.generate_timestamp() >> COUNTER_BITS <= time.time() + 5
    peers.restart(REPLICA)
    replica.insert_rows(plain, [{"k": 2, "v": "after restart"}])
    assert [r["k"] for r in replica.select_rows(f"k from [{plain}]")] == [1, 2]
    assert replica.generate_timestamp() >> COUNTER_BITS <= time.time() + 5


def test_prepare_timestamps_are_checked(peers: ClusterSet) -> None:
    replica_id, path = replica_table(peers, "prepare_ts")
    ts = peers.meta.generate_timestamp()
    for start, prepared in ((2**63 - 1, 2**63 - 1), (ts, seconds_ahead(3600)), (ts + 10, ts)):
        error = error_of(internal(peers, "prepare", prepare(
            f"1-2-3-{start % 1000:x}", replica_id, path, [{"k": 1, "v": "a"}], ts,
            start_timestamp=start, prepare_timestamp=prepared)))
        assert error["code"] == 1802 and "timestamp" in error["message"], error["message"]
    started = time.monotonic()
    assert peers.rows(REPLICA, path) == []  # nothing prepared: the read does not wait
    assert time.monotonic() - started < 2


# -- prepared rows, coordinators, in-doubt transactions ----------------------------------------------


def test_prepared_rows_are_checked_against_the_replica_schema(peers: ClusterSet) -> None:
    replica_id, path = replica_table(peers, "prepare_rows")
    ts = peers.meta.generate_timestamp()
    error = error_of(internal(peers, "prepare", prepare("1-2-3-4", replica_id, path, [{"k": 1, "v": 5}], ts)))
    assert error["code"] == 307 and path in error["message"] and "'v'" in error["message"]
    error = error_of(internal(peers, "prepare", prepare("1-2-3-5", replica_id, path, [{"k": 1}], ts,
                                                        update="yes")))
    assert error["code"] == 101 and "update" in error["message"]
    started = time.monotonic()
    assert peers.rows(REPLICA, path) == []  # no prepare is held: the read does not wait for one
    assert time.monotonic() - started < 2


def test_a_prepare_naming_another_coordinator_than_its_caller_is_refused(peers: ClusterSet) -> None:
    """A prepare must name its caller as coordinator: one naming a cluster that does not exist (or
    another one) could never be decided by it, and would hold rows and reads."""
    replica_id, path = replica_table(peers, "unknown_coordinator")
    ts = peers.meta.generate_timestamp()
    error = error_of(internal(peers, "prepare", prepare("1-2-3-6", replica_id, path, [{"k": 1, "v": "a"}], ts,
                                                        coordinator="nowhere")))
    assert error["code"] == 901
    assert "nowhere" in error["message"] and "primary" in error["message"]
    started = time.monotonic()
    assert peers.rows(REPLICA, path) == []
    assert time.monotonic() - started < 2


def test_a_commit_timestamp_is_checked_and_a_refused_commit_keeps_the_prepare(peers: ClusterSet) -> None:
    add_unreachable_cluster(peers, "silent")  # the prepare stays until this test decides it
    replica_id, path = foreign_replica_table(peers, "commit_ts", "silent")
    ts = peers.meta.generate_timestamp()
    tx = "1-2-3-7"
    assert internal(peers, "prepare", prepare(tx, replica_id, path, [{"k": 1, "v": "a"}], ts,
                                              coordinator="silent"), caller="silent").status_code == 200
    for bad in (2**63 - 1, seconds_ahead(3600), ts - 1, "soon"):
        error = error_of(internal(peers, "commit", {"transaction_id": tx, "commit_timestamp": bad}, caller="silent"))
        assert error["code"] == 1802 and "commit timestamp" in error["message"], error["message"]
    commit_ts = peers.meta.generate_timestamp()
    assert internal(peers, "commit", {"transaction_id": tx, "commit_timestamp": commit_ts},
                    caller="silent").status_code == 200
    assert peers.rows(REPLICA, path) == [{"k": 1, "v": "a"}]
    assert peers.client(REPLICA).lookup_rows(path, [{"k": 1}], timestamp=commit_ts - 1) == []
    peers.client(REPLICA).remove("//sys/clusters/silent", recursive=True)


def test_an_in_doubt_prepare_stops_blocking_reads_and_is_aborted_once_its_coordinator_is_gone(
        peers: ClusterSet) -> None:
    add_unreachable_cluster(peers, "ghost")
    replica_id, path = foreign_replica_table(peers, "in_doubt", "ghost")
    ts = peers.meta.generate_timestamp()
    tx = "1-2-3-8"
    stalled_before = in_doubt_count(peers, "stalled")
    assert internal(peers, "prepare", prepare(tx, replica_id, path, [{"k": 1, "v": "a"}], ts,
                                              coordinator="ghost"), caller="ghost").status_code == 200
    replica = peers.client(REPLICA)

    # past the bound, a read fails at once with YT's retriable BlockedRowWaitTimeout naming the
    # transaction and its coordinator (before it, a read waits)
    def read_refused() -> bool:
        started = time.monotonic()
        response = httpx.post(f"{peers.engines[REPLICA].url}/api/v4/select_rows",
                              json={"query": f"* from [{path}]", "output_format": "json"},
                              headers={"Authorization": f"OAuth {peers.engines[REPLICA].token}",
                                       "X-YT-Header-Format": "json"}, timeout=30)
        if response.status_code == 200:
            raise AssertionError("a read served while a prepare is in doubt")
        error = error_of(response)
        return error["code"] == 1713 and time.monotonic() - started < 1.0 and tx in error["message"] \
            and "ghost" in error["message"]

    wait_for(read_refused, IN_DOUBT_TIMEOUT + 15, "reads refused at once")
    assert in_doubt_count(peers, "stalled") == stalled_before + 1

    # the coordinator leaves the directory: after the bound its transaction is aborted
    aborted_before = in_doubt_count(peers, "aborted_unknown_coordinator")
    replica.remove("//sys/clusters/ghost", recursive=True)
    wait_for(lambda: peers.rows(REPLICA, path) == [], IN_DOUBT_TIMEOUT + 15, "the in-doubt prepare aborted")
    assert in_doubt_count(peers, "aborted_unknown_coordinator") == aborted_before + 1
    # a late commit finds nothing to apply
    internal(peers, "commit", {"transaction_id": tx, "commit_timestamp": peers.meta.generate_timestamp()})
    assert peers.rows(REPLICA, path) == []


def test_a_late_read_at_a_timestamp_is_refused_at_once_while_a_prepare_is_stalled(peers: ClusterSet) -> None:
    add_unreachable_cluster(peers, "mute")
    replica_id, path = foreign_replica_table(peers, "stalled_snapshot", "mute")
    ts = peers.meta.generate_timestamp()
    assert internal(peers, "prepare", prepare("1-2-3-9", replica_id, path, [{"k": 1, "v": "a"}], ts,
                                              coordinator="mute"), caller="mute").status_code == 200
    replica = peers.client(REPLICA)

    def refused_at_once() -> bool:
        started = time.monotonic()
        try:
            replica.lookup_rows(path, [{"k": 1}], timestamp=replica.generate_timestamp())
        except YtError as exc:
            return exc.code == 1713 and time.monotonic() - started < 1.0
        raise AssertionError("a read at a timestamp after an in-doubt prepare was served")

    wait_for(refused_at_once, IN_DOUBT_TIMEOUT + 15, "reads at a timestamp refused at once")
    # a read at a timestamp before the prepare needs nothing from it
    assert replica.lookup_rows(path, [{"k": 1}], timestamp=ts - 1) == []
    assert internal(peers, "abort", {"transaction_id": "1-2-3-9"}, caller="mute").status_code == 200
    replica.remove("//sys/clusters/mute", recursive=True)


# -- in-process: the bounds too big for HTTP, records older than the checks -----------------------------


def test_a_batch_over_the_byte_bound_is_refused_with_413(host: FakeHost) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host, None, EngineConfig(max_peer_batch_bytes=1000))
    ts = host.timestamps.generate()
    batch = push("r-1", "//replica", [change(ts, {"k": k, "v": "x" * 100}) for k in range(20)])
    with pytest.raises(YtError) as refused:
        sink.handle_push(batch, None)
    assert refused.value.http_status == 413 and "max_peer_batch_bytes" in refused.value.message
    with host.storage.read() as conn:
        assert read_sink(conn, "r-1", 0) is None
    assert host.rows(table) == []
    batch["entries"] = batch["entries"][:5]
    batch["row_index"] = 5
    assert sink.handle_push(batch, None) == {"row_index": 5, "applied": True}


def test_a_prepare_over_the_transaction_row_limit_is_refused(host: FakeHost) -> None:
    host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host, None, EngineConfig(max_rows_per_transaction=10))
    ts = host.timestamps.generate()
    with pytest.raises(YtError) as refused:
        sink.handle_prepare(prepare("1-2-3-a", "r-1", "//replica", [{"k": k, "v": "a"} for k in range(11)], ts), None)
    assert refused.value.code == 1717
    assert not host.transactions.has_remote_prepared(host.resolve_table("//replica")[0].table_id)


def test_a_prepare_record_with_a_poisoned_timestamp_is_aborted_at_start_up(host: FakeHost) -> None:
    """A record a peer left before prepares were checked must neither stop the start nor move the clock."""
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    with host.storage.write() as conn:
        conn.execute(sa.insert(prepared_table).values(
            transaction_id="1-2-3-b", participant="p", start_timestamp=2**63 - 1, prepare_timestamp=2**63 - 1,
            coordinator="primary", payload=dumps_json({"table_id": table.table_id, "path": "//replica",
                                                       "extra": {}, "rows": [{"k": 1, "v": "a"}]}).decode()))
    assert host.transactions.recover() == (0, 1)
    assert host.timestamps.generate() >> COUNTER_BITS <= time.time() + 5
    assert not host.transactions.has_remote_prepared(table.table_id)
    with host.storage.read() as conn:
        assert conn.execute(sa.select(prepared_table)).all() == []
