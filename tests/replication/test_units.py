"""Replication's guarantees checked in-process, one piece at a time.

The other tests of this folder are black-box: real engine processes over HTTP, which is what a
user runs, but a failure there rarely says which piece broke, and some situations (an answer lost
right after the replica applied a batch, a commit rolled back after a replica's progress moved)
are hard to provoke at will. These tests complement them: they run the replicator, the replica
sink and the sync-phase logic against a small fake ``ReplicationHost`` and a fake network (both
fakes of the *boundary*: the storage is real SQLite on a temporary file, the tables, the
transaction manager and Cypress are the engine's own), and call one step at a time.

Each test asserts something a user relies on: every change arrives once, in order, with no gap;
progress never claims more than the replica acknowledged; a failing replica shows its error and is
retried later; a replica turns sync only once it has the whole queue.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from reptables.engine.config import EngineConfig
from reptables.engine.cypress import OBJECT_TYPES, Cypress, Node, parse_ypath
from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.replica_types import ReplicaMode, ReplicaState
from reptables.engine.replication import ReplicationHost, ReplicationManager
from reptables.engine.replication.registry import Replica, ReplicaRegistry, SyncPhase
from reptables.engine.replication.sink import ReplicaSink, replica_freshness
from reptables.engine.schema import TableSchema
from reptables.engine.storage import UserTables, replica_progress_table, storage_for_data_dir
from reptables.engine.tablets import DynamicTable, RowWrite, TabletState, WriteKind
from reptables.engine.timestamps import TimestampProvider
from reptables.engine.transactions import Participant, RemoteParticipant, TransactionManager, make_object_id
from reptables.testing import wait_for

SORTED = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
ORDERED = [{"name": "k", "type": "int64"}, {"name": "v", "type": "string"}]


# -- the fakes: one engine's parts without HTTP, and the wire between engines ----------------------------


class FakeHost:
    """A ``ReplicationHost``: the engine's real storage, timestamps, transactions and Cypress."""

    def __init__(self, name: str, data_dir: Path) -> None:
        self.name = name
        self.storage = storage_for_data_dir(data_dir)
        self.timestamps = TimestampProvider(0, lambda _reserved: None)
        self.cypress = Cypress()
        self.transactions = TransactionManager(self.storage, self.timestamps, self._by_id)

    def _by_id(self, table_id: str) -> tuple[DynamicTable, str] | None:
        node = self.cypress.by_id.get(table_id)
        return (node.table, node.path) if node is not None and node.table is not None else None

    def check_accepts_writes(self, path: str) -> None:
        """This host is never paused nor read-only."""

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        node = self.cypress.resolve(parse_ypath(path))
        assert node is not None
        if node.table is None:
            raise YtError(f"{node.path} is not a table", code=ErrorCode.INVALID_PARAMETER)
        return node.table, node.path, node

    def make_table(self, name: str, schema: list[dict[str, Any]], replicated: bool = False,
                   upstream_replica_id: str | None = None) -> DynamicTable:
        node_type = "replicated_table" if replicated else "table"
        node = Node(id=make_object_id(OBJECT_TYPES[node_type]), type=node_type, name=name,
                    parent=self.cypress.root, attributes={"schema": schema})
        parsed = TableSchema.parse(schema, f"//{name}")
        sql_name = f"t_{name}"
        table = DynamicTable(table_id=node.id, schema=parsed,
                             sql=UserTables.queue(sql_name, parsed) if replicated else UserTables(sql_name, parsed),
                             replicated=replicated, upstream_replica_id=upstream_replica_id,
                             state=TabletState.MOUNTED, has_read_locks=False)
        table.recent_floor = self.timestamps.generate()
        table.tablet_rows = {0: [0, 0]}
        with self.storage.write() as conn:
            table.sql.create(conn)
            self.cypress.attach(node)
            self.cypress.save(conn, node)
        node.table = table
        return table

    def rows(self, table: DynamicTable) -> list[tuple[Any, ...]]:
        data = table.sql.data
        with self.storage.read() as conn:
            return [tuple(r) for r in conn.execute(sa.select(data.c.k, data.c.v).order_by(data.c.k))]


