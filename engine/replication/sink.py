"""The replica side: tables fed by another cluster's replicated table, exactly once.

A replica table (``upstream_replica_id`` set) accepts writes only from its replica's replicator
and from the sync commits of its meta-cluster. Both record how far they got in
``_rt_replica_sink``: ``(upstream_replica_id, meta tablet) -> (row index, timestamp)``, written
in the *same* SQL transaction as the rows. A replicator batch carries the row index it starts at
(``prev_row_index``) and is applied only if the record still says so; otherwise the answer is the
stored index. So a batch retried after a lost answer or a crash is recognised, a batch that would
leave a gap is refused, and every change arrives once and in order. The replicator (meta side)
learns the truth from the answer and continues from there.

The ``/internal/v1`` handlers here are ``prepare``/``commit``/``abort`` of sync writes, ``push``
of replicator batches and ``table_info`` (what ``alter_table_replica --enable`` inspects).

Everything a peer sends is input, checked like a client's before anything changes: the rows
against the *replica* table's schema exactly as ``insert_rows``/``delete_rows`` check them (types,
unknown and missing key columns, null keys, the row weight limit), the change kinds (an ordered
table only takes writes), row and tablet indexes, the size of a batch, and every timestamp (in
range, at most ``max_peer_clock_skew`` ahead of this clock: ``TimestampProvider.check``). A
refused request changes nothing: no row, no sink record, no prepare record. One subtlety: an
``any`` value travels as the YSON text the meta-cluster stored, so it is parsed (and must parse)
before the schema check turns it back into the stored text. A prepare must name a coordinator
this cluster knows (``//sys/clusters``): an unknown one could never be asked for its decision.

And who sends it is checked first (``caller``, the cluster named by the peer credential the HTTP
layer verified, ``engine/credentials.py``): a push, a prepare or ``table_info`` for a replica table
only from the meta-cluster whose cell tag its ``upstream_replica_id`` carries, a prepare naming its
caller as coordinator, a commit or abort only from the transaction's coordinator.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson
import sqlalchemy as sa

from .. import yson_util
from ..config import DEFAULT_CONFIG, EngineConfig
from ..credentials import NO_CELL_TAG, cell_tag, id_cell_tag, made_by
from ..errors import ErrorCode, SchemaViolation, YtError
from ..peers import Peers
from ..schema import MAX_ROW_WEIGHT, ColumnType, columns_clean, row_weight, validate_row, validate_rows
from ..storage import FastStatement, on_commit, on_rollback, replica_sink_table
from ..tablets import (
    WRITE_KINDS,
    DynamicTable,
    ImageRun,
    RowWrite,
    WriteKind,
    columns_well_formed,
    decode_writes,
    validate_key_not_null,
)
from .host import ReplicationHost
from .options import UPSTREAM_TABLE_ATTRIBUTE

_READ_SINK = FastStatement.select(replica_sink_table, ("row_index", "timestamp"), "upstream_replica_id", "tablet_index")
_UPDATE_SINK = FastStatement.update(replica_sink_table, "upstream_replica_id", "tablet_index")
_INSERT_SINK = FastStatement.insert(replica_sink_table)

#: the largest tablet index a peer may name: far above any table's tablet count (reshard allows
#: 10,000), low enough to keep the sink records bounded
MAX_PEER_TABLET_INDEX = 100_000
#: row indexes are SQL integers
MAX_ROW_INDEX = (1 << 63) - 1
#: ids and names a peer sends (transaction ids are 64 characters at most in their SQL record)
MAX_TRANSACTION_ID_LENGTH = 64
MAX_NAME_LENGTH = 1000
#: heartbeats one request may carry (a meta-cluster's sweep sends at most HEARTBEATS_PER_REQUEST,
#: heartbeats.py), and recorded in one write transaction (short, so that commits do not wait long)
MAX_HEARTBEATS = 10_000
HEARTBEATS_PER_TRANSACTION = 256


def _restore_attribute(attributes: dict[str, Any], name: str, previous: Any) -> None:
    if previous is None:
        attributes.pop(name, None)
    else:
        attributes[name] = previous


def bad_request(message: str, **attributes: Any) -> YtError:
    return YtError(message, code=ErrorCode.PROTOCOL_ERROR, attributes=attributes)


def int_field(body: dict[str, Any], name: str, what: str, high: int = MAX_ROW_INDEX) -> int:
    """A non-negative integer field of a peer's request, at most ``high``."""
    if name not in body:
        raise bad_request(f"Internal request {what} misses field {name!r}")
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise bad_request(f"Invalid {name} {str(value)[:100]!r} in internal request {what}: expected an integer "
                   f"in [0, {high}]", field=name)
    return value


def str_field(body: dict[str, Any], name: str, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """A non-empty string field of a peer's request, at most ``max_length`` characters."""
    if name not in body:
        raise bad_request(f"Internal request {what} misses field {name!r}")
    value = body[name]
    if not isinstance(value, str) or not 0 < len(value) <= max_length:
        raise bad_request(f"Invalid {name} {str(value)[:100]!r} in internal request {what}: expected a string of "
                   f"1 to {max_length} characters", field=name)
    return value


#: the kinds of change a replication batch carries, by their names on the wire (never a lock)
_PUSH_KINDS = {name: kind for name, kind in WRITE_KINDS.items() if kind is not WriteKind.LOCK}


def _data_bytes(row: dict[str, Any]) -> int:
    """Bytes of a validated row's values, as a batch's size is counted (a string by its length)."""
    return sum(len(v) if type(v) is str else 8 for v in row.values())


def read_sink(conn: sa.Connection, replica_id: str, tablet: int) -> tuple[int, int] | None:
    """The stored (row index, timestamp) of a replica's tablet on this cluster, if any."""
    row = _READ_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet).fetchone()
    return None if row is None else (row[0], row[1])


