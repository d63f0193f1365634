"""Multi-version storage of sorted tables: reads at a timestamp, conflict checks, compaction.

The latest image of a row lives in the table itself and older versions (and tombstones) beside it
(engine/storage.py). These tests pin down what a user relies on through that layout: a read at any
timestamp sees exactly the versions committed at or before it, across overwrites, deletes and
re-inserts; conflict checks give the same answers whether the engine still remembers the commits
or has to read them back from SQL (after a restart, say); compaction never changes what a read at
or after its horizon sees; and a data directory of the old layout is refused, not misread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from reptables.engine.config import EngineConfig
from reptables.engine.errors import LockConflict, YtError
from reptables.engine.node import Cluster
from reptables.engine.storage import meta_table
from reptables.engine.tablets import DynamicTable, RowWrite, WriteKind, decode_writes, encode_writes
from reptables.testing import backends
from reptables.testing.backends import open_cluster

SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "v", "type": "string"},
    {"name": "a", "type": "int64", "lock": "group_a"},
    {"name": "b", "type": "int64", "lock": "group_b"},
]
PATH = "//tmp/t"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = open_cluster("local", tmp_path / "data")
    c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA})
    c.tablets.mount_table(PATH)
    try:
        yield c
    finally:
        c.close()


def table_of(c: Cluster) -> DynamicTable:
    table, _, _ = c.tables.table(PATH)
    return table


def version_rows(c: Cluster) -> int:
    versions = table_of(c).sql.versions
    assert versions is not None
    with c.storage.read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(versions)).scalar_one())


def history(c: Cluster) -> list[tuple[int, dict | None]]:
    """(commit timestamp, row) of key 1 over an overwrite, a delete, a re-insert and an update."""
    steps: list[tuple[int, dict | None]] = []
    c.rows.insert_rows(PATH, [{"k": 1, "v": "one", "a": 1}])
    steps.append((c.rows.generate_timestamp(), {"k": 1, "v": "one", "a": 1, "b": None}))
    c.rows.insert_rows(PATH, [{"k": 1, "v": "two", "b": 2}])
    steps.append((c.rows.generate_timestamp(), {"k": 1, "v": "two", "a": None, "b": 2}))
    c.rows.delete_rows(PATH, [{"k": 1}])
    steps.append((c.rows.generate_timestamp(), None))
    c.rows.insert_rows(PATH, [{"k": 1, "v": "three"}])
    steps.append((c.rows.generate_timestamp(), {"k": 1, "v": "three", "a": None, "b": None}))
    c.rows.insert_rows(PATH, [{"k": 1, "a": 4}], update=True)
    steps.append((c.rows.generate_timestamp(), {"k": 1, "v": "three", "a": 4, "b": None}))
    return steps


def test_reads_at_every_timestamp_see_the_version_committed_then(cluster: Cluster) -> None:
    before = cluster.rows.generate_timestamp()
    steps = history(cluster)
    assert cluster.rows.lookup_rows(PATH, [{"k": 1}], timestamp=before) == []
    assert cluster.rows.select_rows(f"* from [{PATH}]", timestamp=before) == []
    for ts, expected in steps:
        assert cluster.rows.lookup_rows(PATH, [{"k": 1}], timestamp=ts, keep_missing_rows=True) == [expected]
        assert cluster.rows.select_rows(f"* from [{PATH}]", timestamp=ts) == ([expected] if expected else [])
    assert cluster.rows.lookup_rows(PATH, [{"k": 1}]) == [steps[-1][1]]


def test_selects_at_a_timestamp_mix_old_and_current_rows(cluster: Cluster) -> None:
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"old{k}"} for k in range(10)])
    middle = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"new{k}"} for k in range(0, 10, 2)])
    cluster.rows.delete_rows(PATH, [{"k": 9}])
    cluster.rows.insert_rows(PATH, [{"k": 10, "v": "added"}])
    then = cluster.rows.select_rows(f"k, v from [{PATH}] order by k limit 100", timestamp=middle)
    assert then == [{"k": k, "v": f"old{k}"} for k in range(10)]
    counted = cluster.rows.select_rows(f"count(*) as n from [{PATH}] group by 1 as one", timestamp=middle)
    assert counted == [{"n": 10}]
    now = cluster.rows.select_rows(f"k, v from [{PATH}] order by k limit 100")
    assert now == [{"k": k, "v": f"new{k}" if k % 2 == 0 else f"old{k}"} for k in range(9)] + [
        {"k": 10, "v": "added"}]


def test_writes_of_new_keys_keep_no_older_versions(cluster: Cluster) -> None:
    cluster.rows.insert_rows(PATH, [{"k": k, "v": "x"} for k in range(1000)])
    assert version_rows(cluster) == 0
    cluster.rows.insert_rows(PATH, [{"k": k, "v": "y"} for k in range(10)])
    cluster.rows.delete_rows(PATH, [{"k": 500}])
    # ten replaced images, plus the deleted image and its tombstone
    assert version_rows(cluster) == 12


def test_big_batches_that_append_overlap_or_reinsert_keep_every_version(cluster: Cluster) -> None:
    """Batches of many keys: above every row (an append: no image is replaced), over existing rows
    (their images become versions), and over deleted keys below the largest row (no image to
    replace, the tombstones stay). Each read at a timestamp sees what was committed then."""
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"a{k}"} for k in range(100)])  # an empty table
    first = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"b{k}"} for k in range(100, 300)])  # past every row
    assert version_rows(cluster) == 0
    second = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"c{k}"} for k in range(250, 400)])  # 50 of them had a row
    assert version_rows(cluster) == 50
    third = cluster.rows.generate_timestamp()
    cluster.rows.delete_rows(PATH, [{"k": k} for k in range(350, 400)])
    cluster.rows.insert_rows(PATH, [{"k": k, "v": f"d{k}"} for k in range(360, 460)])  # 40 deleted, 60 new
    assert version_rows(cluster) == 50 + 2 * 50

    def values(timestamp: int | None = None) -> dict[int, str]:
        rows = cluster.rows.select_rows(f"k, v from [{PATH}]", timestamp=timestamp)
        return {r["k"]: r["v"] for r in rows}

    assert values(first) == {k: f"a{k}" for k in range(100)}
    assert values(second) == {**values(first), **{k: f"b{k}" for k in range(100, 300)}}
    assert values(third) == {**values(second), **{k: f"c{k}" for k in range(250, 400)}}
    assert values() == {**{k: v for k, v in values(third).items() if k < 350}, **{k: f"d{k}" for k in range(360, 460)}}


def test_conflict_checks_agree_with_and_without_remembered_commits(cluster: Cluster) -> None:
    table = table_of(cluster)
    start = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(PATH, [{"k": 1, "a": 1}], update=True)  # group_a only
    cluster.rows.insert_rows(PATH, [{"k": 2, "v": "x"}])  # every group
    cluster.rows.delete_rows(PATH, [{"k": 3}])
    schema = table.schema
    probes = {
        (1,): RowWrite(WriteKind.WRITE, {"k": 1, "b": 5}, schema.lock_mask(["b"]), update=True),
        (2,): RowWrite(WriteKind.WRITE, {"k": 2, "b": 5}, schema.lock_mask(["b"]), update=True),
        (3,): RowWrite(WriteKind.WRITE, {"k": 3, "a": 5}, schema.lock_mask(["a"]), update=True),
        (4,): RowWrite(WriteKind.WRITE, {"k": 4, "v": "new"}, schema.full_lock_mask),
    }

    def conflicts() -> list[tuple[int, ...]]:
        found = []
        with cluster.storage.read() as conn:
            for key, write in probes.items():
                hit = table.find_conflicts(conn, {key: write}, start)
                if hit is not None:
                    found.append(hit[0])
        return found

    remembered = conflicts()
    # key 1 was written in group_a only: a group_b write does not conflict (seed 003 lock groups)
    assert remembered == [(2,), (3,)]
    table.recent.clear()
    table.recent_keys, table.recent_floor = 0, 1 << 64
    assert conflicts() == remembered


def test_a_transaction_older_than_a_restart_still_sees_its_conflicts(tmp_path: Path) -> None:
    c = open_cluster("local", tmp_path / "data")
    c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA})
    c.tablets.mount_table(PATH)
    start = c.rows.generate_timestamp()
    c.rows.insert_rows(PATH, [{"k": 7, "v": "committed after start"}])
    c.close()
    c = open_cluster("local", tmp_path / "data")
    try:
        c.tablets.mount_table(PATH)
        # a sync-replica prepare of a transaction that started before the restart, on its meta-cluster
        table = table_of(c)
        write = RowWrite(WriteKind.WRITE, {"k": 7, "v": "stale"}, table.schema.full_lock_mask)
        with pytest.raises(LockConflict):
            c.transactions.prepare_participant("1-2-3-4", "meta", table, PATH, [write], start,
                                               c.rows.generate_timestamp(), {})
        assert c.rows.lookup_rows(PATH, [{"k": 7}]) == [{"k": 7, "v": "committed after start", "a": None, "b": None}]
    finally:
        c.close()


def test_versions_superseded_just_before_a_restart_are_compacted_without_another_write(tmp_path: Path) -> None:
    """A version superseded within the table's min_data_ttl before the engine stopped is dropped
    once the ttl passes after the restart, though the table is never written again (the pass
    right after the start visits every table once, when that version is still too young)."""
    c = open_cluster("local", tmp_path / "data")
    try:
        c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA})
        c.tablets.mount_table(PATH)
        c.nodes.set(f"{PATH}/@min_data_ttl", 1000)
        c.rows.insert_rows(PATH, [{"k": 1, "v": "old"}])
        c.rows.insert_rows(PATH, [{"k": 1, "v": "new"}])
    finally:
        c.close()
    c = open_cluster("local", tmp_path / "data")
    try:
        c.tablets.mount_table(PATH)
        assert version_rows(c) == 1
        assert c.snapshots.compact() == 0  # the first pass: younger than min_data_ttl
        # passes until the horizon (the clock less the ttl) reaches the start, which a restart may
        # put up to a second ahead of the wall clock (timestamps.RESERVATION_SECONDS)
        dropped, deadline = 0, time.monotonic() + 8
        while not dropped and time.monotonic() < deadline:
            time.sleep(0.5)
            c.rows.generate_timestamp()  # (the clock a horizon is taken from moves on)
            dropped = c.snapshots.compact()
        assert dropped == 1
        assert version_rows(c) == 0
        assert c.rows.lookup_rows(PATH, [{"k": 1}])[0]["v"] == "new"
        assert c.snapshots.compact() == 0  # and idle since: nothing more
    finally:
        c.close()


def test_remembered_commits_stay_within_their_budget(tmp_path: Path) -> None:
    cluster = open_cluster("local", tmp_path / "data", EngineConfig(recent_commit_keys=50))
    try:
        cluster.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA})
        cluster.tablets.mount_table(PATH)
        table = table_of(cluster)
        pinned = cluster.rows.start_transaction()  # an open transaction pins every later commit...
        for n in range(20):
            cluster.rows.insert_rows(PATH, [{"k": n * 10 + i, "v": "x"} for i in range(10)])
        assert table.recent_keys <= 50  # ...but never past the budget
        assert table.recent_floor > 0
        # a conflict the forgotten commits held is still found, from SQL
        cluster.rows.insert_rows(PATH, [{"k": 0, "v": "conflicting"}], transaction_id=pinned)
        with pytest.raises(LockConflict):
            cluster.rows.commit_transaction(pinned)
    finally:
        cluster.close()


def test_compaction_keeps_what_reads_after_its_horizon_see(cluster: Cluster) -> None:
    cluster.nodes.set(f"{PATH}/@min_data_ttl", 0)
    steps = history(cluster)
    cluster.rows.insert_rows(PATH, [{"k": 2, "v": "a"}])
    cluster.rows.delete_rows(PATH, [{"k": 2}])
    horizon = cluster.rows.generate_timestamp()
    assert version_rows(cluster) > 0
    assert cluster.snapshots.compact() > 0
    # nothing is left but what a read at or after the horizon can see: key 1 lives in the table
    # itself, key 2 is deleted
    assert version_rows(cluster) == 0
    assert cluster.rows.lookup_rows(PATH, [{"k": 1}, {"k": 2}], timestamp=horizon, keep_missing_rows=True) == [
        steps[-1][1], None]
    assert cluster.rows.select_rows(f"k from [{PATH}]", timestamp=horizon) == [{"k": 1}]


def test_versions_are_compacted_once_their_ttl_passes_with_no_commit_since(cluster: Cluster) -> None:
    """A pass skips a table with nothing applied since a pass that left nothing to drop; a version
    superseded after that pass's horizon is still dropped once the horizon passes it, though no
    commit comes after (an idle table's last overwrites are not kept for good)."""
    cluster.nodes.set(f"{PATH}/@min_data_ttl", 1000)
    cluster.rows.insert_rows(PATH, [{"k": 1, "v": "old"}])
    cluster.rows.insert_rows(PATH, [{"k": 1, "v": "new"}])
    assert version_rows(cluster) == 1
    assert cluster.snapshots.compact() == 0  # younger than min_data_ttl
    assert cluster.snapshots.compact() == 0
    time.sleep(2.1)  # (timestamps count whole seconds)
    cluster.rows.generate_timestamp()  # (the clock a horizon is taken from moves on)
    assert cluster.snapshots.compact() == 1
    assert version_rows(cluster) == 0
    assert cluster.rows.lookup_rows(PATH, [{"k": 1}])[0]["v"] == "new"
    # idle since: later passes find nothing (and skip the table)
    assert cluster.snapshots.compact() == 0
    # a commit makes it due again
    cluster.rows.insert_rows(PATH, [{"k": 1, "v": "newer"}])
    time.sleep(2.1)
    cluster.rows.generate_timestamp()
    assert cluster.snapshots.compact() == 1


def test_a_pass_visits_a_table_only_once_its_horizon_reaches_a_commit_not_yet_covered(cluster: Cluster) -> None:
    """A table written within its min_data_ttl has nothing to drop until the pass's horizon reaches
    the commit that superseded a version: passes before that skip it (no write transaction per
    table and pass, which at 1,000 tables written in the last half hour cost seconds a pass), and
    the pass after that still drops the version. Commits applied out of timestamp order (a replica
    catching up) are noted in order."""
    cluster.nodes.set(f"{PATH}/@min_data_ttl", 1000)
    table, _, _ = cluster.tables.table(PATH)
    cluster.snapshots.compact()  # (the pass after the start visits every table once)
    before = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(PATH, [{"k": 5, "v": "old"}])
    cluster.rows.insert_rows(PATH, [{"k": 5, "v": "new"}])
    after = cluster.rows.generate_timestamp()
    assert table.compaction_needed(after)
    assert cluster.snapshots.compact() == 0  # (the versions are younger than the ttl)
    assert not table.compaction_needed(before)  # a horizon before the commits: nothing can be droppable
    assert table.compaction_needed(after)
    time.sleep(2.1)
    cluster.rows.generate_timestamp()
    assert cluster.snapshots.compact() == 1
    assert not table.compaction_needed(cluster.rows.generate_timestamp())
    marks = [3 << 36, 1 << 36, (3 << 36) + 5, (2 << 36) + 7, (2 << 36) + 2]
    table.compaction_marks = []
    for ts in marks:
        table.mark_for_compaction(ts)
    assert table.compaction_marks == [1 << 36, (2 << 36) + 2, 3 << 36]


def test_tables_of_one_shape_share_compiled_sql_yet_each_writes_its_own_rows(cluster: Cluster) -> None:
    """Tables with the same columns take the statements compiled for the first (SQLite: the SQL of
    one differs from the other's by its name only), each with its own table names: writes, updates,
    deletes and reads at a timestamp of one never touch the other."""
    other = "//tmp/other"
    cluster.nodes.create("table", other, {"dynamic": True, "schema": SCHEMA})
    cluster.tablets.mount_table(other)
    for path, tag in ((PATH, "a"), (other, "b")):
        cluster.rows.insert_rows(path, [{"k": i, "v": f"{tag}{i}"} for i in range(100)])
    before = cluster.rows.generate_timestamp()
    for path, tag in ((PATH, "a"), (other, "b")):
        cluster.rows.insert_rows(path, [{"k": i, "v": f"{tag}{i}-new"} for i in range(0, 100, 2)])
        cluster.rows.delete_rows(path, [{"k": i} for i in range(1, 100, 4)])
    for path, tag in ((PATH, "a"), (other, "b")):
        rows = cluster.rows.select_rows(f"k, v from [{path}] order by k limit 1000")
        expected = [{"k": i, "v": f"{tag}{i}-new" if i % 2 == 0 else f"{tag}{i}"} for i in range(100) if i % 4 != 1]
        assert rows == expected
        assert len(cluster.rows.select_rows(f"k from [{path}]", timestamp=before)) == 100
    mine, theirs = table_of(cluster).sql, cluster.tables.table(other)[0].sql
    assert mine.shape == theirs.shape and mine.sql_name != theirs.sql_name
    with cluster.storage.read() as conn:
        if conn.dialect.name == "sqlite":
            sql = theirs.bulk("upsert:data", conn).sql
            assert theirs.sql_name in sql and mine.sql_name not in sql.replace(theirs.sql_name, "")


def test_a_read_before_the_compaction_horizon_is_refused_not_answered_wrong(tmp_path: Path) -> None:
    """After compaction a read at an older timestamp could see a row a later version replaced (or
    miss a deleted one): it is refused with YT's TabletSnapshotExpired (1708), also after a restart."""
    c = open_cluster("local", tmp_path / "data")
    try:
        c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA, "min_data_ttl": 0})
        c.tablets.mount_table(PATH)
        c.rows.insert_rows(PATH, [{"k": 1, "v": "old"}])
        old = c.rows.generate_timestamp()
        c.rows.insert_rows(PATH, [{"k": 1, "v": "new"}])
        assert c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=old)[0]["v"] == "old"  # before compaction: exact
        assert c.snapshots.compact() > 0
        for read in (lambda: c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=old),
                     lambda: c.rows.select_rows(f"v from [{PATH}]", timestamp=old)):
            with pytest.raises(YtError) as refused:
                read()
            error = refused.value
            assert error.code == 1708 and PATH in error.message and "min_data_ttl" in error.message
        assert c.rows.lookup_rows(PATH, [{"k": 1}])[0]["v"] == "new"
        assert c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=c.rows.generate_timestamp())[0]["v"] == "new"
    finally:
        c.close()
    c = open_cluster("local", tmp_path / "data")
    try:
        with pytest.raises(YtError) as again:
            c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=old)
        assert again.value.code == 1708
    finally:
        c.close()


