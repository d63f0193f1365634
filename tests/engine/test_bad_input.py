"""Bad input over real HTTP: every malformed request gets a clear YT error, a 4xx status, and changes nothing.

The product rule: "Bad input (malformed requests, schema violations, ...) gets a clear YT-style error
that names the object and the reason, HTTP 4xx, and leaves nothing half-applied. No request can
produce a 500." Each test sends raw bytes with httpx to one shared engine process (tables get unique
paths), checks the status, the error in both the JSON body and the ``X-YT-Error`` header (code,
message naming the object and the reason), and then reads the table back to prove nothing was applied.
"""

from __future__ import annotations

import gzip
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yt.yson as yson

from reptables.engine.errors import ErrorCode
from reptables.engine.timestamps import COUNTER_BITS, MAX_TIMESTAMP
from reptables.testing import EngineProcess

SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "s", "type": "string"},
    {"name": "i", "type": "int64"},
    {"name": "b", "type": "boolean"},
    {"name": "d", "type": "double"},
    {"name": "u", "type": "uint64"},
    {"name": "a", "type": "any"},
]
REQUIRED_SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "v", "type": "string", "required": True},
]
COMPOSITE_SCHEMA = [
    {"name": "k1", "type": "int64", "sort_order": "ascending"},
    {"name": "k2", "type": "string", "sort_order": "ascending"},
    {"name": "v", "type": "string"},
]
ORDERED_SCHEMA = [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}]

#: the row every sorted test table starts with; "nothing applied" means the table still holds exactly this
BASELINE = {"k": -1, "s": "baseline"}
#: 999 good rows: a batch with one bad row appended must leave no trace of them
GOOD_ROWS = [{"k": n, "s": f"row {n}", "i": n} for n in range(999)]

MIB = 1024 * 1024


# -- plumbing -----------------------------------------------------------------------------------------


class Api:
    """Raw HTTP access to one engine: we build every header and byte ourselves."""

    def __init__(self, engine: EngineProcess) -> None:
        self.engine = engine
        self.http = httpx.Client(base_url=engine.url, timeout=60)

    def close(self) -> None:
        self.http.close()

    def send(self, command: str, params: dict[str, Any] | None = None, body: bytes | None = None, *,
             headers: dict[str, str] | None = None, auth: bool = True, raw_params: str | None = None,
             method: str = "POST") -> httpx.Response:
        h: dict[str, str] = {"X-YT-Header-Format": "json"}
        if auth:
            h["Authorization"] = f"OAuth {self.engine.token}"
        if raw_params is not None:
            h["X-YT-Parameters"] = raw_params
        elif params is not None:
            h["X-YT-Parameters"] = json.dumps(params)
        h.update(headers or {})
        try:
            return self.http.request(method, f"/api/v4/{command}", headers=h, content=body)
        except httpx.RemoteProtocolError as exc:
            alive = self.engine.proc is not None and self.engine.proc.poll() is None
            pytest.fail(f"the engine closed the connection without any HTTP response ({exc}; engine process "
                        f"{'still running' if alive else 'died'}) for {command} with X-YT-Parameters "
                        f"{h.get('X-YT-Parameters', '')[:300]!r} and body {(body or b'')[-200:]!r}")

    def ok(self, command: str, params: dict[str, Any] | None = None, body: bytes | None = None) -> httpx.Response:
        resp = self.send(command, params, body)
        assert resp.status_code == 200, f"{command} {params} failed: {resp.status_code} {resp.text[:1000]}"
        return resp

    # -- higher-level helpers (all go through the same raw requests) --

    def create_table(self, schema: list[dict[str, Any]] = SCHEMA, *, mount: bool = True,
                     rows: list[dict[str, Any]] | None = None, **attributes: Any) -> str:
        path = f"//tmp/bad_input/t_{uuid.uuid4().hex[:12]}"
        self.ok("create", {"type": "table", "path": path, "recursive": True,
                           "attributes": {"dynamic": True, "schema": schema, **attributes}})
        if mount or rows:
            self.ok("mount_table", {"path": path})
            if rows:
                self.insert(path, rows)
            if not mount:
                self.ok("unmount_table", {"path": path})
        return path

    def insert(self, path: str, rows: list[Any], **params: Any) -> None:
        self.ok("insert_rows", {"path": path, "input_format": "json", **params}, json_lines(rows))

    def select_all(self, path: str) -> list[dict[str, Any]]:
        resp = self.ok("select_rows", {"query": f"* FROM [{path}]", "output_format": "json"})
        return [json.loads(line) for line in resp.text.splitlines() if line.strip()]

    def keys(self, path: str, key: str = "k") -> list[Any]:
        return [row[key] for row in self.select_all(path)]

    def exists(self, path: str) -> bool:
        return self.ok("exists", {"path": path}).json()["value"]

    def get(self, path: str) -> Any:
        return self.ok("get", {"path": path}).json()["value"]

    def start_tx(self, **params: Any) -> str:
        return self.ok("start_transaction", {"type": "tablet", **params}).json()["transaction_id"]


