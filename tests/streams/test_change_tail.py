"""The in-memory tail of a streamed table's log (``tablets/changes.ChangeTail``): what a pull it
serves answers is what the read of SQL answers, to the byte, and a pull it cannot serve (a
position before it, a tail let go) reads SQL instead of answering short.

In process, on the current backend: the same range is read both ways and compared. Through the
stream itself: every change once, in order, with the values written (unicode, doubles, booleans,
nulls, updates of some columns, deletes, commits of many rows, an ordered table's appends).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.config import EngineConfig
from reptables.engine.node import Cluster
from reptables.engine.tablets import DynamicTable, changes
from reptables.engine.tablets.changes import ChangeTail, Position, decode_token
from reptables.testing.backends import open_cluster

SORTED = [{"name": "k", "type": "int64", "sort_order": "ascending"},
          {"name": "s", "type": "string", "sort_order": "ascending"},
          {"name": "v", "type": "string"}, {"name": "d", "type": "double"}, {"name": "b", "type": "boolean"},
          {"name": "n", "type": "int64"}]
ORDERED = [{"name": "msg", "type": "string"}, {"name": "x", "type": "double"}]
CAPACITY = 24


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = open_cluster("local", tmp_path / "data", EngineConfig(change_tail_rows=CAPACITY))
    try:
        yield c
    finally:
        c.close()


def make(c: Cluster, path: str, schema: list[dict[str, Any]]) -> DynamicTable:
    c.nodes.create("table", path, {"dynamic": True, "schema": schema, "enable_change_log": True})
    c.tablets.mount_table(path)
    return c.tables.table(path)[0]


def pull_all(c: Cluster, path: str, token: str, limit: int) -> list[dict[str, Any]]:
    """Every event after ``token`` through pulls of the wire form (``event_texts``), parsed."""
    events: list[dict[str, Any]] = []
    while True:
        answer = c.streams.pull_changes(path, from_event_token=token, max_row_count=limit, wait_timeout=0,
                                        event_texts=True)
        got = [json.loads(text + "}") for _, text in answer.event_texts or []] if answer.event_texts is not None \
            else [e for e in answer.events if e["kind"] != "heartbeat"]
        events += got
        token = answer.event_token
        if not got:
            return events


def sql_texts(c: Cluster, table: DynamicTable, path: str, after: Position, limit: int) -> list[tuple[int, str]]:
    bound = c.streams.stream_bound(table)
    with c.storage.read() as conn:
        return changes.read_json(table, conn, after, bound, limit, path)


def write_history(c: Cluster, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Commits of every kind; what each change must say, in order: (kind, key or row)."""
    expected: list[tuple[str, dict[str, Any]]] = []
    for i in range(12):
        rows = [{"k": i, "s": f"ключ-{j}", "v": f"значение {i}/{j} \u2603", "d": i / 7 + j, "b": j % 2 == 0,
                 "n": None if j == 1 else i * j} for j in range(3)]
        c.rows.insert_rows(path, rows)
        expected += [("insert", r) for r in rows]
    c.rows.insert_rows(path, [{"k": 3, "s": "ключ-0", "v": "updated"}], update=True)
    expected.append(("update", {"k": 3, "s": "ключ-0", "v": "updated", "d": 3 / 7, "b": True, "n": 0}))
    c.rows.delete_rows(path, [{"k": 4, "s": "ключ-2"}])
    expected.append(("delete", {"k": 4, "s": "ключ-2"}))
    return expected


def test_a_pull_from_the_tail_answers_what_sql_answers(cluster: Cluster) -> None:
    path = "//tmp/tail"
    table = make(cluster, path, SORTED)
    start = cluster.streams.pull_changes(path, wait_timeout=0, event_texts=True).event_token  # (makes the tail)
    tail = table.change_tail
    assert tail is not None
    expected = write_history(cluster, path)
    # the stream through pulls: every change once, in order, as written (the tail dropped its older
    # half on the way: 38 changes for a capacity of 24, pulled 7 at a time)
    events = pull_all(cluster, path, start, 7)
    assert [(e["kind"], e["key"]) for e in events] == \
        [(kind, {"k": v["k"], "s": v["s"]}) for kind, v in expected]
    for event, (kind, value) in zip(events, expected, strict=True):
        if kind != "delete":
            assert event["row"] == value
        assert event["path"] == path and "origin_cluster_id" not in event
    tokens = [decode_token(e["event_token"])[0] for e in events]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    if cluster.storage.engine.dialect.name != "sqlite":
        return  # (SQLite builds the events in SQL; elsewhere the reference is the Python path above)
    # the same range both ways, from every position the tail covers: the same text
    positions = [decode_token(start)[0]] + tokens
    served = 0
    for after in positions:
        for limit in (1, 5, 1000):
            taken = tail.take(after, cluster.streams.stream_bound(table), limit)
            if taken is None:
                continue  # (before the tail's start after its eviction: SQL answers)
            served += 1
            assert ChangeTail.render(taken, table.table_id, path, table.schema.key_names) == \
                sql_texts(cluster, table, path, after, limit)
    assert served >= 3 * CAPACITY // 2  # (the newer half of the history at least is still in the tail)
    assert tail.take(positions[0], cluster.streams.stream_bound(table), 10) is None  # evicted: not served


def test_ordered_appends_and_a_double_json_cannot_carry(cluster: Cluster) -> None:
    path = "//tmp/tail_ordered"
    table = make(cluster, path, ORDERED)
    start = cluster.streams.pull_changes(path, wait_timeout=0, event_texts=True).event_token
    cluster.rows.insert_rows(path, [{"msg": "a", "x": 1.5}, {"msg": "b", "x": None}])
    cluster.rows.insert_rows(path, [{"msg": "infinite", "x": math.inf}])
    cluster.rows.insert_rows(path, [{"msg": "c", "x": -0.25}])
    tail = table.change_tail
    assert tail is not None
    taken = tail.take(decode_token(start)[0], cluster.streams.stream_bound(table), 100)
    assert taken is not None and len(taken) == 4
    assert ChangeTail.render(taken, table.table_id, path, []) is None  # the infinity: not from the tail
    assert ChangeTail.render(taken[:2], table.table_id, path, []) is not None
    events = pull_all(cluster, path, start, 100)
    assert [e["row"]["msg"] for e in events] == ["a", "b", "infinite", "c"]
    assert [e["$row_index"] for e in events] == [0, 1, 2, 3]
    assert events[2]["row"]["x"] == math.inf and events[3]["row"]["x"] == -0.25


def test_a_tail_let_go_is_never_read_again_and_the_next_pull_makes_a_new_one(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    path = "//tmp/tail_idle"
    table = make(cluster, path, SORTED)
    start = cluster.streams.pull_changes(path, wait_timeout=0, event_texts=True).event_token
    first = table.change_tail
    assert first is not None
    monkeypatch.setattr(ChangeTail, "IDLE_SECONDS", -1.0)  # (every tail is idle now)
    cluster.rows.insert_rows(path, [{"k": 1, "s": "x", "v": "after"}])
    assert table.change_tail is None  # the commit let it go, and did not add to it
    assert first.take(decode_token(start)[0], cluster.streams.stream_bound(table), 10) is None
    monkeypatch.setattr(ChangeTail, "IDLE_SECONDS", 60.0)
    events = pull_all(cluster, path, start, 10)  # (from SQL: the new tail starts after this change)
    assert [e["row"]["v"] for e in events] == ["after"]
    assert table.change_tail is not None and table.change_tail is not first
    cluster.nodes.set(f"{path}/@enable_change_log", False)
    assert table.change_tail is None
