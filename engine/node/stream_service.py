"""Change streams (seed 004): pull a table's changes from an event token, consumers, retention,
and how fresh a read is.

The stream of a table is read in answers (``pull_changes``), each starting after a position the
client holds - an event token (``tablets/changes.py``) or a timestamp - and waiting up to
``wait_timeout`` for a change when there is none; a client that keeps pulling from the last token
it got sees every change once, in order, and its position moves on while the table is idle
(heartbeats carry a token too). Pulls keep no state on the server: a restarted engine, or another
one serving a replica, continues from the same token. An answer is bounded (``max_row_count``,
``max_pull_rows``), so a slow consumer costs the server nothing while it does not pull.

Retention is explicit: a sorted or ordered table keeps its log for ``@change_retention`` (default
1 h), a replicated table its queue as replication needs it (``min_replication_log_ttl``) and for
``@change_retention`` when set; either is kept while a *vital* consumer has not advanced past it.
A start before what is kept is refused (1760) with the oldest position still available, never
answered with a silently incomplete history.

Consumers are YT's queue consumers: a name registered on a table with a stored offset (an event
token) that ``advance_consumer`` moves by compare-and-swap, under the storage writer.

Freshness: ``stream_bound`` is the newest timestamp up to which every change of a table is
applied here - the in-flight bound on a table written here, and, on a replica table, also its
replication freshness (heartbeats from the meta-cluster, ``replication/sink.py``). Reads answer
with it (``include_event_token``) or compare a token with it (``compare_event_token``).

An answer is a :class:`PullAnswer`: the events as maps, or - the fast path for a table SQLite can
describe - as the JSON text SQLite built for each event; the API layer turns either into the wire
format (``api/streams.py``). Other subsystems that need a table's log kept (XDCR peers) register a
hold (``add_log_hold``). Collaborators (given by the composition root, ``cluster.py``): the storage,
the tree, the node's tables, the timestamps, the transaction manager (what is visible), replication
(a replica table's freshness) and the change feed (waiting pulls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..config import EngineConfig
from ..cypress import Cypress, Node
from ..errors import ErrorCode, YtError
from ..metrics import ConsumerSample, StateSamples
from ..replication import UPSTREAM_TABLE_ATTRIBUTE, ReplicationManager
from ..schema import ColumnType
from ..storage import Storage, consumers_table, on_rollback
from ..tablets import DynamicTable, changes
from ..tablets.changes import HEARTBEAT_SEQ, ChangeFeed, Position, decode_token, encode_token, heartbeat_position
from ..timestamps import COUNTER_BITS, MAX_TIMESTAMP, TimestampProvider
from ..transactions import TransactionManager
from .tables import CHANGES_TRIMMED_ATTRIBUTE, DEFAULT_CHANGE_RETENTION_MS, Tables, log

DEFAULT_PULL_ROWS = 1000
DEFAULT_WAIT_MS = 1000
MAX_WAIT_MS = 60_000
#: a replica table's freshness moves with heartbeats that wake no pull: waiting pulls look again this often
_REPLICA_POLL = 0.1


def _ms_to_ts(ms: int) -> int:
    return (ms << COUNTER_BITS) // 1000


#: a hold on a table's change log: the newest position it may be trimmed to (None: no hold)
LogHold = Callable[[DynamicTable], "Position | None"]


@dataclass
class PullAnswer:
    """One answer of a table's stream: its events in order, and where the next pull starts."""

    event_token: str
    timestamp: int
    #: the events as maps (a heartbeat's included); empty when ``event_texts`` holds them
    events: list[dict[str, Any]]
    #: the events as JSON text that SQLite built (the fast path, ``changes.read_json``): each
    #: (timestamp, the event without its ``commit_end`` and closing brace); None unless asked for
    event_texts: list[tuple[int, str]] | None = None


