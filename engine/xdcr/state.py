"""The XDCR subsystem's state and what every part of it asks: who the peers are, what is connected.

The subsystem (``service.py``) is built by the node's composition root and talks to the engine only
through :class:`~.host.XdcrHost`. Its parts - the shippers (``shipper.py``), the receiving side
(``receiver.py``), the conflict log (``conflicts.py``), joins (``join.py``) - share one
:class:`XdcrState`: the peers' states and saved progress, the identities of peers, the stop event,
and the questions they all ask (this cluster's id, its connections, its XDCR tables, how far a
peer has a table, whether a peer is who it claims to be, whether two schemas match). Each field
says who writes it and under which lock.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import sqlalchemy as sa

from ..cypress import YPath
from ..errors import ErrorCode, YtError
from ..storage import on_commit, xdcr_progress_table, xdcr_sink_table
from ..tablets import DynamicTable, xdcr
from ..tablets.changes import Position
from .host import XdcrHost
from .settings import (
    DEFAULT_CONFLICT_RETENTION_MS,
    MAX_RETENTION_MS,
    XDCR_SETTINGS,
    describe_schema_difference,
    schema_signature,
    shown,
)

log = logging.getLogger("reptables.engine.xdcr")


class PeerState:
    """What ``dr_status`` says of one peer (changed by its shipper thread; read as it stands)."""

    def __init__(self) -> None:
        self.state = "connecting"
        self.last_error: str | None = None
        self.conflicts = 0
        self.delivered = 0



class XdcrState:
    """What the parts of the XDCR subsystem share (see the module docstring)."""

    def __init__(self, host: XdcrHost) -> None:
        self.host = host
        self.name = host.name
        self.config = host.config
        self.storage = host.storage
        self.cypress = host.cypress
        self.timestamps = host.timestamps
        self.transactions = host.transactions
        self.peers = host.peers
        self.clock = host.xdcr_clock
        self.change_feed = host.change_feed
        self.serving = host.serving
        #: peer -> its shipper thread (the supervisor thread alone changes it)
        self.shippers: dict[str, threading.Thread] = {}
        #: peer -> what ``dr_status`` says of it (changed by its shipper thread; read as it stands)
        self.peer_states: dict[str, PeerState] = {}
        #: (peer, table id) -> monotonic time of the last batch sent (shipper threads, one key each)
        self.advanced: dict[tuple[str, str], float] = {}
        #: (peer, table id) -> the progress last saved, as committed: changed only under the storage
        #: writer (by ``save_progress`` once its transaction commits, and by ``forget``), read without it
        self.saved_progress: dict[tuple[str, str], Position] = {}
        #: (peer, its URL) -> the XDCR cluster id its engine answered (a cache; request threads write it)
        self.identities: dict[tuple[str, str], int] = {}
        #: set once, when the engine stops: the shippers and the supervisor end
        self.stop = threading.Event()

    @property
    def cluster_id(self) -> int | None:
        """This cluster's XDCR id (``--cluster-id``), None without one."""
        return self.host.cluster_id

    # -- configuration -------------------------------------------------------------------------------

    def sys_attr(self, name: str, default: Any = None) -> Any:
        node = self.cypress.root.children.get("sys")
        return default if node is None else node.attributes.get(name, default)

    def connections(self) -> list[str]:
        value = self.sys_attr("xdcr_connections", [])
        return [str(v) for v in value] if isinstance(value, list) else []

    def tables(self) -> list[tuple[DynamicTable, str]]:
        return [(n.table, n.path) for n in list(self.cypress.by_id.values())
                if n.table is not None and n.table.xdcr_cluster_id is not None]

    def own_id(self) -> int:
        if self.cluster_id is None:
            raise YtError(f"Cluster {self.name} has no XDCR cluster id: start its engine with --cluster-id N (0-127)",
                          code=ErrorCode.INVALID_PARAMETER)
        return self.cluster_id

    # -- who a peer is -------------------------------------------------------------------------------

    def peer_cluster_id(self, peer: str, timeout: float = 10.0) -> int | None:
        """``peer``'s XDCR cluster id as its own engine says (``xdcr_identity``, called at the URL of
        this cluster's directory: a request body's claim is checked against the cluster itself), None
        when it has none. Remembered per (name, URL): a cluster's id never changes (it is stored in
        its data directory, and a restart with another is refused). Network: call with no lock held."""
        url = self.peers.connection(peer).proxy_url
        known = self.identities.get((peer, url))
        if known is not None:
            return known
        answer = self.peers.client(peer).call("xdcr_identity", {}, timeout=timeout)
        cluster_id = answer.get("cluster_id") if isinstance(answer, dict) else None
        if cluster_id is None:
            return None
        if isinstance(cluster_id, bool) or not isinstance(cluster_id, int) or not 0 <= cluster_id <= 127:
            raise YtError(f"Cluster {peer} answered xdcr_identity with cluster id {str(cluster_id)[:40]!r}, not an "
                          "XDCR cluster id (0-127)", code=ErrorCode.PROTOCOL_ERROR, attributes={"cluster_name": peer})
        self.identities[(peer, url)] = cluster_id
        return cluster_id

    def check_peer_identity(self, peer: str, claimed: int) -> None:
        """Refuse a request in which ``peer`` claims XDCR cluster id ``claimed`` unless its engine has it."""
        try:
            actual = self.peer_cluster_id(peer)
        except YtError as exc:
            raise YtError(f"Cluster {self.name} cannot confirm the XDCR cluster id of cluster {peer} (its "
                          f"xdcr_identity did not answer: {exc.message}); its changes wait until it does",
                          code=ErrorCode.XDCR_NOT_CONNECTED, attributes={"cluster_name": peer}) from None
        if actual != claimed:
            raise YtError(f"Cluster {peer} may not act as XDCR cluster id {claimed}: its engine has cluster id "
                          f"{actual}", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"cluster_name": peer, "cluster_id": claimed})

    def check_same_schema(self, table: DynamicTable, path: str, theirs: Any, other: str | None, what: str) -> None:
        """The peer's schema of ``path`` (its signature) must be this cluster's; ``what`` (replication,
        a join) starts once they are identical."""
        mine = schema_signature(table.schema)
        if mine != theirs:
            differences = describe_schema_difference(theirs, mine, other or "the peer", self.name)
            raise YtError(f"The schema of XDCR table {path} differs between cluster {other} and cluster {self.name}: "
                          f"{differences}; {what} starts once they are identical (seed 001: replication waits for "
                          "matching schemas)", code=ErrorCode.XDCR_SCHEMA_MISMATCH,
                          attributes={"path": path, "cluster_name": other or ""})

    # -- how far a peer has a table ----------------------------------------------------------------

    def progress(self, peer: str, table_id: str) -> Position:
        saved = self.saved_progress.get((peer, table_id))
        if saved is not None:
            return saved
        c = xdcr_progress_table.c
        with self.storage.read() as conn:
            row = conn.execute(sa.select(c.timestamp, c.seq).where(c.peer == peer, c.table_id == table_id)).first()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def save_progress(self, peer: str, table_id: str, position: Position, durable: bool = True) -> None:
        """Record how far ``peer`` has this cluster's changes of a table. After a batch the peer
        acknowledged, ``durable=False``: no fsync of its own (the next durable commit carries it).
        A crash may lose it, and then the sender ships those changes again from the older position,
        which the peer answers with its record (its sink is durable and skips what it has); the log
        trim only ever sees a position the peer holds."""
        c = xdcr_progress_table.c
        # a lost record changes nothing this engine relies on: the peer holds what it acknowledged
        with self.storage.write(durable=durable, harmless_if_lost=not durable) as conn:
            if peer not in self.connections():
                return  # reset meanwhile (``_forget``, under this same writer): nothing to record
            updated = conn.execute(xdcr_progress_table.update().where(c.peer == peer, c.table_id == table_id)
                                   .values(timestamp=position[0], seq=position[1])).rowcount
            if not updated:
                conn.execute(xdcr_progress_table.insert().values(peer=peer, table_id=table_id, timestamp=position[0],
                                                                 seq=position[1]))
            on_commit(conn, lambda: self.saved_progress.__setitem__((peer, table_id), position))

    def forget(self, peer: str, peer_id: int | None = None) -> None:
        """Drop a peer: off the connections, its progress and (when its id is known) its sink records."""
        with self.storage.write() as conn:
            sys_node = self.cypress.root.children["sys"]
            remaining = [p for p in self.connections() if p != peer]
            sys_node.attributes["xdcr_connections"] = remaining
            self.cypress.save(conn, sys_node)
            conn.execute(xdcr_progress_table.delete().where(xdcr_progress_table.c.peer == peer))
            for key in [k for k in self.saved_progress if k[0] == peer]:
                del self.saved_progress[key]
            if peer_id is not None:
                conn.execute(xdcr_sink_table.delete().where(xdcr_sink_table.c.origin_cluster_id == peer_id))
        self.peer_states.pop(peer, None)
        log.info("xdcr connection reset", extra={"cluster": self.name, "peer": peer})

    # -- settings (checked when set: the node's Cypress service calls check_setting first) -----------

    def check_setting(self, ypath: YPath, value: Any) -> None:
        """The XDCR settings of ``//sys`` (docs/xdcr.md), checked when set, so that what cannot work is
        refused then and not found later by ``dr_status``: ``xdcr_connections`` (a list of distinct
        //sys/clusters names other than this cluster, each with an XDCR cluster id of its own),
        ``xdcr_conflict_retention`` (milliseconds) and ``xdcr_preferred_source`` (a name or an id)."""
        assert ypath.attribute_path
        name = ypath.attribute_path[0]
        if name not in XDCR_SETTINGS:
            return
        node = self.cypress.resolve(ypath)
        if node is None or node is not self.cypress.root.children.get("sys"):
            return
        where = f"//sys/@{name} of cluster {self.name}"
        if len(ypath.attribute_path) != 1:
            raise YtError(f"Cannot set a part of {where}: set it whole", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"attribute": name})
        if name == "xdcr_conflict_retention":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETENTION_MS:
                raise YtError(f"Invalid {where}: expected milliseconds, an integer in [0, {MAX_RETENTION_MS}], not "
                              f"{shown(value)}", code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": name})
        elif name == "xdcr_preferred_source":
            if isinstance(value, int) and not isinstance(value, bool):
                if not 0 <= value <= xdcr.MAX_CLUSTER_ID:
                    raise YtError(f"Invalid {where}: a cluster id is 0-127, not {value}",
                                  code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": name})
            elif not isinstance(value, str) or not self.peers.known(value) or value == self.name:
                raise YtError(f"Invalid {where}: expected the //sys/clusters name of another cluster, or its XDCR "
                              f"cluster id (0-127), not {shown(value)}", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"attribute": name})
        else:
            self._check_connections(where, value)


    def _check_connections(self, where: str, value: Any) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise YtError(f"Invalid {where}: expected a list of //sys/clusters names, not {shown(value)}",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": "xdcr_connections"})
        if not value:
            return
        if self.cluster_id is None:
            raise YtError(f"Cannot set {where}: the cluster has no XDCR cluster id (start its engine with "
                          "--cluster-id N, 0-127)", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"attribute": "xdcr_connections"})
        problems = []
        if len(value) > xdcr.MAX_CLUSTER_ID:
            problems.append(f"{len(value)} names, more than the {xdcr.MAX_CLUSTER_ID} peers a group can have "
                            "(cluster ids are 0-127)")
        else:
            repeated = sorted({v for v in value if value.count(v) > 1})
            if repeated:
                problems.append(f"{', '.join(map(shown, repeated))} listed twice")
            if self.name in value:
                problems.append(f"its own name {shown(self.name)}")
            unknown = [v for v in value if v != self.name and not self.peers.known(v)]
            if unknown:
                problems.append(f"{', '.join(map(shown, unknown[:5]))} not in //sys/clusters")
        if problems:
            raise YtError(f"Invalid {where}: " + "; ".join(problems), code=ErrorCode.INVALID_PARAMETER,
                          attributes={"attribute": "xdcr_connections"})
        # every member has its own id: ask each peer that answers (one that does not is reported by
        # dr_status once it is asked again, and refused by the others' checks of its changes)
        ids: dict[int, str] = {self.cluster_id: self.name}
        for peer in value:
            try:
                peer_id = self.peer_cluster_id(peer, timeout=2.0)  # (a set waits little)
            except YtError:
                continue
            if peer_id is None:
                raise YtError(f"Invalid {where}: cluster {peer} has no XDCR cluster id (start its engine with "
                              "--cluster-id N, 0-127)", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"attribute": "xdcr_connections", "cluster_name": peer})
            if peer_id in ids:
                raise YtError(f"Invalid {where}: clusters {ids[peer_id]} and {peer} both have XDCR cluster id "
                              f"{peer_id}; every cluster of a group needs its own id",
                              code=ErrorCode.INVALID_PARAMETER,
                              attributes={"attribute": "xdcr_connections", "cluster_id": peer_id})
            ids[peer_id] = peer


    def conflict_retention_ms(self) -> int:
        value = self.sys_attr("xdcr_conflict_retention", DEFAULT_CONFLICT_RETENTION_MS)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            # (set checks it; a value stored by an engine that did not must not stop the trimming)
            return DEFAULT_CONFLICT_RETENTION_MS
        return value
