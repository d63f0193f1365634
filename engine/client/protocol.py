"""The protocol half of the client, written once: request building, encodings, answer parsing.

:class:`~reptables.engine.client.Client` and :class:`~reptables.engine.client.AsyncClient` differ
only in the call that moves bytes; everything they say and understand is here (see the package
docstring for the protocol's tricky parts).

Its names come in two kinds. Those without an underscore are what the two clients (``sync.py``,
``aio.py``) share: :class:`Build` (the request of each typed method), :class:`Request`,
:class:`Answer`, :func:`result_of` (an answer to a result or a raised error), :class:`ClientConfig`
and :data:`Row`; they are public to the package but implementation details of it, so the package's
``__all__`` leaves them out (it exports :class:`Schema`, :class:`TransportError`,
:func:`token_timestamp` and :func:`compare_tokens` from here). Names with an underscore are used in
this module only.
"""

from __future__ import annotations

import builtins
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import httpx
import orjson

from ..errors import (
    ErrorCode,
    UnavailableError,
    YtError,
)
from ..httpconn import has_non_finite
from .route import LeaderRoute, normal_url, split_urls

#: JSON with strings as plain Unicode (see the module docstring on ``encode_utf8``)
_JSON_FORMAT: dict[str, Any] = {"$value": "json", "$attributes": {"encode_utf8": False}}

Row = Mapping[str, Any]


class TransportError(UnavailableError):
    """The request got no HTTP answer: connection refused or reset, DNS failure, timeout.

    ``url`` is the request's URL and ``cause`` the underlying exception (an ``OSError`` or an
    ``httpx`` error; also chained as ``__cause__``). The code is ``UNAVAILABLE`` (105), like a
    proxy that answers 503, so callers can treat both as "retry later".
    """

    def __init__(self, url: str, cause: BaseException) -> None:
        super().__init__(f"Cannot reach YT proxy at {url}: {type(cause).__name__}: {cause}",
                         attributes={"url": url})
        self.url = url
        self.cause = cause


class Schema(list[dict[str, Any]]):
    """A table schema as returned by ``get(".../@schema")``: a list of column dicts.

    ``attributes`` holds the schema's YSON attributes (``strict``, ``unique_keys``); when a
    ``Schema`` is sent back (``create`` attributes, ``set``) it travels in the attributed form.
    """

    def __init__(self, columns: Iterable[dict[str, Any]] = (), attributes: dict[str, Any] | None = None) -> None:
        super().__init__(columns)
        self.attributes: dict[str, Any] = dict(attributes or {})

    def __repr__(self) -> str:
        return f"Schema({list(self)!r}, attributes={self.attributes!r})"


# -- commands -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    """A command's descriptor: what it reads and writes, and whether it mutates."""

    input_type: str | None  # None, "structured" or "tabular"
    output_type: str | None
    volatile: bool

    @property
    def http_method(self) -> str:
        if self.input_type is not None:
            return "PUT"
        return "POST" if self.volatile else "GET"


_READ = _Spec(None, "structured", volatile=False)
_ACTION = _Spec(None, None, volatile=True)
_ROWS_IN = _Spec("tabular", None, volatile=True)
#: a command that changes state and answers with a structure (the XDCR administration)
_ADMIN = _Spec(None, "structured", volatile=True)

