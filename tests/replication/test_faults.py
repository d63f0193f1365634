"""Fault tests of replicated tables: real engine processes, real SIGKILL / SIGSTOP.

Every test runs the three engines of :class:`ClusterSet` (meta-cluster ``primary``, ``remote_0``,
``remote_1``), breaks one of them while writers are busy, brings it back and checks what the
replicas hold.

The load tests write to an **ordered** replicated table (columns ``k``, ``batch``, ``v``): a batch
applied twice to an ordered replica shows up as duplicate rows, where a sorted replica would
silently overwrite them, so "exactly once" is observable. Each batch (``ROWS_PER_BATCH`` rows, one
``insert_rows``) has its own unique keys, so a half-applied batch is observable as well. The
two-phase-commit tests use the sorted schema, where a prepared transaction holds row locks.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reptables.engine.client import Client, token_timestamp
from reptables.engine.errors import UnavailableError, YtError
from reptables.engine.storage import replica_progress_table, tablets_table
from reptables.engine.storage.datadir import DATABASE
from reptables.engine.storage.sql import postgresql_driver_url
from reptables.testing import EngineProcess, wait_for
from tests.replication.conftest import ClusterSet

ORDERED_SCHEMA = [{"name": "k", "type": "int64"}, {"name": "batch", "type": "int64"}, {"name": "v", "type": "string"}]
ROWS_PER_BATCH = 3
TABLE = "//tmp/rt"
REPLICA = "//tmp/r"
META, SYNC_CLUSTER, ASYNC_CLUSTER = "primary", "remote_0", "remote_1"
#: batch numbers, shared by every load of the session: keys never repeat
_BATCH_IDS = itertools.count(1)


def batch_rows(batch: int) -> list[dict[str, Any]]:
    return [{"k": batch * ROWS_PER_BATCH + i, "batch": batch, "v": f"b{batch}"} for i in range(ROWS_PER_BATCH)]


@dataclass
class Attempt:
    batch: int
    started: float
    finished: float
    error: Exception | None

    @property
    def ok(self) -> bool:
        return self.error is None


class WriteLoad:
    """Writer threads, each inserting one batch of fresh keys per ``insert_rows`` until stopped."""

    def __init__(self, clusters: ClusterSet, path: str = TABLE, writers: int = 3,
                 require_sync_replica: bool = True) -> None:
        meta = clusters.engines[META]
        self.url, self.token = meta.url, meta.token
        self.path = path
        self.require_sync_replica = require_sync_replica
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, name=f"writer-{i}", daemon=True) for i in range(writers)]

    def __enter__(self) -> WriteLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        with Client(self.url, self.token, timeout=10) as client:
            while not self._stop.is_set():
                batch = next(_BATCH_IDS)
                started = time.monotonic()
                error: Exception | None = None
                try:
                    client.insert_rows(self.path, batch_rows(batch), require_sync_replica=self.require_sync_replica)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded and checked by the test
                    error = exc
                with self._lock:
                    self.attempts.append(Attempt(batch, started, time.monotonic(), error))
                if error is not None:
                    self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=20)
        assert not any(t.is_alive() for t in self._threads), "a writer thread did not stop"

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def attempted(self) -> set[int]:
        return {a.batch for a in self.snapshot()}

    def acknowledged(self, started_after: float = 0.0) -> set[int]:
        return {a.batch for a in self.snapshot() if a.ok and a.started >= started_after}

    def failures(self, started_after: float = 0.0) -> list[Attempt]:
        return [a for a in self.snapshot() if not a.ok and a.started >= started_after]

    def wait_acknowledged(self, count: int, started_after: float = 0.0, timeout: float = 30.0) -> None:
        wait_for(lambda: len(self.acknowledged(started_after)) >= count, timeout,
                 f"{count} acknowledged batches (failures so far: {self._failure_summary()})")

    def _failure_summary(self) -> str:
        failures = self.failures()
        return f"{len(failures)}, last: {failures[-1].error}" if failures else "none"


# -- set-up and checks -------------------------------------------------------------------------------


def ordered_table_with_replicas(clusters: ClusterSet) -> tuple[str, str]:
    """The load table: a sync replica on remote_0 and an async one on remote_1; returns their ids."""
    clusters.replicated_table(TABLE, schema=ORDERED_SCHEMA)
    sync = clusters.replica(TABLE, SYNC_CLUSTER, REPLICA, mode="sync", schema=ORDERED_SCHEMA)
    async_ = clusters.replica(TABLE, ASYNC_CLUSTER, REPLICA, mode="async", schema=ORDERED_SCHEMA)
    clusters.wait_in_sync(sync)
    return sync, async_


def replica_contents(clusters: ClusterSet, cluster: str, path: str = REPLICA) -> list[tuple[int, int, str]]:
    rows = clusters.client(cluster).select_rows(f"k, batch, v from [{path}]", output_row_limit=10_000_000)
    return sorted((r["k"], r["batch"], r["v"]) for r in rows)


def queue_tablets(clusters: ClusterSet, replica_id: str) -> list[dict[str, Any]]:
    return clusters.meta.get(f"#{replica_id}/@tablets")


def wait_converged(clusters: ClusterSet, replicas: dict[str, str],
                   timeout: float = 30.0) -> list[tuple[int, int, str]]:
    """Until every replica has the whole queue, exactly: same contents, as many rows as the queue.

    ``replicas`` maps replica id -> cluster. Returns the common contents.
    """
    last: dict[str, Any] = {}

    def converged() -> bool:
        contents = {cluster: replica_contents(clusters, cluster) for cluster in replicas.values()}
        progress = {rid: [(t["current_replication_row_index"], t["flushed_row_count"])
                          for t in queue_tablets(clusters, rid)] for rid in replicas}
        last.update(contents=contents, progress=progress)
        queued = sum(flushed for _, flushed in next(iter(progress.values())))
        first = next(iter(contents.values()))
        return (all(c == first for c in contents.values()) and len(first) == queued and
                all(index == flushed for tablets in progress.values() for index, flushed in tablets))

    try:
        wait_for(converged, timeout, "replicas to converge")
    except AssertionError as exc:
        sizes = {cluster: len(rows) for cluster, rows in last.get("contents", {}).items()}
        raise AssertionError(f"{exc}; rows per replica: {sizes}, progress (index, flushed): "
                             f"{last.get('progress')}") from None
    return next(iter(last["contents"].values()))


def check_exactly_once(loads: list[WriteLoad], contents: list[tuple[int, int, str]], where: str) -> None:
    """Acknowledged batches whole and once; other attempted batches whole or absent; nothing else."""
    per_key = Counter(k for k, _, _ in contents)
    duplicated = {k: n for k, n in per_key.items() if n != 1}
    assert not duplicated, f"{where}: keys applied more than once: {dict(list(duplicated.items())[:10])}"
    per_batch = Counter(batch for _, batch, _ in contents)
    partial = {b: n for b, n in per_batch.items() if n != ROWS_PER_BATCH}
    assert not partial, f"{where}: half-applied batches (batch: rows present): {dict(list(partial.items())[:10])}"
    wrong = [row for row in contents if row != (row[0], row[1], f"b{row[1]}") or row[0] // ROWS_PER_BATCH != row[1]]
    assert not wrong, f"{where}: rows that no writer wrote: {wrong[:10]}"
    attempted = set().union(*(load.attempted() for load in loads))
    acknowledged = set().union(*(load.acknowledged() for load in loads))
    unknown = set(per_batch) - attempted
    assert not unknown, f"{where}: batches nobody attempted: {sorted(unknown)[:10]}"
    lost = acknowledged - set(per_batch)
    assert not lost, f"{where}: acknowledged batches missing: {sorted(lost)[:10]} (of {len(acknowledged)})"


def check_all_replicas(clusters: ClusterSet, replicas: dict[str, str], *loads: WriteLoad) -> None:
    """Replicas converge to the same contents, and those hold each load's batches exactly once."""
    try:
        contents = wait_converged(clusters, replicas)
    except AssertionError:
        # say why, if a replica holds duplicates, half batches or lost rows
        for cluster in replicas.values():
            check_exactly_once(list(loads), replica_contents(clusters, cluster), f"replica on {cluster}")
        raise
    assert contents, "nothing was replicated"
    for cluster in replicas.values():
        check_exactly_once(list(loads), replica_contents(clusters, cluster), f"replica on {cluster}")