def test_a_snapshot_lease_holds_compaction_until_it_expires(tmp_path: Path) -> None:
    """A long read at T (a bootstrap copy) leases the snapshot: compaction keeps what a read at T
    needs while the lease lives, and resumes once it expires unrenewed."""
    c = open_cluster("local", tmp_path / "data")
    try:
        c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA, "min_data_ttl": 0})
        c.tablets.mount_table(PATH)
        c.rows.insert_rows(PATH, [{"k": 1, "v": "old"}])
        old = c.rows.generate_timestamp()
        lease = c.snapshots.lease_snapshot({"path": PATH, "timestamp": old, "seconds": 1.5}, None)
        c.rows.insert_rows(PATH, [{"k": 1, "v": "new"}])
        c.snapshots.compact()
        assert c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=old)[0]["v"] == "old"  # held
        renewed = c.snapshots.lease_snapshot(
            {"path": PATH, "timestamp": old, "seconds": 1.5, "lease_id": lease["lease_id"]}, None)
        assert renewed["lease_id"] == lease["lease_id"]
        time.sleep(1.7)  # not renewed again: it expires
        assert c.snapshots.compact() > 0
        with pytest.raises(YtError) as expired:
            c.rows.lookup_rows(PATH, [{"k": 1}], timestamp=old)
        assert expired.value.code == 1708
        # and a snapshot already compacted away cannot be leased back
        with pytest.raises(YtError) as too_late:
            c.snapshots.lease_snapshot({"path": PATH, "timestamp": old, "seconds": 60}, None)
        assert too_late.value.code == 1708
    finally:
        c.close()


