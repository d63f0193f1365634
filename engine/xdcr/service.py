"""Active-active replication across clusters (seed 001, XDCR): shipping, applying, conflicts, operations.

Every cluster of an XDCR group takes writes. A change to an XDCR table is logged with its version
(``tablets/xdcr.py``) in the table's change log (``tablets/changes.py``); one *shipper* per peer
follows the log and sends this cluster's own changes (never the ones it received: nothing is
echoed back) to the peer's ``/internal/v1/xdcr_apply``, in commit order. The peer applies a batch
in one SQL transaction per origin commit, with the batch's last log position recorded in the
same transaction (``_rt_xdcr_sink``), so a batch retried after a lost answer or a crash is
applied once. Every action is resolved by the seed's rules against the row the peer has; every
conflict is logged, as CSV under the data directory (``xdcr_conflicts/LOG_<date>.csv``) and as
rows of the ordered table ``//sys/xdcr_conflicts``, written in the applying transaction.

Configuration is live, in ``//sys``: ``@xdcr_connections`` (the peers, by their ``//sys/clusters``
name) and ``@xdcr_conflict_retention``. A connection works once both sides list each other and
the table's schema is identical on both; until then the shipper waits and says why
(``dr_status``). The operations are seed 001's: ``dr_pause`` (client writes refused, returns once
every change is delivered), ``dr_resume``, ``dr_reset`` (one peer with ``force``, or all),
``dr_drop`` (drain, tell every peer to forget this cluster, leave). A cluster started with
``--paused`` is a read-only standby that still applies what its peers send.

The subsystem is built by the node's composition root (``node/cluster.py``) behind a host protocol
(``host.py``), beside replication: ``XdcrService`` wires its parts - the shared state (``state.py``),
the conflict log (``conflicts.py``), the shippers (``shipper.py``), the receiving side
(``receiver.py``) and joins (``join.py``) - and is the one entry point of the API's commands
(``dr_*``) and of the internal routes (``xdcr_*``).

Threads: a supervisor starts and ends the shippers (one per connected peer) and runs the periodic
work (the conflict log's retention, expired snapshots); the shipper threads hold no lock across a
call to a peer; the receiving side runs in the request's worker thread under the storage writer
(lock 1), like a replicator push.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy as sa

from ..cypress import YPath
from ..errors import ErrorCode, YtError
from ..storage import changes_table
from ..tablets import DynamicTable
from ..tablets.changes import Position
from ..timestamps import COUNTER_BITS
from .conflicts import ConflictLog
from .host import XdcrHost
from .join import PAGE_ROWS, Join
from .receiver import Receiver
from .shipper import Shipper
from .state import PeerState, XdcrState, log


class XdcrService:
    """XDCR of one cluster: its settings, shippers, receiving side, conflict log, joins and operations."""

    def __init__(self, host: XdcrHost) -> None:
        self.state = XdcrState(host)
        self.conflicts = ConflictLog(self.state)
        self.shipper = Shipper(self.state)
        self.receiver = Receiver(self.state, self.conflicts)
        self.join = Join(self.state)

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """The conflict log in place, then the supervisor: shippers for the connected peers, and the
        periodic work. Until ``stop``."""
        state = self.state
        if state.cluster_id is not None:
            self.conflicts.migrate()

        def supervise() -> None:
            while not state.stop.wait(0.5):
                try:
                    wanted = set(state.connections()) if state.cluster_id is not None else set()
                    for peer in wanted - set(state.shippers):
                        thread = threading.Thread(target=self.shipper.ship_loop, args=(peer,), name=f"xdcr-{peer}",
                                                  daemon=True)
                        state.peer_states.setdefault(peer, PeerState())
                        state.shippers[peer] = thread
                        thread.start()
                    for peer, thread in list(state.shippers.items()):
                        if not thread.is_alive():
                            del state.shippers[peer]
                    self.conflicts.trim()
                    self.join.expire_snapshots()
                except Exception:  # noqa: BLE001 - the supervisor must outlive any one failure
                    log.exception("xdcr supervisor failed")

        threading.Thread(target=supervise, name="xdcr-supervisor", daemon=True).start()

    def stop(self) -> None:
        self.state.stop.set()

    # -- what the node asks ------------------------------------------------------------------------------

    def check_setting(self, ypath: YPath, value: Any) -> None:
        """A set of ``//sys/@xdcr_*`` (registered with the Cypress service: runs before its writer lock)."""
        self.state.check_setting(ypath, value)

    def log_hold(self, table: DynamicTable) -> Position | None:
        """An XDCR table's changes stay until every connected peer has them (registered with streams)."""
        return self.shipper.log_hold(table)

    # -- the internal routes (``caller``: the cluster a peer credential names; None in process) -----------

    def handle_apply(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.receiver.apply(body, caller)

    def handle_snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.join.snapshot(body, caller)

    def handle_snapshot_read(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.join.snapshot_read(body, caller)

    def handle_snapshot_release(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return self.join.snapshot_release(body, caller)

    def handle_identity(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        return {"cluster": self.state.name, "cluster_id": self.state.cluster_id}

    # -- joins (the API's dr_join_*) ----------------------------------------------------------------------

    def dr_join_begin(self, path: Any, source: str | None = None, page_rows: int = PAGE_ROWS,
                      restart: bool = False) -> dict[str, Any]:
        return self.join.dr_join_begin(path, source, page_rows, restart)

    def dr_join_read(self, path: Any, page: int) -> dict[str, Any]:
        return self.join.dr_join_read(path, page)

    def dr_join_write(self, path: Any, page: int, entries: list[Any]) -> dict[str, Any]:
        return self.join.dr_join_write(path, page, entries)

    def dr_join_finish(self, path: Any) -> dict[str, Any]:
        return self.join.dr_join_finish(path)

    # -- operations ------------------------------------------------------------------------------------

    def dr_pause(self, wait: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Refuse client writes; with ``wait``, return once every change was delivered to every peer."""
        self.state.serving.set_paused(True)
        if wait:
            deadline = time.monotonic() + timeout
            while True:
                missing = self.shipper.undelivered()
                if not missing:
                    break
                if time.monotonic() > deadline:
                    raise YtError(f"Cluster {self.state.name} is paused but not drained after {timeout:g} s: "
                                  f"{', '.join(missing[:5])} still miss changes (is the peer reachable? "
                                  "see dr_status)", code=ErrorCode.TIMEOUT, attributes={"undelivered": missing[:100]})
                time.sleep(0.05)
        return self.dr_status()

    def dr_resume(self) -> dict[str, Any]:
        self.state.serving.set_paused(False)
        return self.dr_status()

    def dr_reset(self, cluster: str | None = None, force: bool = False) -> dict[str, Any]:
        """Stop replicating to ``cluster`` (``force`` required: its undelivered changes are dropped
        and the group may diverge, seed 001), or to every peer (``cluster`` None)."""
        peers = self.state.connections()
        if cluster is not None:
            if cluster not in peers:
                raise YtError(f"Cluster {self.state.name} has no XDCR connection to {cluster} (connections: {peers})",
                              code=ErrorCode.RESOLVE_ERROR, attributes={"cluster_name": cluster})
            if not force:
                raise YtError(f"Resetting XDCR with the single cluster {cluster} drops the changes it has not "
                              "received and the group may diverge: give --force to confirm (or reset all)",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"cluster_name": cluster})
            self.state.forget(cluster)
        else:
            for peer in peers:
                self.state.forget(peer)
        return self.dr_status()

    def dr_drop(self, timeout: float = 60.0) -> dict[str, Any]:
        """Leave the group: drain every change to every peer, tell each to forget this cluster, reset."""
        own = self.state.own_id()
        self.dr_pause(wait=True, timeout=timeout)
        try:
            for peer in self.state.connections():
                self.state.peers.client(peer).call("xdcr_forget", {"cluster": self.state.name, "cluster_id": own},
                                             timeout=self.state.config.push_timeout)
                self.state.forget(peer)
        finally:
            self.state.serving.set_paused(False)
        return self.dr_status()

    def handle_forget(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """A member leaving the group (``dr_drop``) asks this cluster to forget it: its connection,
        the progress this cluster keeps of it, and the records of its changes applied here. Only
        its own: ``cluster`` must be the caller, and ``cluster_id`` the id the caller's engine has."""
        name, cluster_id = body.get("cluster"), body.get("cluster_id")
        if not isinstance(name, str) or isinstance(cluster_id, bool) or not isinstance(cluster_id, int) \
                or not 0 <= cluster_id <= 127:
            raise YtError("Malformed xdcr_forget: cluster (a name) and cluster_id (0-127) are required",
                          code=ErrorCode.PROTOCOL_ERROR)
        if caller is not None and caller != name:
            raise YtError(f"Cluster {caller} may not drop cluster {name} from XDCR", code=ErrorCode.AUTHORIZATION_ERROR,
                          http_status=403, attributes={"cluster_name": caller})
        if name in self.state.connections():
            if caller is not None:
                self.state.check_peer_identity(name, cluster_id)
            self.state.forget(name, cluster_id)
        return {}

    def dr_status(self) -> dict[str, Any]:
        peers: dict[str, Any] = {}
        now = time.time()
        for peer in self.state.connections():
            state = self.state.peer_states.get(peer) or PeerState()
            queued_rows = queued_bytes = 0
            oldest: int | None = None
            for table, _ in self.state.tables():
                position = self.state.progress(peer, table.table_id)
                c = changes_table.c
                with self.state.storage.read() as conn:
                    # this cluster's own changes the peer misses (received ones are never shipped)
                    count, size, first = conn.execute(sa.select(
                        sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(c.payload)), 0),
                        sa.func.min(c.timestamp)).where(self.shipper.owed(conn, table, position))).one()
                queued_rows += int(count)
                queued_bytes += int(size)
                if first is not None:
                    oldest = int(first) if oldest is None else min(oldest, int(first))
            lag = 0.0 if oldest is None else max(0.0, now - (oldest >> COUNTER_BITS))
            paused = self.state.serving.paused and state.state == "connected"
            peers[peer] = {"state": "paused" if paused else state.state,
                           "lag_seconds": round(lag, 3), "queued_rows": queued_rows, "queued_bytes": queued_bytes,
                           "conflicts": state.conflicts, "delivered_changes": state.delivered,
                           "last_error": state.last_error}
        return {"cluster": self.state.name, "cluster_id": self.state.cluster_id, "paused": self.state.serving.paused,
                "connections": self.state.connections(), "tables": [path for _, path in self.state.tables()],
                "peers": peers, "joining": self.join.joining_tables()}
