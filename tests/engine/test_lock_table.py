"""The row locks of prepared transactions (``transactions/locks.py``): what a prepare locks, what
conflicts with it, what a commit or an abort releases. A sync replica locks a batch of keys per
prepare; the table keeps one holder per lock mode shared by the keys, so these tests cover the
batch of free keys (one pass), keys already held by another transaction (per key), and mixed modes."""

from __future__ import annotations

from reptables.engine.tablets import ImageRun, RowWrite, WriteKind
from reptables.engine.transactions.locks import LockTable

T = "table-1"


def writes(keys: range, mask: int = 1, kind: WriteKind = WriteKind.WRITE, shared: bool = False) -> dict:
    return {(k,): RowWrite(kind, {"k": k}, mask, shared=shared) for k in keys}


def test_a_batch_of_free_keys_is_locked_and_released_whole() -> None:
    locks = LockTable()
    assert not locks
    run = ImageRun([(k,) for k in range(1000)], [(k, "v") for k in range(1000)], 1, ("k", "v"))
    locks.acquire_many(T, run.keyed(), "tx1")
    assert locks
    assert locks.conflict(T, writes(range(999, 1001)), "tx2") == ((999,), "tx1")
    assert locks.conflict(T, writes(range(1000, 1005)), "tx2") is None
    assert locks.conflict(T, writes(range(0, 5)), "tx1") is None  # (its own locks)
    assert locks.conflict("table-2", writes(range(0, 5)), "tx2") is None
    assert locks.holders(T, [(5,), (2000,)], "tx2") == {"tx1"}
    assert locks.holders(T, [(5,)], "tx1") == set()
    locks.release("tx1")
    assert not locks
    assert locks.conflict(T, writes(range(0, 5)), "tx2") is None


def test_keys_two_transactions_hold_stay_locked_until_both_release() -> None:
    locks = LockTable()
    locks.acquire_many(T, writes(range(0, 10), kind=WriteKind.LOCK, shared=True), "tx1")
    locks.acquire_many(T, writes(range(5, 15), kind=WriteKind.LOCK, shared=True), "tx2")
    # shared locks do not conflict with shared locks; an exclusive write does with either holder
    assert locks.conflict(T, writes(range(0, 15), kind=WriteKind.LOCK, shared=True), "tx3") is None
    assert locks.conflict(T, writes(range(12, 13)), "tx3") == ((12,), "tx2")
    assert locks.holders(T, [(7,)], "tx3") == {"tx1", "tx2"}
    locks.release("tx1")
    assert locks.holders(T, [(k,) for k in range(15)], "tx3") == {"tx2"}
    assert locks.conflict(T, writes(range(0, 5)), "tx3") is None
    assert locks.conflict(T, writes(range(0, 6)), "tx3") == ((5,), "tx2")
    locks.release("tx2")
    assert not locks


def test_a_batch_of_several_lock_modes_keeps_each_keys_mode() -> None:
    locks = LockTable()
    keyed = writes(range(0, 3), mask=0b10, kind=WriteKind.LOCK, shared=True)
    keyed.update(writes(range(3, 6), mask=0b100))
    locks.acquire_many(T, keyed, "tx1")
    # a write of another lock group conflicts with neither; of the same group with the writes only
    assert locks.conflict(T, writes(range(0, 6), mask=0b1000), "tx2") is None
    assert locks.conflict(T, writes(range(0, 3), mask=0b10, kind=WriteKind.LOCK, shared=True), "tx2") is None
    assert locks.conflict(T, writes(range(0, 6), mask=0b100), "tx2") == ((3,), "tx1")
    # the primary lock (bit 0) conflicts with every holder
    assert locks.conflict(T, writes(range(1, 2)), "tx2") == ((1,), "tx1")
    locks.release("tx1")
    assert not locks


def test_a_transaction_locking_twice_and_a_release_of_nothing() -> None:
    locks = LockTable()
    locks.release("nobody")
    locks.acquire_many(T, writes(range(0, 4)), "tx1")
    locks.acquire_many(T, writes(range(2, 6)), "tx1")  # (a second tablet's prepare, overlapping keys)
    locks.acquire_many("table-2", writes(range(0, 2)), "tx1")
    assert locks.holders(T, [(k,) for k in range(6)], "tx2") == {"tx1"}
    locks.release("tx1")
    assert not locks and locks.holders(T, [(3,)], "tx2") == set()