def advance_sink(conn: sa.Connection, replica_id: str, tablet: int, row_index: int, ts: int) -> None:
    """Move the record forward (never back), inside the transaction that applies the rows."""
    current = read_sink(conn, replica_id, tablet)
    if current is None:
        _INSERT_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet, row_index=row_index,
                         timestamp=ts)
    elif row_index > current[0] or ts > current[1]:
        _UPDATE_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=tablet,
                         row_index=max(row_index, current[0]), timestamp=max(ts, current[1]))


#: the sink record (replica, TABLET_COUNT_RECORD) holds the meta table's tablet count in row_index
#: and the layout revision it belongs to in timestamp (0: not told)
TABLET_COUNT_RECORD = -1


def set_upstream_tablet_count(conn: sa.Connection, replica_id: str, count: int, revision: int | None = None,
                              known: tuple[int, int] | None = None) -> tuple[int, int]:
    """Remember how many tablets the meta table has (their records make the replica's freshness);
    records of tablets a reshard removed stop counting. Returns the record as it is then.

    ``revision`` is the meta table's layout revision (``DynamicTable.layout_revision``; None from a
    meta-cluster that does not send it): a count of an older revision than the record's is one a
    push that arrived late carries, and is ignored. ``known`` is the record as the caller knows it
    to be (it is read when None)."""
    current = known if known is not None else read_sink(conn, replica_id, TABLET_COUNT_RECORD)
    if current is None:
        _INSERT_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=TABLET_COUNT_RECORD,
                         row_index=count, timestamp=revision or 0)
        return count, revision or 0
    stored_count, stored_revision = current
    if revision is None:
        revision = stored_revision
    if revision < stored_revision or (revision, count) == (stored_revision, stored_count):
        return current
    _UPDATE_SINK.run(conn, upstream_replica_id=replica_id, tablet_index=TABLET_COUNT_RECORD,
                     row_index=count, timestamp=revision)
    return count, revision


def replica_freshness(conn: sa.Connection, replica_id: str) -> int:
    """The newest timestamp up to which a replica table surely has every change of its upstream
    replica: one below the least recorded timestamp over the meta table's tablets (a recorded
    timestamp may be a commit only partly applied: a batch can end inside a commit). 0 while a
    tablet has no record, or the tablet count is not known yet (the first push tells it: every push
    and heartbeat carries it, so a push of a tablet after a reshard counts the reshard's tablets)."""
    rows = conn.execute(sa.select(replica_sink_table.c.tablet_index, replica_sink_table.c.row_index,
                                  replica_sink_table.c.timestamp).where(
        replica_sink_table.c.upstream_replica_id == replica_id)).all()
    by_tablet = {int(r[0]): (int(r[1]), int(r[2])) for r in rows}
    count = by_tablet.pop(TABLET_COUNT_RECORD, None)
    if count is None:
        return 0
    stamps = [by_tablet[t][1] if t in by_tablet else 0 for t in range(count[0])]
    return max(0, min(stamps, default=0) - 1)


