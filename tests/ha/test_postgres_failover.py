"""PostgreSQL failover under an engine (issue 24, item 2): the primary SIGKILLed under writes.

The engine's database is a Patroni cluster (tests/ha/conftest.py; reptables.testing.patroni): a
primary and a synchronous standby, ``synchronous_mode_strict``. The engine reaches whichever is the
primary through a multi-host URL with ``target_session_attrs=read-write``. Killing the primary's
postmaster under two writers checks what docs/ha-postgres.md promises:

* the engine is not restarted (the same process before and after);
* while there is no primary it answers only 105 (retriable), and ``/readyz`` answers 503;
* writes are acknowledged again by themselves once Patroni has promoted the standby (and, with two
  members in strict mode, the old primary has rejoined as the standby);
* every acknowledged write is in the table exactly once, as its async replica on SQLite received it,
  and no write answered with an error is: a commit whose answer died with the primary is looked up
  on the new primary, where synchronous replication put it if it was acknowledged.

The failover window (from the kill to the end of the longest stretch without an acknowledged
write) is printed (run with ``-s``); docs/ha-postgres.md gives the figures measured this way.

The third fault of the HA XDCR tests (test_ha_xdcr.py: an XDCR member served by a leader engine and a
standby, under writes on every member) is here too: the primary of that member's database killed.
It lives in this module because the run starts one Patroni cluster (tests/ha/conftest.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError
from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.storage.leadership import EXIT_STEPPED_DOWN
from reptables.testing import KV_SCHEMA, TEST_TOKEN, EngineProcess, EngineSet, wait_for
from reptables.testing.patroni import PatroniCluster
from tests.ha.xdcr_load import MEMBERS, Load, build, check_group, directories


class Writer(threading.Thread):
    """Inserts one new key per commit until stopped; remembers what was acknowledged (and when: the
    monotonic times the request was sent and answered), what failed and what got no answer."""

    def __init__(self, client: Client, path: str, first_key: int, **options: Any) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.options, self.first_key = client, path, options, first_key
        self.acked: list[int] = []
        self.acked_at: list[tuple[float, float]] = []  # (sent, answered) of each acknowledged write
        self.failed: dict[int, int] = {}  # key -> the error code the engine answered
        self.unknown: list[int] = []  # no answer at all (the outcome is the engine's to tell)
        self.stop_event = threading.Event()

    def run(self) -> None:
        key = self.first_key
        while not self.stop_event.is_set():
            key += 1
            sent = time.monotonic()
            try:
                self.client.insert_rows(self.path, [{"k": key, "v": f"v{key}"}], **self.options)
            except TransportError:
                self.unknown.append(key)
            except YtError as exc:
                self.failed[key] = int(exc.code)
                time.sleep(0.05)
            else:
                self.acked.append(key)
                self.acked_at.append((sent, time.monotonic()))

    def finish(self) -> None:
        self.stop_event.set()
        self.join(150)

    def acked_after(self, count: int, timeout: float) -> None:
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target, timeout, f"{count} more acknowledged writes")


def test_primary_killed_under_writes_loses_no_acknowledged_write(patroni: PatroniCluster, tmp_path: Path) -> None:
    url = patroni.create_database("meta")
    with EngineSet(tmp_path, names=("primary", "replica"), storage={"primary": url, "replica": "sqlite"}) \
            as clusters:
        path = clusters.replicated_table("//tmp/t", KV_SCHEMA)
        replica_id = clusters.replica(path, "replica", "//tmp/t", mode="async")
        engine = clusters.engines["primary"]
        pid = engine.pid
        # two writers: while one waits for the database to say whether its commit happened, the
        # other is answered at once
        with Client(engine.url, TEST_TOKEN, timeout=120) as one, Client(engine.url, TEST_TOKEN, timeout=120) as other:
            writers = [Writer(one, path, 0, require_sync_replica=False),
                       Writer(other, path, 10_000_000, require_sync_replica=False)]
            for writer in writers:
                writer.start()
            try:
                writers[0].acked_after(30, 30)
                killed = patroni.kill_primary()
                killed_at = time.monotonic()
                promoted = patroni.wait_for_primary(60, other_than=killed)
                promoted_at = time.monotonic()
                # back by itself: no restart of the engine, nothing done to it
                for writer in writers:
                    writer.acked_after(20, 60)
            finally:
                for writer in writers:
                    writer.finish()
        assert engine.alive() and engine.pid == pid
        acked = {k for w in writers for k in w.acked}
        failed = {k: code for w in writers for k, code in w.failed.items()}
        unknown = {k for w in writers for k in w.unknown}
        # while there was no primary: retriable answers, and nothing else (no 500, no other code)
        assert failed and set(failed.values()) == {ErrorCode.UNAVAILABLE}, failed
        assert not unknown, sorted(unknown)[:10]
        # the failover window: the longest time without an acknowledgement (of either writer) around the
        # kill. (A commit the dying primary's standby had already confirmed may still be acknowledged a
        # few milliseconds after the kill: the window starts at the last of those, not at the kill.)
        answers = sorted(answered for w in writers for _, answered in w.acked_at if answered > killed_at - 1)
        gap, resumed = max((b - a, b) for a, b in zip(answers, answers[1:], strict=False))
        print(f"\nfailover: kill -> {promoted.name} seen promoted {promoted_at - killed_at:.2f} s; no write "
              f"acknowledged for {gap:.2f} s; kill -> writes acknowledged again {resumed - killed_at:.2f} s; "
              f"{len(failed)} writes answered 105 meanwhile")
        # what the table holds, as its async replica on SQLite received it (the replication queue in
        # PostgreSQL, pushed in order: a row twice or a gap would stall or differ)
        clusters.wait_in_sync(replica_id, timeout=60)
        replica_rows = clusters.client("replica").select_rows("k, v from [//tmp/t]", output_row_limit=1_000_000)
        rows = {r["k"] for r in replica_rows}
        assert len(rows) == len(replica_rows) and all(r["v"] == f"v{r['k']}" for r in replica_rows)
        assert acked <= rows, sorted(acked - rows)[:10]
        # a failed write did not happen (a commit whose answer was lost was looked up, not guessed)
        assert not rows & set(failed), sorted(rows & set(failed))
        assert rows <= acked | unknown, sorted(rows - acked - unknown)[:10]


def test_readyz_is_503_while_there_is_no_primary(patroni: PatroniCluster, tmp_path: Path) -> None:
    url = patroni.create_database("ready")
    engine = EngineProcess("alpha", tmp_path / "alpha", extra_args=["--storage", url])
    engine.start()
    try:
        pid = engine.pid
        with httpx.Client(timeout=30) as http, engine.client(timeout=120) as client:
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": KV_SCHEMA})
            client.mount_table("//tmp/t")
            wait_for(lambda: client.get("//tmp/t/@tablet_state") == "mounted", 30, "mounted")
            client.insert_rows("//tmp/t", [{"k": 0, "v": "before"}])
            assert http.get(f"{engine.url}/readyz").status_code == 200
            killed = patroni.kill_primary()

            def unready() -> httpx.Response | None:
                answer = http.get(f"{engine.url}/readyz")
                return answer if answer.status_code == 503 else None

            answer = wait_for(unready, 30, "/readyz 503 with no primary", interval=0.02)
            assert answer.json()["status"] == "unavailable"
            # alive all the while: a liveness probe must not restart it for its database's failover
            assert http.get(f"{engine.url}/healthz").status_code == 200
            patroni.wait_for_primary(60, other_than=killed)
            wait_for(lambda: http.get(f"{engine.url}/readyz").status_code == 200, 60, "/readyz 200 again")
            # the first write may still meet the writer's connection to the killed primary: 105, and
            # the next one goes through a new connection (a write waits, in strict mode, until the old
            # primary has rejoined as the standby)
            wait_for(lambda: _inserted(client, "//tmp/t", 1), 60, "a write acknowledged again", retry_on=())
            assert [r["k"] for r in client.select_rows("k from [//tmp/t]")] == [0, 1]
        assert engine.alive() and engine.pid == pid
    finally:
        engine.stop()


def _inserted(client: Client, path: str, key: int) -> bool:
    """One insert: True once it is acknowledged, False while the engine answers 105; any other error raises."""
    try:
        client.insert_rows(path, [{"k": key, "v": "after"}])
    except YtError as exc:
        if exc.code == ErrorCode.UNAVAILABLE and not isinstance(exc, TransportError):
            return False
        raise
    return True


def test_xdcr_member_survives_the_primary_of_its_database_killed(patroni: PatroniCluster, tmp_path: Path) -> None:
    """Member a of an XDCR group is a leader engine and a standby over a database of the Patroni
    cluster; writes run on every member (and on a's replicated table with its sync replica, and b's
    with its sync replica on a) while a's database primary is killed. The engines of a answer 105
    meanwhile and serve again by themselves (the leader renews its lease once there is a primary, or
    the standby took the lease first and the old leader stepped down: then it is started again as a
    standby, as its supervisor would); every acknowledged write is everywhere once (test_ha_xdcr.py)."""
    url = patroni.create_database("xdcr_a")
    with EngineSet(tmp_path, names=MEMBERS, cluster_ids=True, standbys={"a": 1}, storage={"a": url},
                   client_timeout=60, start_timeout=60) as group:
        build(group)
        before = directories(group)
        with Load(group, 3) as load:
            load.acked_after(20, 60)
            killed = patroni.kill_primary()
            killed_at = time.monotonic()
            patroni.wait_for_primary(60, other_than=killed)
            # writes acknowledged again on every table, a's included, with nothing done to the engines
            load.acked_after(10, 90)
            back = load.first_ack_after(killed_at, group.leader("a").url)
        stepped_down = [e for e in group.group("a") if not e.alive()]
        for engine in stepped_down:
            assert engine.proc is not None and engine.proc.returncode == EXIT_STEPPED_DOWN, engine.proc.returncode
        print(f"\nprimary kill: a acknowledged writes again {back:.2f} s after it; engines of a that stepped "
              f"down: {len(stepped_down)}")
        group.revive("a")
        check_group(group, load, before)


class OfficialWriter(threading.Thread):
    """The official client (``yt.wrapper``, one address: a Service in front of the engines) inserting one
    new key per call until stopped: what it acknowledged, what raised."""

    def __init__(self, proxy: str, token: str, path: str) -> None:
        super().__init__(daemon=True)
        import yt.wrapper as yt

        self.client = yt.YtClient(proxy=proxy, token=token)
        self.path = path
        self.acked: list[int] = []
        self.raised: list[int] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        key = 0
        while not self.stop_event.is_set():
            key += 1
            try:
                self.client.insert_rows(self.path, [{"k": key, "v": f"v{key}"}])
            except Exception:  # noqa: BLE001 - the outcome is unknown to this writer: checked below
                self.raised.append(key)
                time.sleep(0.1)
            else:
                self.acked.append(key)

    def acked_after(self, count: int, timeout: float) -> None:
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target, timeout, f"{count} more writes acknowledged by yt.wrapper")


def test_the_official_client_writes_through_a_leader_kill_a_pause_and_a_primary_kill(
        patroni: PatroniCluster, tmp_path: Path) -> None:
    """Issue 24's check: a meta-cluster of two engines over a Patroni-managed PostgreSQL, a replicated
    table with a sync and an async replica, ``yt.wrapper`` writing through one address (a Service over
    the engines, reptables.testing.service); the leader SIGKILLed, then the next leader SIGSTOPped past its
    lease (it exits 75 when resumed), then the database primary killed.  Afterwards every acknowledged row
    is on both replicas, with its value, once (a keyed table), and nothing that was never sent is."""
    from reptables.testing.service import LeaderService

    url = patroni.create_database("official")
    with EngineSet(tmp_path, names=("meta", "sync", "async"), standbys={"meta": 1}, leader_lease=1.5,
                   storage={"meta": url, "sync": "sqlite", "async": "sqlite"}) as clusters:
        path = clusters.replicated_table("//tmp/orders", KV_SCHEMA)
        sync_id = clusters.replica(path, "sync", path, mode="sync")
        async_id = clusters.replica(path, "async", path, mode="async")
        clusters.wait_in_sync(sync_id)
        service = LeaderService([e.url for e in clusters.group("meta")]).start()
        writer = OfficialWriter(service.url, TEST_TOKEN, path)
        writer.start()
        try:
            writer.acked_after(20, 60)
            # 1. the leader SIGKILLed: the standby leads, the killed engine comes back as the standby
            first = clusters.leader("meta")
            first.kill()
            second = clusters.leader("meta", 30)
            assert second is not first
            writer.acked_after(20, 60)
            clusters.revive("meta")
            # 2. the new leader paused past its lease: the other one leads; resumed, it steps down (75).
            # (yt.wrapper's keep-alive connections through the Service still lead to the paused engine, as
            # they would through a Kubernetes Service: their requests wait until it resumes and refuses them
            # with 105, then go again, to the new leader)
            os.killpg(second.pid, signal.SIGSTOP)
            try:
                third = clusters.leader("meta", 30)
                assert third is not second
                time.sleep(2.0)
            finally:
                os.killpg(second.pid, signal.SIGCONT)
            assert second.proc is not None and second.proc.wait(timeout=30) == EXIT_STEPPED_DOWN
            writer.acked_after(20, 90)
            clusters.revive("meta")
            # 3. the database's primary killed: Patroni promotes the standby, the engines reconnect
            killed = patroni.kill_primary()
            patroni.wait_for_primary(60, other_than=killed)
            writer.acked_after(20, 90)
        finally:
            writer.stop_event.set()
            writer.join(120)
            service.stop()
        acked, raised = set(writer.acked), set(writer.raised)
        print(f"\nyt.wrapper: {len(acked)} writes acknowledged, {len(raised)} raised, across the three faults")
        for replica_id, cluster in ((sync_id, "sync"), (async_id, "async")):
            clusters.wait_in_sync(replica_id, timeout=90)
            rows = clusters.client(cluster).select_rows("k, v from [//tmp/orders]", output_row_limit=1_000_000)
            keys = {r["k"] for r in rows}
            assert len(keys) == len(rows) and all(r["v"] == f"v{r['k']}" for r in rows), cluster
            assert acked <= keys, (cluster, sorted(acked - keys)[:10])
            assert keys <= acked | raised, (cluster, sorted(keys - acked - raised)[:10])