def json_lines(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _codes(error: dict[str, Any]) -> list[int]:
    return [error.get("code")] + [c for inner in error.get("inner_errors") or [] for c in _codes(inner)]


def _messages(error: dict[str, Any]) -> str:
    return "\n".join([str(error.get("message", ""))] + [_messages(e) for e in error.get("inner_errors") or []])


def assert_yt_error(resp: httpx.Response, code: int | tuple[int, ...], *fragments: str,
                    status: int | None = None) -> dict[str, Any]:
    """A 4xx answer whose JSON body and X-YT-Error header carry the same YT error with ``code``
    (at the top or among the inner errors) and whose messages mention every fragment."""
    context = f"{resp.request.method} {resp.request.url} -> {resp.status_code} {resp.text[:1500]!r}"
    assert 400 <= resp.status_code < 500, f"expected a 4xx status: {context}"
    if status is not None:
        assert resp.status_code == status, context
    try:
        body = resp.json()
    except ValueError:
        pytest.fail(f"the body is not a JSON YT error: {context}")
    assert "X-YT-Error" in resp.headers, f"no X-YT-Error header: {context}"
    assert json.loads(resp.headers["X-YT-Error"]) == body, context
    assert isinstance(body, dict) and isinstance(body.get("code"), int), context
    assert isinstance(body.get("message"), str) and body["message"].strip(), context
    expected = code if isinstance(code, tuple) else (code,)
    assert set(expected) & set(_codes(body)), f"expected code {expected}, got {_codes(body)}: {context}"
    text = _messages(body)
    for fragment in fragments:
        assert fragment.lower() in text.lower(), f"message does not mention {fragment!r}: {context}"
    return body


@pytest.fixture(scope="module")
def api(shared_engine: EngineProcess) -> Iterator[Api]:
    a = Api(shared_engine)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def table(api: Api) -> str:
    """A mounted sorted table holding only BASELINE."""
    return api.create_table(rows=[BASELINE])


def assert_unchanged(api: Api, path: str) -> None:
    rows = api.select_all(path)
    assert [r["k"] for r in rows] == [BASELINE["k"]], f"{path} changed: {rows[:5]}... ({len(rows)} rows)"
    assert rows[0]["s"] == BASELINE["s"]


# -- 1. malformed bodies and parameters ----------------------------------------------------------------


@pytest.mark.parametrize("tail", [
    pytest.param(b'{"k": 1000, "s": ', id="truncated-object"),
    pytest.param(b'{"k": 1000 "s": "x"}', id="missing-comma"),
    pytest.param(b"{'k': 1000}", id="single-quotes"),
])
def test_malformed_json_line_rejects_the_whole_batch(api, table, tail):
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, json_lines(GOOD_ROWS) + tail)
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "Malformed JSON", "line 1000")
    assert_unchanged(api, table)


def test_malformed_json_array_body_is_a_protocol_error(api, table):
    body = b"[" + b",".join(json.dumps(r).encode() for r in GOOD_ROWS) + b', {"k": 1000'
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, body)
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "Malformed JSON", "request body")
    assert_unchanged(api, table)


def test_json_body_that_is_not_utf8_is_a_protocol_error(api, table):
    body = json_lines(GOOD_ROWS) + b'{"k": 1000, "s": "\xff\xfe"}\n'
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, body)
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "UTF-8", "request body")
    assert_unchanged(api, table)


@pytest.mark.parametrize("tail", [
    pytest.param(b"{k=1000;s=", id="truncated-map"),
    pytest.param(b"{k=1000;s=\"x\"", id="unclosed-map"),
    pytest.param(b"{k=1000 s=x}", id="missing-separator"),
    pytest.param(b"{k=]}", id="stray-bracket"),
])
def test_malformed_yson_body_rejects_the_whole_batch(api, table, tail):
    good = b"".join(b'{k=%d;s="row %d"};' % (n, n) for n in range(999))
    resp = api.send("insert_rows", {"path": table, "input_format": "yson"}, good + tail)
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "Malformed YSON")
    assert_unchanged(api, table)


@pytest.mark.parametrize(("header_format", "raw"), [
    pytest.param("json", '{"path": "//tmp/x", "input_format": "json"', id="json-truncated"),
    pytest.param("json", "path=//tmp/x", id="json-garbage"),
    pytest.param("json", "{'path': '//tmp/x'}", id="json-single-quotes"),
    pytest.param("yson", "{path=//tmp/x;input_format=json", id="yson-truncated"),
    pytest.param("yson", '{path="//tmp/x}', id="yson-unterminated-string"),
    pytest.param("yson", "{path=;}", id="yson-missing-value"),
])
def test_malformed_parameters_header_is_a_protocol_error(api, table, header_format, raw):
    raw = raw.replace("//tmp/x", table)
    resp = api.send("insert_rows", body=json_lines([{"k": 5, "s": "x"}]), raw_params=raw,
                    headers={"X-YT-Header-Format": header_format})
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "X-YT-Parameters", header_format)
    assert_unchanged(api, table)


@pytest.mark.parametrize("raw", [
    pytest.param('["//tmp/x"]', id="list"),
    pytest.param('"//tmp/x"', id="string"),
    pytest.param("42", id="number"),
])
def test_parameters_header_that_is_not_a_map_is_a_protocol_error(api, table, raw):
    resp = api.send("insert_rows", body=json_lines([{"k": 5, "s": "x"}]), raw_params=raw.replace("//tmp/x", table))
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "X-YT-Parameters", "map")
    assert_unchanged(api, table)


@pytest.mark.parametrize(("input_format", "body"), [
    pytest.param("json", b"42", id="json-number"),
    pytest.param("json", b'"rows"', id="json-string"),
    pytest.param("json", b"null", id="json-null"),
    pytest.param("json", b"true", id="json-bool"),
    pytest.param("json", b"[1, 2, 3]", id="json-list-of-numbers"),
    pytest.param("yson", b"42", id="yson-number"),
    pytest.param("yson", b'"rows"', id="yson-string"),
])
def test_body_of_scalars_instead_of_rows_is_rejected(api, table, input_format, body):
    resp = api.send("insert_rows", {"path": table, "input_format": input_format}, body)
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, "must be a map")
    assert_unchanged(api, table)


# -- 2. unknown commands and paths --------------------------------------------------------------------


@pytest.mark.parametrize("auth", [True, False], ids=["with-token", "without-token"])
def test_unknown_command_is_404_with_code_103(api, auth):
    resp = api.send("no_such_command", {}, auth=auth)
    assert_yt_error(resp, ErrorCode.NO_SUCH_METHOD, "no_such_command", status=404)


