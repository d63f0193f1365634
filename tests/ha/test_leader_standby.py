"""A meta-cluster of two engine processes over one PostgreSQL database: one leads, one stands by
(docs/storage.md, "Leadership and fencing"; storage/leadership.py).

The setting of every test: engines ``meta_a`` and ``meta_b`` started with ``--standby`` on one
database of the run's PostgreSQL server, a replicated table on them with a *sync* replica on a third
engine (SQLite), and writers inserting one new key per commit through the typed client given both
meta engines' URLs. What is checked:

* **SIGKILL of the leader** under writes: the standby takes over within seconds (the time from the
  kill to the first write acknowledged by the new leader is printed), every acknowledged write is on
  the replica exactly once (its change stream holds one event per key: a write applied twice would
  show twice), and no write answered with an error is anywhere.
* **SIGSTOP of the leader past its lease**, then SIGCONT: the standby takes over and takes writes;
  the old leader, resumed, answers the requests that queued at it with 105 (its lease ran out by its
  own clock), finds the new epoch, and exits with status 75; the rows sent to it are nowhere.
* **A standby's answers**: ``/readyz`` 503 naming the leader, ``/healthz`` 200, every command 105
  (``not_leader``, ``leader_url``), and a client given only the standby's URL follows it to the leader.
* **Refusals**: ``--standby`` without PostgreSQL; a single engine (no ``--standby``) on a database a
  group's leader holds; and a single engine replaced by a second one steps down at its next write.

The fixtures are this file's own (tests/ha/conftest.py belongs to the PostgreSQL failover tests).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError, never_sent
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.storage.leadership import EXIT_STEPPED_DOWN
from reptables.testing import EngineProcess, backends, wait_for
from reptables.testing.backends import RunServer
from reptables.testing.engines import KV_SCHEMA, TEST_TOKEN

PATH = "//tmp/orders"
#: keys sent to the old leader after it was replaced: none may be written anywhere
OLD_LEADER_KEYS = range(900_000_000, 900_000_020)


@pytest.fixture
def postgres() -> RunServer:
    return backends.run_server()


def meta_engine(name: str, base: Path, url: str, *extra: str) -> EngineProcess:
    """A member of the meta-cluster's leader/standby group (its own data directory and port)."""
    engine = EngineProcess("meta", base / name, log_level="info")
    engine.extra_args = ["--storage", url, "--standby", "--advertise-url", engine.url, *extra]
    return engine


