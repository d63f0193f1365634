"""The node tree over real HTTP: no read returns a peer's token, and no refused request changes it.

Two promises users rely on. Tokens of other clusters in ``//sys/clusters`` are secrets: no path,
object id, attribute list or output format returns one, and a token never follows its cluster to a
new ``proxy_url`` (calls then fail with "No credential" until a new token is set). And a Cypress
request that is refused (a value YSON cannot store, a lone surrogate, a ``$`` key, an integer out of
range, a tree deeper than the depth limit, a failure half-way through) leaves the tree exactly as
it was, in memory and on disk: ``get //`` answers the same before and after, later commands work,
and so does the engine after a restart.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine import yson_util
from reptables.engine.errors import ErrorCode
from reptables.engine.peers import Peers, parse_directory
from reptables.engine.peers.directory import NoCredential
from reptables.testing import EngineProcess

SECRET = "SECRET-token-of-b-0123456789"
SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
#: the depth limit of the node tree (reptables.engine.yson_util.MAX_DEPTH)
MAX_DEPTH = 128


class Api:
    """Raw HTTP to one engine: parameters in X-YT-Parameters, bodies as given."""

    def __init__(self, engine: EngineProcess) -> None:
        self.engine = engine
        self.http = httpx.Client(base_url=engine.url, timeout=60)

    def send(self, command: str, params: dict[str, Any], body: bytes | None = None) -> httpx.Response:
        headers = {"X-YT-Header-Format": "json", "Authorization": f"OAuth {self.engine.token}",
                   "X-YT-Parameters": json.dumps(params)}
        return self.http.post(f"/api/v4/{command}", headers=headers, content=body)

    def ok(self, command: str, params: dict[str, Any], body: bytes | None = None) -> httpx.Response:
        resp = self.send(command, params, body)
        assert resp.status_code == 200, f"{command} {params} failed: {resp.status_code} {resp.text[:1000]}"
        return resp

    def get(self, path: str, **params: Any) -> Any:
        return self.ok("get", {"path": path, **params}).json()["value"]

    def set(self, path: str, value: Any, **params: Any) -> None:
        self.ok("set", {"path": path, "input_format": "json", **params}, json.dumps(value).encode())

    def tree(self) -> Any:
        """The whole tree with every node's id and type: a refused request must not change it."""
        return self.get("//", attributes=["id", "type"])

    def close(self) -> None:
        self.http.close()


def assert_refused(resp: httpx.Response, code: int, *fragments: str) -> None:
    context = f"{resp.request.url} -> {resp.status_code} {resp.text[:1000]!r}"
    assert 400 <= resp.status_code < 500, f"expected a 4xx: {context}"
    error = resp.json()
    codes = [error["code"], *(inner["code"] for inner in error.get("inner_errors") or [])]
    assert code in codes, context
    for fragment in fragments:
        assert fragment.lower() in error["message"].lower(), f"message does not mention {fragment!r}: {context}"


@pytest.fixture(scope="module")
def api(shared_engine: EngineProcess) -> Iterator[Api]:
    client = Api(shared_engine)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def tmp_api(api: Api, clean_engine: EngineProcess) -> Iterator[Api]:
    """The shared engine's API; //tmp is emptied and //sys/clusters cleared after the test."""
    try:
        yield api
    finally:
        api.set("//sys/clusters", {})


# -- a listener standing in for cluster b: it records the Authorization of every request ------------


class Listener:
    def __init__(self) -> None:
        self.authorizations: list[str] = []
        seen = self.authorizations

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                seen.append(self.headers.get("Authorization", ""))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps({"code": 105, "message": "listener", "attributes": {}, "inner_errors": []})
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    first, second = Listener(), Listener()
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def replica_on_b(api: Api) -> str:
    """A disabled replica on cluster b of a new replicated table; enabling it calls b."""
    api.ok("create", {"type": "replicated_table", "path": "//tmp/rt",
                      "attributes": {"dynamic": True, "schema": SCHEMA}})
    return api.ok("create", {"type": "table_replica", "attributes": {
        "table_path": "//tmp/rt", "cluster_name": "b", "replica_path": "//tmp/r"}}).json()["node_id"]


