"""reptables.engine.client against a real engine process: one behaviour per test."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reptables.engine.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    LockConflict,
    ResolveError,
    Schema,
    TabletStateError,
    TransportError,
    YtError,
    compare_tokens,
)
from reptables.engine.errors import ErrorCode
from reptables.testing import EngineProcess, free_port, wait_for

TABLE = "//tmp/t"

SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "u", "type": "uint64"},
    {"name": "d", "type": "double"},
    {"name": "b", "type": "boolean"},
    {"name": "s", "type": "string"},
    {"name": "a", "type": "any"},
]

ROW = {"k": 1, "u": 2**63 - 1, "d": 2.5, "b": True, "s": "привет", "a": {"ключ": ["значение", 7, None]}}


@pytest.fixture
def engine(clean_engine: EngineProcess) -> EngineProcess:
    return clean_engine


@pytest.fixture
def client(engine: EngineProcess) -> Iterator[Client]:
    with Client(engine.url, token=engine.token) as c:
        yield c


def mounted_table(client: Client, path: str = TABLE, schema: list[dict[str, Any]] | None = None) -> str:
    client.create("table", path, attributes={"dynamic": True, "schema": schema or SCHEMA,
                                             "enable_change_log": True}, recursive=True)
    client.mount_table(path)
    return path


def test_insert_then_lookup_round_trips_every_column_type_and_unicode(client):
    mounted_table(client)
    client.insert_rows(TABLE, [ROW])
    assert client.lookup_rows(TABLE, [{"k": 1}]) == [ROW]


def test_lookup_with_column_names_returns_only_those_columns(client):
    mounted_table(client)
    client.insert_rows(TABLE, [ROW])
    assert client.lookup_rows(TABLE, [{"k": 1}], column_names=["k", "s"]) == [{"k": 1, "s": "привет"}]


def test_lookup_with_keep_missing_rows_gives_none_for_a_missing_key(client):
    mounted_table(client)
    client.insert_rows(TABLE, [ROW])
    assert client.lookup_rows(TABLE, [{"k": 2}, {"k": 1}], keep_missing_rows=True) == [None, ROW]
    assert client.lookup_rows(TABLE, [{"k": 2}, {"k": 1}]) == [ROW]


def test_select_rows_filters_by_a_unicode_literal(client):
    mounted_table(client)
    client.insert_rows(TABLE, [{"k": 1, "s": "привет"}, {"k": 2, "s": "hello"}])
    assert client.select_rows(f'k, s FROM [{TABLE}] WHERE s = "привет"') == [{"k": 1, "s": "привет"}]


def test_delete_rows_removes_the_rows(client):
    mounted_table(client)
    client.insert_rows(TABLE, [{"k": 1, "s": "a"}, {"k": 2, "s": "b"}])
    client.delete_rows(TABLE, [{"k": 1}])
    assert [row["k"] for row in client.select_rows(f"k FROM [{TABLE}]")] == [2]


def test_transaction_commits_when_the_block_succeeds(client):
    mounted_table(client)
    with client.transaction() as tx:
        client.insert_rows(TABLE, [{"k": 1, "s": "in tx"}], transaction_id=tx)
        assert client.lookup_rows(TABLE, [{"k": 1}]) == []
    assert client.lookup_rows(TABLE, [{"k": 1}], column_names=["s"]) == [{"s": "in tx"}]


def test_transaction_aborts_when_the_block_raises(client):
    mounted_table(client)
    with pytest.raises(RuntimeError, match="boom"), client.transaction() as tx:
        client.insert_rows(TABLE, [{"k": 1, "s": "in tx"}], transaction_id=tx)
        raise RuntimeError("boom")
    assert client.lookup_rows(TABLE, [{"k": 1}]) == []
    with pytest.raises(YtError) as info:
        client.commit_transaction(tx)
    assert info.value.code == ErrorCode.NO_SUCH_TRANSACTION


def test_second_commit_of_conflicting_transactions_raises_lock_conflict(client):
    mounted_table(client)
    first, second = client.start_transaction(), client.start_transaction()
    client.insert_rows(TABLE, [{"k": 1, "s": "first"}], transaction_id=first)
    client.insert_rows(TABLE, [{"k": 1, "s": "second"}], transaction_id=second)
    assert isinstance(client.commit_transaction(first), int)
    with pytest.raises(LockConflict) as info:
        client.commit_transaction(second)
    assert info.value.code == ErrorCode.TRANSACTION_LOCK_CONFLICT == 1700
    assert client.lookup_rows(TABLE, [{"k": 1}], column_names=["s"]) == [{"s": "first"}]


def test_cypress_commands_create_set_get_list_exists_remove(client):
    node_id = client.create("map_node", "//tmp/dir")
    assert isinstance(node_id, str) and node_id
    client.set("//tmp/dir/@note", {"текст": "привет", "n": [1, 2.5, True, None]})
    assert client.get("//tmp/dir/@note") == {"текст": "привет", "n": [1, 2.5, True, None]}
    assert "dir" in client.list("//tmp")
    assert client.exists("//tmp/dir") is True
    client.remove("//tmp/dir")
    assert client.exists("//tmp/dir") is False


def test_attributed_values_are_returned_as_json_attributes(client):
    client.create("map_node", "//tmp/dir")
    assert client.list("//tmp", attributes=["type"]) == [{"$attributes": {"type": "map_node"}, "$value": "dir"}]


def test_get_schema_returns_a_schema_that_recreates_the_table(client):
    mounted_table(client)
    schema = client.get(f"{TABLE}/@schema")
    assert isinstance(schema, Schema)
    assert [column["name"] for column in schema] == [c["name"] for c in SCHEMA]
    assert schema.attributes == {"strict": True, "unique_keys": True}
    client.create("table", "//tmp/copy", attributes={"dynamic": True, "schema": schema})
    assert client.get("//tmp/copy/@schema") == schema
    assert client.get("//tmp/copy/@schema").attributes == schema.attributes


class RecordingTransport(httpx.HTTPTransport):
    """A real transport that keeps every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


