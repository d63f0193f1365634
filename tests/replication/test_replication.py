"""Replicated tables across three real clusters: the behaviours of seed 002."""

from __future__ import annotations

import contextlib
import sqlite3
import time

import pytest
import sqlalchemy as sa

from reptables.engine.errors import ErrorCode, YtError
from reptables.testing import wait_for
from tests.replication.conftest import SCHEMA, ClusterSet


def test_async_replicas_receive_every_row_exactly_once(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    r0 = clusters.replica(path, "remote_0", "//tmp/r")
    r1 = clusters.replica(path, "remote_1", "//tmp/r")
    for batch in range(5):
        clusters.meta.insert_rows(path, [{"k": batch * 100 + i, "v": f"b{batch}"} for i in range(100)],
                                  require_sync_replica=False)
    clusters.meta.delete_rows(path, [{"k": 0}], require_sync_replica=False)
    for cluster in ("remote_0", "remote_1"):
        wait_for(lambda c=cluster: len(clusters.rows(c, "//tmp/r")) == 499, what=f"rows on {cluster}")
        assert sorted(r["k"] for r in clusters.rows(cluster, "//tmp/r")) == list(range(1, 500))
    for replica_id in (r0, r1):
        tablets = clusters.meta.get(f"#{replica_id}/@tablets")
        assert tablets[0]["current_replication_row_index"] == tablets[0]["flushed_row_count"] == 501


def test_sync_replica_has_rows_when_insert_returns(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "now"}])
    assert clusters.rows("remote_0", "//tmp/r") == [{"k": 1, "v": "now"}]


def test_replica_rows_carry_meta_commit_timestamps(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "old"}])
    ts = clusters.meta.generate_timestamp()
    clusters.meta.insert_rows(path, [{"k": 1, "v": "new"}])
    replica = clusters.client("remote_0")
    assert replica.lookup_rows("//tmp/r", [{"k": 1}], timestamp=ts) == [{"k": 1, "v": "old"}]
    assert replica.lookup_rows("//tmp/r", [{"k": 1}]) == [{"k": 1, "v": "new"}]


