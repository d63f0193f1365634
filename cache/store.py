"""The Redis side of the cache: entries with event tokens, compare-and-swap, floors, checkpoints.

Why a store of its own: seed 004's invalidation pattern is only correct if every write to an entry
is conditional on what the writer read — an invalidator and many app servers write the same entry
concurrently, and a write decided on a stale read would put an old value back over an
invalidation. Every write here is therefore a compare-and-swap, done by one Lua script, so the
check and the write are atomic on the Redis server (the caller re-reads and decides again when it
loses the race).

What lives in Redis, all under one prefix:

* ``<prefix>:row:<table>:<key JSON>`` — an entry: JSON ``{"event_token": str, "value": ...}``,
  where ``value`` is ``null`` (invalidated: do not use, only remember the token), the row (a JSON
  object) or ``"missing"`` (the row is known not to exist). The key JSON is canonical (sorted
  columns, no spaces), so the invalidator's ``{"k": 1}`` from a change event and an app server's
  ``{"k": 1}`` name the same entry.
* ``<prefix>:floor:<table>`` — the timestamp (16 hex digits) below which no read may fill the
  cache. The invalidator raises it when it (re)starts without a usable checkpoint, just before it
  empties the table's entries: changes older than its stream's start would never be invalidated,
  so data read before that point must not enter the cache. The fill script checks it atomically.
* ``<prefix>:checkpoint:<table>:<name>`` — an invalidator's position: JSON ``{"event_token",
  "timestamp"}``; it only moves forward (unless reset).

Entries never expire: an evicted token-only entry would forget an invalidation, and a later fill
with data older than that invalidation would then be accepted. Give Redis enough memory, or a
``noeviction`` policy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

import redis

from . import tokens

__all__ = ["MISSING", "Checkpoint", "Entry", "FillResult", "RowCache", "Value", "canonical_key"]

#: the cached value of a row that does not exist
MISSING: Literal["missing"] = "missing"

#: a cached value: the row, MISSING, or None (invalidated: only the token is known)
Value = dict[str, Any] | Literal["missing"] | None

# KEYS[1] entry, KEYS[2] floor; ARGV[1] the entry as read ('' = there was none), ARGV[2] the new
# entry, ARGV[3] the read's timestamp as 16 hex digits ('' = no floor check, for invalidations).
# Returns 1 (written), 0 (the entry changed since it was read), -1 (the read is below the floor).
# Timestamps are compared as two 32-bit halves: Lua numbers are doubles, too narrow for uint64.
_CAS_SCRIPT = """
if ARGV[3] ~= '' then
  local floor = redis.call('GET', KEYS[2])
  if floor then
    local fh, rh = tonumber(string.sub(floor, 1, 8), 16), tonumber(string.sub(ARGV[3], 1, 8), 16)
    if fh > rh or (fh == rh and tonumber(string.sub(floor, 9, 16), 16) > tonumber(string.sub(ARGV[3], 9, 16), 16))
    then
      return -1
    end
  end
end
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if current then return 0 end
elseif current ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