class FakeNetwork:
    """``Peers`` in-process: a call runs the target's handler at once, through JSON as on the wire.

    ``down`` makes a cluster unreachable; ``lose_push_answers`` drops the answers of that many
    pushes *after* the replica applied them (a timeout on the way back)."""

    timeout = 1.0

    def __init__(self) -> None:
        self.sinks: dict[str, ReplicaSink] = {}
        self.down: set[str] = set()
        self.lose_push_answers = 0
        #: (cluster, method, request, answer or None)
        self.calls: list[tuple[str, str, dict[str, Any], dict[str, Any] | None]] = []

    def connection(self, name: str) -> object:
        if name not in self.sinks:
            raise YtError(f"Replica cluster {name} is not known", code=ErrorCode.RESOLVE_ERROR)
        return object()

    def client(self, name: str) -> FakeClient:
        return FakeClient(self, name)

    def pushes(self) -> list[tuple[int, int, dict[str, Any] | None]]:
        return [(c[2]["prev_row_index"], c[2]["row_index"], c[3]) for c in self.calls
                if c[1] == "push" and "heartbeats" not in c[2]]


class FakeClient:
    def __init__(self, network: FakeNetwork, cluster: str) -> None:
        self.network = network
        self.cluster = cluster

    def call(self, method: str, body: dict[str, Any] | None = None, timeout: float | None = None,
             raw_body: bytes | None = None) -> dict[str, Any]:
        request = json.loads(raw_body) if raw_body is not None else json.loads(json.dumps(body or {}))
        if self.cluster in self.network.down:
            self.network.calls.append((self.cluster, method, request, None))
            raise YtError(f"Cannot connect to cluster {self.cluster}", code=ErrorCode.UNAVAILABLE)
        sink = self.network.sinks[self.cluster]
        # (in process: no caller to authenticate, the HTTP layer's part)
        handlers: dict[str, Callable[[dict[str, Any], None], Any]] = {
            "push": sink.handle_push, "table_info": lambda b, caller: sink.table_info(b["path"], caller),
            "prepare": sink.handle_prepare, "commit": sink.handle_commit, "abort": sink.handle_abort}
        answer = json.loads(json.dumps(handlers[method](request, None) or {}))
        self.network.calls.append((self.cluster, method, request, answer))
        if method == "push" and self.network.lose_push_answers > 0:
            self.network.lose_push_answers -= 1
            raise YtError(f"Timed out waiting for cluster {self.cluster}", code=ErrorCode.TIMEOUT)
        return answer


class World:
    """A meta-cluster with a replicated table ``//data`` and a replica cluster ``remote``."""

    def __init__(self, tmp_path: Path, schema: list[dict[str, Any]], config: EngineConfig) -> None:
        self.schema = schema
        self.network = FakeNetwork()
        self.meta = FakeHost("meta", tmp_path / "meta")
        self.remote = FakeHost("remote", tmp_path / "remote")
        self.network.sinks["remote"] = ReplicaSink(self.remote)
        host: ReplicationHost = self.meta  # the fake satisfies the protocol (checked by mypy, too)
        self.manager = ReplicationManager(host, self.network, config)  # type: ignore[arg-type]
        self.table = self.meta.make_table("data", schema, replicated=True)
        self.replica_tables: dict[str, DynamicTable] = {}

    def add_replica(self, name: str, mode: str = "async", enable: bool = True) -> Replica:
        replica_id = self.manager.create_replica({"table_path": "//data", "cluster_name": "remote",
                                                  "replica_path": f"//{name}", "mode": mode})
        self.replica_tables[replica_id] = self.remote.make_table(name, self.schema, upstream_replica_id=replica_id)
        if enable:
            self.manager.alter_replica(replica_id, enabled=True, mode=None)
        return self.manager.replica(replica_id)

    def part(self, rows: list[dict[str, Any]]) -> Participant:
        return Participant(self.table, "//data", 0, [RowWrite(WriteKind.WRITE, row, 1) for row in rows])

    def commit(self, rows: list[dict[str, Any]], remote: list[RemoteParticipant] | None = None,
               fail_after: bool = False) -> int:
        """What the transaction manager does for a replicated tablet: append to the queue and run
        the replication hook, in one SQL transaction (which ``fail_after`` then rolls back)."""
        part = self.part(rows)
        ts = self.meta.timestamps.generate()
        with self.meta.storage.write() as conn:
            self.table.apply(conn, part.writes, ts, 0)
            self.manager.after_queue_append(conn, part, ts, remote or [])
            if fail_after:
                raise RuntimeError("the commit fails after the queue append")
        return ts

    def replicate_once(self, replica: Replica) -> bool:
        return self.manager.replicators.replicator(replica).replicate_once()

    def stored_progress(self, replica: Replica) -> int:
        with self.meta.storage.read() as conn:
            return conn.execute(sa.select(replica_progress_table.c.row_index).where(
                replica_progress_table.c.replica_id == replica.id,
                replica_progress_table.c.tablet_index == 0)).scalar_one()

    def close(self) -> None:
        self.manager.close()
        self.meta.storage.close()
        self.remote.storage.close()


