"""Whether this cluster takes writes to its own tables now: one owner of that answer.

Two switches say no: XDCR's pause (``dr_pause``, ``--paused``: seed 001's read-only standby, which
still applies what its peers send) and ``//sys/@read_only`` (a TableCluster's ``readOnly``). The
row service asks before a client's write, replication before a push into a plain table, the tablet
service before an XDCR table's schema change; the XDCR subsystem flips the pause. Each gets this
object from the composition root instead of asking another service (or a shared ``self``).

``paused`` is a plain attribute, written by the XDCR operations and read without a lock (a bool is
read whole; a write racing the flip is refused or let through, as it would be a moment apart).
"""

from __future__ import annotations

import logging

from ..cypress import Cypress, parse_ypath
from ..errors import ErrorCode, YtError

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