@contextmanager
def frozen(clusters: ClusterSet, name: str) -> Iterator[None]:
    """SIGSTOP the engine's process group (the engine and nothing else); SIGCONT on exit, always."""
    proc = clusters.engines[name].proc
    assert proc is not None and proc.poll() is None
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


# -- 1-3: SIGKILL of each engine under a write load ------------------------------------------------------


def test_meta_sigkill_under_load_keeps_every_replica_exact(clusters: ClusterSet) -> None:
    sync, async_ = ordered_table_with_replicas(clusters)
    replicas = {sync: SYNC_CLUSTER, async_: ASYNC_CLUSTER}
    with WriteLoad(clusters) as load:
        load.wait_acknowledged(40)
        clusters.engines[META].kill()
    assert load.failures(), "the SIGKILL did not interrupt any write"

    clusters.engines[META].start()
    # a restarted meta-cluster first lets its sync replica catch up, then writes go on
    clusters.wait_in_sync(sync)
    restarted = time.monotonic()
    with WriteLoad(clusters) as after:
        after.wait_acknowledged(10, started_after=restarted)
    check_all_replicas(clusters, replicas, load, after)


def test_sync_replica_sigkill_fails_writes_until_it_is_back(clusters: ClusterSet) -> None:
    sync, async_ = ordered_table_with_replicas(clusters)
    replicas = {sync: SYNC_CLUSTER, async_: ASYNC_CLUSTER}
    with WriteLoad(clusters) as load:
        load.wait_acknowledged(30)
        clusters.engines[SYNC_CLUSTER].kill()
        killed = time.monotonic()
        time.sleep(1.5)
        down = load.snapshot()
        clusters.engines[SYNC_CLUSTER].start()
        back = time.monotonic()

        during = [a for a in down if a.started >= killed]
        assert during, "no write was attempted while the sync replica was down"
        accepted = [a.batch for a in during if a.ok]
        assert not accepted, f"writes acknowledged while the sync replica was down: {accepted[:10]}"
        for attempt in during:
            assert isinstance(attempt.error, YtError), repr(attempt.error)
            text = str(attempt.error)
            assert SYNC_CLUSTER in text and sync in text, f"error does not name the replica and cluster: {text}"
        load.wait_acknowledged(20, started_after=back)
    check_all_replicas(clusters, replicas, load)


