"""The official ``yt.wrapper`` Python API against a real engine process.

Users of YTsaurus write code like this; it must work unchanged against reptables, including
tablet transactions (``yt.wrapper.Transaction(type="tablet")``, sticky over HTTP).
"""

from __future__ import annotations

import pytest
import yt.wrapper as yt

from reptables.testing import EngineProcess

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "payload", "type": "any"}]


@pytest.fixture
def client(shared_engine: EngineProcess, request: pytest.FixtureRequest) -> yt.YtClient:
    c = shared_engine.wrapper_client()
    path = f"//tmp/{request.node.name}"
    c.create("table", path, attributes={"dynamic": True, "schema": SCHEMA})
    c.mount_table(path, sync=True)
    c.path = path  # type: ignore[attr-defined]
    return c


def test_insert_lookup_select_in_yson(client: yt.YtClient) -> None:
    path = client.path
    client.insert_rows(path, [{"k": i, "v": f"v{i}", "payload": {"tags": ["a", i]}} for i in range(5)])
    assert list(client.lookup_rows(path, [{"k": 2}])) == [{"k": 2, "v": "v2", "payload": {"tags": ["a", 2]}}]
    assert [r["k"] for r in client.select_rows(f"k from [{path}] where k > 2")] == [3, 4]


def test_tablet_transaction_commits_atomically(client: yt.YtClient) -> None:
    path = client.path
    with client.Transaction(type="tablet"):
        client.insert_rows(path, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
        client.delete_rows(path, [{"k": 3}])
        assert list(client.lookup_rows(path, [{"k": 1}])) == []
    assert sorted(r["k"] for r in client.select_rows(f"k from [{path}]")) == [1, 2]


def test_tablet_transaction_rolls_back_on_exception(client: yt.YtClient) -> None:
    path = client.path
    with pytest.raises(RuntimeError), client.Transaction(type="tablet"):
        client.insert_rows(path, [{"k": 9, "v": "never"}])
        raise RuntimeError("application failure")
    assert list(client.lookup_rows(path, [{"k": 9}])) == []


def test_conflict_surfaces_as_yt_error_with_code_1700(client: yt.YtClient, shared_engine: EngineProcess) -> None:
    path = client.path
    other = shared_engine.wrapper_client()
    with pytest.raises(yt.YtResponseError) as err:
        with client.Transaction(type="tablet"):
            client.insert_rows(path, [{"k": 5, "v": "first"}])
            other.insert_rows(path, [{"k": 5, "v": "concurrent"}])
    assert err.value.contains_code(1700)
    assert list(other.lookup_rows(path, [{"k": 5}]))[0]["v"] == "concurrent"


def test_read_at_generated_timestamp(client: yt.YtClient) -> None:
    path = client.path
    client.insert_rows(path, [{"k": 1, "v": "old"}])
    ts = client.generate_timestamp()
    client.insert_rows(path, [{"k": 1, "v": "new"}])
    assert list(client.lookup_rows(path, [{"k": 1}], timestamp=ts))[0]["v"] == "old"
    assert list(client.select_rows(f"v from [{path}]", timestamp=ts)) == [{"v": "old"}]


def test_cypress_calls(client: yt.YtClient) -> None:
    client.create("map_node", "//home/app/settings", recursive=True)
    client.set("//home/app/settings/@color", "blue")
    assert client.get("//home/app/settings/@color") == "blue"
    assert client.exists("//home/app/settings")
    assert "settings" in client.list("//home/app")
    client.remove("//home/app", recursive=True)
    assert not client.exists("//home/app")
    assert client.get(client.path + "/@key_columns") == ["k"]
