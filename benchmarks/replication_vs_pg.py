"""reptables replicated tables against PostgreSQL 15 logical replication, side by side.

Why
---

reptables re-implements YTsaurus replicated dynamic tables: a meta-cluster engine holds the
table's replication queue, replicas live on other engines, async replicas are fed by the meta's
replicator (batches of up to 90,000 rows), sync replicas are written inside each commit (2PC over
HTTP). The issue's targets compare it with the replication most users know, PostgreSQL's logical
replication: end-to-end replicated throughput >= 1.0x PostgreSQL's, and a single-row commit with
one sync replica at p50 <= 1.0 ms and p99 <= 3 ms (issue 27; the first issue asked for 0.5x and
p50 <= 5 ms). This benchmark measures both sides in one run, on the same rows,
on the same machine, one system after the other.

What is measured
----------------

Rows: 3 columns - ``k`` int64 key, ``v`` short string ``value-<k:012d>``, ``d`` double ``k * 0.5``
(the rows of ``benchmarks/pg_logical.py`` and ``engine_bench.py``); ``--rows`` (1,000,000) rows in
batches of ``--batch-size`` (10,000). Rows are made before any clock starts.

1. **reptables, meta + 2 async replicas.** Three engines (meta, ``replica_0``, ``replica_1``) that
   know each other via ``//sys/clusters``; a replicated table on the meta with two async replicas
   (replica tables with ``upstream_replica_id``, enabled). The client writes every batch with
   ``insert_rows(require_sync_replica=False)`` (one implicit tablet transaction each), from one
   client thread, and again (on fresh engines) from 2 concurrent client threads that split the
   batches round robin, each with its own ``Client``. The clock starts at the first batch:

   * ``insert`` stops when the last ``insert_rows`` returned;
   * ``end to end`` stops when every replica has every row. Polling starts after the last insert,
     every ~50 ms: ``#<replica>/@tablets`` on the meta until, on every tablet,
     ``current_replication_row_index >= flushed_row_count`` (the queue end after the last
     insert); then each replica table is counted (``sum(1) ... group by 1``) to confirm it has
     ``rows`` rows (if not, polling goes on with the count). The time recorded is that of the
     poll that saw the replica complete, as ``pg_logical.py`` does.

   The best honest figure of the thread counts (highest end-to-end rows/s) is the one compared,
   and the table says which it is; every thread count's figures are printed and in the JSON.
2. **reptables, meta + 1 sync + 1 async.** The same with ``replica_0`` a sync replica (waited for
   until in sync before the clock starts) and ``replica_1`` async. ``require_sync_replica`` is
   still ``False`` for a like-for-like request; every commit goes through 2PC with the sync
   replica anyway.
3. **PostgreSQL 15 logical replication** (:func:`benchmarks.pg_logical.run_logical_replication`):
   one publisher, two subscribers, ``COPY`` batches of the same size, time until both
   subscribers have every row. Its docstring explains why it is a fair peer.
4. **Single-row commit latency with one sync replica**: a meta and one sync replica (two
   engines); sequential ``insert_rows`` of one row each (``require_sync_replica`` at its default,
   true), ``--latency-samples`` of them after a warm-up; p50/p99 nearest rank. Beside it,
   PostgreSQL with the subscriber as synchronous standby
   (:func:`benchmarks.pg_logical.run_sync_commit_latency`).

Only the figures with a verified end state count: after the clocks stop (untimed) every replica
is read back in chunks of 100,000 keys and compared row by row with the rows written (count,
and every ``k``, ``v``, ``d``); PostgreSQL checks a checksum on every server. A retriable answer
(105 unavailable, 1700 row lock conflict, 1732 sync replica not in sync - codes the official
``yt.wrapper`` retries for dynamic tables too) is retried at most 5 times with exponential backoff
(0.25 s doubling), the time of the failed attempts and of the backoff staying inside the clock,
and is counted by code in the table.

Ratios are reptables' end-to-end rows/s over PostgreSQL's (the same PostgreSQL figure for both
reptables scenarios: PostgreSQL has no sync-plus-async mode for logical subscribers).

Engines on SQLite or on PostgreSQL
----------------------------------

An engine keeps its state in SQLite (the default) or in a PostgreSQL database of its own
(``--storage postgresql://...``, docs/storage.md). ``--storage postgresql`` runs every scenario
with the meta-cluster and both replica clusters each on a new database of one PostgreSQL server
(the same server version as the logical replication peer; started by the benchmark with
``reptables.testing.postgres.PostgresServer`` and its default durability - ``fsync=on``,
``synchronous_commit=on`` - or given by ``--pg-server [USER@]HOST:PORT`` on loopback); the
databases are dropped when the scenario's engines stop. ``--storage sqlite,postgresql`` measures
both in one run, so that the two are compared under the same load, and adds the PostgreSQL-backed
/ SQLite-backed ratios. Each table line has its storage; each end-to-end line notes the CPU
seconds every engine and the PostgreSQL server used until the replicas were complete (who the
time went to).

How it runs
-----------

Each scenario gets fresh engines (``reptables.testing.EngineSet``: ``python -m reptables.engine.cli
serve --log-level warning`` on free loopback ports, own sessions, stopped by pid); then the
PostgreSQL servers run (``pg_logical.py``: ``pg_ctl`` on their data dirs). Nothing runs
concurrently: each system is stopped before the next starts, since the machine has 2 cores that
every server and the client share. The engines' pids are printed to stderr when they start, so
they can be profiled (``py-spy dump --pid``). Every loop is bounded in count and in time;
temporary directories are removed at the end.

Run from the repository root::

    .venv/bin/python benchmarks/replication_vs_pg.py                 # full run, 1,000,000 rows
    .venv/bin/python benchmarks/replication_vs_pg.py --rows 50000 --latency-samples 200
    .venv/bin/python benchmarks/replication_vs_pg.py --json out.json --skip-pg
    .venv/bin/python benchmarks/replication_vs_pg.py --storage sqlite,postgresql --rows 300000
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError
from reptables.testing import EngineProcess, EngineSet, wait_for

try:
    from benchmarks import engine_bench, pg_logical
except ImportError:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import engine_bench, pg_logical

from benchmarks.engine_bench import BACKEND_LABELS, POSTGRESQL, SQLITE, PgStorage, parse_backends  # noqa: E402

SCHEMA: list[dict[str, Any]] = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "v", "type": "string"},
    {"name": "d", "type": "double"},
]
TABLE = "//tmp/bench_replicated"
REPLICA_TABLE = "//tmp/bench_replica"

TARGET_RATIO = 1.0
TARGET_COMMIT_P50_MS = 1.0
TARGET_COMMIT_P99_MS = 3.0

#: answers a YT client retries (yt.wrapper's dynamic-table retries include these codes), with backoff
RETRY_ATTEMPTS = 6
RETRY_BACKOFF_S = 0.25  # doubled after every failed attempt: at most 0.25 + 0.5 + 1 + 2 + 4 s of waiting
RETRIABLE_CODES = {ErrorCode.UNAVAILABLE, ErrorCode.SYNC_REPLICA_NOT_IN_SYNC, ErrorCode.TRANSACTION_LOCK_CONFLICT}
POLL_INTERVAL_S = 0.05
#: how long a sync replica may take to be in sync on fresh engines
IN_SYNC_TIMEOUT_S = 60.0
VERIFY_CHUNK = 100_000
LATENCY_WARMUP = 20

Row = dict[str, Any]


# -- rows ------------------------------------------------------------------------------------------


def make_batches(rows: int, batch_size: int) -> list[list[Row]]:
    """The benchmark's rows as ``insert_rows`` dicts: exactly pg_logical.make_rows' values."""
    return [[{"k": k, "v": v, "d": d} for k, v, d in pg_logical.make_rows(start, min(batch_size, rows - start))]
            for start in range(0, rows, batch_size)]


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100), as in engine_bench.py and pg_logical.py."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(p / 100.0 * len(ordered))) - 1]


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- retries and engine metrics --------------------------------------------------------------------


class Retries:
    """Bounded retry of retriable answers (105, 1700, 1732) with exponential backoff, counted by code.

    The time of failed attempts and of the backoff stays inside the clock: retries cost what they cost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_code: dict[int, int] = {}
        self.messages: list[str] = []

    @property
    def count(self) -> int:
        return sum(self.by_code.values())

    def call(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(RETRY_ATTEMPTS):
            try:
                return fn()
            except YtError as exc:
                if exc.code not in RETRIABLE_CODES or attempt == RETRY_ATTEMPTS - 1:
                    raise
                with self._lock:
                    self.by_code[exc.code] = self.by_code.get(exc.code, 0) + 1
                    if len(self.messages) < 20:
                        self.messages.append(f"{time.strftime('%H:%M:%S')} {exc.code}: {exc.message[:400]}")
                time.sleep(RETRY_BACKOFF_S * 2 ** attempt)
        raise AssertionError("unreachable")

    def summary(self) -> str:
        return ", ".join(f"{n}x {code}" for code, n in sorted(self.by_code.items())) or "0"


def engine_command_stats(url: str, command: str, token: str) -> tuple[float, int]:
    """(seconds, requests) of ``command`` so far, from an engine's ``/metrics`` histogram (which
    takes the engine's API token on its API port)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=10, headers={"Authorization": f"OAuth {token}"}).text
    except httpx.HTTPError:
        return 0.0, 0
    label = re.escape(f'{{command="{command}"}}')

    def value(name: str) -> float:
        m = re.search(f"^{name}{label} (\\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return value("reptables_request_seconds_sum"), int(value("reptables_request_seconds_count"))


# -- results ---------------------------------------------------------------------------------------


@dataclass
class ReplicaCheck:
    cluster: str
    mode: str
    replica_id: str
    replicated_seconds: float  # from the first insert until this replica was seen complete
    count: int = 0
    rows_compared: int = 0  # rows read back and compared with the rows written
    mismatches: int = 0
    first_mismatch: str = ""

    def ok(self, rows: int) -> bool:
        return self.count == rows and self.rows_compared == rows and self.mismatches == 0


@dataclass
class ReplicationRun:
    scenario: str  # "2 async" or "1 sync + 1 async"
    threads: int
    rows: int
    batch_size: int
    insert_seconds: float
    replicated_seconds: float
    batch_ms_p50: float
    batch_ms_max: float
    queue_rows: int  # flushed_row_count of the meta's queue after the last insert (> rows only after retries)
    retries: int
    retry_codes: str = "0"  # e.g. "2x 105, 1x 1700"
    retry_messages: list[str] = field(default_factory=list)
    meta_ms_per_batch: float | None = None  # the meta engine's own mean insert_rows time (its /metrics)
    replicas: list[ReplicaCheck] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    load_average: str = ""
    storage: str = SQLITE
    #: CPU seconds from the first insert until every replica was complete: per engine, and "postgresql"
    #: (the server of the engines' databases, when they are on PostgreSQL)
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def insert_rows_per_s(self) -> float:
        return self.rows / self.insert_seconds

    @property
    def end_to_end_rows_per_s(self) -> float:
        return self.rows / self.replicated_seconds

    @property
    def verified(self) -> bool:
        return len(self.replicas) == 2 and all(r.ok(self.rows) for r in self.replicas)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "insert_rows_per_s": self.insert_rows_per_s,
                "end_to_end_rows_per_s": self.end_to_end_rows_per_s, "verified": self.verified}


@dataclass
class LatencyRun:
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    retries: int
    retry_codes: str
    meta_mean_ms: float | None  # the meta engine's own mean insert_rows time (its /metrics)
    replica_count: int  # rows on the sync replica afterwards (samples + warm-up)
    expected_count: int
    pids: dict[str, int] = field(default_factory=dict)
    storage: str = SQLITE
    #: CPU seconds per commit during the samples: per engine, and "postgresql" (see ReplicationRun)
    cpu_ms_per_commit: dict[str, float] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return self.replica_count == self.expected_count


# -- reptables: throughput -------------------------------------------------------------------------


@dataclass
class StorageEngineSet(EngineSet):
    """An :class:`EngineSet` whose engines keep their state on the benchmark's storage: SQLite in their
    data directories (``pg`` None), or each a new database of ``pg``'s PostgreSQL server, dropped again
    when the set stops (every scenario starts on empty databases, as it starts on empty directories)."""

    pg: PgStorage | None = None
    databases: list[str] = field(default_factory=list)

    def _engine(self, name: str, index: int, env: Mapping[str, str] | None, extra_args: Sequence[str] | None,
                own_tokens: bool) -> EngineProcess:
        # SQLite: no database URL from the environment ($REPTABLES_STORAGE empty means SQLite)
        storage = ["--storage", self._database(name)] if self.pg is not None else []
        return super()._engine(name, index, {**(env or {}), "REPTABLES_STORAGE": ""},
                               [*(extra_args or []), *storage], own_tokens)

    def _database(self, name: str) -> str:
        assert self.pg is not None
        url = self.pg.create_database(f"repl_{name}")
        self.databases.append(url)
        return url

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.pg is not None:
                for url in self.databases:
                    self.pg.drop_database(url)
            self.databases.clear()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of every engine, and of the PostgreSQL server ("postgresql") if any."""
        out = {name: engine_bench.proc_cpu_seconds(pid) for name, pid in self.pids().items()}
        if self.pg is not None:
            server = self.pg.cpu_seconds()
            if server is not None:
                out[POSTGRESQL] = server
        return out


def engine_set(base: Path, names: tuple[str, ...] = ("meta", "replica_0", "replica_1"),
               pg: PgStorage | None = None) -> StorageEngineSet:
    """Fresh engines ``names`` under ``base`` (the first the meta-cluster), on SQLite or, with ``pg``, each
    on a new database of that PostgreSQL server; a ``with`` block starts and stops them."""
    return StorageEngineSet(base, names, log_level="warning", client_timeout=300.0, start_timeout=60.0, pg=pg)


def _cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before[name], 3) for name in after if name in before}


