"""The mirror job: a PostgreSQL copy of a sorted table, kept up to date from its change stream.

This is seed 004's "data dump, keeping it up to date", with Spark doing both halves:

1. At the first start the job takes StartTime (``generate_timestamp``) and writes it into the
   checkpoint directory, then copies the table's snapshot *at StartTime* into PostgreSQL with the
   ``reptables`` batch reader (key-range partitions in parallel). The table in PostgreSQL is made
   from the table's schema: the key columns are its primary key, plus a column ``_event_token``.
2. Then it applies the table's change stream from StartTime with Structured Streaming
   (``readStream.format("reptables-changes")``, ``foreachBatch``), each micro-batch in one
   PostgreSQL transaction. Spark's checkpoint (in the same directory) records which batches are
   done.

Why it converges exactly, whatever kills it:

* **The newest token wins.** Every row in PostgreSQL carries the event token of the change that
  wrote it (snapshot rows: the token "after every change at or below StartTime"); a change is applied
  only when its token is greater than the row's. A micro-batch applied but not yet committed in
  Spark's checkpoint is replayed after a restart, and every change in it is then a no-op.
* **Deletes leave tombstones.** A deleted row's key and token go to ``<table>_tombstones``, so a
  replayed older write of that key cannot bring the row back. The table itself holds exactly the
  table's rows.
* **The copy is repeatable.** StartTime is stored before the copy starts and reused on restart, so a
  copy killed halfway is run again at the same snapshot; rows already copied are kept (``ON CONFLICT
  DO NOTHING``), and the stream starts only once the copy is recorded as complete. The engine keeps
  the versions a read at StartTime needs for the table's ``min_data_ttl`` (30 min by default): a copy
  must complete within it.

The stream must start before the table's ``@change_retention`` (1 h by default) has passed since
StartTime, and a stopped mirror must be restarted within it; otherwise the job fails with the oldest
position the table still has (start a new mirror into an empty table then).

Secrets: the engine token comes from ``--token-file`` or ``$YT_TOKEN``, never the command line; a
PostgreSQL password belongs in ``$PGPASSWORD`` or ``~/.pgpass``, not in ``--pg-dsn``. Neither is
logged. docs/mirror.md is the user's guide.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from reptables.engine.client import Client
from reptables.engine.errors import YtError

from .changes_source import FORMAT as CHANGES_FORMAT
from .changes_source import position_token
from .options import ReptablesSparkError, SourceOptions
from .reader import KeyRange, ReptablesReader, plan_partitions
from .schema_mapping import JSON_TYPES, YtColumn, spark_schema
from .tables import TableInfo

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("reptables.sparkapps.mirror")

#: the file in the checkpoint directory that holds StartTime and what is mirrored where
STATE_FILE = "mirror.json"
#: Spark's own checkpoint, beside it
SPARK_CHECKPOINT = "spark"
#: the column that holds each row's event token
TOKEN_COLUMN = "_event_token"
#: the tombstone table of ``T`` is ``T`` + this
TOMBSTONE_SUFFIX = "_tombstones"

#: YT column type -> PostgreSQL column type. Floats become double precision: a float column's
#: values travel as JSON doubles, and "real" would round them.
PG_TYPES: dict[str, str] = {
    **{t: "bigint" for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
    "double": "double precision", "float": "double precision", "boolean": "boolean",
    "string": "text", "utf8": "text", "any": "jsonb", "yson": "jsonb",
}


# -- the state file ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MirrorState:
    """What a checkpoint directory mirrors, from where to where, and since when."""

    proxy: str
    path: str
    table_id: str
    pg_table: str
    start_timestamp: int
    snapshot_copied: bool = False

    @property
    def snapshot_token(self) -> str:
        """The token every copied row carries: after every change at or below StartTime."""
        return position_token(self.start_timestamp, self.table_id)

    @classmethod
    def load(cls, directory: Path) -> MirrorState | None:
        path = directory / STATE_FILE
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise ReptablesSparkError(f"mirror: {path} is not a mirror state file ({exc}); was the checkpoint "
                                      "directory written by something else?") from None

    def save(self, directory: Path) -> None:
        """Write atomically (a temporary file renamed over the old one, both synced)."""
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".mirror-", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / STATE_FILE)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# -- PostgreSQL --------------------------------------------------------------------------------------------


def table_ident(name: str, suffix: str = "") -> sql.Identifier:
    """``name`` or ``schema.name`` as an identifier, ``suffix`` appended to the table's name."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ReptablesSparkError(f"mirror: --pg-table must be NAME or SCHEMA.NAME, got {name!r}")
    parts[-1] += suffix
    return sql.Identifier(*parts)


