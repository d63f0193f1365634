"""The bootstrap job: copy a replicated table as of T into a new replica's table, so it can join.

A replica added to a table whose replication queue was trimmed cannot get the old changes from the
queue (the engine refuses to enable it, code 1740). The bootstrap fills its table with the table's
content as of the replica's ``start_replication_timestamp`` T; enabled afterwards, the replica gets
every change after T from its replicator. The job:

1. reads the new replica's attributes on the meta-cluster (table, cluster, replica table, T) and
   waits until the source replica (one with every change up to T) is in sync at T;
2. reads the source replica table at T with the ``reptables`` data source, in key-range partitions;
3. writes each partition's rows, in numbered chunks, to the new replica's cluster through
   ``/internal/v1/bootstrap_write`` with the meta-cluster's peer credential: rows are written at T,
   and a chunk the engine already applied is not applied again — so a job killed at any point and
   run again completes the copy, neither losing nor duplicating a row (chunks are numbered by
   partition and position, the same for the same T and partition count);
4. with ``--enable``, enables the replica.

While it reads, it holds a snapshot lease on the source table at T (renewed from the driver), so
compaction keeps the versions a read at T needs however long the copy takes.

Secrets come from files or the environment, never from the command line (which ``ps`` shows):
``--meta-token-file`` (the meta-cluster's API token), ``--source-credential-file`` and
``--target-credential-file`` (the meta-cluster's peer credentials for the source and target
clusters: ``reptables peer-credential``; the source credential reads only the meta-cluster's own
replica tables). Run as ``python -m reptables.sparkapps.bootstrap`` (local Spark) or as a
SparkApplication's main file.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reptables.engine import yson_util
from reptables.engine.client import Client
from reptables.engine.errors import YtError
from reptables.engine.httpconn import ConnectionPool, HttpTransportError, dumps_json, loads_json
from reptables.engine.replica_types import ReplicaState

from .options import ReptablesSparkError, SourceOptions
from .reader import KeyRange, ReptablesReader, plan_partitions
from .schema_mapping import JSON_TYPES, parse_columns, spark_schema
from .session import job_session
from .tables import TableInfo

log = logging.getLogger("reptables.sparkapps.bootstrap")

#: rows per bootstrap_write chunk
DEFAULT_CHUNK_ROWS = 5000
#: chunk numbers: partition * this + position (a partition holds fewer chunks than this)
CHUNKS_PER_PARTITION = 1 << 32


@dataclass(frozen=True)
class Plan:
    """What the copy needs to know, resolved on the driver from the meta-cluster."""

    table_path: str
    replica_id: str
    target_proxy: str
    target_path: str
    source_proxy: str
    source_path: str
    timestamp: int
    #: columns of type any/yson: the data source gives JSON text, bootstrap_write takes YSON text
    yson_columns: frozenset[str]


def _secret(path: Path | None, env: str, what: str) -> str:
    value = path.read_text().strip() if path is not None else os.environ.get(env, "").strip()
    if not value:
        raise ReptablesSparkError(f"bootstrap: no {what}: give --{what.replace(' ', '-')}-file or set {env}")
    return value


def resolve(meta: Client, replica_id: str, source_replica_id: str, wait: float) -> Plan:
    """The new replica's and the source's coordinates; waits until the source is in sync at T."""
    replica = meta.get(f"#{replica_id}/@")
    source = meta.get(f"#{source_replica_id}/@")
    table_path = str(replica["table_path"])
    if source.get("table_path") != table_path:
        raise ReptablesSparkError(f"bootstrap: source replica {source_replica_id} is a replica of "
                                  f"{source.get('table_path')}, not of {table_path}")
    if replica.get("state") != ReplicaState.DISABLED:
        raise ReptablesSparkError(f"bootstrap: replica {replica_id} of {table_path} is {replica.get('state')}: a "
                                  "bootstrap fills a replica before it is enabled")
    ts = int(replica.get("start_replication_timestamp") or 0)
    if ts <= 0:
        raise ReptablesSparkError(f"bootstrap: replica {replica_id} of {table_path} has no "
                                  "start_replication_timestamp: create it with the copy's timestamp T")
    directory = meta.get("//sys/clusters")
    urls = {}
    for role, cluster in (("target", replica["cluster_name"]), ("source", source["cluster_name"])):
        entry = directory.get(cluster)
        if not isinstance(entry, dict) or not entry.get("proxy_url"):
            raise ReptablesSparkError(f"bootstrap: the {role} cluster {cluster} is not in //sys/clusters of the "
                                      "meta-cluster")
        urls[role] = str(entry["proxy_url"])
    deadline = time.monotonic() + wait
    while source_replica_id not in meta.get_in_sync_replicas(table_path, ts):
        if time.monotonic() > deadline:
            raise ReptablesSparkError(f"bootstrap: source replica {source_replica_id} of {table_path} is not in "
                                      f"sync at timestamp {ts:#x} after {wait:g} s: it cannot serve the snapshot")
        time.sleep(0.5)
    columns = parse_columns(meta.get(f"{table_path}/@schema"), table_path)
    return Plan(table_path=table_path, replica_id=replica_id, target_proxy=urls["target"],
                target_path=str(replica["replica_path"]), source_proxy=urls["source"],
                source_path=str(source["replica_path"]), timestamp=ts,
                yson_columns=frozenset(c.name for c in columns if c.type in JSON_TYPES))


def write_partition(plan: Plan, credential: str, chunk_rows: int, partition: int,
                    pages: Iterator[list[dict[str, Any]]]) -> tuple[int, int, int]:
    """Write one partition's rows (``pages`` of them as ``select_rows`` answers them: the reader's
    ``read_rows``) in numbered chunks: (rows, chunks applied, chunks already there).

    A chunk is written from a thread of its own while the next one is read and converted, one write
    in flight at a time, so chunks still arrive in their order: reading the source and writing the
    target overlap instead of taking turns."""
    pool = ConnectionPool(plan.target_proxy, {"Authorization": f"OAuth {credential}"}, timeout=120.0)
    rows_written = applied = skipped = 0
    pending: list[dict[str, Any]] = []
    seq = 0
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bootstrap-write-{partition}")
    in_flight: Future[dict[str, Any]] | None = None

    def settle() -> None:
        """Wait for the chunk in flight (its error, if any, is the job's)."""
        nonlocal in_flight, applied, skipped
        if in_flight is None:
            return
        answer, in_flight = in_flight.result(), None
        if answer.get("applied"):
            applied += 1
        else:
            skipped += 1

    def flush() -> None:
        nonlocal seq, rows_written, pending, in_flight
        body = {"upstream_replica_id": plan.replica_id, "replica_path": plan.target_path,
                "timestamp": plan.timestamp, "chunk": partition * CHUNKS_PER_PARTITION + seq, "rows": pending}
        settle()
        in_flight = writer.submit(_call, pool, plan, body)
        seq += 1
        rows_written += len(pending)
        pending = []

    try:
        for page in pages:
            for row in page:
                for name in plan.yson_columns:
                    if row.get(name) is not None:
                        row[name] = yson_util.dumps_text(row[name])
                pending.append(row)
                if len(pending) >= chunk_rows:
                    flush()
        if pending or seq == 0:
            flush()
        settle()
    finally:
        writer.shutdown(wait=True)  # (a failed read leaves at most one write to finish)
        pool.close()
    return rows_written, applied, skipped


def _call(pool: ConnectionPool, plan: Plan, body: dict[str, Any], attempts: int = 5) -> dict[str, Any]:
    """One bootstrap_write, retried on transport errors and retriable answers (a chunk is idempotent)."""
    delay = 0.5
    for attempt in range(attempts):
        try:
            response = pool.request("POST", "/internal/v1/bootstrap_write", body=dumps_json(body),
                                    headers={"Content-Type": "application/json"})
        except HttpTransportError as exc:
            if attempt + 1 == attempts:
                raise ReptablesSparkError(f"bootstrap: cluster at {plan.target_proxy} is unreachable: {exc}") from None
        else:
            if response.status_code < 400:
                answer: dict[str, Any] = loads_json(response.content)
                return answer
            error = YtError.from_dict(response.json())
            if response.status_code != 503 or attempt + 1 == attempts:
                raise ReptablesSparkError(f"bootstrap: replica table {plan.target_path} at {plan.target_proxy} "
                                          f"refused chunk {body['chunk']}: {error.message} (YT error code "
                                          f"{error.code})")
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


class SnapshotLease:
    """Holds the source's compaction at T while the copy runs (``/internal/v1/lease_snapshot``), renewed
    from the driver every third of its life; released at the end. A driver that dies stops renewing
    and the lease expires on its own."""

    def __init__(self, proxy: str, credential: str, path: str, timestamp: int, seconds: float = 600.0) -> None:
        self.pool = ConnectionPool(proxy, {"Authorization": f"OAuth {credential}"}, timeout=60.0)
        self.proxy, self.path, self.timestamp, self.seconds = proxy, path, timestamp, seconds
        self.lease_id: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="snapshot-lease", daemon=True)

    def _call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.pool.request("POST", f"/internal/v1/{method}", body=dumps_json(body),
                                     headers={"Content-Type": "application/json"})
        if response.status_code >= 400:
            error = YtError.from_dict(response.json())
            raise ReptablesSparkError(f"bootstrap: cannot hold the snapshot of {self.path} at {self.proxy} at "
                                      f"{self.timestamp:#x}: {error.message} (YT error code {error.code})")
        answer: dict[str, Any] = loads_json(response.content)
        return answer

    def _grant(self) -> None:
        body: dict[str, Any] = {"path": self.path, "timestamp": self.timestamp, "seconds": self.seconds}
        if self.lease_id:
            body["lease_id"] = self.lease_id
        self.lease_id = str(self._call("lease_snapshot", body)["lease_id"])

    def __enter__(self) -> SnapshotLease:
        self._grant()  # the first grant is checked: a snapshot already compacted cannot be leased
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                self._grant()
            except (ReptablesSparkError, HttpTransportError) as exc:
                log.warning("snapshot lease renewal failed (retried): %s", exc)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        try:
            if self.lease_id:
                self._call("release_snapshot", {"lease_id": self.lease_id})
        except (ReptablesSparkError, HttpTransportError):
            pass  # it expires on its own
        finally:
            self.pool.close()