def rows(first: int, count: int, value: str = "v") -> list[dict[str, Any]]:
    return [{"k": k, "v": f"{value}{k}"} for k in range(first, first + count)]


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Callable[..., World]]:
    worlds: list[World] = []

    def make(schema: list[dict[str, Any]] = SORTED, **config: Any) -> World:
        world = World(tmp_path / f"world{len(worlds)}", schema, EngineConfig().with_changes(**config))
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.close()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[FakeHost]:
    """One replica engine's real parts, without HTTP (for the sink's checks in other modules too)."""
    fake = FakeHost("remote", tmp_path)
    try:
        yield fake
    finally:
        fake.storage.close()


# -- the sink: a replica applies each batch once, in order ---------------------------------------------


def _batch(replica_id: str, prev: int, end: int, changes: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    return {"upstream_replica_id": replica_id, "replica_path": "//replica", "tablet_index": 0,
            "prev_row_index": prev, "row_index": end, "preserve_timestamps": True,
            "entries": [{"timestamp": ts, "kind": "write", "payload": {"row": row, "update": False}}
                        for ts, row in changes]}


def test_sink_applies_a_batch_once_and_a_retried_old_batch_never_overwrites_newer_rows(tmp_path: Path) -> None:
    host = FakeHost("remote", tmp_path)
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    t1, t2 = host.timestamps.generate(), host.timestamps.generate()
    first = _batch("r-1", 0, 1, [(t1, {"k": 1, "v": "old"})])
    second = _batch("r-1", 1, 2, [(t2, {"k": 1, "v": "new"})])

    assert sink.handle_push(first, None) == {"row_index": 1, "applied": True}
    assert sink.handle_push(second, None) == {"row_index": 2, "applied": True}
    # the first batch again (its answer was lost): recognised, answered with the stored progress
    assert sink.handle_push(first, None) == {"row_index": 2, "applied": False}
    assert host.rows(table) == [(1, "new")]


def test_sink_applies_a_retried_batch_of_an_ordered_table_once(tmp_path: Path) -> None:
    host = FakeHost("remote", tmp_path)
    table = host.make_table("replica", ORDERED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    ts = host.timestamps.generate()
    batch = _batch("r-1", 0, 2, [(ts, {"k": 1, "v": "a"}), (ts, {"k": 2, "v": "b"})])
    assert sink.handle_push(batch, None)["applied"] is True
    assert sink.handle_push(batch, None) == {"row_index": 2, "applied": False}
    assert host.rows(table) == [(1, "a"), (2, "b")]  # not four rows


def test_sink_refuses_a_batch_that_would_leave_a_gap(tmp_path: Path) -> None:
    host = FakeHost("remote", tmp_path)
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    t1, t2 = host.timestamps.generate(), host.timestamps.generate()
    sink.handle_push(_batch("r-1", 0, 1, [(t1, {"k": 1, "v": "a"})]), None)
    # rows 1..4 never arrived: a batch starting at 5 is not applied; the answer says where to resume
    assert sink.handle_push(_batch("r-1", 5, 7, [(t2, {"k": 2, "v": "b"})]), None) == {"row_index": 1, "applied": False}
    assert host.rows(table) == [(1, "a")]


def test_sink_refuses_batches_of_another_replica(tmp_path: Path) -> None:
    host = FakeHost("remote", tmp_path)
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    with pytest.raises(YtError) as error:
        ReplicaSink(host).handle_push(_batch("r-2", 0, 1, [(host.timestamps.generate(), {"k": 1, "v": "x"})]), None)
    assert error.value.code == ErrorCode.UPSTREAM_REPLICA_MISMATCH
    assert host.rows(table) == []


def test_a_replica_counts_the_tablets_every_push_tells_and_never_goes_back_to_an_older_layout(
        tmp_path: Path) -> None:
    """A replica table's stream goes up to the least timestamp recorded over the meta table's tablets,
    so it must count every tablet a reshard added as soon as any change after the reshard arrives:
    every push tells the count with the layout's revision, and a late push of an older layout (its
    answer timed out, it was applied later) does not take the new tablets out of the count."""
    host = FakeHost("remote", tmp_path)
    host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    t1, t2, t3 = (host.timestamps.generate() for _ in range(3))

    def push(tablet: int, prev: int, end: int, changes: list[tuple[int, dict[str, Any]]], count: int,
             revision: int, receiver: ReplicaSink = sink, **more: Any) -> None:
        receiver.handle_push({**_batch("r-1", prev, end, changes), "tablet_index": tablet, "tablet_count": count,
                              "layout_revision": revision, **more}, None)

    def freshness() -> int:
        with host.storage.read() as conn:
            return replica_freshness(conn, "r-1")

    push(0, 0, 1, [(t1, {"k": 1, "v": "a"})], count=1, revision=0)
    assert freshness() == t1 - 1
    # resharded to two tablets: a push of the busy old tablet says so, and tablet 1 has told nothing yet
    push(0, 1, 2, [(t3, {"k": 2, "v": "c"})], count=2, revision=1)
    assert freshness() == 0
    # a heartbeat of the old layout arriving late, to this sink or to one restarted (which reads the record)
    for receiver in (sink, ReplicaSink(host)):
        push(0, 2, 2, [], count=1, revision=0, receiver=receiver, barrier_timestamp=t3)
        assert freshness() == 0
    push(1, 0, 1, [(t2, {"k": 10, "v": "b"})], count=2, revision=1)
    assert freshness() == t2 - 1


# -- the replicator: in order, progress only after an acknowledgement ----------------------------------


def test_replicator_pushes_every_row_in_order_without_gaps(make_world: Callable[..., World]) -> None:
    world = make_world(batch_rows=2)
    world.commit(rows(0, 3))
    world.commit(rows(3, 2))
    replica = world.add_replica("replica")

    while world.replicate_once(replica):
        pass

    pushes = world.network.pushes()
    assert [(prev, end) for prev, end, _ in pushes] == [(0, 2), (2, 4), (4, 5)]  # contiguous, in order
    assert all(answer is not None and answer["applied"] for _, _, answer in pushes)
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(5)]
    assert replica.progress_of(0).row_index == 5
    assert world.stored_progress(replica) == 5  # survives a restart


def test_progress_moves_only_after_the_replica_acknowledges_and_a_lost_answer_duplicates_nothing(
        make_world: Callable[..., World]) -> None:
    world = make_world(schema=ORDERED)
    world.commit(rows(0, 3))
    replica = world.add_replica("replica")
    world.network.lose_push_answers = 1

    assert world.replicate_once(replica) is False
    # the replica applied the batch, but the meta-cluster never heard so: its progress stays
    assert replica.progress_of(0).row_index == 0
    assert world.stored_progress(replica) == 0
    assert replica.errors and replica.progress_of(0).error is not None

    world.replicate_once(replica)
    # the same batch went again, was recognised, and the answer moved the progress
    assert [(prev, end) for prev, end, _ in world.network.pushes()] == [(0, 3), (0, 3)]
    assert world.network.pushes()[-1][2] == {"row_index": 3, "applied": False}
    assert replica.progress_of(0).row_index == 3
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(3)]
    assert replica.errors == [] and replica.progress_of(0).error is None


