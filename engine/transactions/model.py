"""The vocabulary of tablet transactions: states, participants, the transaction's write buffer.

These types are shared by the coordinator (``manager.py``), the participant side
(``participant.py``) and the replication layer, which implements the commit hooks against them
(``hooks.py``). They hold no engine state: a ``TabletTransaction`` is a client session's buffer,
owned by the ``TransactionManager`` that created it, which also gives it its limits (the
``EngineConfig`` of that engine, so that engines with different limits can share a process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import Any

import sqlalchemy as sa

from ..config import DEFAULT_CONFIG
from ..errors import ErrorCode, TabletStateError, YtError
from ..tablets import DynamicTable, RowWrite, TabletState, WriteKind

ATOMIC_TX_TYPE = 0x2
NON_ATOMIC_TX_TYPE = 0x3


class Atomicity(StrEnum):
    FULL = "full"
    NONE = "none"


class Durability(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class TxState(StrEnum):
    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


def make_object_id(object_type: int, cell_tag: int = 0) -> str:
    """A YT-shaped object id ``a-b-c-d`` whose third part carries the cell tag of the cluster that
    made it (high 16 bits) and the object type (low 16 bits), as YTsaurus ids do."""
    raw = int.from_bytes(os.urandom(16))  # (128 random bits, as uuid4 without building a UUID object)
    return f"{(raw >> 96) & 0xFFFFFFFF:x}-{(raw >> 64) & 0xFFFFFFFF:x}-{((cell_tag & 0xFFFF) << 16) | object_type:x}-" \
           f"{raw & 0xFFFFFFFF:x}"


@dataclass
class Participant:
    """One tablet of one table taking part in a commit."""

    table: DynamicTable
    path: str
    tablet_index: int
    writes: list[RowWrite]
    #: the same writes by key (sorted tables), when the caller has them at hand
    keyed: dict[Any, RowWrite] | None = None
    #: the table's ``layout_revision`` when the writes were placed in tablets: the commit applies
    #: them only if it is still the table's (``check_layout``)
    layout_revision: int = 0

    def check_layout(self, tx_id: str) -> None:
        """Under Storage.write_lock, in the commit's write transaction (unmount and reshard take
        it too): the table is still mounted (or freezing: a freeze waits for the commits in flight)
        and has the tablets the writes were placed in."""
        table = self.table
        if table.layout_revision != self.layout_revision:
            raise YtError(f"Cannot commit transaction {tx_id}: table {self.path} was resharded after the "
                          f"transaction wrote to it (layout revision {self.layout_revision}, now "
                          f"{table.layout_revision}), so tablet {self.tablet_index} of its writes is not the "
                          "table's any more; retry the transaction", code=ErrorCode.NO_SUCH_TABLET,
                          attributes={"path": self.path, "transaction_id": tx_id, "tablet_index": self.tablet_index,
                                      "retriable": True})
        if table.state not in (TabletState.MOUNTED, TabletState.FREEZING):
            raise TabletStateError(f"Cannot commit transaction {tx_id}: table {self.path} was unmounted after the "
                                   f"transaction wrote to it (tablet state is {table.state.value!r})",
                                   code=ErrorCode.TABLET_NOT_MOUNTED,
                                   attributes={"path": self.path, "transaction_id": tx_id,
                                               "tablet_state": table.state.value})

    @property
    def name(self) -> str:
        return f"{self.table.table_id}:{self.tablet_index}"


@dataclass
class RemoteParticipant:
    """A sync replica of a replicated table's tablet: written inside the same commit."""

    cluster: str
    replica_id: str
    replica_path: str
    #: the meta-cluster tablet whose writes this replica receives
    tablet_index: int
    meta_table_id: str
    writes: list[RowWrite]
    #: the replica's row index in the replication queue after this commit (set at apply)
    row_index: int = 0

    @property
    def name(self) -> str:
        return f"{self.cluster}/{self.replica_id}/{self.tablet_index}"

    def progress(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "tablet_index": self.tablet_index, "row_index": self.row_index}