def test_async_replica_sigkill_does_not_stop_writes_and_it_catches_up(clusters: ClusterSet) -> None:
    sync, async_ = ordered_table_with_replicas(clusters)
    replicas = {sync: SYNC_CLUSTER, async_: ASYNC_CLUSTER}
    with WriteLoad(clusters) as load:
        load.wait_acknowledged(30)
        clusters.engines[ASYNC_CLUSTER].kill()
        killed = time.monotonic()
        load.wait_acknowledged(30, started_after=killed, timeout=15)
        clusters.engines[ASYNC_CLUSTER].start()
        load.wait_acknowledged(10, started_after=time.monotonic())
    failures = load.failures()
    assert not failures, f"writes failed although only an async replica was down: {failures[0].error}"
    check_all_replicas(clusters, replicas, load)


# -- 4: replication lag of a stopped async replica -----------------------------------------------------------


def test_async_replica_outage_shows_replication_lag_then_recovers(clusters: ClusterSet) -> None:
    """The async replica's engine is frozen with SIGSTOP (process group) for 20 s, then SIGCONT."""
    sync, async_ = ordered_table_with_replicas(clusters)
    replicas = {sync: SYNC_CLUSTER, async_: ASYNC_CLUSTER}

    def lag() -> int:
        return int(clusters.meta.get(f"#{async_}/@replication_lag_time"))

    with WriteLoad(clusters, writers=2) as load:
        load.wait_acknowledged(10)
        samples: list[int] = []
        with frozen(clusters, ASYNC_CLUSTER):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                samples.append(lag())
                time.sleep(0.5)
        assert max(samples) > 0, f"replication_lag_time stayed 0 during a 20 s outage: {samples}"
        assert max(samples) >= 10_000, f"replication_lag_time did not grow with the outage: {samples}"
        # under a load the newest row is often still on its way: caught up means well under a second
        wait_for(lambda: lag() < 1_000, 30, "replication_lag_time back under 1 s under the load")
    assert not load.failures(), f"writes failed during the async outage: {load.failures()[0].error}"
    check_all_replicas(clusters, replicas, load)
    assert lag() == 0