def ready(engine: EngineProcess) -> bool:
    try:
        return httpx.get(f"{engine.url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Group:
    """Two meta engines, the replica engine, a replicated table with a sync replica."""

    base: Path
    database: str
    metas: list[EngineProcess]
    replica: EngineProcess
    replica_id: str = ""
    clients: list[Client] = field(default_factory=list)

    def leader(self, timeout: float = 30.0) -> EngineProcess:
        """The engine that serves (``/readyz`` 200), waited for."""
        return wait_for(lambda: next((e for e in self.metas if e.alive() and ready(e)), None), timeout, "a leader")

    def other(self, engine: EngineProcess) -> EngineProcess:
        return next(e for e in self.metas if e is not engine)

    def client(self, timeout: float = 5.0) -> Client:
        """A client given both meta engines (closed with the group)."""
        client = Client([e.url for e in self.metas], TEST_TOKEN, timeout=timeout)
        self.clients.append(client)
        return client

    def point_replica_at(self, leader: EngineProcess) -> None:
        """The replica's directory entry of the meta-cluster at ``leader`` (as an operator, or a Service
        over the engines, keeps it): the replica asks it about transactions it holds in doubt."""
        with self.replica.client() as replica:
            replica.set("//sys/clusters/meta", {"proxy_url": leader.url,
                                                "token": peer_credential(TEST_TOKEN, "replica")})

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for engine in [*self.metas, self.replica]:
            resume(engine)
            engine.stop()


def resume(engine: EngineProcess) -> None:
    """SIGCONT an engine that may be paused (a paused process cannot stop)."""
    if engine.alive():
        try:
            os.killpg(engine.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@pytest.fixture
def group(postgres: RunServer, tmp_path: Path) -> Iterator[Group]:
    url = postgres.create_database("ha_meta")
    metas = [meta_engine("meta_a", tmp_path, url), meta_engine("meta_b", tmp_path, url)]
    with backends.using(backends.SQLITE):
        replica = EngineProcess("replica", tmp_path / "replica")
    g = Group(tmp_path, url, metas, replica)
    try:
        replica.start()
        for engine in metas:
            engine.spawn()
        for engine in metas:
            engine.wait_up(60)
        leader = g.leader(60)
        standby = g.other(leader)
        wait_for(lambda: _readyz(standby).get("status") == "standby", 60, "the other engine standing by")
        meta = g.client(timeout=30)
        meta.set("//sys/clusters", {
            "meta": {"proxy_url": leader.url, "token": peer_credential(TEST_TOKEN, "meta")},
            "replica": {"proxy_url": replica.url, "token": peer_credential(TEST_TOKEN, "meta")}})
        with replica.client() as r:
            r.set("//sys/clusters", {
                "meta": {"proxy_url": leader.url, "token": peer_credential(TEST_TOKEN, "replica")},
                "replica": {"proxy_url": replica.url, "token": peer_credential(TEST_TOKEN, "replica")}})
            meta.create("replicated_table", PATH, attributes={"dynamic": True, "schema": KV_SCHEMA})
            meta.mount_table(PATH)
            g.replica_id = meta.create("table_replica", attributes={
                "table_path": PATH, "cluster_name": "replica", "replica_path": PATH, "mode": "sync"})
            r.create("table", PATH, attributes={"dynamic": True, "schema": KV_SCHEMA, "enable_change_log": True,
                                                "upstream_replica_id": g.replica_id}, recursive=True)
            r.mount_table(PATH)
        meta.alter_table_replica(g.replica_id, enabled=True)
        wait_for(lambda: meta.get(f"#{g.replica_id}/@state") == "enabled", 60, "the sync replica enabled")
        wait_for(lambda: g.replica_id in meta.get_in_sync_replicas(PATH, meta.generate_timestamp()), 60,
                 "the sync replica in sync")
        yield g
    finally:
        g.stop()


def _readyz(engine: EngineProcess) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"{engine.url}/readyz", timeout=2).json())
    except (httpx.HTTPError, ValueError):
        return {}


class Writer(threading.Thread):
    """Inserts one new key per commit until stopped: what was acknowledged (with when and where),
    what failed (the engine answered an error: nothing was applied) and what has no known outcome."""

    def __init__(self, client: Client, first_key: int) -> None:
        super().__init__(daemon=True)
        self.client, self.key = client, first_key
        self.acked: list[tuple[int, float, str]] = []  # key, monotonic time, the engine that acknowledged it
        self.failed: dict[int, int] = {}
        self.unknown: list[int] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.key += 1
            try:
                self.client.insert_rows(PATH, [{"k": self.key, "v": f"v{self.key}"}])
            except TransportError as exc:
                if never_sent(exc):
                    self.failed[self.key] = int(exc.code)
                else:
                    self.unknown.append(self.key)
                time.sleep(0.05)
            except YtError as exc:
                self.failed[self.key] = int(exc.code)
                time.sleep(0.05)
            else:
                self.acked.append((self.key, time.monotonic(), self.client.proxy_url))

    def acked_after(self, count: int, timeout: float) -> None:
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target, timeout, f"{count} more acknowledged writes")

    def finish(self) -> None:
        self.stop_event.set()
        self.join(60)


def first_ack_after(writers: list[Writer], moment: float, at: str) -> float:
    """Seconds from ``moment`` to the first write acknowledged at ``at`` after it."""
    times = [t for w in writers for _, t, url in w.acked if t > moment and url == at]
    assert times, f"no write was acknowledged by {at} after the fault"
    return min(times) - moment


