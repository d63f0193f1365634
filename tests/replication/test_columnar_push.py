"""The columnar form of a replicator push: whole-row writes sent as one list per column.

A meta-cluster sends a batch of whole-row writes that are still in its queue's in-memory tail as
columns (``replicator.render_columns``), any other batch as ``entries``; the replica must end up
with exactly what the entries would have given it (the same rows, commit timestamps and errors),
and refuse a malformed columnar batch as it refuses malformed entries, applying nothing. In process,
on the engine's real storage, queue, replicator and sink (``test_units.py``'s fakes for the wire).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from reptables.engine.config import EngineConfig
from reptables.engine.errors import YtError
from reptables.engine.replication.sink import ReplicaSink, read_sink
from reptables.engine.storage import KIND, ROW_COUNT, ROW_INDEX, TS
from reptables.engine.tablets import DynamicTable, ImageRun, RowWrite, WriteKind, encode_writes, queue
from reptables.engine.transactions import Participant

from .test_units import SORTED, FakeHost, World, host, make_world, rows

__all__ = ["host", "make_world"]  # (the fixtures, for pytest)

WITH_DOUBLE = [*SORTED, {"name": "d", "type": "double"}]


def pushes(world: World) -> list[dict[str, Any]]:
    return [c[2] for c in world.network.calls if c[1] == "push" and "heartbeats" not in c[2]
            and (c[2].get("entries") or c[2].get("columnar"))]


def stored(host: FakeHost, table: DynamicTable, *names: str) -> list[tuple[Any, ...]]:
    """The replica's latest rows with their commit timestamps."""
    data = table.sql.data
    with host.storage.read() as conn:
        return [tuple(r) for r in conn.execute(
            sa.select(*(data.c[n] for n in names), data.c[TS]).order_by(data.c.k))]


def commit_writes(world: World, writes: list[RowWrite]) -> int:
    part = Participant(world.table, "//data", 0, writes)
    ts = world.meta.timestamps.generate()
    with world.meta.storage.write() as conn:
        world.table.apply(conn, part.writes, ts, 0)
        world.manager.after_queue_append(conn, part, ts, [])
    return ts


def test_whole_row_writes_go_as_columns_and_arrive_with_their_commits(make_world: Callable[..., World]) -> None:
    world = make_world()
    replica = world.add_replica("replica")
    stamps = [world.commit(rows(0, 3)), world.commit(rows(3, 2)), world.commit(rows(1, 1, "again"))]
    world.replicate_once(replica)
    [body] = pushes(world)
    assert "entries" not in body
    assert body["columnar"]["columns"] == ["k", "v"]
    assert body["columnar"]["commits"] == [[stamps[0], 3], [stamps[1], 2], [stamps[2], 1]]
    assert body["columnar"]["values"] == [[0, 1, 2, 3, 4, 1], ["v0", "v1", "v2", "v3", "v4", "again1"]]
    assert stored(world.remote, world.replica_tables[replica.id], "k", "v") == [
        (0, "v0", stamps[0]), (1, "again1", stamps[2]), (2, "v2", stamps[0]), (3, "v3", stamps[1]),
        (4, "v4", stamps[1])]
    assert world.stored_progress(replica) == 6


def test_a_batch_cut_inside_commits_carries_the_part_of_each(make_world: Callable[..., World]) -> None:
    world = make_world(batch_rows=4)
    replica = world.add_replica("replica")
    t1, t2 = world.commit(rows(0, 6)), world.commit(rows(6, 3))
    while world.replicate_once(replica):
        pass
    sent = [(b["prev_row_index"], b["row_index"], b["columnar"]["commits"], b["columnar"]["values"][0])
            for b in pushes(world)]
    assert sent == [(0, 4, [[t1, 4]], [0, 1, 2, 3]), (4, 8, [[t1, 2], [t2, 2]], [4, 5, 6, 7]),
                    (8, 9, [[t2, 1]], [8])]
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(9)]


