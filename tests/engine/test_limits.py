"""Limits: what one request can make an engine hold, compute or keep open is bounded, and the
client learns which limit it hit from a YT error.

One engine for the module, started with small limits (4 MiB bodies, 1 MiB answers, 0.5 s
queries, 1 s to send headers, 8 connections, 1,000 lookup keys) so that each test reaches its
limit with little data; the reproducers of issue 14 ("Resource limits", "Errors") are among them.
Raw bytes go through httpx or plain sockets, so every header and byte is ours. The mapping of
unexpected exceptions to 500 needs an exception no input can cause: those tests inject one into
an in-process engine (a real ``Cluster`` on SQLite) and read its log records.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import select
import socket
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import httpx
import pytest

from reptables.engine.api import create_app
from reptables.engine.api.app import MAX_ERROR_HEADER
from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import ErrorCode
from reptables.engine.node import Cluster
from reptables.testing import EngineProcess, wait_for

MIB = 1024 * 1024
MAX_BODY = 4 * MIB
MAX_OUTPUT = 1 * MIB
QUERY_TIMEOUT = 0.5
HEADER_TIMEOUT = 1.0
MAX_CONNECTIONS = 8
MAX_LOOKUP_KEYS = 1000
#: the engine's default, which the write row limit is
MAX_ROWS = 100_000

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "s", "type": "string"},
          {"name": "a", "type": "any"}]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    proc = EngineProcess("limited", tmp_path_factory.mktemp("limited"), extra_args=[
        "--max-body-bytes", str(MAX_BODY), "--max-output-bytes", str(MAX_OUTPUT),
        "--query-timeout", str(QUERY_TIMEOUT), "--header-timeout", str(HEADER_TIMEOUT),
        "--max-connections", str(MAX_CONNECTIONS), "--max-lookup-keys", str(MAX_LOOKUP_KEYS)]).start()
    try:
        yield proc
    finally:
        proc.stop()


class Api:
    def __init__(self, engine: EngineProcess) -> None:
        self.engine = engine
        self.http = httpx.Client(base_url=engine.url, timeout=60)

    def send(self, command: str, params: dict[str, Any] | None = None, body: Any = None, *,
             headers: dict[str, str] | None = None, header_format: str = "json",
             raw_params: str | None = None) -> httpx.Response:
        h = {"Authorization": f"OAuth {self.engine.token}", "X-YT-Header-Format": header_format}
        if raw_params is not None or params is not None:
            h["X-YT-Parameters"] = raw_params if raw_params is not None else json.dumps(params)
        h.update(headers or {})
        return self.http.post(f"/api/v4/{command}", headers=h, content=body)

    def ok(self, command: str, params: dict[str, Any], body: bytes | None = None) -> httpx.Response:
        resp = self.send(command, params, body)
        assert resp.status_code == 200, f"{command} {params}: {resp.status_code} {resp.text[:500]}"
        return resp

    def table(self, rows: list[dict[str, Any]] | None = None) -> str:
        path = f"//tmp/limits/t_{uuid.uuid4().hex[:12]}"
        self.ok("create", {"type": "table", "path": path, "recursive": True,
                           "attributes": {"dynamic": True, "schema": SCHEMA}})
        self.ok("mount_table", {"path": path})
        for start in range(0, len(rows or []), MAX_ROWS):
            self.ok("insert_rows", {"path": path, "input_format": "json"}, json_lines(rows[start:start + MAX_ROWS]))
        return path

    def select(self, query: str, **params: Any) -> httpx.Response:
        return self.send("select_rows", {"query": query, "output_format": "json", **params})

    def keys(self, path: str) -> list[int]:
        resp = self.select(f"k FROM [{path}]")
        assert resp.status_code == 200, resp.text
        return [json.loads(line)["k"] for line in resp.text.splitlines()]


@pytest.fixture(scope="module")
def api(engine: EngineProcess) -> Iterator[Api]:
    a = Api(engine)
    try:
        yield a
    finally:
        a.http.close()


def json_lines(rows: list[Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def yt_error(resp: httpx.Response, status: int, code: int, *fragments: str) -> dict[str, Any]:
    """The answer is ``status`` with a YT error of ``code`` (body and X-YT-Error header) whose message
    mentions every fragment."""
    context = f"{resp.status_code} {resp.text[:1000]!r}"
    assert resp.status_code == status, context
    body = resp.json()
    assert json.loads(resp.headers["X-YT-Error"])["code"] == body["code"] == code, context
    for fragment in fragments:
        assert fragment.lower() in body["message"].lower(), f"{fragment!r} not in {context}"
    return body


def rss_peak_bytes(pid: int) -> int:
    """The process' peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


