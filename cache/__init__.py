"""The cache-invalidation pattern of seed 004 over change streams (docs/streams.md).

Why it exists: an application that caches table rows (here in Redis) must drop a cached row when
the row changes, and must never put an older row back — not when a read raced the write, not when
the read went to a lagging replica, not when the invalidation process restarted. Change streams and
event tokens make that possible; this package is the pattern, ready to use:

* :class:`RowCache` (``store.py``): entries of ``(event token, optional value)`` in Redis, written
  only by compare-and-swap;
* :class:`Invalidator` (``invalidator.py``): follows a table's change stream from a checkpoint and
  applies seed 004's rules to every change;
* :class:`CachedReader` / :class:`AppServer` (``reader.py``): reads through the cache and fills it
  only with data at least as fresh as the cached token;
* ``tokens.py``: ordering tokens across streams, "unknown" included.

It builds on the engine's client only (an application of the public API, not part of the engine).
"""

from .invalidator import CHANGES_TRIMMED, Invalidator, InvalidatorStats, Outcome, apply_change
from .reader import AppServer, CachedReader, ReaderStats
from .store import MISSING, Checkpoint, Entry, FillResult, RowCache, Value, canonical_key

__all__ = [
    "CHANGES_TRIMMED",
    "MISSING",
    "AppServer",
    "CachedReader",
    "Checkpoint",
    "Entry",
    "FillResult",
    "Invalidator",
    "InvalidatorStats",
    "Outcome",
    "ReaderStats",
    "RowCache",
    "Value",
    "apply_change",
    "canonical_key",
]