def test_a_failed_push_shows_its_error_on_the_tablet_and_the_replicator_backs_off(
        make_world: Callable[..., World]) -> None:
    world = make_world(soft_backoff=0.6, replicator_tick=0.01)
    world.commit(rows(0, 2))
    replica = world.add_replica("replica")
    world.network.down.add("remote")

    before = time.monotonic()
    assert world.replicate_once(replica) is False
    assert replica.backoff_until >= before + 0.6
    attrs = world.manager.describe(replica)
    assert "Cannot connect" in attrs["tablets"][0]["replication_error"]["message"]
    assert attrs["errors"] and attrs["tablets"][0]["current_replication_row_index"] == 0
    assert world.manager.replicas_attribute(world.table.table_id)[replica.id]["errors"]

    # the cluster is back: the replicator pool waits out the backoff, then delivers
    world.network.down.clear()
    pushes_before = len(world.network.pushes())
    world.manager.start()
    time.sleep(0.2)
    assert len(world.network.pushes()) == pushes_before, "pushed again during the backoff"
    wait_for(lambda: replica.progress_of(0).row_index >= 2, 10, "the rows delivered after the backoff", interval=0.02)
    assert replica.progress_of(0).row_index == 2
    attrs = world.manager.describe(replica)
    assert attrs["errors"] == [] and "replication_error" not in attrs["tablets"][0]