def enable(api: Api, replica_id: str) -> httpx.Response:
    resp = api.send("alter_table_replica", {"replica_id": replica_id, "enabled": True})
    assert resp.status_code != 200, "the listener standing in for b refuses every call"
    return resp


# -- no token in any read, and none sent to a new address -----------------------------------------


def test_no_read_returns_a_peer_token_whatever_the_path_id_or_attributes(tmp_api: Api) -> None:
    api = tmp_api
    api.set("//sys/clusters/b", {"proxy_url": "http://127.0.0.1:1", "token": SECRET})
    sys_id = api.get("//sys/@id")
    clusters_id = api.get("//sys/clusters/@id")
    entry_id = api.get("//sys/clusters/b/@id")
    token_id = api.get("//sys/clusters/b/token/@id")
    attributes = ["id", "type", "key", "path", "parent_id", "count", "value", "token"]
    reads: list[tuple[str, dict[str, Any]]] = [
        (command, {"path": path, **extra})
        for path in ["/", "//", "//sys", "//sys/clusters", "//sys/clusters/b", "//sys/clusters/b/token",
                     f"#{sys_id}", f"#{clusters_id}", f"#{entry_id}", f"#{token_id}", f"#{sys_id}/clusters/b",
                     f"#{entry_id}/token", "//sys/@", "//sys/clusters/b/@", "//sys/clusters/b/token/@"]
        for command, extra in [("get", {}), ("get", {"attributes": attributes}),
                               ("get", {"output_format": "yson"}), ("list", {"attributes": attributes}),
                               ("exists", {})]
    ]
    for command, params in reads:
        resp = api.send(command, params)
        assert SECRET not in resp.text and SECRET not in str(resp.headers), f"{command} {params} leaks the token"
    assert api.get("//sys/clusters/b/token") == "<hidden>"
    assert api.get(f"#{token_id}") == "<hidden>"
    assert api.get("//sys")["clusters"]["b"] == {"proxy_url": "http://127.0.0.1:1", "token": "<hidden>"}
    assert api.get("/")["sys"]["clusters"]["b"]["token"] == "<hidden>"


@pytest.mark.parametrize("change", ["proxy_url", "entry", "entry-without-token", "directory", "by-id"])
def test_a_changed_proxy_url_drops_the_token_and_calls_fail_with_no_credential(tmp_api: Api, listeners, change) -> None:
    api = tmp_api
    old, new = listeners
    api.set("//sys/clusters/b", {"proxy_url": old.url, "token": SECRET})
    replica_id = replica_on_b(api)
    enable(api, replica_id)
    assert old.authorizations == [f"OAuth {SECRET}"]  # the token works while the URL is the same

    if change == "proxy_url":
        api.set("//sys/clusters/b/proxy_url", new.url)
    elif change == "entry":
        api.set("//sys/clusters/b", {"proxy_url": new.url, "token": "<hidden>"})
    elif change == "entry-without-token":
        api.set("//sys/clusters/b", {"proxy_url": new.url})
    elif change == "directory":
        directory = api.get("//sys/clusters")
        directory["b"]["proxy_url"] = new.url
        api.set("//sys/clusters", directory)
    else:
        api.set(f"#{api.get('//sys/clusters/b/@id')}/proxy_url", new.url)

    assert api.get("//sys/clusters/b") == {"proxy_url": new.url}
    assert_refused(enable(api, replica_id), ErrorCode.UNAVAILABLE, "no credential for cluster b")
    assert new.authorizations == [], "the old token was sent to the new URL"

    api.set("//sys/clusters/b/token", "NEW-token")
    enable(api, replica_id)
    assert new.authorizations == ["OAuth NEW-token"]
    assert old.authorizations == [f"OAuth {SECRET}"]


def test_no_client_of_any_kind_is_made_for_a_cluster_without_a_token() -> None:
    # the replicator and 2PC use client(), reads of replicated tables public_client(): neither may call
    # a cluster whose directory entry lost its token
    peers = Peers()
    peers.update(parse_directory({"b": {"proxy_url": "http://127.0.0.1:1"}}))
    with pytest.raises(NoCredential, match="No credential for cluster b"):
        peers.client("b")
    with pytest.raises(NoCredential, match="No credential for cluster b"):
        peers.public_client("b")
    peers.close()