# -- 5: the coordinator dies inside the two-phase commit ----------------------------------------------------


def _flushed(clusters: ClusterSet, replica_id: str) -> int:
    return sum(t["flushed_row_count"] for t in queue_tablets(clusters, replica_id))


def _sorted_contents(clusters: ClusterSet, cluster: str) -> dict[int, str]:
    return {r["k"]: r["v"] for r in clusters.rows(cluster, REPLICA)}


@pytest.mark.parametrize("point, committed", [("after_prepare", False), ("after_commit_decision", True)])
def test_coordinator_crash_in_two_phase_commit_is_all_or_nothing(clusters: ClusterSet, point: str,
                                                                 committed: bool) -> None:
    path = clusters.replicated_table(TABLE)
    # two sync replicas: both are prepared when the coordinator dies
    syncs = {clusters.replica(path, cluster, REPLICA, mode="sync"): cluster for cluster in ("remote_0", "remote_1")}
    for replica_id in syncs:
        clusters.wait_in_sync(replica_id)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "before"}])
    first = next(iter(syncs))
    before = _flushed(clusters, first)
    assert before == 1

    meta = clusters.engines[META]
    meta.stop()
    meta.env = {"REPTABLES_CRASH_AT": point}
    meta.start()
    for replica_id in syncs:
        clusters.wait_in_sync(replica_id)
    with pytest.raises(YtError):
        clusters.meta.insert_rows(path, [{"k": 1, "v": "tx"}, {"k": 2, "v": "tx"}])
    assert meta.proc is not None
    assert meta.proc.wait(timeout=10) == -signal.SIGKILL, "the meta-cluster did not die at the crash point"
    # one replica is SIGKILLed too while it holds the prepared transaction: restarted, it has only its
    # durable record of the prepare (written from the rows as they arrived) to commit or abort
    clusters.engines["remote_1"].kill()
    clusters.engines["remote_1"].start()
    meta.env = {}
    meta.start()
    for replica_id in syncs:
        clusters.wait_in_sync(replica_id)

    expected_queue = before + (2 if committed else 0)
    expected_rows = {1: "tx", 2: "tx"} if committed else {1: "before"}
    for replica_id in syncs:
        assert _flushed(clusters, replica_id) == expected_queue
    for cluster in syncs.values():
        # a commit decided before the crash reaches the replica from the restarted coordinator
        wait_for(lambda c=cluster: _sorted_contents(clusters, c) == expected_rows, 15,
                 f"{point}: rows {expected_rows} on {cluster}")

    # the replicas' prepared transaction is resolved and holds no locks: the same keys are writable
    def write_again() -> bool:
        clusters.meta.insert_rows(path, [{"k": 1, "v": "after"}, {"k": 2, "v": "after"}])
        return True

    wait_for(write_again, 20, "a write to the keys of the interrupted transaction")
    for replica_id in syncs:
        assert _flushed(clusters, replica_id) == expected_queue + 2
    for cluster in syncs.values():
        assert _sorted_contents(clusters, cluster) == {1: "after", 2: "after"}


