"""Tablet transaction semantics of seed 003, checked on a real Cluster over real SQLite.

These run the engine in-process (no HTTP) so that each rule of the seed — snapshot isolation,
both conflict checks, lock groups, read locks, non-atomic mode, limits, two-phase commit — is one
short test. The HTTP path is covered by the yt CLI and client tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from reptables.engine.config import DEFAULT_CONFIG, EngineConfig
from reptables.engine.errors import ErrorCode, LockConflict, YtError
from reptables.engine.node import Cluster
from reptables.engine.storage import commits_table, prepared_table
from reptables.engine.timestamps import COUNTER_BITS
from reptables.testing.backends import open_cluster

SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "v", "type": "string"},
    {"name": "a", "type": "int64", "lock": "group_a"},
    {"name": "b", "type": "int64", "lock": "group_b"},
]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = open_cluster("local", tmp_path / "data")
    c.nodes.create("table", "//tmp/t", {"dynamic": True, "schema": SCHEMA, "pivot_keys": [[], [100]]})
    c.tablets.mount_table("//tmp/t")
    try:
        yield c
    finally:
        c.close()


def lookup(c: Cluster, key: int, **kwargs: object) -> dict | None:
    rows = c.rows.lookup_rows("//tmp/t", [{"k": key}], keep_missing_rows=True, **kwargs)
    return rows[0]


def test_transaction_does_not_see_its_own_writes(cluster: Cluster) -> None:
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "mine"}], transaction_id=tx)
    assert lookup(cluster, 1, transaction_id=tx) is None
    cluster.rows.commit_transaction(tx)
    assert lookup(cluster, 1)["v"] == "mine"


def test_transaction_reads_the_snapshot_of_its_start(cluster: Cluster) -> None:
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "before"}])
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "after"}])
    assert lookup(cluster, 1, transaction_id=tx)["v"] == "before"
    assert cluster.rows.select_rows("v from [//tmp/t]", transaction_id=tx) == [{"v": "before"}]
    assert lookup(cluster, 1)["v"] == "after"


def test_commit_timestamp_is_after_start_and_consistent(cluster: Cluster) -> None:
    tx = cluster.rows.start_transaction()
    start = cluster.transactions.get(tx).start_timestamp
    cluster.rows.insert_rows("//tmp/t", [{"k": 2, "v": "x"}], transaction_id=tx)
    commit_ts = cluster.rows.commit_transaction(tx)
    assert commit_ts > start
    assert lookup(cluster, 2, timestamp=commit_ts - 1) is None
    assert lookup(cluster, 2, timestamp=commit_ts)["v"] == "x"


def test_write_after_start_on_same_key_conflicts(cluster: Cluster) -> None:
    t1, t2 = cluster.rows.start_transaction(), cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 3, "v": "t1"}], transaction_id=t1)
    cluster.rows.insert_rows("//tmp/t", [{"k": 3, "v": "t2"}], transaction_id=t2)
    cluster.rows.commit_transaction(t1)
    with pytest.raises(LockConflict) as err:
        cluster.rows.commit_transaction(t2)
    assert err.value.code == ErrorCode.TRANSACTION_LOCK_CONFLICT
    assert "//tmp/t" in err.value.message
    assert lookup(cluster, 3)["v"] == "t1"


def test_transactions_started_after_a_commit_do_not_conflict(cluster: Cluster) -> None:
    cluster.rows.insert_rows("//tmp/t", [{"k": 4, "v": "first"}])
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 4, "v": "second"}], transaction_id=tx)
    cluster.rows.commit_transaction(tx)
    assert lookup(cluster, 4)["v"] == "second"


def test_different_lock_groups_do_not_conflict(cluster: Cluster) -> None:
    cluster.rows.insert_rows("//tmp/t", [{"k": 5, "v": "base", "a": 0, "b": 0}])
    t1, t2 = cluster.rows.start_transaction(), cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 5, "a": 1}], update=True, transaction_id=t1)
    cluster.rows.insert_rows("//tmp/t", [{"k": 5, "b": 2}], update=True, transaction_id=t2)
    cluster.rows.commit_transaction(t1)
    cluster.rows.commit_transaction(t2)
    assert lookup(cluster, 5) == {"k": 5, "v": "base", "a": 1, "b": 2}


def test_same_lock_group_conflicts(cluster: Cluster) -> None:
    t1, t2 = cluster.rows.start_transaction(), cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 6, "a": 1}], update=True, transaction_id=t1)
    cluster.rows.insert_rows("//tmp/t", [{"k": 6, "a": 2}], update=True, transaction_id=t2)
    cluster.rows.commit_transaction(t1)
    with pytest.raises(LockConflict):
        cluster.rows.commit_transaction(t2)


def test_primary_lock_conflicts_with_every_group(cluster: Cluster) -> None:
    t1, t2 = cluster.rows.start_transaction(), cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 7, "a": 1}], update=True, transaction_id=t1)
    cluster.rows.delete_rows("//tmp/t", [{"k": 7}], transaction_id=t2)
    cluster.rows.commit_transaction(t1)
    with pytest.raises(LockConflict):
        cluster.rows.commit_transaction(t2)


def test_shared_strong_lock_blocks_later_committing_writer(cluster: Cluster) -> None:
    cluster.rows.insert_rows("//tmp/t", [{"k": 8, "v": "x"}])
    writer = cluster.rows.start_transaction()
    reader = cluster.rows.start_transaction()
    cluster.rows.lock_rows("//tmp/t", [{"k": 8}], transaction_id=reader, lock_type="shared_strong")
    cluster.rows.commit_transaction(reader)
    cluster.rows.insert_rows("//tmp/t", [{"k": 8, "v": "y"}], transaction_id=writer)
    with pytest.raises(LockConflict) as err:
        cluster.rows.commit_transaction(writer)
    assert "lock taken after" in err.value.message


def test_shared_weak_lock_leaves_no_timestamp(cluster: Cluster) -> None:
    cluster.rows.insert_rows("//tmp/t", [{"k": 9, "v": "x"}])
    writer = cluster.rows.start_transaction()
    reader = cluster.rows.start_transaction()
    cluster.rows.lock_rows("//tmp/t", [{"k": 9}], transaction_id=reader, lock_type="shared_weak")
    cluster.rows.commit_transaction(reader)
    cluster.rows.insert_rows("//tmp/t", [{"k": 9, "v": "y"}], transaction_id=writer)
    cluster.rows.commit_transaction(writer)
    assert lookup(cluster, 9)["v"] == "y"


def test_read_lock_fails_when_key_was_modified_after_start(cluster: Cluster) -> None:
    reader = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 10, "v": "changed"}])
    cluster.rows.lock_rows("//tmp/t", [{"k": 10}], transaction_id=reader, lock_type="shared_strong")
    with pytest.raises(LockConflict):
        cluster.rows.commit_transaction(reader)


def test_lock_on_one_group_allows_writes_to_another(cluster: Cluster) -> None:
    writer = cluster.rows.start_transaction()
    reader = cluster.rows.start_transaction()
    cluster.rows.lock_rows("//tmp/t", [{"k": 11}], transaction_id=reader, locks=["group_a"], lock_type="shared_strong")
    cluster.rows.commit_transaction(reader)
    cluster.rows.insert_rows("//tmp/t", [{"k": 11, "b": 5}], update=True, transaction_id=writer)
    cluster.rows.commit_transaction(writer)
    assert lookup(cluster, 11)["b"] == 5


def test_lock_rows_rejects_unknown_lock_group(cluster: Cluster) -> None:
    tx = cluster.rows.start_transaction()
    with pytest.raises(YtError, match="Lock 'nope' is not defined"):
        cluster.rows.lock_rows("//tmp/t", [{"k": 1}], transaction_id=tx, locks=["nope"])


def test_multi_tablet_commit_is_two_phase_and_atomic(cluster: Cluster) -> None:
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "low"}, {"k": 150, "v": "high"}], transaction_id=tx)
    cluster.rows.commit_transaction(tx)
    assert cluster.transactions  # the manager recorded the two-phase kind
    assert lookup(cluster, 1)["v"] == "low" and lookup(cluster, 150)["v"] == "high"
    with cluster.storage.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(prepared_table)).scalar() == 0
        assert conn.execute(sa.select(sa.func.count()).select_from(commits_table)).scalar() == 0


def test_conflict_in_one_participant_aborts_all(cluster: Cluster) -> None:
    blocker = cluster.rows.start_transaction()
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 160, "v": "blocker"}], transaction_id=blocker)
    cluster.rows.insert_rows("//tmp/t", [{"k": 2, "v": "tx"}, {"k": 160, "v": "tx"}], transaction_id=tx)
    cluster.rows.commit_transaction(blocker)
    with pytest.raises(LockConflict):
        cluster.rows.commit_transaction(tx)
    assert lookup(cluster, 2) is None
    with cluster.storage.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(prepared_table)).scalar() == 0
    later = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 2, "v": "later"}, {"k": 160, "v": "later"}], transaction_id=later)
    cluster.rows.commit_transaction(later)
    assert lookup(cluster, 160)["v"] == "later"


@pytest.fixture
def configured_cluster(tmp_path: Path) -> Iterator[Callable[[EngineConfig], Cluster]]:
    """A cluster with //tmp/t mounted, built with the given engine config."""
    opened: list[Cluster] = []

    def make(config: EngineConfig) -> Cluster:
        c = open_cluster("local", tmp_path / "configured", config)
        opened.append(c)
        c.nodes.create("table", "//tmp/t", {"dynamic": True, "schema": SCHEMA, "pivot_keys": [[], [100]]})
        c.tablets.mount_table("//tmp/t")
        return c

    yield make
    for c in opened:
        c.close()