def _path_request(api: Api, command: str, path: str) -> httpx.Response:
    if command == "get":
        return api.send("get", {"path": path})
    if command == "insert_rows":
        return api.send("insert_rows", {"path": path, "input_format": "json"}, json_lines([{"k": 1, "s": "x"}]))
    if command == "lookup_rows":
        return api.send("lookup_rows", {"path": path, "input_format": "json", "output_format": "json"},
                        json_lines([{"k": 1}]))
    assert command == "select_rows"
    return api.send("select_rows", {"query": f"* FROM [{path}]", "output_format": "json"})


PATH_COMMANDS = ["get", "insert_rows", "lookup_rows", "select_rows"]


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_unknown_path_is_a_resolve_error(api, command):
    path = f"//tmp/bad_input/no_such_table_{uuid.uuid4().hex[:8]}"
    api.ok("create", {"type": "map_node", "path": "//tmp/bad_input", "recursive": True, "ignore_existing": True})
    resp = _path_request(api, command, path)
    body = assert_yt_error(resp, ErrorCode.RESOLVE_ERROR, path.rsplit("/", 1)[1])
    assert "does not exist" in body["message"] or "has no child" in body["message"], body
    assert body["attributes"].get("path") == path or path in body["message"], body
    assert not api.exists(path)


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_unknown_object_id_is_a_resolve_error(api, command):
    resp = _path_request(api, command, "#1-2-3-4")
    assert_yt_error(resp, ErrorCode.RESOLVE_ERROR, "#1-2-3-4")


def test_path_under_a_missing_directory_names_the_existing_parent_and_the_missing_child(api):
    missing = f"no_such_dir_{uuid.uuid4().hex[:8]}"
    resp = api.send("get", {"path": f"//tmp/{missing}/t"})
    body = assert_yt_error(resp, ErrorCode.RESOLVE_ERROR, missing)
    message = body["message"]
    # YT says: Node //tmp has no child with key "<missing>"; claiming that //tmp/<missing> exists is wrong
    assert f"//tmp/{missing} has no child" not in message, message
    assert "//tmp has no child" in message or f"//tmp/{missing}/t" in message, message


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_unknown_path_with_a_newline_still_gets_an_error_response(api, command):
    path = f"//tmp/no_such\nnode_{uuid.uuid4().hex[:8]}"
    resp = _path_request(api, command, path)
    assert_yt_error(resp, ErrorCode.RESOLVE_ERROR)


@pytest.mark.parametrize("command", ["get", "insert_rows", "lookup_rows"])
@pytest.mark.parametrize(("path", "reason"), [
    pytest.param("tmp/t", "must start with", id="relative"),
    pytest.param("/tmp/t", "must start with", id="single-slash"),
    pytest.param("", "empty", id="empty"),
    pytest.param("#", "empty object id", id="bare-hash"),
    pytest.param("//tmp//t", "empty path segment", id="empty-segment"),
])
def test_malformed_path_is_rejected(api, command, path, reason):
    resp = _path_request(api, command, path)
    assert_yt_error(resp, ErrorCode.RESOLVE_ERROR, reason)


@pytest.mark.parametrize("command", ["get", "insert_rows", "lookup_rows", "mount_table", "remove"])
def test_missing_path_parameter_is_rejected(api, command):
    resp = api.send(command, {"input_format": "json"}, json_lines([{"k": 1}]) if "rows" in command else None)
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, '"path"')


def test_insert_rows_into_an_attribute_path_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": f"{table}/@schema", "input_format": "json"},
                    json_lines([{"k": 7, "s": "through an attribute path"}]))
    assert_yt_error(resp, (ErrorCode.RESOLVE_ERROR, ErrorCode.INVALID_PARAMETER), f"{table}/@schema")
    assert_unchanged(api, table)


# -- 3. schema violations -----------------------------------------------------------------------------


@pytest.mark.parametrize(("column", "value", "column_type"), [
    pytest.param("i", "12", "int64", id="string-into-int64"),
    pytest.param("i", 1.5, "int64", id="float-into-int64"),
    pytest.param("i", True, "int64", id="bool-into-int64"),
    pytest.param("i", [1], "int64", id="list-into-int64"),
    pytest.param("i", 2**63, "int64", id="int64-overflow"),
    pytest.param("b", 1, "boolean", id="int-into-boolean"),
    pytest.param("b", "true", "boolean", id="string-into-boolean"),
    pytest.param("s", 5, "string", id="int-into-string"),
    pytest.param("s", {"x": 1}, "string", id="map-into-string"),
    pytest.param("d", "1.0", "double", id="string-into-double"),
    pytest.param("u", -1, "uint64", id="negative-into-uint64"),
    pytest.param("k", "1000", "int64", id="string-into-int64-key"),
])
def test_insert_of_a_wrongly_typed_value_rejects_the_whole_batch(api, table, column, value, column_type):
    bad = {"k": 1000, "s": "bad", column: value}
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, json_lines([*GOOD_ROWS, bad]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, f"'{column}'", column_type)
    assert_unchanged(api, table)


def test_insert_without_a_key_column_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": table, "input_format": "json"},
                    json_lines([*GOOD_ROWS, {"s": "no key"}]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, "'k'", "missing key column")
    assert_unchanged(api, table)


def test_insert_of_an_unknown_column_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": table, "input_format": "json"},
                    json_lines([*GOOD_ROWS, {"k": 1000, "no_such_column": 1}]))
    assert_yt_error(resp, ErrorCode.COLUMN_NOT_FOUND, table, "'no_such_column'", "not found")
    assert_unchanged(api, table)


@pytest.mark.parametrize("input_format", ["json", "yson"])
def test_insert_of_nan_is_rejected_not_stored_as_null(api, table, input_format):
    """SQL storage has no NaN (SQLite would keep a null): the row is refused, naming the column."""
    rows = [*GOOD_ROWS, {"k": 1000, "d": float("nan")}]
    body = json_lines(rows) if input_format == "json" else yson.dumps(rows, yson_type="list_fragment")
    resp = api.send("insert_rows", {"path": table, "input_format": input_format}, body)
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, "NaN is not allowed in column 'd'")
    assert_unchanged(api, table)