# -- request bodies ------------------------------------------------------------------------------------


def brotli_bomb(size: int) -> bytes:
    compressor = brotli.Compressor(quality=5, lgwin=24)
    chunk = bytes(16 * MIB)
    return b"".join([compressor.process(chunk) for _ in range(size // len(chunk))] + [compressor.finish()])


def test_brotli_bomb_is_refused_with_413_before_it_inflates(api, engine):
    path = api.table([{"k": 1}])
    bomb = brotli_bomb(2048 * MIB)  # the reproducer: 2 GiB of zeros in ~1.6 KB
    assert len(bomb) < 4096
    peak = rss_peak_bytes(engine.pid)
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, bomb,
                    headers={"Content-Encoding": "br"})
    yt_error(resp, 413, ErrorCode.PROTOCOL_ERROR, "after decompression", str(MAX_BODY), "max_body_bytes")
    assert rss_peak_bytes(engine.pid) < 500 * MIB
    assert rss_peak_bytes(engine.pid) - peak < 8 * MAX_BODY  # it inflated to about the limit, no further
    assert api.keys(path) == [1]


def zlib_bomb(size: int) -> bytes:
    """A zlib stream of ``size`` zeros (deflate's best ratio, ~1000:1) whose end never comes: one
    16 MiB block repeated, each flushed so that it does not refer to the one before."""
    chunk = bytes(16 * MIB)
    compressor = zlib.compressobj(9)
    first = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    return first + block * (size // len(chunk) - 1)


def test_gzip_bomb_is_refused_with_413(api, engine):
    path = api.table([{"k": 1}])
    bomb = zlib_bomb(1024 * MIB)
    assert len(bomb) < MAX_BODY
    peak = rss_peak_bytes(engine.pid)
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, bomb, headers={"Content-Encoding": "gzip"})
    yt_error(resp, 413, ErrorCode.PROTOCOL_ERROR, "after decompression", "max_body_bytes")
    assert rss_peak_bytes(engine.pid) < 500 * MIB
    # one received chunk of the bomb may inflate a thousandfold: each step is bounded, not each chunk
    assert rss_peak_bytes(engine.pid) - peak < 8 * MAX_BODY
    assert api.keys(path) == [1]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_compressed_body_within_the_limit_is_accepted(api, encoding):
    path = api.table()
    body = json_lines([{"k": n, "s": "x" * 100} for n in range(20_000)])  # 2.5 MiB, under the limit
    packed = {"gzip": gzip.compress, "deflate": zlib.compress,
              "br": lambda data: brotli.compress(data, quality=5)}[encoding](body)
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, packed,
                    headers={"Content-Encoding": encoding})
    assert resp.status_code == 200, resp.text
    assert api.keys(path) == list(range(20_000))


def test_compressed_body_with_data_after_its_end_is_rejected(api):
    path = api.table([{"k": 1}])
    body = gzip.compress(json_lines([{"k": 2}])) + gzip.compress(json_lines([{"k": 3}]))
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, body, headers={"Content-Encoding": "gzip"})
    yt_error(resp, 400, ErrorCode.PROTOCOL_ERROR, "Content-Encoding", "after the end")
    assert api.keys(path) == [1]


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def test_chunked_body_past_the_limit_is_refused_with_413(api):
    path = api.table([{"k": 1}])
    rows = json_lines([{"k": n, "s": "x" * 1000} for n in range(2, 5000)])  # ~5 MB, no Content-Length
    assert len(rows) > MAX_BODY
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, _chunks(rows))
    assert "content-length" not in resp.request.headers and resp.request.headers["transfer-encoding"] == "chunked"
    yt_error(resp, 413, ErrorCode.PROTOCOL_ERROR, "as received", str(MAX_BODY), "max_body_bytes")
    assert api.keys(path) == [1]