def test_row_limit_per_transaction(configured_cluster: Callable[[EngineConfig], Cluster]) -> None:
    cluster = configured_cluster(EngineConfig(max_rows_per_transaction=10))
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": i} for i in range(10)], transaction_id=tx)
    with pytest.raises(YtError) as err:
        cluster.rows.insert_rows("//tmp/t", [{"k": 10}], transaction_id=tx)
    assert err.value.code == ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION


def test_default_row_limit_is_100000() -> None:
    assert DEFAULT_CONFIG.max_rows_per_transaction == 100_000
    assert DEFAULT_CONFIG.max_transaction_lifetime == 60.0


def test_transaction_lifetime_limit(configured_cluster: Callable[[EngineConfig], Cluster]) -> None:
    cluster = configured_cluster(EngineConfig(max_transaction_lifetime=0.2))
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "late"}], transaction_id=tx)
    time.sleep(0.3)
    with pytest.raises(YtError, match="maximum lifetime"):
        cluster.rows.commit_transaction(tx)
    assert lookup(cluster, 1) is None


def test_non_atomic_transaction_requires_matching_table_atomicity(cluster: Cluster) -> None:
    tx = cluster.rows.start_transaction(atomicity="none")
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "x"}], transaction_id=tx)
    with pytest.raises(YtError) as err:
        cluster.rows.commit_transaction(tx)
    assert err.value.code == ErrorCode.INVALID_TRANSACTION_ATOMICITY
    assert lookup(cluster, 1) is None