@pytest.mark.parametrize("bad", [
    pytest.param({"k": 1000, "v": None}, id="explicit-null"),
    pytest.param({"k": 1000}, id="absent"),
])
def test_insert_without_a_value_for_a_required_column_is_rejected(api, bad):
    path = api.create_table(REQUIRED_SCHEMA, rows=[{"k": -1, "v": "baseline"}])
    good = [{"k": n, "v": str(n)} for n in range(999)]
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, json_lines([*good, bad]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, path, "required column 'v'")
    assert api.keys(path) == [-1]


@pytest.mark.parametrize("command", ["insert_rows", "delete_rows"])
def test_null_key_is_rejected(api, table, command):
    rows = [{"k": -1}] if command == "delete_rows" else GOOD_ROWS
    resp = api.send(command, {"path": table, "input_format": "json"}, json_lines([*rows, {"k": None}]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, "'k'", "null")
    assert_unchanged(api, table)


def test_delete_rows_with_a_non_key_column_is_rejected(api, table):
    resp = api.send("delete_rows", {"path": table, "input_format": "json"},
                    json_lines([{"k": -1}, {"k": 5, "s": "not a key"}]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, table, "'s'", "not a key column")
    assert_unchanged(api, table)


@pytest.mark.parametrize(("keys", "column"), [
    pytest.param([{"k1": 1, "k2": "a"}, {"k1": 1}], "'k2'", id="second-key-column-missing"),
    pytest.param([{"k2": "a"}], "'k1'", id="first-key-column-missing"),
    pytest.param([{}], "'k1'", id="empty-key"),
])
def test_lookup_with_a_missing_key_column_is_rejected(api, keys, column):
    path = api.create_table(COMPOSITE_SCHEMA, rows=[{"k1": 1, "k2": "a", "v": "x"}])
    resp = api.send("lookup_rows", {"path": path, "input_format": "json", "output_format": "json"},
                    json_lines(keys))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, path, column, "missing key column")


def test_lookup_with_a_non_key_column_is_rejected(api):
    path = api.create_table(COMPOSITE_SCHEMA, rows=[{"k1": 1, "k2": "a", "v": "x"}])
    resp = api.send("lookup_rows", {"path": path, "input_format": "json", "output_format": "json"},
                    json_lines([{"k1": 1, "k2": "a", "v": "x"}]))
    assert_yt_error(resp, ErrorCode.SCHEMA_VIOLATION, path, "'v'", "not a key column")


@pytest.mark.parametrize("tablet_index", ["x", 1.5, -1, 7])
def test_insert_into_ordered_table_with_a_bad_tablet_index_is_rejected(api, tablet_index):
    path = api.create_table(ORDERED_SCHEMA, tablet_count=2)
    rows = [{"a": n} for n in range(10)] + [{"a": 10, "$tablet_index": tablet_index}]
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, json_lines(rows))
    body = assert_yt_error(resp, (ErrorCode.NO_SUCH_TABLET, ErrorCode.SCHEMA_VIOLATION, ErrorCode.INVALID_PARAMETER),
                           "$tablet_index", str(tablet_index))
    assert body["code"] != ErrorCode.GENERIC
    assert api.select_all(path) == []


# -- 4. row weight ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    pytest.param("x" * (17 * MIB), id="17-MiB-ascii"),
    pytest.param("\u20ac" * (6 * MIB), id="18-MiB-of-utf8-in-6-Mi-characters"),
    pytest.param(None, id="two-9-MiB-columns"),
])
def test_row_over_16_mib_is_rejected_with_the_row_weight_limit(api, table, value):
    big = {"k": 1000, "s": "y" * (9 * MIB), "a": "z" * (9 * MIB)} if value is None else {"k": 1000, "s": value}
    resp = api.send("insert_rows", {"path": table, "input_format": "json"},
                    json_lines([{"k": 1, "s": "small"}, big]))
    assert_yt_error(resp, ErrorCode.ROW_WEIGHT_LIMIT_EXCEEDED, table, "too large")
    assert_unchanged(api, table)


# -- 5. select_rows -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "reason"), [
    pytest.param("", "empty", id="empty"),
    pytest.param("* FROM", "unexpected end of query", id="no-table"),
    pytest.param("k FROM [{t}] WHERE", "unexpected end of query", id="dangling-where"),
    pytest.param("k FRM [{t}]", 'unexpected "FRM"', id="misspelled-from"),
    pytest.param("k, FROM [{t}]", 'unexpected "FROM"', id="trailing-comma"),
    pytest.param("k FROM [{t}] WHERE (k = 1", "expected one of", id="unbalanced-parenthesis"),
    pytest.param("k FROM [{t}] WHERE s = 'abc", "unexpected character", id="unterminated-string"),
    pytest.param("k FROM [{t}] LIMIT many", 'unexpected "many"', id="limit-not-a-number"),
    pytest.param("k FROM [{t}] WHERE k = = 1", 'unexpected "="', id="double-operator"),
    pytest.param("k FROM [{t}] LIMIT 99999999999999999999999", "out of int64 range", id="limit-overflow"),
    pytest.param("k\nFRM [{t}]", 'unexpected "FRM"', id="multi-line-query"),
])
def test_select_with_a_syntax_error_is_rejected(api, table, query, reason):
    resp = api.send("select_rows", {"query": query.replace("{t}", table), "output_format": "json"})
    assert_yt_error(resp, ErrorCode.QUERY_SYNTAX_ERROR, "Error while parsing query" if query else "empty", reason)


