"""``alter_table --schema`` on dynamic tables, as a user drives it: the official ``yt`` CLI and
``yt.wrapper`` against a real engine process.

What users rely on: a value column can be added (mounted or not, sorted or ordered) and old rows
read it as null; ``required`` can be relaxed; every change YT refuses is refused with YT's reason,
naming the column, and leaves the table exactly as it was; the new schema survives a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yt.yson as yson
from yt.common import YtResponseError

from reptables.testing import EngineProcess

SORTED = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
ORDERED = [{"name": "a", "type": "int64"}, {"name": "b", "type": "string", "required": True}]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess("alter", tmp_path / "alter").start()
    try:
        yield proc
    finally:
        proc.stop()


def _yson(value: Any) -> str:
    """A schema as the ``yt`` CLI takes it (YSON text)."""
    return str(yson.dumps(value).decode())


def _client(engine: EngineProcess) -> Any:
    return engine.wrapper_client()


def _make(engine: EngineProcess, path: str, schema: list[dict[str, Any]], mount: bool = True) -> Any:
    yt = _client(engine)
    yt.create("table", path, attributes={"dynamic": True, "schema": schema})
    if mount:
        yt.mount_table(path, sync=True)
    return yt


def _schema(yt: Any, path: str) -> list[dict[str, Any]]:
    return [{k: c[k] for k in ("name", "type", "required") if k in c} for c in yt.get(f"{path}/@schema")]


def test_add_value_column_to_mounted_sorted_table_with_the_cli(engine: EngineProcess) -> None:
    yt = _make(engine, "//tmp/s", SORTED)
    yt.insert_rows("//tmp/s", [{"k": 1, "v": "old"}])
    wider = SORTED + [{"name": "extra", "type": "int64"}]
    engine.yt("alter-table", "//tmp/s", "--schema", _yson(wider))
    assert [c["name"] for c in yt.get("//tmp/s/@schema")] == ["k", "v", "extra"]
    # the old row reads the new column as null; new rows carry it; an update keeps the others
    assert list(yt.lookup_rows("//tmp/s", [{"k": 1}])) == [{"k": 1, "v": "old", "extra": None}]
    yt.insert_rows("//tmp/s", [{"k": 2, "v": "new", "extra": 7}])
    yt.insert_rows("//tmp/s", [{"k": 1, "extra": 5}], update=True)
    rows = list(yt.select_rows("k, v, extra FROM [//tmp/s] ORDER BY k LIMIT 10"))
    assert rows == [{"k": 1, "v": "old", "extra": 5}, {"k": 2, "v": "new", "extra": 7}]
    assert list(yt.select_rows("k FROM [//tmp/s] WHERE extra = 7")) == [{"k": 2}]


def test_add_column_to_unmounted_ordered_table_and_relax_required(engine: EngineProcess) -> None:
    yt = _make(engine, "//tmp/o", ORDERED)
    yt.insert_rows("//tmp/o", [{"a": 1, "b": "x"}])
    yt.unmount_table("//tmp/o", sync=True)
    relaxed = [ORDERED[0], {"name": "b", "type": "string", "required": False}, {"name": "c", "type": "double"}]
    yt.alter_table("//tmp/o", schema=relaxed)
    yt.mount_table("//tmp/o", sync=True)
    yt.insert_rows("//tmp/o", [{"a": 2, "c": 1.5}])  # b is optional now
    rows = list(yt.select_rows("a, b, c FROM [//tmp/o]"))
    assert sorted(rows, key=lambda r: r["a"]) == [{"a": 1, "b": "x", "c": None}, {"a": 2, "b": None, "c": 1.5}]


def test_empty_table_takes_a_required_column_a_full_one_does_not(engine: EngineProcess) -> None:
    yt = _make(engine, "//tmp/e", SORTED)
    must = SORTED + [{"name": "must", "type": "string", "required": True}]
    yt.alter_table("//tmp/e", schema=must)
    with pytest.raises(YtResponseError, match="Missing required column 'must'"):
        yt.insert_rows("//tmp/e", [{"k": 1, "v": "x"}])
    yt.insert_rows("//tmp/e", [{"k": 1, "v": "x", "must": "y"}])
    with pytest.raises(YtResponseError) as err:
        yt.alter_table("//tmp/e", schema=must + [{"name": "again", "type": "int64", "required": True}])
    assert "Cannot insert a new required column 'again' into a non-empty table" in str(err.value)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda s: s[:1], "Cannot remove column 'v' from a strict schema"),
    (lambda s: [s[0], {"name": "v", "type": "int64"}], "Type mismatch for column 'v'"),
    (lambda s: [s[0], {"name": "v", "type": "string", "required": True}], "Column 'v' cannot become required"),
    (lambda s: [s[0], {"name": "n", "type": "int64"}, s[1]], "Cannot insert column 'n' before existing column 'v'"),
    (lambda s: [s[0], {"name": "k2", "type": "int64", "sort_order": "ascending"}, s[1]],
     "Cannot add key column 'k2'"),
    (lambda s: [{"name": "k", "type": "int64"}, s[1]],
     "Cannot change dynamic table type from sorted to ordered"),
    (lambda s: [s[0], {"name": "v", "type": "string", "lock": "other"}], "Lock mismatch for column 'v'"),
])
def test_refused_changes_name_the_column_and_change_nothing(engine: EngineProcess, change: Any, reason: str) -> None:
    yt = _make(engine, "//tmp/r", SORTED)
    yt.insert_rows("//tmp/r", [{"k": 1, "v": "kept"}])
    before = yt.get("//tmp/r/@schema")
    # a valid new column beside the bad change: all or nothing
    result = engine.yt("alter-table", "//tmp/r", "--schema",
                       _yson(change(SORTED) + [{"name": "z", "type": "int64"}]), check=False)
    assert result.returncode != 0
    assert reason in result.stderr
    assert "//tmp/r" in result.stderr
    assert yt.get("//tmp/r/@schema") == before
    assert list(yt.lookup_rows("//tmp/r", [{"k": 1}])) == [{"k": 1, "v": "kept"}]
    with pytest.raises(YtResponseError, match="Column 'z' is not found"):
        yt.insert_rows("//tmp/r", [{"k": 2, "v": "x", "z": 1}])


def test_widening_a_type_in_its_family_is_allowed(engine: EngineProcess) -> None:
    yt = _make(engine, "//tmp/w", [SORTED[0], {"name": "n", "type": "int32"}])
    yt.insert_rows("//tmp/w", [{"k": 1, "n": 3}])
    yt.alter_table("//tmp/w", schema=[SORTED[0], {"name": "n", "type": "int64"}])
    assert _schema(yt, "//tmp/w")[1] == {"name": "n", "type": "int64", "required": False}
    with pytest.raises(YtResponseError, match="Type mismatch for column 'n'"):
        yt.alter_table("//tmp/w", schema=[SORTED[0], {"name": "n", "type": "int32"}])


def test_new_schema_survives_a_restart(engine: EngineProcess) -> None:
    yt = _make(engine, "//tmp/d", SORTED)
    yt.insert_rows("//tmp/d", [{"k": 1, "v": "a"}])
    yt.alter_table("//tmp/d", schema=SORTED + [{"name": "extra", "type": "string"}])
    yt.insert_rows("//tmp/d", [{"k": 2, "v": "b", "extra": "e"}])
    engine.stop()
    engine.start()
    yt = _client(engine)
    assert [c["name"] for c in yt.get("//tmp/d/@schema")] == ["k", "v", "extra"]
    rows = list(yt.select_rows("k, v, extra FROM [//tmp/d] ORDER BY k LIMIT 10"))
    assert rows == [{"k": 1, "v": "a", "extra": None}, {"k": 2, "v": "b", "extra": "e"}]
    yt.insert_rows("//tmp/d", [{"k": 3, "v": "c", "extra": "f"}])
    assert list(yt.lookup_rows("//tmp/d", [{"k": 3}])) == [{"k": 3, "v": "c", "extra": "f"}]
