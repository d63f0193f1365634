"""The state and mode of a table replica, as seed 002 names them.

Shared by the engine (which stores them), the operator's models (which expose them in CRD status)
and the tracker (which decides modes): one definition of the words users see.
"""

from __future__ import annotations

from enum import StrEnum


class ReplicaState(StrEnum):
    DISABLED = "disabled"
    ENABLING = "enabling"
    ENABLED = "enabled"
    DISABLING = "disabling"


class ReplicaMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"