# -- 6: a dead or frozen sync replica fails the commit fast and applies nothing ----------------------------


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_write_with_sync_replica_down_fails_fast_and_applies_nothing(clusters: ClusterSet, how: str) -> None:
    """``sigkill``: the engine is dead (connection refused); ``sigstop``: it accepts but never answers."""
    path = clusters.replicated_table(TABLE)
    sync = clusters.replica(path, SYNC_CLUSTER, REPLICA, mode="sync")
    async_ = clusters.replica(path, ASYNC_CLUSTER, REPLICA, mode="async")
    clusters.wait_in_sync(sync)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "before"}])
    before = _flushed(clusters, sync)

    def attempt() -> tuple[float, YtError]:
        started = time.monotonic()
        with pytest.raises(YtError) as err:
            clusters.meta.insert_rows(path, [{"k": 2, "v": "lost"}])
        return time.monotonic() - started, err.value

    if how == "sigkill":
        clusters.engines[SYNC_CLUSTER].kill()
        elapsed, error = attempt()
        clusters.engines[SYNC_CLUSTER].start()
    else:
        with frozen(clusters, SYNC_CLUSTER):
            elapsed, error = attempt()
            time.sleep(1.0)  # the coordinator's abort also times out while the replica is frozen
    assert elapsed < 1.5, f"insert_rows took {elapsed:.2f} s to fail with the sync replica down"
    assert SYNC_CLUSTER in error.message and sync in error.message, f"unclear error: {error}"

    # nothing of the failed write anywhere, even after the replica is back and the async one caught up
    assert _flushed(clusters, sync) == before
    wait_for(lambda: all(t["current_replication_row_index"] == before for t in queue_tablets(clusters, async_)),
             15, "async replica caught up")
    for cluster in (SYNC_CLUSTER, ASYNC_CLUSTER):
        assert _sorted_contents(clusters, cluster) == {1: "before"}, cluster

    # a prepare the frozen replica may have taken late is resolved: the key is writable again
    def write_again() -> bool:
        clusters.meta.insert_rows(path, [{"k": 2, "v": "after"}])
        return True

    wait_for(write_again, 20, "a write to the key of the failed transaction")
    assert _flushed(clusters, sync) == before + 1
    assert _sorted_contents(clusters, SYNC_CLUSTER) == {1: "before", 2: "after"}
    wait_for(lambda: _sorted_contents(clusters, ASYNC_CLUSTER) == {1: "before", 2: "after"}, 15, "async replica")


def test_a_commit_landing_while_the_replicator_takes_its_first_barrier_still_reaches_the_replica(
        clusters: ClusterSet) -> None:
    """A new replica's sink has no record yet: a heartbeat claiming a row it lacks would be taken
    as progress, and the row then skipped as already applied (a row lost without an error)."""
    meta = clusters.engines[META]
    meta.stop()
    # the replicator sleeps 1.5 s inside each barrier it takes: the commit below lands in that window
    meta.env = {"REPTABLES_DELAY_AT": "replicator_barrier:1.5"}
    meta.start()
    path = clusters.replicated_table(TABLE)
    replica_id = clusters.replica(path, ASYNC_CLUSTER, REPLICA, enable=False)
    time.sleep(1.1)  # (a barrier is taken only for progress older than a second)
    clusters.alter(replica_id, wait=False, enabled=True)
    time.sleep(0.3)  # the replicator found the queue empty and sleeps in its barrier
    clusters.meta.insert_rows(path, [{"k": 1, "v": "during"}], require_sync_replica=False)
    wait_for(lambda: clusters.rows(ASYNC_CLUSTER, REPLICA) == [{"k": 1, "v": "during"}], 20,
             "the row committed during the barrier")
    clusters.meta.insert_rows(path, [{"k": 2, "v": "after"}], require_sync_replica=False)
    wait_for(lambda: sorted(clusters.rows(ASYNC_CLUSTER, REPLICA), key=lambda r: r["k"]) ==
             [{"k": 1, "v": "during"}, {"k": 2, "v": "after"}], 20, "the next row")
    assert clusters.meta.get(f"#{replica_id}/@state") == "enabled"


