"""Seed 002's "wait for the state" procedures, replayed with the official ``yt`` CLI.

``alter-table-replica --enable`` returns at once and the replica is ``enabling`` until its
replicator has really started (a first pass over every tablet), then ``enabled``; ``--disable``
leaves it ``disabling`` until the replicator has finished its push in flight and stopped. A
``freeze-table`` leaves the table ``freezing`` while a commit on it is in flight, then ``frozen``,
after which the seed's queue check (``flushed_row_count`` against ``current_replication_row_index``)
holds. Both transitions survive a restart of the meta-cluster. The operator's reconcile core
waits on them: a TableReplica is not Ready (reason ``Enabling``/``Disabling``) meanwhile, and it
sends one ``alter_table_replica`` per change, not one per reconcile.

To make the windows observable the replica cluster ``remote_0`` is reached by the meta-cluster
through :class:`GateProxy`, a real HTTP proxy standing in for a slow network: the internal calls it
is told to hold (``push``: the replicator's batches, ``prepare``: a commit's sync replica) wait
until the test releases them. Everything else — three engine processes, the ``yt`` CLI — is real.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.operator.controllers.world import Engines
from reptables.operator.registry import CredentialPolicy, Registry
from reptables.testing import EngineProcess, wait_for
from tests.operator.test_bootstrap import OPS, Operator, cluster, condition, replica, secret, table
from tests.replication.conftest import ClusterSet

TABLE = "//tmp/rt"
REPLICA = "//tmp/r"
META, SLOW, OTHER = "primary", "remote_0", "remote_1"


class GateProxy:
    """A forwarding HTTP proxy in front of one engine; internal calls named in ``hold`` wait for
    :meth:`release` (or 60 s)."""

    def __init__(self, upstream_url: str) -> None:
        target = urlsplit(upstream_url)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 80
        self._held: frozenset[str] = frozenset()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._waiting = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.forward(self)

            do_POST = do_PUT = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def hold(self, *methods: str) -> None:
        self._held = frozenset(methods)
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def forward(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else None
        path = request.path.split("?", 1)[0]
        if path.startswith("/internal/") and path.rsplit("/", 1)[-1] in self._held and not self._open.is_set():
            with self._lock:
                self._waiting += 1
            try:
                self._open.wait(60)
            finally:
                with self._lock:
                    self._waiting -= 1
        upstream = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "connection")}
            upstream.request(request.command, request.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        request.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                request.send_header(key, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def slow_clusters(base: Path, names: tuple[str, ...]) -> Iterator[tuple[ClusterSet, GateProxy]]:
    """Engines (sync replicas wait up to 30 s for a prepare) of which the meta-cluster reaches
    ``remote_0`` through a :class:`GateProxy`."""
    cs = ClusterSet(base, names=names).start(extra_args=["--sync-replica-timeout", "30"])
    proxy = GateProxy(cs.engines[SLOW].url)
    try:
        directory = {n: {"proxy_url": proxy.url if n == SLOW else e.url, "token": peer_credential(e.token, META)}
                     for n, e in cs.engines.items()}
        cs.meta.set("//sys/clusters", directory)
        yield cs, proxy
    finally:
        proxy.close()
        cs.stop()


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[tuple[ClusterSet, GateProxy]]:
    """The meta-cluster and the slow ``remote_0``."""
    with slow_clusters(tmp_path, (META, SLOW)) as clusters:
        yield clusters


@pytest.fixture
def slow3(tmp_path: Path) -> Iterator[tuple[ClusterSet, GateProxy]]:
    """The meta-cluster, the slow ``remote_0`` and ``remote_1`` reached directly."""
    with slow_clusters(tmp_path, (META, SLOW, OTHER)) as clusters:
        yield clusters


def yt_get(cs: ClusterSet, path: str) -> Any:
    return json.loads(cs.engines[META].yt("get", path, "--format", "json").stdout)


def yt_state(cs: ClusterSet, replica_id: str) -> str:
    return str(yt_get(cs, f"#{replica_id}/@state"))


def wait_yt_state(cs: ClusterSet, replica_id: str, state: str, timeout: float = 30.0) -> None:
    wait_for(lambda: yt_state(cs, replica_id) == state, timeout, f"replica {replica_id} {state}")


def insert(cs: ClusterSet, *rows: dict[str, Any]) -> None:
    cs.meta.insert_rows(TABLE, list(rows), require_sync_replica=False)


def timed_yt(cs: ClusterSet, *args: str) -> float:
    started = time.monotonic()
    cs.engines[META].yt(*args)
    return time.monotonic() - started


def test_enable_and_disable_pass_through_enabling_and_disabling(slow: tuple[ClusterSet, GateProxy]) -> None:
    cs, proxy = slow
    cs.replicated_table(TABLE)
    replica_id = cs.replica(TABLE, SLOW, REPLICA, enable=False)
    insert(cs, {"k": 1, "v": "one"})
    assert yt_state(cs, replica_id) == "disabled"

    # the replica cluster answers the compatibility check, but the replicator's batches hang
    proxy.hold("push")
    assert timed_yt(cs, "alter-table-replica", replica_id, "--enable") < 10.0  # returns, does not wait
    wait_for(lambda: proxy.waiting >= 1, 10.0, "the replicator's first push")
    assert yt_state(cs, replica_id) == "enabling"
    assert all(t["state"] == "enabling" for t in yt_get(cs, f"#{replica_id}/@tablets"))
    time.sleep(0.3)
    assert yt_state(cs, replica_id) == "enabling"  # its first pass is not done
    proxy.release()
    wait_yt_state(cs, replica_id, "enabled")
    wait_for(lambda: cs.rows(SLOW, REPLICA) == [{"k": 1, "v": "one"}], 10.0, "the row at the replica")

    # a push in flight when the replica is disabled: disabling until it is done and saved
    proxy.hold("push")
    insert(cs, {"k": 2, "v": "two"})
    wait_for(lambda: proxy.waiting >= 1, 10.0, "a push in flight")
    assert timed_yt(cs, "alter-table-replica", replica_id, "--disable") < 10.0
    assert yt_state(cs, replica_id) == "disabling"
    time.sleep(0.3)
    assert yt_state(cs, replica_id) == "disabling"
    proxy.release()
    wait_yt_state(cs, replica_id, "disabled")
    # the batch in flight arrived and its progress was saved before the replicator stopped
    assert cs.rows(SLOW, REPLICA) == [{"k": 1, "v": "one"}, {"k": 2, "v": "two"}]
    tablets = yt_get(cs, f"#{replica_id}/@tablets")
    assert [t["current_replication_row_index"] for t in tablets] == [t["flushed_row_count"] for t in tablets]
    # disabled: nothing more is pushed
    insert(cs, {"k": 3, "v": "three"})
    time.sleep(0.5)
    assert len(cs.rows(SLOW, REPLICA)) == 2

    # what makes enabling impossible still fails the command itself, and nothing changes
    narrow = [{"name": "k", "type": "int64", "sort_order": "ascending"}]
    narrow_id = cs.replica(TABLE, SLOW, "//tmp/narrow", schema=narrow, enable=False)
    result = cs.engines[META].yt("alter-table-replica", narrow_id, "--enable", check=False)
    assert result.returncode != 0
    assert f"Cannot enable replica {narrow_id}" in result.stderr and "has no column 'v'" in result.stderr
    assert yt_state(cs, narrow_id) == "disabled"

    # with no commit in flight a freeze is complete when the command returns
    cs.engines[META].yt("freeze-table", TABLE)
    assert yt_get(cs, f"{TABLE}/@tablet_state") == "frozen"
    cs.engines[META].yt("unfreeze-table", TABLE)
    assert yt_get(cs, f"{TABLE}/@tablet_state") == "mounted"


def test_transitions_survive_a_restart_of_the_meta_cluster(slow: tuple[ClusterSet, GateProxy]) -> None:
    cs, proxy = slow
    cs.replicated_table(TABLE)
    enabling = cs.replica(TABLE, SLOW, REPLICA, enable=False)
    insert(cs, {"k": 1, "v": "one"})
    proxy.hold("push")
    cs.alter(enabling, enabled=True, wait=False)
    wait_for(lambda: proxy.waiting >= 1, 10.0, "the replicator's first push")
    assert yt_state(cs, enabling) == "enabling"
    cs.restart(META)  # SIGKILL mid-enabling
    assert yt_state(cs, enabling) == "enabling"  # persisted
    proxy.release()
    wait_yt_state(cs, enabling, "enabled")
    wait_for(lambda: cs.rows(SLOW, REPLICA) == [{"k": 1, "v": "one"}], 10.0, "the row at the replica")

    proxy.hold("push")
    insert(cs, {"k": 2, "v": "two"})
    wait_for(lambda: proxy.waiting >= 1, 10.0, "a push in flight")
    cs.alter(enabling, enabled=False, wait=False)
    assert yt_state(cs, enabling) == "disabling"
    cs.restart(META)  # SIGKILL mid-disabling: no replicator runs after the restart
    wait_yt_state(cs, enabling, "disabled")
    proxy.release()
    # enabled again, it delivers what it missed exactly once
    cs.alter(enabling, enabled=True)
    wait_for(lambda: cs.rows(SLOW, REPLICA) == [{"k": 1, "v": "one"}, {"k": 2, "v": "two"}], 10.0,
             "both rows at the replica")


def test_freeze_waits_for_the_commit_in_flight_then_the_queue_check(slow3: tuple[ClusterSet, GateProxy]) -> None:
    cs, proxy = slow3
    cs.replicated_table(TABLE)
    sync_id = cs.replica(TABLE, SLOW, REPLICA, mode="sync")  # waits for "enabled"
    # an enabled sync replica is in every commit: a write fails (1732, draining) or reaches it
    def first_write() -> bool:
        try:
            cs.meta.insert_rows(TABLE, [{"k": 1, "v": "one"}])
        except YtError as exc:
            assert exc.code == 1732, exc  # SyncReplicaNotInSync, retriable
            return False
        assert cs.rows(SLOW, REPLICA) == [{"k": 1, "v": "one"}]
        return True

    wait_for(first_write, 10.0, "a write through the sync replica")
    async_id = cs.replica(TABLE, OTHER, REPLICA)

    # a commit in flight: its sync replica's prepare hangs
    proxy.hold("prepare")
    outcome: list[Any] = []

    def write() -> None:
        with Client(cs.engines[META].url, cs.engines[META].token, timeout=60.0) as writer:
            try:
                writer.insert_rows(TABLE, [{"k": 2, "v": "two"}])
                outcome.append("committed")
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: proxy.waiting >= 1, 10.0, "the commit's prepare in flight")
        assert timed_yt(cs, "freeze-table", TABLE) < 10.0  # returns, does not wait
        assert yt_get(cs, f"{TABLE}/@tablet_state") == "freezing"
        assert [t["state"] for t in yt_get(cs, f"{TABLE}/@tablets")] == ["freezing"]
        # from freezing on, new writes are refused with the frozen error
        refused = cs.engines[META].yt("insert-rows", TABLE, "--format", "json", "--no-require-sync-replica",
                                      input='{"k": 3, "v": "three"}', check=False)
        assert refused.returncode != 0 and "frozen" in refused.stderr, refused.stderr
        time.sleep(0.3)
        assert yt_get(cs, f"{TABLE}/@tablet_state") == "freezing"
    finally:
        proxy.release()
        writer.join(60)
    assert outcome == ["committed"]  # the commit in flight went through
    wait_for(lambda: yt_get(cs, f"{TABLE}/@tablet_state") == "frozen", 10.0, "frozen")
    assert [t["state"] for t in yt_get(cs, f"{TABLE}/@tablets")] == ["frozen"]

    # seed 002, "Checking a replication queue": each replica ends with every flushed row
    for replica_id in (sync_id, async_id):
        def replicated(replica_id: str = replica_id) -> bool:
            tablets = yt_get(cs, f"#{replica_id}/@tablets")
            return all(t["flushed_row_count"] == t["current_replication_row_index"] for t in tablets)

        wait_for(replicated, 15.0, f"replica {replica_id} has the whole queue")
    assert yt_get(cs, f"#{async_id}/@tablets")[0]["flushed_row_count"] == 2
    assert cs.rows(OTHER, REPLICA) == [{"k": 1, "v": "one"}, {"k": 2, "v": "two"}]

    cs.engines[META].yt("unfreeze-table", TABLE)
    assert yt_get(cs, f"{TABLE}/@tablet_state") == "mounted"
    cs.meta.insert_rows(TABLE, [{"k": 3, "v": "three"}])


def test_the_operator_waits_for_enabling_and_disabling(tmp_path: Path) -> None:
    """The reconcile core over real engines: a TableReplica is not Ready while its replica is
    enabling or disabling, and the operator sends no second alter meanwhile."""
    engines = {name: EngineProcess(name, tmp_path / name, token=f"token-{name}-0123456789abcdef")
               for name in ("meta", "target")}
    proxy: GateProxy | None = None
    try:
        for engine in engines.values():
            engine.start()
        proxy = GateProxy(engines["target"].url)
        registry = Registry(Engines(), OPS, CredentialPolicy(frozenset({OPS})))
        op = Operator(engines, registry, launcher=None)  # type: ignore[arg-type]  # no jobs here
        for index, (name, url) in enumerate((("meta", engines["meta"].url), ("target", proxy.url))):
            registry.upsert_secret(secret(f"{name}-token", engines[name].read_token()))
            op.add(cluster(name, url, index))  # the meta-cluster reaches target through the proxy
        doc = table("orders")
        doc["spec"]["minReplicationLogTtl"] = "10m"  # the queued row waits for the replica
        op.add(doc)
        op.until(lambda: "tableId" in next(iter(registry.of_kind("ReplicatedTable"))).status, 30, "the table")
        with op.client("meta") as meta:
            meta.insert_rows("//home/orders", [{"k": 1, "v": "one"}], require_sync_replica=False)

        proxy.hold("push")
        replica_doc = replica("orders-target", "orders", "target")
        op.add(replica_doc)
        op.until(lambda: op.replica("orders-target").status.get("state") == "enabling", 30, "enabling")
        for _ in range(3):
            op.reconcile_all()
        res = op.replica("orders-target")
        assert res.status["state"] == "enabling"
        ready = condition(res, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "Enabling"), ready
        assert [e.reason for e in op.events["orders-target"]].count("Enabling") == 1  # one alter only
        proxy.release()
        op.until(lambda: condition(op.replica("orders-target"), "Ready")["status"] == "True", 30, "Ready")
        assert condition(op.replica("orders-target"), "Ready")["reason"] == "Replicating"

        proxy.hold("push")
        with op.client("meta") as meta:
            meta.insert_rows("//home/orders", [{"k": 2, "v": "two"}], require_sync_replica=False)
        wait_for(lambda: proxy.waiting >= 1, 10.0, "a push in flight")
        replica_doc["spec"]["enabled"] = False
        replica_doc["metadata"]["generation"] = 2
        op.add(replica_doc)
        op.until(lambda: op.replica("orders-target").status.get("state") == "disabling", 30, "disabling")
        for _ in range(3):
            op.reconcile_all()
        ready = condition(op.replica("orders-target"), "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "Disabling"), ready
        assert [e.reason for e in op.events["orders-target"]].count("Disabling") == 1
        proxy.release()
        op.until(lambda: op.replica("orders-target").status.get("state") == "disabled", 30, "disabled")
        ready = condition(op.replica("orders-target"), "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "Disabled"), ready
    finally:
        if proxy is not None:
            proxy.close()
        for engine in engines.values():
            engine.stop()