@pytest.fixture
def non_atomic(cluster: Cluster) -> Cluster:
    cluster.nodes.create("table", "//tmp/na", {"dynamic": True, "atomicity": "none", "min_data_ttl": 0,
                                         "schema": SCHEMA[:2]})
    cluster.tablets.mount_table("//tmp/na")
    return cluster


def test_non_atomic_writes_take_no_locks_last_write_wins(non_atomic: Cluster) -> None:
    t1 = non_atomic.rows.start_transaction(atomicity="none")
    t2 = non_atomic.rows.start_transaction(atomicity="none")
    non_atomic.rows.insert_rows("//tmp/na", [{"k": 1, "v": "one"}], transaction_id=t1)
    non_atomic.rows.insert_rows("//tmp/na", [{"k": 1, "v": "two"}], transaction_id=t2)
    non_atomic.rows.commit_transaction(t1)
    non_atomic.rows.commit_transaction(t2)
    assert non_atomic.rows.lookup_rows("//tmp/na", [{"k": 1}]) == [{"k": 1, "v": "two"}]


def test_non_atomic_write_without_transaction_needs_atomicity_none(non_atomic: Cluster) -> None:
    with pytest.raises(YtError):
        non_atomic.rows.insert_rows("//tmp/na", [{"k": 2, "v": "x"}])
    non_atomic.rows.insert_rows("//tmp/na", [{"k": 2, "v": "x"}], atomicity="none", durability="async")
    assert non_atomic.rows.lookup_rows("//tmp/na", [{"k": 2}]) == [{"k": 2, "v": "x"}]


def test_client_timestamp_off_limits_is_rejected(non_atomic: Cluster) -> None:
    stale = int(time.time() - 120) << COUNTER_BITS
    tx = non_atomic.rows.start_transaction(atomicity="none", start_timestamp=stale)
    non_atomic.rows.insert_rows("//tmp/na", [{"k": 3, "v": "x"}], transaction_id=tx)
    with pytest.raises(YtError, match="Transaction timestamp is off limits, check the local clock readings"):
        non_atomic.rows.commit_transaction(tx)


def test_durability_async_requires_non_atomic(cluster: Cluster) -> None:
    with pytest.raises(YtError, match="durability=async"):
        cluster.rows.start_transaction(durability="async")


