"""The API's commands and internal calls read a request through ``api.incoming.Call`` instead of
Starlette's ``Request``: they must read the same headers, query parameters and body from the same
ASGI messages (header names in lower case, as the ASGI server hands them over) - repeated headers,
repeated, blank and percent-encoded parameters, a body in chunks - and a client gone mid-body must
end the read as Starlette's does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import ClientDisconnect, Request

from reptables.engine.api.incoming import Call

SCOPES: list[tuple[list[tuple[bytes, bytes]], bytes]] = [
    ([(b"authorization", b"OAuth t"), (b"x-yt-header-format", b"json")], b""),
    ([(b"x-yt-parameters", b'{"path":"//tmp/t"}'), (b"x-yt-parameters", b'{"path":"//other"}'),
      (b"content-length", b"12")], b"path=%2F%2Ftmp%2Ft&path=%2F%2Flast&flag=&n=1&n=2&x=%C3%A9"),
    ([(b"accept", b"a"), (b"accept", b"b"), (b"x-empty", b"")], b"a=1;b=2&c"),
]


def _scope(headers: list[tuple[bytes, bytes]], query: bytes) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/api/v4/insert_rows", "raw_path": b"/api/v4/insert_rows",
            "query_string": query, "headers": headers, "path_params": {"command": "insert_rows"},
            "scheme": "http", "server": ("127.0.0.1", 80), "root_path": ""}


@pytest.mark.parametrize(("headers", "query"), SCOPES)
def test_a_call_reads_the_headers_and_parameters_starlette_reads(headers: list[tuple[bytes, bytes]],
                                                                  query: bytes) -> None:
    scope = _scope(headers, query)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    call, request = Call(scope, receive), Request(scope, receive)
    for name in {n.decode() for n, _ in headers} | {"absent"}:
        assert call.headers.get(name) == request.headers.get(name), name
    assert call.query_params == dict(request.query_params.items())
    assert call.path_params == {"command": "insert_rows"}


def test_a_call_reads_a_body_in_chunks_and_stops_at_a_disconnect() -> None:
    async def read(messages: list[dict[str, Any]]) -> bytes:
        queue = list(messages)

        async def receive() -> dict[str, Any]:
            return queue.pop(0)

        return b"".join([chunk async for chunk in Call(_scope([], b""), receive).stream()])

    chunks = [{"type": "http.request", "body": b"ab", "more_body": True},
              {"type": "http.request", "body": b"", "more_body": True},
              {"type": "http.request", "body": b"cd", "more_body": False}]
    assert asyncio.run(read(chunks)) == b"abcd"
    with pytest.raises(ClientDisconnect):
        asyncio.run(read([{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.disconnect"}]))