def test_a_batch_with_a_delete_or_an_update_goes_as_entries(make_world: Callable[..., World]) -> None:
    world = make_world()
    replica = world.add_replica("replica")
    world.commit(rows(0, 3))
    commit_writes(world, [RowWrite(WriteKind.DELETE, {"k": 1}, 1)])
    commit_writes(world, [RowWrite(WriteKind.WRITE, {"k": 2, "v": "updated"}, 1, update=True)])
    world.replicate_once(replica)
    [body] = pushes(world)
    assert "columnar" not in body and len(body["entries"]) == 5
    assert world.remote.rows(world.replica_tables[replica.id]) == [(0, "v0"), (2, "updated")]


def test_whole_rows_read_back_from_sql_go_as_columns(make_world: Callable[..., World]) -> None:
    world = make_world(batch_rows=4)
    replica = world.add_replica("replica")
    t1, t2 = world.commit(rows(0, 6)), world.commit(rows(6, 3))
    world.table.queue_tail.clear()  # (as after a restart: the replicator reads the queue from SQL)
    while world.replicate_once(replica):
        pass
    sent = [(b["prev_row_index"], b["row_index"], b["columnar"]["commits"], b["columnar"]["values"])
            for b in pushes(world)]
    # (runs cut inside a commit carry the part of each, as from the tail)
    assert sent == [(0, 4, [[t1, 4]], [[0, 1, 2, 3], ["v0", "v1", "v2", "v3"]]),
                    (4, 8, [[t1, 2], [t2, 2]], [[4, 5, 6, 7], ["v4", "v5", "v6", "v7"]]),
                    (8, 9, [[t2, 1]], [[8], ["v8"]])]
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(9)]


def test_changes_read_back_from_sql_that_are_not_plain_whole_rows_go_as_entries(
        make_world: Callable[..., World]) -> None:
    world = make_world()
    replica = world.add_replica("replica")
    world.commit(rows(0, 3))
    commit_writes(world, [RowWrite(WriteKind.DELETE, {"k": 1}, 1)])
    commit_writes(world, [RowWrite(WriteKind.WRITE, {"k": 2, "v": "updated"}, 1, update=True)])
    world.table.queue_tail.clear()
    world.replicate_once(replica)
    [body] = pushes(world)
    assert "columnar" not in body and len(body["entries"]) == 5
    assert world.remote.rows(world.replica_tables[replica.id]) == [(0, "v0"), (2, "updated")]


def test_doubles_json_cannot_carry_read_back_from_sql_go_as_entries(make_world: Callable[..., World]) -> None:
    schema = [*SORTED, {"name": "d", "type": "double"}]
    world = make_world(schema)
    replica = world.add_replica("replica")
    world.commit([{"k": 0, "v": "a", "d": 1.5}, {"k": 1, "v": "b", "d": float("inf")}])
    world.commit([{"k": 2, "v": "c", "d": 2.5}])
    world.table.queue_tail.clear()
    world.replicate_once(replica)
    [body] = pushes(world)
    assert "columnar" not in body and len(body["entries"]) == 3
    assert stored(world.remote, world.replica_tables[replica.id], "k", "d") == [
        (0, 1.5, body["entries"][0]["timestamp"]), (1, float("inf"), body["entries"][0]["timestamp"]),
        (2, 2.5, body["entries"][2]["timestamp"])]


def test_a_column_null_in_every_row_is_left_out(make_world: Callable[..., World]) -> None:
    world = make_world(WITH_DOUBLE)
    replica = world.add_replica("replica")
    world.commit(rows(0, 2))
    world.commit([{"k": 5, "v": "x", "d": 0.5}])
    world.replicate_once(replica)
    first, = pushes(world)
    assert first["columnar"]["columns"] == ["k", "v", "d"]
    assert first["columnar"]["values"][2] == [None, None, 0.5]
    world.commit(rows(7, 1))
    world.replicate_once(replica)
    second = pushes(world)[1]
    assert second["columnar"]["columns"] == ["k", "v"]
    assert stored(world.remote, world.replica_tables[replica.id], "k", "v", "d")[-1][:3] == (7, "v7", None)


# -- the sink alone: the same changes as entries and as columns ----------------------------------------


