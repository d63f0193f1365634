"""The "reptables-changes" PySpark streaming source: a table's change stream as a Structured Streaming input.

``spark.readStream.format("reptables-changes")`` turns the engine's ``pull_changes`` command into
micro-batches, one row per change (insert, update, delete...), each with its event token. It is what
keeps a copy of a table elsewhere up to date (``reptables.sparkapps.mirror``, docs/mirror.md): Spark
records every batch's offsets in its checkpoint, so a job killed at any moment resumes exactly
where its last batch ended.

How it maps onto Spark's source API, and why:

* **Offsets are event tokens** (``{"event_token": "..."}``). A token is a position in the table's
  change order; the engine resumes a pull strictly after it. A start timestamp becomes the
  heartbeat-style token of that timestamp ("after every change at or below it"), so a stream started
  at T holds exactly the changes a snapshot read at T does not see.
* **One pull per micro-batch.** ``latestOffset`` pulls from the batch's start (at most
  ``max_rows_per_batch`` changes, waiting up to ``wait_timeout`` ms for one) and keeps what it got;
  ``partitions`` hands those changes to the batch's single task. When Spark replays a batch after a
  restart (its offsets were logged, its data never committed) the changes are not in memory any more,
  and the task pulls the range ``(start, end]`` again: the same changes, since a range below a logged
  end offset never changes.
* **Quiet tables still move.** With no change for ``heartbeat_seconds`` the offset moves to the
  engine's heartbeat token (an empty micro-batch), so a stream's position never falls behind the
  table's ``@change_retention`` just because nothing happened.
* **Trigger.AvailableNow** (``trigger(availableNow=True)``) stops at the changes committed before the
  query started: the source takes a timestamp then and never reads past it.
* **A consumer holds the position** (option ``consumer``): the table then keeps every change the
  query has not finished with, whatever its ``@change_retention`` or, on a replicated table, the
  replication queue's trimming. The source registers the name as a *vital* queue consumer of the
  table at the query's start position and advances it in ``commit(end)`` - Spark calls that once
  the batches up to ``end`` are recorded in its checkpoint, and asks only for later offsets from
  then on, so the consumer's offset is never ahead of where a restarted query resumes.

A position older than the table keeps (``@change_retention``) fails the query with the oldest
position still available, never silently skipping changes.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from reptables.engine.client import Client, PullAnswer, compare_tokens, token_timestamp
from reptables.engine.errors import ErrorCode, YtError

from .options import DEFAULT_ATTEMPTS, ReptablesSparkError, retrying

try:  # pyspark >= 4.2: latestOffset(start, limit), read limits and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
    STREAMING_SUPPORTED = True
except ImportError:  # pragma: no cover - pyspark 4.0/4.1: the source refuses to start (see streamReader)
    from abc import ABC as SupportsTriggerAvailableNow  # type: ignore[assignment]

    ReadLimit = ReadMaxRows = object  # type: ignore[misc,assignment]
    STREAMING_SUPPORTED = False

#: the format name: ``spark.readStream.format(FORMAT)``
FORMAT = "reptables-changes"

#: one row per change; ``key`` and ``row`` are JSON text (a column of type any keeps its structure)
CHANGES_SCHEMA = StructType([
    StructField("event_token", StringType(), False),
    StructField("timestamp", LongType(), False),
    StructField("kind", StringType(), False),
    StructField("key", StringType(), True),
    StructField("row", StringType(), True),
    StructField("tablet_index", LongType(), True),
    # true on a replicated table's partial-row upsert (YT's update mode): ``row`` holds only the columns written
    StructField("update", BooleanType(), False),
])

#: changes one micro-batch holds at most (one pull_changes)
DEFAULT_MAX_ROWS_PER_BATCH = 10_000
#: the engine answers at most this many changes per pull
MAX_PULL_ROWS = 100_000
#: how long one pull waits for a change, ms
DEFAULT_WAIT_TIMEOUT_MS = 1000
MAX_WAIT_TIMEOUT_MS = 60_000
#: seconds without a change after which the offset moves to the engine's heartbeat
DEFAULT_HEARTBEAT_SECONDS = 60
#: the longest consumer name the engine takes
MAX_CONSUMER_LENGTH = 1000
#: YT timestamps: (unix seconds << 30) | counter
_COUNTER_BITS = 30
_TOKEN = re.compile(r"^[0-9a-f]{32}.+$")
_HEARTBEAT_SEQ = "f" * 16

log = logging.getLogger("reptables.sparkapps.changes")


def position_token(timestamp: int, table_id: str) -> str:
    """The heartbeat-style token "after every change at or below ``timestamp``" of the table ``table_id``."""
    return f"{timestamp:016x}{_HEARTBEAT_SEQ}{table_id}"


def token_table_id(token: str) -> str:
    """The table id a token belongs to (everything after its 32 hex digits)."""
    return token[32:]


@dataclass(frozen=True)
class ChangesOptions:
    """The parsed options of one stream (docs/mirror.md lists them)."""

    proxy: str
    path: str
    token: str | None = field(default=None, repr=False)
    from_timestamp: int | None = None
    from_event_token: str | None = None
    max_rows_per_batch: int = DEFAULT_MAX_ROWS_PER_BATCH
    wait_timeout: int = DEFAULT_WAIT_TIMEOUT_MS
    heartbeat_seconds: int = DEFAULT_HEARTBEAT_SECONDS
    attempts: int = DEFAULT_ATTEMPTS
    #: seconds per request (above the longest pull wait)
    timeout: float = 60.0 + MAX_WAIT_TIMEOUT_MS / 1000
    #: a vital queue consumer that holds the query's position (``register_queue_consumer``); None: none
    consumer: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ChangesOptions:
        """Options as Spark hands them over (string values, case-insensitive keys)."""
        opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        proxy = opts.get("proxy", "").strip()
        path = opts.get("path", "").strip()
        if not proxy:
            raise ReptablesSparkError(f'{FORMAT}: option "proxy" is required (the engine\'s URL, e.g. '
                                      "http://127.0.0.1:9012)")
        if not path.startswith("//"):
            raise ReptablesSparkError(f'{FORMAT}: option "path" must be a table path starting with "//", got {path!r}')
        token = opts.get("token") or None
        token_file = opts.get("token_file", "").strip()
        if token and token_file:
            raise ReptablesSparkError(f'{FORMAT}: give option "token" or "token_file" for {path}, not both')
        if token_file:
            try:
                token = Path(token_file).read_text().strip() or None
            except OSError as exc:
                raise ReptablesSparkError(f'{FORMAT}: cannot read option "token_file" {token_file} for {path}: '
                                          f"{exc.strerror}") from None
            if token is None:
                raise ReptablesSparkError(f'{FORMAT}: option "token_file" {token_file} for {path} is empty')
        from_timestamp = _timestamp(opts.get("from_timestamp"))
        from_token = opts.get("from_event_token", "").strip() or None
        if from_token is not None and from_timestamp is not None:
            raise ReptablesSparkError(f'{FORMAT}: give option "from_timestamp" or "from_event_token" for {path}, '
                                      "not both")
        if from_token is not None and not _TOKEN.match(from_token):
            raise ReptablesSparkError(f'{FORMAT}: option "from_event_token" for {path} is not an event token (32 '
                                      f"hex digits and a table id), got {from_token!r}")
        consumer = opts.get("consumer", "").strip() or None
        if consumer is not None and len(consumer) > MAX_CONSUMER_LENGTH:
            raise ReptablesSparkError(f'{FORMAT}: option "consumer" for {path} is longer than '
                                      f"{MAX_CONSUMER_LENGTH} characters")
        return cls(proxy=proxy, path=path, token=token, from_timestamp=from_timestamp, from_event_token=from_token,
                   consumer=consumer,
                   max_rows_per_batch=_bounded(opts, "max_rows_per_batch", DEFAULT_MAX_ROWS_PER_BATCH, MAX_PULL_ROWS),
                   wait_timeout=_bounded(opts, "wait_timeout", DEFAULT_WAIT_TIMEOUT_MS, MAX_WAIT_TIMEOUT_MS),
                   heartbeat_seconds=_bounded(opts, "heartbeat_seconds", DEFAULT_HEARTBEAT_SECONDS, 1 << 30),
                   attempts=_bounded(opts, "attempts", DEFAULT_ATTEMPTS, 100))

    def client(self) -> Client:
        return Client(self.proxy, self.token, timeout=self.timeout)

    def failure(self, exc: BaseException) -> ReptablesSparkError:
        """The error to raise when reading the changes failed because of ``exc`` (never with the token)."""
        where = f"{FORMAT}: cannot read the changes of table {self.path} at {self.proxy}"
        if isinstance(exc, YtError):
            trimmed = exc.find(ErrorCode.CHANGES_TRIMMED)
            if trimmed is not None:
                oldest = trimmed.attributes.get("oldest_event_token")
                return ReptablesSparkError(
                    f"{where}: the stream's position is older than the changes the table keeps "
                    f"(@change_retention); the oldest position available is {oldest}. The changes in between "
                    "are lost to this stream: start again from a new snapshot "
                    f"(YT error code {int(ErrorCode.CHANGES_TRIMMED)})")
            return ReptablesSparkError(f"{where}: {exc} (YT error code {exc.code})")
        return ReptablesSparkError(f"{where}: {type(exc).__name__}: {exc}")


def _timestamp(raw: str | None) -> int | None:
    text = (raw or "").strip()
    if not text:
        return None
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise ReptablesSparkError(f'{FORMAT}: option "from_timestamp" must be a YT timestamp (an integer, decimal '
                                  f"or 0x-hex), got {text!r}") from None
    if value <= 0:
        raise ReptablesSparkError(f'{FORMAT}: option "from_timestamp" must be positive, got {text!r}')
    return value


def _bounded(opts: Mapping[str, str], name: str, default: int, most: int) -> int:
    raw = opts.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 0 < value <= most:
        raise ReptablesSparkError(f"{FORMAT}: option {name!r} must be an integer from 1 to {most}, got {raw!r}")
    return value


def change_row(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """One event of ``pull_changes`` as a row of :data:`CHANGES_SCHEMA`."""
    key, row = event.get("key"), event.get("row")
    tablet = event.get("tablet_index")
    return (str(event["event_token"]), int(event["timestamp"]), str(event["kind"]),
            None if key is None else _json(key), None if row is None else _json(row),
            None if tablet is None else int(tablet), bool(event.get("update", False)))


def _json(value: Any) -> str:
    # the json module, not orjson: a double column's NaN and infinities must survive (as NaN/Infinity)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


@dataclass(frozen=True)
class PulledChanges(InputPartition):
    """A micro-batch's changes, pulled by ``latestOffset`` on the driver: the task only yields them."""

    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class ChangeRange(InputPartition):
    """A micro-batch replayed after a restart: the task pulls the changes after ``start`` up to ``end``."""

    start: str
    end: str


class ChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one Python worker on the driver for the whole query (offsets, planning); pickled to tasks."""

    def __init__(self, options: ChangesOptions) -> None:
        self.options = options
        #: the last pull: (start token, end token, its rows), handed to the batch that covers it
        self._pulled: tuple[str, str, tuple[tuple[Any, ...], ...]] | None = None
        #: Trigger.AvailableNow: the timestamp the query stops at
        self._target: int | None = None

    def _pull(self, client: Client, after: str, max_rows: int) -> PullAnswer:
        return retrying(
            partial(client.pull_changes, self.options.path, from_event_token=after, max_row_count=max_rows,
                    wait_timeout=self.options.wait_timeout), self.options.attempts)

    def initialOffset(self) -> dict[str, Any]:
        """The start of a new query (a query restarted from its checkpoint resumes from there instead);
        with a consumer, the consumer registered at it, so nothing after it is trimmed from now on."""
        opts = self.options
        try:
            with opts.client() as client:
                if opts.from_event_token is not None:
                    start = opts.from_event_token
                else:
                    table_id = str(client.get(f"{opts.path}/@id"))
                    client.keep_change_log(opts.path)  # (a start chosen before the switch would be refused)
                    timestamp = opts.from_timestamp if opts.from_timestamp is not None else \
                        client.generate_timestamp()
                    start = position_token(timestamp, table_id)
                if opts.consumer is not None:
                    hold_position(client, opts.path, opts.consumer, _hold_timestamp(start))
        except YtError as exc:
            raise opts.failure(exc) from None
        return {"event_token": start}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        try:
            with self.options.client() as client:
                self._target = client.generate_timestamp()
        except YtError as exc:
            raise self.options.failure(exc) from None

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self.options
        after = str(start["event_token"])
        target = self._target
        if target is not None and token_timestamp(after) >= target:
            return start  # AvailableNow: everything up to the query's start is read
        max_rows = opts.max_rows_per_batch
        if isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(int(limit.max_rows), MAX_PULL_ROWS))
        try:
            with opts.client() as client:
                answer = self._pull(client, after, max_rows)
        except YtError as exc:
            raise opts.failure(exc) from None
        events = [e for e in answer.get("events") or [] if e.get("kind") != "heartbeat"]
        reached = str(answer.get("event_token") or after)
        delivered = int(answer.get("timestamp") or 0)
        if target is not None:
            events = [e for e in events if int(e["timestamp"]) <= target]
            if delivered >= target:
                end = position_token(target, token_table_id(after))  # every change up to the target is here
            elif events:
                end = str(events[-1]["event_token"])
            else:
                end = reached
        elif events:
            end = str(events[-1]["event_token"])
        elif (token_timestamp(reached) >> _COUNTER_BITS) - (token_timestamp(after) >> _COUNTER_BITS) \
                >= opts.heartbeat_seconds:
            end = reached
        else:
            return start
        if compare_tokens(end, after) <= 0:
            return start
        self._pulled = (after, end, tuple(change_row(e) for e in events))
        return {"event_token": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = str(start["event_token"]), str(end["event_token"])
        if compare_tokens(last, first) <= 0:
            return []
        pulled = self._pulled
        if pulled is not None and pulled[0] == first and pulled[1] == last:
            return [PulledChanges(pulled[2])]
        return [ChangeRange(first, last)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, PulledChanges):
            yield from partition.rows
            return
        assert isinstance(partition, ChangeRange)
        opts = self.options
        after, end = partition.start, partition.end
        end_timestamp = token_timestamp(end)
        try:
            with opts.client() as client:
                while True:
                    answer = self._pull(client, after, opts.max_rows_per_batch)
                    for event in answer.get("events") or []:
                        if event.get("kind") == "heartbeat":
                            continue
                        if compare_tokens(str(event["event_token"]), end) > 0:
                            return
                        yield change_row(event)
                    reached = str(answer.get("event_token") or after)
                    if compare_tokens(reached, end) >= 0 or int(answer.get("timestamp") or 0) >= end_timestamp:
                        return
                    if compare_tokens(reached, after) > 0:
                        after = reached
        except YtError as exc:
            raise opts.failure(exc) from None

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has recorded every batch up to ``end`` and asks only for later offsets: the consumer
        (if any) moves there. A failed advance is logged and made good by the next one (the consumer
        then holds a little more than needed, never less)."""
        pulled = self._pulled
        token = str(end["event_token"])
        if pulled is not None and compare_tokens(pulled[1], token) <= 0:
            self._pulled = None
        opts = self.options
        if opts.consumer is None:
            return
        try:
            with opts.client() as client:
                try:
                    retrying(partial(client.advance_consumer, opts.consumer, opts.path, None, token), opts.attempts)
                except YtError as exc:
                    if exc.code != ErrorCode.RESOLVE_ERROR or exc.attributes.get("consumer_path") != opts.consumer:
                        raise
                    # not registered (a query from a checkpoint made without the option, or unregistered
                    # meanwhile): held from here on; a change trimmed in between fails the next pull (1760)
                    hold_position(client, opts.path, opts.consumer, _hold_timestamp(token))
                    log.warning("%s: consumer %s of %s was not registered: registered again at %s", FORMAT,
                                opts.consumer, opts.path, token)
        except YtError as exc:
            log.warning("%s: could not advance consumer %s of %s to %s: %s (the next batch tries again)",
                        FORMAT, opts.consumer, opts.path, token, str(exc).splitlines()[0])


