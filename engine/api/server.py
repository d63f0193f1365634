"""The HTTP server's own limits: a header-read timeout and a connection limit.

uvicorn times out idle keep-alive connections, but not a connection that never finishes its
headers: a client sending one byte a second (slowloris) keeps a socket, a protocol object and a
file descriptor forever, and enough of them exhaust the process. Its ``limit_concurrency`` answers
a plain-text 503. So the engine runs uvicorn's httptools protocol with two additions:

* **header timeout**: from the moment a connection opens (or a later request on it sends its first
  byte) the client has ``header_timeout`` seconds to complete the request's headers; a slower one
  gets 408 and is disconnected. Bytes arriving do not reset the clock — that is the whole point.
* **connection limit**: a request on a connection beyond ``max_connections`` open ones is answered
  503 with a YT error (retriable) and the connection is closed; connections that never send a
  request are bounded by the header timeout.

This relies on uvicorn's protocol hooks (``connection_made``, ``on_message_begin``,
``on_headers_complete``, ``connection_lost``) and its ``app`` attribute; the tests in
``tests/engine/test_limits.py`` fail if a uvicorn release changes them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import EngineConfig
from ..errors import ErrorCode, UnavailableError, YtError
from .app import _error_response

log = logging.getLogger("reptables.engine.http")

#: a warning about refused or timed-out connections is logged at most this often (seconds)
_WARNING_PERIOD = 60.0


def server_options(config: EngineConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` that apply the engine's connection limits."""
    return {"http": guarded_protocol(config.header_timeout, config.max_connections),
            "timeout_keep_alive": config.keep_alive_timeout}


class _Throttled:
    """Counts events and logs one warning per period, so a flood of bad clients cannot flood the log."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.count = 0
        self.last = 0.0

    def hit(self) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= _WARNING_PERIOD:
            log.warning(self.text, self.count)
            self.count = 0
            self.last = now


def _raw_error_response(error: YtError, status: int, reason: str) -> bytes:
    """A complete HTTP response carrying ``error``, for the transport itself (no request cycle)."""
    body = json.dumps(error.to_dict(), ensure_ascii=True).encode("ascii")
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\nX-YT-Error: {body.decode('ascii')}\r\n"
            f"X-YT-Response-Code: {error.code}\r\n\r\n").encode("ascii") + body


def guarded_protocol(header_timeout: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header timeout and a connection limit."""
    timed_out = _raw_error_response(
        YtError(f"Request headers were not received within {header_timeout:g} s (header_timeout)",
                code=ErrorCode.TIMEOUT), 408, "Request Timeout")
    overloaded = UnavailableError(
        f"The engine serves at most {max_connections} connections at once (max_connections): retry later",
        attributes={"max_connections": max_connections})
    slow_clients = _Throttled("closed %d connection(s) that did not send their request headers within "
                              f"{header_timeout:g} s (header_timeout)")
    refused = _Throttled(f"refused %d request(s) beyond {max_connections} open connections (max_connections)")

    async def overloaded_app(scope: Any, receive: Any, send: Any) -> None:
        response = _error_response(overloaded, "", headers={"Connection": "close"})
        await response(scope, receive, send)

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            #: closes the connection if the current request's headers are not complete in time;
            #: only touched on the event loop
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            if len(self.connections) <= max_connections:
                super().on_headers_complete()
                return
            refused.hit()
            app, self.app = self.app, overloaded_app
            try:
                super().on_headers_complete()
            finally:
                self.app = app

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            slow_clients.hit()
            if self.cycle is None or self.cycle.response_complete:  # no answer of ours in progress
                self.transport.write(timed_out)
            self.transport.close()

    return GuardedProtocol