@pytest.mark.parametrize("query", [
    pytest.param("no_such_column FROM [{t}]", id="in-projection"),
    pytest.param("k FROM [{t}] WHERE no_such_column = 1", id="in-where"),
    pytest.param("k FROM [{t}] GROUP BY no_such_column", id="in-group-by"),
])
def test_select_of_an_unknown_column_is_rejected(api, table, query):
    resp = api.send("select_rows", {"query": query.replace("{t}", table), "output_format": "json"})
    assert_yt_error(resp, ErrorCode.COLUMN_NOT_FOUND, "no_such_column")


@pytest.mark.parametrize("clause", ["ORDER BY k", "OFFSET 3"])
def test_select_with_order_by_or_offset_without_limit_is_rejected(api, table, clause):
    resp = api.send("select_rows", {"query": f"k FROM [{table}] {clause}", "output_format": "json"})
    assert_yt_error(resp, ErrorCode.QUERY_SYNTAX_ERROR, clause.split()[0], "without LIMIT")


@pytest.mark.parametrize("query", [
    pytest.param("k FROM [{t}] WHERE k = 'a'", id="int-equals-string"),
    pytest.param("k FROM [{t}] WHERE s", id="where-not-boolean"),
    pytest.param("k + s FROM [{t}]", id="int-plus-string"),
    pytest.param("k FROM [{t}]\nWHERE k =\n'a'", id="multi-line-int-equals-string"),
])
def test_select_with_a_type_error_is_rejected(api, table, query):
    resp = api.send("select_rows", {"query": query.replace("{t}", table), "output_format": "json"})
    assert_yt_error(resp, ErrorCode.QUERY_SYNTAX_ERROR)


@pytest.mark.parametrize("target", ["//tmp", "//tmp/bad_input/doc"])
def test_select_from_a_path_that_is_not_a_table_is_rejected(api, target):
    if target.endswith("doc"):
        api.ok("set", {"path": target, "recursive": True}, b'"a string node"')
    resp = api.send("select_rows", {"query": f"* FROM [{target}]", "output_format": "json"})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, target, "not a dynamic table")


def test_select_without_a_query_is_rejected(api):
    resp = api.send("select_rows", {"output_format": "json"})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, '"query"')


def _assert_not_5xx(resp: httpx.Response) -> None:
    """A query the database cannot evaluate is the user's problem: a result or a 4xx, never
    503 "storage unavailable" (which clients retry forever) or any other 5xx."""
    if resp.status_code == 200:
        return
    body = assert_yt_error(resp, tuple(c for c in ErrorCode if c not in (ErrorCode.UNAVAILABLE, ErrorCode.GENERIC)))
    assert "unavailable" not in body["message"].lower(), body


def test_select_whose_sum_overflows_int64_does_not_answer_5xx(api):
    path = api.create_table(rows=[{"k": 1, "i": 2**62}, {"k": 2, "i": 2**62}])
    _assert_not_5xx(api.send("select_rows", {"query": f"sum(i) AS total FROM [{path}] GROUP BY 1",
                                             "output_format": "json"}))


def test_select_with_an_expression_too_deep_for_the_database_does_not_answer_5xx(api, table):
    where = " OR ".join(f"k = {n}" for n in range(3000))
    _assert_not_5xx(api.send("select_rows", {"query": f"k FROM [{table}] WHERE {where}", "output_format": "json"}))


# -- 6. tablet state ----------------------------------------------------------------------------------


def _write(api: Api, command: str, path: str) -> httpx.Response:
    rows = [{"k": -1}] if command == "delete_rows" else GOOD_ROWS
    return api.send(command, {"path": path, "input_format": "json"}, json_lines(rows))


@pytest.mark.parametrize("command", ["insert_rows", "delete_rows"])
def test_write_to_an_unmounted_table_is_rejected(api, table, command):
    api.ok("unmount_table", {"path": table})
    resp = _write(api, command, table)
    assert_yt_error(resp, ErrorCode.TABLET_NOT_MOUNTED, table, "not mounted")
    api.ok("mount_table", {"path": table})
    assert_unchanged(api, table)


@pytest.mark.parametrize("command", ["insert_rows", "delete_rows"])
def test_write_to_a_frozen_table_is_rejected(api, table, command):
    api.ok("freeze_table", {"path": table})
    resp = _write(api, command, table)
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, table, "frozen")
    api.ok("unfreeze_table", {"path": table})
    assert_unchanged(api, table)


@pytest.mark.parametrize("command", ["lookup_rows", "select_rows"])
def test_read_from_an_unmounted_table_is_rejected(api, table, command):
    api.ok("unmount_table", {"path": table})
    resp = _path_request(api, command, table)
    assert_yt_error(resp, ErrorCode.TABLET_NOT_MOUNTED, table, "not mounted")


@pytest.mark.parametrize("change", ["freeze_table", "unmount_table"])
def test_commit_after_the_table_left_the_mounted_state_is_rejected(api, table, change):
    tx = api.start_tx()
    api.insert(table, GOOD_ROWS, transaction_id=tx)
    api.ok(change, {"path": table})
    resp = api.send("commit_transaction", {"transaction_id": tx})
    code = ErrorCode.INVALID_TABLET_STATE if change == "freeze_table" else ErrorCode.TABLET_NOT_MOUNTED
    assert_yt_error(resp, code, table)
    api.ok("unfreeze_table" if change == "freeze_table" else "mount_table", {"path": table})
    assert_unchanged(api, table)


# -- 7. timestamps ------------------------------------------------------------------------------------


def _future_timestamp() -> int:
    return int(time.time() + 3600) << COUNTER_BITS