@dataclass(frozen=True)
class PgLayout:
    """The PostgreSQL side of a mirrored table: its columns, key and the statements that change it."""

    pg_table: str
    columns: tuple[YtColumn, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def json_columns(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns if c.type in JSON_TYPES)

    def table(self) -> sql.Identifier:
        return table_ident(self.pg_table)

    def tombstones(self) -> sql.Identifier:
        return table_ident(self.pg_table, TOMBSTONE_SUFFIX)

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """The table and its tombstone table, if they do not exist yet (tokens compare bytewise: COLLATE "C")."""
        def column(c: YtColumn) -> sql.Composed:
            not_null = sql.SQL(" NOT NULL") if not c.nullable else sql.SQL("")
            return sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql.SQL(PG_TYPES[c.type]), not_null)

        token = sql.SQL('{} text COLLATE "C" NOT NULL').format(sql.Identifier(TOKEN_COLUMN))
        key = sql.SQL("PRIMARY KEY ({})").format(self._list(self.keys))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.table(), sql.SQL(", ").join([*(column(c) for c in self.columns), token, key])))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.tombstones(),
            sql.SQL(", ").join([*(column(c) for c in self.columns if c.key), token, key])))

    def holds_rows(self, conn: psycopg.Connection[Any]) -> bool:
        exists = conn.execute("SELECT to_regclass(%s)", [self.table().as_string(conn)]).fetchone()
        if exists is None or exists[0] is None:
            return False
        return conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(self.table())).fetchone() is not None

    @staticmethod
    def _list(names: Iterable[str]) -> sql.Composed:
        return sql.SQL(", ").join(sql.Identifier(n) for n in names)

    def _param(self, param: str, column: str | None) -> sql.Composed:
        """A placeholder cast to its column's type (a NULL or a string would otherwise be text)."""
        pg_type = "text" if column is None else PG_TYPES[self._types[column]]
        return sql.SQL("%({})s::{}").format(sql.SQL(param), sql.SQL(pg_type))

    @property
    def _types(self) -> dict[str, str]:
        return {c.name: c.type for c in self.columns}

    def _key_values(self) -> list[sql.Composed]:
        return [self._param(f"k{i}", k) for i, k in enumerate(self.keys)]

    def _key_match(self, table: sql.Identifier) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("{}.{} = {}").format(table, sql.Identifier(k), p)
                                     for k, p in zip(self.keys, self._key_values(), strict=True))

    def value(self, name: str, value: Any) -> Any:
        """A row value as psycopg should send it (a column of type any: its structure as jsonb)."""
        if name in self.json_columns and value is not None:
            return Jsonb(value)
        return value

    def write_statement(self, names: tuple[str, ...]) -> sql.Composed:
        """Upsert of the columns ``names`` at token %(t)s, unless the row or its tombstone is as new or newer.

        Parameters: ``k0..`` the key, ``c0..`` the values of ``names``, ``t`` the token."""
        table, tomb = self.table(), self.tombstones()
        columns = [*self.keys, *names, TOKEN_COLUMN]
        values = [*self._key_values(), *(self._param(f"c{i}", n) for i, n in enumerate(names)), self._param("t", None)]
        updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in (*names, TOKEN_COLUMN)]
        return sql.SQL(
            "INSERT INTO {table} AS m ({columns}) SELECT {values} "
            "WHERE NOT EXISTS (SELECT 1 FROM {tomb} WHERE {tomb_key} AND {tomb}.{token} >= %(t)s) "
            "ON CONFLICT ({keys}) DO UPDATE SET {updates} WHERE m.{token} < EXCLUDED.{token}").format(
            table=table, columns=self._list(columns), values=sql.SQL(", ").join(values), tomb=tomb,
            tomb_key=self._key_match(tomb), token=sql.Identifier(TOKEN_COLUMN), keys=self._list(self.keys),
            updates=sql.SQL(", ").join(updates))

    def clear_tombstone_statement(self) -> sql.Composed:
        """A write at token %(t)s ends an older tombstone of its key."""
        tomb = self.tombstones()
        return sql.SQL("DELETE FROM {tomb} WHERE {key} AND {tomb}.{token} < %(t)s").format(
            tomb=tomb, key=self._key_match(tomb), token=sql.Identifier(TOKEN_COLUMN))

    def delete_statements(self) -> tuple[sql.Composed, sql.Composed]:
        """A delete at token %(t)s: remove an older row, then leave (or renew) the key's tombstone."""
        table, tomb = self.table(), self.tombstones()
        token = sql.Identifier(TOKEN_COLUMN)
        delete = sql.SQL("DELETE FROM {table} WHERE {key} AND {table}.{token} < %(t)s").format(
            table=table, key=self._key_match(table), token=token)
        values = [*self._key_values(), self._param("t", None)]
        tombstone = sql.SQL(
            "INSERT INTO {tomb} AS d ({columns}) SELECT {values} "
            "WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE {key} AND {table}.{token} >= %(t)s) "
            "ON CONFLICT ({keys}) DO UPDATE SET {token} = EXCLUDED.{token} WHERE d.{token} < EXCLUDED.{token}").format(
            tomb=tomb, columns=self._list([*self.keys, TOKEN_COLUMN]), values=sql.SQL(", ").join(values),
            table=table, key=self._key_match(table), token=token, keys=self._list(self.keys))
        return delete, tombstone