def check_writes(group: Group, writers: list[Writer], since: int, absent: range = range(0)) -> None:
    """Every acknowledged write is on the replica exactly once (one event of its change stream since
    timestamp ``since``), and no failed write (nor a key of ``absent``) is there."""
    acked = {k for w in writers for k, _, _ in w.acked}
    failed = {k for w in writers for k in w.failed}
    with group.replica.client(timeout=60) as replica:
        def present() -> set[int]:
            return {r["k"] for r in replica.select_rows(f"k from [{PATH}]", output_row_limit=10_000_000)}

        wait_for(lambda: acked <= present(), 90, "every acknowledged write on the replica")
        rows = present()
        assert not rows & failed, f"writes answered with an error are on the replica: {sorted(rows & failed)[:10]}"
        stray = sorted(rows & set(absent))
        assert not stray, f"writes sent to the replaced leader are on the replica: {stray}"
        # the stream goes as far as the replica knows it is complete (its freshness): pulled until it
        # holds every acknowledged write
        events: Counter[int] = Counter()
        position: dict[str, Any] = {"from_timestamp": since}

        def pulled_all() -> bool:
            answer = replica.pull_changes(PATH, **position, max_row_count=100_000, wait_timeout=500)
            events.update(int(e["row"]["k"]) for e in answer["events"] if e["kind"] != "heartbeat" and "row" in e)
            position.clear()
            position["from_event_token"] = answer["event_token"]
            return acked <= set(events)

        wait_for(pulled_all, 60, "every acknowledged write in the replica's change stream")
    twice = {k: n for k, n in events.items() if n > 1}
    assert not twice, f"writes applied more than once on the replica: {dict(list(twice.items())[:10])}"
    assert not set(events) & failed
    unknown = sum(len(w.unknown) for w in writers)
    print(f"acknowledged {len(acked)}, failed {len(failed)}, unknown outcome {unknown}, on the replica {len(rows)}")


def start_writers(group: Group, count: int = 2) -> list[Writer]:
    writers = [Writer(group.client(timeout=3), i * 100_000_000) for i in range(count)]
    for writer in writers:
        writer.start()
    return writers


def replica_timestamp(group: Group) -> int:
    with group.replica.client() as replica:
        return replica.generate_timestamp()


# -- a standby's answers -----------------------------------------------------------------------------


def test_a_standby_answers_not_ready_and_names_the_leader(group: Group) -> None:
    def settled() -> tuple[EngineProcess, EngineProcess] | None:
        # (on a loaded machine the lease may have moved since the fixture: the pair as it is now)
        leader = group.leader()
        standby = group.other(leader)
        answer = httpx.get(f"{standby.url}/readyz", timeout=5)
        assert answer.status_code == 503
        body = answer.json()
        assert body.get("status") in ("standby", "starting"), body
        if body == {"status": "standby", "cluster_name": "meta", "leader": leader.url} and ready(leader):
            return leader, standby
        return None

    leader, standby = wait_for(settled, 30, "the standby naming the engine that serves")
    assert httpx.get(f"{standby.url}/healthz", timeout=5).status_code == 200
    # every command: 105 (retriable), naming the leader; nothing done (whatever the token)
    answer = httpx.get(f"{standby.url}/api/v4/get", params={"path": "//sys/@"},
                       headers={"Authorization": f"OAuth {TEST_TOKEN}"}, timeout=5)
    assert answer.status_code == 503
    error = json.loads(answer.headers["X-YT-Error"])
    assert error["code"] == ErrorCode.UNAVAILABLE
    assert error["attributes"]["leader_url"] == leader.url and error["attributes"]["not_leader"] is True
    assert leader.url in error["message"]
    internal = httpx.post(f"{standby.url}/internal/v1/push", content=b"{}", timeout=5)
    assert internal.status_code == 503 and json.loads(internal.headers["X-YT-Error"])["code"] == ErrorCode.UNAVAILABLE
    # a client given only the standby follows it to the leader
    with Client(standby.url, TEST_TOKEN, timeout=10) as client:
        client.insert_rows(PATH, [{"k": 1, "v": "through the standby's answer"}])
        assert client.proxy_url == leader.url
    with group.replica.client() as replica:
        assert replica.lookup_rows(PATH, [{"k": 1}]) == [{"k": 1, "v": "through the standby's answer"}]
    # the leader's lease row names it
    database = group.database.rsplit("/", 1)[1]
    row = backends.run_server().psql("SELECT address, expires_at > now() FROM _rt_leader WHERE id = 1", database)
    assert row == f"{leader.url}|t"