#: the commands with typed methods (every public command of the engine, as its ``GET /api/v4`` describes
#: them); any other command's descriptor is fetched by ``call``
_KNOWN_SPECS: dict[str, _Spec] = {
    "create": _Spec(None, "structured", volatile=True),
    "get": _READ,
    "set": _Spec("structured", None, volatile=True),
    "remove": _ACTION,
    "exists": _READ,
    "list": _READ,
    "mount_table": _ACTION,
    "unmount_table": _ACTION,
    "remount_table": _ACTION,
    "freeze_table": _ACTION,
    "unfreeze_table": _ACTION,
    "reshard_table": _ACTION,
    "trim_rows": _ACTION,
    "alter_table": _ACTION,
    "alter_table_replica": _ACTION,
    "get_in_sync_replicas": _Spec("tabular", "structured", volatile=False),
    "insert_rows": _ROWS_IN,
    "delete_rows": _ROWS_IN,
    "lock_rows": _ROWS_IN,
    "lookup_rows": _Spec("tabular", "tabular", volatile=False),
    "select_rows": _Spec(None, "tabular", volatile=False),
    "generate_timestamp": _READ,
    "start_transaction": _Spec(None, "structured", volatile=True),
    "ping_transaction": _ACTION,
    "commit_transaction": _Spec(None, "structured", volatile=True),
    "abort_transaction": _ACTION,
    "pull_changes": _READ,
    "register_queue_consumer": _ACTION,
    "unregister_queue_consumer": _ACTION,
    "list_queue_consumer_registrations": _READ,
    "pull_consumer": _READ,
    "advance_consumer": _ACTION,
    "dr_pause": _ADMIN,
    "dr_resume": _ADMIN,
    "dr_reset": _ADMIN,
    "dr_drop": _ADMIN,
    "dr_status": _READ,
    "dr_join_begin": _ADMIN,
    "dr_join_read": _READ,
    "dr_join_write": _Spec("structured", "structured", volatile=True),
    "dr_join_finish": _ADMIN,
}

#: the commands that may wait ``wait_timeout`` milliseconds for a change before they answer
_LONG_PULLS = frozenset({"pull_changes", "pull_consumer"})
#: the engine's ``wait_timeout`` when a pull gives none (docs/streams.md)
_DEFAULT_WAIT_TIMEOUT_MS = 1000
#: seconds a long pull's answer may take beyond its ``wait_timeout`` (the engine's linger, a loaded
#: machine, a large answer) before the client gives up on it as a transport timeout
LONG_PULL_MARGIN = 15.0


# -- event tokens (docs/streams.md) ---------------------------------------------------------------

#: a token's position: its commit timestamp and sequence number, 16 hex digits each
_TOKEN_POSITION = re.compile(r"[0-9a-f]{32}")


def token_timestamp(token: str) -> int:
    """The commit timestamp of an event token (its first 16 hex digits)."""
    return int(token[:16], 16)


def compare_tokens(a: str, b: str) -> int:
    """-1, 0 or 1 as change ``a`` came before, with, or after change ``b``: tokens of one table.

    Tokens of two tables have no order of their own (a meta-cluster's and its replicas' tokens
    compare by ``token_timestamp``), so they are a ValueError naming both table ids rather than an
    answer that looks right; so is a string that is not an event token."""
    table_a, table_b = _token_table(a), _token_table(b)
    if table_a != table_b:
        raise ValueError(f"Cannot compare event tokens of two tables: {a!r} is of table {table_a}, {b!r} of table "
                         f"{table_b} (across a meta-cluster and its replicas compare token_timestamp)")
    pa, pb = a[:32], b[:32]
    return (pa > pb) - (pa < pb)


def _token_table(token: str) -> str:
    """The table id of an event token (what follows its 32 hex digits); ValueError if it is not one."""
    if not isinstance(token, str) or len(token) <= 32 or _TOKEN_POSITION.fullmatch(token, 0, 32) is None:
        raise ValueError(f"Invalid event token {token!r}: expected 32 hex digits followed by the table id")
    return token[32:]


# -- encoding -------------------------------------------------------------------------------------


