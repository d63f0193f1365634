"""What the commit path needs from replication, as a protocol the replication layer implements.

The commit path sits below replication (it must never import it: see the import-linter contracts in
``pyproject.toml``), yet a commit that writes a replicated table must fan out to its sync replicas
and advance their progress atomically with the queue append. It does so through these hooks, which
the composition root registers with ``TransactionManager.register_commit_hooks``. Keeping them in
one small protocol documents the whole contract in one place: when each hook runs, what is locked
at that moment, and therefore what the implementation may and may not do.
"""

from __future__ import annotations

from typing import Protocol

import sqlalchemy as sa

from .model import Participant, RemoteParticipant, TabletTransaction


class CommitHooks(Protocol):
    """Called by ``TransactionManager`` while it commits a transaction that writes replicated tables.

    Locks named here: ``Storage.write_lock`` (the storage writer lock, an RLock around every write
    transaction) and the transaction manager's own ``_lock`` (sessions), ``InFlight.cond``
    (in-flight commit timestamps and remote prepares) and ``LockTable._mutex`` (row locks of
    prepared transactions). Hooks run in the committing thread; none of them is ever called with
    ``InFlight.cond``, ``LockTable._mutex``, the session lock or the transaction's own ``lock``
    held.

    In commit order:

    1. :meth:`sync_participants` — once per replicated participant, while the participants are
       formed, before anything is checked or written. No lock is held (the transaction is already
       ``COMMITTING``, so its buffer no longer changes). It may raise to refuse the commit (no sync
       replica, a replica draining); nothing has been done yet.
    2. :meth:`prepare_remote` — two-phase commits with sync replicas only, before the local
       participants are checked. No lock is held: it may block on the network (and must, for its
       answers). It raises if a replica fails to prepare, after telling every replica to abort.
    3. :meth:`after_queue_append` — inside the commit's SQL transaction, under
       ``Storage.write_lock``, right after the queue append of one replicated participant; the
       commit timestamp is registered in flight (readers at or after it wait) and, in a two-phase
       commit, the local participants' row locks are held in the lock table. It must take no lock
       ordered before the writer lock (it may take replication's own registry lock: that one comes
       after), must never block on the network, and may raise to roll the whole commit back
       (``SyncReplicaNotInSync``), which also undoes the in-memory changes of the append.
    4. :meth:`commit_remote` — after the commit decision is durable and every local lock is
       released, once per two-phase commit with remote participants. No lock is held. It must not
       fail the commit (the decision is taken): delivery to the replicas goes on in the background.
    * :meth:`abort_remote` — when a two-phase commit fails after :meth:`prepare_remote` succeeded
       (a local conflict, a crash point), after the local row locks are released. No lock is held;
       it should not block on the network either (the client is waiting for its error).
    """

    def sync_participants(self, part: Participant, require_sync_replica: bool) -> list[RemoteParticipant]: ...

    def prepare_remote(self, tx: TabletTransaction, remote: list[RemoteParticipant],
                       prepare_ts: int) -> list[RemoteParticipant]: ...

    def abort_remote(self, tx_id: str, remote: list[RemoteParticipant]) -> None: ...

    def after_queue_append(self, conn: sa.Connection, part: Participant, commit_ts: int,
                           remote: list[RemoteParticipant]) -> None: ...

    def commit_remote(self, tx_id: str, commit_ts: int, remote: list[RemoteParticipant]) -> None: ...
