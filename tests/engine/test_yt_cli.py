"""Walkthroughs with the official ``yt`` CLI against a real engine process.

These are the acceptance checks of the engine: every command a user types goes through the real
``ytsaurus-client`` CLI, over real HTTP, into a real engine on SQLite.
"""

from __future__ import annotations

import json

import pytest

from reptables.testing import EngineProcess


@pytest.fixture
def engine(clean_engine: EngineProcess) -> EngineProcess:
    return clean_engine

SCHEMA = "[{name=k;type=int64;sort_order=ascending};{name=v;type=string};{name=n;type=double}]"


def _rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _start_tablet_tx(engine: EngineProcess) -> str:
    """``yt start-tx`` starts master transactions; tablet ones go through ``yt execute``, as in YT."""
    import yt.yson as yson

    out = engine.yt("execute", "start_transaction", "{type=tablet;sticky=%true}").stdout
    return str(yson.loads(out.strip().encode())["transaction_id"])


def _make_table(engine: EngineProcess, path: str = "//tmp/t", schema: str = SCHEMA, extra: str = "") -> None:
    engine.yt("create", "table", path, "--attributes", f"{{dynamic=%true;schema={schema}{extra}}}")
    engine.yt("mount-table", path, "--sync")


def test_create_get_set_list_exists_remove(engine: EngineProcess) -> None:
    engine.yt("create", "map_node", "//home/project/data", "--recursive")
    assert engine.yt("exists", "//home/project/data").stdout.strip() == "true"
    engine.yt("set", "//home/project/data/@owner", '"team-a"')
    assert engine.yt("get", "//home/project/data/@owner", "--format", "json").stdout.strip() == '"team-a"'
    engine.yt("set", "//home/project/config", "{retries=3;name=x}")
    got = json.loads(engine.yt("get", "//home/project/config", "--format", "json").stdout)
    assert got == {"retries": 3, "name": "x"}
    assert engine.yt("list", "//home/project").stdout.split() == ["config", "data"]
    engine.yt("remove", "//home/project/config", "--recursive")
    assert engine.yt("exists", "//home/project/config").stdout.strip() == "false"
    node_id = engine.yt("get", "//home/project/data/@id").stdout.strip().strip('"')
    assert engine.yt("get", f"#{node_id}/@path").stdout.strip() == '"//home/project/data"'


def test_table_lifecycle_attributes(engine: EngineProcess) -> None:
    engine.yt("create", "table", "//tmp/t", "--attributes", f"{{dynamic=%true;schema={SCHEMA}}}")
    get = lambda attr: json.loads(engine.yt("get", f"//tmp/t/@{attr}", "--format", "json").stdout)  # noqa: E731
    assert get("tablet_state") == "unmounted"
    assert get("dynamic") is True
    assert get("key_columns") == ["k"]
    assert [c["name"] for c in get("schema")["$value"]] == ["k", "v", "n"]
    engine.yt("reshard-table", "//tmp/t", "[]", "[100]", "[200]")
    assert get("tablet_count") == 3
    assert get("pivot_keys") == [[], [100], [200]]
    engine.yt("mount-table", "//tmp/t", "--sync")
    assert get("tablet_state") == "mounted"
    engine.yt("freeze-table", "//tmp/t", "--sync")
    assert get("tablet_state") == "frozen"
    engine.yt("unfreeze-table", "//tmp/t", "--sync")
    assert get("tablet_state") == "mounted"
    engine.yt("unmount-table", "//tmp/t", "--sync")
    assert get("tablet_state") == "unmounted"
    engine.yt("remove", "//tmp/t")
    assert engine.yt("exists", "//tmp/t").stdout.strip() == "false"


def test_insert_lookup_select_delete(engine: EngineProcess) -> None:
    _make_table(engine)
    rows = "\n".join(json.dumps({"k": i, "v": f"v{i}", "n": i / 2}) for i in range(20))
    engine.yt("insert-rows", "//tmp/t", "--format", "json", input=rows)
    found = _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 3}\n{"k": 99}\n').stdout)
    assert found == [{"k": 3, "v": "v3", "n": 1.5}]
    selected = _rows(engine.yt("select-rows", "k, v from [//tmp/t] where k >= 15 order by k limit 3",
                               "--format", "json").stdout)
    assert selected == [{"k": 15, "v": "v15"}, {"k": 16, "v": "v16"}, {"k": 17, "v": "v17"}]
    engine.yt("delete-rows", "//tmp/t", "--format", "json", input='{"k": 3}\n')
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 3}\n').stdout) == []
    grouped = _rows(engine.yt("select-rows", "p, count(*) as c from [//tmp/t] group by k % 2 as p",
                              "--format", "json").stdout)
    assert sorted(grouped, key=lambda r: r["p"]) == [{"p": 0, "c": 10}, {"p": 1, "c": 9}]


def test_insert_update_mode_keeps_other_columns(engine: EngineProcess) -> None:
    _make_table(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", input='{"k": 1, "v": "a", "n": 1.0}\n')
    engine.yt("insert-rows", "//tmp/t", "--format", "json", "--update", input='{"k": 1, "n": 2.0}\n')
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 1}\n').stdout) == [
        {"k": 1, "v": "a", "n": 2.0}]
    engine.yt("insert-rows", "//tmp/t", "--format", "json", input='{"k": 1, "n": 3.0}\n')
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 1}\n').stdout) == [
        {"k": 1, "v": None, "n": 3.0}]


