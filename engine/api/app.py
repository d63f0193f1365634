"""The YTsaurus HTTP proxy protocol (API v4) over a :class:`~reptables.engine.node.Cluster`.

This layer only translates: it reads parameters (``X-YT-Parameters`` in the header format, the
query string, or the body of a volatile command), decodes the body in the input format,
calls one method of the cluster in a worker thread, and encodes the result in the output format.
The command descriptors at ``GET /api/v4`` tell the official client which HTTP method, input and
output kind each command uses — the client builds its requests from them, so they must be right.

Every failure becomes a YT error (``X-YT-Error`` header plus JSON body) with a 4xx status; a
storage that is momentarily unavailable answers 503, which clients retry. Anything else that
escapes a command is the engine's fault, not the request's: 500, a short message, one log line
(the traceback only at debug level, so a request cannot flood the log). The ``X-YT-Error`` header
is bounded like ``X-YT-Response-Message`` (proxies and clients refuse long header lines); the body
always carries the whole error.

Limits (``EngineConfig``, section "limits"): the body is read within ``max_body_bytes`` on the wire
and after decompression (``body.py``); rows are counted while the body is parsed, and an answer's
bytes while it is encoded (``formats.py``).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
import sqlalchemy.exc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from ..credentials import is_peer_credential, verify_peer_credential
from ..errors import AuthenticationError, ErrorCode, UnavailableError, YtError
from ..httpconn import dumps_json
from ..node import Cluster
from ..node.serving import leader_status
from ..storage.leadership import Leadership
from .body import read_body
from .commands import BODY_BYTES, COMMANDS, Command
from .formats import (
    Format,
    Limit,
    check_unicode,
    dump_plain_structured,
    dump_rows,
    dump_structured,
    has_surrogate_escape,
    load_rows,
    load_structured,
    parse_format,
)
from .incoming import Call, Incoming
from .inline import inline_internal
from .params import arg_bool, decode_header_value, encode_header_value, header_format_of, query_value
from .results import Plain, WithParameters

log = logging.getLogger("reptables.engine.http")

def _header_safe(text: str) -> str:
    """One printable ASCII line: HTTP header values may not carry newlines or control bytes."""
    first = text.splitlines()[0] if text else ""
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in first)[:1000]


#: longest ``X-YT-Error`` header value: errors naming a 70,000-character path must not break the
#: header parsers of clients and proxies (h11 stops at 16 KiB of headers, nginx at 4-8 KiB)
MAX_ERROR_HEADER = 4096


_TRUNCATED = " [X-YT-Error truncated: the response body has the whole error]"


def _cut(value: Any, size: int) -> Any:
    """``value`` with every string cut to ``size`` characters and long lists and maps shortened."""
    if isinstance(value, str):
        return value if len(value) <= size else value[:size] + "..."
    if isinstance(value, dict):
        return {str(k)[:size]: _cut(v, size) for k, v in list(value.items())[:20]}
    if isinstance(value, list | tuple):
        return [_cut(v, size) for v in value[:10]]
    return value


def _bounded_error_header(payload: dict[str, Any], full: str) -> str:
    """The error as one JSON line of at most MAX_ERROR_HEADER characters: long strings in its
    attributes and inner errors cut first, then the message; it then says so. The response body
    always carries the whole error."""
    if len(full) <= MAX_ERROR_HEADER:
        return full
    message = str(payload.get("message", ""))
    for size in (1000, 200, 40):
        short = {"code": payload.get("code"), "message": _cut(message, 2 * size) + _TRUNCATED,
                 "attributes": _cut(payload.get("attributes") or {}, size),
                 "inner_errors": _cut(payload.get("inner_errors") or [], size)}
        header = json.dumps(short, ensure_ascii=True, default=str)
        if len(header) <= MAX_ERROR_HEADER:
            return header
    return json.dumps({"code": payload.get("code"), "message": _cut(message, 80) + _TRUNCATED,
                      "attributes": {}, "inner_errors": []}, ensure_ascii=True, default=str)


def error_response(error: YtError, request_id: str, headers: dict[str, str] | None = None) -> Response:
    payload = error.to_dict()
    body = json.dumps(payload, ensure_ascii=True, default=str)
    return Response(
        content=body.encode("utf-8"), status_code=error.http_status, media_type="application/json",
        headers={"X-YT-Error": _bounded_error_header(payload, body), "X-YT-Response-Code": str(error.code),
                 "X-YT-Response-Message": _header_safe(error.message),
                 "X-YT-Request-Id": request_id, **(headers or {})})


#: what the database raises that is not the engine's fault (see _storage_error)
_STORAGE_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                   sqlalchemy.exc.PendingRollbackError, sqlalchemy.exc.DataError)


def _storage_error(what: str, exc: BaseException, **context: str) -> YtError:
    """The answer for a database error: the database is away (a restart, a network fault) or a
    connection it dropped is not yet replaced - retriable (105); or it refused a value the engine
    handed it (PostgreSQL: a NUL character in text, a number out of a column's range) - the
    caller's (400), nothing applied. The first line of the driver's message: it names host and
    port, never a password."""
    cause = getattr(exc, "orig", None) or exc
    reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    if isinstance(exc, sqlalchemy.exc.DataError):
        log.info("the database refused a value", extra={**context, "error": reason})
        return YtError(f"{what}: the database refused a value: {reason}", code=ErrorCode.INVALID_PARAMETER,
                       http_status=400)
    log.warning("storage unavailable", extra={**context, "error": reason})
    return UnavailableError(f"Storage is temporarily unavailable: {reason}")


def _internal_error(what: str, exc: BaseException, **context: str) -> YtError:
    """An exception no layer turned into a YT error: the engine's fault. One short log line; the
    traceback at debug level only."""
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    log.error("%s failed: %s%s", what, type(exc).__name__, f": {first}" if first else "",
              extra={**context, "error_type": type(exc).__name__})
    log.debug("%s failed", what, exc_info=exc, extra=context)
    return YtError(f"{what} failed with an internal error ({type(exc).__name__}); see the engine log",
                   code=ErrorCode.GENERIC, http_status=500, attributes={"error_type": type(exc).__name__})



#: the API commands a peer credential may run (on its own replica tables): reads served by replicas
_PEER_READS = frozenset({"get", "lookup_rows", "select_rows"})


def create_app(cluster: Cluster, token: str) -> ASGIApp:
    """The ASGI app of one engine; ``token`` is required on every API command.

    On PostgreSQL the engine serves only while it holds its database (``storage/leadership.py``):
    a leader whose lease ran out by its own clock, or that another engine replaced, answers every
    command and internal call 105 naming the leader (``not_leader``: it did nothing with the request)
    and ``/readyz`` 503. ``/leadership`` (the API token) says which lease it holds and which database
    server it reached (``node/serving.py``)."""
    engine_metrics = cluster.metrics
    #: who serves the database (None: SQLite); asked on every request (a reference and a clock read)
    lead = cluster.storage.leadership

    _metric = engine_metrics.child

    def _presented(request: Incoming) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() not in ("oauth", "bearer") or not value.strip():
            raise AuthenticationError("Authentication failed: this engine requires a token "
                                      "(header \"Authorization: OAuth <token>\")")
        return value.strip()

    def authenticate(request: Incoming, command: str | None = None) -> str | None:
        """The API takes the cluster's token (answer: None). A peer credential is good for
        /internal/v1, and here only for the reads a meta-cluster serves from its in-sync replicas
        (answer: the caller, whose read :meth:`Cluster.check_peer_read` then checks)."""
        value = _presented(request)
        if hmac.compare_digest(value.encode(), token.encode()):
            return None
        if is_peer_credential(value):
            if command in _PEER_READS:
                return authenticate_peer(request)
            raise AuthenticationError("Authentication failed: a peer credential is valid only for "
                                      "cluster-to-cluster calls and replica reads, not for this command")
        raise AuthenticationError("Authentication failed: the token is not valid for this cluster")

    def authenticate_peer(request: Incoming) -> str:
        """The calling cluster's name, from its peer credential (engine/credentials.py)."""
        value = _presented(request)
        caller = verify_peer_credential(token, value)
        if caller is None:
            if hmac.compare_digest(value.encode(), token.encode()):
                raise AuthenticationError(
                    f"Authentication failed: cluster {cluster.name} takes cluster-to-cluster calls only with a "
                    "peer credential (the caller's //sys/clusters entry for this cluster must hold "
                    "\"peer:<caller>:<mac>\", see `reptables peer-credential`), not with its API token")
            raise AuthenticationError(f"Authentication failed: the peer credential is not valid for cluster "
                                      f"{cluster.name}")
        if not cluster.peers.known(caller):
            # a cluster removed from the directory is cut off, whatever credential it still holds
            raise YtError(f"Cluster {caller} may not call cluster {cluster.name}: it is not in "
                          f"//sys/clusters of {cluster.name}", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"cluster_name": caller})
        return caller

    #: peer credentials verified already -> the caller they name. The token is fixed for the app's
    #: life, so a credential once valid stays valid; what may change, the directory, is asked on
    #: every call (``peers.known``). Bounded: a flood of distinct valid credentials (there are as many
    #: as clusters) only empties it. Read and written from the event loop only.
    verified: dict[str, str] = {}

    def peer_of(request: Incoming) -> str:
        """:func:`authenticate_peer`, the HMAC computed once per credential (a sync replica checks one
        per internal call, two per single-row commit)."""
        value = request.headers.get("authorization", "")
        caller = verified.get(value)
        if caller is None or not cluster.peers.known(caller):
            caller = authenticate_peer(request)
            if len(verified) >= _MAX_VERIFIED:
                verified.clear()
            verified[value] = caller
        return caller

    async def api(request: Request) -> Response:
        return JSONResponse(["v3", "v4"])

    async def api_v4(request: Request) -> Response:
        return JSONResponse([cmd.descriptor() for name, cmd in sorted(COMMANDS.items())
                             if name == cmd.name])

    async def hosts(request: Request) -> Response:
        host = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
        return JSONResponse([host])

    async def healthz(request: Request) -> Response:
        # alive unless its memory is ahead of its database (PostgreSQL lost asynchronous commits), or
        # it stepped down (another engine leads now): only a restart mends either, so a liveness
        # probe should restart it
        if lead is not None and lead.lost is not None:
            return JSONResponse({"status": "failed", "reason": f"stepped down: {lead.lost}",
                                 "leader": _leader_url(lead)}, status_code=503)
        if cluster.storage.diverged is not None:
            return JSONResponse({"status": "failed", "reason": f"{cluster.storage.diverged}; restart the engine"},
                                status_code=503)
        return JSONResponse({"status": "ok", "cluster_name": cluster.name, "version": __version__})

    async def readyz(request: Request) -> Response:
        if lead is not None and not lead.serving():
            # a leader whose lease ran out, or that stepped down: not where requests should go
            return JSONResponse({"status": "unavailable", "reason": lead.not_serving_error().message,
                                 "leader": _leader_url(lead)}, status_code=503)
        try:
            await run_in_threadpool(cluster.storage.get_meta, "cluster_name")
        except Exception as exc:  # noqa: BLE001 - readiness reports any storage failure
            return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
        # a database file found damaged by any statement keeps the engine unready until a restart
        # checks it again: the intact pages read here must not make it look healthy
        if cluster.storage.corruption is not None:
            return JSONResponse({"status": "unavailable", "reason": f"the database file is damaged "
                                 f"({cluster.storage.corruption}); restart the engine to check it"}, status_code=503)
        if cluster.storage.diverged is not None:
            return JSONResponse({"status": "unavailable", "reason": f"{cluster.storage.diverged}; restart the "
                                 "engine"}, status_code=503)
        return JSONResponse({"status": "ready", "cluster_name": cluster.name})

    async def metrics(request: Request) -> Response:
        # the API token here; Prometheus without one scrapes the metrics listener (--metrics-port,
        # api/server.py), which serves nothing else (docs/security.md)
        try:
            authenticate(request)
        except YtError as error:
            return error_response(error, os.urandom(8).hex())
        # a worker thread: the state collector reads SQL (engine/metrics.py), never on the event loop
        return Response(await run_in_threadpool(generate_latest, engine_metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    async def leadership(request: Request) -> Response:
        # who serves the cluster and on which database server (node/serving.py): behind the API
        # token, like /metrics on this port; a standby never gets here (standby_app answers 105)
        request_id = os.urandom(8).hex()
        try:
            if lead is not None and not lead.serving():
                raise lead.not_serving_error()
            authenticate(request)
            return JSONResponse(await run_in_threadpool(leader_status, cluster.name, cluster.storage))
        except YtError as error:
            return error_response(error, request_id)
        except _STORAGE_ERRORS as exc:
            return error_response(_storage_error("GET /leadership", exc), request_id)

    async def command(request: Call) -> Response:
        name = request.path_params["command"]
        request_id = os.urandom(8).hex()
        started = time.perf_counter()
        outcome = "error"
        try:
            if lead is not None and not lead.serving():
                # not the leader now (a lease run out by this engine's clock, or replaced): nothing
                # served from memory that another engine's writes may have made stale
                raise lead.not_serving_error()
            cmd = COMMANDS.get(name)
            if cmd is None:
                raise YtError(f"Command {name!r} is not supported by this proxy (API v4)",
                              code=ErrorCode.NO_SUCH_METHOD, http_status=404)
            caller = authenticate(request, cmd.name)
            response = await _execute(request, cmd, request_id, caller)
            outcome = "ok"
            return response
        except YtError as error:
            return error_response(error, request_id)
        except _STORAGE_ERRORS as exc:
            return error_response(_storage_error(f"Command {name!r}", exc, command=name), request_id)
        except Exception as exc:  # noqa: BLE001 - the API must answer every request with a YT error
            internal = _internal_error(f"Command {name!r}", exc, command=name, request_id=request_id)
            return error_response(internal, request_id)
        finally:
            counted = name if name in COMMANDS else "unknown"
            _metric(engine_metrics.requests, counted, outcome).inc()
            _metric(engine_metrics.latency, counted).observe(time.perf_counter() - started)

    def _safe_inline(cmd: Command, params: dict[str, Any], body_bytes: int) -> bool:
        assert cmd.inline is not None
        try:
            return cmd.inline(cluster, params, body_bytes)
        except YtError:
            return False  # the handler, in the pool, gives the error

    async def _execute(request: Call, cmd: Command, request_id: str, caller: str | None = None) -> Response:
        header_format = header_format_of(request)
        params: dict[str, Any] = {k: query_value(v) for k, v in request.query_params.items()}
        raw_header = request.headers.get("x-yt-parameters")
        if raw_header:
            decoded = decode_header_value(raw_header, header_format)
            if not isinstance(decoded, dict):
                raise YtError("X-YT-Parameters must be a map", code=ErrorCode.PROTOCOL_ERROR)
            params.update(decoded)
        body = await read_body(request, cluster.config.max_body_bytes)
        if cmd.input_type is None and body.strip():
            decoded = load_structured(body, Format(header_format, {}))
            if not isinstance(decoded, dict):
                raise YtError("Request body of a command without input must be a map of parameters",
                              code=ErrorCode.PROTOCOL_ERROR)
            params.update(decoded)
        input_value: Any = None
        params[BODY_BYTES] = len(body)
        if cmd.input_type is not None:
            fmt = parse_format(params.get("input_format") or request.headers.get("x-yt-input-format"))
            if cmd.input_type == "tabular":
                limit = _input_row_limit(cmd)
                input_value = await run_in_threadpool(load_rows, body, fmt, limit) if len(body) > 65536 \
                    else load_rows(body, fmt, limit)
            else:
                input_value = load_structured(body, fmt)
        if caller is not None:
            cluster.rows.check_peer_read(caller, cmd.name, params)
        if cmd.inline is not None and _safe_inline(cmd, params, len(body)):
            result = cmd.handler(cluster, params, input_value)
        else:
            result = await run_in_threadpool(cmd.handler, cluster, params, input_value)
        headers = {"X-YT-Response-Code": "0", "X-YT-Request-Id": request_id}
        if isinstance(result, WithParameters):
            # (YT's response parameters: the official client reads them, docs/streams.md)
            headers["X-YT-Response-Parameters"] = encode_header_value(result.parameters, header_format)
            result = result.result
        if arg_bool(params, "return_only_value") and isinstance(result, dict) and "value" in result:
            result = result["value"]
        if cmd.output_type is None:
            return _Answer(b"", None, headers)
        fmt = parse_format(params.get("output_format") or request.headers.get("x-yt-output-format"),
                           default="json" if cmd.output_type == "structured" and header_format == "json"
                           else "yson")
        if isinstance(result, Plain):
            plain = result.value
            big = len(plain) > 256 * 1024 if isinstance(plain, bytes) else \
                isinstance(plain, dict) and len(plain.get("events", ())) > 1000
            # (one orjson call: microseconds a change; a big answer off the event loop)
            content = await run_in_threadpool(dump_plain_structured, plain, fmt) if big \
                else dump_plain_structured(plain, fmt)
        elif cmd.output_type == "tabular":
            limit = _output_limit(cmd)
            content = await run_in_threadpool(dump_rows, result, fmt, limit) if len(result) > 100 \
                else dump_rows(result, fmt, limit)
        else:
            content = dump_structured(result, fmt)
        media = "application/json" if fmt.name == "json" else "application/x-yt-yson-binary"
        return _Answer(content, media, headers)

    def _input_row_limit(cmd: Command) -> Limit:
        """Rows one request may carry: a write's are bounded by what one transaction may hold (a
        body with more can never commit), a lookup's keys by ``max_lookup_keys``."""
        config = cluster.config
        if cmd.is_volatile:  # insert_rows, delete_rows, lock_rows
            rows = config.max_rows_per_transaction
            return Limit(rows, lambda: YtError(
                f"Request of {cmd.name} carries more than {rows} rows, the limit of rows per transaction "
                "(max_rows_per_transaction): split it into several transactions",
                code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION, attributes={"limit": rows}))
        keys = config.max_lookup_keys
        return Limit(keys, lambda: YtError(
            f"Request of {cmd.name} carries more than {keys} keys, the limit of keys per request "
            "(max_lookup_keys): split it into several requests",
            code=ErrorCode.INVALID_PARAMETER, attributes={"max_lookup_keys": keys}))

    def _output_limit(cmd: Command) -> Limit:
        size = cluster.config.max_output_bytes
        return Limit(size, lambda: YtError(
            f"Answer of {cmd.name} exceeds the output limit of {size} bytes (max_output_bytes): "
            "narrow the query with a WHERE condition or a LIMIT, or read fewer keys at once",
            code=ErrorCode.INVALID_PARAMETER, attributes={"max_output_bytes": size}))

    # each takes the request body and the calling cluster's name
    internal_methods: dict[str, Callable[[dict[str, Any], str], Any]] = {
        "prepare": cluster.replication.handle_prepare,
        "commit": cluster.replication.handle_commit,
        "abort": cluster.replication.handle_abort,
        "push": cluster.replication.handle_push,
        "bootstrap_write": cluster.replication.handle_bootstrap_write,
        "lease_snapshot": cluster.snapshots.lease_snapshot,
        "release_snapshot": cluster.snapshots.release_snapshot,
        "transaction_status": lambda body, _caller: cluster.transactions.transaction_status(
            str(body["transaction_id"])),
        "table_info": lambda body, caller: cluster.replication.table_info(body.get("path"), caller),
        "xdcr_apply": cluster.xdcr.handle_apply,
        "xdcr_forget": cluster.xdcr.handle_forget,
        "xdcr_snapshot": cluster.xdcr.handle_snapshot,
        "xdcr_snapshot_read": cluster.xdcr.handle_snapshot_read,
        "xdcr_snapshot_release": cluster.xdcr.handle_snapshot_release,
        "xdcr_identity": cluster.xdcr.handle_identity,
    }

    async def internal(request: Call) -> Response:
        """Cluster-to-cluster calls (2PC with sync replicas, replicator pushes), JSON in and out.

        A sync replica answers two of these per single-row commit (its prepare, then the commit
        decision), so the answer is built as a command's is (``_Answer``: orjson, headers in one
        pass; Starlette's ``JSONResponse`` and a request id made for every call cost about a tenth of
        the replica's interpreter time per commit). The request id is made only for an error."""
        method = request.path_params["method"]
        # (a name not served is counted as "unknown": the label values stay a fixed set, whatever
        # names unauthenticated callers send)
        requests = engine_metrics.requests
        counted = f"internal:{method}" if method in internal_methods else "internal:unknown"
        try:
            if lead is not None and not lead.serving():
                raise lead.not_serving_error()
            handler = internal_methods.get(method)
            if handler is None:
                raise YtError(f"Unknown internal method {method!r}", code=ErrorCode.NO_SUCH_METHOD, http_status=404)
            caller = peer_of(request)
            raw = await read_body(request, cluster.config.max_body_bytes) or b"{}"
            try:
                # pushes carry up to 90,000 rows: orjson, unless the standard parser is needed for
                # NaN/Infinity (which only the standard encoder writes)
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = None
            try:
                if body is None:
                    body = json.loads(raw)
                    if has_surrogate_escape(raw):
                        check_unicode(body)  # (orjson refuses lone surrogates; the standard parser does not)
            except ValueError as exc:
                raise YtError(f"Malformed JSON in internal request: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
            if not isinstance(body, dict):
                raise YtError("Internal request body must be a JSON object", code=ErrorCode.PROTOCOL_ERROR)
            try:
                if inline_internal(cluster, method, body, len(raw)):
                    result = handler(body, caller)
                else:
                    result = await run_in_threadpool(handler, body, caller)
            except KeyError as exc:
                raise YtError(f"Internal request {method} misses field {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
            answer = _Answer(dumps_json(result if result is not None else {}), "application/json", _NO_HEADERS)
            _metric(requests, counted, "ok").inc()
            return answer
        except YtError as error:
            _metric(requests, counted, "error").inc()
            return error_response(error, os.urandom(8).hex())
        except _STORAGE_ERRORS as exc:
            _metric(requests, counted, "error").inc()
            return error_response(_storage_error(f"Internal call {method!r}", exc, method=method),
                                  os.urandom(8).hex())
        except Exception as exc:  # noqa: BLE001 - every failure is a YT error for the peer
            _metric(requests, counted, "error").inc()
            request_id = os.urandom(8).hex()
            return error_response(_internal_error(f"Internal call {method!r}", exc, method=method,
                                                   request_id=request_id), request_id)

    async def routed_command(request: Request) -> Response:
        return await command(Call(request.scope, request.receive))

    async def routed_internal(request: Request) -> Response:
        return await internal(Call(request.scope, request.receive))

    routes = [  # the commands first: routes are matched in order
        Route("/api/v4/{command}", routed_command, methods=["GET", "POST", "PUT"]),
        Route("/api", api, methods=["GET"]),
        Route("/api/v4", api_v4, methods=["GET"]),
        Route("/api/v4/", api_v4, methods=["GET"]),
        Route("/internal/v1/{method}", routed_internal, methods=["POST"]),
        Route("/hosts", hosts, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/leadership", leadership, methods=["GET"]),
    ]
    routed = Starlette(routes=routes)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        """Commands and internal calls straight to their handler; the rest through Starlette's router.

        Every command and internal call passed Starlette's two exception middlewares, its router's
        match of each route in turn and two more wrappers before its handler: about 5 % of a
        single-row commit's engine CPU (benchmarks/README.md), for nothing here - the handlers answer
        every failure themselves (a YT error, or a 500 with one log line) and the two routes are
        fixed prefixes. Anything else, and any method these routes do not take, goes to the router
        as before (its 404 and 405 answers, the lifespan)."""
        if scope["type"] == "http" and scope["method"] in _ROUTED_METHODS:
            path: str = scope["path"]
            handler = command if path.startswith("/api/v4/") else internal if path.startswith("/internal/v1/") \
                else None
            if handler is not None:
                name = path[8:] if handler is command else path[13:]
                if name and "/" not in name and (handler is command or scope["method"] == "POST"):
                    scope["path_params"] = {"command" if handler is command else "method": name}
                    response = await handler(Call(scope, receive))
                    await response(scope, receive, send)
                    return
        await routed(scope, receive, send)

    return app


class _Answer(Response):
    """A command's answer: Starlette's ``Response`` with its header list built in one pass from
    names and values that need no checking (ours), as ``Response`` would build it - the headers,
    then ``content-length`` and, with a body type, ``content-type``. It is sent as any response."""

    def __init__(self, body: bytes, media_type: str | None, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        raw.append((b"content-length", str(len(body)).encode("latin-1")))
        if media_type is not None:
            raw.append((b"content-type", media_type.encode("latin-1")))
        self.raw_headers = raw


#: no more headers than ``_Answer`` adds (an internal call's answer)
_NO_HEADERS: dict[str, str] = {}
#: peer credentials remembered as verified (one per calling cluster is the need)
_MAX_VERIFIED = 256

#: the methods of the command route (the internal one takes POST only)
_ROUTED_METHODS = frozenset({"GET", "POST", "PUT"})


def _leader_url(lead: Leadership) -> str | None:
    """The address of the engine that holds the lease, if another one does (None: unknown)."""
    leader = lead.leader
    return leader.address if leader is not None and leader.held and leader.holder != lead.holder else None


def standby_app(cluster_name: str, lead: Leadership) -> Starlette:
    """The ASGI app of a standby engine (``engine serve --standby`` before it wins the lease): alive
    (``/healthz`` 200), not ready (``/readyz`` 503 ``{"status": "standby", "leader": <address>}``; once it
    won the lease and loads the cluster's state, ``{"status": "starting", "reason": ...}``), and
    every other request - commands, internal calls, descriptors - answered 105 naming the leader's
    address (``leader_url``), without looking at its token: a standby serves nothing, so nothing is
    guarded, and a client with any token learns where to go."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "role": "standby", "cluster_name": cluster_name, "version": __version__})

    async def readyz(request: Request) -> Response:
        if lead.epoch is not None and lead.lost is None:
            # it won the lease and loads the cluster's state: no longer a standby, not serving yet (and
            # it names no leader: it is the leader)
            return JSONResponse({"status": "starting", "cluster_name": cluster_name,
                                 "reason": lead.not_serving_error().message}, status_code=503)
        return JSONResponse({"status": "standby", "cluster_name": cluster_name, "leader": _leader_url(lead)},
                            status_code=503)

    async def refuse(request: Request) -> Response:
        return error_response(lead.not_serving_error(), os.urandom(8).hex())

    async def metrics(request: Request) -> Response:
        return Response(b"", media_type=CONTENT_TYPE_LATEST)  # a standby has no engine to measure yet

    return Starlette(routes=[
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/{path:path}", refuse, methods=["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"]),
    ])


class LeaderGate:
    """The ASGI app a standby listens with: its standby app until :meth:`serve` hands it the engine's
    app (the lease won and the node built), then that. Switching is one reference assignment; a
    request already in the standby app finishes there. The ASGI lifespan stays with the app it began
    in (Starlette's: nothing to start or stop)."""

    def __init__(self, standby: ASGIApp) -> None:
        self._app = standby

    def serve(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)
