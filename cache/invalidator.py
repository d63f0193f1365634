"""The invalidation process of seed 004: follow a table's change stream, invalidate cached rows.

Why it is built this way:

* **Rules, not deletes.** Deleting a cached row on a change is not enough: an app server that read
  the row just before the change could put the old value back right after the delete. So, as the
  seed says, a change leaves its event token in the entry (with no value), and a fill is only
  accepted with data at least as fresh as the token in the entry (``reader.py``). Per change:
  no entry -> store the token, no value; the cached token is older -> replace the token, clear the
  value; the cached token is newer -> discard the change; the order is unknown (equal timestamps,
  different streams) -> invalidate with the change's token, the safe side. Each write is a
  compare-and-swap; on a conflict the entry is read again and the rule applied again.
* **Idempotent, so at-least-once is enough.** Applying a change twice gives the same entry, so
  the invalidator can restart from an older position and replay. It keeps its position in Redis
  (a checkpoint, written every ``checkpoint_interval`` seconds and on a clean stop) and resumes
  after it; a crash replays at most the changes since the last checkpoint.
* **Starting without a usable checkpoint resets the table's entries.** The stream only tells about
  changes after its start; an entry filled before that may already be stale and nothing would
  ever invalidate it. So the first start (and a restart whose checkpoint the engine no longer
  retains, ``CHANGES_TRIMMED``) raises the table's fill floor to the start timestamp and empties
  the table's entries (``RowCache.reset``) before following the stream from that timestamp.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reptables.engine.client import Client, YtError

from . import tokens
from .store import Checkpoint, Entry, FillResult, RowCache

__all__ = ["CHANGES_TRIMMED", "Invalidator", "InvalidatorStats", "Outcome", "apply_change"]

log = logging.getLogger("reptables.cache.invalidator")

#: ErrorCode.CHANGES_TRIMMED: the position asked for is older than what the engine retains
CHANGES_TRIMMED = 1760

#: the kinds of change events that name a row by its key
_ROW_CHANGES = frozenset({"insert", "update", "delete", "upsert"})


class Outcome(StrEnum):
    """What one change did to its entry (the values name the statistics' counters)."""

    STORED = "stored"            # no entry: the token is stored, no value
    INVALIDATED = "invalidated"  # the cached token was older: token replaced, value cleared
    UNKNOWN = "unknown_order"    # equal timestamps, different streams: invalidated to be safe
    DISCARDED = "discarded"      # the cached token is newer (or this very change): nothing to do


def apply_change(cache: RowCache, table: str, key: Mapping[str, Any], event_token: str,
                 max_attempts: int = 1000) -> tuple[Outcome, int]:
    """Apply seed 004's rule for one change of ``key``; returns (outcome, compare-and-swap retries).

    ``max_attempts`` bounds the retries against writers that keep changing the entry: a
    livelock then surfaces as an error instead of a hang.
    """
    tokens.validate(event_token)
    for attempt in range(max_attempts):
        entry = cache.get(table, key)
        if entry is None:
            outcome = Outcome.STORED
        else:
            order = tokens.compare(entry.event_token, event_token)
            if order is None:
                outcome = Outcome.UNKNOWN
            elif order < 0:
                outcome = Outcome.INVALIDATED
            else:
                return Outcome.DISCARDED, attempt
        if cache.compare_and_set(table, key, entry, Entry(event_token)) is FillResult.WRITTEN:
            return outcome, attempt
    raise RuntimeError(f"Cache entry {cache.entry_key(table, key)} kept changing: the change {event_token} "
                       f"could not be applied in {max_attempts} attempts")


@dataclass
class InvalidatorStats:
    """Counters of one invalidator since it was made (for logs, metrics and tests)."""

    changes: int = 0
    stored: int = 0
    invalidated: int = 0
    unknown_order: int = 0
    discarded: int = 0
    cas_retries: int = 0
    resets: int = 0
    checkpoints: int = 0


class Invalidator:
    """Follows one table's change stream and keeps the cache's entries of that table invalid.

    ``client`` talks to the cluster whose stream is followed (the meta-cluster of a replicated
    table, or the cluster of a plain sorted table), ``path`` is the table there. ``table`` is the
    cache's name of the table (default ``path``); app servers use the same name. ``name`` tells
    the checkpoints of several invalidators of one table apart. ``start_timestamp``: where a first
    start (no checkpoint) begins; default: now. ``wait_timeout`` (ms) is how long one pull waits
    for a change, and so how quickly :meth:`run` notices its stop event.
    """

    def __init__(self, cache: RowCache, client: Client, path: str, *, table: str | None = None,
                 name: str = "invalidator", start_timestamp: int | None = None,
                 checkpoint_interval: float = 1.0, max_row_count: int = 1000, wait_timeout: int = 500) -> None:
        if checkpoint_interval < 0:
            raise ValueError(f"Invalidator of {path}: checkpoint_interval must be >= 0, got {checkpoint_interval}")
        self.cache = cache
        self.client = client
        self.path = path
        self.table = table if table is not None else path
        self.name = name
        self.start_timestamp = start_timestamp
        self.checkpoint_interval = checkpoint_interval
        self.max_row_count = max_row_count
        self.wait_timeout = wait_timeout
        self.stats = InvalidatorStats()
        self._position: Checkpoint | None = None
        self._saved: Checkpoint | None = None
        self._saved_at = 0.0

    @property
    def position(self) -> Checkpoint | None:
        """Where the invalidator is: every change at or below ``position.timestamp`` is applied."""
        return self._position

    def reset(self, timestamp: int | None = None) -> Checkpoint:
        """Empty the table's entries and follow the stream from ``timestamp`` (default: now)."""
        self.client.keep_change_log(self.path)  # (a start before the log began would be refused)
        if timestamp is None:
            timestamp = self.client.generate_timestamp()
        deleted = self.cache.reset(self.table, timestamp)
        self._position = Checkpoint(None, timestamp)
        self.cache.save_checkpoint(self.table, self.name, self._position, force=True)
        self._saved, self._saved_at = self._position, time.monotonic()
        self.stats.resets += 1
        log.warning("cache of table %s reset at timestamp %d: %d entries deleted, invalidator %s follows %s from there",
                    self.table, timestamp, deleted, self.name, self.path)
        return self._position

    def _start(self) -> Checkpoint:
        checkpoint = self.cache.checkpoint(self.table, self.name)
        if checkpoint is None:
            return self.reset(self.start_timestamp)
        log.info("invalidator %s of table %s resumes from its checkpoint %s", self.name, self.table, checkpoint)
        self._position = self._saved = checkpoint
        self._saved_at = time.monotonic()
        return checkpoint

    def run_once(self) -> int:
        """Pull one batch of changes (waiting up to ``wait_timeout``), apply it; returns the changes applied."""
        position = self._position if self._position is not None else self._start()
        try:
            if position.event_token is not None:
                answer = self.client.pull_changes(self.path, from_event_token=position.event_token,
                                                  max_row_count=self.max_row_count, wait_timeout=self.wait_timeout)
            else:
                answer = self.client.pull_changes(self.path, from_timestamp=position.timestamp,
                                                  max_row_count=self.max_row_count, wait_timeout=self.wait_timeout)
        except YtError as exc:
            if exc.code != CHANGES_TRIMMED:
                raise
            log.warning("invalidator %s of table %s: its position %s is no longer retained by %s (%s)",
                        self.name, self.table, position, self.path, exc)
            self.reset()
            return 0
        applied = self.apply_events(answer["events"])
        self._position = Checkpoint(tokens.validate(answer["event_token"]), int(answer["timestamp"]))
        if time.monotonic() - self._saved_at >= self.checkpoint_interval:
            self.checkpoint()
        return applied

    def apply_events(self, events: Iterable[Mapping[str, Any]]) -> int:
        """Apply the rule to every row change among ``events`` (heartbeats are skipped)."""
        applied = 0
        for event in events:
            kind = event.get("kind")
            if kind == "heartbeat":
                continue
            if kind not in _ROW_CHANGES or not isinstance(event.get("key"), Mapping):
                raise ValueError(f"Invalidator of table {self.path}: a {kind!r} event names no row key; the cache "
                                 "holds rows of sorted tables only")
            outcome, retries = apply_change(self.cache, self.table, event["key"], event["event_token"])
            self.stats.changes += 1
            self.stats.cas_retries += retries
            setattr(self.stats, outcome.value, getattr(self.stats, outcome.value) + 1)
            applied += 1
        return applied

    def checkpoint(self) -> None:
        """Store the current position in Redis (a restart resumes after it)."""
        if self._position is None or self._position == self._saved:
            self._saved_at = time.monotonic()
            return
        self.cache.save_checkpoint(self.table, self.name, self._position)
        self._saved, self._saved_at = self._position, time.monotonic()
        self.stats.checkpoints += 1

    def run(self, stop: threading.Event) -> None:
        """Follow the stream until ``stop`` is set; then store a last checkpoint.

        Errors of the engine or of Redis propagate: the caller (a supervisor, a thread's owner)
        decides whether to restart; a restart resumes from the checkpoint. A checkpoint of another
        table (the path was created anew) is refused by the engine: :meth:`reset` starts over.
        """
        try:
            while not stop.is_set():
                self.run_once()
        finally:
            self.checkpoint()