def test_body_declared_past_the_limit_is_refused_before_it_is_sent(engine):
    with _connect(engine) as sock:
        sock.sendall(f"POST /api/v4/insert_rows HTTP/1.1\r\nHost: engine\r\nAuthorization: OAuth {engine.token}\r\n"
                     f"Content-Length: {MAX_BODY + 1}\r\n\r\n".encode())
        head, body = _read_response(sock)  # no byte of the body sent: the answer comes first
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["code"] == ErrorCode.PROTOCOL_ERROR and b"max_body_bytes" in body


def test_chunked_body_within_the_limit_is_accepted(api):
    path = api.table()
    resp = api.send("insert_rows", {"path": path, "input_format": "json"},
                    _chunks(json_lines([{"k": n} for n in range(1000)]), size=1000))
    assert resp.status_code == 200, resp.text
    assert api.keys(path) == list(range(1000))


def test_internal_call_with_a_body_past_the_limit_is_refused_with_413(api, engine):
    # a peer of its own (a cluster may hold replicas of its own tables): the credential is accepted
    with Client(engine.url, engine.token) as client:
        client.set("//sys/clusters", {"limited": {"proxy_url": engine.url,
                                                  "token": peer_credential(engine.token, "limited")}})
    resp = api.http.post("/internal/v1/push",
                         headers={"Authorization": f"OAuth {peer_credential(engine.token, 'limited')}"},
                         content=_chunks(b" " * (MAX_BODY + 1)))
    yt_error(resp, 413, ErrorCode.PROTOCOL_ERROR, "max_body_bytes")


# -- rows counted while parsing --------------------------------------------------------------------------


@pytest.mark.parametrize("input_format", ["json-lines", "json-array", "yson"])
def test_write_past_the_row_limit_is_refused_before_the_rest_is_parsed(api, input_format):
    """Rows past the limit are never parsed: a malformed tail after row 100,001 is not even seen."""
    path = api.table([{"k": -1}])
    count = MAX_ROWS + 1
    if input_format == "yson":
        body = b"".join(b"{k=%d};" % n for n in range(count)) + b"{k=oops"
    elif input_format == "json-array":
        body = b"[" + b",".join(b'{"k":%d}' % n for n in range(count)) + b',{"k": oops'
    else:
        body = json_lines([{"k": n} for n in range(count)]) + b'{"k": oops\n'
    assert len(body) < MAX_BODY
    resp = api.send("insert_rows", {"path": path, "input_format": input_format.split("-")[0]}, body)
    yt_error(resp, 400, ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION, f"more than {MAX_ROWS} rows",
             "max_rows_per_transaction")
    assert api.keys(path) == [-1]


def test_write_of_exactly_the_row_limit_is_accepted(api):
    path = api.table()
    resp = api.send("insert_rows", {"path": path, "input_format": "json"},
                    b"\n" + json_lines([{"k": n} for n in range(MAX_ROWS)]) + b"\n\n")
    assert resp.status_code == 200, resp.text
    resp = api.select(f"sum(1) AS n FROM [{path}] GROUP BY 1")
    assert json.loads(resp.text)["n"] == MAX_ROWS, resp.text


