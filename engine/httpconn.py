"""Keep-alive HTTP/1.1 connections for the synchronous clients, on the standard library's http.client.

Why not httpx here: a point lookup or a one-row commit takes the engine ~0.1-0.3 ms, and httpx's
synchronous client spends ~0.5 ms of CPU on each request by itself (its request and response
models, h11's pure-Python HTTP parser, cookie extraction); on a 2-core machine that doubled the
latency users see. ``http.client`` does the same HTTP/1.1 work in a fraction of it. The clients
keep httpx where it costs nothing extra: the asyncio client, and custom transports (tests).

A :class:`ConnectionPool` talks to one origin. Idle connections are reused (keep-alive) after a
check that the server has not closed them meanwhile, so a request is never sent on a connection
known to be dead, and only if they were idle less than ``max_idle_seconds`` (4 s, under the
engine's 5 s ``keep_alive_timeout``): a connection the server is closing at that very moment would
take the request and answer with a reset, which the check cannot see coming. A request that fails
is not retried here (a write may have been applied), the caller gets :class:`HttpTransportError`
and decides. Connect and read timeouts are separate: an unreachable peer fails within the connect
timeout whatever the read timeout of a big request.

``https://`` origins go through ``http.client.HTTPSConnection`` with an ``ssl.SSLContext`` that
verifies the server's certificate *and* its name (``check_hostname``): the caller's context (a CA
bundle for the peers, :func:`client_ssl_context`) or, without one, the system trust store, which
also honours ``SSL_CERT_FILE``/``SSL_CERT_DIR`` (OpenSSL reads them when the context is made, not at
import). The TLS handshake is part of connecting, so it is bounded by the connect timeout. An idle
TLS connection is reused only if neither its socket nor its TLS buffer holds unread bytes (a
``close_notify`` from the server is such bytes).
"""

from __future__ import annotations

import http.client
import json
import math
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson


def client_ssl_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A client context that verifies servers: against ``ca_file`` (PEM, one or more CA certificates)
    if given, else the system trust store. Hostname checking is on, TLS 1.2 is the oldest accepted.

    Raises ``OSError`` or ``ssl.SSLError`` if the file cannot be read or holds no certificate: a bad
    CA bundle must stop a process at start-up, not fail its first peer call."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def has_non_finite(value: Any) -> bool:
    """Whether a JSON-able value holds a NaN or an infinity (which orjson would write as null).

    Called on whole batches of rows: builtin types are tested by ``type`` (an ABC check costs
    more than the rest), and ``v - v`` is 0.0 for every finite double and NaN for the others."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if item - item != 0.0:
                return True
        elif kind is dict:
            for v in item.values():
                t = type(v)
                if t is float:
                    if v - v != 0.0:
                        return True
                elif t is not str and t is not int and t is not bool and v is not None:
                    stack.append(v)
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def dumps_json(value: Any) -> bytes:
    """JSON of ``value``: orjson (fast) unless a double is NaN or infinite, which only the standard
    encoder keeps (as ``NaN``/``Infinity``, read back by :func:`loads_json`)."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(value).encode()
    if b"null" in out and has_non_finite(value):
        return json.dumps(value).encode()
    return out


