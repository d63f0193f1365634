"""Rows: timestamps, transactions, insert/delete/lock, lookups and selects.

Writes are validated against the schema here and buffered in a tablet transaction; the commit is
the transaction manager's. Reads of a replicated table are served by an in-sync sync replica.

``RowService`` gets its collaborators from the composition root (``cluster.py``): the storage, the
tree, the node's tables, timestamps, the transaction manager, replication (reads served by a
replica), the peers (their clients), the serving state (may a client write now) and the stream
service (how fresh a read is: ``read_freshness``).
"""

from __future__ import annotations

import random
import time
from itertools import repeat
from typing import Any

import sqlalchemy as sa

from .. import yson_util
from ..config import EngineConfig
from ..credentials import made_by
from ..cypress import Cypress
from ..errors import ErrorCode, YtError
from ..peers import Peers
from ..query import ParsedQuery, compile_query, parse_query
from ..replication import ReplicationManager
from ..schema import MAX_ROW_WEIGHT, row_weight, validate_row, validate_rows
from ..storage import Storage
from ..tablets import (
    DynamicTable,
    RowWrite,
    WriteKind,
    changes,
    validate_key_not_null,
)
from ..timestamps import TimestampProvider
from ..transactions import (
    Atomicity,
    Durability,
    TabletTransaction,
    TransactionManager,
)
from ..xdcr import JOIN_ATTRIBUTE
from .serving import ServingState
from .stream_service import StreamService
from .tables import (
    DEFAULT_OUTPUT_ROW_LIMIT,
    Tables,
    is_storage_outage,
    retarget_query,
)


