"""State changes that run beside writes never stop an engine, and lose no acknowledged write.

The replicated-table tracker flips a replica between ``sync`` and ``async`` on every failover while
applications keep writing. Once that flip took the replication lock and then the storage writer
lock while a commit held them in the other order: within seconds the engine stopped answering, even
``get @tablet_state``. These tests run real engines over HTTP: writer threads insert distinct keys
while one client changes state (mode, enabled, freeze, mount, reshard, trim, replica removal) over
and over. Every request must answer within the client timeout, writes must keep being acknowledged,
and at the end every acknowledged key is on every replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.client import Client, TransportError
from reptables.engine.errors import ErrorCode, YtError
from reptables.testing import wait_for

from .conftest import ClusterSet

WRITERS = 4
#: a request that takes longer than this is an engine that stopped answering
ANSWER_TIMEOUT = 15.0
#: answers a writer may get while a state change is under way: retried, never counted as acknowledged
EXPECTED_REFUSALS = {
    ErrorCode.SYNC_REPLICA_NOT_IN_SYNC, ErrorCode.NO_SYNC_REPLICAS, ErrorCode.TABLET_NOT_MOUNTED,
    ErrorCode.INVALID_TABLET_STATE, ErrorCode.TRANSACTION_LOCK_CONFLICT,
}


@dataclass
class Load:
    """Writer threads that insert distinct keys and remember which inserts were acknowledged."""

    cs: ClusterSet
    path: str
    acked: set[int] = field(default_factory=set)
    attempted: set[int] = field(default_factory=set)
    ack_times: list[float] = field(default_factory=list)
    refusals: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards the sets and lists above

    def run(self, seconds: float, change: Callable[[Client, int], None],
            probe: Callable[[Client], Any] | None = None) -> None:
        engine = self.cs.engines[self.cs.names[0]]
        threads = [threading.Thread(target=self._write, args=(w, engine.url, engine.token), daemon=True)
                   for w in range(WRITERS)]
        threads.append(threading.Thread(target=self._probe, args=(engine.url, engine.token, probe), daemon=True))
        for thread in threads:
            thread.start()
        started = time.monotonic()
        step = 0
        with Client(engine.url, engine.token, timeout=ANSWER_TIMEOUT) as admin:
            try:
                while time.monotonic() - started < seconds and not self.failures:
                    try:
                        change(admin, step)
                    except TransportError as exc:
                        self._fail(f"state change {step} got no answer: {exc}")
                    step += 1
                    time.sleep(0.05)
            finally:
                self.stop.set()
                for thread in threads:
                    thread.join(timeout=ANSWER_TIMEOUT * 2)
        assert not self.failures, "\n".join(self.failures[:5])
        assert step >= 5, f"only {step} state changes in {seconds} s"
        assert len(self.acked) >= 20, f"only {len(self.acked)} writes acknowledged in {seconds} s"
        gaps = [b - a for a, b in zip([started, *sorted(self.ack_times)], sorted(self.ack_times), strict=False)]
        assert max(gaps) < 10.0, f"no write acknowledged for {max(gaps):.1f} s"

    def _fail(self, message: str) -> None:
        with self._lock:
            self.failures.append(message)

    def _write(self, writer: int, url: str, token: str | None) -> None:
        with Client(url, token, timeout=ANSWER_TIMEOUT) as client:
            i = 0
            while not self.stop.is_set():
                key = writer * 1_000_000 + i
                i += 1
                with self._lock:
                    self.attempted.add(key)
                try:
                    client.insert_rows(self.path, [{"k": key, "v": f"w{writer}"}], require_sync_replica=False)
                except TransportError as exc:
                    self._fail(f"insert of key {key} got no answer: {exc}")
                    return
                except YtError as exc:
                    if exc.code not in EXPECTED_REFUSALS:
                        self._fail(f"insert of key {key} failed unexpectedly: {exc.code} {exc.message}")
                        return
                    with self._lock:
                        self.refusals[exc.code] = self.refusals.get(exc.code, 0) + 1
                    time.sleep(0.01)
                    continue
                with self._lock:
                    self.acked.add(key)
                    self.ack_times.append(time.monotonic())

    def _probe(self, url: str, token: str | None, probe: Callable[[Client], Any] | None) -> None:
        """Reads of the table's state keep answering too (they used to hang with the writes)."""
        with Client(url, token, timeout=ANSWER_TIMEOUT) as client:
            while not self.stop.is_set():
                try:
                    client.get(f"{self.path}/@tablet_state")
                    if probe is not None:
                        probe(client)
                except TransportError as exc:
                    self._fail(f"read of {self.path} state got no answer: {exc}")
                    return
                except YtError:
                    pass  # the table may be briefly unmounted or gone: an answer is what counts
                self.stop.wait(0.1)