def _insert_all(es: EngineSet, batches: list[list[Row]], threads: int, retries: Retries,
                timeout: float) -> tuple[float, float, list[float]]:
    """Insert every batch from ``threads`` client threads (round robin).

    Returns (perf_counter at the start, seconds until the last insert returned, every batch's seconds).
    """
    clients = [es.engines[es.meta_name].client(es.client_timeout) for _ in range(threads)]
    times: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)
    deadline = [0.0]

    def work(i: int) -> None:
        client = clients[i]
        try:
            barrier.wait(timeout=60)
            for batch in batches[i::threads]:
                if errors or time.monotonic() > deadline[0]:
                    return
                t = time.perf_counter()
                retries.call(functools.partial(client.insert_rows, TABLE, batch, require_sync_replica=False))
                times[i].append(time.perf_counter() - t)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,), name=f"bench-client-{i}", daemon=True)
               for i in range(threads)]
    try:
        for w in workers:
            w.start()
        deadline[0] = time.monotonic() + timeout
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        for w in workers:
            w.join(timeout=max(1.0, deadline[0] - time.monotonic() + 60))
        seconds = time.perf_counter() - t0
    finally:
        for c in clients:
            c.close()
    if errors:
        raise errors[0]
    if any(w.is_alive() for w in workers) or sum(len(t) for t in times) != len(batches):
        raise TimeoutError(f"the inserts did not finish within {timeout:.0f} s")
    return t0, seconds, [x for t in times for x in t]