def test_write_without_sync_replica_is_refused_by_default(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    clusters.replica(path, "remote_0", "//tmp/r")
    with pytest.raises(YtError) as err:
        clusters.meta.insert_rows(path, [{"k": 1, "v": "x"}])
    assert err.value.code == ErrorCode.NO_SYNC_REPLICAS
    assert err.value.message == "Table //tmp/rt has no synchronous replicas"
    clusters.meta.insert_rows(path, [{"k": 1, "v": "x"}], require_sync_replica=False)


def test_reads_of_replicated_table_go_to_in_sync_replica(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    with pytest.raises(YtError, match="No in-sync replicas found for table //tmp/rt"):
        clusters.meta.select_rows(f"* from [{path}]")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    clusters.meta.insert_rows(path, [{"k": i, "v": str(i)} for i in range(3)])
    assert clusters.meta.select_rows(f"k from [{path}] where k > 0") == [{"k": 1}, {"k": 2}]
    assert clusters.meta.lookup_rows(path, [{"k": 2}]) == [{"k": 2, "v": "2"}]


def test_replica_table_refuses_direct_writes(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    with pytest.raises(YtError) as err:
        clusters.client("remote_0").insert_rows("//tmp/r", [{"k": 1, "v": "sneaky"}])
    assert err.value.code == ErrorCode.UPSTREAM_REPLICA_MISMATCH
    assert replica_id in err.value.message


def test_replica_lifecycle_states(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r", enable=False)
    assert clusters.meta.get(f"#{replica_id}/@state") == "disabled"
    clusters.alter(replica_id, enabled=True)
    assert clusters.meta.get(f"#{replica_id}/@state") == "enabled"
    clusters.alter(replica_id, enabled=False)
    assert clusters.meta.get(f"#{replica_id}/@state") == "disabled"
    clusters.meta.insert_rows(path, [{"k": 1, "v": "queued"}], require_sync_replica=False)
    assert clusters.rows("remote_0", "//tmp/r") == []
    clusters.alter(replica_id, enabled=True)
    wait_for(lambda: clusters.rows("remote_0", "//tmp/r") == [{"k": 1, "v": "queued"}])


def test_async_to_sync_switch_catches_up_then_writes_synchronously(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    clusters.meta.insert_rows(path, [{"k": i, "v": "a"} for i in range(2000)], require_sync_replica=False)
    clusters.alter(replica_id, mode="sync")
    clusters.wait_in_sync(replica_id)
    clusters.meta.insert_rows(path, [{"k": 5000, "v": "sync"}])
    rows = clusters.rows("remote_0", "//tmp/r")
    assert len(rows) == 2001 and {"k": 5000, "v": "sync"} in rows


def test_sync_to_async_is_immediate(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(replica_id)
    clusters.alter(replica_id, mode="async")
    assert clusters.meta.get(f"#{replica_id}/@mode") == "async"
    with pytest.raises(YtError, match="no synchronous replicas"):
        clusters.meta.insert_rows(path, [{"k": 1, "v": "x"}])


def test_unknown_cluster_is_rejected(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    with pytest.raises(YtError, match="Replica cluster nowhere is not known"):
        clusters.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": path, "cluster_name": "nowhere", "replica_path": "//tmp/r"}})


def test_directory_never_returns_tokens(clusters: ClusterSet) -> None:
    directory = clusters.meta.get("//sys/clusters")
    assert set(directory) == {"primary", "remote_0", "remote_1"}
    assert all(entry["token"] == "<hidden>" for entry in directory.values())
    assert clusters.meta.get("//sys/clusters/remote_0/token") == "<hidden>"
    # writing back what get returned keeps the real tokens working
    clusters.meta.set("//sys/clusters", directory)
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(replica_id)


@pytest.mark.parametrize("replica_schema, fragment", [
    ([{"name": "k", "type": "int64", "sort_order": "ascending"}], "narrower"),
    ([{"name": "k", "type": "string", "sort_order": "ascending"}, {"name": "v", "type": "string"}], "type"),
    ([{"name": "k2", "type": "int64", "sort_order": "ascending"}, {"name": "k", "type": "int64"},
      {"name": "v", "type": "string"}], "key columns"),
    ([{"name": "k", "type": "int64"}, {"name": "v", "type": "string"}], "ordered"),
])
def test_incompatible_replica_cannot_be_enabled(clusters: ClusterSet, replica_schema: list, fragment: str) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r", schema=replica_schema, enable=False)
    with pytest.raises(YtError, match=fragment):
        clusters.alter(replica_id, enabled=True)
    assert clusters.meta.get(f"#{replica_id}/@state") == "disabled"


def test_get_in_sync_replicas_tracks_async_progress(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    lagging = clusters.replica(path, "remote_1", "//tmp/r", enable=False)
    clusters.wait_in_sync(sync)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "x"}])
    ts = clusters.meta.generate_timestamp()
    assert clusters.in_sync(path, ts) == [sync]
    clusters.alter(lagging, enabled=True)
    wait_for(lambda: sorted(clusters.in_sync(path, ts)) == sorted([sync, lagging]))
    # idle tablets do not hold a caught-up replica out of sync later on
    assert lagging in clusters.in_sync(path)


def test_ordered_replicated_table(clusters: ClusterSet) -> None:
    schema = [{"name": "msg", "type": "string"}]
    path = clusters.replicated_table("//tmp/log", schema=schema)
    clusters.replica(path, "remote_0", "//tmp/log", schema=schema)
    for i in range(3):
        clusters.meta.insert_rows(path, [{"msg": f"m{i}"}], require_sync_replica=False)
    wait_for(lambda: [r["msg"] for r in clusters.client("remote_0").select_rows(
        "msg from [//tmp/log]")] == ["m0", "m1", "m2"])


def test_queue_is_trimmed_after_every_replica_has_rows(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt", attributes={"min_replication_log_ttl": 0})
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    clusters.meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(10)], require_sync_replica=False)
    wait_for(lambda: clusters.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] == 10, what="trim")
    assert clusters.meta.get(f"#{replica_id}/@tablets")[0]["current_replication_row_index"] == 10


def test_a_queue_too_young_to_trim_is_trimmed_at_once_when_its_ttl_is_lowered(clusters: ClusterSet) -> None:
    """A queue whose rows every replica has but which are younger than min_replication_log_ttl is
    passed over until they are old enough; lowering the ttl (to free the space now) takes effect at
    the next pass, not when the old ttl would have run out."""
    path = clusters.replicated_table("//tmp/rt", attributes={"min_replication_log_ttl": 3_600_000})
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    clusters.meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(10)], require_sync_replica=False)
    wait_for(lambda: clusters.meta.get(f"#{replica_id}/@tablets")[0]["current_replication_row_index"] == 10,
             what="replicated")
    time.sleep(2.5)  # (two passes of the maintenance: the queue is kept, an hour is not over)
    assert clusters.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] == 0
    clusters.meta.set(f"{path}/@min_replication_log_ttl", 0)
    wait_for(lambda: clusters.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] == 10, timeout=10,
             what="trim after the ttl was lowered")


