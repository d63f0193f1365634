"""Writing a DataFrame into a sorted dynamic table: Arrow batches, insert_rows chunks, safe retries.

Why it is built this way:

* **Only sorted tables.** An insert into a sorted table is an upsert by key: a chunk written twice
  leaves the table as written once. Spark retries a failed task from its first row, and a task may
  fail after some of its chunks were committed (an executor lost, the engine unreachable for a
  moment), so every write must be repeatable. Appends to an ordered table are not: a retried task
  would append its first chunks again. Rather than a half-measure, a write to an ordered table is
  refused on the driver, before any task runs, with an error naming the table and this reason.
* **Chunks.** Spark hands each task Arrow record batches; they are gathered into chunks of up to
  ``batch_rows`` rows (or ``batch_bytes`` of Arrow data) and each chunk is one ``insert_rows``, one
  tablet transaction: it is applied whole or not at all. A chunk that fails for a retriable reason
  (engine unreachable or busy, a row lock, a sync replica catching up) is sent again.
* **The engine validates.** Rows go to the engine as they are; it checks them against the table's
  schema and its errors (a null key, an unknown column, a negative uint64...) become the Spark
  job's error, message included. Two checks happen here because the engine cannot make them: the
  DataFrame's Spark types (on the driver), and integers out of the range of a column's declared
  narrow type (``int8``...), which the engine stores without checking.

``mode("overwrite")`` is refused: the data source never deletes rows. An aborted job leaves the chunks
its tasks committed (they are upserts of the job's own rows; write again to complete it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from reptables.engine.client import Client
from reptables.engine.errors import YtError

from .options import ReptablesSparkError, SourceOptions, retrying
from .schema_mapping import (
    batch_to_rows,
    check_ranges,
    check_write_schema,
    json_string_columns,
    narrow_integer_columns,
)
from .tables import TableInfo

log = logging.getLogger("reptables.sparkapps")


@dataclass(frozen=True)
class ChunksWritten(WriterCommitMessage):
    """What one task wrote: rows and insert_rows chunks (each one committed transaction)."""

    rows: int
    chunks: int


class ReptablesWriter(DataSourceArrowWriter):
    """Built on the driver (checks the table and the DataFrame's schema), pickled to every write task."""

    def __init__(self, options: SourceOptions, schema: StructType, overwrite: bool) -> None:
        self.options = options
        path = options.path
        if overwrite:
            raise ReptablesSparkError(f"reptables: cannot write to table {path} at {options.proxy} with mode "
                                      '"overwrite": the data source never deletes rows; use mode("append") '
                                      "(an upsert by key), after deleting the rows to replace if need be")
        try:
            with options.client() as client:
                info = TableInfo.fetch(client, path)
        except (YtError, ValueError) as exc:
            raise options.failure("write to", exc) from None
        if not info.sorted:
            raise ReptablesSparkError(
                f"reptables: cannot write to table {path} at {options.proxy}: it is an ordered table, and appends "
                "to an ordered table are not idempotent - a Spark task retried after some of its rows were "
                "appended would append them twice. Write to a sorted table (an insert there is an upsert by key) "
                "or append with the engine's client in your own transactions")
        check_write_schema(schema, info.columns, path)
        self.json_columns = json_string_columns(schema, info.columns)
        self.narrow = narrow_integer_columns(schema, info.columns)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ChunksWritten:
        opts = self.options
        pending: list[pa.RecordBatch] = []
        pending_rows = pending_bytes = 0
        rows_written = chunks = 0
        try:
            with opts.client() as client:
                for batch in iterator:
                    if batch.num_rows == 0:
                        continue
                    check_ranges(batch, self.narrow, opts.path)
                    pending.append(batch)
                    pending_rows += batch.num_rows
                    pending_bytes += batch.nbytes
                    if pending_rows >= opts.batch_rows or pending_bytes >= opts.batch_bytes:
                        written, sent = self._flush(client, pending)
                        rows_written, chunks = rows_written + written, chunks + sent
                        pending, pending_rows, pending_bytes = [], 0, 0
                written, sent = self._flush(client, pending)
        except YtError as exc:
            raise opts.failure("write to", exc) from None
        return ChunksWritten(rows=rows_written + written, chunks=chunks + sent)

    def _flush(self, client: Client, batches: list[pa.RecordBatch]) -> tuple[int, int]:
        """Send the rows of ``batches`` in chunks of at most ``batch_rows``; (rows, chunks) sent."""
        opts = self.options
        rows: list[dict[str, Any]] = []
        for batch in batches:
            rows.extend(batch_to_rows(batch, self.json_columns, opts.path))
        chunks = 0
        update = True if opts.update else None
        for start in range(0, len(rows), opts.batch_rows):
            chunk = rows[start:start + opts.batch_rows]
            retrying(partial(client.insert_rows, opts.path, chunk, update=update), opts.attempts)
            chunks += 1
        return len(rows), chunks

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, ChunksWritten)]
        log.info("wrote %d rows in %d chunks to %s", sum(m.rows for m in done), sum(m.chunks for m in done),
                 self.options.path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, ChunksWritten)]
        log.warning("write to %s aborted; %d rows of the tasks that finished stay written (upserts: a new "
                    "write of the same DataFrame completes it)", self.options.path, sum(m.rows for m in done))