def _replica_count(client: Client, path: str) -> int:
    found = client.select_rows(f"sum(1) AS c FROM [{path}] GROUP BY 1")
    return int(found[0]["c"]) if found else 0


def _verify_replica(client: Client, path: str, rows: int, check: ReplicaCheck) -> None:
    """Untimed: count the replica, then read it back in key chunks and compare every row."""
    check.count = _replica_count(client, path)
    for start in range(0, rows, VERIFY_CHUNK):
        end = min(rows, start + VERIFY_CHUNK)
        got = client.select_rows(f"k, v, d FROM [{path}] WHERE k >= {start} AND k < {end}",
                                 output_row_limit=VERIFY_CHUNK + 1)
        got.sort(key=lambda r: r["k"])
        expected: list[Row] = [{"k": k, "v": v, "d": d} for k, v, d in pg_logical.make_rows(start, end - start)]
        check.rows_compared += len(got)
        if got != expected:
            want: dict[int, Row] = {r["k"]: r for r in expected}
            bad = [r for r in got if want.get(r["k"]) != r]
            check.mismatches += len(bad) + abs(len(expected) - len(got))
            if not check.first_mismatch:
                missing = sorted(set(want) - {r["k"] for r in got})[:3]
                check.first_mismatch = f"chunk {start}..{end}: got {len(got)} rows, missing keys {missing}, " \
                                       f"first differing row {bad[0] if bad else None}"


