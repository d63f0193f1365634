"""The app server's side of seed 004: read through the cache, fill it only with fresh enough data.

Why the fill is conditional: an entry the invalidator emptied still carries the token of the
change that emptied it. A read that started before that change (on a lagging replica, or simply
racing the write) returns the old row, and putting that row in the cache would undo the
invalidation for good — no later change would come to clear it. So every read asks the engine for
the freshness of its data (``include_event_token``: a heartbeat-style token, "every change at or
below this timestamp is in the data", and with ``compare_event_token`` the engine's own verdict
``fresh``), and the row goes into the cache only when that token is at least as new as the one in
the entry, with a compare-and-swap so a change the invalidator applied meanwhile is not
overwritten. A read that is not fresh enough is still returned to the caller — it is as good as
any uncached read of that replica — it is just not cached.

Reads may go to a replica cluster: pass that cluster's client and the replica table's path, and
``table=`` the cache's name of the table (the path the invalidator follows on the meta-cluster).
Tokens of the replica and of the meta-cluster are ordered by timestamp (``tokens.compare``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reptables.engine.client import Client

from . import tokens
from .store import MISSING, Entry, FillResult, RowCache

__all__ = ["AppServer", "CachedReader", "ReaderStats"]


@dataclass
class ReaderStats:
    """Counters of one reader since it was made (for logs, metrics and tests)."""

    hits: int = 0
    misses: int = 0
    fills: int = 0
    #: reads whose data was older than (or not known to be as new as) the cached token: not cached
    not_fresh: int = 0
    #: reads older than the table's fill floor (the invalidator restarted after them): not cached
    below_floor: int = 0
    cas_retries: int = 0


class CachedReader:
    """Reads rows of one sorted table by key, through the cache (seed 004's "regular appserver").

    ``client`` and ``path``: where reads go (the table's cluster, or a replica's cluster and the
    replica table's path); ``table``: the cache's name of the table, as the invalidator uses it
    (default ``path``).
    """

    def __init__(self, cache: RowCache, client: Client, path: str, *, table: str | None = None,
                 max_attempts: int = 100) -> None:
        self.cache = cache
        self.client = client
        self.path = path
        self.table = table if table is not None else path
        self.max_attempts = max_attempts
        self.stats = ReaderStats()
        self._key_columns: frozenset[str] | None = None

    def key_columns(self) -> frozenset[str]:
        """The table's key columns (read once from its schema)."""
        if self._key_columns is None:
            schema = self.client.get(f"{self.path}/@schema")
            columns = frozenset(column["name"] for column in schema if column.get("sort_order"))
            if not columns:
                raise ValueError(f"Table {self.path} has no key columns: the cache holds rows of sorted tables only")
            self._key_columns = columns
        return self._key_columns

    def _check_key(self, key: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(key, Mapping):
            raise ValueError(f"Invalid key {key!r} for table {self.path}: expected a map of key columns to values")
        expected = self.key_columns()
        if set(key) != expected:
            raise ValueError(f"Invalid key {dict(key)!r} for table {self.path}: expected exactly the key columns "
                             f"{sorted(expected)}")
        return dict(key)

    def get(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """The row with ``key`` (None: no such row), from the cache when it holds a value."""
        key = self._check_key(key)
        entry = self.cache.get(self.table, key)
        if entry is not None and isinstance(entry.value, dict):
            self.stats.hits += 1
            return dict(entry.value)
        if entry is not None and entry.value == MISSING:
            self.stats.hits += 1
            return None
        self.stats.misses += 1
        compared = entry.event_token if entry is not None else None
        response: dict[str, Any] = {}
        rows = self.client.lookup_rows(self.path, [key], keep_missing_rows=True, include_event_token=True,
                                       compare_event_token=compared, response_parameters=response)
        row = rows[0] if rows else None
        read_token = tokens.validate(response.get("event_token"), f"freshness token of a read of {self.path}")
        self._fill(key, entry, Entry(read_token, MISSING if row is None else row), compared, response.get("fresh"))
        return row

    def _fill(self, key: dict[str, Any], current: Entry | None, new: Entry, compared: str | None,
              fresh: bool | None) -> None:
        """Store ``new`` unless the entry holds something at least as new; retry on a conflict."""
        for _ in range(self.max_attempts):
            if current is not None:
                order = tokens.compare(new.event_token, current.event_token)
                if current.event_token == compared and fresh is not None:
                    # the engine compared its data with this very token: trust the safer verdict
                    order = (1 if order is None else order) if fresh else -1
                if order is None or order < 0:
                    self.stats.not_fresh += 1
                    return
                if order == 0 and current.has_value:
                    return
            result = self.cache.compare_and_set(self.table, key, current, new,
                                                read_timestamp=tokens.timestamp_of(new.event_token))
            if result is FillResult.WRITTEN:
                self.stats.fills += 1
                return
            if result is FillResult.BELOW_FLOOR:
                self.stats.below_floor += 1
                return
            self.stats.cas_retries += 1
            current = self.cache.get(self.table, key)
        raise RuntimeError(f"Cache entry {self.cache.entry_key(self.table, key)} kept changing: a read of "
                           f"{self.path} could not be cached in {self.max_attempts} attempts")


#: seed 004's name for the reading side
AppServer = CachedReader