# -- applying changes --------------------------------------------------------------------------------------


@dataclass
class NetChange:
    """What the changes of one key in one micro-batch amount to, at the token of the last of them."""

    token: str
    #: None: the key ends deleted; else the columns written (all of them unless ``partial``)
    values: dict[str, Any] | None
    #: only some columns are known (a partial-row write onto a row this batch did not see)
    partial: bool = False


def fold(changes: Iterable[Mapping[str, Any]], layout: PgLayout, path: str) -> dict[tuple[Any, ...], NetChange]:
    """The net change per key of a micro-batch's changes (in stream order)."""
    out: dict[tuple[Any, ...], NetChange] = {}
    keys = layout.keys
    known = set(layout.names)
    for change in changes:
        kind = str(change["kind"])
        token = str(change["event_token"])
        key_values = json.loads(change["key"]) if change["key"] is not None else None
        if not isinstance(key_values, dict) or any(k not in key_values for k in keys):
            raise ReptablesSparkError(f"mirror: change {token} of {path} ({kind}) has no key "
                                      f"{list(keys)}: only sorted tables can be mirrored")
        key = tuple(key_values[k] for k in keys)
        if kind == "delete":
            out[key] = NetChange(token, None)
            continue
        if kind not in ("insert", "update", "upsert"):
            raise ReptablesSparkError(f"mirror: change {token} of {path} has kind {kind!r}, which a mirror of a "
                                      "sorted table cannot apply")
        row = json.loads(change["row"]) if change["row"] is not None else {}
        written = {n: v for n, v in row.items() if not n.startswith("$")}
        unknown = sorted(set(written) - known)
        if unknown:
            raise ReptablesSparkError(f"mirror: change {token} of {path} writes columns {unknown} that the mirrored "
                                      "schema does not have: the table's schema changed; start a new mirror")
        values = {n: v for n, v in written.items() if n not in keys}
        before = out.get(key)
        if not change["update"]:  # a full row: columns it lacks are null
            out[key] = NetChange(token, {c: values.get(c) for c in layout.names if c not in keys})
        elif before is None:
            out[key] = NetChange(token, values, partial=True)
        elif before.values is None:  # written after a delete: a new row, the other columns null
            out[key] = NetChange(token, {c: values.get(c) for c in layout.names if c not in keys})
        else:
            out[key] = NetChange(token, {**before.values, **values}, partial=before.partial)
    return out