def run_reptables_throughput(batches: list[list[Row]], rows: int, batch_size: int, sync_replica: bool, threads: int,
                             base: Path, timeout: float = 1800.0, pg: PgStorage | None = None) -> ReplicationRun:
    """One scenario on fresh engines: meta + 2 replicas (``replica_0`` sync if ``sync_replica``); with
    ``pg`` every engine on a new database of that PostgreSQL server."""
    scenario = "1 sync + 1 async" if sync_replica else "2 async"
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="reptables-repl-", dir=base) as tmp, \
            engine_set(Path(tmp), pg=pg) as es:
        log(f"      engines {es.pids()}")
        es.replicated_table(TABLE, SCHEMA)
        modes = {"replica_0": "sync" if sync_replica else "async", "replica_1": "async"}
        ids = {cluster: es.replica(TABLE, cluster, REPLICA_TABLE, mode=mode, schema=SCHEMA)
               for cluster, mode in modes.items()}
        if sync_replica:
            es.wait_in_sync(ids["replica_0"], IN_SYNC_TIMEOUT_S)
        meta_url, meta_token = es.engines[es.meta_name].url, es.engines[es.meta_name].read_token()
        before = engine_command_stats(meta_url, "insert_rows", meta_token)
        retries = Retries()
        load = load_average()
        cpu_before = es.cpu_seconds()

        t0, insert_seconds, batch_times = _insert_all(es, batches, threads, retries, timeout)
        after = engine_command_stats(meta_url, "insert_rows", meta_token)

        # poll: replication progress on the meta, then a count on the replica to confirm
        done_at: dict[str, float] = {}
        confirmed: set[str] = set()
        queue_rows = [0]

        def replicated() -> bool:
            for cluster, replica_id in ids.items():
                if cluster in confirmed:
                    continue
                if cluster not in done_at:
                    tablets = es.meta.get(f"#{replica_id}/@tablets")
                    queue_rows[0] = sum(t["flushed_row_count"] for t in tablets)
                    if queue_rows[0] < rows or any(
                            t["current_replication_row_index"] < t["flushed_row_count"] for t in tablets):
                        continue
                    done_at[cluster] = time.perf_counter()
                if _replica_count(es.client(cluster), REPLICA_TABLE) == rows:
                    confirmed.add(cluster)
                else:  # progress said done but the rows are not all there yet: the count decides
                    done_at.pop(cluster)
            return len(confirmed) == len(ids)

        wait_for(replicated, timeout, f"both replicas to have {rows:,} rows", interval=POLL_INTERVAL_S)
        cpu_used = _cpu_used(cpu_before, es.cpu_seconds())
        checks = [ReplicaCheck(cluster, modes[cluster], ids[cluster], done_at[cluster] - t0) for cluster in ids]
        replicated_seconds = max(c.replicated_seconds for c in checks)
        for check in checks:
            _verify_replica(es.client(check.cluster), REPLICA_TABLE, rows, check)
        n = after[1] - before[1]
        run = ReplicationRun(
            scenario=scenario, threads=threads, rows=rows, batch_size=batch_size, insert_seconds=insert_seconds,
            replicated_seconds=replicated_seconds, batch_ms_p50=percentile(batch_times, 50) * 1000.0,
            batch_ms_max=max(batch_times) * 1000.0, queue_rows=queue_rows[0], retries=retries.count,
            retry_codes=retries.summary(), retry_messages=retries.messages,
            meta_ms_per_batch=(after[0] - before[0]) / n * 1000.0 if n else None,
            replicas=checks, pids=es.pids(), load_average=f"{load} -> {load_average()}",
            storage=POSTGRESQL if pg is not None else SQLITE, cpu_seconds=cpu_used)
    return run