def test_lookup_past_the_key_limit_is_refused(api):
    path = api.table([{"k": 1}])
    resp = api.send("lookup_rows", {"path": path, "input_format": "json", "output_format": "json"},
                    json_lines([{"k": n} for n in range(MAX_LOOKUP_KEYS + 1)]))
    yt_error(resp, 400, ErrorCode.INVALID_PARAMETER, f"more than {MAX_LOOKUP_KEYS} keys", "max_lookup_keys")


# -- answers: bytes and time -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_table(api: Api) -> str:
    """2,000 rows of 1.5 KB: an answer of all of them is three times the output limit."""
    return api.table([{"k": n, "s": "v" * 1500} for n in range(2000)])


def test_select_without_limit_past_the_output_limit_is_refused(api, wide_table):
    """Refused while the rows are fetched (the error names the query), not once the answer is built."""
    query = f"* FROM [{wide_table}]"
    error = yt_error(api.select(query), 400, ErrorCode.INVALID_PARAMETER, "output limit", str(MAX_OUTPUT),
                     "max_output_bytes")
    assert error["attributes"]["query"] == query


def test_select_within_the_output_limit_is_answered(api, wide_table):
    resp = api.select(f"* FROM [{wide_table}] WHERE k < 500")
    assert resp.status_code == 200, resp.text
    assert len(resp.text.splitlines()) == 500


@pytest.mark.parametrize("output_format", ["json", "yson"])
def test_lookup_answer_past_the_output_limit_is_refused(api, wide_table, output_format):
    resp = api.send("lookup_rows", {"path": wide_table, "input_format": "json", "output_format": output_format},
                    json_lines([{"k": n} for n in range(MAX_LOOKUP_KEYS)]))
    yt_error(resp, 400, ErrorCode.INVALID_PARAMETER, "output limit", "max_output_bytes")


def test_select_running_past_the_query_time_limit_is_stopped(api):
    path = api.table([{"k": n, "s": f"value {n}"} for n in range(MAX_ROWS)])
    # 300 string comparisons per row, none on the key: seconds of work for the database
    where = " OR ".join(f"lower(s) = 'nope {n}'" for n in range(300))
    started = time.monotonic()
    resp = api.select(f"k FROM [{path}] WHERE {where}")
    yt_error(resp, 400, ErrorCode.TIMEOUT, f"{QUERY_TIMEOUT:g} s", "query_timeout")
    assert time.monotonic() - started < 2.0
    assert api.select(f"k FROM [{path}] WHERE k < 3").text.count("\n") == 3  # the engine serves on


# -- connections -------------------------------------------------------------------------------------------