def test_requests_follow_the_v4_protocol(engine):
    transport = RecordingTransport()
    with Client(engine.url, token=engine.token, transport=transport) as c:
        mounted_table(c)
        c.insert_rows(TABLE, [{"k": 1, "s": "привет"}])
        c.select_rows(f'k FROM [{TABLE}] WHERE s = "привет"')
    sent = {r.url.path.rsplit("/", 1)[-1]: r for r in transport.requests}
    assert {name: r.method for name, r in sent.items()} == {
        "create": "POST", "mount_table": "POST", "insert_rows": "PUT", "select_rows": "GET"}
    json_format = {"$value": "json", "$attributes": {"encode_utf8": False}}
    for request in transport.requests:
        assert request.headers["Authorization"] == f"OAuth {engine.token}"
        assert request.headers["X-YT-Header-Format"] == "json"
        assert request.headers["X-YT-Parameters"].isascii()
    insert_params = json.loads(sent["insert_rows"].headers["X-YT-Parameters"])
    assert insert_params == {"path": TABLE, "input_format": json_format}
    assert sent["insert_rows"].content == '{"k":1,"s":"привет"}\n'.encode()
    select_params = json.loads(sent["select_rows"].headers["X-YT-Parameters"])
    assert select_params["output_format"] == json_format
    assert "привет" in select_params["query"]


def test_generate_timestamp_increases(client):
    first = client.generate_timestamp()
    assert isinstance(first, int)
    assert client.generate_timestamp() > first


def test_missing_path_raises_resolve_error(client):
    with pytest.raises(ResolveError) as info:
        client.get("//tmp/missing")
    assert info.value.code == ErrorCode.RESOLVE_ERROR == 500
    assert "//tmp/missing" in info.value.message


def test_wrong_token_raises_authentication_error(engine):
    with Client(engine.url, token="not-the-token") as c, pytest.raises(AuthenticationError) as info:
        c.exists("//tmp")
    assert info.value.code == ErrorCode.AUTHENTICATION_ERROR == 900


def test_token_defaults_to_yt_token_from_the_environment(engine, monkeypatch):
    monkeypatch.setenv("YT_TOKEN", engine.token)
    with Client(engine.url) as c:
        assert c.exists("//tmp") is True


def test_closed_port_raises_transport_error():
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, token="t", timeout=5) as c, pytest.raises(TransportError) as info:
        c.exists("//tmp")
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.url == f"{url}/api/v4/exists"
    assert info.value.cause is info.value.__cause__ is not None


def test_call_runs_any_command_by_name_as_the_proxy_describes_it(client):
    mounted_table(client)
    client.call("remount_table", {"path": TABLE})
    assert client.get(f"{TABLE}/@tablet_state") == "mounted"


def test_call_returns_structured_output_as_sent(client):
    assert client.call("exists", {"path": "//tmp"}) == {"value": True}