def test_the_masked_token_written_back_keeps_the_token_while_the_url_is_unchanged(tmp_api: Api, listeners) -> None:
    api = tmp_api
    listener, _ = listeners
    api.set("//sys/clusters/b", {"proxy_url": listener.url, "token": SECRET})
    replica_id = replica_on_b(api)
    api.set("//sys/clusters", api.get("//sys/clusters"))  # what get shows, "<hidden>" included
    api.set("//sys/clusters/b/token", "<hidden>")
    api.set("//sys/clusters/b/proxy_url", listener.url + "/")  # the same URL
    assert api.get("//sys/clusters/b/token") == "<hidden>"
    enable(api, replica_id)
    assert listener.authorizations == [f"OAuth {SECRET}"]


def test_a_directory_change_that_would_leave_an_invalid_entry_is_refused(tmp_api: Api) -> None:
    api = tmp_api
    api.set("//sys/clusters/b", {"proxy_url": "http://127.0.0.1:1", "token": SECRET})
    before = api.tree()
    entry_id = api.get("//sys/clusters/b/@id")
    assert_refused(api.send("remove", {"path": "//sys/clusters/b/proxy_url"}), ErrorCode.INVALID_PARAMETER,
                   "//sys/clusters/b/proxy_url must be an http(s) URL")
    assert_refused(api.send("set", {"path": f"#{entry_id}", "input_format": "json"},
                            b'{"proxy_url": "ftp://elsewhere", "token": "x"}'),
                   ErrorCode.INVALID_PARAMETER, "//sys/clusters/b/proxy_url must be an http(s) URL")
    assert api.tree() == before


# -- a refused request changes nothing --------------------------------------------------------------


def _deep_list(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


DEEP_PATH = "//tmp/" + "/".join(["d"] * 600)

#: (command, parameters, body, the start of the error message): requests the tree must refuse whole,
#: with an error naming the command, the object and the reason (and where in the value it lies)
REFUSED = [
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b'"\\ud800"',
                 "Cannot set //tmp/x: string is not valid Unicode (it holds a lone surrogate)",
                 id="set-lone-surrogate"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b'{"a": ["ok", "\\udfff"]}',
                 "Cannot set //tmp/x: string at /a/1 is not valid Unicode", id="set-nested-lone-surrogate"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b'{"\\ud800": 1}',
                 "Cannot set //tmp/x: map key '\\ud800' is not valid Unicode", id="set-lone-surrogate-key"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b"[1000000000000000000000000000000]",
                 "Cannot set //tmp/x: integer 1000000000000000000000000000000 at /0 is out of range [-2^63, 2^64-1]",
                 id="set-integer-1e30"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b"18446744073709551616",
                 "Cannot set //tmp/x: integer 18446744073709551616 is out of range", id="set-integer-above-uint64"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b"-9223372036854775809",
                 "Cannot set //tmp/x: integer -9223372036854775809 is out of range", id="set-integer-below-int64"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "yson"}, b'{a={"$b"=1}}',
                 "Cannot set //tmp/x: map key '$b' at /a starts with \"$\", which is reserved", id="set-dollar-key"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "json"}, b'{"": 1}',
                 "Cannot set //tmp/x: empty map key: a node name cannot be empty", id="set-empty-node-name"),
    pytest.param("set", {"path": "//tmp/$x", "input_format": "json"}, b"1",
                 "Cannot set //tmp/$x: node name '$x' starts with \"$\"", id="set-dollar-node-name"),
    pytest.param("set", {"path": "//tmp/\ud800", "input_format": "json"}, b"1",
                 "Cannot set //tmp/\\ud800: node name '\\ud800' is not valid Unicode",
                 id="set-lone-surrogate-node-name"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "yson"}, _deep_list(200),
                 "Cannot set //tmp/x: depth limit of 128 exceeded", id="set-200-deep-value"),
    pytest.param("set", {"path": "//tmp/x", "input_format": "yson"}, _deep_list(600),
                 "Malformed YSON in request body", id="set-600-deep-value"),
    pytest.param("set", {"path": DEEP_PATH, "input_format": "json", "recursive": True}, b"1",
                 "depth limit of 128 exceeded (the node would be at depth 601)", id="set-600-deep-path"),
    pytest.param("create", {"path": DEEP_PATH, "type": "map_node", "recursive": True}, None,
                 "depth limit of 128 exceeded (the node would be at depth 601)", id="create-600-deep-path"),
    pytest.param("create", {"path": "//tmp/d", "type": "document", "attributes": {"value": {"a": "\ud800"}}}, None,
                 "Cannot create document //tmp/d: string at /value/a is not valid Unicode",
                 id="create-document-lone-surrogate"),
    # in the body: X-YT-Parameters are JSON parsed into doubles, a body keeps the integer
    pytest.param("create", {},
                 b'{"path": "//tmp/m", "type": "map_node", "attributes": {"n": 1000000000000000000000000000000}}',
                 "Cannot create map_node //tmp/m: integer 1000000000000000000000000000000 at /n is out of range",
                 id="create-attribute-integer-1e30"),
    pytest.param("create", {"path": "//tmp/$m", "type": "map_node"}, None,
                 "Cannot create //tmp/$m: node name '$m' starts with \"$\"", id="create-dollar-node-name"),
    pytest.param("set", {"path": "//tmp/t/@bad", "input_format": "json"}, b'"\\ud800"',
                 "Cannot set //tmp/t/@bad: string is not valid Unicode", id="set-attribute-lone-surrogate"),
    pytest.param("set", {"path": "//tmp/t/@bad", "input_format": "yson"}, b'{"$a"=1}',
                 "Cannot set //tmp/t/@bad: map key '$a' starts with \"$\"", id="set-attribute-dollar-key"),
    pytest.param("set", {"path": "//tmp/t/@bad", "input_format": "json"}, b"-9223372036854775809",
                 "Cannot set //tmp/t/@bad: integer -9223372036854775809 is out of range",
                 id="set-attribute-integer-out-of-range"),
    pytest.param("set", {"path": "//tmp/t/@bad", "input_format": "yson"}, _deep_list(200),
                 "Cannot set //tmp/t/@bad: depth limit of 128 exceeded", id="set-attribute-200-deep"),
    pytest.param("set", {"path": "//tmp/t/@\ud800", "input_format": "json"}, b"1",
                 "Cannot set //tmp/t/@\\ud800: attribute name '\\ud800' is not valid Unicode",
                 id="set-attribute-lone-surrogate-name"),
]