def test_snapshot_leases_belong_to_their_holder_and_are_capped(tmp_path: Path) -> None:
    """A peer renews and releases only its own leases, and holds a bounded number of them."""
    from reptables.engine.tablets import SnapshotLeases

    leases = SnapshotLeases(max_per_holder=3)
    held = [leases.grant("t1", 100 + i, 60.0, holder="b") for i in range(3)]
    with pytest.raises(YtError, match="holds 3 snapshot leases already"):
        leases.grant("t1", 200, 60.0, holder="b")
    leases.grant("t1", 50, 60.0, holder="c")  # another holder has its own allowance
    assert leases.pinned("t1") == 50
    with pytest.raises(YtError, match="only its holder renews it") as renew:
        leases.grant("t1", 10, 60.0, lease_id=held[0].lease_id, holder="c")
    assert renew.value.code == 901
    with pytest.raises(YtError, match="only its holder releases it"):
        leases.release(held[0].lease_id, holder="c")
    leases.release(held[0].lease_id, holder="b")
    leases.grant("t1", 200, 60.0, holder="b")  # a released lease frees its place
    # renewed and expiring leases do not pile up: 10,000 renewals of short leases leave only the live ones
    short = leases.grant("t2", 1, 0.001, holder="d")
    for _ in range(10_000):
        short = leases.grant("t2", 1, 0.001, lease_id=short.lease_id, holder="d")
    time.sleep(0.01)
    assert leases.pinned("t2") is None and len(leases) == 4