def test_a_standby_that_won_the_lease_says_it_is_starting_until_it_serves(group: Group) -> None:
    import psycopg

    leader = group.leader()
    standby = group.other(leader)
    # the cluster's state cannot be loaded while a session of the test holds its node table: the new
    # leader waits in its load, between winning the lease and serving
    with psycopg.connect(group.database, connect_timeout=30) as conn:
        leader.kill()
        conn.execute("LOCK TABLE _rt_nodes IN ACCESS EXCLUSIVE MODE")
        answer = wait_for(lambda: (a := _readyz(standby)).get("status") != "standby" and a, 30,
                          "the standby winning the lease")
        assert answer["status"] == "starting" and answer["cluster_name"] == "meta", answer
        assert "just taken over" in answer["reason"] and "leader" not in answer, answer
        assert not ready(standby) and standby.alive()
    # (the test's transaction ends with the block: the load goes on, and the engine serves)
    assert group.leader(60) is standby


# -- the leader's death ----------------------------------------------------------------------------


def test_the_standby_takes_over_when_the_leader_is_killed(group: Group) -> None:
    since = replica_timestamp(group)
    leader = group.leader()
    standby = group.other(leader)
    writers = start_writers(group)
    try:
        writers[0].acked_after(30, 60)
        fault = time.monotonic()
        leader.kill()
        new = group.leader(30)
        serving = time.monotonic() - fault
        assert new is standby
        group.point_replica_at(new)
        for writer in writers:
            writer.acked_after(20, 60)
        took = first_ack_after(writers, fault, new.url)
        print(f"SIGKILL: the new leader ready {serving:.2f} s, its first acknowledged write {took:.2f} s after the "
              "kill")
        assert took < 15, f"the takeover took {took:.1f} s"
    finally:
        for writer in writers:
            writer.finish()
    check_writes(group, writers, since)
    # the new leader says why it leads
    log = standby.log_path.read_text()
    assert '"message": "this engine leads the cluster"' in log and '"replaced": ' in log


def test_a_leader_paused_past_its_lease_never_writes_again(group: Group) -> None:
    since = replica_timestamp(group)
    old = group.leader()
    standby = group.other(old)
    writers = start_writers(group)
    queued: list[Any] = []
    try:
        writers[0].acked_after(30, 60)
        fault = time.monotonic()
        os.killpg(old.pid, signal.SIGSTOP)
        new = group.leader(30)
        serving = time.monotonic() - fault
        assert new is standby
        group.point_replica_at(new)
        for writer in writers:
            writer.acked_after(20, 60)
        took = first_ack_after(writers, fault, new.url)
        # (the writers' clients wait out their 3 s timeout at the paused leader before they move on)
        print(f"SIGSTOP: the new leader ready {serving:.2f} s, its first acknowledged write {took:.2f} s after the "
              "pause")
        assert took < 20, f"the takeover took {took:.1f} s"
        # writes sent to the paused old leader wait in its socket: it reads them when it resumes
        senders = [threading.Thread(target=_send_raw_insert, args=(old, key, queued), daemon=True)
                   for key in OLD_LEADER_KEYS[:4]]
        for sender in senders:
            sender.start()
        time.sleep(0.5)
        os.killpg(old.pid, signal.SIGCONT)
        for sender in senders:
            sender.join(30)
        # and after it resumed, until it is gone
        for key in OLD_LEADER_KEYS[4:]:
            _send_raw_insert(old, key, queued)
            if not old.alive():
                break
        assert old.proc is not None
        assert old.proc.wait(timeout=30) == EXIT_STEPPED_DOWN
        for writer in writers:
            writer.acked_after(10, 60)
    finally:
        resume(old)
        for writer in writers:
            writer.finish()
    # every write sent to the old leader was refused (105, not the leader) or found it gone
    print(f"writes sent to the replaced leader: {Counter(map(str, queued))}")
    for outcome in queued:
        assert outcome in ("refused", "gone"), f"the replaced leader answered {outcome}"
    log = old.log_path.read_text()
    assert "this engine is no longer the leader of its cluster" in log
    check_writes(group, writers, since, absent=OLD_LEADER_KEYS)