def test_a_value_nested_deeper_than_python_recursion_is_refused_by_its_depth() -> None:
    # whatever the request parser lets through, checking a value never recurses past the depth limit
    value: Any = 1
    for _ in range(5000):
        value = [value]
    with pytest.raises(yson_util.InvalidValue, match="depth limit of 128 exceeded"):
        yson_util.checked_python(value)
    assert yson_util.checked_python(json.loads(_deep_list(MAX_DEPTH))) is not None
    assert yson_util.MAX_DEPTH == MAX_DEPTH


def _prepare(api: Api) -> None:
    """What the refused requests run against: a mounted table with a row, a directory, a value."""
    api.ok("create", {"type": "table", "path": "//tmp/t", "attributes": {"dynamic": True, "schema": SCHEMA}})
    api.ok("mount_table", {"path": "//tmp/t"})
    api.ok("insert_rows", {"path": "//tmp/t", "input_format": "json"}, b'{"k": 1, "v": "one"}\n')
    api.set("//tmp/dir/a", {"b": [1, 2.5, "x"]}, recursive=True)


def _still_works(api: Api) -> None:
    """The commands a broken tree used to fail: get, set, and mount (which saves the table's node)."""
    assert api.get("//tmp")["dir"] == {"a": {"b": [1, 2.5, "x"]}}
    api.set("//tmp/after", {"ok": 1})
    assert api.get("//tmp/after/ok") == 1
    api.ok("unmount_table", {"path": "//tmp/t"})
    api.ok("mount_table", {"path": "//tmp/t"})
    rows = api.ok("select_rows", {"query": "* FROM [//tmp/t]", "output_format": "json"}).text
    assert json.loads(rows.splitlines()[0]) == {"k": 1, "v": "one"}
    api.ok("remove", {"path": "//tmp/after", "recursive": True})