def test_a_malformed_delay_setting_is_refused_at_start(tmp_path: Path) -> None:
    engine = EngineProcess("bad", tmp_path / "bad", env={"REPTABLES_DELAY_AT": "replicator_barrier"})
    with pytest.raises(RuntimeError, match="REPTABLES_DELAY_AT"):
        engine.start()


# -- 6: a resharded table across a restart of the meta-cluster ----------------------------------------------

#: three tablets, after a reshard of a table made with one; a key in each
RESHARD_PIVOTS: list[list[Any]] = [[], [10], [20]]
RESHARD_KEYS = (5, 15, 25)


def _replica_changes(clusters: ClusterSet, cluster: str, start: int, until: int) -> list[tuple[int, str]]:
    """What the change stream of the replica table on ``cluster`` delivers from timestamp ``start`` on,
    until it has passed timestamp ``until``: a consumer's view, (key, value) per change."""
    client = clusters.client(cluster)
    changes: list[tuple[int, str]] = []
    token: list[str] = []

    def passed() -> bool:
        answer = client.pull_changes(REPLICA, from_event_token=token[-1] if token else None,
                                     from_timestamp=None if token else start, wait_timeout=0)
        token.append(answer["event_token"])
        changes.extend((e["key"]["k"], e["row"]["v"]) for e in answer["events"] if e["kind"] != "heartbeat")
        return token_timestamp(answer["event_token"]) >= until

    wait_for(passed, 30, f"the stream of {REPLICA} on {cluster} to pass the last write")
    return changes


def _check_delivered_once(clusters: ClusterSet, replicas: dict[str, str], start: int,
                          written: list[tuple[int, str]]) -> None:
    """Every replica holds the last value of every key, every tablet of the queue is replicated to
    its end, and each replica's change stream has every acknowledged write exactly once."""
    until = clusters.meta.generate_timestamp()
    last = {k: v for k, v in written}
    for replica_id, cluster in replicas.items():
        wait_for(lambda cluster=cluster: _sorted_contents(clusters, cluster) == last, 30, f"the rows on {cluster}")
        wait_for(lambda replica_id=replica_id: all(
            t["current_replication_row_index"] == t["flushed_row_count"] for t in queue_tablets(clusters, replica_id)),
            30, f"replica {replica_id} to have the whole queue")
        delivered = Counter(_replica_changes(clusters, cluster, start, until))
        assert delivered == Counter(written), (
            f"the stream on {cluster}: missing {sorted(set(written) - set(delivered))}, "
            f"more than once {sorted(c for c, n in delivered.items() if n > 1)}, "
            f"never written {sorted(set(delivered) - set(written))}")