def apply_changes(conn: psycopg.Connection[Any], layout: PgLayout, net: Mapping[tuple[Any, ...], NetChange]) -> None:
    """Apply the net changes in the connection's current transaction (one statement kind at a time)."""
    writes: dict[tuple[str, ...], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    deletes: list[dict[str, Any]] = []
    for key, change in net.items():
        at: dict[str, Any] = {f"k{i}": v for i, v in enumerate(key)}
        at["t"] = change.token
        if change.values is None:
            deletes.append(at)
            continue
        names = tuple(sorted(change.values))
        values = {f"c{i}": layout.value(n, change.values[n]) for i, n in enumerate(names)}
        writes.setdefault(names, []).append((at, values))
    with conn.cursor() as cur:
        for names, rows in writes.items():
            cur.executemany(layout.write_statement(names), [{**at, **values} for at, values in rows])
            cur.executemany(layout.clear_tombstone_statement(), [at for at, _ in rows])
        if deletes:
            delete, tombstone = layout.delete_statements()
            cur.executemany(delete, deletes)
            cur.executemany(tombstone, deletes)


class BatchApplier:
    """The ``foreachBatch`` function: each micro-batch's changes in one PostgreSQL transaction."""

    def __init__(self, dsn: str, layout: PgLayout, path: str) -> None:
        self.dsn, self.layout, self.path = dsn, layout, path
        self._conn: psycopg.Connection[Any] | None = None
        self.changes_applied = 0
        #: monotonic time of the last batch that had changes (or of the start)
        self.last_change = time.monotonic()
        self.last_token: str | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, connect_timeout=30)
        return self._conn

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        changes = sorted((r.asDict() for r in batch.collect()), key=lambda c: str(c["event_token"])[:32])
        if not changes:
            return
        net = fold(changes, self.layout, self.path)
        conn = self._connection()
        try:
            with conn.transaction():
                apply_changes(conn, self.layout, net)
        except psycopg.OperationalError:
            conn.close()  # a new connection for the replay of this batch
            raise
        self.changes_applied += len(changes)
        self.last_token = str(changes[-1]["event_token"])
        self.last_change = time.monotonic()
        log.info("batch %d: applied %d changes of %d keys to %s (up to %s)", batch_id, len(changes), len(net),
                 self.layout.pg_table, self.last_token)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


# -- the snapshot copy -------------------------------------------------------------------------------------


def copy_partition(dsn: str, layout: PgLayout, snapshot_token: str, batches: Iterator[pa.RecordBatch]) -> int:
    """One partition's rows into the table in one transaction (``COPY`` into a temporary table, then an
    insert that keeps rows a killed earlier run already copied); the rows read."""
    names = layout.names
    rows = 0
    with psycopg.connect(dsn, connect_timeout=30) as conn, conn.transaction(), conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TEMPORARY TABLE mirror_copy (LIKE {}) ON COMMIT DROP").format(layout.table()))
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in (*names, TOKEN_COLUMN))
        with cur.copy(sql.SQL("COPY mirror_copy ({}) FROM STDIN").format(columns)) as copy:
            for batch in batches:
                for row in batch.to_pylist():
                    copy.write_row([*(row[n] for n in names), snapshot_token])
                rows += batch.num_rows
        cur.execute(sql.SQL("INSERT INTO {table} ({columns}) SELECT {columns} FROM mirror_copy "
                            "ON CONFLICT DO NOTHING").format(table=layout.table(), columns=columns))
    return rows