def loads_json(data: bytes) -> Any:
    """Parse JSON written by :func:`dumps_json` (or any JSON, NaN included)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


class HttpTransportError(Exception):
    """A request got no HTTP answer: connection refused or reset, timeout, malformed answer."""

    def __init__(self, url: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.url = url
        self.cause = cause


@dataclass
class HttpResponse:
    """What the clients read of an answer (the same names as ``httpx.Response``)."""

    status_code: int
    headers: http.client.HTTPMessage
    content: bytes
    url: str

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


#: the longest status or header line and the most header lines an answer may have (http.client's own)
_MAX_LINE = 65536
_MAX_HEADERS = 100


def _header_block(fp: Any) -> list[bytes]:
    """The lines of a header block, up to the empty line that ends it (or the end of the stream)."""
    lines: list[bytes] = []
    while True:
        line = fp.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return lines
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")


def _message(lines: list[bytes]) -> http.client.HTTPMessage:
    """The header lines as http.client's ``HTTPMessage`` (case-insensitive ``get``), made directly:
    ``http.client.parse_headers`` runs the email package's parser, a visible share of a meta-cluster's
    CPU per sync commit, whose two peer calls each read one answer (benchmarks/README.md). A
    line that continues the one before (obsolete folding) is joined to it."""
    message = http.client.HTTPMessage()
    name: str | None = None
    value = ""
    for raw in lines:
        line = raw.decode("iso-8859-1")
        if line[:1] in (" ", "\t") and name is not None:
            value = f"{value} {line.strip()}"
            continue
        if name is not None:
            message[name] = value
        name, _, rest = line.partition(":")
        value = rest.strip()
    if name is not None:
        message[name] = value
    return message


class _Response(http.client.HTTPResponse):
    """http.client's answer, with its header block read by :func:`_message`; the rest as
    ``HTTPResponse.begin`` does it (interim 100 answers skipped, the body's framing: chunked, a
    length, or until the connection closes)."""

    def begin(self) -> None:
        if self.headers is not None:
            return  # (begun already)
        while True:
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            _header_block(self.fp)  # an interim answer's headers: nothing to keep
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise http.client.UnknownProtocol(version)
        self.headers = self.msg = _message(_header_block(self.fp))
        encoding = self.headers.get("transfer-encoding")
        self.chunked = bool(encoding) and encoding.lower() == "chunked"
        self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            if self.length is not None and self.length < 0:
                self.length = None
        if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or 100 <= status < 200 \
                or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True  # no framing: the body ends when the connection does


class ConnectionPool:
    """Connections to one ``http://`` or ``https://`` origin, shared by threads.

    ``ssl_context`` verifies an ``https://`` server (default: :func:`client_ssl_context`, the system
    trust store); it is not used for ``http://``."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout: float = 30.0,
                 connect_timeout: float | None = None, max_idle: int = 8,
                 ssl_context: ssl.SSLContext | None = None, max_idle_seconds: float = 4.0) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Not an http(s) URL: {base_url!r}")
        self.base_url = f"{parts.scheme}://{parts.netloc}"
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl_context = (ssl_context or client_ssl_context()) if self._https else None
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.connect_timeout = connect_timeout if connect_timeout is not None else timeout
        self._max_idle = max_idle
        self._max_idle_seconds = max_idle_seconds
        #: guards _idle and _closed; a leaf lock, never held during a request
        self._lock = threading.Lock()
        #: (connection, when it went idle), most recent last; guarded by _lock
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._closed = False  # guarded by _lock

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None,
                timeout: float | None = None, connect_timeout: float | None = None) -> HttpResponse:
        url = self.base_url + self._prefix + path
        read_timeout = timeout if timeout is not None else self.timeout
        conn = self._take()
        try:
            if conn is None:
                conn = self._connect(min(connect_timeout or self.connect_timeout, read_timeout))
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            all_headers = {**self.headers, **(headers or {})}
            if body is None and method in ("POST", "PUT"):
                body = b""
            conn.request(method, self._prefix + path, body=body, headers=all_headers)
            answer = conn.getresponse()
            content = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            if conn is not None:
                conn.close()
            raise HttpTransportError(url, exc) from exc
        if answer.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return HttpResponse(answer.status, answer.headers, content, url)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._ssl_context is not None:
            # connect() also runs the handshake and the certificate and hostname checks, all within
            # ``timeout`` (the socket's timeout until request() sets the read timeout)
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl_context)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        conn.response_class = _Response
        conn.connect()
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _take(self) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn, since = self._idle.pop()
            if time.monotonic() - since < self._max_idle_seconds and _still_open(conn):
                return conn
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle connection is usable if its socket has nothing to read: a readable idle socket means
    the server closed it (or sent something unasked for), and it must not carry a request."""
    sock = conn.sock
    if sock is None:
        return False
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False  # decrypted bytes nobody asked for
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