def _keys(cs: ClusterSet, cluster: str, path: str) -> set[int]:
    return {int(r["k"]) for r in cs.client(cluster).select_rows(f"k from [{path}]", output_row_limit=10_000_000)}


def _assert_every_acknowledged_row_arrives(cs: ClusterSet, load: Load, replicas: dict[str, str],
                                           timeout: float = 60.0) -> None:
    for cluster, replica_path in replicas.items():
        def arrived(cluster: str = cluster, replica_path: str = replica_path) -> bool:
            return load.acked <= _keys(cs, cluster, replica_path)

        try:
            wait_for(arrived, timeout, f"every acknowledged key on {cluster}:{replica_path}")
        except AssertionError:
            missing = sorted(load.acked - _keys(cs, cluster, replica_path))
            replicas = cs.meta.get(f"{load.path}/@replicas")
            states = {rid: cs.meta.get(f"#{rid}/@") for rid, r in replicas.items() if r["cluster_name"] == cluster}
            raise AssertionError(f"{len(missing)} acknowledged keys missing on {cluster}:{replica_path} "
                                 f"(first {missing[:5]}); replicas there: {states}; "
                                 f"queue: {cs.meta.get(f'{load.path}/@tablets')}") from None
        unexpected = _keys(cs, cluster, replica_path) - load.attempted
        assert not unexpected, f"{cluster} holds keys nobody wrote: {sorted(unexpected)[:5]}"


@pytest.fixture(scope="module")
def cs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    cset = ClusterSet(Path(tmp_path_factory.mktemp("state-changes"))).start()
    try:
        yield cset
    finally:
        cset.stop()


def test_flipping_a_replica_between_sync_and_async_beside_writes(cs: ClusterSet) -> None:
    """The tracker's path: alter_table_replica mode (and enabled) flips while four clients write."""
    path = cs.replicated_table("//tmp/flip")
    flipped = cs.replica(path, "remote_0", "//tmp/flip", mode="sync")
    steady = cs.replica(path, "remote_1", "//tmp/flip")
    cs.wait_in_sync(flipped)
    load = Load(cs, path)
    plan: list[dict[str, Any]] = [{"mode": "async"}, {"mode": "sync"}, {"mode": "async"}, {"enabled": False},
                                  {"mode": "sync"}, {"enabled": True}, {"mode": "async"}, {"enabled": False},
                                  {"enabled": True}, {"mode": "sync"}]

    def change(admin: Client, step: int) -> None:
        admin.call("alter_table_replica", {"replica_id": flipped, **plan[step % len(plan)]})

    load.run(30.0, change, probe=lambda c: c.get(f"#{flipped}/@mode"))
    cs.alter(flipped, enabled=True, mode="async")
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/flip", "remote_1": "//tmp/flip"})
    assert cs.meta.get(f"#{steady}/@state") == "enabled"


def test_freeze_and_unfreeze_beside_writes(cs: ClusterSet) -> None:
    path = cs.replicated_table("//tmp/freeze")
    cs.replica(path, "remote_0", "//tmp/freeze")

    def change(admin: Client, step: int) -> None:
        (admin.freeze_table if step % 2 == 0 else admin.unfreeze_table)(path)

    load = Load(cs, path)
    load.run(10.0, change)
    if cs.meta.get(f"{path}/@tablet_state") == "frozen":
        cs.meta.unfreeze_table(path)
    assert load.refusals.get(ErrorCode.INVALID_TABLET_STATE, 0) > 0, "no write ever met a frozen table"
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/freeze"})


def test_mount_and_unmount_beside_writes(cs: ClusterSet) -> None:
    path = cs.replicated_table("//tmp/mount")
    cs.replica(path, "remote_0", "//tmp/mount")

    def change(admin: Client, step: int) -> None:
        (admin.unmount_table if step % 2 == 0 else admin.mount_table)(path)

    load = Load(cs, path)
    load.run(10.0, change)
    if cs.meta.get(f"{path}/@tablet_state") == "unmounted":
        cs.meta.mount_table(path)
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/mount"})


