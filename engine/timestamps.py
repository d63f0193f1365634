"""Timestamps in the YTsaurus format, unique and monotonic across restarts.

A timestamp is 64 bits: ``(unix seconds << 30) | counter``. Every value is derived from the wall
clock, so the physical time of any timestamp can be recovered within about a second.

The tricky part is restarts. Timestamps must never repeat or go backwards, even if the process is
killed and the clock is behind what it was. We therefore persist a *reservation*: a high-water
mark that is always >= every timestamp handed out. Issuing a timestamp past the reservation first
durably moves the reservation a few seconds ahead (one small write every few seconds); after a
restart the generator starts strictly above the stored reservation.

The reservation lives in its own small file (written to a temporary file, fsynced, renamed), not
in the SQL database: a timestamp is often generated while a SQL write transaction is open, and a
second writer on the same SQLite database at that moment would deadlock or invalidate it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

COUNTER_BITS = 30
COUNTER_MASK = (1 << COUNTER_BITS) - 1
MIN_TIMESTAMP = 1 << COUNTER_BITS
#: timestamps handed out without a fresh durable reservation, in seconds; also the most a restart
#: can move the clock ahead of real time
RESERVATION_SECONDS = 1
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
        #: guards _last and _reserved; a leaf lock, taken inside the commit path's locks (it may
        #: fsync the reservation file once a second while held: no timestamp may pass an unsaved one)
        self._lock = threading.Lock()
        self._last = reserved  # guarded by _lock (read without it: a monotonic int, a stale read is harmless)
        self._reserved = reserved  # guarded by _lock
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


class ReservationFile:
    """The durable high-water reservation: one integer in a file, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def write(self, value: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{value}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
