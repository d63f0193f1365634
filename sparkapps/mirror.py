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

**It holds its position.** Before the copy the job registers a *vital queue consumer* of the table
at StartTime (its name is kept in the state file) and the stream advances it as Spark records its
batches (the ``consumer`` option of the change-stream source). The engine keeps every change a vital
consumer has not passed - beyond a sorted table's ``@change_retention``, and on a replicated table
beyond its replication queue's trimming (``minReplicationLogTtl: 0s`` trims a change as soon as every
replica has it) - so a copy that takes long, a stream behind the writes or a mirror stopped for a
while loses nothing. The price: a mirror that is stopped for good keeps the table's changes until it
is released (``--release``: unregisters the consumer). A start that finds its consumer gone and the
changes after StartTime trimmed refuses, naming ``@change_retention``.

The job's parts: this module (the state file, the snapshot copy, the streaming query and the
command line), ``mirror_pg.py`` (the PostgreSQL table, its tombstones and the newest-token-wins
statements), ``mirror_batches.py`` (each micro-batch of changes in one PostgreSQL transaction).

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
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError

from .changes_source import FORMAT as CHANGES_FORMAT
from .changes_source import hold_position, position_token
from .mirror_batches import BatchApplier
from .mirror_pg import TOKEN_COLUMN, PgLayout, table_ident
from .options import ReptablesSparkError, SourceOptions
from .reader import KeyRange, ReptablesReader, plan_partitions
from .schema_mapping import spark_schema
from .tables import TableInfo

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger("reptables.sparkapps.mirror")

#: the file in the checkpoint directory that holds StartTime and what is mirrored where
STATE_FILE = "mirror.json"
#: Spark's own checkpoint, beside it
SPARK_CHECKPOINT = "spark"


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
    #: the vital queue consumer of the table that holds the mirror's position (None: a state written
    #: before mirrors held one)
    consumer: str | None = None
    #: ``--release`` unregistered the consumer: this checkpoint can never resume
    released: bool = False

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
        except (ValueError, TypeError, AttributeError) as exc:
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


def consumer_name(pg_table: str) -> str:
    """A new mirror's consumer: its PostgreSQL table, and a random part (two mirrors of one table into
    tables of the same name on two servers are two consumers)."""
    return f"//consumers/reptables-mirror/{pg_table}-{uuid.uuid4().hex[:12]}"


def hold(client: Client, args: argparse.Namespace, state: MirrorState, checkpoint: Path,
         legacy: bool) -> MirrorState:
    """The mirror's consumer registered (vital, at StartTime) or found; the state that names it.

    The state names the consumer before it is registered, so a consumer of a mirror is always
    named by its checkpoint (a kill in between leaves a name to register on the next start, never
    a registration nobody knows of)."""
    if state.consumer is None:
        state = replace(state, consumer=consumer_name(args.pg_table))
        state.save(checkpoint)
    assert state.consumer is not None
    try:
        if hold_position(client, args.path, state.consumer, state.start_timestamp):
            log.info("registered consumer %s of %s (vital, from StartTime %#x): the table keeps every change the "
                     "mirror has not applied", state.consumer, args.path, state.start_timestamp)
    except YtError as exc:
        if exc.find(ErrorCode.CHANGES_TRIMMED) is None:
            raise
        if not legacy:
            raise ReptablesSparkError(
                f"mirror: {args.path} no longer keeps the changes after this mirror's StartTime "
                f"{state.start_timestamp:#x} (@change_retention, or a replicated table's queue trimming) and the "
                f"mirror's consumer {state.consumer} is not registered (was it released?); start a new mirror "
                "(a new checkpoint directory, an empty PostgreSQL table)") from None
        # a checkpoint of a mirror that held no consumer: hold from now on; changes the stream still
        # needs that are gone already fail it with error 1760, as they did before
        client.register_queue_consumer(args.path, state.consumer, vital=True)
        log.warning("checkpoint %s had no consumer and StartTime is trimmed: consumer %s holds the changes from "
                    "now on", checkpoint, state.consumer)
    return state


def prepare(args: argparse.Namespace, token: str | None) -> tuple[MirrorState, PgLayout]:
    """Check the table, PostgreSQL and the checkpoint agree; at the first start take StartTime and save
    it; register (or find) the consumer that holds the mirror's position."""
    checkpoint: Path = args.checkpoint
    state = MirrorState.load(checkpoint)
    legacy = state is not None and state.consumer is None
    if state is not None and state.released:
        raise ReptablesSparkError(f"mirror: checkpoint {checkpoint} belongs to a mirror that was released (its "
                                  "consumer is unregistered, the table no longer keeps its changes); start a new "
                                  "mirror (a new checkpoint directory, an empty PostgreSQL table)")
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
                client.keep_change_log(args.path)  # StartTime after the switch: every later change is logged
                state = MirrorState(proxy=args.proxy, path=args.path, table_id=table_id, pg_table=args.pg_table,
                                    start_timestamp=client.generate_timestamp(), consumer=consumer_name(args.pg_table))
                state.save(checkpoint)
                log.info("mirror of %s into %s: StartTime %#x", args.path, args.pg_table, state.start_timestamp)
            state = hold(client, args, state, checkpoint, legacy)
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


