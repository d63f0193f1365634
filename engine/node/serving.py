"""Whether this cluster takes writes to its own tables now: one owner of that answer; and who serves it.

Two switches say no: XDCR's pause (``dr_pause``, ``--paused``: seed 001's read-only standby, which
still applies what its peers send) and ``//sys/@read_only`` (a TableCluster's ``readOnly``). The
row service asks before a client's write, replication before a push into a plain table, the tablet
service before an XDCR table's schema change; the XDCR subsystem flips the pause. Each gets this
object from the composition root instead of asking another service (or a shared ``self``).

``paused`` is a plain attribute, written by the XDCR operations and read without a lock (a bool is
read whole; a write racing the flip is refused or let through, as it would be a moment apart).

:func:`leader_status` says which engine serves the cluster's database (its lease's epoch and address)
and which PostgreSQL server that database is on: ``GET /leadership`` (``api/app.py``), what the
operator shows as a TableCluster's ``status.leadership``.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from ..cypress import Cypress, parse_ypath
from ..errors import ErrorCode, YtError
from ..storage import Storage

log = logging.getLogger("reptables.engine")

_SYS = parse_ypath("//sys")


class ServingState:
    """The switches that make this cluster refuse writes to its own tables."""

    def __init__(self, name: str, cypress: Cypress, paused: bool = False) -> None:
        self.name = name
        self._cypress = cypress
        #: client writes refused (dr_pause, --paused); XDCR peers' changes still applied
        self.paused = paused

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        log.info("xdcr paused" if paused else "xdcr resumed", extra={"cluster": self.name})

    def check_accepts_writes(self, path: str) -> None:
        """Refuse a write to ``path`` while paused or read-only (``ReplicationHost.check_accepts_writes``)."""
        if self.paused:
            raise YtError(f"Cluster {self.name} is paused (dr_pause, or started with --paused): the write to {path} "
                          "is refused; resume it with `reptables dr resume`", code=ErrorCode.READ_ONLY,
                          attributes={"path": path, "cluster_name": self.name})
        sys_node = self._cypress.resolve(_SYS, missing_ok=True)
        if sys_node is not None and sys_node.attributes.get("read_only") is True:
            raise YtError(f"Cluster {self.name} is read-only (//sys/@read_only): the write to {path} is refused; "
                          "write on a writable cluster", code=ErrorCode.READ_ONLY,
                          attributes={"path": path, "cluster_name": self.name})


#: the server a PostgreSQL session reached (NULL over a Unix socket) and whether it is a standby
_SERVER = sa.text("SELECT host(inet_server_addr()) AS host, inet_server_port() AS port, "
                  "pg_is_in_recovery() AS in_recovery")


def leader_status(name: str, storage: Storage) -> dict[str, Any]:
    """Who serves this cluster and where its database is: the answer of ``GET /leadership``.

    The operator reads it from the engine that serves an HA table cluster (``status.leadership`` of
    its TableCluster, docs/ha.md): the lease this engine holds (``epoch``, the fencing token; its
    advertised ``address``; ``role`` ``leader`` for a member of a leader/standby group, ``single``
    otherwise) and the PostgreSQL server its sessions reached (``host:port`` as the server sees the
    connection, ``inet_server_addr()``, else the URL's host) - never the URL's user or password. A
    standby never gets here (it answers every request 105 naming the leader). SQLite: no lease, no
    server."""
    lead = storage.leadership
    answer: dict[str, Any] = {"cluster_name": name, "storage": "postgresql" if storage.is_postgresql else "sqlite",
                              "role": "leader" if lead is not None and lead.candidate else "single",
                              "epoch": None, "address": None, "holder": None, "lease_seconds": None,
                              "replaced": None, "database": None}
    if lead is not None:
        answer.update(epoch=lead.epoch, address=lead.address, holder=lead.holder, lease_seconds=lead.lease)
        if lead.replaced is not None:
            # the lease this engine took over: the operator names it in ``LeaderChanged`` also when
            # it saw no leader in between (the takeover's gap) or was not running then
            answer["replaced"] = {"epoch": lead.replaced.epoch, "address": lead.replaced.address}
    if storage.is_postgresql:
        with storage.read() as conn:
            row = conn.execute(_SERVER).one()
        url = storage.engine.url
        host = row.host or url.host or "localhost"  # (a Unix socket: the server cannot say)
        port = row.port or url.port or 5432
        answer["database"] = {"server": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                              "in_recovery": bool(row.in_recovery)}
    return answer
