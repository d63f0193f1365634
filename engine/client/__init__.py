"""A small, typed client for the YTsaurus HTTP proxy API v4, as the reptables engine speaks it.

Why this module exists: the official ``yt.wrapper`` client is large, configured through global
state and synchronous only. Code of reptables that talks to an engine (the operator, jobs, tests)
wants a client it can hold in one object, close deterministically and use from asyncio, raising
the engine's own error classes. This is it, in the style of httpx: :class:`Client` and
:class:`AsyncClient` have the same constructor and methods (the async ones are coroutines). Both
build every request (``protocol.Build``, ``protocol.Request``) and turn every response into a
result or an error (``protocol.result_of``) with the same helpers of ``protocol.py``; the two
classes differ only in the call that moves bytes, so the protocol is written down exactly once.

Every public command of the engine (its command table, ``GET /api/v4``) has a typed method of the
same name with YT's parameter names, so a reader (and mypy) can follow a command from its caller to
the engine's handler; answers of a fixed shape are typed (``types.py``: ``XdcrStatus``,
``PullAnswer``...). :meth:`Client.call` stays as the escape hatch for a command this client does not
know (another proxy's, or one newer than the client).

The tricky parts of the protocol, all handled here:

* **Parameters** travel JSON-encoded in the ``X-YT-Parameters`` header (``X-YT-Header-Format:
  json``). HTTP headers are bytes, not text, so the JSON is ASCII-escaped (``ensure_ascii``): a
  query that mentions ``"привет"`` arrives intact.
* **HTTP method** follows the command's descriptor: ``PUT`` when the command reads a body,
  ``POST`` when it mutates (is "volatile"), ``GET`` otherwise. :meth:`Client.call` learns the
  descriptors of commands this module does not know from ``GET /api/v4``.
* **Formats**: rows and values travel as JSON with ``encode_utf8=false``. YT's JSON format
  defaults to ``encode_utf8=true``, under which every *byte* of a string's UTF-8 form travels as one
  code point (``"п"`` becomes ``"Ð¿"``); turning it off makes strings plain Unicode in both
  directions. Tabular data is one JSON value per line (a ``null`` line is a missing row of
  ``lookup_rows(keep_missing_rows=True)``); structured data is one JSON value.
* **Result wrapping**: v4 wraps structured results in a one-key map (``get`` → ``{"value": ...}``,
  ``create`` → ``{"node_id": ...}``, ``start_transaction`` → ``{"transaction_id": ...}``, ...).
  The typed methods unwrap it; :meth:`Client.call` returns what the proxy sent.
* **YSON attributes** on values appear in JSON as ``{"$attributes": {...}, "$value": ...}`` and are
  returned as-is (e.g. ``get(path, attributes=["type"])``). The same form is accepted on input, so
  a row value or a ``set`` value that is a map with a ``"$value"`` key is read by the proxy as an
  attributed YSON value. One exception for convenience: ``get("<table>/@schema")`` returns a
  :class:`Schema` — a list of column dicts that keeps the schema's own attributes (``strict``,
  ``unique_keys``) in ``.attributes`` and is sent back in the attributed form when passed as a
  parameter or value, so ``create("table", p2, attributes={"schema": client.get(p1 + "/@schema")})``
  copies a schema exactly.
* **Long pulls**: ``pull_changes`` and ``pull_consumer`` may wait ``wait_timeout`` ms (up to 60 s)
  for a change before they answer, longer than the client's per-request timeout (30 s by default).
  Their requests get a read timeout of at least ``wait_timeout`` plus 15 s; every other request
  keeps the client's, and connecting always does.
* **Several engines of one cluster** (a leader and its standbys, docs/storage.md "Leadership and
  fencing"): ``Client(["http://a:9012", "http://b:9012"])`` (or ``"http://a:9012,http://b:9012"``).
  A standby, or a leader that lost its lease, answers 105 with ``not_leader`` (it did nothing) and
  the leader's address (``leader_url``): the request is sent there at once, as it is to the next URL
  when a connection is refused. Any other failure is raised as before (an engine that reset the
  connection may have acted), and the next request goes to the next URL. A client of one URL
  follows a leader an engine names too.
* **Errors**: one hierarchy. A failed command answers with a YT error (JSON body and the
  ``X-YT-Error`` header; a ``X-YT-Response-Code`` other than ``0`` also means failure), rebuilt by
  :meth:`YtError.from_dict` into the most specific class (``ResolveError``, ``LockConflict``, ...).
  A request that never got an answer (connection refused, timeout) raises :class:`TransportError`,
  an :class:`~reptables.engine.errors.UnavailableError` (code 105), so ``except YtError`` catches
  everything this client raises.
"""

from ..errors import (
    AlreadyExistsError,
    AuthenticationError,
    ErrorCode,
    LockConflict,
    NoSuchTransaction,
    QuerySyntaxError,
    ResolveError,
    SchemaViolation,
    TabletStateError,
    UnavailableError,
    YtError,
)
from .aio import AsyncClient
from .protocol import Schema, TransportError, compare_tokens, token_timestamp
from .sync import Client
from .types import (
    ChangeEvent,
    ConsumerRegistration,
    PullAnswer,
    XdcrJoinFinished,
    XdcrJoinPage,
    XdcrJoinProgress,
    XdcrJoinWritten,
    XdcrPeerStatus,
    XdcrStatus,
)

__all__ = [
    "AlreadyExistsError",
    "AsyncClient",
    "AuthenticationError",
    "ChangeEvent",
    "Client",
    "ConsumerRegistration",
    "ErrorCode",
    "LockConflict",
    "NoSuchTransaction",
    "QuerySyntaxError",
    "ResolveError",
    "PullAnswer",
    "Schema",
    "SchemaViolation",
    "TabletStateError",
    "TransportError",
    "UnavailableError",
    "XdcrJoinFinished",
    "XdcrJoinPage",
    "XdcrJoinProgress",
    "XdcrJoinWritten",
    "XdcrPeerStatus",
    "XdcrStatus",
    "YtError",
    "compare_tokens",
    "token_timestamp",
]
