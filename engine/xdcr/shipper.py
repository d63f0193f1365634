"""The sending side of XDCR: one shipper per peer follows each XDCR table's change log.

Every change to an XDCR table is logged with its version (``tablets/xdcr.py``) in the table's change
log (``tablets/changes.py``); a shipper sends this cluster's own changes (never the ones it received:
nothing is echoed back) to the peer's ``/internal/v1/xdcr_apply``, in commit order, and records how
far the peer has them once the peer has acknowledged them. A member whose log no longer holds what a
peer lacks never ships part of it: it probes the peer and waits for a join (``waiting_for_snapshot``).
The shipper threads hold no lock across a call to a peer.
"""

from __future__ import annotations

import logging
import re
import time

import orjson
import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..httpconn import dumps_json
from ..storage import changes_table
from ..tablets import DynamicTable, changes
from ..tablets.changes import Position
from .settings import schema_signature
from .state import PeerState, XdcrState

log = logging.getLogger("reptables.engine.xdcr")

#: the head of a logged XDCR change's payload: its version, ``{"o": [timestamp, cluster id]``
#: (orjson writes no spaces, the standard encoder, used for NaN, one after each separator)
_ORIGIN = re.compile(r'\{"o": ?\[-?\d+, ?(-?\d+)\]')
#: changes one batch carries to a peer
BATCH_CHANGES = 2000
_IDLE_WAIT = 0.2
#: at most this often (seconds) a peer's record of this cluster's log position is moved past changes
#: this cluster only received (an empty batch)
_ADVANCE_INTERVAL = 0.5