def canonical_key(key: Mapping[str, Any]) -> str:
    """The key's JSON, the same for every writer: sorted columns, no spaces, Unicode as is."""
    if not isinstance(key, Mapping) or not key:
        raise ValueError(f"Invalid row key {key!r}: expected a non-empty map of key columns to values")
    return json.dumps(dict(key), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _glob_escape(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


@dataclass(frozen=True)
class Entry:
    """One cached row: the token of its last invalidation or population, and maybe its value."""

    event_token: str
    value: Value = None
    #: the entry exactly as stored, when it was read from Redis: what a compare-and-swap expects
    raw: bytes | str | None = field(default=None, compare=False, repr=False)

    @property
    def has_value(self) -> bool:
        """Whether the entry can answer a read (a row, or "the row does not exist")."""
        return self.value is not None

    def encode(self) -> bytes:
        return json.dumps({"event_token": self.event_token, "value": self.value}, sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def decode(cls, raw: bytes | str, where: str) -> Entry:
        try:
            data = json.loads(raw)
            value = data["value"]
            if not (value is None or value == MISSING or isinstance(value, dict)):
                raise ValueError(f"value {value!r} is neither a row, {MISSING!r} nor null")
            return cls(tokens.validate(data["event_token"]), value, raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"Cache entry {where} is not a reptables cache entry: {exc}") from exc


class FillResult(Enum):
    """What a conditional write did."""

    WRITTEN = 1
    CONFLICT = 0
    BELOW_FLOOR = -1


@dataclass(frozen=True)
class Checkpoint:
    """An invalidator's position: after ``event_token`` (or, with none yet, at ``timestamp``)."""

    event_token: str | None
    #: every change at or below this timestamp has been applied
    timestamp: int

    def encode(self) -> str:
        return json.dumps({"event_token": self.event_token, "timestamp": self.timestamp})

    @classmethod
    def decode(cls, raw: bytes | str, where: str) -> Checkpoint:
        try:
            data = json.loads(raw)
            token = data["event_token"]
            return cls(None if token is None else tokens.validate(token), int(data["timestamp"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"Checkpoint {where} is not a reptables cache checkpoint: {exc}") from exc


class RowCache:
    """Cached rows of tables in one Redis database, every write conditional on what was read.

    ``client`` is a ``redis.Redis`` (``decode_responses`` off, the default); ``prefix`` namespaces
    every key, so several caches can share a database. A table is named by any string — the
    path of the table the invalidator follows is the natural choice, shared by the app servers
    that read it on a replica under another path.
    """

    def __init__(self, client: redis.Redis, prefix: str = "reptables:cache") -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("RowCache needs a redis.Redis with decode_responses=False: entries are compared "
                             "byte for byte")
        self.redis = client
        self.prefix = prefix
        self._cas = client.register_script(_CAS_SCRIPT)

    # -- keys --

    def entry_key(self, table: str, key: Mapping[str, Any]) -> str:
        return f"{self.prefix}:row:{table}:{canonical_key(key)}"

    def floor_key(self, table: str) -> str:
        return f"{self.prefix}:floor:{table}"

    def checkpoint_key(self, table: str, name: str) -> str:
        return f"{self.prefix}:checkpoint:{table}:{name}"

    # -- entries --

    def get(self, table: str, key: Mapping[str, Any]) -> Entry | None:
        """The entry of a row, or None when the cache knows nothing about it."""
        redis_key = self.entry_key(table, key)
        raw = self.redis.get(redis_key)
        return None if raw is None else Entry.decode(raw, redis_key)

    def compare_and_set(self, table: str, key: Mapping[str, Any], expected: Entry | None, new: Entry,
                        read_timestamp: int | None = None) -> FillResult:
        """Store ``new`` if the entry is still ``expected`` (None: there is still no entry).

        With ``read_timestamp`` (a fill with data read at that timestamp) the write is also refused
        when the table's floor is above it. ``expected`` must be an entry read by :meth:`get`.
        """
        expected_raw: bytes | str = b""
        if expected is not None:
            if expected.raw is None:
                raise ValueError("compare_and_set needs the expected entry as read from the cache (Entry.raw)")
            expected_raw = expected.raw
        args = [expected_raw, new.encode(), b"" if read_timestamp is None else f"{read_timestamp:016x}".encode()]
        result = self._cas(keys=[self.entry_key(table, key), self.floor_key(table)], args=args)
        return FillResult(int(result))

    def delete(self, table: str, key: Mapping[str, Any]) -> None:
        self.redis.delete(self.entry_key(table, key))

    def entries(self, table: str) -> Iterator[tuple[dict[str, Any], Entry]]:
        """Every entry of a table, with its key (a scan: entries written meanwhile may be missed)."""
        prefix = f"{self.prefix}:row:{table}:"
        for redis_key in self.redis.scan_iter(match=_glob_escape(prefix) + "*", count=500):
            raw = self.redis.get(redis_key)
            if raw is not None:
                name = redis_key.decode() if isinstance(redis_key, bytes) else str(redis_key)
                yield json.loads(name[len(prefix):]), Entry.decode(raw, name)

    # -- floors --

    def floor(self, table: str) -> int | None:
        """The timestamp below which reads may not fill the table's entries (None: no floor)."""
        raw = self.redis.get(self.floor_key(table))
        return None if raw is None else int(raw, 16)

    def reset(self, table: str, timestamp: int) -> int:
        """Forget everything cached for a table and refuse fills read before ``timestamp``.

        For an invalidator that starts following the table at ``timestamp``: it will see every
        change after it, and nothing before. The floor goes up first (never down) and only then
        are the entries deleted, so a fill that raced with the reset is either refused by the
        floor or deleted. Returns the number of entries deleted.
        """
        floor_key = self.floor_key(table)
        with self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(floor_key)
                    current = pipe.get(floor_key)
                    pipe.multi()
                    if current is None or int(current, 16) < timestamp:
                        pipe.set(floor_key, f"{timestamp:016x}")
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        deleted = 0
        batch: list[bytes] = []
        for redis_key in self.redis.scan_iter(match=_glob_escape(f"{self.prefix}:row:{table}:") + "*", count=500):
            batch.append(redis_key)
            if len(batch) >= 500:
                deleted += int(self.redis.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(self.redis.delete(*batch))
        return deleted

    # -- checkpoints --

    def checkpoint(self, table: str, name: str) -> Checkpoint | None:
        key = self.checkpoint_key(table, name)
        raw = self.redis.get(key)
        return None if raw is None else Checkpoint.decode(raw, key)

    def save_checkpoint(self, table: str, name: str, checkpoint: Checkpoint, force: bool = False) -> bool:
        """Store an invalidator's position if it is ahead of the stored one (or with ``force``).

        Forward-only, so an invalidator that lingers after its replacement started cannot move the
        shared position back. Returns whether it was stored.
        """
        key = self.checkpoint_key(table, name)
        with self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if not force and raw is not None and not _ahead(checkpoint, Checkpoint.decode(raw, key)):
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.set(key, checkpoint.encode())
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue


def _ahead(new: Checkpoint, old: Checkpoint) -> bool:
    if new.event_token is not None and old.event_token is not None:
        order = tokens.compare(new.event_token, old.event_token)
        if order is not None:
            return order > 0
    return new.timestamp > old.timestamp
