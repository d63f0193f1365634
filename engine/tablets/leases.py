"""Snapshot leases: a long read at one timestamp holds version compaction back, for a while.

A bootstrap copy reads a source table as of T for as long as the copy takes; compaction drops the
versions a read at T needs once they are older than ``@min_data_ttl`` (30 min by default), after
which reads at T are refused (``TabletSnapshotExpired``). A lease names a table and a timestamp and
expires on its own unless renewed: while it lives, compaction of that table never passes its
timestamp. A job that dies simply stops renewing, and compaction resumes — nothing to clean up.

Leases are granted to peers (``/internal/v1/lease_snapshot``: the peer credential names the
*holder*), so what one peer can make the engine keep is bounded: at most ``MAX_LEASES_PER_HOLDER``
live leases each, and only the holder renews or releases its lease. A grant runs under the storage
writer (so a lease and a compaction never pass each other): it costs O(log n) in the number of
leases, never a scan of them all; expired leases leave a heap ordered by expiry.

Leases live in memory: a restarted engine has none, and a copy that spans a restart fails loudly
(its reads at T are refused once compaction passes T) rather than reading wrong rows.
"""

from __future__ import annotations

import heapq
import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import ErrorCode, YtError

#: the longest a lease lives without renewal (seconds)
MAX_LEASE_SECONDS = 3600.0
#: live leases one holder (a peer cluster; "" in process) may have at once: a bootstrap copy takes one
MAX_LEASES_PER_HOLDER = 64


@dataclass(frozen=True)
class Lease:
    lease_id: str
    table_id: str
    timestamp: int
    expires_at: float
    holder: str = ""


class SnapshotLeases:
    """The live leases of one engine, by id, by table and by holder."""

    def __init__(self, max_per_holder: int = MAX_LEASES_PER_HOLDER) -> None:
        #: guards every field below. A leaf: nothing is acquired and no I/O is done while holding it
        self._lock = threading.Lock()
        self._max_per_holder = max_per_holder
        self._leases: dict[str, Lease] = {}
        self._by_table: dict[str, set[str]] = {}
        self._by_holder: dict[str, set[str]] = {}
        #: (expires_at, lease_id), one entry per grant or renewal; an entry whose lease was renewed
        #: or released since is skipped when it comes up
        self._expiry: list[tuple[float, str]] = []

    def grant(self, table_id: str, timestamp: int, seconds: float, lease_id: str | None = None,
              holder: str = "") -> Lease:
        """A new lease, or ``lease_id`` renewed (same table and holder; its timestamp may only move
        back). A ``YtError`` when ``holder`` has ``MAX_LEASES_PER_HOLDER`` live leases already."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            old = self._leases.get(lease_id) if lease_id else None
            if old is not None and old.holder != holder:
                raise YtError(f"Snapshot lease {lease_id} belongs to another cluster: only its holder renews it",
                              code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                              attributes={"lease_id": lease_id or ""})
            if old is not None and old.table_id == table_id:
                timestamp = min(timestamp, old.timestamp)
            else:
                old = None
                held = self._by_holder.get(holder, ())
                if len(held) >= self._max_per_holder:
                    raise YtError(f"Cluster {holder or 'in process'} holds {len(held)} snapshot leases already, the "
                                  f"most one cluster may hold: release one (they expire {MAX_LEASE_SECONDS:g} s "
                                  "after their last renewal at the latest)", code=ErrorCode.INVALID_PARAMETER,
                                  attributes={"cluster_name": holder, "limit": self._max_per_holder})
            lease = Lease(lease_id if old is not None and lease_id else uuid.uuid4().hex, table_id, timestamp,
                          now + min(seconds, MAX_LEASE_SECONDS), holder)
            self._leases[lease.lease_id] = lease
            self._by_table.setdefault(table_id, set()).add(lease.lease_id)
            self._by_holder.setdefault(holder, set()).add(lease.lease_id)
            heapq.heappush(self._expiry, (lease.expires_at, lease.lease_id))
            return lease

    def release(self, lease_id: str, holder: str = "") -> None:
        """Drop a lease (of ``holder``: another's is refused; an unknown or expired one is nothing)."""
        with self._lock:
            lease = self._leases.get(lease_id)
            if lease is None:
                return
            if lease.holder != holder:
                raise YtError(f"Snapshot lease {lease_id} belongs to another cluster: only its holder releases it",
                              code=ErrorCode.AUTHORIZATION_ERROR, http_status=403, attributes={"lease_id": lease_id})
            self._drop(lease)

    def pinned(self, table_id: str) -> int | None:
        """The oldest timestamp a live lease holds on ``table_id``."""
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            held = [self._leases[i].timestamp for i in self._by_table.get(table_id, ())]
        return min(held) if held else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def _drop(self, lease: Lease) -> None:
        del self._leases[lease.lease_id]
        for index, key in ((self._by_table, lease.table_id), (self._by_holder, lease.holder)):
            ids = index.get(key)
            if ids is not None:
                ids.discard(lease.lease_id)
                if not ids:
                    del index[key]

    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, lease_id = heapq.heappop(self._expiry)
            lease = self._leases.get(lease_id)
            if lease is not None and lease.expires_at == expires_at:
                self._drop(lease)
        if len(self._expiry) > 4 * len(self._leases) + 64:
            # renewals leave stale entries behind: rebuild rather than let them pile up
            self._expiry = [(lease.expires_at, lease.lease_id) for lease in self._leases.values()]
            heapq.heapify(self._expiry)