def test_compaction_keeps_versions_visible_to_open_transactions(cluster: Cluster) -> None:
    cluster.nodes.set("//tmp/t/@min_data_ttl", 0)
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "v1"}])
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "v2"}])
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "v3"}])
    cluster.snapshots.compact()
    assert lookup(cluster, 1, transaction_id=tx)["v"] == "v1"
    cluster.rows.abort_transaction(tx)
    removed = cluster.snapshots.compact()
    assert removed >= 2
    assert lookup(cluster, 1)["v"] == "v3"


def test_timestamps_stay_monotonic_across_restart(tmp_path: Path) -> None:
    c = open_cluster("local", tmp_path / "d")
    last = max(c.rows.generate_timestamp() for _ in range(100))
    c.close()
    c = open_cluster("local", tmp_path / "d")
    try:
        assert c.rows.generate_timestamp() > last
    finally:
        c.close()


def test_a_batch_writing_a_key_twice_keeps_its_last_write_and_a_later_batch_merges_with_it(cluster: Cluster) -> None:
    """A transaction's writes are merged per key (last write wins, an update merges its columns),
    whether the key repeats within one insert_rows call, across calls, or across tablets."""
    tx = cluster.rows.start_transaction()
    cluster.rows.insert_rows("//tmp/t", [{"k": 1, "v": "first", "a": 1}, {"k": 2, "v": "two"},
                                         {"k": 1, "v": "second"}], transaction_id=tx)
    cluster.rows.insert_rows("//tmp/t", [{"k": 2, "b": 5}], update=True, transaction_id=tx)
    cluster.rows.insert_rows("//tmp/t", [{"k": 3, "v": "three"}, {"k": 150, "v": "other tablet"}], transaction_id=tx)
    cluster.rows.commit_transaction(tx)
    assert lookup(cluster, 1) == {"k": 1, "v": "second", "a": None, "b": None}
    assert lookup(cluster, 2) == {"k": 2, "v": "two", "a": None, "b": 5}
    assert lookup(cluster, 3)["v"] == "three" and lookup(cluster, 150)["v"] == "other tablet"


def test_one_key_lookups_see_each_commit_and_hold_no_snapshot_open(tmp_path: Path) -> None:
    """A lookup of one key at the latest timestamp runs its one point query on SQLite without a
    BEGIN (Storage.read, ``one_statement``): it must still see every commit made before it and leave
    no read transaction behind, which would hold back the WAL's checkpoint (the file would grow)."""
    import sqlite3

    from reptables.engine.storage.datadir import DATABASE

    c = Cluster.open("local", tmp_path / "data", DEFAULT_CONFIG)  # SQLite: the path it concerns
    try:
        c.nodes.create("table", "//tmp/t", {"dynamic": True, "schema": SCHEMA})
        c.tablets.mount_table("//tmp/t")
        for value in ("a", "b", "c"):
            c.rows.insert_rows("//tmp/t", [{"k": 1, "v": value}])
            found = lookup(c, 1)
            assert found is not None and found["v"] == value
        assert lookup(c, 2) is None
        with sqlite3.connect(tmp_path / "data" / DATABASE) as raw:
            busy, _, _ = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "a reader held a snapshot open after the lookups"
    finally:
        c.close()


def test_writes_by_key_take_each_keys_last_write_for_single_and_compound_keys(tmp_path: Path) -> None:
    """DynamicTable.keyed, which a commit, a prepare and a replica's apply use to find each key's
    write: the key tuple of every row, in key-column order, and the last write of a key written
    twice - for a key of one column and of two."""
    from reptables.engine.tablets import RowWrite, WriteKind

    c = open_cluster("local", tmp_path / "data")
    try:
        c.nodes.create("table", "//tmp/one", {"dynamic": True, "schema": SCHEMA})
        c.nodes.create("table", "//tmp/two", {"dynamic": True, "schema": [
            {"name": "b", "type": "string", "sort_order": "ascending"},
            {"name": "a", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]})
        one, _, _ = c.tables.table("//tmp/one")
        two, _, _ = c.tables.table("//tmp/two")
        first, again, other = (RowWrite(WriteKind.WRITE, row, 1) for row in (
            {"k": 1, "v": "x"}, {"v": "y", "k": 1}, {"k": 2, "v": "z"}))
        assert one.keyed([first, again, other]) == {(1,): again, (2,): other}
        rows = [{"a": 1, "b": "p", "v": "x"}, {"v": "y", "a": 2, "b": "p"}, {"b": "p", "a": 1, "v": "z"}]
        writes = [RowWrite(WriteKind.WRITE, row, 1) for row in rows]
        assert two.keyed(writes) == {("p", 1): writes[2], ("p", 2): writes[1]}
        assert list(two.keyed(writes)) == [("p", 1), ("p", 2)]
    finally:
        c.close()
