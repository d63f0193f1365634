"""The replica side of a bootstrap copy: a new replica's table filled as of its start timestamp.

A replica whose history left the meta-cluster's queue needs the table's content as of a timestamp
T, after which the replicator sends every change (``start_replication_timestamp = T``). The copy
cannot go through ``insert_rows``: a replica table refuses writes that bypass its replicator, and
rows written now would carry timestamps after changes the replicator will bring later (a read at
a timestamp would then see the copy over a newer change). So the copy has its own internal call,
``bootstrap_write``, with three rules:

* **only the meta-cluster of the replica**, during its bootstrap: the caller's peer credential must
  name the cluster whose cell tag the replica id carries (as for pushes), and the copy is refused
  once the replicator has delivered anything to that replica (its sink record exists);
* **rows at T**: every row is written with the commit timestamp T, the snapshot it was read at, so
  reads on the replica order it before every change the replicator brings (all after T);
* **exactly once per chunk**: a copy is cut into numbered chunks (deterministic for a given T and
  key range); an applied chunk is recorded in the same SQL transaction as its rows, under
  ``bootstrap:<replica id>``, and a repeated chunk (a retried Spark task) changes nothing.

Rows are checked against the replica table's schema like every peer input (``ReplicaSink.check_writes``).
Sorted tables only: an ordered replica has no key to make a copy idempotent (refused with a clear error).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..storage import replica_sink_table
from ..tablets import RowWrite, WriteKind
from .sink import MAX_ROW_INDEX, ReplicaSink, bad_request, int_field, read_sink, str_field

#: the sink records of a bootstrap's chunks are kept under this prefix and the replica id
BOOTSTRAP_PREFIX = "bootstrap:"


def bootstrap_key(replica_id: str) -> str:
    return f"{BOOTSTRAP_PREFIX}{replica_id}"


def handle_bootstrap_write(sink: ReplicaSink, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
    """Apply one chunk of a bootstrap copy (see the module docstring); answers ``{"applied": bool}``."""
    replica_id = str_field(body, "upstream_replica_id", "bootstrap_write", 64 - len(BOOTSTRAP_PREFIX))
    what = f"bootstrap copy of replica {replica_id}"
    table, path = sink.replica_table(body.get("replica_path"), replica_id)
    sink.check_caller(caller, replica_id, what, path)
    if not table.sorted:
        raise YtError(f"Cannot bootstrap replica table {path}: a bootstrap copy fills sorted tables only (an "
                      "ordered table has no key to make a retried copy idempotent)",
                      code=ErrorCode.TABLE_MUST_BE_SORTED, attributes={"path": path})
    ts = sink.check_timestamp(body.get("timestamp"), f"snapshot timestamp of the {what}")
    chunk = int_field(body, "chunk", what, MAX_ROW_INDEX)
    rows = body.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise bad_request(f"Invalid rows in internal request {what}: expected a list of maps", field="rows")
    if len(rows) > sink.config.max_peer_batch_rows:
        raise bad_request(f"Invalid chunk {chunk} of the {what}: {len(rows)} rows, more than the "
                   f"{sink.config.max_peer_batch_rows} a batch may carry (max_peer_batch_rows)")
    writes = [RowWrite(WriteKind.WRITE, row, table.schema.full_lock_mask, False) for row in rows]
    sink.check_writes(table, path, writes, what)
    key = bootstrap_key(replica_id)

    def during_bootstrap(conn: sa.Connection) -> tuple[int, int] | None:
        delivered = conn.execute(sa.select(replica_sink_table.c.tablet_index).where(
            replica_sink_table.c.upstream_replica_id == replica_id).limit(1)).first()
        if delivered is not None:
            raise YtError(f"Cannot apply chunk {chunk} of the {what} to {path}: the replica already receives "
                          "replicated changes, its bootstrap is over", code=ErrorCode.INVALID_TRANSACTION_STATE,
                          attributes={"path": path, "replica_id": replica_id})
        return read_sink(conn, key, chunk)

    def record(conn: sa.Connection, _newest: int) -> None:
        conn.execute(replica_sink_table.insert().values(upstream_replica_id=key, tablet_index=chunk,
                                                        row_index=len(writes), timestamp=ts))

    answer = sink.host.transactions.apply_replicated(
        table, [(ts, writes)] if writes else [], True, 0, check=during_bootstrap,
        # a recorded chunk never matches -1: it is not applied again
        expected=-1, record=record, end=len(writes))
    return {"applied": bool(answer.get("applied", True)), "rows": len(writes)}


def bootstrap_progress(conn: sa.Connection, replica_id: str) -> dict[str, int] | None:
    """What a bootstrap copy wrote into this cluster's table of ``replica_id``, from its chunk records.

    ``{"chunks": applied chunks, "rows": rows they held, "timestamp": the snapshot T}``, or None when
    no chunk was applied. A retried chunk is recorded once, so ``rows`` counts each copied row once:
    it is the copy's progress while it runs and its total once it is done (shown as the replica
    table's ``@bootstrap_progress`` and in the TableReplica's ``status.bootstrap.rowsCopied``).
    """
    c = replica_sink_table.c
    chunks, rows, timestamp = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(c.row_index), 0), sa.func.max(c.timestamp))
        .where(c.upstream_replica_id == bootstrap_key(replica_id))).one()
    if not chunks:
        return None
    return {"chunks": int(chunks), "rows": int(rows), "timestamp": int(timestamp)}