# -- switching to sync: catching up, draining, in sync ------------------------------------------------


def _refused_with_1732(world: World) -> bool:
    try:
        world.manager.sync_participants(world.part(rows(100, 1)), require_sync_replica=False)
    except YtError as exc:
        return exc.code == ErrorCode.SYNC_REPLICA_NOT_IN_SYNC
    return False


def test_a_sync_replica_turns_in_sync_only_once_it_has_the_whole_queue(make_world: Callable[..., World]) -> None:
    world = make_world(batch_rows=2, drain_threshold_rows=1)
    world.commit(rows(0, 5))
    replica = world.add_replica("replica", mode="sync")
    assert replica.phase is SyncPhase.CATCHING_UP
    with pytest.raises(YtError) as error:
        world.manager.sync_participants(world.part(rows(100, 1)), require_sync_replica=True)
    assert error.value.code == ErrorCode.SYNC_REPLICA_NOT_IN_SYNC

    world.replicate_once(replica)  # rows 0-1: three missing, more than the drain threshold
    assert replica.phase is SyncPhase.CATCHING_UP

    world.replicate_once(replica)  # rows 2-3: one missing, so it drains; writes are refused meanwhile
    assert replica.phase is SyncPhase.DRAINING
    assert _refused_with_1732(world)

    world.network.down.add("remote")
    world.replicate_once(replica)  # the last row cannot be pushed: still draining, not in sync
    assert replica.phase is SyncPhase.DRAINING and not replica.writes_synchronously

    world.network.down.clear()
    world.replicate_once(replica)
    assert replica.phase is SyncPhase.IN_SYNC
    assert world.manager.in_sync_replicas(world.table, world.meta.timestamps.generate()) == [replica.id]
    participants = world.manager.sync_participants(world.part(rows(5, 1)), require_sync_replica=True)
    assert [p.replica_id for p in participants] == [replica.id]

    # from now on each commit carries the replica's progress with it, in the same SQL transaction
    world.commit(rows(5, 1), remote=participants)
    assert participants[0].row_index == 6
    assert replica.progress_of(0).row_index == 6 and world.stored_progress(replica) == 6
    assert world.replicate_once(replica) is False  # the replicator has nothing to push for it