@pytest.mark.parametrize("command, params, body, fragment", REFUSED)
def test_a_refused_cypress_request_changes_nothing(tmp_api: Api, command, params, body, fragment) -> None:
    api = tmp_api
    _prepare(api)
    before = api.tree()
    resp = api.send(command, params, body)
    # a value too deep for YSON itself is refused by the request parser
    assert_refused(resp, ErrorCode.PROTOCOL_ERROR if "Malformed YSON" in fragment else ErrorCode.INVALID_PARAMETER,
                   fragment)
    assert api.tree() == before
    _still_works(api)


def test_the_depth_limit_counts_the_node_and_its_value(tmp_api: Api) -> None:
    api = tmp_api
    # //tmp/x is at depth 2: a value nested 126 deep fits, 127 does not
    api.ok("set", {"path": "//tmp/x", "input_format": "yson"}, _deep_list(MAX_DEPTH - 2))
    assert_refused(api.send("set", {"path": "//tmp/y", "input_format": "yson"}, _deep_list(MAX_DEPTH - 1)),
                   ErrorCode.INVALID_PARAMETER, "depth limit of 128")
    path = "//tmp/" + "/".join(["d"] * (MAX_DEPTH - 1))  # the deepest node: at depth 128
    api.ok("create", {"path": path, "type": "map_node", "recursive": True})
    before = api.tree()
    assert_refused(api.send("create", {"path": path + "/one-more", "type": "map_node"}),
                   ErrorCode.INVALID_PARAMETER, "depth limit of 128")
    assert_refused(api.send("set", {"path": path + "/v", "input_format": "json"}, b"1"),
                   ErrorCode.INVALID_PARAMETER, "depth limit of 128")
    assert_refused(api.send("set", {"path": path + "/@a", "input_format": "json"}, b"[1]"),
                   ErrorCode.INVALID_PARAMETER, "depth limit of 128")
    assert api.tree() == before
    # the whole tree, as deep as the limit allows, still comes out of get in both formats
    assert set(api.get("/")["tmp"]) == {"x", "d"}
    assert api.ok("get", {"path": "/", "output_format": "yson", "attributes": ["id"]}).content


def test_replacing_a_map_with_a_mounted_table_inside_removes_nothing(tmp_api: Api) -> None:
    api = tmp_api
    _prepare(api)
    before = api.tree()
    for path in ("/", "//tmp"):
        resp = api.send("set", {"path": path, "input_format": "json"}, b"{}")
        assert_refused(resp, ErrorCode.INVALID_TABLET_STATE, "//tmp/t", "unmount it first")
        assert api.tree() == before
    resp = api.send("set", {"path": "/", "input_format": "json"}, b'{"tmp": {}, "home": {}}')
    assert resp.status_code == 400 and api.tree() == before
    _still_works(api)


def test_refused_replacements_keep_the_replicas_of_the_tables_they_would_remove(tmp_api: Api) -> None:
    # removing a replicated table forgets its replicas; a request refused later must not have removed it
    api = tmp_api
    api.set("//sys/clusters/b", {"proxy_url": "http://127.0.0.1:1", "token": SECRET})
    replica_id = replica_on_b(api)
    _prepare(api)  # //tmp/t, mounted, comes after //tmp/rt
    api.ok("set", {"path": f"#{replica_id}/@note", "input_format": "json"}, b'"text"')
    before = api.tree()
    refused = [
        (api.send("set", {"path": "//tmp", "input_format": "json"}, b"{}"), ErrorCode.INVALID_TABLET_STATE),
        (api.send("create", {"type": "table", "path": "//tmp/rt", "force": True,
                             "attributes": {"dynamic": True, "schema": "not a schema"}}), ErrorCode.INVALID_PARAMETER),
        (api.send("set", {"path": f"#{replica_id}/@note/deeper", "input_format": "json"}, b"1"),
         ErrorCode.INVALID_PARAMETER),
    ]
    for resp, code in refused:
        assert_refused(resp, code)
        assert api.tree() == before
        assert api.get(f"#{replica_id}/@state") == "disabled"
        assert replica_id in api.get("//tmp/rt/@replicas")
        assert api.get(f"#{replica_id}/@note") == "text"