class Shipper:
    """The shippers of this cluster's own changes, one thread per peer (started by the service)."""

    def __init__(self, state: XdcrState) -> None:
        self.state = state

    def ship_loop(self, peer: str) -> None:
        state = self.state.peer_states.setdefault(peer, PeerState())
        state.state, state.last_error = "connecting", None  # (a connection set again starts afresh)
        while not self.state.stop.is_set() and peer in self.state.connections():
            version = self.state.change_feed.version
            busy = failed = False
            for table, path in self.state.tables():
                try:
                    busy |= self._ship_table(peer, table, path, state)
                except YtError as exc:
                    failed = True
                    state.state, state.last_error = self._waiting_state(exc), exc.message
                    log.warning("xdcr shipping waits", extra={"peer": peer, "path": path, "error": exc.message})
                    self.state.stop.wait(1.0)
                except Exception as exc:  # noqa: BLE001 - recorded, retried
                    failed = True
                    state.state, state.last_error = "error", f"{type(exc).__name__}: {exc}"
                    log.exception("xdcr shipping failed", extra={"peer": peer, "path": path})
                    self.state.stop.wait(1.0)
            if not failed:
                # every table shipped (or had nothing to ship) in this pass
                state.state, state.last_error = "connected", None
            if not busy and not self.state.change_feed.wait_after(version, time.monotonic() + _IDLE_WAIT):
                self.state.stop.wait(_IDLE_WAIT)  # no slot to wait for a commit in: poll
        state.state = "reset" if peer not in self.state.connections() else "stopped"

    @staticmethod
    def _waiting_state(exc: YtError) -> str:
        if exc.code == ErrorCode.XDCR_SCHEMA_MISMATCH:
            return "waiting_for_schema"
        if exc.code == ErrorCode.XDCR_NOT_CONNECTED:
            return "waiting_for_peer"
        if exc.code == ErrorCode.XDCR_NEEDS_SNAPSHOT:
            return "waiting_for_snapshot"
        return "error"

    def _ship_table(self, peer: str, table: DynamicTable, path: str, state: PeerState) -> bool:
        """Send the next batch of this cluster's own changes of ``table`` to ``peer``; True if more wait."""
        own = self.state.own_id()
        position = self.state.progress(peer, table.table_id)
        if position < table.changes_trimmed:
            position = self._probe(peer, table, path, position)
        bound = self.state.host.stream_bound(table)
        with self.state.storage.read() as conn:
            found = changes.read_logged(table, conn, position, bound, BATCH_CHANGES)
        if not found:
            return False
        end: Position = (int(found[-1][0]), int(found[-1][1]))
        actions = [self._action(r[0], r[1], r[3], r[4]) for r in found if self._origin_id(r[4], own) == own]
        key = (peer, table.table_id)
        if not actions and len(found) < BATCH_CHANGES and \
                time.monotonic() - self.state.advanced.get(key, 0.0) < _ADVANCE_INTERVAL:
            # only changes received from peers, at the tail of the log: the peer's record of this
            # cluster's position moves on with the next own change, or in a moment (the progress
            # saved here never runs ahead of what the peer recorded: the log is trimmed up to that
            # progress, and a cluster joining from a snapshot starts from the peer's record)
            return False
        self.state.advanced[key] = time.monotonic()
        stored = self._send(peer, table, path, position, end, actions)
        if stored < position:
            # the peer joined from a snapshot after this cluster had shipped to its table (which
            # the join cleared): ship again from the snapshot's position (a probe first if the
            # log no longer holds it)
            log.info("xdcr peer rewound", extra={"peer": peer, "path": path, "position": list(stored)})
            self.state.save_progress(peer, table.table_id, stored)
            return True
        if stored < end:
            raise YtError(f"XDCR peer {peer} answered position {stored} for a batch ending at {end}",
                          code=ErrorCode.PROTOCOL_ERROR)
        state.delivered += len(actions)
        self.state.save_progress(peer, table.table_id, end, durable=False)
        return len(found) >= BATCH_CHANGES

    def _send(self, peer: str, table: DynamicTable, path: str, start: Position, end: Position,
              actions: list[str]) -> Position:
        """One ``xdcr_apply`` of the changes after ``start`` up to ``end`` (``actions``: each as JSON
        text, :meth:`_action`): the position the peer holds."""
        head = dumps_json({"path": path, "origin_cluster": self.state.name, "origin_cluster_id": self.state.own_id(),
                           "schema": schema_signature(table.schema), "start": list(start), "end": list(end)})
        body = head[:-1] + b',"actions":[' + ",".join(actions).encode() + b"]}"
        answer = self.state.peers.client(peer).call("xdcr_apply", raw_body=body,
                                                     timeout=self.state.config.push_timeout)
        return int(answer["position"][0]), int(answer["position"][1])

    def _probe(self, peer: str, table: DynamicTable, path: str, position: Position) -> Position:
        """The log was trimmed after ``position``: ask the peer what it holds. Enough (it joined from
        a snapshot, or had it all), shipping goes on from there; else it needs a snapshot."""
        stored = self._send(peer, table, path, position, position, [])
        if stored < table.changes_trimmed:
            raise YtError(f"Cluster {peer} misses changes of {path} that cluster {self.state.name} no longer keeps "
                          f"(its change log is trimmed up to {list(table.changes_trimmed)}, the peer holds "
                          f"{list(stored)}): join {peer} to the group from a snapshot "
                          f"(`reptables dr join --path {path}` against {peer})",
                          code=ErrorCode.XDCR_NEEDS_SNAPSHOT, attributes={"path": path, "cluster_name": peer})
        self.state.save_progress(peer, table.table_id, stored)
        return stored

    @staticmethod
    def _origin_id(payload: str, own: int) -> int:
        """The cluster id of a logged change's version (``o``): read from the head of the payload,
        where ``changes.record`` puts XDCR's fields, without parsing the rest; a change logged
        without a version (none is) counts as this cluster's own."""
        head = _ORIGIN.match(payload)
        if head is not None:
            return int(head.group(1))
        version = changes.decode_payload(payload).get("o")
        return int(version[1]) if isinstance(version, list) and len(version) == 2 else own

    @staticmethod
    def _action(ts: int, seq: int, kind: str, payload: str) -> str:
        """A logged change as an action of ``xdcr_apply`` (JSON text): its position, its kind and the
        logged payload as it is (its version ``o``, the version it was made on ``e``, the delete
        horizon ``h``, the replaced row ``b``, and ``row`` or ``key``). Passed on without parsing
        and encoding it again: the shippers' largest cost when they did (benchmarks/README.md)."""
        rest = payload.strip()[1:].lstrip()
        return f'{{"p":[{int(ts)},{int(seq)}],"k":{orjson.dumps(kind).decode()}' + \
            ("}" if rest.startswith("}") else "," + rest)

    def log_hold(self, table: DynamicTable) -> Position | None:
        """An XDCR table's changes stay until every connected peer has them."""
        if table.xdcr_cluster_id is None:
            return None
        peers = self.state.connections()
        if not peers:
            return None
        return min(self.state.progress(peer, table.table_id) for peer in peers)

    @staticmethod
    def owed(conn: sa.Connection, table: DynamicTable, position: Position) -> sa.ColumnElement[bool]:
        """The logged changes of XDCR table ``table`` after ``position`` that were made on this
        cluster (what a peer at ``position`` still misses; the changes this cluster only received
        are never shipped, so never owed, though the peer's record passes them only every half second)."""
        c = changes_table.c
        own = table.xdcr_cluster_id
        # the cluster id of the version at the head of the payload (``_ORIGIN``): between its first
        # comma and its first "]". Not a JSON path: a payload with an infinite double is written by
        # the standard encoder (``Infinity``), which neither SQLite's nor PostgreSQL's JSON reads
        find = sa.func.strpos if conn.dialect.name == "postgresql" else sa.func.instr
        comma, close = find(c.payload, ","), find(c.payload, "]")
        origin = sa.case((c.payload.like('{"o":%'), sa.cast(sa.func.trim(
            sa.func.substr(c.payload, comma + 1, close - comma - 1)), sa.Integer)), else_=None)
        mine = origin == own
        after = sa.or_(c.timestamp > position[0], sa.and_(c.timestamp == position[0], c.seq > position[1]))
        # (the redundant ``timestamp >= position`` is the index's lower bound, as in ``changes.read``)
        return sa.and_(c.table_id == table.table_id, c.timestamp >= position[0], after, mine)

    def undelivered(self) -> list[str]:
        """(peer: table) pairs whose peer misses some of this cluster's own changes."""
        missing = []
        for table, path in self.state.tables():
            for peer in self.state.connections():
                position = self.state.progress(peer, table.table_id)
                with self.state.storage.read() as conn:
                    owed = conn.execute(sa.select(changes_table.c.seq).where(
                        self.owed(conn, table, position)).limit(1)).first()
                if owed is not None:
                    missing.append(f"{peer}: {path}")
        return missing
