"""The options of the "reptables" data source, the engine client they make, and the errors it raises.

Why a module of its own: the reader and the writer run in three places - Spark's planner (a Python
worker on the driver), every read or write task (Python workers on the executors) and the driver's
commit - and each rebuilds the same client from the same options. The options arrive as Spark
strings (case-insensitive keys); they are parsed once, on the driver, into :class:`SourceOptions`,
which travels to the executors pickled inside the reader or writer.

Two things are tricky:

* **The token never leaves in a message.** It is kept out of the dataclass' ``repr`` and no error
  text contains it; errors name the proxy and the table instead.
* **Errors must survive Spark.** An exception raised in a Python worker reaches the user as the text
  of a Java exception, so :class:`ReptablesSparkError` carries everything in its message: what was
  being done, the table, the proxy and the engine's own reason (its YT error, inner errors included).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError

#: rows one select_rows page asks for (each page is a LIMIT; see docs/spark.md "Reading")
DEFAULT_PAGE_ROWS = 50_000
#: the engine answers at most this many rows (DEFAULT_OUTPUT_ROW_LIMIT of the node); a page never asks for more
MAX_PAGE_ROWS = 1_000_000
#: rows one insert_rows call (one tablet transaction) carries; below the engine's max_rows_per_transaction
DEFAULT_BATCH_ROWS = 20_000
#: bytes of Arrow data after which a write chunk is sent even if it has fewer rows
DEFAULT_BATCH_BYTES = 32 * 1024 * 1024
#: attempts of one request that failed for a reason worth retrying (see :func:`retrying`)
DEFAULT_ATTEMPTS = 4

#: errors worth another attempt of the same request: the engine is unreachable or busy, a row lock is
#: held, a sync replica is still catching up, no replica is in sync for a read yet
RETRIABLE_CODES = frozenset({
    ErrorCode.UNAVAILABLE, ErrorCode.TRANSACTION_LOCK_CONFLICT, ErrorCode.BLOCKED_ROW_WAIT_TIMEOUT,
    ErrorCode.SYNC_REPLICA_NOT_IN_SYNC, ErrorCode.NO_IN_SYNC_REPLICAS, ErrorCode.TIMEOUT,
})

T = TypeVar("T")


class ReptablesSparkError(Exception):
    """A read or write of the "reptables" data source failed; the message says what, where and why."""


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read or write (docs/spark.md lists them)."""

    proxy: str
    path: str
    token: str | None = field(default=None, repr=False)
    #: an explicit snapshot timestamp; None: one generated on the cluster when the read is planned
    timestamp: int | None = None
    #: the number of read partitions asked for; None: one per tablet
    partitions: int | None = None
    page_rows: int = DEFAULT_PAGE_ROWS
    batch_rows: int = DEFAULT_BATCH_ROWS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    attempts: int = DEFAULT_ATTEMPTS
    #: seconds per request
    timeout: float = 60.0
    #: YT's ``update`` mode of insert_rows: columns the DataFrame lacks keep their values
    update: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Options as Spark hands them over (string values, case-insensitive keys)."""
        opts = {str(k).lower(): v for k, v in options.items()}
        proxy = (opts.get("proxy") or "").strip()
        path = (opts.get("path") or "").strip()
        if not proxy:
            raise ReptablesSparkError('reptables: option "proxy" is required (the engine\'s URL, e.g. '
                                      'http://127.0.0.1:9012)')
        if not path.startswith("//"):
            raise ReptablesSparkError(f'reptables: option "path" must be a table path starting with "//", '
                                      f"got {path!r}")
        return cls(
            proxy=proxy, path=path, token=opts.get("token") or None,
            timestamp=_timestamp(opts.get("timestamp")),
            partitions=_positive(opts, "partitions", None),
            page_rows=min(MAX_PAGE_ROWS, _positive(opts, "page_rows", DEFAULT_PAGE_ROWS) or DEFAULT_PAGE_ROWS),
            batch_rows=_positive(opts, "batch_rows", DEFAULT_BATCH_ROWS) or DEFAULT_BATCH_ROWS,
            batch_bytes=_positive(opts, "batch_bytes", DEFAULT_BATCH_BYTES) or DEFAULT_BATCH_BYTES,
            attempts=_positive(opts, "attempts", DEFAULT_ATTEMPTS) or DEFAULT_ATTEMPTS,
            timeout=float(_positive(opts, "timeout", 60) or 60),
            update=_boolean(opts, "update"),
        )

    def client(self) -> Client:
        """A client of the engine (keep-alive connections: one per task, closed by the caller)."""
        return Client(self.proxy, self.token, timeout=self.timeout)

    def failure(self, action: str, exc: BaseException) -> ReptablesSparkError:
        """The error to raise when ``action`` (e.g. "read") on this table failed because of ``exc``."""
        reason = str(exc) if isinstance(exc, YtError) else f"{type(exc).__name__}: {exc}"
        code = f" (YT error code {exc.code})" if isinstance(exc, YtError) else ""
        return ReptablesSparkError(f"reptables: cannot {action} table {self.path} at {self.proxy}: {reason}{code}")


def _timestamp(raw: str | None) -> int | None:
    if raw is None or str(raw).strip() == "":
        return None
    text = str(raw).strip()
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise ReptablesSparkError(f'reptables: option "timestamp" must be a YT timestamp (an integer, decimal or '
                                  f"0x-hex), got {text!r}") from None
    if value <= 0:
        raise ReptablesSparkError(f'reptables: option "timestamp" must be positive, got {text!r}')
    return value


def _positive(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = opts.get(name)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ReptablesSparkError(f"reptables: option {name!r} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise ReptablesSparkError(f"reptables: option {name!r} must be a positive integer, got {raw!r}")
    return value


def _boolean(opts: Mapping[str, str], name: str) -> bool:
    raw = str(opts.get(name) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ReptablesSparkError(f"reptables: option {name!r} must be true or false, got {raw!r}")
    return raw == "true"


def is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, YtError) and any(exc.find(code) is not None for code in RETRIABLE_CODES)


def retrying(call: Callable[[], T], attempts: int) -> T:
    """``call()``, tried again (backoff 0.2 s doubling, with jitter) while it fails with a retriable error.

    Only for requests whose repetition is harmless: reads at a fixed timestamp, and upserts of the same
    rows into a sorted table (docs/spark.md "Retries and idempotency").
    """
    delay = 0.2
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except YtError as exc:
            if attempt == attempts or not is_retriable(exc):
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")  # the loop returns or raises