def test_a_value_refused_when_stored_leaves_the_node_as_it_was(tmp_api: Api) -> None:
    # alter_table hands its value to the tree unchecked; the tree refuses what YSON cannot store and
    # puts the node back, so later saves of it (mount) keep working
    api = tmp_api
    api.ok("create", {"type": "table", "path": "//tmp/t", "attributes": {"dynamic": True, "schema": SCHEMA}})
    before = api.tree()
    resp = api.send("alter_table", {"path": "//tmp/t", "upstream_replica_id": "\ud800"})
    assert_refused(resp, ErrorCode.INVALID_PARAMETER, "cannot store node //tmp/t", "lone surrogate")
    assert api.tree() == before
    api.ok("mount_table", {"path": "//tmp/t"})
    api.ok("unmount_table", {"path": "//tmp/t"})
    api.ok("set", {"path": "//tmp/t/@note", "input_format": "json"}, b'"saved"')
    assert api.get("//tmp/t/@note") == "saved"


def test_a_create_that_fails_in_sql_half_way_leaves_the_tree_as_it_was(tmp_api: Api) -> None:
    # SQL column names are case-insensitive: "v" and "V" pass the schema checks but not CREATE TABLE, which
    # runs after the new directories and the table's node were made, or after a forced create removed the
    # node it replaces (reported separately: such a schema should be refused up front with a 400)
    api = tmp_api
    api.set("//tmp/old", {"child": [1, 2]})
    before = api.tree()
    schema = [*SCHEMA, {"name": "V", "type": "string"}]
    for params in ({"path": "//tmp/new/dir/t", "recursive": True}, {"path": "//tmp/old", "force": True}):
        resp = api.send("create", {"type": "table", "attributes": {"dynamic": True, "schema": schema}, **params})
        assert resp.status_code >= 400, resp.text
        assert api.tree() == before
    assert api.send("exists", {"path": "//tmp/new"}).json()["value"] is False
    assert api.get("//tmp/old") == {"child": [1, 2]}
    api.ok("create", {"type": "table", "path": "//tmp/new/dir/t", "recursive": True,
                      "attributes": {"dynamic": True, "schema": SCHEMA}})
    api.ok("create", {"type": "table", "path": "//tmp/old", "force": True,
                      "attributes": {"dynamic": True, "schema": SCHEMA}})


def test_a_tree_after_refused_requests_is_the_same_after_a_restart(tmp_path: Path) -> None:
    engine = EngineProcess("restart", tmp_path / "restart").start()
    api = Api(engine)
    try:
        _prepare(api)
        api.set("//sys/clusters/b", {"proxy_url": "http://127.0.0.1:1", "token": SECRET})
        api.ok("set", {"path": "//tmp/doubles", "input_format": "yson"}, b"[1e30; -1e-30; %nan; %inf]")
        for param in REFUSED:
            command, params, body, _ = param.values
            api.send(command, params, body)
        api.send("create", {"type": "table", "path": "//tmp/new/t", "recursive": True, "attributes": {
            "dynamic": True, "schema": [*SCHEMA, {"name": "V", "type": "string"}]}})
        api.send("set", {"path": "/", "input_format": "json"}, b"{}")
        before = api.tree()
        engine.stop()
        engine.start()
        assert api.tree() == before
        assert api.get("//sys/clusters/b/token") == "<hidden>"
        doubles = api.ok("get", {"path": "//tmp/doubles", "output_format": "yson"}).content
        assert doubles == b'{"value"=[1e+30;-1e-30;%nan;%inf;];}'

        _still_works(api)
    finally:
        api.close()
        engine.stop()


def test_a_refused_alter_table_leaves_the_table_accepting_direct_writes(tmp_api: Api) -> None:
    """An upstream_replica_id that cannot be stored is refused, and the table is no replica table."""
    tmp_api.ok("create", {"type": "table", "path": "//tmp/plain",
                          "attributes": {"dynamic": True, "schema": SCHEMA}})
    resp = tmp_api.send("alter_table", {"path": "//tmp/plain", "upstream_replica_id": "bad\ud800id"})
    assert 400 <= resp.status_code < 500, resp.text
    tmp_api.ok("mount_table", {"path": "//tmp/plain"})
    # a replica table would refuse this direct write (UpstreamReplicaMismatch)
    tmp_api.ok("insert_rows", {"path": "//tmp/plain", "input_format": "json"}, b'{"k": 1, "v": "direct"}')