def _send_raw_insert(engine: EngineProcess, key: int, outcomes: list[Any]) -> None:
    """One insert straight to ``engine`` (no client that would follow a leader's address): its outcome."""
    try:
        answer = httpx.put(f"{engine.url}/api/v4/insert_rows", content=json.dumps({"k": key, "v": "old"}).encode(),
                           headers={"Authorization": f"OAuth {TEST_TOKEN}", "X-YT-Header-Format": "json",
                                    "X-YT-Parameters": json.dumps({"path": PATH, "input_format": "json"})},
                           timeout=30)
    except httpx.TransportError:
        outcomes.append("gone")
        return
    if answer.status_code == 503:
        error = json.loads(answer.headers["X-YT-Error"])
        if error["code"] == ErrorCode.UNAVAILABLE:
            # not the leader; or its database connection ended by the engine that replaced it
            outcomes.append("refused" if error["attributes"].get("not_leader") else "unavailable")
            return
    outcomes.append((answer.status_code, answer.headers.get("X-YT-Error")))


# -- refusals ----------------------------------------------------------------------------------------


def serve(name: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``engine serve`` expected to refuse to start: its exit, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "REPTABLES_STORAGE"}
    return subprocess.run([sys.executable, "-m", "reptables.engine.cli", "serve", "--cluster-name", name, "--data-dir",
                           str(data_dir), "--token", TEST_TOKEN, "--port", "1", *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)


def test_standby_needs_postgresql_and_a_group_refuses_a_single_engine(postgres: RunServer, tmp_path: Path) -> None:
    refused = serve("meta", tmp_path / "sqlite", "--standby")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "--standby needs --storage postgresql://...: the engines of a leader/standby group share one PostgreSQL "
        "database (SQLite is one engine's file: no leadership)"]
    url = postgres.create_database("ha_group")
    leader = meta_engine("meta_a", tmp_path, url)
    leader.start()
    try:
        refused = serve("meta", tmp_path / "single", "--storage", url)
        assert refused.returncode == 1
        assert f"at {leader.url} leads it (a leader/standby group); start this engine with --standby" in refused.stderr
    finally:
        leader.stop()
    # a leader that stops ends its lease: a single engine may take the database at once
    single = EngineProcess("meta", tmp_path / "single", extra_args=["--storage", url]).start()
    single.stop()


def test_a_single_engine_replaced_by_another_steps_down(postgres: RunServer, tmp_path: Path) -> None:
    url = postgres.create_database("ha_single")
    first = EngineProcess("meta", tmp_path / "first", extra_args=["--storage", url])
    first.start()
    second = EngineProcess("meta", tmp_path / "second", extra_args=["--storage", url])
    try:
        with first.client() as client:
            client.create("table", PATH, attributes={"dynamic": True, "schema": KV_SCHEMA})
            client.mount_table(PATH)
            wait_for(lambda: client.get(f"{PATH}/@tablet_state") == "mounted", 30, "mounted")
            client.insert_rows(PATH, [{"k": 1, "v": "first"}])
        second.start()  # takes the database over (a mistake: two single engines on one database)
        # the first writes nothing more: refused (its sessions were ended, then its writes fenced, or
        # it found the new epoch by itself), until it is gone
        outcomes: list[Any] = []
        for key in OLD_LEADER_KEYS:
            _send_raw_insert(first, key, outcomes)
            if not first.alive():
                break
            time.sleep(0.2)
        assert first.proc is not None and first.proc.wait(timeout=30) == EXIT_STEPPED_DOWN
        assert all(o in ("refused", "gone", "unavailable") for o in outcomes), outcomes
        with second.client() as client:
            assert client.select_rows(f"k from [{PATH}]") == [{"k": 1}]
    finally:
        first.stop()
        second.stop()


# -- the client: several engines, the leader followed --------------------------------------------------