class ReplicaSink:
    """Answers the meta-cluster's calls on a replica cluster."""

    def __init__(self, host: ReplicationHost, peers: Peers | None = None,
                 config: EngineConfig = DEFAULT_CONFIG) -> None:
        self.host = host
        #: the cluster directory: a prepare's coordinator must be in it (None: a test's sink
        #: without a directory accepts every coordinator)
        self.peers = peers
        self.config = config
        #: upstream replica -> its committed TABLET_COUNT_RECORD (count, layout revision), once read or
        #: written: a push that tells what the record holds needs no statement. Read and changed only
        #: under Storage.write_lock (in a push's write transaction and its on_commit hook); nothing but
        #: ``handle_push`` writes the record
        self._tablet_counts: dict[str, tuple[int, int]] = {}
        #: upstream replica -> when (monotonic) its table's freshness was last read here. Single dict
        #: operations from request threads, atomic in CPython: no lock (a lost race only moves one
        #: time by one read)
        self._freshness_reads: dict[str, float] = {}

    def replica_table(self, path: object, replica_id: str, preserve: bool = True) -> tuple[DynamicTable, str]:
        """The table a peer's push, prepare or bootstrap write for replica ``replica_id`` goes to.

        A replica table (``preserve``) names the replica in its ``upstream_replica_id``. A table
        without one takes the rows of a replica with ``preserve_timestamps`` false, as this cluster's
        own writes: only while the cluster takes writes. Never a system table (``//sys``: the
        directory, the conflict log) and never an XDCR table, whose changes come only from its group
        (``xdcr_apply``) and would be shipped to the whole group as this cluster's own."""
        if not isinstance(path, str):
            raise bad_request(f"Invalid replica_path {str(path)[:100]!r}: expected a string", field="replica_path")
        table, table_path, _ = self.host.resolve_table(path)
        self.check_replication_target(table, table_path, replica_id)
        expected = replica_id if preserve else None
        if table.upstream_replica_id != expected:
            raise YtError(f"Table {table_path} does not accept writes of replica {replica_id}: its "
                          f"upstream_replica_id is {table.upstream_replica_id!r}",
                          code=ErrorCode.UPSTREAM_REPLICA_MISMATCH, attributes={"path": table_path})
        if not preserve:
            self.host.check_accepts_writes(table_path)
        return table, table_path

    def check_replication_target(self, table: DynamicTable, path: str, replica_id: str | None = None) -> None:
        """Refuse a system table or an XDCR table as the target of replication (see ``replica_table``)."""
        if path == "//sys" or path.startswith("//sys/"):
            raise YtError(f"Table {path} is a system table of cluster {self.host.name}: no replica writes or "
                          "inspects it", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"path": path, **({"replica_id": replica_id} if replica_id else {})})
        if table.xdcr_cluster_id is not None:
            raise YtError(f"Table {path} of cluster {self.host.name} is an XDCR table: only the members of its "
                          "group change it (XDCR), never a replica", code=ErrorCode.AUTHORIZATION_ERROR,
                          http_status=403,
                          attributes={"path": path, **({"replica_id": replica_id} if replica_id else {})})

    def check_caller(self, caller: str | None, replica_id: str, what: str, path: str) -> None:
        """Only a replica's meta-cluster may write it: the cell tag of the replica's id (made by
        its meta-cluster, see engine/credentials.py) must be the calling cluster's. ``caller``
        None is an in-process call (no HTTP, nothing to authenticate)."""
        if caller is None:
            return
        if not made_by(replica_id, caller):
            tag = id_cell_tag(replica_id)
            owner = ("was made before cell tags and names no meta-cluster (re-create the replica)"
                     if tag == NO_CELL_TAG else f"belongs to the cluster with cell tag {tag:#x}")
            raise YtError(f"Cluster {caller} may not write table {path} as replica {replica_id} ({what}): "
                          f"the replica {owner}, not to cluster {caller} (cell tag {cell_tag(caller):#x})",
                          code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"path": path, "replica_id": replica_id, "cluster_name": caller})

    def table_info(self, path: Any, caller: str | None) -> dict[str, Any]:
        if not isinstance(path, str):
            raise bad_request(f"Invalid path {str(path)[:100]!r}: expected a string", field="path")
        table, table_path, _ = self.host.resolve_table(path)
        if caller is not None:
            # what a meta-cluster inspects before enabling a replica: its replica tables, or a plain
            # table of this cluster for a replica without preserve_timestamps; nothing else
            self.check_replication_target(table, table_path)
        if table.upstream_replica_id:
            self.check_caller(caller, table.upstream_replica_id, "table_info", table_path)
        return {"sorted": table.sorted, "key_columns": table.schema.key_names,
                "columns": [{"name": c.name, "type": c.type.value} for c in table.schema.columns],
                "upstream_replica_id": table.upstream_replica_id, "tablet_state": table.state.value,
                "atomicity": table.atomicity}

    def prepare_may_wait(self, body: dict[str, Any]) -> bool:
        """Whether a prepare may wait for the decision on an earlier transaction (which arrives as
        another request: such a prepare must not hold the event loop)."""
        path = body.get("replica_path")
        if not isinstance(path, str):
            return False  # refused by the handler
        try:
            table, _, _ = self.host.resolve_table(path)
        except YtError:
            return False
        return self.host.transactions.has_remote_prepared(table.table_id)

    # -- checks of what a peer sends ---------------------------------------------------------------------

    def check_writes(self, table: DynamicTable, path: str, writes: list[RowWrite], what: str) -> None:
        """Check rows received from a peer against the replica table's schema, as a client's.

        Writes are checked as ``insert_rows`` checks its rows, deletes and locks as the keys of
        ``delete_rows``/``lock_rows``; each row is replaced by its checked form. An ordered table
        takes only writes. The batch's size (rows and bytes) is bounded."""
        schema = table.schema
        if not table.sorted:
            for w in writes:
                if w.kind is not WriteKind.WRITE:
                    raise YtError(f"Cannot apply a {w.kind.value} change to ordered table {path} ({what}): "
                                  "ordered tables take only writes", code=ErrorCode.TABLE_MUST_BE_SORTED,
                                  attributes={"path": path})
        any_columns = [c.name for c in schema.columns if c.type is ColumnType.ANY]
        full = [w for w in writes if w.kind is WriteKind.WRITE]
        if any_columns:
            for w in full:
                if isinstance(w.row, dict):
                    self._parse_any(w.row, any_columns, path)
        checked = validate_rows(schema, [w.row for w in full], path, keys_not_null=table.sorted)
        exact = not self._surely_within_bounds(checked)
        total = 0
        for w, row in zip(full, checked, strict=True):
            w.row = row
            if not exact:
                continue
            size = _data_bytes(row)
            # (the weight is at most 4 bytes a character and 64 a column more: most rows skip it)
            if size * 4 + 64 * len(row) > MAX_ROW_WEIGHT and row_weight(row) > MAX_ROW_WEIGHT:
                raise YtError(f"Row of table {path} is too large: its weight exceeds {MAX_ROW_WEIGHT} bytes",
                              code=ErrorCode.ROW_WEIGHT_LIMIT_EXCEEDED, attributes={"path": path})
            total += size
            w.row = row
        for w in writes:
            if w.kind is not WriteKind.WRITE:
                key_row = validate_row(schema, w.row, path, key_only=True)
                validate_key_not_null(schema, key_row, path)
                w.row = key_row
        if total > self.config.max_peer_batch_bytes:
            raise YtError(f"Cannot apply {what} to table {path}: its rows hold {total} bytes, more than the "
                          f"{self.config.max_peer_batch_bytes} bytes allowed (max_peer_batch_bytes)",
                          code=ErrorCode.PROTOCOL_ERROR, attributes={"path": path}, http_status=413)

    def _surely_within_bounds(self, rows: list[dict[str, Any]]) -> bool:
        """Whether no row of a batch can be too heavy and the batch not too big, told without a
        Python pass over every value (the exact count costs as much as the schema check).

        One orjson encoding bounds the bytes from above: a string counts at most its JSON length,
        any other value 8 bytes. Only when the bound is not enough does the exact count run."""
        if not rows:
            return True
        try:
            encoded = len(orjson.dumps(rows))
        except TypeError:
            return False  # values JSON cannot carry (they are counted exactly)
        bound = encoded + 8 * sum(map(len, rows))
        if bound > self.config.max_peer_batch_bytes:
            return False
        widest = max(map(len, rows))
        if bound * 4 + 64 * widest <= MAX_ROW_WEIGHT:
            return True
        # a batch too big for its whole bound to bound one row (a lagging replica's 90,000 rows):
        # each row by its own encoding, still in C (half the cost of the exact count)
        heaviest = max(map(len, map(orjson.dumps, rows)))
        return (heaviest + 8 * widest) * 4 + 64 * widest <= MAX_ROW_WEIGHT

    def check_column_writes(self, table: DynamicTable, path: str, writes: list[RowWrite], names: list[str],
                            values: list[list[Any]], what: str) -> bool:
        """:meth:`check_writes` for whole-row writes that arrived as columns (``names``, ``values``):
        a column at a time (``columns_clean``) when that passes them whole and within the batch
        bound (True: the writes are the values as they came), else row by row, with its precise
        errors and conversions (False: the writes may hold converted values)."""
        size = columns_clean(table.schema, names, values, keys_not_null=table.sorted)
        if size is None or size > self.config.max_peer_batch_bytes:
            self.check_writes(table, path, writes, what)
            return False
        return True

    def parse_columnar(self, table: DynamicTable, path: str, columnar: Any, what: str, preserve: bool,
                       max_rows: int) -> tuple[list[tuple[int, list[RowWrite] | ImageRun]], list[RowWrite]]:
        """The changes of a push in the columnar form (``replicator.render_columns``): whole-row
        writes as ``{"columns": [names], "values": [[a list per column]], "commits": [[timestamp,
        count], ...]}``, checked as :meth:`check_writes` checks the rows of ``entries`` and
        grouped by commit. The schema check runs a column at a time (``columns_clean``); a batch
        that check cannot pass whole (a value to convert, an error to name precisely) goes row
        by row through :meth:`check_writes`, with the same results and errors as ``entries``."""
        if type(columnar) is not dict:
            raise bad_request(f"Invalid columnar in internal request {what}: expected a map", field="columnar")
        names, values, commits = columnar.get("columns"), columnar.get("values"), columnar.get("commits")
        if type(names) is not list or type(values) is not list or len(names) != len(values) or \
                not all(type(n) is str for n in names) or len(set(names)) != len(names):
            raise bad_request(f"Invalid columnar in internal request {what}: expected as many distinct column names "
                              "as lists of values", field="columnar")
        if type(commits) is not list or not commits:
            raise bad_request(f"Invalid commits in internal request {what}: expected a non-empty list of "
                              "[timestamp, count]", field="commits")
        stamps: list[int] = []
        counts: list[int] = []
        for i, commit in enumerate(commits):
            if type(commit) is not list or len(commit) != 2 or type(commit[1]) is not int or commit[1] < 1:
                raise bad_request(f"Invalid commit {i} in internal request {what}: expected [timestamp, count] "
                                  "with a positive count", field="commits")
            ts = self.check_timestamp(commit[0], f"timestamp of commit {i} of a {what}", preserve)
            if stamps and ts <= stamps[-1]:
                raise bad_request(f"Invalid commit {i} in internal request {what}: its timestamp {ts:#x} is not "
                                  f"after that of the commit before it ({stamps[-1]:#x}); a batch is in commit order")
            stamps.append(ts)
            counts.append(commit[1])
        rows = sum(counts)
        if rows > max_rows or any(type(column) is not list or len(column) != rows for column in values):
            raise bad_request(f"Invalid columnar in internal request {what}: {rows} changes in its commits, more than "
                              f"the batch's {max_rows} rows or not the length of every column", field="columnar")
        if table.takes_images and names:
            size = columns_clean(table.schema, names, values, keys_not_null=True)
            if size is not None and size <= self.config.max_peer_batch_bytes:
                # every value as it came: the table applies the images, no row dict or write per row
                return self._image_runs(table, names, values, stamps, counts), []
        # the rows as the entries' form would make them, one C pass (a name per column of each)
        made = list(map(dict, map(zip, repeat(names), zip(*values, strict=True)))) if names else \
            [{} for _ in range(rows)]
        write = WriteKind.WRITE
        if table.sorted:
            writes = list(map(RowWrite, repeat(write), made, repeat(table.schema.full_lock_mask)))
        else:
            writes = list(map(RowWrite, repeat(write), made, repeat(1)))
        self.check_column_writes(table, path, writes, names, values, what)
        groups: list[tuple[int, list[RowWrite] | ImageRun]] = []
        first = 0
        for ts, count in zip(stamps, counts, strict=True):
            groups.append((ts, writes[first:first + count]))
            first += count
        return groups, writes

    @staticmethod
    def _image_runs(table: DynamicTable, names: list[str], values: list[list[Any]], stamps: list[int],
                    counts: list[int]) -> list[tuple[int, list[RowWrite] | ImageRun]]:
        """Checked columns as one :class:`ImageRun` per commit (a column not named is null in every row)."""
        keys, images, columns = _images_of_columns(table, names, values)
        mask = table.schema.full_lock_mask
        groups: list[tuple[int, list[RowWrite] | ImageRun]] = []
        first = 0
        for ts, count in zip(stamps, counts, strict=True):
            groups.append((ts, ImageRun(keys[first:first + count], images[first:first + count], mask, columns)))
            first += count
        return groups

    def _prepare_images(self, table: DynamicTable, body: dict[str, Any]) -> ImageRun | None:
        """A prepare's writes as an :class:`ImageRun` when they are whole rows of a sorted table that
        the column check passes as they came (as a push's columns, :meth:`parse_columnar`); None
        for anything else, which is decoded and checked write by write, with its precise errors."""
        if not table.takes_images or "writes" in body or "rows" in body:
            return None
        names: Any = body.get("columns")
        values: Any = body.get("values")
        if body.get("kind", "write") != "write" or any(body.get(flag, False) is not False
                                                      for flag in ("update", "shared", "strong")):
            return None
        if not columns_well_formed(names, values) or not values[0]:
            return None
        mask = body.get("mask", 1)
        if type(mask) is not int:
            return None
        size = columns_clean(table.schema, names, values, keys_not_null=True)
        if size is None or size > self.config.max_peer_batch_bytes:
            return None
        keys, images, columns = _images_of_columns(table, names, values)
        return ImageRun(keys, images, table.schema.full_lock_mask, columns)  # (this table's lock groups)

    @staticmethod
    def _parse_any(row: dict[str, Any], names: list[str], path: str) -> None:
        """``any`` values arrive as the YSON text the meta-cluster stored: parse them back, so that
        the schema check stores them as this cluster's own writes would be."""
        for name in names:
            value = row.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise SchemaViolation(f"Value of column {name!r} of table {path} must arrive as YSON text, "
                                      f"got {yson_util.type_name(value)}", attributes={"column": name, "path": path})
            try:
                row[name] = yson_util.loads_text(value)
            except Exception as exc:  # noqa: BLE001 - the YSON parser raises several types
                raise SchemaViolation(f"Value of column {name!r} of table {path} is not valid YSON: "
                                      f"{str(exc)[:200]}", attributes={"column": name, "path": path}) from None

    def check_timestamp(self, ts: object, what: str, ahead: bool = True) -> int:
        """A timestamp from a peer: in range, and (``ahead``) not past ``max_peer_clock_skew``."""
        return self.host.timestamps.check(ts, what, self.config.max_peer_clock_skew if ahead else math.inf)

    # -- sync writes ---------------------------------------------------------------------------------

    def handle_prepare(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        tx_id = str_field(body, "transaction_id", "prepare", MAX_TRANSACTION_ID_LENGTH)
        what = f"prepare of transaction {tx_id}"
        coordinator = str_field(body, "coordinator", what)
        replica_id = str_field(body, "replica_id", what)
        if caller is not None and coordinator != caller:
            raise YtError(f"Cluster {caller} may not prepare transaction {tx_id} in the name of coordinator "
                          f"{coordinator}", code=ErrorCode.AUTHORIZATION_ERROR, http_status=403,
                          attributes={"transaction_id": tx_id, "cluster_name": caller})
        tablet_index = int_field(body, "tablet_index", what, MAX_PEER_TABLET_INDEX)
        start_ts = self.check_timestamp(body.get("start_timestamp"), f"start timestamp of transaction {tx_id}")
        prepare_ts = self.check_timestamp(body.get("prepare_timestamp"), f"prepare timestamp of transaction {tx_id}")
        table, path = self.replica_table(body.get("replica_path"), replica_id)
        self.check_caller(caller, replica_id, what, path)
        if self.peers is not None and not self.peers.known(coordinator):
            # its decision could never be asked for: the prepare would hold rows and reads forever
            raise YtError(f"Cannot prepare transaction {tx_id} for table {path}: its coordinator, cluster "
                          f"{coordinator}, is not in //sys/clusters of cluster {self.host.name}",
                          code=ErrorCode.RESOLVE_ERROR, attributes={"transaction_id": tx_id,
                                                                    "cluster_name": coordinator, "path": path})
        for flag in ("update", "shared", "strong"):
            value = body.get(flag, False)
            if not (isinstance(value, bool) or isinstance(value, list) and all(isinstance(v, bool) for v in value)):
                raise bad_request(f"Malformed writes in {what}: {flag} must be a boolean or a list of booleans",
                                  field=flag)
        run = self._prepare_images(table, body)
        if run is not None:
            # whole rows of a sorted table, checked as they came: prepared and applied as images
            if len(run) > self.config.max_rows_per_transaction:
                raise YtError(f"Cannot prepare transaction {tx_id} for table {path}: {len(run)} rows, more than "
                              f"the {self.config.max_rows_per_transaction} a transaction may write",
                              code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION, attributes={"path": path})
            self.host.transactions.prepare_participant(
                tx_id, coordinator, table, path, run, start_ts, prepare_ts,
                {"upstream_replica_id": replica_id, "meta_tablet_index": tablet_index},
                participant=f"{table.table_id}/{replica_id}/{tablet_index}",
                encoded={"columns": body["columns"], "values": body["values"], "kind": "write", "update": False,
                         "shared": False, "strong": False, "mask": run.mask})
            return self.host.transactions.participant_durability()
        try:
            writes = decode_writes(body)
        except YtError as exc:
            raise bad_request(f"Malformed writes in {what}: {exc.message}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad_request(f"Malformed writes in {what}: {type(exc).__name__}: {str(exc)[:200]}") from None
        if len(writes) > self.config.max_rows_per_transaction:
            raise YtError(f"Cannot prepare transaction {tx_id} for table {path}: {len(writes)} rows, more than "
                          f"the {self.config.max_rows_per_transaction} a transaction may write",
                          code=ErrorCode.TOO_MANY_ROWS_IN_TRANSACTION, attributes={"path": path})
        #: the prepared record's writes as received, when they passed the check as they are: the
        #: record is then not encoded again from the writes (about a fifth of a 10,000-row prepare's work)
        received: dict[str, Any] | None = None
        if "columns" in body and body.get("kind", "write") == "write" and body.get("update", False) is False:
            # whole-row writes as columns (``encode_writes``)
            if self.check_column_writes(table, path, writes, body["columns"], body["values"], what):
                received = {"columns": body["columns"], "values": body["values"], "kind": "write",
                            "update": False, "shared": body.get("shared", False), "strong": body.get("strong", False),
                            "mask": body.get("mask", 1)}
        else:
            self.check_writes(table, path, writes, what)
        if table.sorted:
            # this table's lock groups, not the meta's
            full_mask, write_kind = table.schema.full_lock_mask, WriteKind.WRITE
            for w in writes:
                w.mask = (table.schema.lock_mask(list(w.row)) if w.update else full_mask) \
                    if w.kind is write_kind else 1
            if received is not None:
                received["mask"] = full_mask  # (every write a whole-row write)
        transactions = self.host.transactions
        transactions.prepare_participant(
            tx_id, coordinator, table, path, writes, start_ts, prepare_ts,
            {"upstream_replica_id": replica_id,
             # (no null: a null in a record makes its encoding look for NaNs)
             **({} if table.sorted else {"tablet_index": tablet_index % table.tablet_count}),
             "meta_tablet_index": tablet_index},
            participant=f"{table.table_id}/{replica_id}/{tablet_index}", encoded=received)
        # (the coordinator learns which of its relaxed commits here this durable prepare covered)
        return transactions.participant_durability()

    def handle_commit(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """Apply a coordinator's decision; ``relaxed``: without an fsync on SQLite storage (see
        ``transactions/participant.py``). The answer says which relaxed commits here are durable and,
        for a relaxed one, its ``sequence``."""
        tx_id = str_field(body, "transaction_id", "commit", MAX_TRANSACTION_ID_LENGTH)
        what = f"commit of transaction {tx_id}"
        commit_ts = self.check_timestamp(body.get("commit_timestamp"), f"commit timestamp of transaction {tx_id}")
        raw_progress = body.get("progress", [])
        if not isinstance(raw_progress, list) or not all(isinstance(p, dict) for p in raw_progress):
            raise bad_request(f"Invalid progress in internal request {what}: expected a list of maps", field="progress")
        progress = {(str_field(p, "replica_id", what), int_field(p, "tablet_index", what, MAX_PEER_TABLET_INDEX)):
                    int_field(p, "row_index", what) for p in raw_progress}

        def advance(conn: sa.Connection, _table: DynamicTable, extra: dict[str, Any]) -> None:
            row_index = progress.get((extra["upstream_replica_id"], int(extra["meta_tablet_index"])))
            if row_index is not None:
                advance_sink(conn, extra["upstream_replica_id"], extra["meta_tablet_index"], row_index,
                             int(extra["commit_timestamp"]))

        relaxed = body.get("relaxed", False)
        if not isinstance(relaxed, bool):
            raise bad_request(f"Invalid relaxed in internal request {what}: expected a boolean", field="relaxed")
        transactions = self.host.transactions
        sequence = transactions.commit_participant(tx_id, commit_ts, advance, coordinator=caller, relaxed=relaxed)
        answer = transactions.participant_durability()
        if sequence is not None:
            answer["sequence"] = sequence
        return answer

    def handle_abort(self, body: dict[str, Any], caller: str | None) -> None:
        self.host.transactions.abort_participant(
            str_field(body, "transaction_id", "abort", MAX_TRANSACTION_ID_LENGTH), coordinator=caller)

    # -- replicator batches -------------------------------------------------------------------------

    def handle_push(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """Apply one replicator batch exactly once; answer with the stored progress. A body with
        ``heartbeats`` carries the heartbeats of many replicas instead (:meth:`handle_heartbeats`)."""
        if "heartbeats" in body:
            return self.handle_heartbeats(body, caller)
        push = self.parse_push(body, caller)
        return self.host.transactions.apply_replicated(
            push.table, push.groups, push.preserve, push.tablet % push.table.tablet_count,
            check=lambda conn: read_sink(conn, push.replica_id, push.tablet),
            expected=push.prev, record=push.record, end=push.end)

    def parse_push(self, body: dict[str, Any], caller: str | None, what_kind: str = "push") -> _Push:
        """A push (a batch, or a heartbeat: no entries) checked whole, as it will be applied."""
        replica_id = str_field(body, "upstream_replica_id", what_kind)
        what = f"{what_kind} of replica {replica_id}"
        preserve = body.get("preserve_timestamps", True)
        if not isinstance(preserve, bool):
            raise bad_request(f"Invalid preserve_timestamps {str(preserve)[:100]!r} in internal request {what}: "
                       "expected a boolean", field="preserve_timestamps")
        table, path = self.replica_table(body.get("replica_path"), replica_id, preserve)
        self.check_caller(caller, replica_id, what, path)
        tablet = int_field(body, "tablet_index", what, MAX_PEER_TABLET_INDEX)
        prev, end = int_field(body, "prev_row_index", what), int_field(body, "row_index", what)
        columnar = body.get("columnar")
        entries = body.get("entries") if columnar is None else []
        if not isinstance(entries, list):
            raise bad_request(f"Invalid entries in internal request {what}: expected a list", field="entries")
        limit = self.config.max_peer_batch_rows
        if prev > end or end - prev > limit or len(entries) > end - prev:
            raise bad_request(f"Invalid batch in internal request {what}: rows [{prev}, {end}) with {len(entries)} "
                       f"changes (a batch covers at most {limit} rows, max_peer_batch_rows, and carries at most "
                       "one change per row)", prev_row_index=prev, row_index=end, path=path)
        groups: list[tuple[int, list[RowWrite] | ImageRun]] = []
        writes: list[RowWrite] = []
        kinds = _PUSH_KINDS
        last_ts = 0
        group: list[RowWrite] | None = None
        # (up to 100,000 changes: names bound locally, exact types compared where a subclass is no use)
        for i, entry in enumerate(entries):
            if type(entry) is not dict:
                raise bad_request(f"Invalid change {i} in internal request {what}: expected a map")
            ts = entry.get("timestamp")
            if ts != last_ts or type(ts) is not int:  # (the changes of one commit share it: checked once)
                ts = self.check_timestamp(ts, f"timestamp of change {i} of a {what}", preserve)
            if ts < last_ts:
                raise bad_request(f"Invalid change {i} in internal request {what}: its timestamp {ts:#x} is before "
                                  f"that of the change before it ({last_ts:#x}); a batch is in commit order")
            raw_kind = entry.get("kind")
            kind = kinds.get(raw_kind) if type(raw_kind) is str else None
            if kind is None:  # (a lock is no change a batch carries)
                raise bad_request(f"Unknown change kind {str(entry.get('kind'))[:100]!r} in a replication batch "
                           f"({what})")
            payload = entry.get("payload")
            if type(payload) is str:
                try:
                    payload = json.loads(payload)
                except ValueError as exc:
                    raise bad_request(f"Malformed payload of change {i} in internal request {what}: {exc}") from None
            if type(payload) is not dict or "row" not in payload:
                raise bad_request(f"Malformed payload of change {i} in internal request {what}: expected a map with "
                           "a row")
            update = payload.get("update", False)
            if update is not False and update is not True:
                raise bad_request(f"Malformed payload of change {i} in internal request {what}: update must be "
                                  "a boolean")
            if ts != last_ts or group is None:
                last_ts, group = ts, []
                groups.append((ts, group))
            write = RowWrite(kind, payload["row"], 1, update)
            group.append(write)
            writes.append(write)
        if columnar is not None:
            groups, writes = self.parse_columnar(table, path, columnar, what, preserve, end - prev)
        else:
            self.check_writes(table, path, writes, what)
        if table.sorted and columnar is None:  # (the columnar form's writes are whole rows, masked)
            full_mask, write_kind = table.schema.full_lock_mask, WriteKind.WRITE
            for w in writes:
                if w.kind is write_kind:
                    w.mask = table.schema.lock_mask(list(w.row)) if w.update else full_mask
        # a heartbeat (no entries): the meta-cluster has nothing of this tablet before this timestamp
        # that the replica lacks; recorded like a batch, so the replica knows how fresh it is
        barrier = 0
        if "barrier_timestamp" in body:
            barrier = self.check_timestamp(body["barrier_timestamp"], f"barrier timestamp of a {what}")
        tablet_count = int_field(body, "tablet_count", what, MAX_PEER_TABLET_INDEX) if "tablet_count" in body \
            else None
        revision = int_field(body, "layout_revision", what) if "layout_revision" in body else None
        # the replicated table's id: its stream's tokens compare with this replica's reads
        upstream_table = str_field(body, "table_id", what, MAX_TRANSACTION_ID_LENGTH) if "table_id" in body \
            else None
        node = self.host.cypress.by_id.get(table.table_id) if preserve else None

        def record(conn: sa.Connection, newest_ts: int) -> None:
            advance_sink(conn, replica_id, tablet, end, max(newest_ts, barrier))
            if tablet_count is not None:
                # every push tells the count (a heartbeat's alone would miss a busy tablet's reshard);
                # the record is read only when this sink does not know it yet
                known = self._tablet_counts.get(replica_id)
                stored = set_upstream_tablet_count(conn, replica_id, tablet_count, revision, known)
                if stored != known:
                    on_commit(conn, lambda: self._tablet_counts.__setitem__(replica_id, stored))
            if upstream_table is not None and node is not None \
                    and node.attributes.get(UPSTREAM_TABLE_ATTRIBUTE) != upstream_table:
                previous = node.attributes.get(UPSTREAM_TABLE_ATTRIBUTE)
                node.attributes[UPSTREAM_TABLE_ATTRIBUTE] = upstream_table
                self.host.cypress.save(conn, node)
                on_rollback(conn, lambda: _restore_attribute(node.attributes, UPSTREAM_TABLE_ATTRIBUTE, previous))

        return _Push(table, replica_id, preserve, tablet, prev, end, groups, record)

    # -- heartbeats of many replicas at once --------------------------------------------------------

    def handle_heartbeats(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """The heartbeats a meta-cluster's sweep sends this cluster (``heartbeats.py``): each one an
        empty push with a barrier timestamp, checked as a push, recorded as one (only while the
        record holds its row index), a few hundred to a write transaction. Each answer says when the
        replica table's freshness was last read here (``freshness_read_ago``, seconds; absent: not
        since the engine started), so that the meta-cluster keeps sending them only while someone
        reads it. An item that is refused (a removed table, a caller who may not write it) answers
        its error; the others are recorded."""
        items = body["heartbeats"]
        if not isinstance(items, list) or len(items) > MAX_HEARTBEATS:
            raise bad_request(f"Invalid heartbeats in internal request push: expected a list of at most "
                              f"{MAX_HEARTBEATS} maps", field="heartbeats")
        answers: list[dict[str, Any]] = []
        pushes: list[tuple[int, _Push]] = []
        for i, item in enumerate(items):
            try:
                if not isinstance(item, dict):
                    raise bad_request(f"Invalid heartbeat {i} in internal request push: expected a map")
                push = self.parse_push(item, caller, "heartbeat")
                if push.groups or push.prev != push.end or "barrier_timestamp" not in item:
                    raise bad_request(f"Invalid heartbeat {i} of replica {push.replica_id}: a heartbeat carries no "
                                      "changes, one row index and a barrier timestamp")
            except YtError as exc:
                answers.append({"error": {"code": exc.code, "message": exc.message}})
                continue
            pushes.append((len(answers), push))
            read_ago = self.freshness_read_ago(push.replica_id)
            answers.append({} if read_ago is None else {"freshness_read_ago": read_ago})
        for first in range(0, len(pushes), HEARTBEATS_PER_TRANSACTION):
            with self.host.storage.write() as conn:
                for index, push in pushes[first:first + HEARTBEATS_PER_TRANSACTION]:
                    stored = read_sink(conn, push.replica_id, push.tablet)
                    if stored is not None and stored[0] != push.prev:
                        answers[index].update(row_index=stored[0], applied=False)
                    else:
                        push.record(conn, 0)
                        answers[index].update(row_index=push.end, applied=True)
        return {"heartbeats": answers}

    def freshness_read(self, replica_id: str) -> None:
        """A read of the freshness of replica ``replica_id``'s table here (a change stream, an event token)."""
        self._freshness_reads[replica_id] = time.monotonic()

    def freshness_read_ago(self, replica_id: str) -> float | None:
        """Seconds since the freshness of replica ``replica_id``'s table was last read here, if ever."""
        at = self._freshness_reads.get(replica_id)
        return None if at is None else round(time.monotonic() - at, 3)


def _images_of_columns(table: DynamicTable, names: list[str], values: list[list[Any]]
                       ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], tuple[str, ...]]:
    """(keys, images in the table's column order, those columns) of whole rows given as checked
    columns; a column not named is null in every row."""
    schema = table.schema  # (one schema: an alter may replace the table's meanwhile)
    given = dict(zip(names, values, strict=True))
    rows = len(values[0])
    columns = [given[c.name] if c.name in given else [None] * rows for c in schema.columns]
    images = list(zip(*columns, strict=True))
    keys = list(zip(*(given[k] for k in schema.key_names), strict=True))
    return keys, images, tuple(c.name for c in schema.columns)


@dataclass
class _Push:
    """A push as :meth:`ReplicaSink.parse_push` checked it; ``record`` writes its sink record."""

    table: DynamicTable
    replica_id: str
    preserve: bool
    tablet: int
    prev: int
    end: int
    groups: list[tuple[int, list[RowWrite] | ImageRun]]
    record: Callable[[sa.Connection, int], None]