def test_freeze_gives_the_seed_queue_check(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    clusters.meta.insert_rows(path, [{"k": i, "v": "x"} for i in range(50)], require_sync_replica=False)
    clusters.meta.freeze_table(path)
    assert clusters.meta.get(f"{path}/@tablet_state") == "frozen"
    flushed = clusters.meta.get(f"{path}/@tablets")[0]["flushed_row_count"]
    wait_for(lambda: clusters.meta.get(f"#{replica_id}/@tablets")[0]["current_replication_row_index"] == flushed)


def test_collocation_attributes(clusters: ClusterSet) -> None:
    a = clusters.replicated_table("//tmp/a")
    b = clusters.replicated_table("//tmp/b")
    c = clusters.replicated_table("//tmp/c")
    collocation = clusters.meta.call("create", {"type": "table_collocation", "attributes": {
        "collocation_type": "replication", "table_paths": [a, b]}})["node_id"]
    ids = [clusters.meta.get(f"{p}/@id") for p in (a, b)]
    assert clusters.meta.get(f"#{collocation}/@table_ids") == ids
    assert clusters.meta.get(f"#{collocation}/@table_paths") == [a, b]
    assert clusters.meta.get(f"{a}/@replication_collocation_id") == collocation
    clusters.meta.set(f"{c}/@replication_collocation_id", collocation)
    assert clusters.meta.get(f"{a}/@replication_collocation_table_paths") == [a, b, c]
    clusters.meta.remove(f"{c}/@replication_collocation_id")
    assert clusters.meta.get(f"#{collocation}/@table_paths") == [a, b]


def test_throttler_and_options_are_validated(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    clusters.meta.set(f"{path}/@replication_throttler", {"period": 1000, "limit": 1000000})
    clusters.meta.set(f"{path}/@replicated_table_options/preferred_sync_replica_clusters", ["remote_0"])
    assert clusters.meta.get(f"{path}/@replicated_table_options/preferred_sync_replica_clusters") == ["remote_0"]
    with pytest.raises(YtError, match="min_sync_replica_count"):
        clusters.meta.set(f"{path}/@replicated_table_options",
                          {"min_sync_replica_count": 3, "max_sync_replica_count": 1})


def test_the_throttler_limit_is_an_average_over_its_period_with_no_burst(clusters: ClusterSet) -> None:
    """Seed 002: ``limit`` bytes per ``period`` on average; a backlog is not sent in one burst."""
    path = clusters.replicated_table("//tmp/rt_throttled")
    clusters.meta.set(f"{path}/@replication_throttler", {"period": 1000, "limit": 2000})
    replica_id = clusters.replica(path, "remote_0", "//tmp/r_throttled", enable=False)
    rows = [{"k": i, "v": "x" * 190} for i in range(50)]  # ~10 KB of queue payload
    clusters.meta.insert_rows(path, rows, require_sync_replica=False)
    started = time.monotonic()
    clusters.alter(replica_id, enabled=True)
    # the rows delivered in each of three periods: each carries about one period's budget (2000 bytes,
    # ~9 of these ~210-byte rows), never the backlog, and every period carries some
    delivered = []
    for period in range(1, 4):
        time.sleep(max(0.0, started + period - time.monotonic()))
        delivered.append(len(clusters.rows("remote_0", "//tmp/r_throttled")))
    per_period = [b - a for a, b in zip([0, *delivered], delivered, strict=False)]
    assert all(n <= 20 for n in per_period), f"rows per period {per_period}: a burst beyond the limit"
    assert sum(per_period) > 0, "nothing delivered in three periods"
    wait_for(lambda: len(clusters.rows("remote_0", "//tmp/r_throttled")) == 50, 30, "every row")
    # 10 KB at 2000 B/s: about five seconds, never all at once
    assert time.monotonic() - started >= 3.0


def test_a_read_only_cluster_refuses_client_writes_and_still_receives_replication(clusters: ClusterSet) -> None:
    """TableCluster ``readOnly`` (the operator sets ``//sys/@read_only``): no client writes, replication goes on."""
    path = clusters.replicated_table("//tmp/rt_read_only")
    clusters.replica(path, "remote_0", "//tmp/r_read_only")
    remote = clusters.client("remote_0")
    remote.create("table", "//tmp/plain_read_only", attributes={"dynamic": True, "schema": SCHEMA})
    remote.mount_table("//tmp/plain_read_only")
    wait_for(lambda: remote.get("//tmp/plain_read_only/@tablet_state") == "mounted", 10, "mounted")
    remote.set("//sys/@read_only", True)
    try:
        with pytest.raises(YtError, match=r"Cluster remote_0 is read-only \(//sys/@read_only\): the write to "
                                          r"//tmp/plain_read_only is refused") as refused:
            remote.insert_rows("//tmp/plain_read_only", [{"k": 1, "v": "x"}])
        assert refused.value.code == ErrorCode.READ_ONLY
        with pytest.raises(YtError, match="is read-only"):
            remote.delete_rows("//tmp/plain_read_only", [{"k": 1}])
        # the meta-cluster's changes still arrive: a read-only cluster can host replicas
        clusters.meta.insert_rows(path, [{"k": 7, "v": "replicated"}], require_sync_replica=False)
        wait_for(lambda: clusters.rows("remote_0", "//tmp/r_read_only") == [{"k": 7, "v": "replicated"}], 30,
                 "the replicated row")
        assert remote.select_rows("* from [//tmp/plain_read_only]") == []
    finally:
        remote.set("//sys/@read_only", False)
    remote.insert_rows("//tmp/plain_read_only", [{"k": 1, "v": "x"}])


def test_a_replica_with_atomicity_none_is_asynchronous_and_needs_a_non_atomic_table(clusters: ClusterSet) -> None:
    """Seed 002: a replica's atomicity "makes sense only for asynchronous replicas"; its replication writes are
    non-atomic, so its table must be too (seed 003: the modes of a table and its writes must match)."""
    path = clusters.replicated_table("//tmp/rt_non_atomic")

    def create(mode: str) -> str:
        return str(clusters.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": path, "cluster_name": "remote_0", "replica_path": "//tmp/r_non_atomic", "mode": mode,
            "atomicity": "none"}})["node_id"])

    with pytest.raises(YtError, match="atomicity=none can only be asynchronous"):
        create("sync")
    replica_id = create("async")
    remote = clusters.client("remote_0")
    remote.create("table", "//tmp/r_non_atomic", attributes={"dynamic": True, "schema": SCHEMA,
                                                             "upstream_replica_id": replica_id})
    remote.mount_table("//tmp/r_non_atomic")
    with pytest.raises(YtError, match="has atomicity=full but the replica has atomicity=none; they must match"):
        clusters.alter(replica_id, enabled=True)
    remote.unmount_table("//tmp/r_non_atomic")
    wait_for(lambda: remote.get("//tmp/r_non_atomic/@tablet_state") == "unmounted", 10, "unmounted")
    remote.remove("//tmp/r_non_atomic")
    remote.create("table", "//tmp/r_non_atomic", attributes={"dynamic": True, "schema": SCHEMA, "atomicity": "none",
                                                             "upstream_replica_id": replica_id})
    remote.mount_table("//tmp/r_non_atomic")
    clusters.alter(replica_id, enabled=True)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "non-atomic"}], require_sync_replica=False)
    wait_for(lambda: clusters.rows("remote_0", "//tmp/r_non_atomic") == [{"k": 1, "v": "non-atomic"}], 30, "the row")
    with pytest.raises(YtError, match="atomicity=none and can only be asynchronous"):
        clusters.alter(replica_id, mode="sync")
    assert clusters.meta.get(f"#{replica_id}/@mode") == "async"