def copy(spark: Any, plan: Plan, source_credential: str, target_credential: str, partitions: int | None = None,
         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> dict[str, int]:
    """Read the source at T in the data source's key-range partitions and write each; the totals.

    The partitions are planned by the data source's reader (``plan_partitions``: the same plan for
    the same T and count, which keeps chunk numbers stable across runs) and each Spark task reads its
    range with the reader's own ``read_rows`` — the engine's answers as they come, no Arrow batch or
    DataFrame in between — and writes them."""
    opts = SourceOptions.parse({"proxy": plan.source_proxy, "token": source_credential, "path": plan.source_path,
                                "timestamp": str(plan.timestamp),
                                **({"partitions": str(partitions)} if partitions else {})})
    with SnapshotLease(plan.source_proxy, source_credential, plan.source_path, plan.timestamp):
        try:
            with opts.client() as client:
                info = TableInfo.fetch(client, plan.source_path)
                ranges = plan_partitions(client, info, plan.timestamp, opts.partitions)
        except (YtError, ValueError) as exc:
            raise opts.failure("read", exc) from None
        reader = ReptablesReader(opts, spark_schema(info.columns))

        def per_partition(item: tuple[int, KeyRange]) -> tuple[int, int, int, int]:
            index, key_range = item
            return (index, *write_partition(plan, target_credential, chunk_rows, index, reader.read_rows(key_range)))

        results = spark.sparkContext.parallelize(list(enumerate(ranges)), max(1, len(ranges))).map(
            per_partition).collect()
    return {"partitions": len(results), "rows": sum(r[1] for r in results),
            "chunks_applied": sum(r[2] for r in results), "chunks_skipped": sum(r[3] for r in results)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.sparkapps.bootstrap", description=__doc__.split("\n")[0])
    parser.add_argument("--meta-proxy", required=True, help="URL of the meta-cluster")
    parser.add_argument("--meta-token-file", type=Path, help="its API token (default: $REPTABLES_META_TOKEN)")
    parser.add_argument("--replica-id", required=True, help="the new replica (disabled, start_replication_timestamp=T)")
    parser.add_argument("--source-replica-id", required=True, help="a replica of the same table to copy from")
    parser.add_argument("--source-credential-file", type=Path,
                        help="the meta-cluster's peer credential for the source cluster "
                             "(default: $REPTABLES_SOURCE_CREDENTIAL)")
    parser.add_argument("--target-credential-file", type=Path,
                        help="the meta-cluster's peer credential for the new replica's cluster "
                             "(default: $REPTABLES_TARGET_CREDENTIAL)")
    parser.add_argument("--partitions", type=int, default=None, help="read partitions (default: one per tablet)")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the source to be in sync at T")
    parser.add_argument("--enable", action="store_true", help="enable the replica after the copy")
    parser.add_argument("--master", default=None, help="Spark master (default: the session's, else local[*])")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        meta_token = _secret(args.meta_token_file, "REPTABLES_META_TOKEN", "meta token")
        source_credential = _secret(args.source_credential_file, "REPTABLES_SOURCE_CREDENTIAL", "source credential")
        target_credential = _secret(args.target_credential_file, "REPTABLES_TARGET_CREDENTIAL", "target credential")
        with Client(args.meta_proxy, meta_token, timeout=60.0) as meta:
            plan = resolve(meta, args.replica_id, args.source_replica_id, args.wait)
            log.info("bootstrap of replica %s of %s: copying %s:%s as of %#x into %s:%s", plan.replica_id,
                     plan.table_path, plan.source_proxy, plan.source_path, plan.timestamp, plan.target_proxy,
                     plan.target_path)
            with job_session(f"reptables-bootstrap-{plan.replica_id}", args.master) as spark:
                started = time.monotonic()
                totals = copy(spark, plan, source_credential, target_credential, args.partitions, args.chunk_rows)
            seconds = time.monotonic() - started
            log.info("bootstrap copied %d rows in %d partitions (%d chunks applied, %d already there) in %.1f s, "
                     "%.0f rows/s", totals["rows"], totals["partitions"], totals["chunks_applied"],
                     totals["chunks_skipped"], seconds, totals["rows"] / seconds if seconds else 0.0)
            if args.enable:
                meta.alter_table_replica(plan.replica_id, enabled=True)
                log.info("replica %s enabling (enabled once its replicator runs on every tablet)", plan.replica_id)
    except (ReptablesSparkError, YtError) as exc:
        log.error("bootstrap failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