def test_a_data_directory_of_the_old_layout_is_refused(tmp_path: Path) -> None:
    if backends.current() != backends.SQLITE:
        pytest.skip("format 1 was SQLite's only: no PostgreSQL database holds it")
    c = open_cluster("local", tmp_path / "data")
    c.nodes.create("table", PATH, {"dynamic": True, "schema": SCHEMA})
    with c.storage.write() as conn:
        conn.execute(meta_table.delete().where(meta_table.c.name == "storage_format"))
    c.close()
    # an engine of format 1 wrote neither the storage_format row nor the data directory's marker
    (tmp_path / "data" / "engine.marker").unlink()
    with pytest.raises(YtError, match="storage format 1"):
        open_cluster("local", tmp_path / "data")


def test_a_rolled_back_commit_leaves_no_trace_in_memory(cluster: Cluster) -> None:
    """Row counts, the replication queue's in-memory tail and the remembered commits change with a
    commit's SQL transaction, and go back with it when it rolls back."""
    cluster.nodes.create("replicated_table", "//tmp/rt", {"dynamic": True, "schema": SCHEMA})
    cluster.tablets.mount_table("//tmp/rt")
    queue, _, _ = cluster.tables.table("//tmp/rt")
    table = table_of(cluster)
    cluster.rows.insert_rows("//tmp/rt", [{"k": 1, "v": "kept"}], require_sync_replica=False)
    remembered = len(table.recent)
    writes = [RowWrite(WriteKind.WRITE, {"k": k, "v": "lost"}, table.schema.full_lock_mask) for k in (2, 3)]
    with pytest.raises(RuntimeError), cluster.storage.write() as conn:
        ts = cluster.rows.generate_timestamp()
        queue.apply(conn, writes, ts, 0)
        table.apply(conn, writes, ts)
        assert queue.tablet_rows[0][0] == 3
        raise RuntimeError("the commit fails after the append")
    assert queue.tablet_rows[0][0] == 1
    assert len(table.recent) == remembered
    with cluster.storage.read() as conn:
        assert [(run.start, run.rows) for run in queue.read_queue(conn, 0, 0, 10)] == [(0, 1)]
    cluster.rows.insert_rows("//tmp/rt", [{"k": 4, "v": "next"}], require_sync_replica=False)
    with cluster.storage.read() as conn:
        runs = queue.read_queue(conn, 0, 0, 10)
    assert [(run.start, orjson.loads(run.text)["row"]["k"]) for run in runs] == [(0, 1), (1, 4)]
    assert cluster.rows.lookup_rows(PATH, [{"k": 2}]) == []


