"""Bootstrap of a new replica with local Spark: the copy's rate beside its two ceilings, in one run.

Issue 9's targets: the copy of 1,000,000 rows end to end (``reptables.sparkapps.bootstrap.copy``:
plan, read the source replica at T in Spark tasks, write chunks through ``bootstrap_write``) should
reach >= 80 % of the lower of two ceilings measured on the same rows in the same run, and >= 100,000
rows/s:

* **write ceiling**: the target engine's own bulk write path, ``bootstrap_write`` of the same rows
  in the same chunks from one Python client, no Spark (into a second, fresh replica table);
* **read ceiling**: a Spark pass that reads the source at T with the data source's reader in the
  same partitions and only counts the rows.

Spark start-up (session creation) is reported separately and is in none of the three figures.

Both ceilings are measured with the machine to themselves; the copy runs the read and the write at
once, on the same cores. So the run also measures the CPU each phase costs the whole machine (every
process: the engines, Spark's JVM and Python workers, the client; from ``/proc/stat``, which is
why the machine should be otherwise idle) and prints the **shared-core ceiling**: the rate at
which this machine's cores could run a read and a write of every row at once, ``cores / (read CPU
per row + write CPU per row)``, never above the lower ceiling. Where that is below the lower
ceiling, the copy is bound by the cores, not by how well it overlaps its read and its write.
The verify job's comparison of the copy with its source at T (1,000,000 rows on each side; target:
under 30 s) is timed after the copy.
Three engines (meta, source, target) on loopback in their own sessions, stopped by pid
(``reptables.testing.EngineSet``). ``--json out.json`` writes the figures.

    .venv/bin/python benchmarks/bootstrap_bench.py --rows 1000000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reptables.engine.credentials import peer_credential
from reptables.engine.httpconn import ConnectionPool, dumps_json
from reptables.sparkapps.bootstrap import copy, resolve
from reptables.sparkapps.options import SourceOptions
from reptables.sparkapps.reader import ReptablesReader, plan_partitions
from reptables.sparkapps.schema_mapping import spark_schema
from reptables.sparkapps.tables import TableInfo
from reptables.sparkapps.verify import verify
from reptables.testing import EngineSet, wait_for

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "d", "type": "double"}]
TABLE = "//tmp/bench"
NAMES = ("meta", "source", "target")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load(es: EngineSet, rows: int) -> tuple[str, str]:
    """The replicated table with ``rows`` rows, replicated to ``source`` and trimmed: (source replica id, path)."""
    es.replicated_table(TABLE, SCHEMA, attributes={"min_replication_log_ttl": 0})
    source = es.replica(TABLE, "source", "//tmp/source", schema=SCHEMA)
    batch = 10_000
    for start in range(0, rows, batch):
        es.meta.insert_rows(TABLE, [{"k": k, "v": f"value-{k:012d}", "d": k * 0.5}
                                    for k in range(start, min(rows, start + batch))], require_sync_replica=False)
    wait_for(lambda: es.meta.get(f"{TABLE}/@tablets")[0]["trimmed_row_count"] >= rows, 600, "replicated, trimmed")
    return source, "//tmp/source"


def new_replica(es: EngineSet, ts: int, path: str) -> str:
    replica_id: str = es.meta.call("create", {"type": "table_replica", "attributes": {
        "table_path": TABLE, "cluster_name": "target", "replica_path": path, "start_replication_timestamp": ts}})[
        "node_id"]
    es.client("target").create("table", path, attributes={"dynamic": True, "schema": SCHEMA,
                                                          "upstream_replica_id": replica_id})
    es.client("target").mount_table(path)
    return replica_id


def busy_cpu_seconds() -> float:
    """CPU seconds every process of the machine has used so far (``/proc/stat``: all but idle and iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def write_ceiling(es: EngineSet, replica_id: str, path: str, ts: int, rows: list[dict[str, Any]],
                  chunk_rows: int) -> float:
    target = es.engines["target"]
    pool = ConnectionPool(target.url, {"Authorization": f"OAuth {peer_credential(target.read_token(), 'meta')}"},
                          timeout=300.0)
    try:
        started = time.perf_counter()
        for seq, start in enumerate(range(0, len(rows), chunk_rows)):
            body = {"upstream_replica_id": replica_id, "replica_path": path, "timestamp": ts,
                    "chunk": seq, "rows": rows[start:start + chunk_rows]}
            answer = pool.request("POST", "/internal/v1/bootstrap_write", body=dumps_json(body),
                                  headers={"Content-Type": "application/json"})
            assert answer.status_code == 200, answer.text[:300]
        return time.perf_counter() - started
    finally:
        pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunk-rows", type=int, default=5000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    results: dict[str, Any] = {"rows": args.rows, "partitions": args.partitions, "chunk_rows": args.chunk_rows,
                               "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="reptables-boot-") as tmp, \
            EngineSet(Path(tmp), NAMES, log_level="warning", client_timeout=300.0, start_timeout=60.0) as es:
        log(f"engines {es.pids()}; loading {args.rows:,} rows")
        source, source_path = load(es, args.rows)
        ts = es.meta.generate_timestamp()
        wait_for(lambda: source in es.in_sync(TABLE), 120, "source in sync")
        source_cred = peer_credential(es.engines["source"].read_token(), "meta")
        target_cred = peer_credential(es.engines["target"].read_token(), "meta")

        from pyspark.sql import SparkSession

        started = time.perf_counter()
        spark = (SparkSession.builder.master("local[2]").appName("reptables-bootstrap-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.sparkContext.parallelize([0], 1).count()  # the Python workers too
        results["spark_startup_s"] = time.perf_counter() - started
        try:
            # the read ceiling: the same plan and reader, rows only counted
            opts = SourceOptions.parse({"proxy": es.engines["source"].url, "token": source_cred,
                                        "path": source_path, "timestamp": str(ts), "partitions": str(args.partitions)})
            with opts.client() as client:
                info = TableInfo.fetch(client, source_path)
                ranges = plan_partitions(client, info, ts, opts.partitions)
            reader = ReptablesReader(opts, spark_schema(info.columns))
            started, busy = time.perf_counter(), busy_cpu_seconds()
            counted = spark.sparkContext.parallelize(ranges, len(ranges)).map(
                lambda r: sum(b.num_rows for b in reader.read(r))).sum()
            read_s = time.perf_counter() - started
            results["read_cpu_us_per_row"] = (busy_cpu_seconds() - busy) / args.rows * 1e6
            assert counted == args.rows, counted
            results["read_ceiling_rows_per_s"] = args.rows / read_s

            # the copy, end to end (its own replica, plan resolved on the meta-cluster)
            replica_id = new_replica(es, ts, "//tmp/target")
            plan = resolve(es.meta, replica_id, source, wait=60)
            started, busy = time.perf_counter(), busy_cpu_seconds()
            totals = copy(spark, plan, source_cred, target_cred, args.partitions, args.chunk_rows)
            copy_s = time.perf_counter() - started
            results["copy_cpu_us_per_row"] = (busy_cpu_seconds() - busy) / args.rows * 1e6
            assert totals["rows"] == args.rows, totals
            results["copy_rows_per_s"] = args.rows / copy_s
            results["copy_seconds"] = copy_s

            # verification of the copy against its source, at T (both sides read, checksummed)
            target_opts = SourceOptions.parse({"proxy": es.engines["target"].url, "token": target_cred,
                                               "path": "//tmp/target", "timestamp": str(ts)})
            started = time.perf_counter()
            checked = verify(spark, opts, target_opts, ts, args.partitions)
            results["verify_seconds"] = time.perf_counter() - started
            results["verify_matches"] = all(r.matches for r in checked)
            assert results["verify_matches"] and sum(r.left_rows for r in checked) == args.rows
        finally:
            spark.stop()

        # the write ceiling: the same rows, same chunks, one client, no Spark
        rows = _all_rows(es, source_path, ts, args.rows)
        other = new_replica(es, ts, "//tmp/target_ceiling")
        busy = busy_cpu_seconds()
        write_s = write_ceiling(es, other, "//tmp/target_ceiling", ts, rows, args.chunk_rows)
        results["write_cpu_us_per_row"] = (busy_cpu_seconds() - busy) / args.rows * 1e6
        results["write_ceiling_rows_per_s"] = args.rows / write_s
        # the copy is whole: enabled, the replica catches up and equals the source in count
        es.meta.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
        count = es.client("target").select_rows("sum(1) as n from [//tmp/target] group by 1")[0]["n"]
        results["verified_rows"] = count
    lower = min(results["read_ceiling_rows_per_s"], results["write_ceiling_rows_per_s"])
    results["copy_vs_lower_ceiling"] = results["copy_rows_per_s"] / lower
    cores = os.cpu_count() or 1
    shared = cores * 1e6 / (results["read_cpu_us_per_row"] + results["write_cpu_us_per_row"])
    results["cores"] = cores
    results["shared_core_ceiling_rows_per_s"] = min(lower, shared)
    results["copy_vs_shared_core_ceiling"] = results["copy_rows_per_s"] / results["shared_core_ceiling_rows_per_s"]
    results["load_average_after"] = os.getloadavg()
    log(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _all_rows(es: EngineSet, path: str, ts: int, total: int) -> list[dict[str, Any]]:
    """Every row at ``ts`` in key pages (the engine bounds one answer)."""
    out: list[dict[str, Any]] = []
    after = -1
    client = es.client("source")
    while len(out) < total:
        page = client.select_rows(f"* from [{path}] where k > {after} order by k limit 100000", timestamp=ts)
        if not page:
            break
        out.extend(page)
        after = page[-1]["k"]
    return out


if __name__ == "__main__":
    sys.exit(main())