class StreamService:
    """pull_changes, the queue-consumer commands, retention, and the freshness of reads."""

    def __init__(self, name: str, config: EngineConfig, storage: Storage, cypress: Cypress, tables: Tables,
                 timestamps: TimestampProvider, transactions: TransactionManager, replication: ReplicationManager,
                 change_feed: ChangeFeed) -> None:
        self.name = name
        self.config = config
        self.storage = storage
        self.cypress = cypress
        self.tables = tables
        self.timestamps = timestamps
        self.transactions = transactions
        self.replication = replication
        self.change_feed = change_feed
        self._log_holds: list[LogHold] = []

    def add_log_hold(self, hold: LogHold) -> None:
        """Register what else keeps a table's log (XDCR: every connected peer's position)."""
        self._log_holds.append(hold)

    # -- positions -----------------------------------------------------------------------------------

    def stream_bound(self, table: DynamicTable, fresh: int | None = None) -> int:
        """The newest timestamp up to which every change of ``table`` is applied on this cluster
        (at most ``fresh``, a timestamp just taken)."""
        bound = self.transactions.visible_bound(self.timestamps.generate() if fresh is None else fresh)
        freshness = self.replication.replica_freshness(table)
        if freshness is not None:
            bound = min(bound, freshness)
        return bound

    def _trimmed(self, table: DynamicTable) -> Position:
        """The newest position no longer kept (a stream starts after it, or later)."""
        if table.replicated:
            return heartbeat_position(table.trimmed_timestamp) if table.trimmed_timestamp else (0, 0)
        return max(table.changes_trimmed, table.stream_start)

    @staticmethod
    def _check_logged(table: DynamicTable, table_path: str) -> None:
        """A sorted or ordered table streams only while it keeps a change log (``@enable_change_log``)."""
        if not table.replicated and not table.change_log:
            raise YtError(f"Cannot stream table {table_path}: it keeps no change log; set "
                          f"{table_path}/@enable_change_log to %true (or register a queue consumer, which does) "
                          "and stream the changes committed after that", code=ErrorCode.NO_CHANGE_LOG,
                          attributes={"path": table_path})

    def _check_kept(self, table: DynamicTable, table_path: str, start: Position) -> None:
        self._check_logged(table, table_path)
        trimmed = self._trimmed(table)
        if start < trimmed:
            oldest = encode_token(trimmed, table.table_id)
            raise YtError(f"Cannot stream table {table_path} from timestamp {start[0]:#x}: its changes up to "
                          f"timestamp {trimmed[0]:#x} are no longer kept (change_retention, or the replication "
                          f"log's trimming); the oldest position available is event token {oldest} (timestamp "
                          f"{trimmed[0]}); raise @change_retention or register a vital consumer to keep more",
                          code=ErrorCode.CHANGES_TRIMMED,
                          attributes={"path": table_path, "oldest_timestamp": trimmed[0], "oldest_event_token": oldest})

    def _position_of(self, table: DynamicTable, table_path: str, token: Any, what: str = "event token") -> Position:
        """The position of an event token of ``table`` (a token of another table is refused), not
        ahead of this cluster's clock (``_check_not_ahead``)."""
        position, table_id = decode_token(token, what)
        if table_id != table.table_id:
            raise YtError(f"Invalid {what} for table {table_path}: it belongs to the table with id {table_id}, "
                          f"not to {table_path} ({table.table_id})", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": table_path, "event_token": str(token)[:200]})
        self._check_not_ahead(table_path, position[0], what)
        return position

    def _check_not_ahead(self, table_path: str, ts: int, what: str) -> None:
        """A stream position is a time this cluster has reached: every position it hands out is, and
        one ahead of its clock would be answered with a heartbeat at that future time, after which a
        consumer resuming from it would skip the changes committed before its clock gets there. One
        within the current second (another cluster's timestamp of this second, a meta-cluster's on
        its replica) is taken, and this clock moves past it: later commits here come after it."""
        if ts > MAX_TIMESTAMP:
            raise YtError(f"Invalid {what} for table {table_path}: timestamp {ts:#x} is out of the timestamp range",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path, "timestamp": ts})
        if ts <= self.timestamps.last:
            return  # (the common case, without taking a timestamp: every position handed out is here)
        now = self.timestamps.generate()
        if ts <= now:
            return
        if ts >> COUNTER_BITS <= now >> COUNTER_BITS:
            self.timestamps.observe(ts)
            return
        raise YtError(f"Invalid {what} for table {table_path}: its timestamp {ts:#x} is ahead of every commit cluster "
                      f"{self.name} has made or seen (its clock is at {now:#x}); a position comes from a change, "
                      "a heartbeat, a read's event token or generate_timestamp", code=ErrorCode.INVALID_PARAMETER,
                      attributes={"path": table_path, "timestamp": ts, "clock": now})

    def _start(self, table: DynamicTable, table_path: str, from_event_token: Any,
               from_timestamp: Any) -> Position:
        if from_event_token is not None and from_timestamp is not None:
            raise YtError(f"Cannot stream table {table_path}: give from_event_token or from_timestamp, not both",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        if from_event_token is not None:
            return self._position_of(table, table_path, from_event_token, "from_event_token")
        if from_timestamp is not None:
            if isinstance(from_timestamp, bool) or not isinstance(from_timestamp, int) or \
                    not 0 <= from_timestamp <= MAX_TIMESTAMP:
                raise YtError(f"Invalid from_timestamp {str(from_timestamp)[:100]!r} for table {table_path}: "
                              f"expected a timestamp (an integer in [0, {MAX_TIMESTAMP:#x}])",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
            self._check_not_ahead(table_path, from_timestamp, "from_timestamp")
            return heartbeat_position(from_timestamp)
        return heartbeat_position(self.stream_bound(table))

    @staticmethod
    def _limits(max_row_count: Any, wait_timeout: Any, max_rows: int) -> tuple[int, int]:
        rows = DEFAULT_PULL_ROWS if max_row_count is None else max_row_count
        wait = DEFAULT_WAIT_MS if wait_timeout is None else wait_timeout
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= max_rows:
            raise YtError(f"Invalid max_row_count {str(rows)[:50]!r}: expected an integer in [1, {max_rows}]",
                          code=ErrorCode.INVALID_PARAMETER)
        if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= MAX_WAIT_MS:
            raise YtError(f"Invalid wait_timeout {str(wait)[:50]!r}: expected milliseconds in [0, {MAX_WAIT_MS}]",
                          code=ErrorCode.INVALID_PARAMETER)
        return rows, wait

    # -- pulling -------------------------------------------------------------------------------------

    def pull_changes(self, path: Any, from_event_token: Any = None, from_timestamp: Any = None,
                     max_row_count: Any = None, wait_timeout: Any = None, event_texts: bool = False) -> PullAnswer:
        """One answer of the stream (see the module docstring). With ``event_texts`` the events may
        come as the JSON text SQLite builds (``changes.read_json``), for the wire."""
        table, table_path, _ = self.tables.table(path)
        limit, wait_ms = self._limits(max_row_count, wait_timeout, self.config.max_pull_rows)
        start = self._start(table, table_path, from_event_token, from_timestamp)
        return self._pull(table, table_path, start, limit, wait_ms, event_texts)

    def _pull(self, table: DynamicTable, table_path: str, start: Position, limit: int,
              wait_ms: int, raw: bool = False) -> PullAnswer:
        self._check_kept(table, table_path, start)
        deadline = time.monotonic() + wait_ms / 1000.0
        feed = self.change_feed
        # a slot for the whole wait: at most ``max_waiting_pulls`` pulls hold a worker thread while
        # they wait, on any kind of table; without one the pull answers with what it has at once
        with feed.waiting() as may_wait:
            while True:
                version = feed.version
                fresh = self.timestamps.generate()
                bound = self.stream_bound(table, fresh)
                texts, found = self._read(table, table_path, start, bound, limit, raw)
                # a trim may have passed between the check and the read: never answer with a gap
                self._check_kept(table, table_path, start)
                if texts:
                    return self._answer_json(table, texts, bound, limited=len(texts) >= limit)
                if found:
                    return self._answer(table, table_path, found, bound, limited=len(found) >= limit)
                now = time.monotonic()
                if now >= deadline or feed.closed or not may_wait:
                    break  # (closed: the engine is stopping, the client pulls again from this answer's token)
                if self.transactions.visible_bound(fresh) < fresh:
                    # a commit is in flight (the one whose notice woke us, say): read again once it is
                    # applied instead of waiting for the next one
                    try:
                        self.transactions.wait_visible(fresh, timeout=min(0.05, deadline - now))
                    except YtError:
                        pass
                    continue
                # (a replica table's freshness moves with heartbeats that notify nobody: look again soon)
                until = min(deadline, now + _REPLICA_POLL) if table.upstream_replica_id else deadline
                if not feed.wait_after(version, until):
                    break  # the engine is stopping: answer now
                self._check_present(table, table_path)
                if feed.version != version and self.config.pull_linger > 0:
                    # woken by a commit: let the next few join it in one answer
                    time.sleep(min(self.config.pull_linger, max(0.0, deadline - time.monotonic())))
        position = max(start, heartbeat_position(bound))
        token = encode_token(position, table.table_id)
        return PullAnswer(token, position[0], [{"kind": "heartbeat", "event_token": token, "timestamp": position[0],
                                                "path": table_path}])

    def _read(self, table: DynamicTable, table_path: str, start: Position, bound: int, limit: int,
              raw: bool) -> tuple[list[tuple[int, str]], list[changes.Change]]:
        """The changes after ``start`` up to ``bound``: as event texts (``raw``: for the wire) from
        the table's tail in memory or from SQLite's JSON, else as changes read from SQL."""
        if raw:
            kept = self._from_tail(table, table_path, start, bound, limit)
            if kept is not None:
                return kept, []
        with self.storage.read() as conn:
            if raw and changes.can_read_json(table, conn):
                try:
                    return changes.read_json(table, conn, start, bound, limit, table_path), []
                except sa.exc.OperationalError:
                    pass  # a payload SQLite's JSON cannot read (a NaN or an infinite double): build in Python
            return [], changes.read(table, conn, start, bound, limit)

    def _from_tail(self, table: DynamicTable, table_path: str, start: Position, bound: int,
                   limit: int) -> list[tuple[int, str]] | None:
        """Event texts of the table's tail (``changes.ChangeTail``), made by the first such pull;
        None where the tail does not serve: a position before it, a replica table or a queue (whose
        commits do not apply in timestamp order here), an ``any`` column (its YSON text is parsed
        into the event), a NaN or an infinite double."""
        if table.replicated or table.upstream_replica_id is not None or \
                any(c.type is ColumnType.ANY for c in table.schema.columns):
            return None
        tail = changes.tail_for(table, self.storage.write_lock, lambda: self.timestamps.last,
                                self.config.change_tail_rows)
        taken = tail.take(start, bound, limit)
        if taken is None:
            return None
        return changes.ChangeTail.render(taken, table.table_id, table_path, table.schema.key_names)

    def _check_present(self, table: DynamicTable, table_path: str) -> None:
        """A pull waiting on a table that was removed meanwhile answers at once that it is gone."""
        node = self.cypress.by_id.get(table.table_id)
        if node is None or node.table is not table:
            raise YtError(f"Table {table_path} was removed while a pull of its changes waited",
                          code=ErrorCode.RESOLVE_ERROR, attributes={"path": table_path})

    def _answer(self, table: DynamicTable, table_path: str, found: list[changes.Change], bound: int,
                limited: bool) -> PullAnswer:
        events = self._events(table, table_path, found)
        if limited:
            token, ts = events[-1]["event_token"], found[-1].position[0]
        else:
            # every change up to the bound is in this answer: the next pull starts after it
            ts = max(bound, found[-1].position[0])
            token = encode_token((ts, HEARTBEAT_SEQ), table.table_id)
        return PullAnswer(token, ts, events)

    @staticmethod
    def _answer_json(table: DynamicTable, texts: list[tuple[int, str]], bound: int, limited: bool) -> PullAnswer:
        """``_answer`` of events SQLite built (``changes.read_json``)."""
        if limited:
            ts = texts[-1][0]
            token = texts[-1][1][len('{"event_token":"'):].split('"', 1)[0]
        else:
            ts = max(bound, texts[-1][0])
            token = encode_token((ts, HEARTBEAT_SEQ), table.table_id)
        return PullAnswer(token, ts, [], texts)

    def _events(self, table: DynamicTable, table_path: str, found: list[changes.Change]) -> list[dict[str, Any]]:
        keys = table.schema.key_names
        rows = [c.payload.get("row") for c in found]
        self.tables.decode_any_columns(table, [r for r in rows if isinstance(r, dict)])
        events: list[dict[str, Any]] = []
        for i, (change, row) in enumerate(zip(found, rows, strict=True)):
            event: dict[str, Any] = {"event_token": encode_token(change.position, table.table_id),
                                     "timestamp": change.position[0], "kind": change.kind, "path": table_path,
                                     "tablet_index": change.tablet_index}
            if change.kind == "append":
                event["row"] = row
                event["$tablet_index"] = change.tablet_index
                event["$row_index"] = change.payload.get("row_index")
            elif change.kind == "delete":
                key = change.payload.get("key")
                event["key"] = dict(zip(keys, key, strict=False)) if isinstance(key, list) else \
                    {k: (row or {}).get(k) for k in keys}
            else:
                event["key"] = {k: (row or {}).get(k) for k in keys}
                event["row"] = row
                if change.kind == "upsert":
                    event["update"] = bool(change.payload.get("update", False))
            origin = change.payload.get("o")
            if isinstance(origin, list):
                # an XDCR table's change: its version (the cluster that made it, and when)
                event["origin_cluster_id"], event["origin_timestamp"] = origin[1], origin[0]
            nxt = found[i + 1] if i + 1 < len(found) else None
            event["commit_end"] = nxt is None or nxt.position[0] != change.position[0]
            events.append(event)
        return events

    # -- consumers (YT's queue consumers) ------------------------------------------------------------------

    @staticmethod
    def _consumer_name(consumer_path: Any) -> str:
        if not isinstance(consumer_path, str) or not 0 < len(consumer_path) <= 1000 or not _is_utf8(consumer_path):
            raise YtError(f"Invalid consumer_path {ascii(str(consumer_path)[:100])}: expected a name of 1 to 1000 "
                          "characters (valid UTF-8)", code=ErrorCode.INVALID_PARAMETER)
        return consumer_path

    def _consumer_row(self, conn: sa.Connection, table: DynamicTable, consumer: str) -> Any:
        c = consumers_table.c
        return conn.execute(sa.select(c.vital, c.offset_timestamp, c.offset_seq).where(
            c.table_id == table.table_id, c.consumer_path == consumer)).first()

    def _no_consumer(self, consumer: str, table_path: str) -> YtError:
        return YtError(f"Consumer {consumer} is not registered for table {table_path}",
                       code=ErrorCode.RESOLVE_ERROR, attributes={"path": table_path, "consumer_path": consumer})

    def register_queue_consumer(self, queue_path: Any, consumer_path: Any, vital: bool = False,
                                from_timestamp: Any = None) -> None:
        table, table_path, node = self.tables.table(queue_path)
        consumer = self._consumer_name(consumer_path)
        start = self._start(table, table_path, None, from_timestamp)
        with self.storage.write() as conn:
            if not table.replicated and not table.change_log:
                # a consumer streams the table: its log starts now (a consumer "from now" starts with it)
                self.tables.switch_change_log(conn, node, True)
                if from_timestamp is None:
                    start = max(start, self._trimmed(table))
            self._check_kept(table, table_path, start)
            c = consumers_table.c
            if self._consumer_row(conn, table, consumer) is not None:
                # registered again: the offset stays, vital is updated
                conn.execute(consumers_table.update().where(c.table_id == table.table_id,
                                                            c.consumer_path == consumer).values(vital=bool(vital)))
            else:
                conn.execute(consumers_table.insert().values(
                    table_id=table.table_id, consumer_path=consumer, vital=bool(vital),
                    offset_timestamp=start[0], offset_seq=_signed(start[1])))
        log.info("queue consumer registered", extra={"path": table_path, "consumer_path": consumer,
                                                     "vital": bool(vital)})

    def unregister_queue_consumer(self, queue_path: Any, consumer_path: Any) -> None:
        table, table_path, _ = self.tables.table(queue_path)
        consumer = self._consumer_name(consumer_path)
        with self.storage.write() as conn:
            c = consumers_table.c
            removed = conn.execute(consumers_table.delete().where(
                c.table_id == table.table_id, c.consumer_path == consumer)).rowcount
            if not removed:
                raise self._no_consumer(consumer, table_path)

    def list_queue_consumer_registrations(self, queue_path: Any) -> list[dict[str, Any]]:
        table, table_path, _ = self.tables.table(queue_path)
        c = consumers_table.c
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(c.consumer_path, c.vital, c.offset_timestamp, c.offset_seq).where(
                c.table_id == table.table_id).order_by(c.consumer_path)).all()
        return [{"queue_path": table_path, "consumer_path": r[0], "vital": bool(r[1]),
                 "offset": encode_token((int(r[2]), _unsigned(r[3])), table.table_id), "timestamp": int(r[2])}
                for r in rows]

    def pull_consumer(self, consumer_path: Any, queue_path: Any, max_row_count: Any = None,
                      wait_timeout: Any = None) -> PullAnswer:
        table, table_path, _ = self.tables.table(queue_path)
        consumer = self._consumer_name(consumer_path)
        limit, wait_ms = self._limits(max_row_count, wait_timeout, self.config.max_pull_rows)
        with self.storage.read() as conn:
            row = self._consumer_row(conn, table, consumer)
        if row is None:
            raise self._no_consumer(consumer, table_path)
        return self._pull(table, table_path, (int(row[1]), _unsigned(row[2])), limit, wait_ms)

    def advance_consumer(self, consumer_path: Any, queue_path: Any, old_offset: Any, new_offset: Any) -> None:
        table, table_path, _ = self.tables.table(queue_path)
        consumer = self._consumer_name(consumer_path)
        new = self._position_of(table, table_path, new_offset, "new_offset")
        old = None if old_offset is None else self._position_of(table, table_path, old_offset, "old_offset")
        with self.storage.write() as conn:
            row = self._consumer_row(conn, table, consumer)
            if row is None:
                raise self._no_consumer(consumer, table_path)
            current = (int(row[1]), _unsigned(row[2]))
            if old is not None and current != old:
                raise YtError(f"Cannot advance consumer {consumer} of table {table_path}: its offset is "
                              f"{encode_token(current, table.table_id)}, not the old_offset given (another "
                              "consumer advanced it first)", code=ErrorCode.CONSUMER_OFFSET_CONFLICT,
                              attributes={"path": table_path, "consumer_path": consumer,
                                          "current_offset": encode_token(current, table.table_id)})
            self._check_kept(table, table_path, new)
            c = consumers_table.c
            conn.execute(consumers_table.update().where(c.table_id == table.table_id, c.consumer_path == consumer)
                         .values(offset_timestamp=new[0], offset_seq=_signed(new[1])))

    def _vital_offset(self, conn: sa.Connection, table_id: str) -> Position | None:
        c = consumers_table.c
        rows = conn.execute(sa.select(c.offset_timestamp, c.offset_seq).where(
            c.table_id == table_id, c.vital == sa.true())).all()
        return min(((int(r[0]), _unsigned(r[1])) for r in rows), default=None)

    def consumer_samples(self) -> StateSamples:
        """The consumers' lag for ``/metrics`` (a state source, read at scrape time, no lock): the
        age of the oldest change a consumer has not advanced past, 0 when it has them all."""
        c = consumers_table.c
        samples = StateSamples()
        now = time.time()
        with self.storage.read() as conn:
            rows = conn.execute(sa.select(c.table_id, c.consumer_path, c.vital, c.offset_timestamp,
                                          c.offset_seq)).all()
            for table_id, consumer, vital, offset_ts, offset_seq in rows:
                node = self.cypress.by_id.get(table_id)
                if node is None or node.table is None:
                    continue
                after = changes.read(node.table, conn, (int(offset_ts), _unsigned(offset_seq)), 1 << 62, 1)
                lag = max(0.0, now - (after[0].position[0] >> COUNTER_BITS)) if after else 0.0
                samples.consumers.append(ConsumerSample(node.path, consumer, bool(vital), lag))
        return samples

    # -- retention -----------------------------------------------------------------------------------------

    def stream_hold(self, table: DynamicTable, node: Node) -> int | None:
        """A replicated table's queue: the newest commit timestamp it may be trimmed to for streams
        (``ReplicationHost.stream_hold``): ``@change_retention`` when set, and vital consumers."""
        hold: int | None = None
        retention = node.attributes.get("change_retention")
        if isinstance(retention, int) and not isinstance(retention, bool):
            hold = self.timestamps.last - _ms_to_ts(retention)
        with self.storage.read() as conn:
            vital = self._vital_offset(conn, table.table_id)
        if vital is not None:
            # every change at the offset's timestamp stays (a heartbeat offset could allow it: no matter)
            hold = vital[0] - 1 if hold is None else min(hold, vital[0] - 1)
        return hold

    def _log_hold(self, table: DynamicTable) -> Position | None:
        """Changes others still need beyond the consumers (the registered holds: XDCR peers)."""
        holds = [h for h in (hold(table) for hold in self._log_holds) if h is not None]
        return min(holds) if holds else None

    def trim_changes(self) -> int:
        """Drop logged changes older than each table's ``@change_retention`` that no vital consumer
        still needs (the background loop runs it)."""
        removed = 0
        for node in list(self.cypress.by_id.values()):
            table = node.table
            if table is None or table.replicated or not table.change_log:
                continue
            retention = node.attributes.get("change_retention", DEFAULT_CHANGE_RETENTION_MS)
            horizon = self.timestamps.last - _ms_to_ts(int(retention))
            with self.storage.read() as conn:
                up_to = changes.newest_before(conn, table.table_id, horizon)
            if up_to is None or up_to <= table.changes_trimmed:
                continue
            hold = self._log_hold(table)
            if hold is not None and hold < up_to:
                up_to = hold
            with self.storage.write() as conn:
                vital = self._vital_offset(conn, table.table_id)
                if vital is not None and vital < up_to:
                    up_to = vital
                if up_to <= table.changes_trimmed:
                    continue
                removed += changes.trim(conn, table.table_id, up_to)
                before = table.changes_trimmed
                table.changes_trimmed = up_to
                node.attributes[CHANGES_TRIMMED_ATTRIBUTE] = list(up_to)
                self.cypress.save(conn, node)
                on_rollback(conn, _restore_trimmed(table, before))
        return removed

    # -- freshness of reads ------------------------------------------------------------------------------

    def read_freshness(self, table: DynamicTable, table_path: str, timestamp: int | None,
                       include_event_token: bool, compare_event_token: Any) -> dict[str, Any] | None:
        """The response parameters of a read (``include_event_token``/``compare_event_token``),
        taken *before* the read: the data it returns includes every change up to ``timestamp``."""
        if not include_event_token and compare_event_token is None:
            return None
        compared = None
        if compare_event_token is not None:
            # tokens compare across a meta-cluster and its replicas by timestamp: a replica table takes
            # the tokens of its replicated table too (whose id its pushes carry), and no other table's
            compared, token_table = decode_token(compare_event_token, "compare_event_token")
            if token_table != table.table_id:
                node = self.cypress.by_id.get(table.table_id)
                upstream = node.attributes.get(UPSTREAM_TABLE_ATTRIBUTE) if node is not None else None
                if not table.upstream_replica_id or upstream not in (None, token_table):
                    raise YtError(f"Invalid compare_event_token for table {table_path}: it is a token of the table "
                                  f"with id {token_table}, not of {table_path} ({table.table_id})"
                                  + (f" or of its replicated table ({upstream})" if upstream else ""),
                                  code=ErrorCode.INVALID_PARAMETER,
                                  attributes={"path": table_path, "event_token": str(compare_event_token)[:200]})
        fresh_ts = self.stream_bound(table)
        if timestamp is not None:
            fresh_ts = min(fresh_ts, timestamp)
        out: dict[str, Any] = {"event_token": encode_token(heartbeat_position(fresh_ts), table.table_id),
                               "timestamp": fresh_ts}
        if compared is not None:
            out["fresh"] = compared[0] <= fresh_ts
        return out


def _restore_trimmed(table: DynamicTable, before: Position) -> Callable[[], None]:
    def undo() -> None:
        table.changes_trimmed = before
    return undo


def _is_utf8(text: str) -> bool:
    """Whether ``text`` can be stored (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _signed(seq: int) -> int:
    """A seq in a signed 64-bit SQL column (the heartbeat seq is 2**64 - 1)."""
    return seq - (1 << 64) if seq >= 1 << 63 else seq


def _unsigned(value: Any) -> int:
    value = int(value)
    return value + (1 << 64) if value < 0 else value