def test_a_rolled_back_append_to_an_ordered_table_leaves_no_gap_in_row_index(cluster: Cluster) -> None:
    cluster.nodes.create("table", "//tmp/log", {"dynamic": True, "schema": [{"name": "msg", "type": "string"}]})
    cluster.tablets.mount_table("//tmp/log")
    log, _, _ = cluster.tables.table("//tmp/log")
    cluster.rows.insert_rows("//tmp/log", [{"msg": "first"}])
    with pytest.raises(RuntimeError), cluster.storage.write() as conn:
        log.apply(conn, [RowWrite(WriteKind.WRITE, {"msg": "lost"}, 1)], cluster.rows.generate_timestamp(), 0)
        raise RuntimeError("a two-phase commit fails after this participant was applied")
    cluster.rows.insert_rows("//tmp/log", [{"msg": "second"}])
    rows = cluster.rows.select_rows("[$row_index], msg from [//tmp/log]")
    assert [(r["$row_index"], r["msg"]) for r in rows] == [(0, "first"), (1, "second")]


def test_writes_travel_in_columns_and_come_back_the_same() -> None:
    writes = [RowWrite(WriteKind.WRITE, {"k": 1, "v": "x"}, 7),
              RowWrite(WriteKind.WRITE, {"k": 2, "a": 1}, 2, update=True),
              RowWrite(WriteKind.DELETE, {"k": 3}, 1),
              RowWrite(WriteKind.LOCK, {"k": 4}, 4, shared=True, strong=True)]
    encoded = encode_writes(writes)
    assert decode_writes(orjson.loads(orjson.dumps(encoded))) == writes
    uniform = encode_writes(writes[:1] * 3)
    assert uniform["kind"] == "write" and uniform["update"] is False  # one value, not a list per row
    # the older form, one map per write (prepared records written before the columns)
    assert decode_writes({"writes": [w.to_payload() for w in writes]}) == writes
    with pytest.raises(YtError, match="unknown kind"):
        decode_writes({"rows": [{"k": 1}], "kind": "upsert"})