def commit_messages(tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> list[dict[str, Any]]:
    """One commit message per cluster, with the queue progress of each of its participants."""
    by_cluster: dict[str, dict[str, Any]] = {}
    for rp in remote:
        message = by_cluster.setdefault(rp.cluster, {"cluster": rp.cluster, "transaction_id": tx_id,
                                                     "commit_timestamp": commit_ts, "progress": []})
        message["progress"].append(rp.progress())
    return list(by_cluster.values())


#: called inside the participant's commit with (connection, table, prepare extras + commit_timestamp):
#: in its SQL transaction, under Storage.write_lock, like ``CommitHooks.after_queue_append``
ApplyHook = Callable[[sa.Connection, DynamicTable, dict[str, Any]], None]


@dataclass
class TabletTransaction:
    """A client's tablet transaction: its timestamps, state and buffered writes.

    ``lock`` guards the buffer (``writes``, ``tables``, ``row_count``, ``require_sync_replica``)
    and the way out of ``ACTIVE``: writers fill the buffer under it after :meth:`check_active`,
    and ``commit``/``abort`` leave ``ACTIVE`` under it, so that once a commit has begun nothing is
    added to what it applies. It is a leaf: nothing else is taken while it is held.
    """

    id: str
    start_timestamp: int
    atomicity: Atomicity
    durability: Durability
    started_at: float
    timeout: float
    #: leaves ACTIVE under ``lock`` (commit, abort; ``expire`` sets ABORTED without it)
    state: TxState = TxState.ACTIVE
    #: (table_id, tablet) -> key or row position -> merged write, in arrival order. Guarded by ``lock``
    writes: dict[tuple[str, int], dict[Any, RowWrite]] = field(default_factory=dict)
    #: guarded by ``lock``
    tables: dict[str, tuple[DynamicTable, str]] = field(default_factory=dict)
    #: guarded by ``lock``
    row_count: int = 0
    #: per table id: its ``layout_revision`` when the first of the writes to it was placed in its
    #: tablets (a later write placed under another is refused). Guarded by ``lock``
    layouts: dict[str, int] = field(default_factory=dict)
    #: per table id: the last ``require_sync_replica`` given for writes to it. Guarded by ``lock``
    require_sync_replica: dict[str, bool] = field(default_factory=dict)
    last_ping: float = 0.0
    commit_timestamp: int | None = None
    #: the limits of the engine that started it (``EngineConfig.max_transaction_lifetime`` and
    #: ``max_rows_per_transaction``)
    max_lifetime: float = DEFAULT_CONFIG.max_transaction_lifetime
    max_rows: int = DEFAULT_CONFIG.max_rows_per_transaction
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards the buffer and leaving ACTIVE

    def check_active(self) -> None:
        if self.state is not TxState.ACTIVE:
            raise YtError(f"Transaction {self.id} is {self.state.value}, cannot use it",
                          code=ErrorCode.INVALID_TRANSACTION_STATE)
        if time.monotonic() - self.started_at > self.max_lifetime:
            raise YtError(f"Transaction {self.id} has exceeded the maximum lifetime of "
                          f"{self.max_lifetime:.0f} s and can no longer be used",
                          code=ErrorCode.INVALID_TRANSACTION_STATE)

    def _place(self, table: DynamicTable, path: str, revision: int) -> None:
        """The writes of ``table`` being added were placed in tablets under ``revision``."""
        placed = self.layouts.setdefault(table.table_id, revision)
        if placed != revision:
            raise YtError(f"Cannot write into table {path} in transaction {self.id}: the table was resharded "
                          f"after the transaction's earlier writes to it (layout revision {placed}, now "
                          f"{revision}); retry the transaction", code=ErrorCode.NO_SUCH_TABLET,
                          attributes={"path": path, "transaction_id": self.id, "retriable": True})

    def add_many(self, table: DynamicTable, path: str, writes: list[tuple[int, RowWrite]], revision: int) -> None:
        """Buffer a batch of writes of one table (the hot path of insert_rows), placed in tablets
        under the table's layout ``revision``."""
        if self.row_count + len(writes) > self.max_rows:
            raise YtError(f"Transaction {self.id} exceeds the limit of {self.max_rows} rows",
                          code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION,
                          attributes={"limit": self.max_rows})
        self._place(table, path, revision)
        self.row_count += len(writes)
        self.tables[table.table_id] = (table, path)
        buckets = self.writes
        if table.sorted and writes and _fill_fresh_bucket(buckets, table, writes):
            return
        key_of = table.key_of
        last_tablet = -1
        bucket: dict[Any, RowWrite] = {}
        for tablet, write in writes:
            if tablet != last_tablet:
                found = buckets.get((table.table_id, tablet))
                if found is None:
                    found = buckets[(table.table_id, tablet)] = {}
                bucket = found
                last_tablet = tablet
            if not table.sorted:
                bucket[len(bucket)] = write
                continue
            key = key_of(write.row)
            prev = bucket.get(key)
            bucket[key] = write if prev is None else _merge(prev, write)

    def add(self, table: DynamicTable, path: str, tablet: int, write: RowWrite, revision: int) -> None:
        """Buffer a write placed in ``tablet`` under the table's layout ``revision``, merging it
        with earlier writes of the same key (last one wins)."""
        if self.row_count >= self.max_rows:
            raise YtError(f"Transaction {self.id} exceeds the limit of {self.max_rows} rows",
                          code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION,
                          attributes={"limit": self.max_rows})
        self._place(table, path, revision)
        self.row_count += 1
        self.tables[table.table_id] = (table, path)
        bucket = self.writes.setdefault((table.table_id, tablet), {})
        if not table.sorted:
            bucket[len(bucket)] = write
            return
        key = table.key_of(write.row)
        prev = bucket.get(key)
        bucket[key] = _merge(prev, write) if prev is not None else write


_TABLET, _WRITE, _ROW = itemgetter(0), itemgetter(1), attrgetter("row")


def _fill_fresh_bucket(buckets: dict[tuple[str, int], dict[Any, RowWrite]], table: DynamicTable,
                       writes: list[tuple[int, RowWrite]]) -> bool:
    """:meth:`TabletTransaction.add_many`'s usual case in C passes: a sorted table's batch into one
    tablet this transaction has not written yet, no key twice (each key's one write is the merge).
    False, having changed nothing, for any other batch."""
    tablet = writes[0][0]
    where = (table.table_id, tablet)
    if where in buckets or list(map(_TABLET, writes)).count(tablet) != len(writes):
        return False
    batch = list(map(_WRITE, writes))
    names = table.schema.key_names
    try:
        rows = map(_ROW, batch)
        keys = list(zip(map(itemgetter(names[0]), rows))) if len(names) == 1 else \
            list(map(itemgetter(*names), rows))
    except (KeyError, TypeError):
        return False  # (a row without its key: the per-row loop raises as it always did)
    bucket = dict(zip(keys, batch, strict=True))
    if len(bucket) != len(batch):
        return False  # a key written twice: merged by the per-row loop
    buckets[where] = bucket
    return True


def _merge(prev: RowWrite, new: RowWrite) -> RowWrite:
    if new.kind is WriteKind.LOCK:
        if prev.kind is WriteKind.LOCK:
            return RowWrite(WriteKind.LOCK, new.row, prev.mask | new.mask,
                            shared=prev.shared and new.shared, strong=prev.strong or new.strong)
        prev.mask |= new.mask
        return prev
    mask = prev.mask | new.mask
    if new.kind is WriteKind.WRITE and new.update and prev.kind is WriteKind.WRITE:
        return RowWrite(WriteKind.WRITE, {**prev.row, **new.row}, mask, update=prev.update)
    if new.kind is WriteKind.WRITE and new.update and prev.kind is WriteKind.DELETE:
        return RowWrite(WriteKind.WRITE, new.row, mask, update=False)
    return RowWrite(new.kind, new.row, mask, update=new.update)
