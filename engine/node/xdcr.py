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

Threads: the shipper threads hold no lock across a call to a peer; the receiving side runs in the
request's worker thread under the storage writer (lock 1), like a replicator push.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..cypress import YPath
from ..errors import ErrorCode, YtError
from ..schema import TableSchema
from ..storage import changes_table, on_commit, on_rollback, xdcr_progress_table, xdcr_sink_table
from ..tablets import DynamicTable, RowWrite, WriteKind, changes, xdcr
from ..tablets.changes import Position
from ..timestamps import COUNTER_BITS
from .base import JOIN_ATTRIBUTE, REWIND_ATTRIBUTE
from .rows import RowCommands

log = logging.getLogger("reptables.engine.xdcr")

CONFLICTS_PATH = "//sys/xdcr_conflicts"
#: the seed's conflict log columns, in its order, then whether the losing write was local or replicated
CONFLICT_COLUMNS = ["ROW_TYPE", "ACTION_TYPE", "CONFLICT_TYPE", "CONFLICTS_ON_PRIMARY_KEY", "DECISION", "CLUSTER_ID",
                    "TIMESTAMP", "DIVERGENCE", "TABLE_NAME", "CURRENT_CLUSTER_ID", "CURRENT_TIMESTAMP", "TUPLE",
                    "LOSING_WRITE", "KEY"]
CONFLICT_SCHEMA = [
    {"name": "ROW_TYPE", "type": "string"}, {"name": "ACTION_TYPE", "type": "string"},
    {"name": "CONFLICT_TYPE", "type": "string"}, {"name": "CONFLICTS_ON_PRIMARY_KEY", "type": "int64"},
    {"name": "DECISION", "type": "string"}, {"name": "CLUSTER_ID", "type": "int64"},
    {"name": "TIMESTAMP", "type": "uint64"}, {"name": "DIVERGENCE", "type": "string"},
    {"name": "TABLE_NAME", "type": "string"}, {"name": "CURRENT_CLUSTER_ID", "type": "int64"},
    {"name": "CURRENT_TIMESTAMP", "type": "uint64"}, {"name": "TUPLE", "type": "string"},
    {"name": "LOSING_WRITE", "type": "string"}, {"name": "KEY", "type": "string"},
]
#: seed 001: the TUPLE column is limited to 1 MB; a longer row is truncated (bounds what a peer's
#: change can make this cluster store, whatever its rows weigh)
MAX_TUPLE_BYTES = 1_000_000
DEFAULT_CONFLICT_RETENTION_MS = 7 * 24 * 3600 * 1000
#: changes one batch carries to a peer
BATCH_CHANGES = 2000
_IDLE_WAIT = 0.2
#: at most this often (seconds) a peer's record of this cluster's log position is moved past changes
#: this cluster only received (an empty batch)
_ADVANCE_INTERVAL = 0.5


#: the settings of ``//sys`` that ``_check_setting`` checks
XDCR_SETTINGS = ("xdcr_connections", "xdcr_conflict_retention", "xdcr_preferred_source")
#: the longest conflict-log retention (100 years, in ms)
MAX_RETENTION_MS = 100 * 365 * 24 * 3600 * 1000


def describe_schema_difference(theirs: Any, mine: list[dict[str, Any]], other: str, own: str) -> str:
    """How two schema signatures differ, in words, column by column (no Python reprs)."""
    def columns(signature: Any) -> dict[str, dict[str, Any]]:
        if not isinstance(signature, list):
            return {}
        return {str(c.get("name")): c for c in signature if isinstance(c, dict)}

    def describe(column: dict[str, Any]) -> str:
        parts = [str(column.get("type"))]
        if column.get("sort_order"):
            parts.append(f"key ({column['sort_order']})")
        if column.get("required"):
            parts.append("required")
        return ", ".join(parts)

    if not isinstance(theirs, list):
        return f"cluster {other} sent no schema"
    a, b = columns(theirs), columns(mine)
    out = []
    for name in list(dict.fromkeys([*a, *b])):
        if name not in b:
            out.append(f"column {name} ({describe(a[name])}) exists only on {other}")
        elif name not in a:
            out.append(f"column {name} ({describe(b[name])}) exists only on {own}")
        elif a[name] != b[name]:
            out.append(f"column {name} is {describe(a[name])} on {other} but {describe(b[name])} on {own}")
    if not out and list(a) != list(b):
        out.append(f"the columns are in another order ({', '.join(a)} on {other}; {', '.join(b)} on {own})")
    return "; ".join(out[:10]) or "the schemas are written differently"


