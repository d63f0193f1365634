"""Snapshot leases: a long read at one timestamp holds version compaction back, for a while.

A bootstrap copy reads a source table as of T for as long as the copy takes; compaction drops the
versions a read at T needs once they are older than ``@min_data_ttl`` (30 min by default), after
which reads at T are refused (``TabletSnapshotExpired``). A lease names a table and a timestamp and
expires on its own unless renewed: while it lives, compaction of that table never passes its
timestamp. A job that dies simply stops renewing, and compaction resumes — nothing to clean up.

Leases live in memory: a restarted engine has none, and a copy that spans a restart fails loudly
(its reads at T are refused once compaction passes T) rather than reading wrong rows.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

#: the longest a lease lives without renewal (seconds)
MAX_LEASE_SECONDS = 3600.0


@dataclass(frozen=True)
class Lease:
    lease_id: str
    table_id: str
    timestamp: int
    expires_at: float


class SnapshotLeases:
    """The live leases of one engine, by id."""

    def __init__(self) -> None:
        #: guards _leases. A leaf: nothing is acquired and no I/O is done while holding it
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}

    def grant(self, table_id: str, timestamp: int, seconds: float, lease_id: str | None = None) -> Lease:
        """A new lease, or ``lease_id`` renewed (same table; its timestamp may only move back)."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            old = self._leases.get(lease_id) if lease_id else None
            if old is not None and old.table_id == table_id:
                timestamp = min(timestamp, old.timestamp)
            lease = Lease(lease_id if old is not None and lease_id else uuid.uuid4().hex, table_id, timestamp,
                          now + min(seconds, MAX_LEASE_SECONDS))
            self._leases[lease.lease_id] = lease
            return lease

    def release(self, lease_id: str) -> None:
        with self._lock:
            self._leases.pop(lease_id, None)

    def pinned(self, table_id: str) -> int | None:
        """The oldest timestamp a live lease holds on ``table_id``."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            held = [lease.timestamp for lease in self._leases.values() if lease.table_id == table_id]
        return min(held) if held else None

    def _expire(self, now: float) -> None:
        for lease_id in [i for i, lease in self._leases.items() if lease.expires_at <= now]:
            del self._leases[lease_id]