def test_a_key_of_several_columns_is_searched_in_its_index_not_scanned(cluster: Cluster) -> None:
    """Writes to a table whose key has several columns find the rows they replace by searching the
    primary key, never by scanning the table: on SQLite a row-value ``IN`` list scans the whole
    table, and every commit cost in proportion to the table's size (100 rows into 110,000: 30 ms of
    CPU, five times more than into 10,000). Also what such writes leave: inserts, updates past a
    statement's worth of keys, deletes, reads at a timestamp before them."""
    path = "//tmp/composite"
    schema = [{"name": "a", "type": "int64", "sort_order": "ascending"},
              {"name": "b", "type": "string", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
    cluster.nodes.create("table", path, {"dynamic": True, "schema": schema})
    cluster.tablets.mount_table(path)
    cluster.rows.insert_rows(path, [{"a": i % 3, "b": f"k{i}", "v": "first"} for i in range(700)])
    before = cluster.rows.generate_timestamp()
    cluster.rows.insert_rows(path, [{"a": i % 3, "b": f"k{i}", "v": "second"} for i in range(0, 700, 2)])
    cluster.rows.delete_rows(path, [{"a": i % 3, "b": f"k{i}"} for i in range(1, 700, 7)])
    rows = cluster.rows.select_rows(f"a, b, v from [{path}] limit 1000")
    expected = {(i % 3, f"k{i}"): "second" if i % 2 == 0 else "first" for i in range(700) if i % 7 != 1}
    assert {(r["a"], r["b"]): r["v"] for r in rows} == expected
    assert len(cluster.rows.select_rows(f"a from [{path}] limit 1000", timestamp=before)) == 700
    assert cluster.rows.lookup_rows(path, [{"a": 0, "b": "k0"}, {"a": 1, "b": "k1"}], keep_missing_rows=True) == [
        {"a": 0, "b": "k0", "v": "second"}, None]
    table, _, _ = cluster.tables.table(path)
    with cluster.storage.read() as conn:
        if conn.dialect.name != "sqlite":
            return  # (PostgreSQL takes the keys as arrays, one statement for all)
        statements = table.__dict__.get("_key_statements") or {}
        assert statements, "the writes ran their key-list statements"
        raw = conn.connection.driver_connection
        assert raw is not None
        for (name, size, _), (sql, order, _) in statements.items():
            plan = " | ".join(row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, [None] * len(order or [])))
            assert "SCAN" not in plan, (name, size, plan)
            assert "SEARCH" in plan, (name, size, plan)