def _hold_timestamp(token: str) -> int:
    """Where a consumer holding a stream at ``token`` starts: its timestamp, or - a token inside a
    commit - the one before, so the rest of that commit is kept too."""
    return token_timestamp(token) - (token[16:32] != _HEARTBEAT_SEQ)


def hold_position(client: Client, path: str, consumer: str, timestamp: int) -> bool:
    """Make ``consumer`` a vital consumer of ``path`` whose offset is at most ``timestamp``: registered
    there when it is not registered yet (True), else only made vital, its offset kept (False).

    A vital consumer's offset is what the engine keeps changes from, on every kind of table: past
    ``@change_retention`` on sorted and ordered tables, past the replication queue's trimming on a
    replicated table (docs/streams.md, "Retention and consumers"). A timestamp older than what the
    table still keeps fails with the engine's error 1760."""
    registered = any(r["consumer_path"] == consumer for r in client.list_queue_consumer_registrations(path))
    # registering again keeps the offset and sets vital; a new registration starts at the timestamp
    client.register_queue_consumer(path, consumer, vital=True, from_timestamp=None if registered else timestamp)
    return not registered


class ReptablesChangesDataSource(DataSource):
    """``spark.readStream.format("reptables-changes")``: the changes of one table, in change order."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return CHANGES_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if not STREAMING_SUPPORTED:
            raise ReptablesSparkError(f"{FORMAT}: needs pyspark >= 4.2 (read limits and Trigger.AvailableNow of "
                                      "Python streaming sources); pip install 'pyspark>=4.2'")
        return ChangesStreamReader(ChangesOptions.parse(self.options))
