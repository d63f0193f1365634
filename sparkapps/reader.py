"""Reading a dynamic table into Spark: one snapshot timestamp, parallel key ranges, pages, Arrow batches.

Why it is built this way:

* **One snapshot.** Every partition reads at the same timestamp: the ``timestamp`` option, or one
  generated on the cluster (``generate_timestamp``) when Spark plans the read. The engine keeps row
  versions for a table's ``min_data_ttl`` (30 min by default), so a read must finish within it.
* **Partitions are key ranges.** A sorted table splits at its tablets' pivot keys; asked for more
  partitions than tablets, a tablet whose first key column is an integer is split again between the
  column's min and max (one aggregate query per tablet, at the snapshot). Asked for fewer,
  neighbouring tablets are merged. An ordered table splits by ``$tablet_index`` and ``$row_index``
  ranges (from ``@tablets``' trimmed and flushed row counts); the last range of a tablet is left
  open, so no row visible at the snapshot is missed. An ordered *replicated* table splits by tablet
  only: its rows live on the replica, whose row counts the meta-cluster does not know.
* **Pages keep memory bounded.** A partition reads ``page_rows`` rows at a time in key order and
  continues after the last key it got (``WHERE key > last ORDER BY key LIMIT n``), so no page
  exceeds the engine's output limits; a page refused for its size (``max_output_bytes``) is asked
  again with half as many rows.
* **Replicated tables** are read through their meta-cluster, which serves the read from an in-sync
  replica at the same timestamp (the query names the replicated table; the engine retargets it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError

from .options import SourceOptions, retrying
from .schema_mapping import INTEGER_TYPES, JSON_TYPES, arrow_schema, check_read_schema, rows_to_batch
from .tables import ROW_INDEX, TABLET_INDEX, Bound, TableInfo, column_ref, compare, select_page


@dataclass(frozen=True)
class KeyRange(InputPartition):
    """One read partition: rows whose key is >= every bound of ``lower`` and < every bound of ``upper``.

    Bounds are keys or key prefixes over ``key_names`` (the table's key columns, or ``$tablet_index``,
    ``$row_index`` of an ordered table). Spark pickles the reader before it plans the partitions, so
    everything a task needs to know of the table travels here, in the partition.
    """

    index: int
    timestamp: int
    key_names: tuple[str, ...]
    key_types: tuple[str, ...]
    #: columns of type any/yson among those read (their values become JSON text)
    json_columns: frozenset[str]
    lower: tuple[Bound, ...] = ()
    upper: tuple[Bound, ...] = ()


def plan_partitions(client: Client, info: TableInfo, timestamp: int, wanted: int | None) -> list[KeyRange]:
    """The key ranges of a read of ``info`` at ``timestamp``, about ``wanted`` of them (None: one per tablet)."""
    if info.sorted:
        ranges = _sorted_ranges(client, info, timestamp, wanted or info.tablet_count)
        key_names = tuple(c.name for c in info.key_columns)
        key_types = tuple(c.type for c in info.key_columns)
    else:
        ranges = _ordered_ranges(info, wanted or info.tablet_count)
        key_names, key_types = (TABLET_INDEX, ROW_INDEX), ("int64", "int64")
    json_columns = frozenset(c.name for c in info.columns if c.type in JSON_TYPES)
    return [KeyRange(index=i, timestamp=timestamp, key_names=key_names, key_types=key_types,
                     json_columns=json_columns, lower=lo, upper=hi) for i, (lo, hi) in enumerate(ranges)]


_Range = tuple[tuple[Bound, ...], tuple[Bound, ...]]


def _groups(count: int, wanted: int) -> list[tuple[int, int]]:
    """``count`` items cut into ``min(count, wanted)`` contiguous groups of nearly equal size: (start, end)."""
    parts = max(1, min(count, wanted))
    cuts = [count * i // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


def _sorted_ranges(client: Client, info: TableInfo, timestamp: int, wanted: int) -> list[_Range]:
    pivots = list(info.pivot_keys) or [()]
    tablets: list[_Range] = []
    for i, pivot in enumerate(pivots):
        lower: tuple[Bound, ...] = (pivot,) if pivot else ()
        upper: tuple[Bound, ...] = (pivots[i + 1],) if i + 1 < len(pivots) else ()
        tablets.append((lower, upper))
    if wanted <= len(tablets):
        return [(tablets[start][0], tablets[end - 1][1]) for start, end in _groups(len(tablets), wanted)]
    first = info.key_columns[0]
    if first.type not in INTEGER_TYPES:
        return tablets  # no finer split of a non-integer key: one partition per tablet (docs/spark.md)
    out: list[_Range] = []
    for t, count in enumerate(_shares(len(tablets), wanted)):
        lower, upper = tablets[t]
        if count == 1:
            out.append((lower, upper))
            continue
        lo, hi = _min_max(client, info, first.name, lower, upper, timestamp)
        if lo is None or hi is None or hi - lo < 1:
            out.append((lower, upper))
            continue
        cuts = sorted({lo + (hi - lo + 1) * j // count for j in range(1, count)} - {lo})
        edges: list[Bound | None] = [None, *[(c,) for c in cuts], None]
        for a, b in zip(edges, edges[1:], strict=False):
            out.append((lower + ((a,) if a is not None else ()), upper + ((b,) if b is not None else ())))
    return out


def _shares(tablets: int, wanted: int) -> list[int]:
    """``wanted`` partitions spread over ``tablets`` tablets (each gets at least one)."""
    base, extra = divmod(wanted, tablets)
    return [base + (1 if i < extra else 0) for i in range(tablets)]


def _min_max(client: Client, info: TableInfo, name: str, lower: tuple[Bound, ...], upper: tuple[Bound, ...],
             timestamp: int) -> tuple[int | None, int | None]:
    """The smallest and largest value of key column ``name`` in a key range, at ``timestamp``."""
    names = [c.name for c in info.key_columns]
    types = [c.type for c in info.key_columns]
    where = [compare(names, types, ">=", b) for b in lower] + [compare(names, types, "<", b) for b in upper]
    ref = column_ref(name)
    query = f"min({ref}) AS lo, max({ref}) AS hi FROM [{info.path}]"
    if where:
        query += " WHERE " + " AND ".join(f"({w})" for w in where)
    row = client.select_rows(query, timestamp=timestamp)[0]
    return row["lo"], row["hi"]


def _ordered_ranges(info: TableInfo, wanted: int) -> list[_Range]:
    tablets = info.tablet_count

    def tablet_bound(t: int) -> tuple[Bound, ...]:
        """``$tablet_index >= t`` as a lower bound, ``< t`` as an upper one; none at either end."""
        return ((t,),) if 0 < t < tablets else ()

    if wanted <= tablets or not info.tablet_rows:
        return [(tablet_bound(start), tablet_bound(end)) for start, end in _groups(tablets, wanted)]
    out: list[_Range] = []
    for t, count in enumerate(_shares(tablets, wanted)):
        trimmed, rows = info.tablet_rows[t]
        count = max(1, min(count, rows - trimmed))
        cuts = [trimmed + (rows - trimmed) * j // count for j in range(1, count)]
        edges: list[Bound | None] = [None, *[(t, c) for c in cuts], None]
        for a, b in zip(edges, edges[1:], strict=False):
            out.append((tablet_bound(t) if a is None else (a,), tablet_bound(t + 1) if b is None else (b,)))
    return out


class ReptablesReader(DataSourceReader):
    """Plans the partitions on the driver (:meth:`partitions`) and reads each on an executor (:meth:`read`)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        try:
            with opts.client() as client:
                timestamp = opts.timestamp if opts.timestamp is not None else client.generate_timestamp()
                info = TableInfo.fetch(client, opts.path)
                check_read_schema(self.schema, info.columns, opts.path)
                return plan_partitions(client, info, timestamp, opts.partitions)
        except (YtError, ValueError) as exc:
            raise opts.failure("read", exc) from None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KeyRange)
        wanted = {f.name for f in self.schema.fields}
        json_columns = partition.json_columns & wanted
        for rows in self.read_rows(partition):
            yield rows_to_batch(rows, self.arrow_schema, json_columns, self.options.path)

    def read_rows(self, partition: KeyRange) -> Iterator[list[dict[str, Any]]]:
        """The partition's rows at its timestamp, a page at a time, as ``select_rows`` answers them
        (the columns of the schema, and the key columns). For a job that writes them to an engine
        again (the bootstrap copy): no Arrow batch to build and take apart in between."""
        opts = self.options
        key_names, key_types = partition.key_names, partition.key_types
        wanted = [f.name for f in self.schema.fields]
        projection = wanted + [k for k in key_names if k not in wanted]
        conditions = ([compare(key_names, key_types, ">=", b) for b in partition.lower]
                      + [compare(key_names, key_types, "<", b) for b in partition.upper])
        page = opts.page_rows
        after: Bound | None = None
        try:
            with opts.client() as client:
                while True:
                    query = select_page(opts.path, projection, key_names, key_types, conditions, after, page)
                    try:
                        rows = retrying(partial(client.select_rows, query, timestamp=partition.timestamp),
                                        opts.attempts)
                    except YtError as exc:
                        if _too_large(exc) and page > 1:
                            page = max(1, page // 2)
                            continue
                        raise
                    if rows:
                        last = rows[-1]
                        after = tuple(last[k] for k in key_names)
                        yield rows
                    if len(rows) < page:
                        return
        except YtError as exc:
            raise opts.failure(f"read partition {partition.index} (at timestamp {partition.timestamp}) of",
                               exc) from None


def _too_large(exc: YtError) -> bool:
    """The engine refused an answer for its size (``max_output_bytes``): a smaller page will do."""
    found = exc.find(ErrorCode.INVALID_PARAMETER)
    return found is not None and "max_output_bytes" in found.attributes