def test_call_of_an_unknown_command_raises_no_such_method(client):
    with pytest.raises(YtError) as info:
        client.call("no_such_command", {})
    assert info.value.code == ErrorCode.NO_SUCH_METHOD


def test_async_client_round_trip_and_transaction(engine):
    async def scenario() -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
        async with AsyncClient(engine.url, token=engine.token) as c:
            await c.create("table", TABLE, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True},
                           recursive=True)
            await c.mount_table(TABLE)
            await c.insert_rows(TABLE, [ROW])
            async with c.transaction() as tx:
                await c.insert_rows(TABLE, [{"k": 2, "s": "в транзакции"}], transaction_id=tx)
            looked_up = await c.lookup_rows(TABLE, [{"k": 1}, {"k": 3}], keep_missing_rows=True)
            selected = await c.select_rows(f"k, s FROM [{TABLE}] WHERE k = 2")
            return looked_up, selected

    looked_up, selected = asyncio.run(scenario())
    assert looked_up == [ROW, None]
    assert selected == [{"k": 2, "s": "в транзакции"}]


def test_async_client_raises_the_same_errors(engine):
    async def scenario() -> None:
        async with AsyncClient(engine.url, token=engine.token) as c:
            await c.get("//tmp/missing")

    with pytest.raises(ResolveError):
        asyncio.run(scenario())


def test_a_connection_idle_near_the_servers_keep_alive_limit_is_not_reused(engine: EngineProcess) -> None:
    """The server closes a keep-alive connection after 5 idle seconds; one idle nearly that long could
    be closing just as a request goes out on it (a reset the caller sees as an unreachable cluster),
    so the pool opens a new one instead. A connection idle a moment is reused."""
    import time

    from reptables.engine.httpconn import ConnectionPool

    pool = ConnectionPool(engine.url, max_idle_seconds=0.5)
    try:
        def port_of_next_request() -> int:
            assert pool.request("GET", "/readyz").status_code == 200
            [(conn, _)] = pool._idle
            assert conn.sock is not None
            return int(conn.sock.getsockname()[1])

        first = port_of_next_request()
        assert port_of_next_request() == first  # reused at once
        time.sleep(0.8)
        assert port_of_next_request() != first  # idle past the limit: a new connection
    finally:
        pool.close()


# --- long pulls and event tokens -------------------------------------------------------------------


def test_a_long_pull_beyond_the_client_timeout_answers_with_its_heartbeat(engine: EngineProcess) -> None:
    """A pull may wait up to a minute for a change: its request outlives the client's timeout by design."""
    with Client(engine.url, token=engine.token, timeout=2) as c:
        mounted_table(c)
        started = time.monotonic()
        answer = c.pull_changes(TABLE, wait_timeout=4000)
    assert [e["kind"] for e in answer["events"]] == ["heartbeat"]
    assert time.monotonic() - started >= 3.5  # it did wait (the engine answers an idle pull at its timeout)


def test_the_async_client_long_pull_beyond_its_timeout_answers_with_its_heartbeat(engine: EngineProcess) -> None:
    async def scenario() -> dict[str, Any]:
        async with AsyncClient(engine.url, token=engine.token, timeout=2) as c:
            await c.create("table", TABLE, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True},
                           recursive=True)
            await c.mount_table(TABLE)
            return await c.pull_changes(TABLE, wait_timeout=4000)

    answer = asyncio.run(scenario())
    assert [e["kind"] for e in answer["events"]] == ["heartbeat"]