# -- reptables: single-row commit latency ----------------------------------------------------------


def run_reptables_latency(samples: int, base: Path, timeout: float = 1800.0,
                          pg: PgStorage | None = None) -> LatencyRun:
    """Sequential single-row commits on a meta with one sync replica (two fresh engines; with ``pg`` each on
    a new database of that PostgreSQL server)."""
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="reptables-lat-", dir=base) as tmp, \
            engine_set(Path(tmp), ("meta", "replica_0"), pg=pg) as es:
        log(f"      engines {es.pids()}")
        es.replicated_table(TABLE, SCHEMA)
        replica_id = es.replica(TABLE, "replica_0", REPLICA_TABLE, mode="sync", schema=SCHEMA)
        es.wait_in_sync(replica_id, IN_SYNC_TIMEOUT_S)
        retries = Retries()
        meta_url, meta_token = es.engines[es.meta_name].url, es.engines[es.meta_name].read_token()
        client = es.meta

        def commit(k: int) -> None:
            row = {"k": k, "v": f"value-{k:012d}", "d": k * 0.5}
            retries.call(lambda: client.insert_rows(TABLE, [row]))

        for i in range(LATENCY_WARMUP):
            commit(-1 - i)
        before = engine_command_stats(meta_url, "insert_rows", meta_token)
        cpu_before = es.cpu_seconds()
        deadline = time.monotonic() + timeout
        times: list[float] = []
        for k in range(samples):
            t = time.perf_counter()
            commit(k)
            times.append((time.perf_counter() - t) * 1000.0)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(times)} of {samples} commits took over {timeout:.0f} s")
        after = engine_command_stats(meta_url, "insert_rows", meta_token)
        cpu_used = _cpu_used(cpu_before, es.cpu_seconds())
        # a sync replica has the row when insert_rows returns; its count proves it
        replica_count = _replica_count(es.client("replica_0"), REPLICA_TABLE)
        n = after[1] - before[1]
        return LatencyRun(samples=samples, p50_ms=percentile(times, 50), p99_ms=percentile(times, 99),
                          mean_ms=sum(times) / len(times), min_ms=min(times), max_ms=max(times),
                          retries=retries.count, retry_codes=retries.summary(),
                          meta_mean_ms=(after[0] - before[0]) / n * 1000.0 if n else None,
                          replica_count=replica_count, expected_count=samples + LATENCY_WARMUP, pids=es.pids(),
                          storage=POSTGRESQL if pg is not None else SQLITE,
                          cpu_ms_per_commit={k: round(v / len(times) * 1000.0, 3) for k, v in cpu_used.items()})


def run_reptables(rows: int, batch_size: int, thread_counts: Sequence[int], latency_samples: int, base: Path,
                  timeout: float = 1800.0, pg: PgStorage | None = None) -> dict[str, Any]:
    """Every reptables measurement on one storage (SQLite, or with ``pg`` databases of that PostgreSQL
    server): {"2 async": [runs], "1 sync + 1 async": [runs], "latency": LatencyRun}."""
    batches = make_batches(rows, batch_size)
    out: dict[str, Any] = {}
    on = f"reptables on {BACKEND_LABELS[POSTGRESQL if pg is not None else SQLITE]}"
    for sync_replica in (False, True):
        runs: list[ReplicationRun] = []
        for threads in thread_counts:
            name = "meta + 1 sync + 1 async" if sync_replica else "meta + 2 async"
            log(f"[{on}] {name}: {rows:,} rows in batches of {batch_size:,}, {threads} client thread(s) ...")
            run = run_reptables_throughput(batches, rows, batch_size, sync_replica, threads, base, timeout, pg)
            log(f"      insert {run.insert_rows_per_s:,.0f} rows/s, end to end {run.end_to_end_rows_per_s:,.0f} "
                f"rows/s, verified {run.verified}, retries {run.retry_codes}, CPU s {run.cpu_seconds}")
            runs.append(run)
        out["1 sync + 1 async" if sync_replica else "2 async"] = runs
    if latency_samples > 0:
        log(f"[{on}] {latency_samples:,} single-row commits with one sync replica ...")
        lat = run_reptables_latency(latency_samples, base, timeout, pg)
        log(f"      p50 {lat.p50_ms:.2f} ms, p99 {lat.p99_ms:.2f} ms")
        out["latency"] = lat
    return out


