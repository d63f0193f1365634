"""Tablet transactions: visibility, row locks, the commit coordinator and the participant side."""

from .manager import (
    Atomicity,
    Durability,
    Participant,
    RemoteParticipant,
    TabletTransaction,
    TransactionManager,
    commit_messages,
    make_object_id,
)

__all__ = [
    "Atomicity", "Durability", "Participant", "RemoteParticipant", "TabletTransaction", "TransactionManager",
    "commit_messages", "make_object_id",
]