class TimeoutRecordingTransport(httpx.HTTPTransport):
    """A real transport that keeps the timeouts of every request it sends, by command."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: dict[str, dict[str, float]] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.timeouts[request.url.path.rsplit("/", 1)[-1]] = dict(request.extensions["timeout"])
        return super().handle_request(request)


def test_only_long_pulls_get_a_longer_read_timeout(engine: EngineProcess) -> None:
    transport = TimeoutRecordingTransport()
    with Client(engine.url, token=engine.token, timeout=2, transport=transport) as c:
        mounted_table(c)
        c.insert_rows(TABLE, [{"k": 1}])
        c.pull_changes(TABLE, from_timestamp=0, wait_timeout=40_000)  # answers at once: there is a change
        c.call("pull_changes", {"path": TABLE, "from_timestamp": 0, "wait_timeout": 50_000})
    assert transport.timeouts["pull_changes"] == {"connect": 2, "read": 65, "write": 2, "pool": 2}
    assert transport.timeouts["insert_rows"] == {"connect": 2, "read": 2, "write": 2, "pool": 2}


def test_compare_tokens_orders_the_changes_of_one_table(client: Client) -> None:
    mounted_table(client)
    client.insert_rows(TABLE, [{"k": 1}])
    client.insert_rows(TABLE, [{"k": 2}])
    first, second = (e["event_token"] for e in client.pull_changes(TABLE, from_timestamp=0)["events"])
    assert compare_tokens(first, second) == -1
    assert compare_tokens(second, first) == 1
    assert compare_tokens(first, first) == 0


def test_compare_tokens_refuses_tokens_of_two_tables_naming_both(client: Client) -> None:
    mounted_table(client)
    mounted_table(client, "//tmp/other")
    client.insert_rows(TABLE, [{"k": 1}])
    client.insert_rows("//tmp/other", [{"k": 1}])
    mine = client.pull_changes(TABLE, from_timestamp=0)["events"][0]["event_token"]
    other = client.pull_changes("//tmp/other", from_timestamp=0)["events"][0]["event_token"]
    table_id, other_id = client.get(f"{TABLE}/@id"), client.get("//tmp/other/@id")
    assert mine.endswith(table_id) and other.endswith(other_id)
    with pytest.raises(ValueError, match="two tables") as info:
        compare_tokens(mine, other)
    assert table_id in str(info.value) and other_id in str(info.value)


@pytest.mark.parametrize("bad", ["", "0123", "g" * 32 + "1-2-3-4", "0" * 32])
def test_compare_tokens_refuses_a_string_that_is_not_an_event_token(bad: str) -> None:
    good = "0" * 32 + "1-2-3-4"
    with pytest.raises(ValueError, match="Invalid event token"):
        compare_tokens(good, bad)
    with pytest.raises(ValueError, match="Invalid event token"):
        compare_tokens(bad, good)


# --- every command a typed method ------------------------------------------------------------------


def _public_commands() -> dict[str, Any]:
    """The engine's command table without its aliases (``start_tx`` ... name a command registered first)."""
    from reptables.engine.api.commands import COMMANDS

    seen: set[Any] = set()
    out = {}
    for name, command in COMMANDS.items():
        if command.handler not in seen:
            seen.add(command.handler)
            out[name] = command
    return out


def test_every_public_command_has_a_typed_method_with_the_same_parameters_on_both_clients() -> None:
    from reptables.engine.client.protocol import _KNOWN_SPECS

    def parameters(method: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]

    missing, differing, described = [], [], []
    for name, command in _public_commands().items():
        sync, aio = getattr(Client, name, None), getattr(AsyncClient, name, None)
        if sync is None or aio is None:
            missing.append(name)
            continue
        if parameters(sync) != parameters(aio):
            differing.append(name)
        spec = _KNOWN_SPECS[name]
        if (spec.input_type, spec.output_type, spec.volatile) != (command.input_type, command.output_type,
                                                                 command.is_volatile):
            described.append(name)
    assert not missing, f"commands without a typed method: {missing}"
    assert not differing, f"methods whose parameters differ between Client and AsyncClient: {differing}"
    assert not described, f"methods sent with another HTTP method or format than the engine's: {described}"


# --- replicas -----------------------------------------------------------------------------------------


@pytest.fixture
def replica(client: Client, engine: EngineProcess) -> Iterator[tuple[str, str]]:
    """A replicated table of the engine with a disabled async replica on the engine itself:
    (table path, replica id)."""
    from reptables.engine.credentials import peer_credential

    client.set("//sys/clusters", {engine.cluster_name: {"proxy_url": engine.url,
                                                        "token": peer_credential(engine.token, engine.cluster_name)}})
    try:
        client.create("replicated_table", "//tmp/rt", attributes={"dynamic": True, "schema": SCHEMA})
        client.mount_table("//tmp/rt")
        replica_id = client.create("table_replica", attributes={
            "table_path": "//tmp/rt", "cluster_name": engine.cluster_name, "replica_path": "//tmp/rt_copy"})
        client.create("table", "//tmp/rt_copy", attributes={"dynamic": True, "schema": SCHEMA,
                                                            "upstream_replica_id": replica_id})
        client.mount_table("//tmp/rt_copy")
        yield "//tmp/rt", replica_id
    finally:
        client.set("//sys/clusters", {})


