"""The YTsaurus HTTP proxy protocol (API v4) over a :class:`~reptables.engine.cluster.Cluster`.

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
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy.exc
import yt.yson as yson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__, yson_util
from ..errors import AuthenticationError, ErrorCode, UnavailableError, YtError
from ..node import Cluster
from .formats import (
    Format,
    dump_rows,
    dump_structured,
    load_rows,
    load_structured,
    parse_format,
)

log = logging.getLogger("reptables.engine.http")

#: the largest request body accepted (a batch of rows); larger bodies get a clear error
MAX_BODY_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Command:
    name: str
    input_type: str | None
    output_type: str | None
    is_volatile: bool
    is_heavy: bool
    handler: Callable[[Cluster, dict[str, Any], Any], Any]
    #: whether a request may run on the event loop itself (see ``_inline``); None: never
    inline: Callable[[Cluster, dict[str, Any], int], bool] | None = None

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "input_type": self.input_type or "null",
                "output_type": self.output_type or "null", "is_volatile": self.is_volatile,
                "is_heavy": self.is_heavy}


def _p(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = params.get(name, default)
    return yson_util.to_python(value) if value is not None else default


def _path(params: dict[str, Any]) -> Any:
    if "path" not in params:
        raise YtError("Missing required parameter \"path\"", code=ErrorCode.INVALID_PARAMETER)
    return params["path"]


def _bool(params: dict[str, Any], name: str, default: bool = False) -> bool:
    value = _p(params, name)
    if value is None:
        return default
    if isinstance(value, str):
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise YtError(f"Parameter {name!r} must be a boolean, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return bool(value)


def _int(params: dict[str, Any], name: str, default: Any = None) -> Any:
    value = _p(params, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise YtError(f"Parameter {name!r} must be an integer, got {value!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def _str_list(params: dict[str, Any], name: str) -> list[str] | None:
    value = _p(params, name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise YtError(f"Parameter {name!r} must be a list of strings", code=ErrorCode.INVALID_PARAMETER)
    return value


def _tx(params: dict[str, Any]) -> str | None:
    value = _p(params, "transaction_id")
    if not value or value == "0-0-0-0":
        return None
    return str(value)


def _required_str(params: dict[str, Any], name: str) -> str:
    value = _p(params, name)
    if not isinstance(value, str) or not value:
        raise YtError(f"Missing required parameter {name!r}", code=ErrorCode.INVALID_PARAMETER)
    return value


def _rows(body: Any) -> list[Any]:
    return body if isinstance(body, list) else []


COMMANDS: dict[str, Command] = {}
#: a pseudo-parameter the protocol layer adds: the decoded request body's size in bytes
_BODY_BYTES = "\0body_bytes"


def _command(name: str, input_type: str | None, output_type: str | None, volatile: bool, heavy: bool = False,
             aliases: tuple[str, ...] = (),
             inline: Callable[[Cluster, dict[str, Any], int], bool] | None = None,
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[[Cluster, dict[str, Any], Any], Any]) -> Callable[..., Any]:
        for n in (name, *aliases):
            COMMANDS[n] = Command(n, input_type, output_type, volatile, heavy, fn, inline)
        return fn
    return register


# -- which requests run on the event loop ------------------------------------------------------------
#
# Handing a request to a worker thread and back costs ~0.4 ms here, more than a point lookup or a
# one-row commit itself. Small requests that cannot wait on anything - no other cluster (replicated
# tables), no in-flight commit (reads at a timestamp), no busy writer - run on the event loop
# instead; everything else, and anything big, runs in the thread pool so the loop stays free.

#: a request body up to this size may be served on the event loop
INLINE_BODY_BYTES = 64 * 1024


def _inline_lookup(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    return (body_bytes <= INLINE_BODY_BYTES and p.get("timestamp") is None and _tx(p) is None
            and c.is_plain_table(p.get("path")))


def _inline_write(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    # inside a transaction a write is only buffered; else it commits, and must not wait for the writer
    return (body_bytes <= INLINE_BODY_BYTES and c.is_plain_table(p.get("path"))
            and (_tx(p) is not None or not c.storage.write_busy()))


def _always(c: Cluster, p: dict[str, Any], body_bytes: int) -> bool:
    return True


#: cluster-to-cluster calls that never wait for another cluster (so may run on the event loop)
_INLINE_INTERNAL = frozenset({"prepare", "commit", "abort", "push", "transaction_status"})


@_command("create", None, "structured", True)
def _create(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    kind = _required_str(p, "type")
    path = p.get("path") if kind in ("table_replica", "table_collocation") else _path(p)
    node_id = c.create(kind, path, p.get("attributes"), _bool(p, "recursive"),
                       _bool(p, "ignore_existing"), _bool(p, "force"))
    return {"node_id": node_id}


@_command("get", None, "structured", False)
def _get(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.get(_path(p), _str_list(p, "attributes"))}


@_command("set", "structured", None, True)
def _set(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.set(_path(p), body, _bool(p, "recursive"), _bool(p, "force"))


@_command("remove", None, None, True)
def _remove(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.remove(_path(p), _bool(p, "recursive"), _bool(p, "force"))


@_command("exists", None, "structured", False)
def _exists(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.exists(_path(p))}


@_command("list", None, "structured", False)
def _list(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"value": c.list(_path(p), _str_list(p, "attributes"))}


@_command("mount_table", None, None, True)
def _mount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.mount_table(_path(p), _bool(p, "freeze"))


@_command("unmount_table", None, None, True)
def _unmount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.unmount_table(_path(p), _bool(p, "force"))


@_command("remount_table", None, None, True)
def _remount(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.remount_table(_path(p))


@_command("freeze_table", None, None, True)
def _freeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.freeze_table(_path(p))


@_command("unfreeze_table", None, None, True)
def _unfreeze(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.unfreeze_table(_path(p))


@_command("reshard_table", None, None, True)
def _reshard(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.reshard_table(_path(p), _p(p, "pivot_keys"), _p(p, "tablet_count"))


@_command("trim_rows", None, None, True)
def _trim(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.trim_rows(_path(p), _int(p, "tablet_index"), _int(p, "trimmed_row_count"))


@_command("alter_table", None, None, True)
def _alter_table(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.alter_table(_path(p), _p(p, "upstream_replica_id"), _p(p, "schema"))


@_command("alter_table_replica", None, None, True)
def _alter_table_replica(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    replica_id = _required_str(p, "replica_id")
    enabled = _p(p, "enabled")
    tracker = _p(p, "enable_replicated_table_tracker")
    if tracker is not None:
        c.set(f"#{replica_id.lstrip('#')}/@enable_replicated_table_tracker", bool(tracker))
    c.alter_table_replica(replica_id, None if enabled is None else _bool(p, "enabled"), _p(p, "mode"))


@_command("get_in_sync_replicas", "tabular", "structured", False)
def _get_in_sync_replicas(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    keys = None if _bool(p, "all_keys") else _rows(body)
    return c.get_in_sync_replicas(_path(p), _int(p, "timestamp"), keys)


@_command("generate_timestamp", None, "structured", False, inline=_always)
def _generate_timestamp(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"timestamp": yson.YsonUint64(c.generate_timestamp())}


@_command("start_transaction", None, "structured", True, aliases=("start_tx",))
def _start_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"transaction_id": c.start_transaction(
        str(_p(p, "type", "tablet")), _p(p, "atomicity"), _p(p, "durability"), _int(p, "timeout"),
        _int(p, "start_timestamp"))}


@_command("ping_transaction", None, None, True, aliases=("ping_tx",))
def _ping_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.ping_transaction(_required_str(p, "transaction_id"))


@_command("commit_transaction", None, "structured", True, aliases=("commit_tx",))
def _commit_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return {"commit_timestamp": yson.YsonUint64(c.commit_transaction(_required_str(p, "transaction_id")))}


@_command("abort_transaction", None, None, True, aliases=("abort_tx",))
def _abort_tx(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    c.abort_transaction(_required_str(p, "transaction_id"))


@_command("insert_rows", "tabular", None, True, heavy=True, inline=_inline_write)
def _insert_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.insert_rows(_path(p), _rows(body), _bool(p, "update"), _tx(p), _p(p, "atomicity"), _p(p, "durability"),
                  _bool(p, "require_sync_replica", True), input_bytes=p.get(_BODY_BYTES))


@_command("delete_rows", "tabular", None, True, heavy=True, inline=_inline_write)
def _delete_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.delete_rows(_path(p), _rows(body), _tx(p), _p(p, "atomicity"), _p(p, "durability"),
                  _bool(p, "require_sync_replica", True))


@_command("lock_rows", "tabular", None, True, heavy=True)
def _lock_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    c.lock_rows(_path(p), _rows(body), _tx(p), _str_list(p, "locks"), str(_p(p, "lock_type", "shared_strong")))


@_command("lookup_rows", "tabular", "tabular", False, heavy=True, inline=_inline_lookup)
def _lookup_rows(c: Cluster, p: dict[str, Any], body: Any) -> Any:
    return c.lookup_rows(_path(p), _rows(body), _str_list(p, "column_names"), _int(p, "timestamp"),
                         _bool(p, "keep_missing_rows"), _tx(p))


@_command("select_rows", None, "tabular", False, heavy=True)
def _select_rows(c: Cluster, p: dict[str, Any], _: Any) -> Any:
    return c.select_rows(_p(p, "query"), _int(p, "timestamp"), _tx(p), _int(p, "input_row_limit"),
                         _int(p, "output_row_limit"), _bool(p, "fail_on_incomplete_result", True))


def _query_value(text: str) -> Any:
    """Query-string parameters are text; integers and booleans are recognised as such."""
    if text.lstrip("-").isdigit():
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


#: parameters whose JSON form ``{"$value": ..., "$attributes": ...}`` parse_format reads as it is
_FORMAT_PARAMETERS = frozenset({"input_format", "output_format"})
_SCALARS = (str, int, float, bool, type(None))


def _decode_header_value(raw: str, header_format: str) -> Any:
    data = raw.encode("latin-1")
    try:
        if header_format == "yson":
            return yson.loads(data)
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            value = json.loads(data.decode("utf-8"))  # NaN and friends, or the precise error
        if not isinstance(value, dict):
            return yson.json_to_yson(value)
        # scalars need no conversion; structures may carry YSON attributes in their JSON form
        return {k: v if isinstance(v, _SCALARS) or k in _FORMAT_PARAMETERS else yson.json_to_yson(v)
                for k, v in value.items()}
    except Exception:  # noqa: BLE001 - any parse failure is a malformed header
        raise YtError(f"Malformed X-YT-Parameters header (expected {header_format})",
                      code=ErrorCode.PROTOCOL_ERROR) from None


def _header_format(request: Request) -> str:
    raw = request.headers.get("x-yt-header-format", "json")
    return parse_format(raw, default="json").name


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        if encoding in ("gzip", "deflate"):
            # YT clients label zlib streams "gzip"; wbits=47 accepts both zlib and gzip headers
            return zlib.decompress(body, zlib.MAX_WBITS | 32)
        if encoding == "br":
            import brotli

            return brotli.decompress(body)
    except Exception as exc:  # noqa: BLE001
        raise YtError(f"Cannot decode request body with Content-Encoding {encoding!r}: {exc}",
                      code=ErrorCode.PROTOCOL_ERROR) from None
    raise YtError(f"Unsupported Content-Encoding {encoding!r}", code=ErrorCode.PROTOCOL_ERROR)


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
        if content_length > MAX_BODY_BYTES:
            raise YtError(f"Request body of {content_length} bytes exceeds the limit of {MAX_BODY_BYTES} bytes",
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
                # small prepares and commits of sync replica writes are on the latency path of every
                # write to the meta-cluster: on the event loop, unless they would wait for the writer
                if (method in _INLINE_INTERNAL and len(raw) <= INLINE_BODY_BYTES and not cluster.storage.write_busy()
                        and not (method == "prepare" and cluster.replication.prepare_may_wait(body))):
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