def _not_leader(leader: str | None) -> httpx.Response:
    attributes: dict[str, Any] = {"not_leader": True, "cluster_name": "meta"}
    if leader is not None:
        attributes["leader_url"] = leader
    error = {"code": 105, "message": "Cluster meta: this engine is a standby", "attributes": attributes,
             "inner_errors": []}
    return httpx.Response(503, headers={"X-YT-Error": json.dumps(error), "X-YT-Response-Code": "105"},
                          json=error)


def test_the_client_follows_the_leader_an_engine_names() -> None:
    seen: list[str] = []

    def engines(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host}:{request.url.port}")
        if request.url.host == "b":
            return httpx.Response(200, json={"value": 7}, headers={"X-YT-Response-Code": "0"})
        return _not_leader("http://b:2")

    with Client("http://a:1", "t", transport=httpx.MockTransport(engines)) as client:
        assert client.get("//x") == 7
        assert seen == ["a:1", "b:2"] and client.proxy_url == "http://b:2"
        assert client.get("//x") == 7 and seen[-1] == "b:2"  # the next request goes to the leader at once


def test_the_client_goes_on_to_the_next_engine_only_when_nothing_was_done() -> None:
    seen: list[str] = []
    state = {"a": "refused"}

    def engines(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        if request.url.host == "a":
            if state["a"] == "refused":
                raise httpx.ConnectError("refused", request=request)
            raise httpx.ReadTimeout("no answer", request=request)
        if request.url.host == "b":
            return _not_leader(None)  # a standby that knows no leader: try the next one
        return httpx.Response(200, json={"value": 1}, headers={"X-YT-Response-Code": "0"})

    with Client("http://a,http://b,http://c", "t", transport=httpx.MockTransport(engines)) as client:
        # a refused connection (never sent) and a standby's answer (nothing done): on to the next
        assert client.get("//x") == 1 and seen == ["a", "b", "c"]
        # an engine that may have acted (a timeout): raised, and the next request goes elsewhere
        state["a"] = "timeout"
        client._config._current = 0
        seen.clear()
        with pytest.raises(TransportError):
            client.insert_rows("//t", [{"k": 1}])
        assert seen == ["a"] and client.proxy_url == "http://b"
    # a paused leader: it timed out, and a standby still names it (its lease has not run out): not
    # followed back to (another timeout) but 105 at once, until the standby leads
    seen.clear()
    paused = {"leads": False}

    def paused_leader(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url.host))
        if request.url.host == "a":
            raise httpx.ReadTimeout("paused", request=request)
        if not paused["leads"]:
            return _not_leader("http://a")
        return httpx.Response(200, json={"value": 2}, headers={"X-YT-Response-Code": "0"})

    with Client("http://a,http://b", "t", transport=httpx.MockTransport(paused_leader)) as client:
        with pytest.raises(TransportError):
            client.get("//x")
        with pytest.raises(YtError) as raised:
            client.get("//x")
        assert raised.value.attributes["not_leader"] and seen == ["a", "b"]
        paused["leads"] = True
        assert client.get("//x") == 2 and seen[-1] == "b"
    # standbys that know no leader, all of them: 105 raised after two rounds
    with Client(["http://b", "http://b2"], "t", transport=httpx.MockTransport(lambda r: _not_leader(None))) as client:
        with pytest.raises(YtError) as raised:
            client.get("//x")
        assert raised.value.code == ErrorCode.UNAVAILABLE and raised.value.attributes["not_leader"]


def test_the_async_client_follows_the_leader_too() -> None:
    import asyncio

    from reptables.engine.client import AsyncClient

    def engines(request: httpx.Request) -> httpx.Response:
        if request.url.host == "b":
            return httpx.Response(200, json={"value": 7}, headers={"X-YT-Response-Code": "0"})
        if request.url.host == "c":
            raise httpx.ConnectError("refused", request=request)
        return _not_leader("http://b:2")

    async def run() -> None:
        async with AsyncClient(["http://c:3", "http://a:1"], "t", transport=httpx.MockTransport(engines)) as client:
            assert await client.get("//x") == 7
            assert client.proxy_url == "http://b:2"

    asyncio.run(run())
