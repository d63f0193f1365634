"""What replication needs from the engine that hosts it: ``ReplicationHost``.

Replication sits above transactions, Cypress and storage and below the node (``Cluster``), which
builds it. It must not know ``Cluster``: a layer that reached up into the composition root could
use anything there, and a reader could not tell what replication depends on. This protocol is the
whole answer: the cluster's name (sent as the coordinator of sync writes), its storage, timestamp
provider, transaction manager and Cypress tree, one way to turn a path into a table, whether the
cluster takes writes now, and the change streams' hold on a queue.

``Cluster`` hands replication an adapter over its parts and services (``_ReplicationHost`` in
node/cluster.py); the unit tests (``tests/replication/test_units.py``) satisfy
it with a few real parts over a temporary SQLite file, without HTTP or engine processes.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..cypress import Cypress, Node
from ..storage import Storage
from ..tablets import DynamicTable
from ..timestamps import TimestampProvider
from ..transactions import TransactionManager


class ReplicationHost(Protocol):
    """The engine as replication sees it (read-only members: replication never replaces them)."""

    @property
    def name(self) -> str:
        """This cluster's name in the cluster directory (the coordinator named in sync prepares)."""
        ...

    @property
    def storage(self) -> Storage: ...

    @property
    def timestamps(self) -> TimestampProvider: ...

    @property
    def transactions(self) -> TransactionManager: ...

    @property
    def cypress(self) -> Cypress:
        """Replica objects are Cypress nodes; replicated tables are found by id in ``by_id``."""
        ...

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        """The dynamic table at ``path``, its canonical path and its node; a ``YtError`` otherwise."""
        ...

    def check_accepts_writes(self, path: str) -> None:
        """Refuse (a ``YtError`` naming the reason) when this cluster takes no writes to its own tables
        now: paused for XDCR (``dr_pause``, ``--paused``) or ``//sys/@read_only``. A push into a table
        of this cluster that is not a replica table (``preserve_timestamps`` false) is such a write."""
        ...

    def stream_hold(self, table: DynamicTable, node: Node) -> int | None:
        """The newest commit timestamp change streams let a replicated table's queue be trimmed
        to (its ``change_retention`` and vital consumers, ``node/stream_service.py``); None: no hold."""
        ...