def best_run(runs: Sequence[ReplicationRun]) -> ReplicationRun:
    """The verified run with the highest end-to-end rows/s (else the fastest at all)."""
    verified = [r for r in runs if r.verified] or list(runs)
    return max(verified, key=lambda r: r.end_to_end_rows_per_s)


# -- report ----------------------------------------------------------------------------------------


@dataclass
class Line:
    figure: str
    reptables: str
    postgres: str = ""
    ratio: str = ""
    target: str = ""
    status: str = ""
    note: str = ""
    #: the storage of the reptables engines the line measured ("" for a line about both)
    storage: str = SQLITE


def closing_line(lines: list[Line], all_ok: bool) -> str:
    """What the run says of its targets at the end: never "all targets met" when a target went unmeasured
    (a ratio without its PostgreSQL run, ``--skip-pg``)."""
    if not all_ok:
        return "targets missed: " + ", ".join(f"{x.figure} [{x.storage}]" for x in lines if x.status == "MISS")
    unmeasured = [f"{x.figure} [{x.storage}]" for x in lines if x.target and not x.status]
    if unmeasured:
        return "no target missed; not measured (no PostgreSQL run to compare with): " + ", ".join(unmeasured)
    return "all targets met"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cpu_note(cpu: dict[str, float], per: str, scale: float = 1.0) -> str:
    """``; CPU s: meta 12.1, replica_0 4.0, replica_1 3.9, PostgreSQL 9.5`` (who the time went to)."""
    if not cpu:
        return ""
    parts = [f"{'PostgreSQL' if k == POSTGRESQL else k} {v * scale:.2f}" for k, v in cpu.items()]
    return f"; CPU {per}: {', '.join(parts)}"


def build_lines(rep: dict[str, Any], pg_tp: pg_logical.PgThroughputResult | None,
                pg_lat: pg_logical.PgLatencyResult | None, storage: str = SQLITE) -> tuple[list[Line], bool]:
    """The side-by-side table of reptables on ``storage`` and PostgreSQL logical replication; the bool
    is whether every target with a figure was met."""
    lines: list[Line] = []
    all_ok = True
    pg_e2e = pg_tp.end_to_end_rows_per_s if pg_tp is not None else None
    for key in ("2 async", "1 sync + 1 async"):
        runs: list[ReplicationRun] = rep.get(key, [])
        if not runs:
            continue
        best = best_run(runs)
        for run in runs:
            lines.append(Line(f"  insert on meta, {key}, {run.threads} thread(s)", _rate(run.insert_rows_per_s),
                              note=f"batch p50 {run.batch_ms_p50:.0f} ms, meta engine "
                                   f"{_ms(run.meta_ms_per_batch)} ms/batch, retries {run.retry_codes}",
                              storage=storage))
            lines.append(Line(f"  end to end, {key}, {run.threads} thread(s)", _rate(run.end_to_end_rows_per_s),
                              note=f"{run.replicated_seconds:.1f} s; replicas done at "
                                   + ", ".join(f"{c.cluster} ({c.mode}) {c.replicated_seconds:.1f} s"
                                               for c in run.replicas)
                                   + ("" if run.verified else "; NOT VERIFIED")
                                   + _cpu_note(run.cpu_seconds, "s until complete"),
                              storage=storage))
        ratio = best.end_to_end_rows_per_s / pg_e2e if pg_e2e else None
        ok = ratio is not None and ratio >= TARGET_RATIO and best.verified
        all_ok &= ok or ratio is None
        lines.append(Line(f"insert rows/s, {key}", _rate(best.insert_rows_per_s),
                          _rate(pg_tp.insert_rows_per_s) if pg_tp else "-",
                          note=f"best: {best.threads} client thread(s); PostgreSQL: COPY into the publisher",
                          storage=storage))
        lines.append(Line(f"end-to-end rows/s, {key}", _rate(best.end_to_end_rows_per_s), _rate(pg_e2e),
                          "-" if ratio is None else f"{ratio:.2f}x", f">= {TARGET_RATIO}x",
                          "" if ratio is None else ("PASS" if ok else "MISS"),
                          f"best: {best.threads} client thread(s); verified {best.verified}; PostgreSQL: 2 "
                          "subscribers" + ("" if pg_tp is None else f", verified {pg_tp.verified}"),
                          storage=storage))
    lat: LatencyRun | None = rep.get("latency")
    if lat is not None:
        ok = lat.p50_ms <= TARGET_COMMIT_P50_MS and lat.verified
        all_ok &= ok
        lines.append(Line("single-row commit p50 ms, 1 sync replica", _ms(lat.p50_ms),
                          _ms(pg_lat.p50_ms) if pg_lat else "-", "", f"<= {TARGET_COMMIT_P50_MS:g} ms",
                          "PASS" if ok else "MISS",
                          f"{lat.samples:,} commits; meta engine mean {_ms(lat.meta_mean_ms)} ms; retries "
                          f"{lat.retry_codes}; PostgreSQL: subscriber as synchronous standby"
                          + (f" ({pg_lat.sync_state})" if pg_lat else "")
                          + _cpu_note(lat.cpu_ms_per_commit, "ms per commit"),
                          storage=storage))
        ok99 = lat.p99_ms <= TARGET_COMMIT_P99_MS and lat.verified
        all_ok &= ok99
        lines.append(Line("single-row commit p99 ms, 1 sync replica", _ms(lat.p99_ms),
                          _ms(pg_lat.p99_ms) if pg_lat else "-", "", f"<= {TARGET_COMMIT_P99_MS:g} ms",
                          "PASS" if ok99 else "MISS",
                          note=f"mean {lat.mean_ms:.2f}, max {lat.max_ms:.2f}" + (
                              f"; PostgreSQL mean {pg_lat.mean_ms:.2f}, max {pg_lat.max_ms:.2f}" if pg_lat else ""),
                          storage=storage))
    return lines, all_ok


