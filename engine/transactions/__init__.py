"""Tablet transactions: visibility, row locks, the commit coordinator and the participant side.

``manager`` (``TransactionManager``: sessions, commit paths, decision records), ``participant``
(``ParticipantSide``: transactions coordinated by another cluster, recovery, replicator batches),
``visibility`` (``InFlight``: what reads wait for), ``locks`` (``LockTable`` and the conflict check),
``hooks`` (``CommitHooks``: what a commit asks of replication) and ``model`` (the shared types).
"""

from .hooks import CommitHooks
from .manager import TransactionManager
from .model import (
    Atomicity,
    Durability,
    Participant,
    RemoteParticipant,
    TabletTransaction,
    commit_messages,
    make_object_id,
)

__all__ = [
    "Atomicity", "CommitHooks", "Durability", "Participant", "RemoteParticipant", "TabletTransaction",
    "TransactionManager", "commit_messages", "make_object_id",
]