def test_yson_format_round_trip(engine: EngineProcess) -> None:
    _make_table(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "yson", input='{k=1;v="x"};{k=2;v="y"};')
    out = engine.yt("select-rows", "* from [//tmp/t]", "--format", "<format=text>yson").stdout
    import yt.yson as yson

    rows = [yson.yson_to_json(r) for r in yson.loads(out.encode(), yson_type="list_fragment")]
    assert rows == [{"k": 1, "v": "x", "n": None}, {"k": 2, "v": "y", "n": None}]


def test_read_at_timestamp_sees_exactly_older_commits(engine: EngineProcess) -> None:
    _make_table(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", input='{"k": 1, "v": "old"}\n')
    ts = int(engine.yt("generate-timestamp").stdout)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", input='{"k": 1, "v": "new"}\n{"k": 2, "v": "x"}\n')
    at_ts = _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", "--timestamp", str(ts),
                            input='{"k": 1}\n{"k": 2}\n').stdout)
    assert at_ts == [{"k": 1, "v": "old", "n": None}]
    selected = _rows(engine.yt("select-rows", "k, v from [//tmp/t]", "--timestamp", str(ts),
                               "--format", "json").stdout)
    assert selected == [{"k": 1, "v": "old"}]


def test_generate_timestamp_is_monotonic_yt_format(engine: EngineProcess) -> None:
    first = int(engine.yt("generate-timestamp").stdout)
    second = int(engine.yt("generate-timestamp").stdout)
    assert second > first
    import time

    assert abs((first >> 30) - time.time()) < 5


def test_tablet_transaction_commit_and_isolation(engine: EngineProcess) -> None:
    _make_table(engine)
    tx = _start_tablet_tx(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", "--tx", tx, input='{"k": 5, "v": "in-tx"}\n')
    # buffered until commit: invisible outside, and (seed 003) invisible to the transaction itself
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 5}\n').stdout) == []
    engine.yt("commit-tx", tx)
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 5}\n').stdout) == [
        {"k": 5, "v": "in-tx", "n": None}]


def test_conflicting_transactions_second_commit_fails(engine: EngineProcess) -> None:
    _make_table(engine)
    tx1 = _start_tablet_tx(engine)
    tx2 = _start_tablet_tx(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", "--tx", tx1, input='{"k": 7, "v": "one"}\n')
    engine.yt("insert-rows", "//tmp/t", "--format", "json", "--tx", tx2, input='{"k": 7, "v": "two"}\n')
    engine.yt("commit-tx", tx1)
    failed = engine.yt("commit-tx", tx2, check=False)
    assert failed.returncode != 0
    assert "conflict" in failed.stderr.lower()
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 7}\n').stdout)[0]["v"] == "one"


def test_aborted_transaction_applies_nothing(engine: EngineProcess) -> None:
    _make_table(engine)
    tx = _start_tablet_tx(engine)
    engine.yt("insert-rows", "//tmp/t", "--format", "json", "--tx", tx, input='{"k": 8, "v": "x"}\n')
    engine.yt("abort-tx", tx)
    assert _rows(engine.yt("lookup-rows", "//tmp/t", "--format", "json", input='{"k": 8}\n').stdout) == []


def test_ordered_table_rows_and_trim(engine: EngineProcess) -> None:
    engine.yt("create", "table", "//tmp/q", "--attributes",
              "{dynamic=%true;tablet_count=2;schema=[{name=msg;type=string}]}")
    engine.yt("mount-table", "//tmp/q", "--sync")
    rows = "\n".join(json.dumps({"$tablet_index": 1, "msg": f"m{i}"}) for i in range(5))
    engine.yt("insert-rows", "//tmp/q", "--format", "json", input=rows)
    selected = _rows(engine.yt("select-rows", "[$row_index], msg from [//tmp/q] where [$tablet_index] = 1",
                               "--format", "json").stdout)
    assert [(r["$row_index"], r["msg"]) for r in selected] == [(i, f"m{i}") for i in range(5)]
    engine.yt("trim-rows", "//tmp/q", "1", "3")
    left = _rows(engine.yt("select-rows", "msg from [//tmp/q] where [$tablet_index] = 1", "--format", "json").stdout)
    assert left == [{"msg": "m3"}, {"msg": "m4"}]
    tablets = json.loads(engine.yt("get", "//tmp/q/@tablets", "--format", "json").stdout)
    assert tablets[1]["trimmed_row_count"] == 3 and tablets[1]["flushed_row_count"] == 5


@pytest.mark.parametrize("bad_input, fragment", [
    ('{"v": "no key"}\n', "Missing key column"),
    ('{"k": "str"}\n', "of type int64"),
    ('{"k": 1, "zzz": 1}\n', "not found in the schema"),
    ('{"k": 1, "v": \n', "Malformed JSON"),
])
def test_bad_rows_are_rejected_with_clear_errors(engine: EngineProcess, bad_input: str, fragment: str) -> None:
    _make_table(engine)
    result = engine.yt("insert-rows", "//tmp/t", "--format", "json", input=bad_input, check=False)
    assert result.returncode != 0
    assert fragment in result.stderr