def storage_lines(reps: dict[str, dict[str, Any]]) -> list[Line]:
    """reptables on PostgreSQL against reptables on SQLite, when the run measured both."""
    if SQLITE not in reps or POSTGRESQL not in reps:
        return []
    lite, pg = reps[SQLITE], reps[POSTGRESQL]
    lines: list[Line] = []
    for key in ("2 async", "1 sync + 1 async"):
        if lite.get(key) and pg.get(key):
            a, b = best_run(lite[key]), best_run(pg[key])
            ratio = b.end_to_end_rows_per_s / a.end_to_end_rows_per_s
            lines.append(Line(f"end-to-end rows/s, {key}: PostgreSQL-backed / SQLite-backed",
                              _rate(b.end_to_end_rows_per_s), ratio=f"{ratio:.2f}x",
                              note=f"SQLite-backed {_rate(a.end_to_end_rows_per_s)} rows/s", storage="both"))
    if lite.get("latency") is not None and pg.get("latency") is not None:
        a_lat, b_lat = lite["latency"], pg["latency"]
        lines.append(Line("single-row commit p50 ms, 1 sync replica: PostgreSQL-backed / SQLite-backed",
                          _ms(b_lat.p50_ms), ratio=f"{b_lat.p50_ms / a_lat.p50_ms:.2f}x",
                          note=f"SQLite-backed {_ms(a_lat.p50_ms)} ms", storage="both"))
    return lines


def print_lines(lines: list[Line], out: Any = None) -> None:
    out = sys.stdout if out is None else out  # looked up per call: a test's capture replaces sys.stdout
    head = Line("figure", "reptables", "PostgreSQL 15", "ratio", "target", "", storage="storage")
    cols = ("figure", "storage", "reptables", "postgres", "ratio", "target", "status")
    widths = [max(len(getattr(x, c)) for x in [head, *lines]) for c in cols]
    rule = "  ".join("-" * w for w in widths)

    def render(x: Line) -> str:
        cells = [getattr(x, c) for c in cols]
        text = "  ".join(v.ljust(w) if i in (0, 1, 5, 6) else v.rjust(w)
                         for i, (v, w) in enumerate(zip(cells, widths, strict=True)))
        return (text + (f"  ({x.note})" if x.note else "")).rstrip()

    print(rule, file=out)
    print(render(head), file=out)
    print(rule, file=out)
    for x in lines:
        print(render(x), file=out)
    print(rule, file=out)