def _shown(value: Any) -> str:
    """A value in an error message: YSON-like, short, control characters escaped."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= 80 else text[:80] + "..."


def _bounded_json(value: Any) -> str:
    """``value`` as JSON (keys sorted), cut to ``MAX_TUPLE_BYTES`` of UTF-8 (seed 001's TUPLE)."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= MAX_TUPLE_BYTES // 4:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_TUPLE_BYTES:
        return text
    return data[:MAX_TUPLE_BYTES].decode("utf-8", "ignore")


def schema_signature(schema: TableSchema) -> list[dict[str, Any]]:
    return [{"name": c.name, "type": c.type.value, "sort_order": "ascending" if c.is_key else None,
             "required": bool(getattr(c, "required", False))} for c in schema.columns]


class PeerState:
    """What ``dr_status`` says of one peer (changed by its shipper thread; read as it stands)."""

    def __init__(self) -> None:
        self.state = "connecting"
        self.last_error: str | None = None
        self.conflicts = 0
        self.delivered = 0


class XdcrCommands(RowCommands):
    """XDCR tables, their shipping to peers, the receiving side, and the dr_* operations."""

    # set by Cluster.__init__ / _load
    xdcr_paused: bool
    _xdcr_shippers: dict[str, threading.Thread]
    _xdcr_peer_state: dict[str, PeerState]
    #: (peer, table id) -> monotonic time of the last batch sent (shipper threads, one key each)
    _xdcr_advanced: dict[tuple[str, str], float]
    #: (peer, table id) -> the progress last saved, as committed: changed only under the storage
    #: writer (by ``_save_progress`` once its transaction commits, and by ``_forget``), read without it
    _xdcr_progress: dict[tuple[str, str], Position]
    _xdcr_stop: threading.Event
    #: (peer, its URL) -> the XDCR cluster id its engine answered (a cache; request threads write it)
    _xdcr_identities: dict[tuple[str, str], int]

    # -- configuration -------------------------------------------------------------------------------

    def _sys_attr(self, name: str, default: Any = None) -> Any:
        node = self.cypress.root.children.get("sys")
        return default if node is None else node.attributes.get(name, default)

    def xdcr_connections(self) -> list[str]:
        value = self._sys_attr("xdcr_connections", [])
        return [str(v) for v in value] if isinstance(value, list) else []

    def _xdcr_tables(self) -> list[tuple[DynamicTable, str]]:
        return [(n.table, n.path) for n in list(self.cypress.by_id.values())
                if n.table is not None and n.table.xdcr_cluster_id is not None]

    def _own_id(self) -> int:
        if self.cluster_id is None:
            raise YtError(f"Cluster {self.name} has no XDCR cluster id: start its engine with --cluster-id N (0-127)",
                          code=ErrorCode.INVALID_PARAMETER)
        return self.cluster_id

    def _check_setting(self, ypath: YPath, value: Any) -> None:
        """The XDCR settings of ``//sys`` (docs/xdcr.md), checked when set, so that what cannot work is
        refused then and not found later by ``dr_status``: ``xdcr_connections`` (a list of distinct
        //sys/clusters names other than this cluster, each with an XDCR cluster id of its own),
        ``xdcr_conflict_retention`` (milliseconds) and ``xdcr_preferred_source`` (a name or an id)."""
        super()._check_setting(ypath, value)
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
                              f"{_shown(value)}", code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": name})
        elif name == "xdcr_preferred_source":
            if isinstance(value, int) and not isinstance(value, bool):
                if not 0 <= value <= xdcr.MAX_CLUSTER_ID:
                    raise YtError(f"Invalid {where}: a cluster id is 0-127, not {value}",
                                  code=ErrorCode.INVALID_PARAMETER, attributes={"attribute": name})
            elif not isinstance(value, str) or not self.peers.known(value) or value == self.name:
                raise YtError(f"Invalid {where}: expected the //sys/clusters name of another cluster, or its XDCR "
                              f"cluster id (0-127), not {_shown(value)}", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"attribute": name})
        else:
            self._check_connections(where, value)

    def _check_connections(self, where: str, value: Any) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise YtError(f"Invalid {where}: expected a list of //sys/clusters names, not {_shown(value)}",
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
                problems.append(f"{', '.join(map(_shown, repeated))} listed twice")
            if self.name in value:
                problems.append(f"its own name {_shown(self.name)}")
            unknown = [v for v in value if v != self.name and not self.peers.known(v)]
            if unknown:
                problems.append(f"{', '.join(map(_shown, unknown[:5]))} not in //sys/clusters")
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

    def _conflict_retention_ms(self) -> int:
        value = self._sys_attr("xdcr_conflict_retention", DEFAULT_CONFLICT_RETENTION_MS)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            # (set checks it; a value stored by an engine that did not must not stop the trimming)
            return DEFAULT_CONFLICT_RETENTION_MS
        return value

    # -- who a peer is -------------------------------------------------------------------------------

    def peer_cluster_id(self, peer: str, timeout: float = 10.0) -> int | None:
        """``peer``'s XDCR cluster id as its own engine says (``xdcr_identity``, called at the URL of
        this cluster's directory: a request body's claim is checked against the cluster itself), None
        when it has none. Remembered per (name, URL): a cluster's id never changes (it is stored in
        its data directory, and a restart with another is refused). Network: call with no lock held."""
        url = self.peers.connection(peer).proxy_url
        known = self._xdcr_identities.get((peer, url))
        if known is not None:
            return known
        answer = self.peers.client(peer).call("xdcr_identity", {}, timeout=timeout)
        cluster_id = answer.get("cluster_id") if isinstance(answer, dict) else None
        if cluster_id is None:
            return None
        if isinstance(cluster_id, bool) or not isinstance(cluster_id, int) or not 0 <= cluster_id <= 127:
            raise YtError(f"Cluster {peer} answered xdcr_identity with cluster id {str(cluster_id)[:40]!r}, not an "
                          "XDCR cluster id (0-127)", code=ErrorCode.PROTOCOL_ERROR, attributes={"cluster_name": peer})
        self._xdcr_identities[(peer, url)] = cluster_id
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

    # -- shipping ------------------------------------------------------------------------------------

    def start_xdcr(self) -> None:
        if self.cluster_id is not None:
            # the conflict log is queryable from the start (empty until a conflict)
            with self.storage.write() as conn:
                conflicts = self._conflicts_table(conn)
            if "KEY" not in conflicts.schema.by_name:
                # a log made before it had the KEY column: widened in place, its rows kept
                self._alter_schema(CONFLICTS_PATH, CONFLICT_SCHEMA)

        def supervise() -> None:
            while not self._xdcr_stop.wait(0.5):
                try:
                    wanted = set(self.xdcr_connections()) if self.cluster_id is not None else set()
                    for peer in wanted - set(self._xdcr_shippers):
                        thread = threading.Thread(target=self._ship_loop, args=(peer,), name=f"xdcr-{peer}",
                                                  daemon=True)
                        self._xdcr_peer_state.setdefault(peer, PeerState())
                        self._xdcr_shippers[peer] = thread
                        thread.start()
                    for peer, thread in list(self._xdcr_shippers.items()):
                        if not thread.is_alive():
                            del self._xdcr_shippers[peer]
                    self._xdcr_maintenance()
                except Exception:  # noqa: BLE001 - the supervisor must outlive any one failure
                    log.exception("xdcr supervisor failed")

        threading.Thread(target=supervise, name="xdcr-supervisor", daemon=True).start()

    def _xdcr_maintenance(self) -> None:
        """The supervisor's periodic work (the conflict log's retention; more in subclasses)."""
        self._trim_conflicts()

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

    def _ship_loop(self, peer: str) -> None:
        state = self._xdcr_peer_state.setdefault(peer, PeerState())
        state.state, state.last_error = "connecting", None  # (a connection set again starts afresh)
        while not self._xdcr_stop.is_set() and peer in self.xdcr_connections():
            version = self.change_feed.version
            busy = failed = False
            for table, path in self._xdcr_tables():
                try:
                    busy |= self._ship_table(peer, table, path, state)
                except YtError as exc:
                    failed = True
                    state.state, state.last_error = self._waiting_state(exc), exc.message
                    log.warning("xdcr shipping waits", extra={"peer": peer, "path": path, "error": exc.message})
                    self._xdcr_stop.wait(1.0)
                except Exception as exc:  # noqa: BLE001 - recorded, retried
                    failed = True
                    state.state, state.last_error = "error", f"{type(exc).__name__}: {exc}"
                    log.exception("xdcr shipping failed", extra={"peer": peer, "path": path})
                    self._xdcr_stop.wait(1.0)
            if not failed:
                # every table shipped (or had nothing to ship) in this pass
                state.state, state.last_error = "connected", None
            if not busy and not self.change_feed.wait_after(version, time.monotonic() + _IDLE_WAIT):
                self._xdcr_stop.wait(_IDLE_WAIT)  # no slot to wait for a commit in: poll
        state.state = "reset" if peer not in self.xdcr_connections() else "stopped"

    @staticmethod
    def _waiting_state(exc: YtError) -> str:
        if exc.code == ErrorCode.XDCR_SCHEMA_MISMATCH:
            return "waiting_for_schema"
        if exc.code == ErrorCode.XDCR_NOT_CONNECTED:
            return "waiting_for_peer"
        if exc.code == ErrorCode.XDCR_NEEDS_SNAPSHOT:
            return "waiting_for_snapshot"
        return "error"

    def _progress(self, peer: str, table_id: str) -> Position:
        saved = self._xdcr_progress.get((peer, table_id))
        if saved is not None:
            return saved
        c = xdcr_progress_table.c
        with self.storage.read() as conn:
            row = conn.execute(sa.select(c.timestamp, c.seq).where(c.peer == peer, c.table_id == table_id)).first()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def _save_progress(self, peer: str, table_id: str, position: Position, durable: bool = True) -> None:
        """Record how far ``peer`` has this cluster's changes of a table. After a batch the peer
        acknowledged, ``durable=False``: no fsync of its own (the next durable commit carries it).
        A crash may lose it, and then the sender ships those changes again from the older position,
        which the peer answers with its record (its sink is durable and skips what it has); the log
        trim only ever sees a position the peer holds."""
        c = xdcr_progress_table.c
        with self.storage.write(durable=durable) as conn:
            if peer not in self.xdcr_connections():
                return  # reset meanwhile (``_forget``, under this same writer): nothing to record
            updated = conn.execute(xdcr_progress_table.update().where(c.peer == peer, c.table_id == table_id)
                                   .values(timestamp=position[0], seq=position[1])).rowcount
            if not updated:
                conn.execute(xdcr_progress_table.insert().values(peer=peer, table_id=table_id, timestamp=position[0],
                                                                 seq=position[1]))
            on_commit(conn, lambda: self._xdcr_progress.__setitem__((peer, table_id), position))

    def _ship_table(self, peer: str, table: DynamicTable, path: str, state: PeerState) -> bool:
        """Send the next batch of this cluster's own changes of ``table`` to ``peer``; True if more wait."""
        own = self._own_id()
        position = self._progress(peer, table.table_id)
        if position < table.changes_trimmed:
            position = self._probe(peer, table, path, position)
        bound = self.stream_bound(table)
        with self.storage.read() as conn:
            found = changes.read(table, conn, position, bound, BATCH_CHANGES)
        if not found:
            return False
        end = found[-1].position
        actions = [self._action(c) for c in found if (c.payload.get("o") or [0, own])[1] == own]
        key = (peer, table.table_id)
        if not actions and len(found) < BATCH_CHANGES and \
                time.monotonic() - self._xdcr_advanced.get(key, 0.0) < _ADVANCE_INTERVAL:
            # only changes received from peers, at the tail of the log: the peer's record of this
            # cluster's position moves on with the next own change, or in a moment (the progress
            # saved here never runs ahead of what the peer recorded: the log is trimmed up to that
            # progress, and a cluster joining from a snapshot starts from the peer's record)
            return False
        self._xdcr_advanced[key] = time.monotonic()
        stored = self._send(peer, table, path, position, end, actions)
        if stored < position:
            # the peer joined from a snapshot after this cluster had shipped to its table (which
            # the join cleared): ship again from the snapshot's position (a probe first if the
            # log no longer holds it)
            log.info("xdcr peer rewound", extra={"peer": peer, "path": path, "position": list(stored)})
            self._save_progress(peer, table.table_id, stored)
            return True
        if stored < end:
            raise YtError(f"XDCR peer {peer} answered position {stored} for a batch ending at {end}",
                          code=ErrorCode.PROTOCOL_ERROR)
        state.delivered += len(actions)
        self._save_progress(peer, table.table_id, end, durable=False)
        return len(found) >= BATCH_CHANGES

    def _send(self, peer: str, table: DynamicTable, path: str, start: Position, end: Position,
              actions: list[dict[str, Any]]) -> Position:
        """One ``xdcr_apply`` of the changes after ``start`` up to ``end``: the position the peer holds."""
        body = {"path": path, "origin_cluster": self.name, "origin_cluster_id": self._own_id(),
                "schema": schema_signature(table.schema), "start": list(start), "end": list(end), "actions": actions}
        answer = self.peers.client(peer).call("xdcr_apply", body, timeout=self.config.push_timeout)
        return int(answer["position"][0]), int(answer["position"][1])

    def _probe(self, peer: str, table: DynamicTable, path: str, position: Position) -> Position:
        """The log was trimmed after ``position``: ask the peer what it holds. Enough (it joined from
        a snapshot, or had it all), shipping goes on from there; else it needs a snapshot."""
        stored = self._send(peer, table, path, position, position, [])
        if stored < table.changes_trimmed:
            raise YtError(f"Cluster {peer} misses changes of {path} that cluster {self.name} no longer keeps "
                          f"(its change log is trimmed up to {list(table.changes_trimmed)}, the peer holds "
                          f"{list(stored)}): join {peer} to the group from a snapshot "
                          f"(`reptables dr join --path {path}` against {peer})",
                          code=ErrorCode.XDCR_NEEDS_SNAPSHOT, attributes={"path": path, "cluster_name": peer})
        self._save_progress(peer, table.table_id, stored)
        return stored

    @staticmethod
    def _action(change: changes.Change) -> dict[str, Any]:
        p = change.payload
        return {"p": list(change.position), "k": change.kind, "key": p.get("key"), "row": p.get("row"),
                "o": p.get("o"), "e": p.get("e"), "b": p.get("b")}

    # -- receiving ------------------------------------------------------------------------------------

    def handle_xdcr_apply(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """A peer's batch of its own changes of one table (``caller``: the cluster its peer credential
        names; None in process). Who may send what is checked first, then every field (range and
        size), then the rows against the table's schema; nothing is applied unless all of it holds."""
        own = self._own_id()
        batch = xdcr.parse_apply(body, xdcr.Bounds.ahead_of_now(self.config.max_peer_clock_skew),
                                 self.config.max_peer_batch_rows)
        origin, origin_id = batch.origin, batch.origin_id
        if caller is not None and caller != origin:
            raise YtError(f"Cluster {caller} may not send XDCR changes in the name of {origin}",
                          code=ErrorCode.AUTHORIZATION_ERROR, http_status=403, attributes={"cluster_name": caller})
        if origin_id == own:
            raise YtError(f"Cluster {origin} has XDCR cluster id {origin_id}, the id of cluster {self.name} too: "
                          "every cluster of a group needs its own id", code=ErrorCode.XDCR_NOT_CONNECTED,
                          attributes={"cluster_name": origin, "cluster_id": origin_id})
        if origin not in self.xdcr_connections():
            raise YtError(f"Cluster {self.name} is not connected to {origin} for XDCR: add it to "
                          f"//sys/@xdcr_connections of {self.name}", code=ErrorCode.XDCR_NOT_CONNECTED,
                          attributes={"cluster_name": origin})
        if caller is not None:
            # the id in the body is a claim: the origin's own engine says which id it has
            self.check_peer_identity(origin, origin_id)
        table, path, node = self._table(batch.path)
        if table.xdcr_cluster_id is None:
            raise YtError(f"Table {path} of cluster {self.name} is not an XDCR table (create it with xdcr=%true, "
                          "while empty)", code=ErrorCode.XDCR_NOT_CONNECTED, attributes={"path": path})
        joining = node.attributes.get(JOIN_ATTRIBUTE)
        if isinstance(joining, dict):
            raise YtError(f"Table {path} of cluster {self.name} is joining the group from a snapshot of cluster "
                          f"{joining.get('source')}: changes wait until the join is finished",
                          code=ErrorCode.XDCR_NEEDS_SNAPSHOT, attributes={"path": path})
        self.check_same_schema(table, path, batch.schema, origin, "replication")
        end_position, start_position = batch.end, batch.start
        groups: list[tuple[int, list[RowWrite]]] = []
        group_keys: set[tuple[Any, ...]] = set()
        meta: dict[int, xdcr.Action] = {}
        newest = 0
        writes: list[RowWrite] = []
        for action in batch.actions:
            if action.kind == "delete":
                write = RowWrite(WriteKind.DELETE, dict(zip(table.schema.key_names, action.key or [], strict=False)), 1)
            else:
                write = RowWrite(WriteKind.WRITE, dict(action.row or {}), table.schema.full_lock_mask)
            write.origin = action.origin
            meta[id(write)] = action
            newest = max(newest, action.origin[0])
            writes.append(write)
        # everything a peer sends is input: its rows are checked against this table's schema as a
        # client's would be (types, keys, row weight), before anything is applied (the rows the
        # changes were made on are checked where they are used: in the conflict log, _resolve_actions)
        self.replication.check_peer_writes(table, path, writes, f"XDCR changes of cluster {origin}")
        for write in writes:
            # one local commit for a run of changes to distinct keys (each keeps its own version):
            # a key changed twice starts the next commit, so the later change sees the earlier
            key = table.key_of(write.row)
            if not groups or key in group_keys:
                groups.append((meta[id(write)].origin[0], []))
                group_keys = set()
            groups[-1][1].append(write)
            group_keys.add(key)
        if newest:
            # later changes made here are newer than every change seen (versions follow causality);
            # ``newest`` is at most max_peer_clock_skew ahead of this host's clock (parse_apply)
            self.xdcr_clock.observe(newest)
        stored_box: dict[str, Position] = {}

        def check(conn: sa.Connection) -> tuple[Any, Any] | None:
            if isinstance(node.attributes.get(JOIN_ATTRIBUTE), dict):
                # (checked again under the writer: a join that began meanwhile clears the table)
                raise YtError(f"Table {path} of cluster {self.name} is joining the group from a snapshot: changes "
                              "wait until the join is finished", code=ErrorCode.XDCR_NEEDS_SNAPSHOT,
                              attributes={"path": path})
            c = xdcr_sink_table.c
            row = conn.execute(sa.select(c.timestamp, c.seq).where(
                c.table_id == table.table_id, c.origin_cluster_id == origin_id)).first()
            stored = (0, 0) if row is None else (int(row[0]), int(row[1]))
            stored_box["stored"] = stored
            pending = node.attributes.get(REWIND_ATTRIBUTE) or []
            if origin_id in pending:
                # the first batch from this origin since this cluster joined from a snapshot: one
                # that starts past the snapshot's position (the sender shipped to the table before
                # the join cleared it) is answered with the position, and the sender rewinds to it
                if start_position is not None and stored < start_position:
                    return (stored, 0)
                remaining = [o for o in pending if o != origin_id]
                if remaining:
                    node.attributes[REWIND_ATTRIBUTE] = remaining
                else:
                    node.attributes.pop(REWIND_ATTRIBUTE, None)
                self.cypress.save(conn, node)
                on_rollback(conn, lambda: node.attributes.__setitem__(REWIND_ATTRIBUTE, pending))
            # a batch at or below what is recorded is a retry: answered with the record
            return (stored, 0) if stored >= end_position else None

        def prepare(conn: sa.Connection, _source_ts: int, commit_ts: int, writes: list[RowWrite]) -> list[RowWrite]:
            stored = stored_box.get("stored", (0, 0))
            todo = [w for w in writes if meta[id(w)].position > stored]
            return self._resolve_actions(conn, table, path, todo, meta, commit_ts, origin)

        def record(conn: sa.Connection, _newest: int) -> None:
            c = xdcr_sink_table.c
            updated = conn.execute(xdcr_sink_table.update().where(
                c.table_id == table.table_id, c.origin_cluster_id == origin_id).values(
                timestamp=end_position[0], seq=end_position[1])).rowcount
            if not updated:
                conn.execute(xdcr_sink_table.insert().values(table_id=table.table_id, origin_cluster_id=origin_id,
                                                             timestamp=end_position[0], seq=end_position[1]))

        answer = self.transactions.apply_replicated(table, groups, False, 0, check=check, expected=None,
                                                    record=record, end=end_position, prepare=prepare)
        if not answer.get("applied", True):
            stored = stored_box.get("stored", end_position)
            return {"applied": False, "position": list(stored)}
        return {"applied": True, "position": list(end_position)}

    def _resolve_actions(self, conn: sa.Connection, table: DynamicTable, path: str, writes: list[RowWrite],
                         meta: dict[int, xdcr.Action], commit_ts: int, origin: str) -> list[RowWrite]:
        """The seed's rules for each action, against the rows as they are now (under the writer);
        conflicts go to the conflict log in this same transaction."""
        own = self._own_id()
        keys = [table.key_of(w.row) for w in writes]
        current = xdcr.read_versions(conn, table.table_id, keys)
        accepted: list[RowWrite] = []
        conflicted: list[tuple[RowWrite, tuple[Any, ...], xdcr.Resolution, xdcr.RowVersion | None]] = []
        for write, key in zip(writes, keys, strict=True):
            action = meta[id(write)]
            expected = action.expected
            assert write.origin is not None
            here = current.get(key)
            resolution = xdcr.resolve(action.kind, write.origin, expected, here)
            write.origin_parent = None if expected is None else expected.version
            write.here_known, write.here = True, here
            if resolution.accept:
                accepted.append(write)
            if resolution.is_conflict:
                conflicted.append((write, key, resolution, expected))
        log_rows: list[dict[str, Any]] = []
        befores = [RowWrite(WriteKind.WRITE, dict(meta[id(w)].before or {}), table.schema.full_lock_mask)
                   for w, _, _, expected in conflicted if expected is not None and meta[id(w)].before is not None]
        if befores:
            # the rows the conflicting changes were made on go to the conflict log (EXP): checked like
            # rows first (a bad one refuses the whole batch: nothing of it is applied)
            self.replication.check_peer_writes(table, path, befores, "the earlier rows in XDCR changes of "
                                                                     f"cluster {origin}")
        if conflicted:
            # the rows as they are here, for the log (read only when there is a conflict)
            rows = dict(zip([k for _, k, _, _ in conflicted],
                            table.lookup(conn, [k for _, k, _, _ in conflicted], None), strict=True))
            # when the conflict was resolved, on the version clock: the unit of the versions logged
            resolved_at = self.xdcr_clock.read()
            for write, key, resolution, expected in conflicted:
                log_rows += self._conflict_rows(table, path, meta[id(write)], write, key, resolution, expected,
                                                current.get(key), rows.get(key), own, resolved_at)
        if log_rows:
            self._log_conflicts(conn, log_rows, commit_ts, origin)
        return accepted

    def _conflict_rows(self, table: DynamicTable, path: str, action: xdcr.Action, write: RowWrite,
                       key: tuple[Any, ...], resolution: xdcr.Resolution, expected: xdcr.RowVersion | None,
                       current: xdcr.RowVersion | None, current_row: dict[str, Any] | None, own: int,
                       resolved_at: int) -> list[dict[str, Any]]:
        """The seed's rows of one conflict, in its order: EXT and EXP on a timestamp mismatch (or a
        missing row), EXT on a constraint violation, NEW for an insert or update, DEL for a delete."""
        kind = action.kind
        decision = "A" if resolution.accept else "R"
        # the write that lost: the incoming one (replicated) if rejected, else the row's last change
        if not resolution.accept:
            losing = "replicated"
        else:
            losing = "local" if current is not None and current.version[1] == own else "replicated"
        assert write.origin is not None

        key_text = _bounded_json(dict(zip(table.schema.key_names, key, strict=False)))

        def row(row_type: str, conflict: str, cluster: int, ts: int, tuple_: Any) -> dict[str, Any]:
            return {"ROW_TYPE": row_type, "ACTION_TYPE": xdcr.ACTION_TYPES[kind], "CONFLICT_TYPE": conflict,
                    "CONFLICTS_ON_PRIMARY_KEY": int(resolution.on_primary_key), "DECISION": decision,
                    "CLUSTER_ID": cluster, "TIMESTAMP": ts, "DIVERGENCE": "C", "TABLE_NAME": path,
                    "CURRENT_CLUSTER_ID": own, "CURRENT_TIMESTAMP": resolved_at,
                    "TUPLE": _bounded_json(tuple_), "LOSING_WRITE": losing, "KEY": key_text}

        out = []
        cur_version = current.version if current is not None else (0, 0)
        existing = current_row if current_row is not None else dict(zip(table.schema.key_names, key, strict=False))
        if resolution.conflict in ("MSMT", "MISS"):
            out.append(row("EXT", resolution.conflict, cur_version[1], cur_version[0],
                           None if current_row is None else current_row))
            if expected is not None:
                out.append(row("EXP", resolution.conflict, expected.version[1], expected.version[0], action.before))
        if resolution.conflict == "CNST":
            out.append(row("EXT", "CNST", cur_version[1], cur_version[0], existing))
        if kind == "delete":
            out.append(row("DEL", "NONE", write.origin[1], write.origin[0],
                           dict(zip(table.schema.key_names, action.key or [], strict=False))))
        else:
            out.append(row("NEW", "NONE", write.origin[1], write.origin[0], action.row))
        return out

    # -- the conflict log ------------------------------------------------------------------------------

    def _conflicts_table(self, conn: sa.Connection) -> DynamicTable:
        node = self.cypress.root.children.get("sys")
        child = node.children.get("xdcr_conflicts") if node is not None else None
        if child is None or child.table is None:
            child = self._create_system_table(conn, "xdcr_conflicts", CONFLICT_SCHEMA)
        assert child.table is not None
        return child.table

    def _log_conflicts(self, conn: sa.Connection, rows: list[dict[str, Any]], commit_ts: int, origin: str) -> None:
        table = self._conflicts_table(conn)
        table.apply(conn, [RowWrite(WriteKind.WRITE, r, 1) for r in rows], commit_ts, 0)
        state = self._xdcr_peer_state.setdefault(origin, PeerState())
        conflicts = sum(1 for r in rows if r["ROW_TYPE"] in ("NEW", "DEL"))

        def publish() -> None:
            state.conflicts += conflicts
            self._write_csv(rows)

        on_commit(conn, publish)

    def _conflict_dir(self) -> Path | None:
        return None if self.data_dir is None else self.data_dir.path / "xdcr_conflicts"

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        directory = self._conflict_dir()
        if directory is None:
            return
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"LOG_{datetime.now(UTC):%Y%m%d}.csv"
        columns = CONFLICT_COLUMNS
        new = not path.exists()
        if not new:
            # a file begun by an older engine keeps its own columns (rows written under its header)
            with path.open(encoding="utf-8", newline="") as f:
                columns = next(csv.reader(f), []) or CONFLICT_COLUMNS
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
        # 0600 whatever the umask: the file holds whole rows
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8", newline="") as f:
            f.write(buffer.getvalue())

    def _trim_conflicts(self) -> None:
        """Keep the conflict log within ``//sys/@xdcr_conflict_retention`` (ms): older rows of
        ``//sys/xdcr_conflicts`` are trimmed and older CSV files removed."""
        retention = self._conflict_retention_ms()
        horizon = self.timestamps.last - ((retention << COUNTER_BITS) // 1000)
        node = self.cypress.root.children.get("sys")
        child = node.children.get("xdcr_conflicts") if node is not None else None
        if child is not None and child.table is not None:
            table = child.table
            data = table.sql.data
            with self.storage.read() as conn:
                last = conn.execute(sa.select(sa.func.max(data.c["_rt_row_index"])).where(
                    data.c["_rt_tablet_index"] == 0, data.c["_rt_ts"] <= horizon)).scalar()
            if last is not None:
                with self.storage.write() as conn:
                    table.trim_rows(conn, 0, int(last) + 1, CONFLICTS_PATH)
        directory = self._conflict_dir()
        if directory is not None and directory.exists():
            cutoff = time.time() - retention / 1000.0
            for file in directory.glob("LOG_*.csv"):
                if file.stat().st_mtime < cutoff:
                    file.unlink(missing_ok=True)

    # -- holds on the change log ----------------------------------------------------------------------

    def _log_hold(self, table: DynamicTable) -> Position | None:
        """An XDCR table's changes stay until every connected peer has them."""
        if table.xdcr_cluster_id is None:
            return None
        peers = self.xdcr_connections()
        if not peers:
            return None
        return min(self._progress(peer, table.table_id) for peer in peers)

    # -- operations ----------------------------------------------------------------------------------

    @staticmethod
    def _owed(conn: sa.Connection, table: DynamicTable, position: Position) -> sa.ColumnElement[bool]:
        """The logged changes of XDCR table ``table`` after ``position`` that were made on this
        cluster (what a peer at ``position`` still misses; the changes this cluster only received
        are never shipped, so never owed, though the peer's record passes them only every half second)."""
        c = changes_table.c
        own = table.xdcr_cluster_id
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            origin: sa.ColumnElement[Any] = sa.func.jsonb_extract_path_text(sa.cast(c.payload, JSONB), "o", "1")
            mine: sa.ColumnElement[bool] = origin == str(own)
        else:
            mine = sa.func.json_extract(c.payload, "$.o[1]") == own
        after = sa.or_(c.timestamp > position[0], sa.and_(c.timestamp == position[0], c.seq > position[1]))
        # (the redundant ``timestamp >= position`` is the index's lower bound, as in ``changes.read``)
        return sa.and_(c.table_id == table.table_id, c.timestamp >= position[0], after, mine)

    def _undelivered(self) -> list[str]:
        """(peer: table) pairs whose peer misses some of this cluster's own changes."""
        missing = []
        for table, path in self._xdcr_tables():
            for peer in self.xdcr_connections():
                position = self._progress(peer, table.table_id)
                with self.storage.read() as conn:
                    owed = conn.execute(sa.select(changes_table.c.seq).where(
                        self._owed(conn, table, position)).limit(1)).first()
                if owed is not None:
                    missing.append(f"{peer}: {path}")
        return missing

    def dr_pause(self, wait: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Refuse client writes; with ``wait``, return once every change was delivered to every peer."""
        self._set_paused(True)
        if wait:
            deadline = time.monotonic() + timeout
            while True:
                missing = self._undelivered()
                if not missing:
                    break
                if time.monotonic() > deadline:
                    raise YtError(f"Cluster {self.name} is paused but not drained after {timeout:g} s: "
                                  f"{', '.join(missing[:5])} still miss changes (is the peer reachable? "
                                  "see dr_status)", code=ErrorCode.TIMEOUT, attributes={"undelivered": missing[:100]})
                time.sleep(0.05)
        return self.dr_status()

    def dr_resume(self) -> dict[str, Any]:
        self._set_paused(False)
        return self.dr_status()

    def _set_paused(self, paused: bool) -> None:
        self.xdcr_paused = paused
        log.info("xdcr paused" if paused else "xdcr resumed", extra={"cluster": self.name})

    def dr_reset(self, cluster: str | None = None, force: bool = False) -> dict[str, Any]:
        """Stop replicating to ``cluster`` (``force`` required: its undelivered changes are dropped
        and the group may diverge, seed 001), or to every peer (``cluster`` None)."""
        peers = self.xdcr_connections()
        if cluster is not None:
            if cluster not in peers:
                raise YtError(f"Cluster {self.name} has no XDCR connection to {cluster} (connections: {peers})",
                              code=ErrorCode.RESOLVE_ERROR, attributes={"cluster_name": cluster})
            if not force:
                raise YtError(f"Resetting XDCR with the single cluster {cluster} drops the changes it has not "
                              "received and the group may diverge: give --force to confirm (or reset all)",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"cluster_name": cluster})
            self._forget(cluster)
        else:
            for peer in peers:
                self._forget(peer)
        return self.dr_status()

    def _forget(self, peer: str, peer_id: int | None = None) -> None:
        """Drop a peer: off the connections, its progress and (when its id is known) its sink records."""
        with self.storage.write() as conn:
            sys_node = self.cypress.root.children["sys"]
            remaining = [p for p in self.xdcr_connections() if p != peer]
            sys_node.attributes["xdcr_connections"] = remaining
            self.cypress.save(conn, sys_node)
            conn.execute(xdcr_progress_table.delete().where(xdcr_progress_table.c.peer == peer))
            for key in [k for k in self._xdcr_progress if k[0] == peer]:
                del self._xdcr_progress[key]
            if peer_id is not None:
                conn.execute(xdcr_sink_table.delete().where(xdcr_sink_table.c.origin_cluster_id == peer_id))
        self._xdcr_peer_state.pop(peer, None)
        log.info("xdcr connection reset", extra={"cluster": self.name, "peer": peer})

    def dr_drop(self, timeout: float = 60.0) -> dict[str, Any]:
        """Leave the group: drain every change to every peer, tell each to forget this cluster, reset."""
        own = self._own_id()
        self.dr_pause(wait=True, timeout=timeout)
        try:
            for peer in self.xdcr_connections():
                self.peers.client(peer).call("xdcr_forget", {"cluster": self.name, "cluster_id": own},
                                             timeout=self.config.push_timeout)
                self._forget(peer)
        finally:
            self._set_paused(False)
        return self.dr_status()

    def handle_xdcr_forget(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
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
        if name in self.xdcr_connections():
            if caller is not None:
                self.check_peer_identity(name, cluster_id)
            self._forget(name, cluster_id)
        return {}

    def dr_status(self) -> dict[str, Any]:
        peers: dict[str, Any] = {}
        now = time.time()
        for peer in self.xdcr_connections():
            state = self._xdcr_peer_state.get(peer) or PeerState()
            queued_rows = queued_bytes = 0
            oldest: int | None = None
            for table, _ in self._xdcr_tables():
                position = self._progress(peer, table.table_id)
                c = changes_table.c
                with self.storage.read() as conn:
                    # this cluster's own changes the peer misses (received ones are never shipped)
                    count, size, first = conn.execute(sa.select(
                        sa.func.count(), sa.func.coalesce(sa.func.sum(sa.func.length(c.payload)), 0),
                        sa.func.min(c.timestamp)).where(self._owed(conn, table, position))).one()
                queued_rows += int(count)
                queued_bytes += int(size)
                if first is not None:
                    oldest = int(first) if oldest is None else min(oldest, int(first))
            lag = 0.0 if oldest is None else max(0.0, now - (oldest >> COUNTER_BITS))
            peers[peer] = {"state": "paused" if self.xdcr_paused and state.state == "connected" else state.state,
                           "lag_seconds": round(lag, 3), "queued_rows": queued_rows, "queued_bytes": queued_bytes,
                           "conflicts": state.conflicts, "delivered_changes": state.delivered,
                           "last_error": state.last_error}
        return {"cluster": self.name, "cluster_id": self.cluster_id, "paused": self.xdcr_paused,
                "connections": self.xdcr_connections(), "tables": [path for _, path in self._xdcr_tables()],
                "peers": peers}


__all__ = ["CONFLICTS_PATH", "JOIN_ATTRIBUTE", "PeerState", "XdcrCommands", "schema_signature"]