def test_alter_table_replica_switches_mode_enables_and_hands_the_mode_to_the_tracker(client, replica):
    _, replica_id = replica
    client.alter_table_replica(replica_id, mode="sync")
    assert client.get(f"#{replica_id}/@mode") == "sync"
    assert client.get(f"#{replica_id}/@state") == "disabled"
    client.alter_table_replica(replica_id, enabled=True)
    wait_for(lambda: client.get(f"#{replica_id}/@state") == "enabled", what="the replica enabled")
    assert client.get(f"#{replica_id}/@mode") == "sync"
    client.alter_table_replica(replica_id, enable_replicated_table_tracker=False)
    assert client.get(f"#{replica_id}/@enable_replicated_table_tracker") is False


def test_get_in_sync_replicas_names_an_enabled_replica_that_holds_every_change(client, replica):
    path, replica_id = replica
    before = client.generate_timestamp()
    assert client.get_in_sync_replicas(path, before) == []  # disabled
    client.alter_table_replica(replica_id, enabled=True, mode="sync")
    wait_for(lambda: client.get(f"#{replica_id}/@state") == "enabled", what="the replica enabled")
    # A sync replica just enabled refuses writes (retriable) until it has caught up.
    wait_for(lambda: client.insert_rows(path, [{"k": 1, "s": "written"}]) or True,
             what="a write the new sync replica accepts")
    now = client.generate_timestamp()
    wait_for(lambda: client.get_in_sync_replicas(path, now) == [replica_id], what="the replica in sync")
    assert client.get_in_sync_replicas(path, now, keys=[{"k": 1}]) == [replica_id]
    assert client.lookup_rows("//tmp/rt_copy", [{"k": 1}], column_names=["s"]) == [{"s": "written"}]


# --- tables --------------------------------------------------------------------------------------------


def test_alter_table_adds_a_value_column_to_a_mounted_table(client):
    mounted_table(client)
    client.alter_table(TABLE, schema=[*SCHEMA, {"name": "added", "type": "string"}])
    assert [c["name"] for c in client.get(f"{TABLE}/@schema")][-1] == "added"
    client.insert_rows(TABLE, [{"k": 1, "added": "new column"}])
    assert client.lookup_rows(TABLE, [{"k": 1}], column_names=["added"]) == [{"added": "new column"}]


def test_alter_table_sets_the_upstream_replica_of_an_unmounted_table(client):
    client.create("table", TABLE, attributes={"dynamic": True, "schema": SCHEMA})
    client.alter_table(TABLE, upstream_replica_id="1-2-3-4")
    assert client.get(f"{TABLE}/@upstream_replica_id") == "1-2-3-4"


def test_remount_table_keeps_a_mounted_table_mounted_and_refuses_an_unmounted_one(client):
    mounted_table(client)
    client.remount_table(TABLE)
    assert client.get(f"{TABLE}/@tablet_state") == "mounted"
    client.unmount_table(TABLE, force=True)
    assert client.get(f"{TABLE}/@tablet_state") == "unmounted"
    with pytest.raises(TabletStateError):
        client.remount_table(TABLE)


def test_a_non_atomic_transaction_takes_the_clients_start_timestamp_checked_against_the_clock(client):
    client.create("table", TABLE, attributes={"dynamic": True, "schema": SCHEMA, "atomicity": "none"})
    client.mount_table(TABLE)
    now = client.generate_timestamp()
    tx = client.start_transaction(atomicity="none", start_timestamp=now)
    client.insert_rows(TABLE, [{"k": 1, "s": "now"}], transaction_id=tx, atomicity="none")
    client.commit_transaction(tx)
    assert client.lookup_rows(TABLE, [{"k": 1}], column_names=["s"]) == [{"s": "now"}]
    an_hour_ago = now - (3600 << 30)
    stale = client.start_transaction(atomicity="none", start_timestamp=an_hour_ago)
    client.insert_rows(TABLE, [{"k": 2}], transaction_id=stale, atomicity="none")
    with pytest.raises(YtError, match="off limits"):
        client.commit_transaction(stale)


def test_select_rows_past_its_output_row_limit_fails_unless_told_to_return_what_it_has(client):
    mounted_table(client)
    client.insert_rows(TABLE, [{"k": i} for i in range(5)])
    with pytest.raises(YtError) as info:
        client.select_rows(f"k FROM [{TABLE}]", output_row_limit=2)
    assert info.value.code == ErrorCode.INVALID_PARAMETER
    assert len(client.select_rows(f"k FROM [{TABLE}]", output_row_limit=2, fail_on_incomplete_result=False)) == 2