def test_a_resharded_table_delivers_every_acknowledged_row_once_across_a_meta_sigkill(clusters: ClusterSet) -> None:
    """A reshard to more tablets saves the queue row counts of the tablets it adds: a meta-cluster
    SIGKILLed after it goes on appending to their queues where they ended, and sends the rows an
    async replica had not received yet (docs/reliability.md, "Found by the fault runs")."""
    path = clusters.replicated_table(TABLE)
    logged = {"enable_change_log": True}  # the replica tables' streams are checked
    sync = clusters.replica(path, SYNC_CLUSTER, REPLICA, mode="sync", table_attributes=logged)
    async_ = clusters.replica(path, ASYNC_CLUSTER, REPLICA, mode="async", table_attributes=logged)
    clusters.wait_in_sync(sync)
    meta = clusters.meta
    start = meta.generate_timestamp()
    written = [(k, "one tablet") for k in RESHARD_KEYS]
    meta.insert_rows(path, [{"k": k, "v": v} for k, v in written])
    # the operator's way to spread a table: unmount, reshard (once every replica has the queue), mount
    meta.unmount_table(path)
    wait_for(lambda: meta.reshard_table(path, pivot_keys=RESHARD_PIVOTS) is None, 30, "the reshard")
    meta.mount_table(path)
    assert meta.get(f"{path}/@tablet_count") == len(RESHARD_PIVOTS)
    clusters.wait_in_sync(sync)
    clusters.engines[ASYNC_CLUSTER].stop()
    resharded = [(k, "three tablets") for k in RESHARD_KEYS]
    meta.insert_rows(path, [{"k": k, "v": v} for k, v in resharded])  # queued for the async replica
    written += resharded

    clusters.restart(META)
    clusters.engines[ASYNC_CLUSTER].start()
    clusters.wait_in_sync(sync)
    restarted = [(k, "restarted") for k in RESHARD_KEYS]

    def write_restarted() -> bool:
        try:
            meta.insert_rows(path, [{"k": k, "v": v} for k, v in restarted])
        except UnavailableError:
            # retried, as a client does: the sync replica may still hold the row locks of a transaction
            # the killed meta-cluster left in doubt, until it asks for the outcome (within about 2 s).
            # A failed attempt committed nothing: a retry that wrote twice fails the count below
            return False
        except YtError as exc:
            pytest.fail(f"a write to every tablet after the restart failed: {exc}")
        return True

    wait_for(write_restarted, 30, "a write to every tablet after the restart")
    written += restarted

    _check_delivered_once(clusters, {sync: SYNC_CLUSTER, async_: ASYNC_CLUSTER}, start, written)
    # each queue counted its rows on across the restart: one tablet's rows, then one row a tablet twice
    assert [t["flushed_row_count"] for t in queue_tablets(clusters, async_)] == [len(RESHARD_KEYS) + 2, 2, 2]


def _database_url(engine: EngineProcess) -> str:
    """The SQLAlchemy URL of a (stopped) engine's database: its ``--storage``, else its data directory's file."""
    if "--storage" in engine.extra_args:
        return postgresql_driver_url(engine.extra_args[engine.extra_args.index("--storage") + 1])
    return f"sqlite:///{engine.data_dir / DATABASE}"


def _drop_tablet_rows(engine: EngineProcess, table_id: str, from_tablet: int) -> None:
    """Delete a stopped engine's ``_rt_tablets`` rows of a table's tablets from ``from_tablet`` on: what
    a reshard of an engine before the fix left in its database (it made none for the tablets it added)."""
    database = sa.create_engine(_database_url(engine))
    try:
        with database.begin() as conn:
            deleted = conn.execute(tablets_table.delete().where(tablets_table.c.table_id == table_id,
                                                                tablets_table.c.tablet_index >= from_tablet))
            assert deleted.rowcount > 0
    finally:
        database.dispose()