@pytest.mark.parametrize("command", ["lookup_rows", "select_rows"])
@pytest.mark.parametrize("timestamp", [
    pytest.param(-1, id="negative"),
    pytest.param("abc", id="string"),
    pytest.param("1234567890123", id="numeric-string"),
    pytest.param(0, id="zero"),
    pytest.param((1 << COUNTER_BITS) - 1, id="below-min"),
    pytest.param(1.5, id="float"),
    pytest.param(True, id="boolean"),
    pytest.param([1], id="list"),
    pytest.param("future", id="one-hour-ahead"),
    pytest.param(MAX_TIMESTAMP + 2, id="above-max"),
    pytest.param(2**64, id="above-uint64"),
    pytest.param(2**70, id="far-above-uint64"),
])
def test_bad_read_timestamp_is_rejected(api, table, command, timestamp):
    if timestamp == "future":
        timestamp = _future_timestamp()
    params: dict[str, Any] = {"timestamp": timestamp, "output_format": "json"}
    if command == "lookup_rows":
        resp = api.send("lookup_rows", {"path": table, "input_format": "json", **params}, json_lines([{"k": -1}]))
    else:
        resp = api.send("select_rows", {"query": f"* FROM [{table}]", **params})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, "timestamp")


# -- 8. authentication --------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [
    pytest.param(None, id="missing"),
    pytest.param("OAuth wrong-token-9876543210", id="wrong-token"),
    pytest.param("OAuth {token}x", id="token-with-suffix"),
    pytest.param("OAuth {token_prefix}", id="token-prefix"),
    pytest.param("OAuth", id="scheme-without-token"),
    pytest.param("OAuth{token}", id="no-space"),
    pytest.param("Basic {token}", id="wrong-scheme"),
    pytest.param("{token}", id="token-without-scheme"),
    pytest.param("", id="empty"),
])
def test_bad_credentials_are_rejected_with_401_and_never_echoed(api, table, authorization):
    token = api.engine.token
    headers = {}
    if authorization is not None:
        headers["Authorization"] = authorization.format(token=token, token_prefix=token[:-3])
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, json_lines([{"k": 5, "s": "x"}]),
                    headers=headers, auth=False)
    assert_yt_error(resp, ErrorCode.AUTHENTICATION_ERROR, "Authentication failed", status=401)
    sent = {token, token[:-3], "wrong-token-9876543210"}
    everything = resp.text + json.dumps(dict(resp.headers))
    for secret in sent:
        assert secret not in everything, f"response echoes {secret!r}: {everything[:1000]}"
    assert_unchanged(api, table)


# -- 9. create ----------------------------------------------------------------------------------------


def _new_path() -> str:
    return f"//tmp/bad_input/new_{uuid.uuid4().hex[:12]}"


def _create(api: Api, path: str, attributes: Any, type: str = "table", **params: Any) -> httpx.Response:
    return api.send("create", {"type": type, "path": path, "recursive": True, "attributes": attributes, **params})


@pytest.mark.parametrize("attributes", [
    pytest.param({"schema": SCHEMA}, id="no-dynamic-attribute"),
    pytest.param({"schema": SCHEMA, "dynamic": False}, id="dynamic-false"),
])
def test_create_of_a_static_table_is_rejected(api, attributes):
    path = _new_path()
    assert_yt_error(_create(api, path, attributes), ErrorCode.INVALID_PARAMETER, path, "dynamic")
    assert not api.exists(path)


def test_create_of_a_dynamic_table_without_schema_is_rejected(api):
    path = _new_path()
    assert_yt_error(_create(api, path, {"dynamic": True}), ErrorCode.INVALID_PARAMETER, path, '"schema"')
    assert not api.exists(path)


KEY = {"name": "k", "type": "int64", "sort_order": "ascending"}
VALUE = {"name": "v", "type": "string"}


@pytest.mark.parametrize(("schema", "reason"), [
    pytest.param([KEY, {"name": "v", "type": "int128"}], "'int128'", id="unknown-type"),
    pytest.param([KEY, {"name": "v"}], "unsupported type", id="no-type"),
    pytest.param([KEY, VALUE, {"name": "v", "type": "int64"}], "duplicate column 'v'", id="duplicate-column"),
    pytest.param([KEY, VALUE, {"name": "V", "type": "int64"}], "duplicate column 'V'", id="duplicate-column-in-case"),
    pytest.param([KEY, VALUE, {"name": "_RT_TS", "type": "int64"}], "is reserved", id="reserved-prefix-in-case"),
    pytest.param([KEY, VALUE, {"name": "k2", "type": "int64", "sort_order": "ascending"}], "'k2'",
                 id="key-after-value"),
    pytest.param([KEY, {"name": "_rt_x", "type": "string"}], "'_rt_x'", id="reserved-prefix"),
    pytest.param([KEY, {"name": "$x", "type": "string"}], "'$x'", id="system-column-name"),
    pytest.param([KEY, {"type": "string"}], "no name", id="column-without-name"),
    pytest.param([KEY, "v"], "not a map", id="column-not-a-map"),
    pytest.param([], "non-empty list", id="empty"),
    pytest.param("k int64", "non-empty list", id="not-a-list"),
    pytest.param([{"name": "k", "type": "any", "sort_order": "ascending"}, VALUE], "any", id="any-key"),
    pytest.param([{"name": "k", "type": "int64", "sort_order": "sideways"}, VALUE], "sort order",
                 id="bad-sort-order"),
])
def test_create_with_a_bad_schema_is_rejected(api, schema, reason):
    path = _new_path()
    resp = _create(api, path, {"dynamic": True, "schema": schema})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, path, "invalid schema", reason)
    assert not api.exists(path)


@pytest.mark.parametrize(("pivot_keys", "reason"), [
    pytest.param([[1], [2]], "first pivot key must be []", id="first-not-empty"),
    pytest.param([[], [5], [3]], "strictly increasing", id="decreasing"),
    pytest.param([[], [5], [5]], "strictly increasing", id="repeated"),
    pytest.param([[], ["a"]], "does not match", id="string-for-int64-key"),
    pytest.param([[], [1.5]], "does not match", id="float-for-int64-key"),
    pytest.param([[], 1], "list of key lists", id="pivot-not-a-list"),
    pytest.param([], "list of key lists", id="empty-list"),
    pytest.param([[], [1, "a", 3]], "prefix of the key columns", id="longer-than-key"),
])
def test_create_with_bad_pivot_keys_is_rejected(api, pivot_keys, reason):
    path = _new_path()
    resp = _create(api, path, {"dynamic": True, "schema": SCHEMA, "pivot_keys": pivot_keys})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, path, "pivot", reason)
    assert not api.exists(path)


