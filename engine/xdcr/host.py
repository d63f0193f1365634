"""What the XDCR subsystem needs from the engine that hosts it: ``XdcrHost``.

XDCR (seed 001, active-active replication) sits beside replication, below the node that builds it:
it must not know the node's services. This protocol is the whole answer: the cluster's name,
settings and id; the storage, the tree, timestamps, transactions and peers; its version clock and
change feed; whether the cluster takes writes (``serving``); a table by path; a table's stream
bound (what may be shipped); the check of a peer's rows against a table's schema (replication's);
the creation of a system table and the widening of a schema (the conflict log); and the data
directory (conflict CSVs, snapshot pages). The node's composition root (``node/cluster.py``)
satisfies it with an adapter over its services; tests may satisfy it with real parts.

Two attributes of a table's Cypress node belong to XDCR and are read by the node too (a table
joining its group refuses client writes): ``JOIN_ATTRIBUTE`` and ``REWIND_ATTRIBUTE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from ..config import EngineConfig
from ..cypress import Cypress, Node
from ..peers import Peers
from ..storage import Storage
from ..tablets import DynamicTable, RowWrite
from ..tablets.changes import ChangeFeed
from ..tablets.xdcr import VersionClock
from ..timestamps import TimestampProvider
from ..transactions import TransactionManager

#: an XDCR table's node attribute while it joins its group from a snapshot (join.py)
JOIN_ATTRIBUTE = "_rt_xdcr_join"
#: the origins whose first batch after such a join may have to rewind to the snapshot's position
REWIND_ATTRIBUTE = "_rt_xdcr_rewind"


class Serving(Protocol):
    """Whether the cluster takes client writes (the XDCR pause)."""

    paused: bool

    def set_paused(self, paused: bool) -> None: ...


class XdcrHost(Protocol):
    """The engine as XDCR sees it."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> EngineConfig: ...

    @property
    def cluster_id(self) -> int | None:
        """This cluster's XDCR id (``--cluster-id``, kept in the data directory), None without one."""
        ...

    @property
    def storage(self) -> Storage: ...

    @property
    def cypress(self) -> Cypress: ...

    @property
    def timestamps(self) -> TimestampProvider: ...

    @property
    def transactions(self) -> TransactionManager: ...

    @property
    def peers(self) -> Peers: ...

    @property
    def xdcr_clock(self) -> VersionClock: ...

    @property
    def change_feed(self) -> ChangeFeed: ...

    @property
    def serving(self) -> Serving: ...

    @property
    def data_dir(self) -> Path | None:
        """The engine's data directory (None: an engine without one; snapshots go to a temp dir)."""
        ...

    def resolve_table(self, path: Any) -> tuple[DynamicTable, str, Node]:
        """The dynamic table at ``path``, its canonical path and node; a ``YtError`` otherwise."""
        ...

    def stream_bound(self, table: DynamicTable) -> int:
        """The newest timestamp up to which every change of ``table`` is applied here."""
        ...

    def check_peer_writes(self, table: DynamicTable, path: str, writes: list[RowWrite], what: str) -> None:
        """Rows from a peer, checked against ``table``'s schema as a client's (each replaced by its checked form)."""
        ...

    def create_system_table(self, conn: sa.Connection, name: str, schema: list[dict[str, Any]]) -> Node:
        """A mounted table ``//sys/<name>`` the engine keeps itself, inside the caller's write transaction."""
        ...

    def alter_schema(self, path: Any, schema: Any) -> None:
        """Widen a table's schema (``alter_table --schema``)."""
        ...