def test_replicas_attribute_shape(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    replica_id = clusters.replica(path, "remote_0", "//tmp/r")
    info = clusters.meta.get(f"{path}/@replicas")[replica_id]
    assert info == {"cluster_name": "remote_0", "replica_path": "//tmp/r", "state": "enabled", "mode": "async",
                    "replication_lag_time": 0, "errors": [], "preserve_timestamps": True, "atomicity": "full",
                    "replicated_table_tracker_enabled": True}
    tablet = clusters.meta.get(f"#{replica_id}/@tablets")[0]
    assert set(tablet) == {"tablet_id", "state", "current_replication_row_index", "current_replication_timestamp",
                           "replication_lag_time", "flushed_row_count", "trimmed_row_count"}
    clusters.meta.remove(f"#{replica_id}")
    assert clusters.meta.get(f"{path}/@replicas") == {}


def test_preserve_timestamps_false_writes_with_replica_timestamps(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt")
    clusters.replica(path, "remote_0", "//tmp/sink", preserve_timestamps=False)
    clusters.meta.insert_rows(path, [{"k": 1, "v": "x"}], require_sync_replica=False)
    wait_for(lambda: clusters.rows("remote_0", "//tmp/sink") == [{"k": 1, "v": "x"}])
    clusters.client("remote_0").insert_rows("//tmp/sink", [{"k": 2, "v": "manual"}])
    assert len(clusters.rows("remote_0", "//tmp/sink")) == 2



def test_sync_replica_of_a_multi_tablet_table_gets_every_tablet(clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/rt", attributes={"pivot_keys": [[], [1000]]})
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    asynchronous = clusters.replica(path, "remote_1", "//tmp/r")
    clusters.wait_in_sync(sync)
    rows = [{"k": k, "v": "x"} for k in (*range(10), *range(1000, 1010))]
    clusters.meta.insert_rows(path, rows)
    assert sorted(r["k"] for r in clusters.rows("remote_0", "//tmp/r")) == [r["k"] for r in rows]
    wait_for(lambda: len(clusters.rows("remote_1", "//tmp/r")) == 20, what="async copy")
    for replica_id in (sync, asynchronous):
        tablets = clusters.meta.get(f"#{replica_id}/@tablets")
        wait_for(lambda r=replica_id: all(t["current_replication_row_index"] == t["flushed_row_count"] == 10
                                          for t in clusters.meta.get(f"#{r}/@tablets")), what="progress")
        assert len(tablets) == 2
    # the sync replica's progress is exact, so switching it to async replicates nothing twice
    clusters.alter(sync, mode="async")
    clusters.meta.insert_rows(path, [{"k": 5000, "v": "later"}], require_sync_replica=False)
    wait_for(lambda: len(clusters.rows("remote_0", "//tmp/r")) == 21, what="async after sync")


def test_every_acknowledged_sync_write_is_visible_on_the_replica_at_once(clusters: ClusterSet) -> None:
    """The meta acknowledges a commit once its decision is durable and tells the replica after;
    a read of the replica must still see it (seed 002: a sync replica read without a timestamp
    sees every committed transaction), as must a read of the replicated table."""
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    replica = clusters.client("remote_0")
    for k in range(40):
        clusters.meta.insert_rows(path, [{"k": k, "v": f"v{k}"}])
        assert replica.lookup_rows("//tmp/r", [{"k": k}]) == [{"k": k, "v": f"v{k}"}]
        assert replica.select_rows("sum(1) as n from [//tmp/r] group by 1") == [{"n": k + 1}]
        assert clusters.meta.lookup_rows(path, [{"k": k}]) == [{"k": k, "v": f"v{k}"}]


def _decisions(clusters: ClusterSet, name: str) -> int:
    """Commit decisions the engine ``name`` still keeps (read from its database beside it)."""
    args = clusters.engines[name].extra_args
    if "--storage" in args:  # its database on the run's PostgreSQL server
        url = args[args.index("--storage") + 1].replace("postgresql://", "postgresql+psycopg://", 1)
        db = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with db.connect() as conn:
                return int(conn.execute(sa.text("SELECT count(*) FROM _rt_commits")).scalar_one())
        finally:
            db.dispose()
    with contextlib.closing(sqlite3.connect(f"file:{clusters.engines[name].data_dir / 'engine.sqlite'}?mode=ro",
                                            uri=True)) as lite:
        return int(lite.execute("SELECT count(*) FROM _rt_commits").fetchone()[0])


def test_sync_commits_sent_without_an_fsync_are_made_durable_before_the_meta_forgets_them(
        clusters: ClusterSet) -> None:
    """A sync replica writes the meta's commit message without an fsync (transactions/participant.py):
    the meta keeps each decision until the replica says the commit is durable there, and sends a
    commit no later answer covered again, durably. After a burst of writes nothing is left: the last
    commits too, which no later prepare covered, are forgotten once made durable; after the replica
    engine is killed and restarted, the decisions it acknowledged as its previous run are resent and
    every row is there once."""
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    for k in range(30):
        clusters.meta.insert_rows(path, [{"k": k, "v": f"v{k}"}])
    if clusters.engines["remote_0"].extra_args.count("--storage") == 0:
        # (SQLite) the last commit is relaxed and covered by nothing later: it is kept a moment after
        assert _decisions(clusters, "primary") >= 1
    wait_for(lambda: _decisions(clusters, "primary") == 0, timeout=20, what="every decision forgotten")
    for k in range(30, 60):
        clusters.meta.insert_rows(path, [{"k": k, "v": f"v{k}"}])
    clusters.restart("remote_0")  # SIGKILL: the relaxed commits of its first run are not known durable
    wait_for(lambda: _decisions(clusters, "primary") == 0, timeout=30, what="the decisions resent and forgotten")
    assert clusters.rows("remote_0", "//tmp/r") == [{"k": k, "v": f"v{k}"} for k in range(60)]
    clusters.meta.insert_rows(path, [{"k": 60, "v": "after"}])
    assert len(clusters.rows("remote_0", "//tmp/r")) == 61


def test_back_to_back_sync_writes_of_one_key_do_not_conflict(clusters: ClusterSet) -> None:
    """The next write of a key may reach the replica before the decision on the previous one: its
    prepare waits for that decision instead of failing with a lock conflict."""
    path = clusters.replicated_table("//tmp/rt")
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync")
    clusters.wait_in_sync(sync)
    for n in range(40):
        clusters.meta.insert_rows(path, [{"k": 7, "v": f"version {n}"}])
    assert clusters.rows("remote_0", "//tmp/r") == [{"k": 7, "v": "version 39"}]


def test_infinities_reach_every_replica_and_nan_is_refused(clusters: ClusterSet) -> None:
    schema = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "d", "type": "double"}]
    path = clusters.replicated_table("//tmp/rt", schema=schema)
    sync = clusters.replica(path, "remote_0", "//tmp/r", mode="sync", schema=schema)
    clusters.replica(path, "remote_1", "//tmp/r", schema=schema)
    clusters.wait_in_sync(sync)
    values = [float("inf"), float("-inf"), 1.5, None]
    clusters.meta.insert_rows(path, [{"k": i, "d": v} for i, v in enumerate(values)])
    # SQL has no NaN: refused with the column named, nothing applied (docs/engine.md)
    with pytest.raises(YtError, match="NaN is not allowed in column 'd' of table //tmp/rt") as err:
        clusters.meta.insert_rows(path, [{"k": 8, "d": 2.0}, {"k": 9, "d": float("nan")}])
    assert err.value.code == ErrorCode.SCHEMA_VIOLATION
    for cluster in ("remote_0", "remote_1"):
        rows = wait_for(lambda c=cluster: (r := clusters.rows(c, "//tmp/r")) and len(r) == 4 and r,
                        what=f"rows on {cluster}")
        assert [r["d"] for r in sorted(rows, key=lambda r: r["k"])] == values


def test_a_transaction_that_wrote_before_a_reshard_cannot_commit_after_it(clusters: ClusterSet) -> None:
    """A transaction's rows are placed in tablets by the pivot keys of the moment they were written.
    If the table is unmounted, resharded and mounted again before the commit, those tablets are not
    the table's any more: the commit is refused (retriable: a new transaction places the rows anew),
    and nothing of it reaches the queue or a replica. Found by the fault suite (``reshard``): a write
    sent while the meta-cluster was paused in the middle of a reshard merging three tablets into one
    was appended to the queue of tablet 1, which the new layout no longer had; the replica got it only
    when a later reshard brought tablet 1 back, long after its change stream had passed the commit."""
    path = clusters.replicated_table("//tmp/rt", attributes={"pivot_keys": [[], [3], [8]]})
    replica_id = clusters.replica(path, "remote_0", "//tmp/r", mode="async")
    meta = clusters.meta
    tx = meta.start_transaction(type="tablet")
    meta.insert_rows(path, [{"k": 5, "v": "before the reshard"}], transaction_id=tx, require_sync_replica=False)
    meta.unmount_table(path)
    wait_for(lambda: meta.reshard_table(path, pivot_keys=[[]]) is None, 30, "the reshard")
    meta.mount_table(path)
    with pytest.raises(YtError) as refused:
        meta.commit_transaction(tx)
    assert refused.value.code == ErrorCode.NO_SUCH_TABLET, refused.value
    assert path in refused.value.message and "resharded" in refused.value.message
    # nothing of it anywhere: no tablet's queue got a row, tablet 1 of the old layout included (the
    # old layout back shows it: a resharded table's queue goes on from a returning tablet's last row)
    assert [t["flushed_row_count"] for t in meta.get(f"{path}/@tablets")] == [0]
    meta.unmount_table(path)
    meta.reshard_table(path, pivot_keys=[[], [3], [8]])
    meta.mount_table(path)
    assert [t["flushed_row_count"] for t in meta.get(f"{path}/@tablets")] == [0, 0, 0]
    assert [t["current_replication_row_index"] for t in meta.get(f"#{replica_id}/@tablets")] == [0, 0, 0]
    # the same write in a new transaction goes to the new tablet and reaches the replica
    meta.insert_rows(path, [{"k": 5, "v": "after the reshard"}], require_sync_replica=False)
    wait_for(lambda: clusters.rows("remote_0", "//tmp/r") == [{"k": 5, "v": "after the reshard"}], 20,
             "the replica")


def test_a_second_replica_of_a_table_to_the_same_place_is_refused_and_another_table_may_use_it(
        clusters: ClusterSet) -> None:
    """Two replicas of one table writing one replica table would apply every change twice: the second
    is refused (ALREADY_EXISTS, naming the first); a replica of another table may name the same
    place (it is that table's business whether the replica table accepts it)."""
    first_table = clusters.replicated_table("//tmp/rt_twice")
    other_table = clusters.replicated_table("//tmp/rt_twice_other")

    def create(table_path: str, replica_path: str) -> str:
        return str(clusters.meta.call("create", {"type": "table_replica", "attributes": {
            "table_path": table_path, "cluster_name": "remote_0", "replica_path": replica_path,
            "mode": "async"}})["node_id"])

    first = create(first_table, "//tmp/r_twice")
    with pytest.raises(YtError, match=f"Replica {first} of //tmp/rt_twice already points to remote_0://tmp/r_twice") \
            as refused:
        create(first_table, "//tmp/r_twice")
    assert refused.value.code == ErrorCode.ALREADY_EXISTS
    create(first_table, "//tmp/r_twice_elsewhere")
    create(other_table, "//tmp/r_twice")
    assert len(clusters.meta.get(f"{first_table}/@replicas")) == 2