def _connect(engine: EngineProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", engine.port), timeout=10)


def _read_until_closed(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.05)
        if ready:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return data, True
            if not chunk:
                return data, True
            data += chunk
    return data, False


def _get(sock: socket.socket, path: str = "/healthz") -> tuple[bytes, bytes]:
    """One keep-alive GET on a raw socket: the status line and headers, and the body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: engine\r\n\r\n".encode())
    return _read_response(sock)


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        body += chunk
    return head, body


def test_slow_header_sender_is_disconnected(engine):
    """Slowloris: one header byte every 0.1 s never completes; the engine answers 408 and closes."""
    request = b"GET /healthz HTTP/1.1\r\nHost: engine\r\nX-Slow: " + b"x" * 100
    with _connect(engine) as sock:
        started = time.monotonic()
        closed = False
        data = b""
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            got, closed = _read_until_closed(sock, time.monotonic() + 0.1)
            data += got
            if closed:
                break
        elapsed = time.monotonic() - started
    assert closed, "the engine kept a connection whose headers never completed"
    assert HEADER_TIMEOUT - 0.1 <= elapsed < HEADER_TIMEOUT + 2.0, elapsed
    if data:  # the 408 may be lost to a reset when the close races our next byte
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        assert b"header_timeout" in data


def test_silent_connection_is_closed_after_the_header_timeout(engine):
    with _connect(engine) as sock:
        data, closed = _read_until_closed(sock, time.monotonic() + HEADER_TIMEOUT + 2.0)
    assert closed
    assert data.startswith(b"HTTP/1.1 408"), data[:200]


def test_keep_alive_connection_serves_requests_past_the_header_timeout(engine):
    """The clock runs per request: a connection busy with complete requests is not cut."""
    with _connect(engine) as sock:
        deadline = time.monotonic() + HEADER_TIMEOUT * 2
        while time.monotonic() < deadline:
            head, _ = _get(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            time.sleep(0.2)


def test_requests_beyond_the_connection_limit_get_503(engine):
    sockets: list[socket.socket] = []
    statuses: list[bytes] = []
    try:
        for _ in range(MAX_CONNECTIONS + 2):
            sock = _connect(engine)
            sockets.append(sock)
            head, body = _get(sock)  # served connections stay open (keep-alive)
            statuses.append(head[:12])
            if head.startswith(b"HTTP/1.1 503"):
                break
        assert head.startswith(b"HTTP/1.1 503"), statuses
        error = json.loads(body)
        assert error["code"] == ErrorCode.UNAVAILABLE and "max_connections" in error["message"]
        assert b"x-yt-error" in head.lower()
        # the served ones: every connection up to the limit (one may be another test's idle client)
        assert MAX_CONNECTIONS - 1 <= len(statuses) - 1 <= MAX_CONNECTIONS, statuses
    finally:
        for sock in sockets:
            sock.close()
    # the closed connections leave the engine's count as their EOF arrives
    wait_for(lambda: httpx.get(f"{engine.url}/healthz", timeout=5).status_code == 200, 5,
             "the engine to serve again once the connections are closed")


# -- errors ------------------------------------------------------------------------------------------------


def test_error_about_a_70000_character_path_has_a_bounded_header(api):
    path = "//tmp/" + "x" * 70_000
    resp = api.send("get", {"path": path})  # httpx (h11) refuses header lines past 16 KiB
    assert resp.status_code == 404
    header = resp.headers["X-YT-Error"]
    assert len(header) <= MAX_ERROR_HEADER
    short = json.loads(header)
    assert short["code"] == resp.json()["code"] == ErrorCode.RESOLVE_ERROR
    assert "truncated" in short["message"]
    assert path in resp.json()["message"]  # the body keeps the whole error


def test_short_error_header_is_the_whole_error(api):
    resp = api.send("get", {"path": "//tmp/no_such_node"})
    assert json.loads(resp.headers["X-YT-Error"]) == resp.json()


@pytest.mark.parametrize("body", [
    pytest.param(b'{"k": 1, "s": "\\ud800"}\n', id="json-lines"),
    pytest.param(b'[{"k": 1, "a": ["ok", {"\\udfff": 1}]}]', id="json-array-nested"),
])
def test_lone_surrogate_in_rows_is_a_protocol_error(api, body):
    path = api.table([{"k": -1}])
    resp = api.send("insert_rows", {"path": path, "input_format": "json"}, body)
    yt_error(resp, 400, ErrorCode.PROTOCOL_ERROR, "not valid Unicode", "lone surrogate")
    assert api.keys(path) == [-1]


@pytest.mark.parametrize("command", ["set", "insert_rows"])
def test_json_body_nested_too_deeply_is_a_protocol_error(api, command):
    path = api.table([{"k": -1}]) if command == "insert_rows" else f"//tmp/limits/deep_{uuid.uuid4().hex[:8]}"
    nested = b"[" * 5000 + b"]" * 5000
    body = b'{"k": 1, "a": ' + nested + b"}\n" if command == "insert_rows" else nested
    resp = api.send(command, {"path": path, "input_format": "json"}, body)
    yt_error(resp, 400, ErrorCode.PROTOCOL_ERROR, "nested too deeply")


def test_yson_parameters_with_a_string_that_is_not_utf8_are_a_protocol_error(api):
    resp = api.send("get", raw_params=r'{path="//tmp/\xff"}', header_format="yson")  # a YSON escape
    yt_error(resp, 400, ErrorCode.PROTOCOL_ERROR, "X-YT-Parameters", "not valid UTF-8")


@pytest.mark.parametrize("output_format", [
    pytest.param({"$value": "yson", "$attributes": {"format": "weird"}}, id="yson-format"),
    pytest.param({"$value": "json", "$attributes": {"encode_utf8": "maybe"}}, id="encode_utf8"),
])
def test_output_format_with_a_bad_attribute_is_rejected(api, output_format):
    resp = api.send("get", {"path": "//tmp", "output_format": output_format})
    yt_error(resp, 400, ErrorCode.INVALID_PARAMETER, "format")


def test_any_value_that_is_not_utf8_is_written_byte_for_byte_in_json(api):
    """YSON input can store any bytes in an ``any`` column; JSON output writes them as YT does
    (one code point per byte under encode_utf8), or refuses by name when it cannot."""
    path = api.table()
    api.ok("insert_rows", {"path": path, "input_format": "yson"}, b'{k=1;a=["\xff\xfe"]};')
    resp = api.select(f"a FROM [{path}]")
    assert resp.status_code == 200, resp.text
    assert json.loads(resp.text)["a"] == ["\xff\xfe"]
    plain = {"$value": "json", "$attributes": {"encode_utf8": False}}
    resp = api.select(f"a FROM [{path}]", output_format=plain)
    yt_error(resp, 400, ErrorCode.INVALID_PARAMETER, "not valid UTF-8", "encode_utf8")


# -- unexpected exceptions: an injected fault in an in-process engine ---------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster.open("local", tmp_path / "data")
    try:
        yield cluster
    finally:
        cluster.close()


def _fault(*args: Any, **kwargs: Any) -> Any:
    raise RecursionError("maximum recursion depth exceeded " + "while doing something deep " * 1000)


def _post(app: Any, path: str, headers: dict[str, str], content: bytes = b"") -> httpx.Response:
    """One request to an in-process ASGI app."""
    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
            return await client.post(path, headers=headers, content=content)
    return asyncio.run(call())


def _assert_internal_error(resp: httpx.Response, caplog: pytest.LogCaptureFixture) -> None:
    assert resp.status_code == 500, resp.text
    error = resp.json()
    assert error["code"] == ErrorCode.GENERIC
    assert "internal error" in error["message"] and "RecursionError" in error["message"]
    assert len(resp.content) < 1000 and "Traceback" not in resp.text
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None and len(lines[0].getMessage()) < 400
    assert "RecursionError" in lines[0].getMessage()
    traced = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(traced) == 1  # the traceback, for whoever runs the engine at debug level


def test_unexpected_exception_in_a_command_is_a_500_with_one_short_log_line(local, monkeypatch, caplog):
    monkeypatch.setattr(local.reads, "exists", _fault)
    caplog.set_level(logging.DEBUG, logger="reptables.engine.http")
    resp = _post(create_app(local, "token"), "/api/v4/exists",
                 {"Authorization": "OAuth token", "X-YT-Parameters": '{"path": "//tmp"}'})
    _assert_internal_error(resp, caplog)


def test_unexpected_exception_in_an_internal_call_is_a_500_with_one_short_log_line(local, monkeypatch, caplog):
    monkeypatch.setattr(local.transactions, "transaction_status", _fault)
    caplog.set_level(logging.DEBUG, logger="reptables.engine.http")
    local.nodes.set("//sys/clusters", {"local": {"proxy_url": "http://127.0.0.1:1", "token": "unused"}})
    resp = _post(create_app(local, "token"), "/internal/v1/transaction_status",
                 {"Authorization": f"OAuth {peer_credential('token', 'local')}"}, b'{"transaction_id": "1-2-3-4"}')
    _assert_internal_error(resp, caplog)