def test_reshard_beside_writes(cs: ClusterSet) -> None:
    """unmount, reshard, mount: the cycle an operator runs to spread a hot table (and to merge it back).

    A replicated table is resharded only once its replica has the whole queue (keys move between
    tablets); until then the reshard is refused with a retriable error naming the replica."""
    path = cs.replicated_table("//tmp/reshard")
    cs.replica(path, "remote_0", "//tmp/reshard")
    pivots = [[[]], [[], [1_000_000]], [[], [1_000_000], [2_000_000]], [[], [2_000_000]], [[]]]
    done = {"reshards": 0, "refused": 0}
    phase = {"next": "unmount"}

    def change(admin: Client, step: int) -> None:
        if phase["next"] == "unmount":
            admin.unmount_table(path)
            phase["next"] = "reshard"
        elif phase["next"] == "reshard":
            try:
                admin.reshard_table(path, pivot_keys=pivots[(done["reshards"] + 1) % len(pivots)])
            except YtError as exc:
                assert exc.code == ErrorCode.INVALID_TABLET_STATE and "has not received" in exc.message, exc
                done["refused"] += 1
                return
            done["reshards"] += 1
            phase["next"] = "mount"
        else:
            admin.mount_table(path)
            phase["next"] = "unmount"

    load = Load(cs, path)
    load.run(10.0, change)
    if phase["next"] != "unmount":
        wait_for(lambda: _reshard_settled(cs, path, phase), what="last reshard cycle")
    assert done["reshards"] >= 2, done
    assert cs.meta.get(f"{path}/@tablet_count") == len(pivots[done["reshards"] % len(pivots)])
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/reshard"})


def _reshard_settled(cs: ClusterSet, path: str, phase: dict[str, str]) -> bool:
    """Finish an interrupted unmount/reshard/mount cycle: the table ends mounted."""
    if cs.meta.get(f"{path}/@tablet_state") == "unmounted":
        cs.meta.mount_table(path)
    phase["next"] = "unmount"
    return True


def test_trim_beside_writes(cs: ClusterSet) -> None:
    """Queue trimming of a replicated table (and trim_rows of an ordered one) beside writes."""
    path = cs.replicated_table("//tmp/trim", attributes={"min_replication_log_ttl": 0})
    cs.replica(path, "remote_0", "//tmp/trim")
    log = "//tmp/trim_log"
    cs.meta.create("table", log, attributes={"dynamic": True, "schema": [{"name": "v", "type": "string"}]})
    cs.meta.mount_table(log)

    def change(admin: Client, step: int) -> None:
        admin.insert_rows(log, [{"v": f"r{step}-{i}"} for i in range(10)])
        count = admin.get(f"{log}/@tablets")[0]["flushed_row_count"]
        admin.trim_rows(log, 0, max(0, count - 5))

    load = Load(cs, path)
    load.run(10.0, change)
    tablet = cs.meta.get(f"{log}/@tablets")[0]
    assert tablet["trimmed_row_count"] > 0
    assert len(cs.meta.select_rows(f"v from [{log}]")) == tablet["flushed_row_count"] - tablet["trimmed_row_count"]
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/trim"})
    wait_for(lambda: cs.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] > 0, what="queue trimmed")


def test_replica_removal_beside_writes(cs: ClusterSet) -> None:
    """Replicas created, enabled and removed again while writes go on; the steady replica gets all."""
    path = cs.replicated_table("//tmp/remove")
    cs.replica(path, "remote_0", "//tmp/remove")
    created: list[str] = []

    def change(admin: Client, step: int) -> None:
        if step % 2 == 0:
            replica_path = f"//tmp/removed_{step}"
            replica_id = admin.call("create", {"type": "table_replica", "attributes": {
                "table_path": path, "cluster_name": "remote_1", "replica_path": replica_path,
                "mode": "sync" if step % 4 == 0 else "async"}})["node_id"]
            created.append(replica_id)
            remote = cs.client("remote_1")
            remote.create("table", replica_path, attributes={
                "dynamic": True, "schema": [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                            {"name": "v", "type": "string"}], "upstream_replica_id": replica_id})
            remote.mount_table(replica_path)
            admin.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
        else:
            admin.remove(f"#{created[-1]}")

    load = Load(cs, path)
    load.run(10.0, change)
    remaining = set(cs.meta.get(f"{path}/@replicas"))
    assert not (set(created[:-1]) & remaining), "a removed replica is still listed"
    _assert_every_acknowledged_row_arrives(cs, load, {"remote_0": "//tmp/remove"})