def as_entries(replica_id: str, path: str, commits: list[tuple[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    entries = [{"timestamp": ts, "kind": "write", "payload": {"row": row, "update": False}}
               for ts, batch in commits for row in batch]
    return {"upstream_replica_id": replica_id, "replica_path": path, "tablet_index": 0, "prev_row_index": 0,
            "row_index": len(entries), "preserve_timestamps": True, "entries": entries}


def as_columns(replica_id: str, path: str, commits: list[tuple[int, list[dict[str, Any]]]],
               names: list[str]) -> dict[str, Any]:
    every = [row for _, batch in commits for row in batch]
    return {"upstream_replica_id": replica_id, "replica_path": path, "tablet_index": 0, "prev_row_index": 0,
            "row_index": len(every), "preserve_timestamps": True,
            "columnar": {"columns": names, "values": [[row.get(n) for row in every] for n in names],
                         "commits": [[ts, len(batch)] for ts, batch in commits]}}


def test_columns_that_need_converting_are_stored_as_the_entries_would_store_them(host: FakeHost) -> None:
    by_entries = host.make_table("by_entries", WITH_DOUBLE, upstream_replica_id="r-1")
    by_columns = host.make_table("by_columns", WITH_DOUBLE, upstream_replica_id="r-2")
    sink = ReplicaSink(host)
    t1, t2 = host.timestamps.generate(), host.timestamps.generate()
    # an int for a double column: the row check converts it (the column check cannot pass it)
    commits = [(t1, [{"k": 1, "v": "a", "d": 2}, {"k": 2, "v": None, "d": 0.25}]), (t2, [{"k": 1, "v": "b", "d": 3}])]
    assert sink.handle_push(as_entries("r-1", "//by_entries", commits), None)["applied"]
    assert sink.handle_push(as_columns("r-2", "//by_columns", commits, ["k", "v", "d"]), None)["applied"]
    expected = [(1, "b", 3.0, t2), (2, None, 0.25, t1)]
    assert stored(host, by_entries, "k", "v", "d") == expected
    assert stored(host, by_columns, "k", "v", "d") == expected
    assert all(type(row[2]) is float for row in stored(host, by_columns, "k", "v", "d"))


def test_columns_applied_as_images_leave_the_versions_and_conflict_memory_the_entries_leave(
        host: FakeHost) -> None:
    """A columnar push of values the column check passes is applied as images (``ImageRun``),
    without a write per row: the data, every older version (reads at a timestamp) and the commits
    remembered for conflict checks must be those the entries give, with a key written twice in
    one commit and in several, and a column left out (null)."""
    by_entries = host.make_table("img_entries", WITH_DOUBLE, upstream_replica_id="r-1")
    by_columns = host.make_table("img_columns", WITH_DOUBLE, upstream_replica_id="r-2")
    sink = ReplicaSink(host)
    t1, t2, t3 = (host.timestamps.generate() for _ in range(3))
    commits = [(t1, [{"k": 1, "v": "a", "d": 0.5}, {"k": 2, "v": "b", "d": 1.5}, {"k": 1, "v": "a2", "d": 2.5}]),
               (t2, [{"k": 2, "v": "c", "d": None}, {"k": 3, "v": "d", "d": 4.5}]),
               (t3, [{"k": 1, "v": "e", "d": 5.5}])]
    assert sink.handle_push(as_entries("r-1", "//img_entries", commits), None)["applied"]
    push = sink.parse_push(as_columns("r-2", "//img_columns", commits, ["k", "v", "d"]), None)
    assert [type(writes).__name__ for _, writes in push.groups] == ["ImageRun"] * 3
    assert sink.handle_push(as_columns("r-2", "//img_columns", commits, ["k", "v", "d"]), None)["applied"]
    # a column left out of the columns: null in every row
    t4 = host.timestamps.generate()
    later = [(t4, [{"k": 4, "v": "f"}])]
    for replica, path in (("r-1", "//img_entries"), ("r-2", "//img_columns")):
        body = as_entries(replica, path, later) if replica == "r-1" else as_columns(replica, path, later, ["k", "v"])
        body["prev_row_index"], body["row_index"] = 6, 7
        assert sink.handle_push(body, None)["applied"]

    def everything(table: DynamicTable) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        data, versions = table.sql.data, table.sql.versions
        assert versions is not None
        with host.storage.read() as conn:
            latest = [tuple(r) for r in conn.execute(sa.select(data).order_by(data.c.k))]
            older = [tuple(r) for r in conn.execute(sa.select(versions).order_by(versions.c.k, versions.c[TS]))]
        return latest, older

    assert everything(by_columns) == everything(by_entries)
    latest, older = everything(by_columns)
    assert [(r[0], r[1], r[2], r[3]) for r in latest] == [(1, "e", 5.5, t3), (2, "c", None, t2), (3, "d", 4.5, t2),
                                                         (4, "f", None, t4)]
    assert len(older) == 2  # k=1 at t1, k=2 at t1: the images t2 and t3 replaced
    for entries, columns in zip(by_entries.recent, by_columns.recent, strict=True):
        assert entries[:2] == columns[:2] and list(entries[2]) == list(columns[2])
        assert [(w.kind, w.mask) for w in entries[2].values()] == [(w.kind, w.mask) for w in columns[2].values()]


def test_images_made_before_an_alter_are_applied_by_column_name(host: FakeHost) -> None:
    """Images made for the table's columns of then (a prepare held while the table was altered):
    applied by name as writes, the new column null, never as tuples of the wrong shape."""
    table = host.make_table("img_altered", WITH_DOUBLE, upstream_replica_id="r-1")
    run = ImageRun([(1,), (2,)], [(1, "a"), (2, "b")], table.schema.full_lock_mask, ("k", "v"))
    with host.storage.write() as conn:
        assert table.apply(conn, run, host.timestamps.generate(), 0, run.keyed()) == 2
    assert [row[:3] for row in stored(host, table, "k", "v", "d")] == [(1, "a", None), (2, "b", None)]


def _commits(host: FakeHost) -> list[list[Any]]:
    return [[host.timestamps.generate(), 2]]


@pytest.mark.parametrize(("change", "words"), [
    (lambda c, h: [], "expected a map"),
    (lambda c, h: {**c, "columns": "k"}, "distinct column names"),
    (lambda c, h: {**c, "columns": ["k"]}, "distinct column names"),
    (lambda c, h: {**c, "columns": ["k", "k"]}, "distinct column names"),
    (lambda c, h: {**c, "columns": ["k", 7]}, "distinct column names"),
    (lambda c, h: {**c, "columns": ["k", "v", "w"]}, "distinct column names"),
    (lambda c, h: {**c, "commits": []}, "commits"),
    (lambda c, h: {**c, "commits": [[c["commits"][0][0], 0]]}, "positive count"),
    (lambda c, h: {**c, "commits": [[c["commits"][0][0]]]}, "[timestamp, count]"),
    (lambda c, h: {**c, "commits": [[c["commits"][0][0], 1], [c["commits"][0][0], 1]]}, "commit order"),
    (lambda c, h: {**c, "commits": [["1", 2]]}, "integer"),
    (lambda c, h: {**c, "commits": [[2**63 - 1, 2]]}, "timestamp"),
    (lambda c, h: {**c, "values": [[1, 2], ["a"]]}, "length of every column"),
    (lambda c, h: {**c, "values": [[1, 2, 3], ["a", "b", "c"]], "commits": [[c["commits"][0][0], 3]]},
     "more than the batch's 2 rows"),
], ids=["not-a-map", "names-not-a-list", "fewer-names-than-values", "duplicate-name", "name-not-a-string",
        "more-names-than-values", "no-commits", "empty-commit", "commit-not-a-pair", "commits-out-of-order",
        "timestamp-not-an-integer", "timestamp-near-2-63", "columns-of-other-lengths", "more-rows-than-the-batch"])
def test_a_malformed_columnar_push_is_refused_and_applies_nothing(
        host: FakeHost, change: Callable[[dict[str, Any], FakeHost], Any], words: str) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    body = as_columns("r-1", "//replica", [(host.timestamps.generate(), [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])],
                      ["k", "v"])
    good = dict(body)
    body["columnar"] = change(body["columnar"], host)
    with pytest.raises(YtError) as refused:
        sink.handle_push(body, None)
    assert words in refused.value.message, refused.value.message
    assert refused.value.http_status < 500
    with host.storage.read() as conn:
        assert read_sink(conn, "r-1", 0) is None
    assert host.rows(table) == []
    assert sink.handle_push(good, None) == {"row_index": 2, "applied": True}
    assert host.rows(table) == [(1, "a"), (2, "b")]


@pytest.mark.parametrize(("names", "values", "words"), [
    (["k", "v", "x"], [[1, 2], ["a", "b"], [None, 5]], "x"),
    (["k", "v"], [[1, None], ["a", "b"]], "k"),
    (["k", "v"], [[1, 2], ["a", 5]], "v"),
    (["v"], [["a", "b"]], "k"),
    (["k", "v"], [[1, 2**64], ["a", "b"]], "k"),
], ids=["unknown-column", "null-key", "int-in-a-string-column", "no-key-column", "key-out-of-range"])
def test_a_columnar_row_the_schema_refuses_is_named_as_in_entries(
        host: FakeHost, names: list[str], values: list[list[Any]], words: str) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    ts = host.timestamps.generate()
    body = as_columns("r-1", "//replica", [(ts, [{}, {}])], names)
    body["columnar"]["values"] = values
    with pytest.raises(YtError) as by_columns:
        sink.handle_push(body, None)
    every = [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]
    with pytest.raises(YtError) as by_entries:
        sink.handle_push(as_entries("r-1", "//replica", [(ts, every)]), None)
    assert by_columns.value.message == by_entries.value.message
    assert by_columns.value.code == by_entries.value.code
    assert words in by_columns.value.message and "//replica" in by_columns.value.message
    assert host.rows(table) == []


def test_a_columnar_batch_over_the_byte_bound_is_refused_with_413(host: FakeHost) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host, None, EngineConfig(max_peer_batch_bytes=1000))
    commits = [(host.timestamps.generate(), [{"k": k, "v": "x" * 100} for k in range(20)])]
    with pytest.raises(YtError) as refused:
        sink.handle_push(as_columns("r-1", "//replica", commits, ["k", "v"]), None)
    assert refused.value.http_status == 413 and "max_peer_batch_bytes" in refused.value.message
    assert host.rows(table) == []
    commits = [(commits[0][0], commits[0][1][:5])]
    assert sink.handle_push(as_columns("r-1", "//replica", commits, ["k", "v"]), None)["applied"]
    assert len(host.rows(table)) == 5


# -- a sync replica's prepare: whole rows as columns too ----------------------------------------------


def prepare_body(tx_id: str, replica_id: str, ts: int, writes: dict[str, Any]) -> dict[str, Any]:
    return {"transaction_id": tx_id, "coordinator": "primary", "replica_id": replica_id, "replica_path": "//replica",
            "tablet_index": 0, "start_timestamp": ts, "prepare_timestamp": ts, **writes}


def test_a_prepare_of_whole_rows_goes_as_columns_and_commits_them(host: FakeHost) -> None:
    table = host.make_table("replica", WITH_DOUBLE, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    writes = encode_writes([RowWrite(WriteKind.WRITE, {"k": k, "v": f"v{k}", "d": None}, 1) for k in range(3)])
    assert writes["columns"] == ["k", "v", "d"] and writes["values"][0] == [0, 1, 2] and "rows" not in writes
    # rows that do not all name the same columns go as rows
    mixed = encode_writes([RowWrite(WriteKind.WRITE, {"k": 5, "v": "a"}, 1),
                           RowWrite(WriteKind.WRITE, {"k": 6, "d": 1.5}, 1)])
    assert "columns" not in mixed and mixed["rows"] == [{"k": 5, "v": "a"}, {"k": 6, "d": 1.5}]
    ts = host.timestamps.generate()
    sink.handle_prepare(prepare_body("1-2-3-1", "r-1", ts, writes), None)
    sink.handle_prepare(prepare_body("1-2-3-2", "r-1", ts, mixed), None)
    for tx_id in ("1-2-3-1", "1-2-3-2"):
        sink.handle_commit({"transaction_id": tx_id, "commit_timestamp": host.timestamps.generate()}, None)
    assert [row[:3] for row in stored(host, table, "k", "v", "d")] == [
        (0, "v0", None), (1, "v1", None), (2, "v2", None), (5, "a", None), (6, None, 1.5)]


def test_a_prepare_of_whole_rows_locks_and_commits_as_the_rows_form_does(host: FakeHost) -> None:
    """A sync replica holds a prepare of whole rows its column check passes as images (``ImageRun``):
    its keys are locked until the decision (a later transaction writing one of them is refused),
    and the commits leave the data, the versions and the remembered commits the rows form leaves."""
    by_columns = host.make_table("replica", WITH_DOUBLE, upstream_replica_id="r-1")
    by_rows = host.make_table("replica_rows", WITH_DOUBLE, upstream_replica_id="r-2")
    sink = ReplicaSink(host)
    batches = [[{"k": 1, "v": "a", "d": 0.5}, {"k": 2, "v": "b", "d": None}],
               [{"k": 2, "v": "c", "d": 2.5}, {"k": 3, "v": None, "d": 3.5}],
               [{"k": 1, "v": "e", "d": None}]]
    for i, batch in enumerate(batches):
        start = host.timestamps.generate()
        columns = encode_writes([RowWrite(WriteKind.WRITE, row, 1) for row in batch])
        assert "columns" in columns
        sink.handle_prepare(prepare_body(f"1-2-3-{10 + i}", "r-1", start, columns), None)
        rows = prepare_body(f"1-2-3-{20 + i}", "r-2", start, {"rows": batch})
        sink.handle_prepare({**rows, "replica_path": "//replica_rows"}, None)
        if i == 0:
            # k=1 is locked by the prepared transaction: a later one that writes it is refused
            later = encode_writes([RowWrite(WriteKind.WRITE, {"k": 1, "v": "x", "d": None}, 1)])
            with pytest.raises(YtError) as refused:
                sink.handle_prepare(prepare_body("1-2-3-99", "r-1", host.timestamps.generate(), later), None)
            assert "conflict" in refused.value.message.lower() and "1-2-3-10" in refused.value.message
        commit_ts = host.timestamps.generate()
        for tx_id in (f"1-2-3-{10 + i}", f"1-2-3-{20 + i}"):
            sink.handle_commit({"transaction_id": tx_id, "commit_timestamp": commit_ts}, None)
    assert not host.transactions.has_remote_prepared(by_columns.table_id)

    def everything(table: DynamicTable) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        data, versions = table.sql.data, table.sql.versions
        assert versions is not None
        with host.storage.read() as conn:
            return ([tuple(r) for r in conn.execute(sa.select(data).order_by(data.c.k))],
                    [tuple(r) for r in conn.execute(sa.select(versions).order_by(versions.c.k, versions.c[TS]))])

    assert everything(by_columns) == everything(by_rows)
    assert [r[:3] for r in everything(by_columns)[0]] == [(1, "e", None), (2, "c", 2.5), (3, None, 3.5)]
    assert len(everything(by_columns)[1]) == 2
    assert [(c[0], sorted(c[2]), {(w.kind, w.mask) for w in c[2].values()}) for c in by_columns.recent] == \
        [(c[0], sorted(c[2]), {(w.kind, w.mask) for w in c[2].values()}) for c in by_rows.recent]


@pytest.mark.parametrize("writes", [
    {"columns": ["k", "k"], "values": [[1], [2]]},
    {"columns": ["k", "v"], "values": [[1, 2], ["a"]]},
    {"columns": ["k"], "values": [[1], [2]]},
    {"columns": "k", "values": [[1]]},
    {"columns": [], "values": []},
], ids=["duplicate-name", "lengths-differ", "more-values-than-names", "names-not-a-list", "no-column"])
def test_a_malformed_columnar_prepare_is_refused(host: FakeHost, writes: dict[str, Any]) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    with pytest.raises(YtError) as refused:
        sink.handle_prepare(prepare_body("1-2-3-4", "r-1", host.timestamps.generate(), writes), None)
    assert refused.value.code == 101 and "Malformed writes" in refused.value.message, refused.value.message
    assert not host.transactions.has_remote_prepared(table.table_id)


@pytest.mark.parametrize(("names", "values", "words"), [
    (["k", "v", "x"], [[1, 2], ["a", "b"], [None, 5]], "x"),
    (["k", "v"], [[1, None], ["a", "b"]], "k"),
    (["k", "v"], [[1, 2], ["a", 5]], "v"),
], ids=["unknown-column", "null-key", "int-in-a-string-column"])
def test_a_columnar_prepare_the_schema_refuses_is_named_as_in_rows(
        host: FakeHost, names: list[str], values: list[list[Any]], words: str) -> None:
    table = host.make_table("replica", SORTED, upstream_replica_id="r-1")
    sink = ReplicaSink(host)
    ts = host.timestamps.generate()
    with pytest.raises(YtError) as by_columns:
        sink.handle_prepare(prepare_body("1-2-3-5", "r-1", ts, {"columns": names, "values": values}), None)
    every = [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]
    with pytest.raises(YtError) as by_rows:
        sink.handle_prepare(prepare_body("1-2-3-6", "r-1", ts, {"rows": every}), None)
    assert by_columns.value.message == by_rows.value.message and by_columns.value.code == by_rows.value.code
    assert words in by_columns.value.message and "//replica" in by_columns.value.message
    assert not host.transactions.has_remote_prepared(table.table_id)


# -- the queue's SQL rows: a run of one commit's changes each ----------------------------------------


def queue_rows(world: World) -> list[tuple[int, int, str]]:
    data = world.table.sql.data
    with world.meta.storage.read() as conn:
        return [(int(r[0]), int(r[1]), str(r[2])) for r in conn.execute(
            sa.select(data.c[ROW_INDEX], data.c[ROW_COUNT], data.c[KIND]).order_by(data.c[ROW_INDEX]))]


def test_a_commit_is_one_queue_row_per_run_of_one_kind_and_reads_back_change_by_change(
        make_world: Callable[..., World]) -> None:
    world = make_world()
    replica = world.add_replica("replica")
    first = world.commit(rows(0, 10))
    second = commit_writes(world, [RowWrite(WriteKind.WRITE, {"k": 20, "v": "a"}, 1),
                                   RowWrite(WriteKind.WRITE, {"k": 21, "v": "b"}, 1),
                                   RowWrite(WriteKind.DELETE, {"k": 3}, 1),
                                   RowWrite(WriteKind.WRITE, {"k": 22, "v": "c"}, 1)])
    assert queue_rows(world) == [(0, 10, "write"), (10, 2, "write"), (12, 1, "delete"), (13, 1, "write")]
    with world.meta.storage.read() as conn:
        # from inside a run, across runs, at most the limit; and the rest of a commit with whole_commits
        middle = queue.read_sql(world.table.sql.data, conn, 0, 7, 5)
        assert [(e.row_index, e.timestamp, e.kind) for e in middle] == [
            (7, first, "write"), (8, first, "write"), (9, first, "write"), (10, second, "write"),
            (11, second, "write")]
        assert [e.row_index for e in queue.read_sql(world.table.sql.data, conn, 0, 7, 4, whole_commits=True)] == \
            list(range(7, 14))
        assert queue.first_timestamp_from(world.table, conn, 0, 9) == first
        assert queue.first_timestamp_from(world.table, conn, 0, 12) == second
        assert queue.first_timestamp_from(world.table, conn, 0, 14) is None
    world.table.queue_tail.clear()  # (as after a restart: every batch is read back from SQL)
    while world.replicate_once(replica):
        pass
    assert world.remote.rows(world.replica_tables[replica.id]) == [
        (k, f"v{k}") for k in range(10) if k != 3] + [(20, "a"), (21, "b"), (22, "c")]


def test_a_run_is_trimmed_whole_once_every_replica_has_all_of_it(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.commit(rows(0, 10))
    world.commit(rows(10, 5))
    with world.meta.storage.write() as conn:
        # a replica has rows below 12: the first run goes, the second stays whole
        assert queue.trim(world.table, conn, 0, 12, world.meta.timestamps.generate()) == 10
    assert world.table.tablet_rows[0] == [15, 10]
    assert queue_rows(world) == [(10, 5, "write")]
    with world.meta.storage.write() as conn:
        assert queue.trim(world.table, conn, 0, 14, world.meta.timestamps.generate()) == 0
        assert queue.trim(world.table, conn, 0, 15, world.meta.timestamps.generate()) == 5
    assert queue_rows(world) == [] and world.table.tablet_rows[0] == [15, 15]


def _runs(found: list[queue.QueueRun]) -> list[tuple[int, int, int, str, list[str]]]:
    return [(r.start, r.rows, r.timestamp, r.kind, r.payloads()) for r in found]


def test_runs_read_from_the_tail_and_from_sql_hold_the_same_changes(make_world: Callable[..., World]) -> None:
    world = make_world()
    world.commit(rows(0, 10))
    commit_writes(world, [RowWrite(WriteKind.WRITE, {"k": 20, "v": "a"}, 1),
                          RowWrite(WriteKind.DELETE, {"k": 3}, 1),
                          RowWrite(WriteKind.DELETE, {"k": 4}, 1)])
    world.commit(rows(30, 4))
    windows = [(0, 100), (0, 10), (3, 4), (7, 5), (9, 3), (10, 1), (11, 6), (16, 10), (17, 5)]
    with world.meta.storage.read() as conn:
        from_tail = [world.table.read_queue(conn, 0, start, limit) for start, limit in windows]
        from_sql = [queue.read_runs_sql(world.table.sql.data, conn, 0, start, limit) for start, limit in windows]
    assert [_runs(found) for found in from_tail] == [_runs(found) for found in from_sql]
    # every window holds exactly its changes, in order, the first and last run cut to it
    for (start, limit), found in zip(windows, from_tail, strict=True):
        indices = [r.start + i for r in found for i in range(r.rows)]
        assert indices == list(range(start, min(start + limit, 17)))
        assert all(len(r.payloads()) == r.rows for r in found)
    assert [r.block is not None for r in from_tail[0]] == [True, False, False, True]
    assert all(r.block is None for found in from_sql for r in found)
    assert [orjson.loads(p)["row"] for p in from_tail[3][0].payloads()] == [
        {"k": k, "v": f"v{k}"} for k in (7, 8, 9)]


def test_a_byte_bound_cuts_a_batch_inside_a_commit_and_every_change_arrives_once(
        make_world: Callable[..., World]) -> None:
    world = make_world(batch_bytes=100)
    replica = world.add_replica("replica")
    stamp = world.commit(rows(0, 10))  # a payload is 39 characters: two fit a batch
    while world.replicate_once(replica):
        pass
    sent = [(b["prev_row_index"], b["row_index"], b["columnar"]["commits"]) for b in pushes(world)]
    assert sent == [(k, k + 2, [[stamp, 2]]) for k in range(0, 10, 2)]
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(10)]


def test_a_change_over_the_byte_bound_still_goes_alone(make_world: Callable[..., World]) -> None:
    world = make_world(batch_bytes=10)
    replica = world.add_replica("replica")
    world.commit(rows(0, 2))
    while world.replicate_once(replica):
        pass
    assert [(b["prev_row_index"], b["row_index"]) for b in pushes(world)] == [(0, 1), (1, 2)]
    assert world.remote.rows(world.replica_tables[replica.id]) == [(0, "v0"), (1, "v1")]


def test_a_commit_bound_cuts_a_batch_between_commits(make_world: Callable[..., World]) -> None:
    world = make_world(batch_timestamps=2)
    replica = world.add_replica("replica")
    stamps = [world.commit(rows(k, 1)) for k in range(5)]
    while world.replicate_once(replica):
        pass
    assert [b["columnar"]["commits"] for b in pushes(world)] == [
        [[stamps[0], 1], [stamps[1], 1]], [[stamps[2], 1], [stamps[3], 1]], [[stamps[4], 1]]]
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(5)]


def test_the_tail_keeps_whole_runs_within_its_bound_and_older_rows_come_from_sql(
        make_world: Callable[..., World]) -> None:
    world = make_world(batch_rows=8)
    world.table.config = world.table.config.with_changes(queue_tail_rows=10)  # (the table's own tunables)
    replica = world.add_replica("replica")
    for k in range(0, 24, 4):
        world.commit(rows(k, 4))
    tail = world.table.queue_tail[0]
    # past 10 rows the tail drops its oldest runs, keeping the run that holds the bound's half
    assert tail[-1].end == 24 and tail[0].start > 0 and 24 - tail[0].start <= 10
    assert [r.start for r in tail] == list(range(tail[0].start, 24, 4))
    while world.replicate_once(replica):
        pass
    bodies = pushes(world)
    # (rows older than the tail are read back from SQL, and go as columns too)
    assert [b["row_index"] for b in bodies] == [8, 16, 24] and all("columnar" in b for b in bodies)
    assert world.remote.rows(world.replica_tables[replica.id]) == [(k, f"v{k}") for k in range(24)]
