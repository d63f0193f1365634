"""The engine's listeners over uvicorn: a header-read timeout and a connection limit, TLS, and the
separate metrics listener.

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

**TLS** (``EngineConfig.tls_cert_file``/``tls_key_file``, docs/security.md): uvicorn wraps the same
protocol in asyncio's TLS layer, so the hooks above run on decrypted bytes and both limits hold
over HTTPS (``tests/engine/test_tls.py``). ``connection_made`` runs only once the handshake is
done: a client that never finishes its handshake is dropped by asyncio's handshake timeout (60 s),
not by ``header_timeout``. The context takes Python's default ciphers (uvicorn's own default,
``"TLSv1"``, offers TLS 1.2 clients only CBC-SHA1 suites) and TLS 1.2 at least. Certificates
are read at start-up: a renewed certificate takes a restart.

**The metrics listener** (``--metrics-port``): a second uvicorn server, in a thread with its own
event loop, that serves ``/metrics`` and nothing else, without a token and without TLS, for
Prometheus; the API listener then still serves ``/metrics``, but only with the API token. Its
socket is bound before the API port opens, so a port already taken stops the engine at start-up
instead of leaving it running without metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import EngineConfig
from ..errors import ErrorCode, UnavailableError, YtError
from .app import error_response

log = logging.getLogger("reptables.engine.http")

#: a warning about refused or timed-out connections is logged at most this often (seconds)
_WARNING_PERIOD = 60.0

#: seconds the metrics listener waits for its open connections when the engine stops
_METRICS_GRACE = 2.0


def server_options(config: EngineConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` that apply the engine's connection limits and, when the
    config names a certificate and key, serve HTTPS."""
    options: dict[str, Any] = {"http": guarded_protocol(config.header_timeout, config.max_connections),
                               "timeout_keep_alive": config.keep_alive_timeout,
                               # nothing here reads the client's address: no middleware rewriting it
                               # from X-Forwarded-* on every request (uvicorn's default)
                               "proxy_headers": False}
    if config.tls_cert_file or config.tls_key_file:
        options.update(ssl_certfile=config.tls_cert_file, ssl_keyfile=config.tls_key_file, ssl_ciphers=None)
    return options


def check_tls_files(config: EngineConfig) -> str | None:
    """Why the TLS settings cannot work (None if they can): both files or neither, and a key that
    matches the certificate. Checked before the engine opens its data, so a bad Secret fails fast."""
    if not config.tls_cert_file and not config.tls_key_file:
        return None
    if not (config.tls_cert_file and config.tls_key_file):
        return "--tls-cert-file and --tls-key-file go together: give both, or neither for plain HTTP"
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(config.tls_cert_file,
                                                                            config.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        return (f"cannot load the TLS certificate {config.tls_cert_file} with key {config.tls_key_file}: "
                f"{exc}")
    return None


def metrics_app(registry: CollectorRegistry) -> Starlette:
    """The ASGI app of the metrics listener: ``GET /metrics`` of one engine's registry, and only that
    (every other path is 404: the listener needs no token because it serves nothing else)."""

    async def metrics(request: Request) -> Response:
        # a worker thread: the state collector reads SQL (engine/metrics.py)
        return Response(await run_in_threadpool(generate_latest, registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


def _config(app: ASGIApp, host: str, port: int, **extra: Any) -> uvicorn.Config:
    server_config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, **extra)
    server_config.load()
    if server_config.ssl is not None:
        server_config.ssl.minimum_version = ssl.TLSVersion.TLSv1_2
    return server_config


class _Server(uvicorn.Server):
    """uvicorn's server that says when a stop begins: ``on_exit`` runs at the first SIGTERM or
    SIGINT, before the server waits for in-flight requests (long stream pulls end then)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._on_exit is not None and not self.should_exit:
            # a thread of its own: this runs in a signal handler, which may have interrupted a
            # holder of a lock that ``on_exit`` takes
            threading.Thread(target=self._on_exit, name="stop-begins", daemon=True).start()
        super().handle_exit(sig, frame)


def run_servers(app: ASGIApp, host: str, port: int, config: EngineConfig,
                metrics: tuple[ASGIApp, int] | None = None, on_exit: Callable[[], None] | None = None) -> None:
    """Serve ``app`` on ``host:port`` (HTTPS if ``config`` names a certificate) until SIGTERM or
    SIGINT, and ``metrics`` = (app, port) on a plain-HTTP listener of the same host beside it.
    ``on_exit`` runs when the signal comes, before the wait for in-flight requests.

    Returns when the API server stopped; exits the process (status 3, as ``uvicorn.run``) if a
    listener could not start."""
    main = _Server(_config(app, host, port, timeout_graceful_shutdown=10, **server_options(config)), on_exit)
    metrics_server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    if metrics is not None:
        metrics_config = _config(metrics[0], host, metrics[1], log_config=None, lifespan="off",
                                 timeout_graceful_shutdown=_METRICS_GRACE,
                                 http=guarded_protocol(config.header_timeout, config.max_connections),
                                 timeout_keep_alive=config.keep_alive_timeout)
        sock = metrics_config.bind_socket()  # exits the process if the port is taken
        metrics_server = uvicorn.Server(metrics_config)
        # not the main thread: uvicorn installs no signal handlers there; the API server's do
        thread = threading.Thread(target=metrics_server.run, kwargs={"sockets": [sock]}, name="metrics-listener",
                                  daemon=True)
        thread.start()
    try:
        main.run()
    finally:
        if metrics_server is not None and thread is not None:
            metrics_server.should_exit = True
            thread.join(timeout=_METRICS_GRACE + 3)
    if not main.started:
        sys.exit(3)  # uvicorn's STARTUP_FAILURE: the port was taken or the app did not start


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
        response = error_response(overloaded, "", headers={"Connection": "close"})
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