def copy_snapshot(spark: SparkSession, opts: SourceOptions, dsn: str, layout: PgLayout, state: MirrorState) -> int:
    """The table at StartTime into PostgreSQL, in the batch reader's key-range partitions; the rows copied.

    Columns of type any arrive as JSON text and go into jsonb as such; float columns are read as
    doubles, exactly as the change stream carries them."""
    from pyspark.sql.types import DoubleType, FloatType, StructField, StructType

    try:
        with opts.client() as client:
            info = TableInfo.fetch(client, opts.path)
            ranges = plan_partitions(client, info, state.start_timestamp, opts.partitions)
    except (YtError, ValueError) as exc:
        raise opts.failure("read", exc) from None
    schema = StructType([StructField(f.name, DoubleType(), f.nullable) if isinstance(f.dataType, FloatType) else f
                         for f in spark_schema(info.columns).fields])
    reader = ReptablesReader(opts, schema)
    token = state.snapshot_token

    def per_partition(key_range: KeyRange) -> int:
        return copy_partition(dsn, layout, token, reader.read(key_range))

    counts = spark.sparkContext.parallelize(ranges, max(1, len(ranges))).map(per_partition).collect()
    return sum(counts)


# -- the job -----------------------------------------------------------------------------------------------


def _token(token_file: Path | None) -> str | None:
    if token_file is None:
        return os.environ.get("YT_TOKEN") or None
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ReptablesSparkError(f"mirror: cannot read --token-file {token_file}: {exc.strerror}") from None
    if not token:
        raise ReptablesSparkError(f"mirror: --token-file {token_file} is empty")
    return token


def prepare(args: argparse.Namespace, token: str | None) -> tuple[MirrorState, PgLayout]:
    """Check the table, PostgreSQL and the checkpoint agree; at the first start take StartTime and save it."""
    checkpoint: Path = args.checkpoint
    state = MirrorState.load(checkpoint)
    try:
        with Client(args.proxy, token, timeout=60.0) as client:
            info = TableInfo.fetch(client, args.path)
            table_id = str(client.get(f"{args.path}/@id"))
            if not info.sorted:
                raise ReptablesSparkError(f"mirror: {args.path} is an ordered table; only sorted tables can be "
                                          "mirrored (their rows are identified by key)")
            layout = PgLayout(args.pg_table, info.columns)
            if state is not None:
                if (state.path, state.pg_table) != (args.path, args.pg_table):
                    raise ReptablesSparkError(
                        f"mirror: checkpoint {checkpoint} belongs to the mirror of {state.path} into "
                        f"{state.pg_table}, not of {args.path} into {args.pg_table}")
                if state.table_id != table_id:
                    raise ReptablesSparkError(
                        f"mirror: {args.path} is not the table checkpoint {checkpoint} mirrors (its id was "
                        f"{state.table_id}, now {table_id}: it was recreated); start a new mirror into an empty "
                        "table with a new checkpoint directory")
            with psycopg.connect(args.pg_dsn, connect_timeout=30, autocommit=True) as conn:
                if state is None and layout.holds_rows(conn):
                    raise ReptablesSparkError(
                        f"mirror: PostgreSQL table {args.pg_table} already holds rows and {checkpoint} has no mirror "
                        "state: a new mirror starts from an empty table (drop it, or give the checkpoint directory "
                        "of the mirror that filled it)")
                layout.create(conn)
            if state is None:
                state = MirrorState(proxy=args.proxy, path=args.path, table_id=table_id, pg_table=args.pg_table,
                                    start_timestamp=client.generate_timestamp())
                state.save(checkpoint)
                log.info("mirror of %s into %s: StartTime %#x", args.path, args.pg_table, state.start_timestamp)
    except YtError as exc:
        raise ReptablesSparkError(f"mirror: cannot read table {args.path} at {args.proxy}: {exc} "
                                  f"(YT error code {exc.code})") from None
    except psycopg.Error as exc:
        raise ReptablesSparkError(f"mirror: PostgreSQL ({_dsn_place(args.pg_dsn)}): {exc}") from None
    return state, layout