@pytest.mark.parametrize(("schema", "attributes", "reason"), [
    pytest.param(SCHEMA, {"tablet_count": 2}, "tablet_count", id="tablet_count-on-sorted"),
    pytest.param(ORDERED_SCHEMA, {"tablet_count": 0}, "tablet_count", id="tablet_count-zero"),
    pytest.param(ORDERED_SCHEMA, {"tablet_count": 10_001}, "tablet_count", id="tablet_count-too-large"),
    pytest.param(ORDERED_SCHEMA, {"tablet_count": "3"}, "tablet_count", id="tablet_count-string"),
    pytest.param(ORDERED_SCHEMA, {"pivot_keys": [[]]}, "pivot_keys", id="pivot_keys-on-ordered"),
    pytest.param(SCHEMA, {"atomicity": "partial"}, "atomicity", id="bad-atomicity"),
    pytest.param(SCHEMA, {"min_data_ttl": -1}, "min_data_ttl", id="negative-min_data_ttl"),
])
def test_create_with_a_bad_table_attribute_is_rejected(api, schema, attributes, reason):
    path = _new_path()
    resp = _create(api, path, {"dynamic": True, "schema": schema, **attributes})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, path, reason)
    assert not api.exists(path)


@pytest.mark.parametrize("attribute", ["type", "id", "path", "tablet_state"])
def test_create_with_a_read_only_system_attribute_is_rejected(api, attribute):
    path = _new_path()
    resp = _create(api, path, {"dynamic": True, "schema": SCHEMA, attribute: "map_node"})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, f"'{attribute}'")
    assert not api.exists(path)


def test_create_with_attributes_that_are_not_a_map_is_rejected(api):
    path = _new_path()
    assert_yt_error(_create(api, path, [1, 2]), ErrorCode.INVALID_PARAMETER, '"attributes"', "map")
    assert not api.exists(path)


def test_create_of_an_unknown_object_type_is_rejected(api):
    path = _new_path()
    assert_yt_error(_create(api, path, {}, type="no_such_type"), ErrorCode.INVALID_PARAMETER, "'no_such_type'")
    assert not api.exists(path)


def test_failed_recursive_create_leaves_no_intermediate_directories(api):
    top = _new_path()
    path = f"{top}/a/b/t"
    resp = _create(api, path, {"dynamic": True, "schema": [KEY, {"name": "v", "type": "int128"}]})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, path, "int128")
    assert not api.exists(top)


@pytest.mark.parametrize("type", ["table", "map_node"])
def test_create_on_an_existing_table_is_rejected_with_501_and_keeps_it(api, table, type):
    node_id = api.get(f"{table}/@id")
    attributes = {"dynamic": True, "schema": COMPOSITE_SCHEMA} if type == "table" else {}
    resp = _create(api, table, attributes, type=type)
    assert_yt_error(resp, ErrorCode.ALREADY_EXISTS, table, "already exists")
    assert api.get(f"{table}/@id") == node_id
    assert api.get(f"{table}/@tablet_state") == "mounted"
    assert_unchanged(api, table)


def test_create_on_an_existing_directory_is_rejected_with_501(api):
    resp = _create(api, "//tmp", {}, type="map_node")
    assert_yt_error(resp, ErrorCode.ALREADY_EXISTS, "//tmp", "already exists")


# -- 10. transactions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["commit_transaction", "abort_transaction", "ping_transaction"])
@pytest.mark.parametrize("tx_id", ["1-2-3-4", "not-a-transaction-id"])
def test_unknown_transaction_is_rejected_with_11000(api, command, tx_id):
    resp = api.send(command, {"transaction_id": tx_id})
    assert_yt_error(resp, ErrorCode.NO_SUCH_TRANSACTION, tx_id)


def test_write_in_an_unknown_transaction_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": table, "input_format": "json", "transaction_id": "1-2-3-4"},
                    json_lines(GOOD_ROWS))
    assert_yt_error(resp, ErrorCode.NO_SUCH_TRANSACTION, "1-2-3-4")
    assert_unchanged(api, table)


@pytest.mark.parametrize("ending", ["abort_transaction", "commit_transaction"])
@pytest.mark.parametrize("use", ["insert_rows", "lookup_rows", "commit_transaction", "ping_transaction"])
def test_use_of_a_finished_transaction_is_rejected(api, table, ending, use):
    tx = api.start_tx()
    if ending == "abort_transaction":
        api.insert(table, GOOD_ROWS, transaction_id=tx)
    api.ok(ending, {"transaction_id": tx})
    if use == "insert_rows":
        resp = api.send("insert_rows", {"path": table, "input_format": "json", "transaction_id": tx},
                        json_lines([{"k": 1000, "s": "late"}]))
    elif use == "lookup_rows":
        resp = api.send("lookup_rows", {"path": table, "input_format": "json", "output_format": "json",
                                        "transaction_id": tx}, json_lines([{"k": -1}]))
    else:
        resp = api.send(use, {"transaction_id": tx})
    assert_yt_error(resp, ErrorCode.NO_SUCH_TRANSACTION, tx)
    assert_unchanged(api, table)


def test_start_of_a_master_transaction_is_rejected(api):
    resp = api.send("start_transaction", {"type": "master"})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, "'master'", "not supported", "tablet")


