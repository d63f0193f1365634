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

Timestamps from elsewhere (a replicated batch keeps its meta-cluster's, a sync commit takes the
coordinator's, a read may name one) move this clock forward through :meth:`TimestampProvider.observe`.
One such value far ahead - 2^63-1 from a forged push - would move every later timestamp, and the
reservation written for it, past SQLite's integer range: every write fails, also after a restart.
So a foreign timestamp is checked first (:meth:`TimestampProvider.check`): inside YT's range and at
most a bounded distance ahead of this host's *wall clock* (never of the last timestamp: a bound
relative to the last value would let repeated values creep the clock forward), and refused with a
clear error otherwise, never clamped.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from .errors import ErrorCode, YtError

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
#: how far ahead of this host's clock a timestamp from elsewhere may be, unless the caller says
#: otherwise (seconds): YT's client_timestamp_threshold, and EngineConfig.max_peer_clock_skew
DEFAULT_MAX_AHEAD_SECONDS = 60.0


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

    def __init__(self, reserved: int, persist: Callable[[int], None],
                 max_ahead_seconds: float = DEFAULT_MAX_AHEAD_SECONDS) -> None:
        #: guards _last and _reserved; a leaf lock, taken inside the commit path's locks (it may
        #: fsync the reservation file once a second while held: no timestamp may pass an unsaved one)
        self._lock = threading.Lock()
        self._last = reserved  # guarded by _lock (read without it: a monotonic int, a stale read is harmless)
        self._reserved = reserved  # guarded by _lock
        self._persist = persist
        #: the bound of :meth:`check` when its caller gives none (set once, read-only after)
        self.max_ahead_seconds = max_ahead_seconds

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

    def check(self, ts: object, what: str = "timestamp", max_ahead_seconds: float | None = None) -> int:
        """``ts`` if it is a timestamp this clock may adopt; a ``YtError`` naming ``what`` otherwise.

        Valid: an integer in ``[MIN_TIMESTAMP, MAX_TIMESTAMP]`` (so also below the sentinels and far
        below SQLite's int64 limit) whose second is at most ``max_ahead_seconds`` (default: the
        provider's; ``math.inf``: no bound) ahead of this host's wall clock. Any distance *behind* is
        fine: a replica catching up receives changes hours old."""
        if isinstance(ts, bool) or not isinstance(ts, int):
            raise YtError(f"Invalid {what} {ts!r}: expected an integer timestamp", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"timestamp": repr(ts)[:100]})
        if not MIN_TIMESTAMP <= ts <= MAX_TIMESTAMP:
            raise YtError(f"Invalid {what} {ts}: out of the timestamp range [{MIN_TIMESTAMP:#x}, {MAX_TIMESTAMP:#x}]",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"timestamp": ts})
        ahead = self.max_ahead_seconds if max_ahead_seconds is None else max_ahead_seconds
        now = time.time()
        if math.isfinite(ahead) and (ts >> COUNTER_BITS) > int(now + ahead):
            raise YtError(f"Invalid {what} {ts:#x}: it is {(ts >> COUNTER_BITS) - int(now)} s ahead of this "
                          f"cluster's clock, more than the {ahead:g} s allowed; check the clocks of both clusters",
                          code=ErrorCode.INVALID_PARAMETER,
                          attributes={"timestamp": ts, "max_ahead_seconds": ahead})
        return ts

    def observe(self, ts: int, max_ahead_seconds: float | None = None) -> None:
        """Make later timestamps exceed ``ts`` (used when a value carries a foreign timestamp).

        ``ts`` must pass :meth:`check` (with ``max_ahead_seconds``): a value that would push this
        clock out of range, or far into the future, is refused with a ``YtError`` and changes
        nothing."""
        self.check(ts, max_ahead_seconds=max_ahead_seconds)
        with self._lock:
            if ts > self._last:
                self._last = ts


class ReservationFile:
    """The durable high-water reservation: one integer in a file, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int:
        """The stored reservation; 0 when there is none yet (a cluster that never made a timestamp).

        A file that does not hold a timestamp is refused (``DataDirError``), never read as 0: the
        clock would start from the wall clock and could repeat timestamps already in the data."""
        from .errors import DataDirError

        try:
            text = self.path.read_text(errors="replace").strip()
        except FileNotFoundError:
            return 0
        try:
            value = int(text)  # never empty: written to a temporary file and renamed
        except ValueError:
            value = -1
        if not 0 <= value <= MAX_TIMESTAMP:
            raise DataDirError(
                f"The timestamp reservation {self.path} is damaged (it holds {text[:40]!r}, not a timestamp "
                f"in [0, {MAX_TIMESTAMP}]): timestamps could repeat or leave the storable range; see "
                "\"Corruption and recovery\" in docs/engine.md", attributes={"path": str(self.path)})
        return value

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
