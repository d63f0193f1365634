"""The YTsaurus HTTP proxy protocol (API v4) over a :class:`~reptables.engine.node.Cluster`.

This layer only translates: it reads parameters (``X-YT-Parameters`` in the header format, the
query string, or the body of a volatile command), decodes the body in the input format,
calls one method of the cluster in a worker thread, and encodes the result in the output format.
The command descriptors at ``GET /api/v4`` tell the official client which HTTP method, input and
output kind each command uses — the client builds its requests from them, so they must be right.

Every failure becomes a YT error (``X-YT-Error`` header plus JSON body) with a 4xx status; only a
storage that is momentarily unavailable answers 503, which clients retry.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
import uuid
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

from .. import __version__
from ..errors import AuthenticationError, ErrorCode, UnavailableError, YtError
from ..node import Cluster
from .commands import _BODY_BYTES, COMMANDS, Command
from .formats import Format, dump_rows, dump_structured, load_rows, load_structured, parse_format
from .inline import inline_internal
from .params import _bool, _decode_header_value, _decompress, _header_format, _query_value

log = logging.getLogger("reptables.engine.http")

def _header_safe(text: str) -> str:
    """One printable ASCII line: HTTP header values may not carry newlines or control bytes."""
    first = text.splitlines()[0] if text else ""
    return "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in first)[:1000]


def _error_response(error: YtError, request_id: str) -> Response:
    payload = error.to_dict()
    header = json.dumps(payload, ensure_ascii=True, default=str)
    return Response(
        content=header.encode("utf-8"), status_code=error.http_status, media_type="application/json",
        headers={"X-YT-Error": header, "X-YT-Response-Code": str(error.code),
                 "X-YT-Response-Message": _header_safe(error.message),
                 "X-YT-Request-Id": request_id})



def create_app(cluster: Cluster, token: str) -> Starlette:
    """The ASGI app of one engine; ``token`` is required on every API command."""
    engine_metrics = cluster.metrics
    children: dict[tuple[str, tuple[str, ...]], Any] = {}

    def _metric(metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: prometheus_client resolves labels on every call."""
        key = (metric._name, labels)
        child = children.get(key)
        if child is None:
            child = children[key] = metric.labels(*labels)
        return child

    def authenticate(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() not in ("oauth", "bearer") or not value:
            raise AuthenticationError("Authentication failed: this engine requires a token "
                                      "(header \"Authorization: OAuth <token>\")")
        if not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise AuthenticationError("Authentication failed: the token is not valid for this cluster")

    async def api(request: Request) -> Response:
        return JSONResponse(["v3", "v4"])

    async def api_v4(request: Request) -> Response:
        return JSONResponse([cmd.descriptor() for name, cmd in sorted(COMMANDS.items())
                             if name == cmd.name])

    async def hosts(request: Request) -> Response:
        host = request.headers.get("host") or f"{request.url.hostname}:{request.url.port}"
        return JSONResponse([host])

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "cluster_name": cluster.name, "version": __version__})

    async def readyz(request: Request) -> Response:
        try:
            await run_in_threadpool(cluster.storage.get_meta, "cluster_name")
        except Exception as exc:  # noqa: BLE001 - readiness reports any storage failure
            return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready", "cluster_name": cluster.name})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(engine_metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def command(request: Request) -> Response:
        name = request.path_params["command"]
        request_id = os.urandom(8).hex()
        started = time.perf_counter()
        outcome = "error"
        try:
            cmd = COMMANDS.get(name)
            if cmd is None:
                raise YtError(f"Command {name!r} is not supported by this proxy (API v4)",
                              code=ErrorCode.NO_SUCH_METHOD, http_status=404)
            authenticate(request)
            response = await _execute(request, cmd)
            outcome = "ok"
            response.headers["X-YT-Request-Id"] = request_id
            return response
        except YtError as error:
            return _error_response(error, request_id)
        except sqlalchemy.exc.OperationalError as exc:
            log.warning("storage unavailable", extra={"command": name, "error": str(exc)})
            return _error_response(UnavailableError(f"Storage is temporarily unavailable: {exc.orig}"), request_id)
        except Exception as exc:  # noqa: BLE001 - the API must answer every request with a YT error
            log.exception("command failed", extra={"command": name})
            return _error_response(YtError(f"Command {name!r} failed: {type(exc).__name__}: {exc}"), request_id)
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

    async def _execute(request: Request, cmd: Command) -> Response:
        header_format = _header_format(request)
        params: dict[str, Any] = {k: _query_value(v) for k, v in request.query_params.items()}
        raw_header = request.headers.get("x-yt-parameters")
        if raw_header:
            decoded = _decode_header_value(raw_header, header_format)
            if not isinstance(decoded, dict):
                raise YtError("X-YT-Parameters must be a map", code=ErrorCode.PROTOCOL_ERROR)
            params.update(decoded)
        content_length = int(request.headers.get("content-length") or 0)
        if content_length > cluster.config.max_body_bytes:
            raise YtError(f"Request body of {content_length} bytes exceeds the limit of "
                          f"{cluster.config.max_body_bytes} bytes",
                          code=ErrorCode.PROTOCOL_ERROR, http_status=413)
        body = _decompress(await request.body(), request.headers.get("content-encoding", ""))
        if cmd.input_type is None and body.strip():
            decoded = load_structured(body, Format(header_format, {}))
            if not isinstance(decoded, dict):
                raise YtError("Request body of a command without input must be a map of parameters",
                              code=ErrorCode.PROTOCOL_ERROR)
            params.update(decoded)
        input_value: Any = None
        params[_BODY_BYTES] = len(body)
        if cmd.input_type is not None:
            fmt = parse_format(params.get("input_format") or request.headers.get("x-yt-input-format"))
            if cmd.input_type == "tabular":
                input_value = await run_in_threadpool(load_rows, body, fmt) if len(body) > 65536 \
                    else load_rows(body, fmt)
            else:
                input_value = load_structured(body, fmt)
        if cmd.inline is not None and _safe_inline(cmd, params, len(body)):
            result = cmd.handler(cluster, params, input_value)
        else:
            result = await run_in_threadpool(cmd.handler, cluster, params, input_value)
        if _bool(params, "return_only_value") and isinstance(result, dict) and "value" in result:
            result = result["value"]
        if cmd.output_type is None:
            return Response(status_code=200, headers={"X-YT-Response-Code": "0"})
        fmt = parse_format(params.get("output_format") or request.headers.get("x-yt-output-format"),
                           default="json" if cmd.output_type == "structured" and header_format == "json"
                           else "yson")
        if cmd.output_type == "tabular":
            content = await run_in_threadpool(dump_rows, result, fmt) if len(result) > 100 \
                else dump_rows(result, fmt)
        else:
            content = dump_structured(result, fmt)
        media = "application/json" if fmt.name == "json" else "application/x-yt-yson-binary"
        return Response(content=content, media_type=media, headers={"X-YT-Response-Code": "0"})

    internal_methods: dict[str, Callable[[dict[str, Any]], Any]] = {
        "prepare": cluster.replication.handle_prepare,
        "commit": cluster.replication.handle_commit,
        "abort": cluster.replication.handle_abort,
        "push": cluster.replication.handle_push,
        "transaction_status": lambda body: cluster.transactions.transaction_status(str(body["transaction_id"])),
        "table_info": lambda body: cluster.replication.table_info(str(body["path"])),
    }

    async def internal(request: Request) -> Response:
        """Cluster-to-cluster calls (2PC with sync replicas, replicator pushes), JSON in and out."""
        method = request.path_params["method"]
        request_id = uuid.uuid4().hex[:16]
        try:
            handler = internal_methods.get(method)
            if handler is None:
                raise YtError(f"Unknown internal method {method!r}", code=ErrorCode.NO_SUCH_METHOD, http_status=404)
            authenticate(request)
            raw = await request.body() or b"{}"
            try:
                # pushes carry up to 90,000 rows: orjson, unless the standard parser is needed for
                # NaN/Infinity (which only the standard encoder writes)
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = None
            try:
                if body is None:
                    body = json.loads(raw)
            except ValueError as exc:
                raise YtError(f"Malformed JSON in internal request: {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
            if not isinstance(body, dict):
                raise YtError("Internal request body must be a JSON object", code=ErrorCode.PROTOCOL_ERROR)
            try:
                if inline_internal(cluster, method, body, len(raw)):
                    result = handler(body)
                else:
                    result = await run_in_threadpool(handler, body)
            except KeyError as exc:
                raise YtError(f"Internal request {method} misses field {exc}", code=ErrorCode.PROTOCOL_ERROR) from None
            engine_metrics.requests.labels(command=f"internal:{method}", outcome="ok").inc()
            return JSONResponse(result if result is not None else {})
        except YtError as error:
            engine_metrics.requests.labels(command=f"internal:{method}", outcome="error").inc()
            return _error_response(error, request_id)
        except Exception as exc:  # noqa: BLE001 - every failure is a YT error for the peer
            log.exception("internal call failed", extra={"method": method})
            return _error_response(YtError(f"Internal call {method!r} failed: {type(exc).__name__}: {exc}"),
                                   request_id)

    routes = [  # the commands first: routes are matched in order
        Route("/api/v4/{command}", command, methods=["GET", "POST", "PUT"]),
        Route("/api", api, methods=["GET"]),
        Route("/api/v4", api_v4, methods=["GET"]),
        Route("/api/v4/", api_v4, methods=["GET"]),
        Route("/internal/v1/{method}", internal, methods=["POST"]),
        Route("/hosts", hosts, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes)