@pytest.mark.parametrize(("params", "reason"), [
    pytest.param({"atomicity": "full", "durability": "async"}, "durability=async", id="async-with-full-atomicity"),
    pytest.param({"durability": "async"}, "durability=async", id="async-with-default-atomicity"),
    pytest.param({"atomicity": "partial"}, "'partial'", id="unknown-atomicity"),
    pytest.param({"durability": "eventually"}, "'eventually'", id="unknown-durability"),
    pytest.param({"timeout": 0}, "timeout", id="zero-timeout"),
    pytest.param({"timeout": -1000}, "timeout", id="negative-timeout"),
    pytest.param({"timeout": "soon"}, "timeout", id="string-timeout"),
    pytest.param({"start_timestamp": 12345}, "start_timestamp", id="start-timestamp-on-atomic"),
])
def test_start_transaction_with_bad_parameters_is_rejected(api, params, reason):
    resp = api.send("start_transaction", {"type": "tablet", **params})
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, reason)


def test_implicit_write_with_async_durability_and_full_atomicity_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": table, "input_format": "json", "durability": "async"},
                    json_lines(GOOD_ROWS))
    assert_yt_error(resp, ErrorCode.INVALID_PARAMETER, "durability=async")
    assert_unchanged(api, table)


@pytest.mark.parametrize(("table_atomicity", "tx_atomicity"), [("full", "none"), ("none", "full")])
def test_atomicity_mismatch_fails_at_commit_and_applies_nothing(api, table_atomicity, tx_atomicity):
    path = api.create_table(atomicity=table_atomicity)
    api.insert(path, [BASELINE], atomicity=table_atomicity)
    tx = api.start_tx(atomicity=tx_atomicity)
    api.insert(path, GOOD_ROWS, transaction_id=tx)
    resp = api.send("commit_transaction", {"transaction_id": tx})
    assert_yt_error(resp, ErrorCode.INVALID_TRANSACTION_ATOMICITY, path, "atomicity", repr(table_atomicity))
    assert_unchanged(api, path)


def test_implicit_write_with_mismatched_atomicity_is_rejected(api, table):
    resp = api.send("insert_rows", {"path": table, "input_format": "json", "atomicity": "none"},
                    json_lines(GOOD_ROWS))
    assert_yt_error(resp, ErrorCode.INVALID_TRANSACTION_ATOMICITY, table, "atomicity")
    assert_unchanged(api, table)


def test_commit_without_a_transaction_id_is_rejected(api):
    assert_yt_error(api.send("commit_transaction", {}), ErrorCode.INVALID_PARAMETER, "'transaction_id'")


# -- 11. tablet-state-guarded Cypress changes ---------------------------------------------------------


def test_reshard_of_a_mounted_sorted_table_is_rejected(api, table):
    resp = api.send("reshard_table", {"path": table, "pivot_keys": [[], [10]]})
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, table, "unmounted")
    assert api.get(f"{table}/@pivot_keys") == [[]]
    assert api.get(f"{table}/@tablet_count") == 1
    assert_unchanged(api, table)


def test_reshard_of_a_mounted_ordered_table_is_rejected(api):
    path = api.create_table(ORDERED_SCHEMA, rows=[{"a": 1}], tablet_count=2)
    resp = api.send("reshard_table", {"path": path, "tablet_count": 1})
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, path, "unmounted")
    assert api.get(f"{path}/@tablet_count") == 2
    assert [r["a"] for r in api.select_all(path)] == [1]


@pytest.mark.parametrize("state", ["mounted", "frozen"])
def test_remove_of_a_mounted_table_is_rejected(api, table, state):
    if state == "frozen":
        api.ok("freeze_table", {"path": table})
    resp = api.send("remove", {"path": table})
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, table, "unmount")
    assert api.exists(table)
    assert api.get(f"{table}/@tablet_state") == state
    assert_unchanged(api, table)


def test_recursive_remove_of_a_directory_holding_a_mounted_table_removes_nothing(api):
    top = _new_path()
    unmounted = f"{top}/a_unmounted"
    mounted = f"{top}/z_mounted"
    for path in (unmounted, mounted):
        api.ok("create", {"type": "table", "path": path, "recursive": True,
                          "attributes": {"dynamic": True, "schema": SCHEMA}})
    api.ok("mount_table", {"path": mounted})
    api.insert(mounted, [BASELINE])
    resp = api.send("remove", {"path": top, "recursive": True})
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, mounted, "unmount")
    assert api.exists(unmounted) and api.exists(mounted)
    assert_unchanged(api, mounted)


def test_changing_atomicity_of_a_mounted_table_is_rejected(api, table):
    resp = api.send("set", {"path": f"{table}/@atomicity"}, b'"none"')
    assert_yt_error(resp, ErrorCode.INVALID_TABLET_STATE, table, "unmounted")
    assert api.get(f"{table}/@atomicity") == "full"


# -- 12. content encoding -----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["zstd", "compress", "x-no-such-encoding", "gzip, br"])
def test_body_with_an_unsupported_content_encoding_is_rejected(api, table, encoding):
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, json_lines(GOOD_ROWS),
                    headers={"Content-Encoding": encoding})
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "Content-Encoding", encoding)
    assert_unchanged(api, table)


@pytest.mark.parametrize(("encoding", "body"), [
    pytest.param("gzip", json_lines(GOOD_ROWS), id="gzip-label-on-plain-body"),
    pytest.param("gzip", gzip.compress(json_lines(GOOD_ROWS))[:-100], id="truncated-gzip"),
    pytest.param("deflate", b"\x78\x9c garbage", id="corrupt-deflate"),
    pytest.param("br", b"\x00\x01 not brotli at all", id="corrupt-brotli"),
])
def test_body_that_does_not_decode_with_its_content_encoding_is_rejected(api, table, encoding, body):
    resp = api.send("insert_rows", {"path": table, "input_format": "json"}, body,
                    headers={"Content-Encoding": encoding})
    assert_yt_error(resp, ErrorCode.PROTOCOL_ERROR, "Content-Encoding", encoding)
    assert_unchanged(api, table)