# --- XDCR administration --------------------------------------------------------------------------------


def test_dr_pause_refuses_client_writes_until_dr_resume(client):
    mounted_table(client)
    status = client.dr_status()
    assert (status["paused"], status["connections"], status["peers"]) == (False, [], {})
    assert client.dr_pause(wait=False)["paused"] is True
    try:
        with pytest.raises(YtError):
            client.insert_rows(TABLE, [{"k": 1}])
    finally:
        assert client.dr_resume()["paused"] is False
    client.insert_rows(TABLE, [{"k": 1}])
    assert client.dr_reset()["connections"] == []


def test_the_async_client_reports_the_same_dr_status(engine):
    async def scenario() -> Any:
        async with AsyncClient(engine.url, token=engine.token) as c:
            return await c.dr_status()

    with Client(engine.url, token=engine.token) as c:
        assert asyncio.run(scenario()) == c.dr_status()


def test_a_cluster_joins_an_xdcr_table_page_by_page_with_the_typed_join_commands(tmp_path):
    from reptables.engine.credentials import peer_credential
    from reptables.engine.process import start_all

    engines = {name: EngineProcess(name, tmp_path / name, extra_args=["--cluster-id", str(i)])
               for i, name in enumerate(("a", "b"), start=1)}
    start_all(engines.values())
    try:
        with Client(engines["a"].url, engines["a"].token) as a, Client(engines["b"].url, engines["b"].token) as b:
            for name, c in (("a", a), ("b", b)):
                c.set("//sys/clusters", {n: {"proxy_url": e.url, "token": peer_credential(e.token, name)}
                                         for n, e in engines.items()})
                c.create("table", TABLE, recursive=True, attributes={"dynamic": True, "xdcr": True,
                                                                     "schema": SCHEMA[:2]})
                c.mount_table(TABLE)
            a.insert_rows(TABLE, [{"k": i, "u": i} for i in range(120)])
            a.set("//sys/@xdcr_connections", ["b"])
            b.set("//sys/@xdcr_connections", ["a"])
            begun = b.dr_join_begin(TABLE, source="a", page_rows=50)
            assert (begun["source"], begun["pages"], begun["rows"]) == ("a", 3, 120)
            assert b.dr_status()["joining"][TABLE]["missing_pages"] == [0, 1, 2]
            for page in begun["missing_pages"]:
                entries = b.dr_join_read(TABLE, page)["entries"]
                assert b.dr_join_write(TABLE, page, entries)["applied"] is True
                assert b.dr_join_write(TABLE, page, entries)["applied"] is False  # loaded once
            assert b.dr_join_finish(TABLE)["joined"] is True
            assert TABLE not in b.dr_status()["joining"]
            assert b.select_rows(f"k, u FROM [{TABLE}]", output_row_limit=1000) == \
                a.select_rows(f"k, u FROM [{TABLE}]", output_row_limit=1000)
    finally:
        for engine in engines.values():
            engine.stop()


def test_answer_headers_are_read_as_http_client_would_without_the_email_parser() -> None:
    """The synchronous clients read an answer's header block themselves (engine/httpconn.py): the
    same names and values as ``http.client.parse_headers``, repeated names kept, a folded line
    joined with one space (RFC 9112), values without surrounding blanks, and the same refusal of
    an endless block."""
    import http.client
    import io

    from reptables.engine.httpconn import _header_block, _message

    block = (b"X-YT-Error: {\"code\": 1}\r\nx-yt-response-code: 0\r\nVia: a\r\nvia: b\r\n"
             b"Folded: first\r\n  second\r\nEmpty:\r\n\r\nbody")
    ours = _message(_header_block(io.BytesIO(block)))
    standard = http.client.parse_headers(io.BytesIO(block))
    assert ours.get("x-yt-error") == standard.get("X-YT-ERROR") == '{"code": 1}'
    assert ours.get("X-YT-Response-Code") == "0"
    assert ours.get_all("via") == standard.get_all("via") == ["a", "b"]
    assert ours.get("folded") == "first second" and ours.get("empty") == ""
    assert ours.get("missing") is None
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        _header_block(io.BytesIO(b"".join(f"h{i}: v\r\n".encode() for i in range(200)) + b"\r\n"))
    with pytest.raises(http.client.LineTooLong):
        _header_block(io.BytesIO(b"h: " + b"x" * 70000 + b"\r\n\r\n"))