# -- command line ----------------------------------------------------------------------------------


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so the finally blocks stop every server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows written in each throughput run")
    p.add_argument("--batch-size", type=int, default=10_000, help="rows per insert_rows / COPY transaction")
    p.add_argument("--threads", default="1,2", help="client thread counts tried for reptables (default 1,2)")
    p.add_argument("--latency-samples", type=int, default=1000, help="single-row commits timed (0 skips it)")
    p.add_argument("--storage", default=SQLITE, metavar="LIST",
                   help="the storage of the reptables engines, one or both, one after the other: sqlite "
                        "(default), postgresql (each engine a database of one PostgreSQL server the benchmark "
                        "starts, or --pg-server's), sqlite,postgresql")
    p.add_argument("--pg-server", default=None, metavar="[USER@]HOST:PORT",
                   help="with --storage postgresql: an existing PostgreSQL server on loopback for the engines' "
                        "databases (user 'reptables' unless given; a password from $PGPASSWORD or a pgpass file), "
                        "instead of starting one; the databases are dropped after each scenario")
    p.add_argument("--skip-pg", action="store_true", help="measure reptables only")
    p.add_argument("--skip-reptables", action="store_true", help="measure PostgreSQL only")
    p.add_argument("--timeout", type=float, default=1800.0, help="bound of each insert phase and each wait (s)")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the temporary data directories "
                   "(default: the system temp dir; use a real disk, not tmpfs)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write every figure as JSON")
    args = p.parse_args(argv)
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        p.error("--threads must be a comma-separated list of integers")
    try:
        storages = parse_backends(args.storage)
    except ValueError as exc:
        p.error(f"--storage: {exc}")
    if args.pg_server is not None and POSTGRESQL not in storages:
        p.error("--pg-server needs --storage postgresql (or sqlite,postgresql)")
    if args.rows < 1 or args.batch_size < 1 or args.latency_samples < 0 or not thread_counts \
            or min(thread_counts) < 1:
        p.error("--rows, --batch-size and --threads must be positive, --latency-samples >= 0")
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    base = args.workdir or Path(tempfile.gettempdir())
    started = time.perf_counter()
    load_start = load_average()

    reps: dict[str, dict[str, Any]] = {}
    pg_servers: dict[str, Any] = {}
    if not args.skip_reptables:
        for storage in storages:
            if storage == SQLITE:
                reps[storage] = run_reptables(args.rows, args.batch_size, thread_counts, args.latency_samples, base,
                                              args.timeout)
                continue
            log(f"[reptables on PostgreSQL] {'using ' + args.pg_server if args.pg_server else 'starting'} the "
                "PostgreSQL server of the engines' databases ...")
            with PgStorage(args.pg_server, args.workdir) as pg:
                pg_servers[storage] = {"server": pg.describe(), "settings": pg.settings,
                                       "given": args.pg_server is not None}
                log(f"      {pg.describe()}")
                reps[storage] = run_reptables(args.rows, args.batch_size, thread_counts, args.latency_samples, base,
                                              args.timeout, pg)
    pg_tp: pg_logical.PgThroughputResult | None = None
    pg_lat: pg_logical.PgLatencyResult | None = None
    if not args.skip_pg:
        log(f"[PostgreSQL] logical replication: {args.rows:,} rows in COPY batches of {args.batch_size:,}, "
            "publisher + 2 subscribers ...")
        pg_tp = pg_logical.run_logical_replication(args.rows, args.batch_size, args.workdir)
        log(f"      {pg_tp.server_version}; insert {pg_tp.insert_rows_per_s:,.0f} rows/s, end to end "
            f"{pg_tp.end_to_end_rows_per_s:,.0f} rows/s, verified {pg_tp.verified}")
        if args.latency_samples > 0:
            log(f"[PostgreSQL] {args.latency_samples:,} single-row commits, subscriber as synchronous standby ...")
            pg_lat = pg_logical.run_sync_commit_latency(args.latency_samples, args.workdir)
            log(f"      p50 {pg_lat.p50_ms:.2f} ms, p99 {pg_lat.p99_ms:.2f} ms")

    lines: list[Line] = []
    all_ok = True
    for storage, rep in reps.items():
        more, ok = build_lines(rep, pg_tp, pg_lat, storage)
        lines += more
        all_ok &= ok
    lines += storage_lines(reps)
    total = time.perf_counter() - started
    print()
    print(f"replicated tables: reptables vs PostgreSQL 15 logical replication ({args.rows:,} rows, batches of "
          f"{args.batch_size:,}; {total:.0f} s; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}; "
          f"load average {load_start} at start, {load_average()} at end)")
    for storage in reps:
        where = pg_servers[storage]["server"] if storage == POSTGRESQL else "SQLite in each engine's data directory " \
            "(WAL, synchronous=FULL)"
        print(f"reptables engines on {BACKEND_LABELS[storage]}: {where}")
    if pg_tp is not None:
        print(f"PostgreSQL logical replication: {pg_tp.server_version}, 3 servers (publisher + 2 subscribers), "
              "default durability")
    print_lines(lines)
    print(closing_line(lines, all_ok))
    verified = all(r.verified for rep in reps.values()
                   for runs in (rep.get("2 async", []), rep.get("1 sync + 1 async", [])) for r in runs) \
        and all(rep.get("latency") is None or rep["latency"].verified for rep in reps.values()) \
        and (pg_tp is None or pg_tp.verified)
    if not verified:
        print("WARNING: some end state did not verify; see the notes and the JSON")
    if args.json is not None:
        def as_json(rep: dict[str, Any]) -> dict[str, Any]:
            return {key: ([r.to_json() for r in value] if isinstance(value, list)
                          else {**asdict(value), "verified": value.verified}) for key, value in rep.items()}

        payload = {
            "config": {"rows": args.rows, "batch_size": args.batch_size, "threads": thread_counts,
                       "latency_samples": args.latency_samples, "storage": storages, "pg_server": args.pg_server,
                       "cpus": os.cpu_count(), "seconds": total},
            "reptables": {storage: as_json(rep) for storage, rep in reps.items()},
            "reptables_postgresql_server": pg_servers.get(POSTGRESQL),
            "postgresql": {"throughput": None if pg_tp is None else {**asdict(pg_tp), "verified": pg_tp.verified},
                           "sync_commit_latency": None if pg_lat is None else asdict(pg_lat)},
            "figures": [asdict(x) for x in lines],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