def test_a_meta_cluster_restores_the_queue_counts_an_older_reshard_did_not_save(clusters: ClusterSet) -> None:
    """A database a reshard of an older engine left without the row counts of the tablets it added is
    repaired at start-up: from the rows a queue holds, and from what the replicas acknowledged for a
    queue trimmed empty. Writes to those tablets then go on where their queues ended, and every
    replica gets every row once."""
    path = clusters.replicated_table(TABLE, attributes={"min_replication_log_ttl": 0})
    replicas = {clusters.replica(path, cluster, REPLICA, table_attributes={"enable_change_log": True}): cluster
                for cluster in (SYNC_CLUSTER, ASYNC_CLUSTER)}
    meta = clusters.meta
    meta.unmount_table(path)
    meta.reshard_table(path, pivot_keys=RESHARD_PIVOTS)
    meta.mount_table(path)
    start = meta.generate_timestamp()
    written = [(25, "replicated and trimmed")]
    meta.insert_rows(path, [{"k": k, "v": v} for k, v in written], require_sync_replica=False)
    wait_for(lambda: queue_tablets(clusters, next(iter(replicas)))[2]["trimmed_row_count"] == 1, 30,
             "tablet 2's queue to be trimmed empty")
    clusters.engines[ASYNC_CLUSTER].stop()
    queued = [(15, "queued"), (16, "queued")]
    meta.insert_rows(path, [{"k": k, "v": v} for k, v in queued], require_sync_replica=False)
    written += queued

    table_id = meta.get(f"{path}/@id")
    clusters.engines[META].stop()
    _drop_tablet_rows(clusters.engines[META], table_id, 1)
    clusters.engines[META].start()
    clusters.engines[ASYNC_CLUSTER].start()
    after = [(15, "after"), (25, "after")]
    try:
        meta.insert_rows(path, [{"k": k, "v": v} for k, v in after], require_sync_replica=False)
    except YtError as exc:
        pytest.fail(f"a write to the tablets without counts failed after the restart: {exc}")
    written += after

    _check_delivered_once(clusters, replicas, start, written)
    # the queues went on where they had ended: tablet 1 after its 2 queued rows, tablet 2 after its trimmed one
    assert [t["flushed_row_count"] for t in queue_tablets(clusters, next(iter(replicas)))] == [0, 3, 2]


def _rewind_progress(engine: EngineProcess, replica_id: str, row_index: int) -> int:
    """Set a stopped meta-cluster's saved progress of ``replica_id`` back to ``row_index`` on every
    tablet: what a crash of its machine leaves when it loses the replicator's last progress writes
    (they are committed without an fsync). Returns the row index it had saved."""
    database = sa.create_engine(_database_url(engine))
    c = replica_progress_table.c
    try:
        with database.begin() as conn:
            saved = conn.execute(sa.select(sa.func.max(c.row_index)).where(c.replica_id == replica_id)).scalar_one()
            conn.execute(replica_progress_table.update().where(c.replica_id == replica_id)
                         .values(row_index=row_index, timestamp=0))
    finally:
        database.dispose()
    return int(saved)


def test_a_meta_cluster_that_lost_its_replication_progress_pushes_again_and_the_replica_applies_nothing_twice(
        clusters: ClusterSet) -> None:
    """The replicator records how far a replica got without an fsync of its own. A meta-cluster whose
    machine crashed may come back with an older position: it pushes those rows again, the replica
    answers with its own durable record, and every row is there once, the later writes too."""
    path = clusters.replicated_table(TABLE, schema=ORDERED_SCHEMA,
                                     attributes={"min_replication_log_ttl": 3_600_000})  # (keeps the queue)
    replica_id = clusters.replica(path, ASYNC_CLUSTER, REPLICA, mode="async", schema=ORDERED_SCHEMA)
    meta = clusters.meta
    before = [next(_BATCH_IDS) for _ in range(5)]
    for batch in before:
        meta.insert_rows(path, batch_rows(batch), require_sync_replica=False)
    wait_converged(clusters, {replica_id: ASYNC_CLUSTER})

    clusters.engines[META].stop()
    saved = _rewind_progress(clusters.engines[META], replica_id, 0)
    assert saved == len(before) * ROWS_PER_BATCH
    clusters.engines[META].start()
    after = [next(_BATCH_IDS) for _ in range(3)]
    for batch in after:
        meta.insert_rows(path, batch_rows(batch), require_sync_replica=False)

    contents = wait_converged(clusters, {replica_id: ASYNC_CLUSTER})
    assert contents == sorted(row for batch in before + after
                              for row in ((r["k"], r["batch"], r["v"]) for r in batch_rows(batch)))
    # the replicator learnt the replica's position from its answer, and went on from there
    assert [t["current_replication_row_index"] for t in queue_tablets(clusters, replica_id)] == \
        [(len(before) + len(after)) * ROWS_PER_BATCH]