def _to_wire(value: Any) -> Any:
    """``value`` with every :class:`Schema` in YT's attributed JSON form."""
    if isinstance(value, Schema):
        return {"$attributes": _to_wire(value.attributes), "$value": [_to_wire(c) for c in value]}
    if isinstance(value, Mapping):
        return {k: _to_wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def _dump_json(value: Any) -> str:
    return json.dumps(_to_wire(value), ensure_ascii=False, separators=(",", ":"))


def _encode_rows(rows: Iterable[Any]) -> bytes:
    """Rows as JSON lines: one orjson call for the whole batch, the standard encoder for the rest.

    orjson encodes a list of rows ~20x faster than the standard encoder (and ~20x faster than
    one orjson call per row); its ``[{...},{...}]`` becomes JSON lines by replacing the ``},{``
    between rows - safe when there are exactly as many of them as row boundaries, that is, when no
    value holds one. orjson writes NaN and infinities as ``null`` (the standard encoder writes
    ``NaN``, which the proxy reads back as a double) and knows nothing of :class:`Schema` or other
    subclasses of the builtins: a body with a ``null`` in it is checked for non-finite doubles, and
    any value orjson won't take as is falls back.
    """
    rows = rows if isinstance(rows, list) else list(rows)
    if not rows:
        return b""
    try:
        whole = orjson.dumps(rows, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:
        pass
    else:
        if (whole.startswith(b"[{") and whole.count(b"},{") == len(rows) - 1
                and (b"null" not in whole or not has_non_finite(rows))):
            return whole[1:-1].replace(b"},{", b"}\n{") + b"\n"
    return "".join(_dump_json(row) + "\n" for row in rows).encode("utf-8")


def _encode_input(spec: _Spec, value: Any) -> bytes:
    if value is None:
        return b""
    if spec.input_type == "tabular":
        return _encode_rows(value)
    return _dump_json(value).encode("utf-8")


@dataclass(frozen=True)
class Request:
    """One HTTP request, and the function that turns its successful response into a result."""

    method: str
    url: str
    parse: Callable[[Answer], Any]
    params: dict[str, Any] | None = None
    body: bytes | None = None
    #: filled with the answer's ``X-YT-Response-Parameters`` (reads with event tokens)
    response_parameters: dict[str, Any] | None = None
    #: seconds the engine may hold the request before it answers (a long pull's ``wait_timeout``);
    #: None for every other request
    wait_seconds: float | None = None

    @property
    def headers(self) -> dict[str, str]:
        headers = {"X-YT-Header-Format": "json"}
        if self.params is not None:
            headers["X-YT-Parameters"] = json.dumps(_to_wire(self.params), ensure_ascii=True,
                                                    separators=(",", ":"))
        return headers

    @classmethod
    def command(cls, name: str, params: Mapping[str, Any], input: Any = None, *, spec: _Spec | None = None,
                unwrap: str | None = None, convert: Callable[[Any], Any] | None = None) -> Request:
        """A request of command ``name`` (``spec`` defaults to the known one).

        Parameters whose value is None are left out. A structured result is unwrapped from its
        one-key map ``{unwrap: ...}``, then passed through ``convert``. A long pull carries its
        ``wait_timeout`` as ``wait_seconds``, for the clients' request timeout.
        """
        spec = spec or _KNOWN_SPECS[name]
        wire_params = {k: v for k, v in params.items() if v is not None}
        body = None
        if spec.input_type is not None:
            wire_params["input_format"] = _JSON_FORMAT
            body = _encode_input(spec, input)
        parse: Callable[[Answer], Any] = _parse_nothing
        if spec.output_type is not None:
            wire_params["output_format"] = _JSON_FORMAT
            parse = _parse_tabular if spec.output_type == "tabular" else partial(
                _parse_structured, unwrap=unwrap, convert=convert)
        wait_seconds = None
        if name in _LONG_PULLS:
            wait = wire_params.get("wait_timeout", _DEFAULT_WAIT_TIMEOUT_MS)
            valid = isinstance(wait, int | float) and not isinstance(wait, bool)
            wait_seconds = max(0.0, float(wait if valid else _DEFAULT_WAIT_TIMEOUT_MS)) / 1000
        return cls(spec.http_method, f"/api/v4/{name}", parse, wire_params, body, wait_seconds=wait_seconds)


# -- decoding -------------------------------------------------------------------------------------


class Answer(Protocol):
    """What the parsers read of an answer: an ``httpx.Response`` or an ``httpconn.HttpResponse``."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Any: ...
    @property
    def content(self) -> bytes: ...
    @property
    def is_success(self) -> bool: ...
    @property
    def text(self) -> str: ...
    @property
    def url(self) -> Any: ...
    def json(self) -> Any: ...



def _parse_nothing(response: Answer) -> None:
    return None


def _unescape_keys(value: Any) -> Any:
    """The JSON form of YSON writes a map key starting with "$" as "$$...": undo it."""
    if isinstance(value, dict):
        return {(k[1:] if k.startswith("$$") else k): _unescape_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescape_keys(v) for v in value]
    return value


def _parse_structured(response: Answer, unwrap: str | None,
                      convert: Callable[[Any], Any] | None) -> Any:
    content = response.content
    value = json.loads(content.decode("utf-8"))
    if b'"$$' in content:
        value = _unescape_keys(value)
    if unwrap is not None:
        value = value[unwrap]
    return convert(value) if convert is not None else value


def _parse_tabular(response: Answer) -> list[Any]:
    body = response.content.strip()
    if not body:
        return []
    if b"\n\n" not in body:
        try:  # one orjson parse of all the lines (the standard parser is needed for NaN)
            return orjson.loads(b"[" + body.replace(b"\n", b",") + b"]")
        except orjson.JSONDecodeError:
            pass
    text = body.decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _parse_descriptors(response: Answer) -> dict[str, _Spec]:
    def kind(raw: str | None) -> str | None:
        return None if raw in (None, "", "null") else raw

    return {d["name"]: _Spec(kind(d.get("input_type")), kind(d.get("output_type")), bool(d.get("is_volatile")))
            for d in response.json()}


def _to_schema(value: Any) -> Any:
    """A ``get`` result of a ``@schema`` attribute as a :class:`Schema` (anything else unchanged)."""
    if isinstance(value, dict) and isinstance(value.get("$value"), list):
        return Schema(value["$value"], value.get("$attributes"))
    if isinstance(value, list):
        return Schema(value)
    return value


def _error_from_response(response: Answer) -> YtError | None:
    """The YT error a response carries, or None if it is a success."""
    if response.is_success and response.headers.get("X-YT-Response-Code", "0") == "0":
        return None
    for raw in (response.headers.get("X-YT-Error"), response.content.decode("utf-8", errors="replace")):
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(data, dict) and "code" in data:
            return YtError.from_dict(data)
    # not a YT error (e.g. a load balancer's 502 page): keep the status and the text
    code = ErrorCode.UNAVAILABLE if response.status_code in (502, 503, 504) else ErrorCode.GENERIC
    return YtError.from_dict({
        "code": code,
        "message": f"HTTP {response.status_code} from {response.url}: {response.text[:1000]}",
        "attributes": {"http_status": response.status_code, "url": str(response.url)},
    })


def result_of(req: Request, response: Answer) -> Any:
    error = _error_from_response(response)
    if error is not None:
        raise error
    if req.response_parameters is not None:
        raw = response.headers.get("X-YT-Response-Parameters")
        if raw:
            req.response_parameters.update(json.loads(raw))
    return req.parse(response)


# -- the requests of the typed methods, shared by both clients ------------------------------------


class Build:
    """The request of each typed method, built from that method's arguments (same names, same order)."""

    @staticmethod
    def descriptors() -> Request:
        return Request("GET", "/api/v4", _parse_descriptors)

    @staticmethod
    def call(specs: Mapping[str, _Spec], command: str, params: Mapping[str, Any], input: Any) -> Request:
        if command not in specs:
            raise YtError(f"Command {command!r} is not supported by this proxy", code=ErrorCode.NO_SUCH_METHOD)
        return Request.command(command, params, input, spec=specs[command])

    @staticmethod
    def create(type: str, path: str | None, attributes: dict[str, Any] | None, recursive: bool, ignore_existing: bool,
               force: bool) -> Request:
        return Request.command("create", {
            "type": type, "path": path, "attributes": attributes, "recursive": recursive,
            "ignore_existing": ignore_existing, "force": force}, unwrap="node_id")

    @staticmethod
    def get(path: str, attributes: list[str] | None) -> Request:
        is_schema = path.rstrip("/").endswith("/@schema")
        return Request.command("get", {"path": path, "attributes": attributes}, unwrap="value",
                               convert=_to_schema if is_schema else None)

    @staticmethod
    def set(path: str, value: Any, recursive: bool, force: bool) -> Request:
        return Request.command("set", {"path": path, "recursive": recursive, "force": force}, value)

    @staticmethod
    def remove(path: str, recursive: bool, force: bool) -> Request:
        return Request.command("remove", {"path": path, "recursive": recursive, "force": force})

    @staticmethod
    def exists(path: str) -> Request:
        return Request.command("exists", {"path": path}, unwrap="value", convert=bool)

    @staticmethod
    def list(path: str, attributes: builtins.list[str] | None) -> Request:
        return Request.command("list", {"path": path, "attributes": attributes}, unwrap="value")

    @staticmethod
    def mount_table(path: str, freeze: bool) -> Request:
        return Request.command("mount_table", {"path": path, "freeze": freeze})

    @staticmethod
    def by_path(command: str, path: str) -> Request:
        """remount_table, freeze_table, unfreeze_table, dr_join_finish: commands of a path alone."""
        return Request.command(command, {"path": path})

    @staticmethod
    def unmount_table(path: str, force: bool) -> Request:
        return Request.command("unmount_table", {"path": path, "force": force or None})

    @staticmethod
    def reshard_table(path: str, pivot_keys: builtins.list[builtins.list[Any]] | None,
                      tablet_count: int | None) -> Request:
        return Request.command("reshard_table", {"path": path, "pivot_keys": pivot_keys,
                                                 "tablet_count": tablet_count})

    @staticmethod
    def trim_rows(path: str, tablet_index: int, trimmed_row_count: int) -> Request:
        return Request.command("trim_rows", {"path": path, "tablet_index": tablet_index,
                                             "trimmed_row_count": trimmed_row_count})

    @staticmethod
    def alter_table(path: str, schema: Any, upstream_replica_id: str | None) -> Request:
        return Request.command("alter_table", {"path": path, "schema": schema,
                                               "upstream_replica_id": upstream_replica_id})

    @staticmethod
    def alter_table_replica(replica_id: str, enabled: bool | None, mode: str | None,
                            enable_replicated_table_tracker: bool | None) -> Request:
        return Request.command("alter_table_replica", {
            "replica_id": replica_id, "enabled": enabled, "mode": mode,
            "enable_replicated_table_tracker": enable_replicated_table_tracker})

    @staticmethod
    def get_in_sync_replicas(path: str, timestamp: int, keys: Iterable[Row] | None) -> Request:
        """``keys`` None asks about every key (``all_keys``)."""
        return Request.command("get_in_sync_replicas", {
            "path": path, "timestamp": timestamp, "all_keys": True if keys is None else None},
            None if keys is None else list(keys))

    @staticmethod
    def insert_rows(path: str, rows: Iterable[Row], update: bool | None, transaction_id: str | None,
                    atomicity: str | None, durability: str | None, require_sync_replica: bool | None) -> Request:
        return Request.command("insert_rows", {
            "path": path, "update": update, "transaction_id": transaction_id, "atomicity": atomicity,
            "durability": durability, "require_sync_replica": require_sync_replica}, list(rows))

    @staticmethod
    def delete_rows(path: str, keys: Iterable[Row], transaction_id: str | None, atomicity: str | None,
                    durability: str | None, require_sync_replica: bool | None) -> Request:
        return Request.command("delete_rows", {
            "path": path, "transaction_id": transaction_id, "atomicity": atomicity, "durability": durability,
            "require_sync_replica": require_sync_replica}, list(keys))

    @staticmethod
    def lock_rows(path: str, keys: Iterable[Row], locks: builtins.list[str] | None, lock_type: str | None,
                  transaction_id: str | None) -> Request:
        return Request.command("lock_rows", {
            "path": path, "locks": locks, "lock_type": lock_type, "transaction_id": transaction_id}, list(keys))

    @staticmethod
    def lookup_rows(path: str, keys: Iterable[Row], column_names: builtins.list[str] | None,
                    timestamp: int | None, keep_missing_rows: bool | None, transaction_id: str | None,
                    include_event_token: bool = False, compare_event_token: str | None = None,
                    response_parameters: dict[str, Any] | None = None) -> Request:
        req = Request.command("lookup_rows", {
            "path": path, "column_names": column_names, "timestamp": timestamp,
            "keep_missing_rows": keep_missing_rows, "transaction_id": transaction_id,
            "include_event_token": include_event_token or None, "compare_event_token": compare_event_token},
            list(keys))
        return replace(req, response_parameters=response_parameters)

    @staticmethod
    def select_rows(query: str, timestamp: int | None, transaction_id: str | None,
                    output_row_limit: int | None, include_event_token: bool = False,
                    compare_event_token: str | None = None,
                    response_parameters: dict[str, Any] | None = None, input_row_limit: int | None = None,
                    fail_on_incomplete_result: bool | None = None) -> Request:
        req = Request.command("select_rows", {
            "query": query, "timestamp": timestamp, "transaction_id": transaction_id,
            "input_row_limit": input_row_limit, "output_row_limit": output_row_limit,
            "fail_on_incomplete_result": fail_on_incomplete_result,
            "include_event_token": include_event_token or None, "compare_event_token": compare_event_token})
        return replace(req, response_parameters=response_parameters)

    # -- change streams (docs/streams.md) --

    @staticmethod
    def pull_changes(path: str, from_event_token: str | None, from_timestamp: int | None,
                     max_row_count: int | None, wait_timeout: int | None) -> Request:
        return Request.command("pull_changes", {
            "path": path, "from_event_token": from_event_token, "from_timestamp": from_timestamp,
            "max_row_count": max_row_count, "wait_timeout": wait_timeout})

    @staticmethod
    def register_queue_consumer(queue_path: str, consumer_path: str, vital: bool,
                                from_timestamp: int | None) -> Request:
        return Request.command("register_queue_consumer", {
            "queue_path": queue_path, "consumer_path": consumer_path, "vital": vital,
            "from_timestamp": from_timestamp})

    @staticmethod
    def unregister_queue_consumer(queue_path: str, consumer_path: str) -> Request:
        return Request.command("unregister_queue_consumer", {"queue_path": queue_path,
                                                             "consumer_path": consumer_path})

    @staticmethod
    def list_queue_consumer_registrations(queue_path: str) -> Request:
        return Request.command("list_queue_consumer_registrations", {"queue_path": queue_path}, unwrap="value")

    @staticmethod
    def pull_consumer(consumer_path: str, queue_path: str, max_row_count: int | None,
                      wait_timeout: int | None) -> Request:
        return Request.command("pull_consumer", {
            "consumer_path": consumer_path, "queue_path": queue_path, "max_row_count": max_row_count,
            "wait_timeout": wait_timeout})

    @staticmethod
    def advance_consumer(consumer_path: str, queue_path: str, old_offset: str | None, new_offset: str) -> Request:
        return Request.command("advance_consumer", {
            "consumer_path": consumer_path, "queue_path": queue_path, "old_offset": old_offset,
            "new_offset": new_offset})

    @staticmethod
    def generate_timestamp() -> Request:
        return Request.command("generate_timestamp", {}, unwrap="timestamp")

    @staticmethod
    def start_transaction(type: str, atomicity: str | None, durability: str | None,
                          timeout: int | None, start_timestamp: int | None = None) -> Request:
        return Request.command("start_transaction", {
            "type": type, "atomicity": atomicity, "durability": durability, "timeout": timeout,
            "start_timestamp": start_timestamp}, unwrap="transaction_id")

    @staticmethod
    def by_transaction_id(command: str, transaction_id: str) -> Request:
        """ping_transaction, abort_transaction: commands of a transaction id alone."""
        return Request.command(command, {"transaction_id": transaction_id})

    @staticmethod
    def commit_transaction(transaction_id: str) -> Request:
        return Request.command("commit_transaction", {"transaction_id": transaction_id}, unwrap="commit_timestamp")

    # -- active-active replication, XDCR (docs/xdcr.md) --

    @staticmethod
    def dr_pause(wait: bool, timeout: int | None) -> Request:
        return Request.command("dr_pause", {"wait": wait, "timeout": timeout})

    @staticmethod
    def dr_reset(cluster: str | None, force: bool) -> Request:
        return Request.command("dr_reset", {"cluster": cluster, "force": force or None})

    @staticmethod
    def dr_drop(timeout: int | None) -> Request:
        return Request.command("dr_drop", {"timeout": timeout})

    @staticmethod
    def no_parameters(command: str) -> Request:
        """dr_status, dr_resume: commands without parameters."""
        return Request.command(command, {})

    @staticmethod
    def dr_join_begin(path: str, source: str | None, page_rows: int | None, restart: bool) -> Request:
        return Request.command("dr_join_begin", {"path": path, "source": source, "page_rows": page_rows,
                                                 "restart": restart})

    @staticmethod
    def dr_join_read(path: str, page: int) -> Request:
        return Request.command("dr_join_read", {"path": path, "page": page})

    @staticmethod
    def dr_join_write(path: str, page: int, entries: builtins.list[Any]) -> Request:
        return Request.command("dr_join_write", {"path": path, "page": page}, entries)


def proxy_urls(proxy_url: str | Sequence[str]) -> list[str]:
    """The engines a client may send to: one URL, several separated by commas, or a list of them."""
    urls = list(dict.fromkeys(normal_url(u) for u in split_urls(proxy_url)))
    if not urls:
        raise ValueError("A client needs the URL of at least one engine")
    return urls


def never_sent(error: TransportError) -> bool:
    """Whether the request of ``error`` never reached an engine (its connection was refused): it may be
    sent elsewhere without being applied twice. A reset or a timeout may come after the engine acted."""
    return isinstance(error.cause, ConnectionRefusedError | httpx.ConnectError)


class ClientConfig(LeaderRoute):
    """What :class:`Client` and :class:`AsyncClient` make of their constructor arguments.

    Several engines of one table cluster (a leader and its standbys, docs/storage.md "Leadership and
    fencing"): requests go to one of them, :attr:`proxy_url`, until :meth:`resend_to` says to go to
    another (the rules are :class:`~.route.LeaderRoute`'s, shared with the engine's calls to peers).
    ``follow_unlisted``: whether a leader an engine names outside the URLs given is followed."""

    def __init__(self, proxy_url: str | Sequence[str], token: str | None, timeout: float,
                 follow_unlisted: bool = True) -> None:
        # an engine that got no answer through is not followed back to for the client's timeout
        super().__init__(proxy_urls(proxy_url), suspect_seconds=timeout, follow_unlisted=follow_unlisted)
        token = token if token is not None else os.environ.get("YT_TOKEN")
        self.headers = {"Authorization": f"OAuth {token}"} if token else {}
        #: the per-request timeout, in seconds (httpx's form below)
        self.seconds = timeout
        self.timeout = httpx.Timeout(timeout)
        #: command descriptors; ``call`` adds the proxy's own on meeting an unknown command
        self.specs: dict[str, _Spec] = dict(_KNOWN_SPECS)

    def resend_to(self, error: YtError, sent_to: str, attempt: int) -> str | None:
        """Where to send again a request that failed with ``error`` at ``sent_to`` (its ``attempt``-th
        failure), or None: raise ``error``. Only a request no engine acted on is sent again:

        * an answer saying the engine is not the leader (``not_leader``: a standby, or a leader whose
          lease ran out or that was replaced; it did nothing with the request): to the leader it names
          (``leader_url``), else to the next URL;
        * a refused connection (the request never left): to the next URL.

        Any other transport error moves the client on to the next URL for the *next* request, and is
        raised (the engine may have acted: the caller decides whether to retry). An engine that got no
        answer through is not followed back to for the client's timeout, even if a standby still names
        it (its lease has not run out yet: a paused leader). At most twice around the URLs, then the
        last error is raised (a takeover in progress: retry later)."""
        if isinstance(error, TransportError):
            return self.after_no_answer(sent_to, attempt, never_sent(error))
        if not error.attributes.get("not_leader"):
            return None
        return self.after_not_leader(sent_to, attempt, error.attributes.get("leader_url"))

    def read_timeout(self, req: Request) -> float:
        """How long ``req`` may wait for its answer: the client's timeout, and for a long pull at least
        its ``wait_timeout`` plus :data:`LONG_PULL_MARGIN` (a pull that waits 60 s is not late at 30 s).
        Connecting keeps the client's timeout either way."""
        if req.wait_seconds is None:
            return self.seconds
        return max(self.seconds, req.wait_seconds + LONG_PULL_MARGIN)

    def httpx_timeout(self, req: Request) -> httpx.Timeout:
        """:meth:`read_timeout` in httpx's form (connect, write and pool timeouts stay the client's)."""
        if req.wait_seconds is None:
            return self.timeout
        return httpx.Timeout(self.seconds, read=self.read_timeout(req))