class RowService:
    """Timestamps, transactions and rows."""

    def __init__(self, name: str, config: EngineConfig, storage: Storage, cypress: Cypress, tables: Tables,
                 timestamps: TimestampProvider, transactions: TransactionManager, replication: ReplicationManager,
                 peers: Peers, serving: ServingState, streams: StreamService) -> None:
        self.name = name
        self.config = config
        self.storage = storage
        self.cypress = cypress
        self.tables = tables
        self.timestamps = timestamps
        self.transactions = transactions
        self.replication = replication
        self.peers = peers
        self.serving = serving
        self.streams = streams

    def generate_timestamp(self) -> int:
        return self.timestamps.generate()

    def start_transaction(self, type: str = "tablet", atomicity: str | None = None,
                          durability: str | None = None, timeout: int | None = None,
                          start_timestamp: int | None = None) -> str:
        if type != "tablet":
            raise YtError(f"Transaction type {type!r} is not supported: reptables serves tablet "
                          "transactions only: use yt.wrapper.Transaction(type=\"tablet\") or "
                          "`yt execute start_transaction '{type=tablet}'`", code=ErrorCode.INVALID_PARAMETER)
        try:
            atom = Atomicity(atomicity or "full")
            dur = Durability(durability or "sync")
        except ValueError:
            raise YtError(f"Invalid atomicity {atomicity!r} or durability {durability!r}",
                          code=ErrorCode.INVALID_PARAMETER) from None
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
            raise YtError(f"Invalid transaction timeout {timeout!r}: expected milliseconds > 0",
                          code=ErrorCode.INVALID_PARAMETER)
        tx = self.transactions.start(atom, dur, timeout / 1000.0 if timeout else None, start_timestamp)
        return tx.id

    def ping_transaction(self, transaction_id: str) -> None:
        self.transactions.ping(transaction_id)

    def commit_transaction(self, transaction_id: str) -> int:
        tx = self.transactions.get(transaction_id)
        return self.transactions.commit(tx)

    def abort_transaction(self, transaction_id: str) -> None:
        self.transactions.abort(transaction_id)

    def _tx_for_write(self, transaction_id: str | None, atomicity: str | None,
                      durability: str | None) -> tuple[TabletTransaction, bool]:
        if transaction_id:
            tx = self.transactions.get(transaction_id)
            tx.check_active()
            return tx, False
        tx_id = self.start_transaction("tablet", atomicity, durability)
        return self.transactions.get(tx_id), True

    def _run_write(self, tx: TabletTransaction, implicit: bool, fill: Any) -> None:
        try:
            with tx.lock:
                tx.check_active()
                fill()
        except BaseException:
            if implicit:
                self.transactions.abort(tx.id)
            raise
        if implicit:
            self.transactions.commit(tx)

    def insert_rows(self, path: Any, rows: list[Any], update: bool = False, transaction_id: str | None = None,
                    atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool = True, input_bytes: int | None = None) -> None:
        """``input_bytes`` is the size of the request body when known: no row of a smaller body can
        reach the row weight limit, so the per-row weight check is skipped."""
        table, table_path, _ = self.tables.table(path)
        self._check_direct_write(table, table_path)
        table.check_writable(table_path)
        # read before the pivot keys: a reshard publishes its tablets first and the revision last
        revision = table.layout_revision
        # an ordered table's rows without $tablet_index all go to one randomly chosen tablet, so a
        # batch stays one participant and keeps its order
        batch_tablet = None if table.sorted else random.randrange(table.tablet_count)
        schema = table.schema
        sorted_ = table.sorted
        single_tablet = sorted_ and len(table.pivot_keys) == 1
        checked = validate_rows(schema, rows, table_path, update=update, keys_not_null=sorted_)
        if input_bytes is None or input_bytes > MAX_ROW_WEIGHT:
            for row in checked:
                if row_weight(row) > MAX_ROW_WEIGHT:
                    raise YtError(f"Row of table {table_path} is too large: its weight exceeds "
                                  f"{MAX_ROW_WEIGHT} bytes", code=ErrorCode.ROW_WEIGHT_LIMIT_EXCEEDED)
        full_mask = schema.full_lock_mask if sorted_ else 1
        validated: list[tuple[int, RowWrite]]
        if single_tablet and not update:
            # the hot path: one tablet, whole-row writes
            validated = list(zip(repeat(0), map(RowWrite, repeat(WriteKind.WRITE), checked, repeat(full_mask))))
        else:
            validated = []
            for raw, row in zip(rows, checked, strict=True):
                if single_tablet:
                    tablet = 0
                else:
                    explicit = yson_util.to_python(raw.get("$tablet_index")) if isinstance(raw, dict) else None
                    tablet = table.tablet_for_row(row, batch_tablet if explicit is None else explicit)
                mask = schema.lock_mask(list(row)) if update and sorted_ else full_mask
                validated.append((tablet, RowWrite(WriteKind.WRITE, row, mask, update=update)))
        tx, implicit = self._tx_for_write(transaction_id, atomicity, durability)

        def fill() -> None:
            tx.require_sync_replica[table.table_id] = require_sync_replica
            tx.add_many(table, table_path, validated, revision)

        self._run_write(tx, implicit, fill)

    def _check_direct_write(self, table: DynamicTable, path: str) -> None:
        """A client's row write: refused on a read-only cluster and on replica tables."""
        self.serving.check_accepts_writes(path)
        node = self.cypress.by_id.get(table.table_id)
        joining = node.attributes.get(JOIN_ATTRIBUTE) if node is not None else None
        if isinstance(joining, dict):
            raise YtError(f"XDCR table {path} of cluster {self.name} is joining its group from a snapshot of cluster "
                          f"{joining.get('source')}: writes are refused until the join is finished (dr_status)",
                          code=ErrorCode.READ_ONLY, attributes={"path": path, "cluster_name": self.name})
        if table.upstream_replica_id:
            raise YtError(f"Table {path} is a replica table (upstream_replica_id {table.upstream_replica_id}): "
                          "direct writes are refused; write to its replicated table on the meta-cluster",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH,
                          attributes={"path": path, "upstream_replica_id": table.upstream_replica_id})

    def delete_rows(self, path: Any, keys: list[Any], transaction_id: str | None = None,
                    atomicity: str | None = None, durability: str | None = None,
                    require_sync_replica: bool = True) -> None:
        table, table_path, _ = self.tables.table(path)
        if not table.sorted:
            raise YtError(f"Cannot delete rows from ordered table {table_path}: use trim_rows",
                          code=ErrorCode.TABLE_MUST_BE_SORTED, attributes={"path": table_path})
        self._check_direct_write(table, table_path)
        table.check_writable(table_path)
        revision = table.layout_revision  # (before the pivot keys, as in insert_rows)
        validated = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            validated.append((table.tablet_for_row(key_row), RowWrite(WriteKind.DELETE, key_row, 1)))
        tx, implicit = self._tx_for_write(transaction_id, atomicity, durability)

        def fill() -> None:
            tx.require_sync_replica[table.table_id] = require_sync_replica
            for tablet, w in validated:
                tx.add(table, table_path, tablet, w, revision)

        self._run_write(tx, implicit, fill)

    def lock_rows(self, path: Any, keys: list[Any], transaction_id: str | None = None,
                  locks: list[str] | None = None, lock_type: str = "shared_strong") -> None:
        if not transaction_id:
            raise YtError("lock_rows requires a tablet transaction (transaction_id)", code=ErrorCode.INVALID_PARAMETER)
        table, table_path, _ = self.tables.table(path)
        if not table.sorted:
            raise YtError(f"Cannot lock rows of ordered table {table_path}", code=ErrorCode.TABLE_MUST_BE_SORTED)
        if lock_type not in ("shared_weak", "shared_strong", "exclusive"):
            raise YtError(f"Invalid lock_type {lock_type!r}: expected shared_weak, shared_strong or exclusive",
                          code=ErrorCode.INVALID_PARAMETER)
        groups = table.schema.lock_groups
        mask = 0
        for name in locks or []:
            if name not in groups[1:]:
                raise YtError(f"Lock {name!r} is not defined in the schema of table {table_path}",
                              code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path, "lock": name})
            mask |= 1 << groups.index(name)
        mask = mask or 1
        revision = table.layout_revision  # (before the pivot keys, as in insert_rows)
        validated = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            validated.append((table.tablet_for_row(key_row), RowWrite(
                WriteKind.LOCK, key_row, mask, shared=lock_type != "exclusive",
                strong=lock_type == "shared_strong")))
        tx, _ = self._tx_for_write(transaction_id, None, None)

        def fill() -> None:
            for tablet, w in validated:
                tx.add(table, table_path, tablet, w, revision)

        self._run_write(tx, False, fill)

    def trim_rows(self, path: Any, tablet_index: int, trimmed_row_count: int) -> None:
        table, table_path, _ = self.tables.table(path)
        for name, value in (("tablet_index", tablet_index), ("trimmed_row_count", trimmed_row_count)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise YtError(f"Invalid {name} {value!r}: expected a non-negative integer",
                              code=ErrorCode.INVALID_PARAMETER)
        table.check_readable(table_path)
        with self.storage.write() as conn:
            table.trim_rows(conn, tablet_index, trimmed_row_count, table_path)

    def _snapshot_timestamp(self, timestamp: Any, transaction_id: str | None) -> int | None:
        if transaction_id:
            tx = self.transactions.get(transaction_id)
            tx.check_active()
            if timestamp is None and tx.atomicity is Atomicity.FULL:
                self.transactions.wait_visible(tx.start_timestamp)
                return tx.start_timestamp
        return self.tables.read_timestamp(timestamp)

    def lookup_rows(self, path: Any, keys: list[Any], column_names: list[str] | None = None,
                    timestamp: Any = None, keep_missing_rows: bool = False,
                    transaction_id: str | None = None, include_event_token: bool = False,
                    compare_event_token: Any = None,
                    response_parameters: dict[str, Any] | None = None) -> list[dict[str, Any] | None]:
        """``include_event_token``/``compare_event_token`` (change streams, docs/streams.md) put the
        read's freshness into ``response_parameters``."""
        table, table_path, _ = self.tables.table(path)
        if not table.sorted:
            raise YtError(f"Cannot lookup rows in ordered table {table_path}: use select_rows",
                          code=ErrorCode.TABLE_MUST_BE_SORTED, attributes={"path": table_path})
        table.check_readable(table_path)
        if column_names is not None:
            for name in column_names:
                if name not in table.schema.by_name:
                    raise YtError(f"Column {name!r} is not found in the schema of table {table_path}",
                                  code=ErrorCode.COLUMN_NOT_FOUND, attributes={"column": name, "path": table_path})
        ts = self._snapshot_timestamp(timestamp, transaction_id)
        table.check_snapshot(ts, table_path)
        if ts is None and not table.replicated:
            self.transactions.wait_prepared_writes(table.table_id)
        key_tuples = []
        key_rows = []
        for raw in keys:
            key_row = validate_row(table.schema, raw, table_path, key_only=True)
            validate_key_not_null(table.schema, key_row, table_path)
            key_tuples.append(table.key_of(key_row))
            key_rows.append(key_row)
        if table.replicated:
            replica = self.replication.in_sync_read_replica(table, table_path)
            return self._from_replica(replica, lambda c: c.lookup_rows(
                replica.replica_path, key_rows, column_names=column_names, timestamp=ts,
                keep_missing_rows=keep_missing_rows, include_event_token=include_event_token,
                compare_event_token=compare_event_token, response_parameters=response_parameters))
        freshness = self.streams.read_freshness(table, table_path, ts, include_event_token, compare_event_token)
        if freshness is not None and response_parameters is not None:
            response_parameters.update(freshness)
        # (one key at the latest timestamp: one point query, see Storage.read)
        with self.storage.read(one_statement=ts is None and len(key_tuples) == 1) as conn:
            found = table.lookup(conn, key_tuples, ts)
        self.tables.decode_any_columns(table, found)
        out: list[dict[str, Any] | None] = []
        for row in found:
            if row is None:
                if keep_missing_rows:
                    out.append(None)
                continue
            if column_names is not None:
                row = {n: row[n] for n in column_names}
            out.append(row)
        return out

    def select_rows(self, query: str, timestamp: Any = None, transaction_id: str | None = None,
                    input_row_limit: int | None = None, output_row_limit: int | None = None,
                    fail_on_incomplete_result: bool = True, include_event_token: bool = False,
                    compare_event_token: Any = None,
                    response_parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        if not isinstance(query, str):
            raise YtError("Parameter \"query\" must be a string", code=ErrorCode.INVALID_PARAMETER)
        parsed = parse_query(query)
        tables = [self.tables.table(path) for path in parsed.table_paths]  # FROM first, then each JOIN's
        for table, table_path, _ in tables:
            table.check_readable(table_path)
        ts = self._snapshot_timestamp(timestamp, transaction_id)
        for table, table_path, _ in tables:
            table.check_snapshot(ts, table_path)
        if any(table.replicated for table, _, _ in tables):
            replica, rewritten = self._replicas_for_query(parsed, tables)
            return self._from_replica(replica, lambda c: c.select_rows(
                rewritten, timestamp=ts, output_row_limit=output_row_limit,
                include_event_token=include_event_token, compare_event_token=compare_event_token,
                response_parameters=response_parameters))
        if ts is None:
            for table_id in dict.fromkeys(table.table_id for table, _, _ in tables):
                self.transactions.wait_prepared_writes(table_id)
        # (a join's answer is as fresh as its least fresh table: the FROM table's token is given)
        freshness = [self.streams.read_freshness(table, path, ts, include_event_token, compare_event_token)
                     for table, path, _ in tables]
        if freshness[0] is not None and response_parameters is not None:
            least = min(f["timestamp"] for f in freshness if f is not None)
            response_parameters["timestamp"] = least
            response_parameters["event_token"] = changes.encode_token(changes.heartbeat_position(least),
                                                                      tables[0][0].table_id)
            if "fresh" in freshness[0]:
                response_parameters["fresh"] = all(f is not None and f.get("fresh") for f in freshness)
        sources = [table.query_source(ts) for table, _, _ in tables]
        compiled = compile_query(parsed, sources[0], sources[1:])
        limit = output_row_limit or DEFAULT_OUTPUT_ROW_LIMIT
        statement = compiled.statement
        if statement._limit_clause is None:
            statement = statement.limit(limit + 1)
        # limits (EngineConfig "limits"): the database stops the query at query_timeout, and the
        # fetch stops once the answer is surely past max_output_bytes - each value takes at least
        # one byte in any output format, a string at least its length - instead of building it whole
        timeout = self.config.query_timeout
        max_bytes = self.config.max_output_bytes
        deadline = time.monotonic() + timeout
        timed_out = False

        def past_deadline() -> bool:
            nonlocal timed_out
            timed_out = time.monotonic() > deadline
            return timed_out

        shown = query if len(query) <= 1000 else query[:1000] + "..."  # as errors echo it
        strings = [i for i, n in enumerate(compiled.output_columns) if compiled.output_types.get(n) == "string"]
        width = len(compiled.output_columns)
        fetched: list[Any] = []
        try:
            with self.storage.read() as conn:
                raw = conn.connection.dbapi_connection
                if self.storage.is_sqlite:
                    # called every million VM steps (~20 ms): each call takes the GIL, which more
                    # often would stall the query behind busy Python threads
                    raw.set_progress_handler(past_deadline, 1_000_000)  # type: ignore[union-attr]
                else:
                    conn.execute(sa.text(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}"))
                try:
                    result = conn.execute(statement)
                    size = 0
                    while len(fetched) <= limit:
                        batch = result.fetchmany(min(1000, limit + 1 - len(fetched)))
                        if not batch:
                            break
                        fetched.extend(batch)
                        size += width * len(batch) + sum(len(r[i]) for r in batch for i in strings if r[i])
                        if size > max_bytes:
                            raise YtError(f"Answer of select_rows exceeds the output limit of {max_bytes} bytes "
                                          "(max_output_bytes): narrow the query with a WHERE condition or a LIMIT",
                                          code=ErrorCode.INVALID_PARAMETER,
                                          attributes={"max_output_bytes": max_bytes, "query": shown})
                finally:
                    if self.storage.is_sqlite:
                        raw.set_progress_handler(None, 0)  # type: ignore[union-attr]
        except sa.exc.DBAPIError as exc:
            if timed_out or "statement timeout" in str(exc.orig):
                raise YtError(f"Query was stopped after the query time limit of {timeout:g} s (query_timeout): "
                              "narrow it with a WHERE condition on the key columns or a LIMIT",
                              code=ErrorCode.TIMEOUT, attributes={"query_timeout": timeout, "query": shown}) from None
            if is_storage_outage(exc):
                raise
            # the storage refused to evaluate this query (overflow, expression too deep...)
            raise YtError(f"Query cannot be evaluated: {exc.orig}", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"query": shown}) from None
        rows = [dict(zip(compiled.output_columns, r, strict=True)) for r in fetched]
        if len(rows) > limit:
            if fail_on_incomplete_result:
                raise YtError(f"Query result exceeds the output row limit of {limit} rows; add a limit or "
                              "raise output_row_limit", code=ErrorCode.INVALID_PARAMETER,
                              attributes={"output_row_limit": limit})
            rows = rows[:limit]
        any_columns = {n for n, t in compiled.output_types.items() if t == "any"}
        if any_columns:
            for row in rows:
                for n in any_columns:
                    if row.get(n) is not None:
                        row[n] = yson_util.loads_text(row[n])
        return rows

    def _replicas_for_query(self, parsed: ParsedQuery,
                            tables: list[tuple[DynamicTable, str, Any]]) -> tuple[Any, str]:
        """The replica that serves a query over replicated tables, and the query retargeted to the
        replica tables on its cluster (seed 002, "Reading data"): one cluster must hold an in-sync
        sync replica of every table of the query, as inter-cluster queries are not supported."""
        distinct = {table.table_id: (table, path) for table, path, _ in tables}
        plain = [path for table, path in distinct.values() if not table.replicated]
        if plain:
            replicated = [path for table, path in distinct.values() if table.replicated]
            raise YtError(f"Query mixes replicated tables ({', '.join(replicated)}) with tables that are not "
                          f"replicated ({', '.join(plain)}): if one table of a query is replicated, all must be",
                          code=ErrorCode.INVALID_PARAMETER,
                          attributes={"replicated_paths": replicated, "plain_paths": plain})
        if len(distinct) == 1:
            table, path = next(iter(distinct.values()))
            replica = self.replication.in_sync_read_replica(table, path)
            return replica, retarget_query(parsed, dict.fromkeys(parsed.table_paths, replica.replica_path))
        by_cluster: dict[str, dict[str, Any]] = {}  # cluster -> table id -> its in-sync sync replica
        for table_id in distinct:
            for replica in self.replication.registry.replicas_of(table_id):
                if replica.writes_synchronously:
                    by_cluster.setdefault(replica.cluster_name, {}).setdefault(table_id, replica)
        clusters = sorted(name for name, found in by_cluster.items() if len(found) == len(distinct))
        if not clusters:
            paths = [path for _, path in distinct.values()]
            raise YtError(f"No single cluster contains in-sync replicas for all involved tables [{', '.join(paths)}]",
                          code=ErrorCode.NO_IN_SYNC_REPLICAS,
                          attributes={"paths": paths, "clusters_with_sync_replicas": {
                              name: sorted(distinct[t][1] for t in found) for name, found in by_cluster.items()}})
        chosen = by_cluster[random.choice(clusters)]  # as YT, any cluster that has them all
        # keyed by each path as written in the query (``//t`` and ``#<id>`` may name one table)
        new_paths = {written: chosen[table.table_id].replica_path
                     for written, (table, _, _) in zip(parsed.table_paths, tables, strict=True)}
        first = tables[0][0].table_id
        return chosen[first], retarget_query(parsed, new_paths)

    def check_peer_read(self, caller: str, command: str, params: dict[str, Any]) -> None:
        """A peer credential reads only the replica tables of its own replicas, and only with
        ``lookup_rows``/``select_rows`` (what a meta-cluster needs to serve reads of its replicated
        tables from an in-sync replica, :meth:`_from_replica`) and ``get`` of such a table or its
        attributes (what a bootstrap copy's reader plans with: schema, tablets, pivot keys)."""
        if command == "get":
            node, _ = self.tables.resolve(params.get("path"))
            if node.table is None:
                raise YtError(f"Cluster {caller} may not read {node.path}: a peer credential reads only replica "
                              "tables", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                              attributes={"cluster_name": caller, "path": node.path})
            path: Any = node.path
        elif command == "lookup_rows":
            path = params.get("path")
        elif command == "select_rows":
            query = params.get("query")
            paths = parse_query(query).table_paths if isinstance(query, str) else ()
            for other in paths[1:]:  # every table a join reads must be such a replica table too
                self.check_peer_read(caller, "lookup_rows", {"path": other})
            path = paths[0] if paths else None
        else:
            path = None
        if not isinstance(path, str):
            raise YtError(f"Cluster {caller} may not run {command} here: a peer credential reads only replica "
                          "tables, with get, lookup_rows and select_rows", code=ErrorCode.AUTHORIZATION_ERROR,
                          http_status=403, attributes={"cluster_name": caller})
        table, table_path, _ = self.tables.table(path)
        upstream = table.upstream_replica_id
        if upstream is None or not made_by(upstream, caller):
            raise YtError(f"Cluster {caller} may not read table {table_path}: it is not a replica table of "
                          f"a replica on cluster {caller}", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"cluster_name": caller, "path": table_path})

    def _from_replica(self, replica: Any, read: Any) -> Any:
        """Serve a read of a replicated table from its in-sync replica (seed 002, "Reading data")."""
        try:
            return read(self.peers.public_client(replica.cluster_name))
        except YtError as exc:
            raise YtError(f"Cannot read replicated table {replica.table_path} from its sync replica "
                          f"{replica.cluster_name}:{replica.replica_path}: {exc.message}", code=exc.code,
                          attributes={"replica_id": replica.id}, inner_errors=[exc]) from None