def test_an_async_commit_is_refused_once_a_replica_is_in_sync_without_being_a_participant(
        make_world: Callable[..., World]) -> None:
    world = make_world()
    replica = world.add_replica("replica", mode="sync")
    world.replicate_once(replica)
    assert replica.writes_synchronously
    with pytest.raises(YtError) as error:
        world.commit(rows(0, 1))  # participants chosen before the replica turned in sync
    assert error.value.code == ErrorCode.SYNC_REPLICA_NOT_IN_SYNC
    assert world.table.tablet_rows[0][0] == 0  # nothing appended


def test_a_rolled_back_commit_leaves_sync_progress_where_it_was(make_world: Callable[..., World]) -> None:
    world = make_world()
    first = world.add_replica("first", mode="sync")
    second = world.add_replica("second", mode="sync")
    world.replicate_once(first)
    world.replicate_once(second)
    assert first.writes_synchronously and second.writes_synchronously
    both = world.manager.sync_participants(world.part(rows(0, 2)), require_sync_replica=True)

    # a commit whose participants missed `second` is refused after `first` moved: nothing stays
    with pytest.raises(YtError):
        world.commit(rows(0, 2), remote=[p for p in both if p.replica_id == first.id])
    assert first.progress_of(0).row_index == 0
    # ...and one failing later in its transaction likewise
    with pytest.raises(RuntimeError):
        world.commit(rows(0, 2), remote=both, fail_after=True)
    assert first.progress_of(0).row_index == 0 and second.progress_of(0).row_index == 0

    # so the next commit is accepted, and every replica's progress matches the queue
    world.commit(rows(0, 2), remote=world.manager.sync_participants(world.part(rows(0, 2)), True))
    assert world.table.tablet_rows[0][0] == 2
    assert first.progress_of(0).row_index == second.progress_of(0).row_index == 2


# -- the registry: mode and state changes, readers take copies ----------------------------------------


def test_disable_stops_the_replicator_and_enable_starts_clean(make_world: Callable[..., World]) -> None:
    world = make_world(replicator_tick=0.01)
    world.commit(rows(0, 1))
    replica = world.add_replica("replica")
    world.network.down.add("remote")
    world.replicate_once(replica)
    assert replica.errors

    world.manager.alter_replica(replica.id, enabled=False, mode=None)
    assert replica.state is ReplicaState.DISABLING  # the command returns at once
    world.manager.replicators.replicator(replica).run_once()  # its next pass sees it, stops and says so
    assert replica.state is ReplicaState.DISABLED
    world.network.down.clear()
    world.manager.alter_replica(replica.id, enabled=True, mode="sync")
    snap = replica.snapshot()
    assert (snap.state, snap.mode, snap.phase, snap.errors, snap.backoff_until) == \
        (ReplicaState.ENABLING, ReplicaMode.SYNC, SyncPhase.CATCHING_UP, (), 0.0)
    world.replicate_once(replica)  # caught up: it drains, and is enabled from here on
    assert (replica.state, replica.phase) in ((ReplicaState.ENABLED, SyncPhase.DRAINING),
                                              (ReplicaState.ENABLED, SyncPhase.IN_SYNC))


def test_replicas_come_back_from_storage_with_their_progress(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.commit(rows(0, 3))
    replica = world.add_replica("replica", mode="sync")
    world.replicate_once(replica)

    registry = ReplicaRegistry(world.meta, world.network)  # type: ignore[arg-type]
    with world.meta.storage.read() as conn:
        registry.load(conn)
    again = registry.get(replica.id)
    assert again.progress_of(0).row_index == 3
    # a restarted sync replica catches up again before it takes part in commits
    assert (again.state, again.mode, again.phase) == (ReplicaState.ENABLED, ReplicaMode.SYNC, SyncPhase.CATCHING_UP)