def release(args: argparse.Namespace) -> None:
    """``--release``: unregister the mirror's consumer, so the table stops keeping changes for it, and
    mark the checkpoint so it never resumes. The checkpoint directory and the PostgreSQL tables stay."""
    checkpoint: Path = args.checkpoint
    state = MirrorState.load(checkpoint)
    if state is None:
        raise ReptablesSparkError(f"mirror: {checkpoint} holds no mirror state ({STATE_FILE}): nothing to release")
    for given, kept, option in ((args.proxy, state.proxy, "--proxy"), (args.path, state.path, "--path"),
                                (args.pg_table, state.pg_table, "--pg-table")):
        if given is not None and given != kept:
            raise ReptablesSparkError(f"mirror: checkpoint {checkpoint} belongs to the mirror of {state.path} at "
                                      f"{state.proxy} into {state.pg_table}, not {option} {given}")
    token = _token(args.token_file)
    if state.consumer is not None:
        try:
            with Client(state.proxy, token, timeout=60.0) as client:
                table_id = str(client.get(f"{state.path}/@id"))
                if table_id != state.table_id:
                    log.info("%s was recreated (id %s, was %s): its consumers went with the old table", state.path,
                             table_id, state.table_id)
                elif any(r["consumer_path"] == state.consumer
                         for r in client.list_queue_consumer_registrations(state.path)):
                    client.unregister_queue_consumer(state.path, state.consumer)
                    log.info("unregistered consumer %s of %s: the table no longer keeps changes for this mirror",
                             state.consumer, state.path)
                else:
                    log.info("consumer %s of %s is not registered: nothing to release", state.consumer, state.path)
        except YtError as exc:
            if exc.code != ErrorCode.RESOLVE_ERROR or exc.attributes.get("consumer_path") is not None:
                raise ReptablesSparkError(f"mirror: cannot release consumer {state.consumer} of {state.path} at "
                                          f"{state.proxy}: {exc} (YT error code {exc.code})") from None
            log.info("%s does not exist any more: its consumers went with it", state.path)
    replace(state, released=True).save(checkpoint)
    log.info("mirror of %s into %s released: remove %s and the PostgreSQL tables %s and %s_tombstones when they "
             "are no longer needed", state.path, state.pg_table, checkpoint, state.pg_table, state.pg_table)


def run(args: argparse.Namespace) -> None:
    if args.release:
        release(args)
        return
    token = _token(args.token_file)
    state, layout = prepare(args, token)
    checkpoint: Path = args.checkpoint
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    spark = spark_session(args.master)
    # after the session: SparkContext puts in a SIGINT handler of its own (cancel every job, raise
    # KeyboardInterrupt), and Ctrl-C must stop the mirror after its current batch like SIGTERM does
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
    if state.consumer is not None:
        reader = reader.option("consumer", state.consumer)  # advanced as Spark records each batch
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
    parser.add_argument("--proxy", help="the engine's URL")
    parser.add_argument("--path", help="the sorted table, //...")
    parser.add_argument("--token-file", type=Path, help="the engine's token (default: $YT_TOKEN)")
    parser.add_argument("--pg-dsn", help="libpq connection string (password: $PGPASSWORD or ~/.pgpass)")
    parser.add_argument("--pg-table", help="the PostgreSQL table, NAME or SCHEMA.NAME")
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="directory of the mirror's state and Spark's checkpoint (one per mirror)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="apply the changes committed so far, then exit")
    when.add_argument("--until-idle", type=float, metavar="SECONDS",
                      help="exit once no change arrived for SECONDS")
    when.add_argument("--release", action="store_true",
                      help="stop mirroring for good: unregister the mirror's consumer, so the table stops keeping "
                           "changes for it (needs only --checkpoint and the token)")
    parser.add_argument("--max-rows-per-batch", type=int, default=10_000, help="changes per micro-batch")
    parser.add_argument("--master", default="local[1]", help="Spark master when run directly (default local[1])")
    args = parser.parse_args(argv)
    if not args.release:
        missing = [f"--{n.replace('_', '-')}" for n in ("proxy", "path", "pg_dsn", "pg_table")
                   if getattr(args, n) is None]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)}")
    if args.path is not None and not args.path.startswith("//"):
        parser.error(f"--path must be a table path starting with //, got {args.path!r}")
    if args.until_idle is not None and args.until_idle <= 0:
        parser.error("--until-idle must be positive")
    if not 0 < args.max_rows_per_batch <= 100_000:
        parser.error("--max-rows-per-batch must be from 1 to 100000")
    if args.pg_table is not None:
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