def _dsn_place(dsn: str) -> str:
    """Where a DSN points, without its password."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an invalid --pg-dsn"
    return f"host={params.get('host', '')} port={params.get('port', '')} dbname={params.get('dbname', '')}"


def spark_session(master: str) -> SparkSession:
    """Local Spark with a small footprint (or the submitted application's session under spark-submit)."""
    from pyspark.sql import SparkSession

    from . import register

    builder = SparkSession.builder.appName("reptables-mirror")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.master(master).config("spark.driver.memory", "512m")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", "1"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def run(args: argparse.Namespace) -> None:
    token = _token(args.token_file)
    state, layout = prepare(args, token)
    checkpoint: Path = args.checkpoint
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    spark = spark_session(args.master)
    try:
        if not state.snapshot_copied:
            opts = SourceOptions.parse({"proxy": args.proxy, "path": args.path, "token": token or "",
                                        "timestamp": str(state.start_timestamp)})
            started = time.monotonic()
            rows = copy_snapshot(spark, opts, args.pg_dsn, layout, state)
            state = MirrorState(**{**asdict(state), "snapshot_copied": True})
            state.save(checkpoint)
            log.info("copied the snapshot of %s at %#x: %d rows in %.1f s", args.path, state.start_timestamp, rows,
                     time.monotonic() - started)
        else:
            log.info("resuming the mirror of %s into %s (StartTime %#x, snapshot copied)", args.path,
                     args.pg_table, state.start_timestamp)
        stream(spark, args, state, layout, stop)
    finally:
        spark.stop()


def stream(spark: SparkSession, args: argparse.Namespace, state: MirrorState, layout: PgLayout,
           stop: threading.Event) -> None:
    reader = (spark.readStream.format(CHANGES_FORMAT).option("proxy", args.proxy).option("path", args.path)
              .option("from_timestamp", str(state.start_timestamp))
              .option("max_rows_per_batch", str(args.max_rows_per_batch)))
    if args.token_file is not None:
        reader = reader.option("token_file", str(args.token_file))  # the token itself never enters the plan
    applier = BatchApplier(args.pg_dsn, layout, args.path)
    writer = (reader.load().writeStream.foreachBatch(applier)
              .option("checkpointLocation", str(args.checkpoint / SPARK_CHECKPOINT)))
    if args.once:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    asked = False  # whether the source has been asked for changes yet: the idle clock starts then
    try:
        while query.isActive:
            if query.awaitTermination(1):
                break
            if not asked and query.lastProgress is not None:
                asked = True
                applier.last_change = max(applier.last_change, time.monotonic())
            idle = time.monotonic() - applier.last_change
            if stop.is_set() or (args.until_idle is not None and asked and idle >= args.until_idle):
                if not stop.is_set():
                    log.info("no change for %.0f s: stopping (up to %s)", idle, applier.last_token)
                query.stop()
        query.awaitTermination()
    finally:
        applier.close()
    log.info("mirror of %s into %s stopped: %d changes applied in this run", args.path, args.pg_table,
             applier.changes_applied)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m reptables.sparkapps.mirror",
                                     description="Copy a sorted table into PostgreSQL and keep the copy up to date "
                                                 "from its change stream (docs/mirror.md).")
    parser.add_argument("--proxy", required=True, help="the engine's URL")
    parser.add_argument("--path", required=True, help="the sorted table, //...")
    parser.add_argument("--token-file", type=Path, help="the engine's token (default: $YT_TOKEN)")
    parser.add_argument("--pg-dsn", required=True, help="libpq connection string (password: $PGPASSWORD or ~/.pgpass)")
    parser.add_argument("--pg-table", required=True, help="the PostgreSQL table, NAME or SCHEMA.NAME")
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="directory of the mirror's state and Spark's checkpoint (one per mirror)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="apply the changes committed so far, then exit")
    when.add_argument("--until-idle", type=float, metavar="SECONDS",
                      help="exit once no change arrived for SECONDS")
    parser.add_argument("--max-rows-per-batch", type=int, default=10_000, help="changes per micro-batch")
    parser.add_argument("--master", default="local[1]", help="Spark master when run directly (default local[1])")
    args = parser.parse_args(argv)
    if not args.path.startswith("//"):
        parser.error(f"--path must be a table path starting with //, got {args.path!r}")
    if args.until_idle is not None and args.until_idle <= 0:
        parser.error("--until-idle must be positive")
    if not 0 < args.max_rows_per_batch <= 100_000:
        parser.error("--max-rows-per-batch must be from 1 to 100000")
    table_ident(args.pg_table)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        args = parse_args(argv)
        run(args)
    except ReptablesSparkError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
