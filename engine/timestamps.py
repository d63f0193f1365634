"""Timestamps in the YTsaurus format, unique and monotonic across restarts.

A timestamp is 64 bits: ``(unix seconds << 30) | counter``. Every value is derived from the wall
clock, so the physical time of any timestamp can be recovered within about a second.

The tricky part is restarts. Timestamps must never repeat or go backwards, even if the process is
killed and the clock is behind what it was. We therefore persist a *reservation*: a high-water
mark that is always >= every timestamp handed out. Issuing a timestamp past the reservation first
durably moves the reservation a few seconds ahead (one small write every few seconds); after a
restart the generator starts strictly above the stored reservation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

COUNTER_BITS = 30
COUNTER_MASK = (1 << COUNTER_BITS) - 1
MIN_TIMESTAMP = 1 << COUNTER_BITS
#: timestamps handed out without a fresh durable reservation, in seconds
RESERVATION_SECONDS = 10
NULL_TIMESTAMP = 0
#: ``SyncLastCommittedTimestamp`` of YT: "read the latest committed data"
SYNC_LAST_COMMITTED_TIMESTAMP = 0x3FFFFFFFFFFFFF01
ASYNC_LAST_COMMITTED_TIMESTAMP = 0x3FFFFFFFFFFFFF04
MAX_TIMESTAMP = 0x3FFFFFFFFFFFFF00


def timestamp_to_unix(ts: int) -> float:
    """Approximate physical time (unix seconds) of a timestamp."""
    return float(ts >> COUNTER_BITS)


def timestamp_to_datetime(ts: int) -> datetime:
    return datetime.fromtimestamp(ts >> COUNTER_BITS, tz=UTC)


def unix_to_timestamp(seconds: float) -> int:
    """The smallest timestamp of a given second."""
    return int(seconds) << COUNTER_BITS


class TimestampProvider:
    """Hands out unique, monotonic timestamps; persists a reservation through ``persist``."""

    def __init__(self, reserved: int, persist: Callable[[int], None]) -> None:
        self._lock = threading.Lock()
        self._last = reserved
        self._reserved = reserved
        self._persist = persist

    @property
    def last(self) -> int:
        return self._last

    def generate(self) -> int:
        with self._lock:
            now = unix_to_timestamp(time.time())
            ts = max(self._last + 1, now)
            if ts >= self._reserved:
                reserved = unix_to_timestamp((ts >> COUNTER_BITS) + RESERVATION_SECONDS)
                self._persist(reserved)
                self._reserved = reserved
            self._last = ts
            return ts

    def observe(self, ts: int) -> None:
        """Make later timestamps exceed ``ts`` (used when a value carries a foreign timestamp)."""
        with self._lock:
            if ts > self._last:
                self._last = ts
