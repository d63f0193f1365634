"""How the cost of replication grows with tables, tablets, replicas and XDCR members.

Why this benchmark: a YTsaurus cluster holds thousands of replicated tables, and an engine whose
replication costs something per table *while nothing is written* stops working long before that
(issue 27 measured 86 % of a core idle on a meta-cluster with 300 tables). Throughput benchmarks
never see it: they write one table. So this one grows one dimension at a time and measures, at each
point, what a user of many tables meets:

* **tables**: N replicated tables (sorted, one tablet) on one meta-cluster, each with two async
  replicas on two other engines;
* **tablets**: one replicated table resharded into T tablets before its first mount, two async replicas;
* **replicas**: one replicated table with R async replicas (on two replica engines, at R paths);
* **members**: one XDCR table on M engines (an XDCR group, every pair connected);
* **operator**: the kopf operator reconciling N TableReplica objects (``--replica-objects``) against
  an emulated Kubernetes API, with real engines behind them (see below).

At each point, on every engine (``/proc``, the engine's own process): its **threads** and **RSS**
after the setup, its **idle CPU** (% of one core over ``--idle-seconds`` with nothing written, after
``--settle-seconds``; for tables again after the fan-out below, over ``--idle-after-seconds``, 31 by
default, so that the window holds a compaction pass over the tables just written), the **time to
create** the setup (for tables also the time of the last batch of ``--batch`` tables against the
first: creating the 1,000th table should cost what the 10th did), the **single-row commit p50** (one
row into one replicated table, async replicas: what every writer pays) and the **lookup p50** (one
key of a replica table), and the **fan-out time**: one row written into every table (every tablet;
on every member) until every replica (member) holds it (tables and tablets: until the replica
engines' counts of committed rows say so, then checked row by row; see ``_fan_out``).

Goals (issue 27) at 1,000 tables x 2 async replicas: idle CPU <= 2 % of a core per engine (before
and after every table was written once), engine threads bounded by a pool size (not by replicas),
the last batch created as fast as the first, commit and lookup p50 within 20 % of the 10-table
point, fan-out within 5 s. The table marks them.

The operator dimension answers the control plane's half of the question: a cluster with 1,000
replicas has 1,000 TableReplica objects, and the operator must bring them all to Ready and then cost
little while it refreshes them. No Kubernetes API server can run here, so the API is the operator
tests' emulator (``tests/k8s/emulator.py``: kmock with an API server's metadata, status subresource,
watches and CRD validation), started as a program (``python -m tests.k8s.emulator``: nothing imports
from tests/) in a process of its own; the operator is the real one (``reptables operator``, kopf and
the handlers) in another process, pointed at it by a kubeconfig; the engines are real (meta, r0, r1).
The shape: ceil(N/2) ReplicatedTables on the meta-cluster, each with two async TableReplicas (on r0
and r1; the last table has one when N is odd), all POSTed at once (4 client threads) after the
three TableClusters are Ready. Measured from the first POST until every TableReplica and every
ReplicatedTable has ``Ready=True`` in its status (the namespace listed every 0.25-1 s, so the time
is that much coarse): the **time to Ready**, the operator's **CPU seconds** over it (utime+stime of
its process from ``/proc``, all its threads; the emulator and the engines are other processes,
counted apart), the **API requests** it made (the emulator's access log, minus this benchmark's
own requests, which carry their own User-Agent); then, after ``--settle-seconds``, its **threads**,
**RSS**, **idle CPU** and API requests per second over ``--idle-seconds`` (the status refresh,
``--status-refresh``, defaults to the operator's own 5 s). ``verified``: the meta-cluster's tables
hold N enabled replicas, as the statuses say.

Engines are started with :class:`reptables.testing.EngineSet` on free loopback ports in a temporary
directory, each in its own process group, and stopped by pid at the end of each point, also on an
error or Ctrl-C; so are the operator and the API emulator (each in a session of its own). Every wait
is bounded.

    .venv/bin/python benchmarks/scale_bench.py                 # 10, 100, 1000 tables; tablets; replicas; members
    .venv/bin/python benchmarks/scale_bench.py --quick         # small points, ~70 s on an idle machine
    .venv/bin/python benchmarks/scale_bench.py --tables 10,300 --dimensions tables --json out.json
    .venv/bin/python benchmarks/scale_bench.py --dimensions operator --replica-objects 10,100,1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from reptables.engine.errors import YtError  # noqa: E402
from reptables.testing import KV_SCHEMA, EngineSet, free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
DIMENSIONS = ("tables", "tablets", "replicas", "members", "operator")
#: the option that lists each dimension's sizes (the others are named as their dimension)
SIZE_OPTIONS = {"operator": "replica_objects"}
#: the goals of issue 27 at the largest point of ``tables``
IDLE_CPU_GOAL_PCT = 2.0
FAN_OUT_GOAL_S = 5.0
LATENCY_GOAL_RATIO = 1.2


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- what /proc says about an engine -------------------------------------------------------------------


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def status_value(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def idle_cpu_pct(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """% of one core each process used over ``seconds`` of wall time."""
    before = {n: cpu_ticks(p) for n, p in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return {n: round(100.0 * (cpu_ticks(p) - before[n]) / CLK_TCK / wall, 2) for n, p in pids.items()}


# -- one point ---------------------------------------------------------------------------------------------


@dataclass
class OperatorFigures:
    """What the operator dimension measures beyond the engines' figures (see the module docstring)."""

    replica_objects: int
    table_objects: int
    status_refresh_s: float
    #: the operator's and the API emulator's pids (stopped when the point ends)
    pids: dict[str, int] = field(default_factory=dict)
    #: seconds to POST every object
    apply_s: float = 0.0
    #: seconds from the first POST until every TableReplica (ReplicatedTable) was Ready; None: not
    #: within ``ready_timeout_s`` (the figures below are then those of the timeout, and no idle is measured)
    replicas_ready_s: float | None = None
    tables_ready_s: float | None = None
    ready_timeout_s: float = 0.0
    #: how many were Ready at the end (after the idle window, or at the timeout)
    ready_replicas: int = 0
    ready_tables: int = 0
    #: [seconds since the first POST, TableReplicas Ready, ReplicatedTables Ready] about every 10 s
    progress: list[tuple[float, int, int]] = field(default_factory=list)
    #: CPU seconds from the first POST until all were Ready: the operator's, the emulator's, the engines' (sum)
    operator_cpu_s: float = 0.0
    emulator_cpu_s: float = 0.0
    engines_cpu_s: float = 0.0
    #: API requests the operator made until all were Ready (all, and writes: POST/PUT/PATCH/DELETE)
    api_requests: int = 0
    api_writes: int = 0
    #: after the settle: the operator's threads and RSS, idle CPU (% of one core) and API requests per second
    threads: int = 0
    rss_mib: float = 0.0
    idle_cpu_pct: float | None = None
    emulator_idle_cpu_pct: float | None = None
    idle_api_requests_per_s: float | None = None
    #: seconds after the settle until the operator's API writes fell quiet (the idle window begins then)
    quiet_after_s: float | None = None

    @property
    def ready_s(self) -> float | None:
        """Seconds until every object was Ready (None: not within the timeout)."""
        if self.replicas_ready_s is None or self.tables_ready_s is None:
            return None
        return max(self.replicas_ready_s, self.tables_ready_s)

    @property
    def measured_s(self) -> float:
        """The span the CPU and requests were counted over: until all were Ready, else the timeout."""
        ready = self.ready_s
        return self.ready_timeout_s if ready is None else ready


@dataclass
class Point:
    dimension: str
    size: int
    engines: list[str] = field(default_factory=list)
    #: the engines' pids (all stopped when the point ends)
    pids: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    idle_cpu_pct: dict[str, float] = field(default_factory=dict)
    #: tables only: idle CPU again after the fan-out (every table written once: what the background
    #: passes over written tables cost, compaction's every 30 s among them)
    idle_after_cpu_pct: dict[str, float] = field(default_factory=dict)
    create_s: float = 0.0
    #: tables only: seconds per table of the first and the last batch created
    first_batch_s_per_table: float | None = None
    last_batch_s_per_table: float | None = None
    commit_p50_ms: float | None = None
    lookup_p50_ms: float | None = None
    fan_out_s: float | None = None
    verified: bool = False
    notes: list[str] = field(default_factory=list)
    #: the operator dimension only
    operator: OperatorFigures | None = None


def timed(fn: Callable[[], Any], samples: int) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000.0, 3)


def _measure(point: Point, es: EngineSet, args: argparse.Namespace) -> None:
    pids = es.pids()
    point.engines, point.pids = list(pids), dict(pids)
    progress(f"    settling {args.settle_seconds:g} s, then idle CPU over {args.idle_seconds:g} s ...")
    time.sleep(args.settle_seconds)
    point.threads = {n: status_value(p, "Threads") for n, p in pids.items()}
    point.rss_mib = {n: round(status_value(p, "VmRSS") / 1024.0, 1) for n, p in pids.items()}
    point.idle_cpu_pct = idle_cpu_pct(pids, args.idle_seconds)


def _await_all(what: str, pending: set[Any], check: Callable[[Any], bool], timeout: float) -> float:
    """Seconds until ``check`` held for every item of ``pending`` (each checked until it holds)."""
    started = time.monotonic()
    deadline = started + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {len(pending)} not done after {timeout:g} s")
        for item in list(pending):
            if check(item):
                pending.discard(item)
        if pending:
            time.sleep(0.02)
    return time.monotonic() - started


def _replicated(es: EngineSet, path: str, replicas: Iterable[tuple[str, str]],
                pivot_keys: list[list[Any]] | None = None) -> list[str]:
    """A replicated table with async replicas at (cluster, path), enabled without waiting; their ids."""
    meta = es.meta
    attrs: dict[str, Any] = {"dynamic": True, "schema": KV_SCHEMA}
    if pivot_keys:
        attrs["pivot_keys"] = pivot_keys
    meta.create("replicated_table", path, attributes=attrs, recursive=True)
    meta.mount_table(path)
    ids = [es.replica(path, cluster, replica_path, mode="async", enable=False) for cluster, replica_path in replicas]
    for replica_id in ids:
        es.alter(replica_id, wait=False, enabled=True)
    return ids


def _all_enabled(es: EngineSet, ids: list[str], timeout: float) -> None:
    pending = set(ids)
    _await_all("replicas enabled", pending, lambda r: es.meta.get(f"#{r}/@state") == "enabled", timeout)


def _latencies(point: Point, es: EngineSet, path: str, cluster: str, replica_path: str, samples: int) -> None:
    meta = es.meta
    counter = iter(range(10**9))
    point.commit_p50_ms = timed(lambda: meta.insert_rows(path, [{"k": 10**8 + next(counter), "v": "latency"}],
                                                         require_sync_replica=False), samples)
    replica = es.client(cluster)
    point.lookup_p50_ms = timed(lambda: replica.lookup_rows(replica_path, [{"k": 10**8}]), samples)


def run_tables(n: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("tables", n)
    with EngineSet(base, names=("meta", "r0", "r1")) as es:
        started = time.monotonic()
        batch_times: list[float] = []
        ids: list[str] = []
        for first in range(0, n, args.batch):
            batch_started = time.monotonic()
            for i in range(first, min(n, first + args.batch)):
                path = f"//tmp/t{i}"
                ids += _replicated(es, path, (("r0", path), ("r1", path)))
            batch_times.append((time.monotonic() - batch_started) / max(1, min(args.batch, n - first)))
        point.first_batch_s_per_table = round(batch_times[0], 4)
        point.last_batch_s_per_table = round(batch_times[-1], 4)
        _all_enabled(es, ids, 60 + n * 0.2)
        point.create_s = round(time.monotonic() - started, 2)
        _measure(point, es, args)
        _latencies(point, es, "//tmp/t0", "r0", "//tmp/t0", args.samples)
        point.fan_out_s, point.verified = _fan_out(es, [f"//tmp/t{i}" for i in range(n)], ("r0", "r1"), args)
        # (by default over more than one compaction period, 30 s: a pass visits the tables just written)
        seconds = args.idle_after_seconds
        progress(f"    settling {args.settle_seconds:g} s, then idle CPU after the fan-out over {seconds:g} s ...")
        time.sleep(args.settle_seconds)
        point.idle_after_cpu_pct = idle_cpu_pct(es.pids(), seconds)
    return point



_ROWS_WRITTEN = re.compile(r"^reptables_rows_written_total (\S+)$", re.M)


def _rows_written(es: EngineSet, cluster: str) -> float:
    """The rows an engine has committed so far (``reptables_rows_written``, counted once a commit,
    a push's included, is durable), from its ``/metrics``."""
    engine = es.engines[cluster]
    text = httpx.get(f"{engine.url}/metrics", timeout=10,
                     headers={"Authorization": f"OAuth {engine.read_token()}"}).raise_for_status().text
    found = _ROWS_WRITTEN.search(text)
    return float(found.group(1)) if found else 0.0


def _fan_out(es: EngineSet, paths: list[str], clusters: tuple[str, ...], args: argparse.Namespace,
             key_of: Callable[[str], list[int]] | None = None) -> tuple[float, bool]:
    """One row (or one per key of ``key_of(path)``) written into every table, then the seconds until
    every replica table on ``clusters`` (same paths) holds it.

    The moment they all arrived is read from each replica engine's count of committed rows (one
    request per engine every 20 ms), then the rows themselves are looked up. The lookups alone, a
    pass of one per table and cluster (2,000 at 1,000 tables, about a second), said when the last
    arrived only to within their own pass. If the lookups find a row missing when the counts said
    all had arrived, the figure is the time the lookups saw the last one instead (never earlier)."""
    meta = es.meta
    keys_of = {path: key_of(path) if key_of else [7] for path in paths}
    expected = sum(map(len, keys_of.values()))
    before = {c: _rows_written(es, c) for c in clusters}
    for _ in range(50):  # until earlier writes have all arrived (the counts hold still for 0.1 s)
        time.sleep(0.1)
        now = {c: _rows_written(es, c) for c in clusters}
        if now == before:
            break
        before = now
    marker = f"fan-out-{time.time_ns()}"
    started = time.monotonic()
    for path in paths:
        meta.insert_rows(path, [{"k": k, "v": marker} for k in keys_of[path]], require_sync_replica=False)
    deadline = started + args.fan_out_timeout
    while any(_rows_written(es, c) < before[c] + expected for c in clusters):
        if time.monotonic() > deadline:
            break  # (the lookups below say what is missing)
        time.sleep(0.02)
    counted = time.monotonic()
    clients = {c: es.client(c) for c in clusters}

    def arrived(item: tuple[str, str]) -> bool:
        cluster, path = item
        keys = keys_of[path]
        rows = clients[cluster].lookup_rows(path, [{"k": k} for k in keys])
        return len(rows) == len(keys) and all(r is not None and r["v"] == marker for r in rows)

    pending = {(c, p) for c in clusters for p in paths}
    missing = {item for item in pending if not arrived(item)}
    if not missing:
        return round(counted - started, 3), True
    _await_all("fan-out", missing, arrived, args.fan_out_timeout)
    return round(time.monotonic() - started, 3), True


def run_tablets(t: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("tablets", t)
    with EngineSet(base, names=("meta", "r0", "r1")) as es:
        started = time.monotonic()
        pivots: list[list[Any]] = [[]] + [[i * 1000] for i in range(1, t)]
        path = "//tmp/tablets"
        _all_enabled(es, _replicated(es, path, (("r0", path), ("r1", path)), pivot_keys=pivots), 60)
        point.create_s = round(time.monotonic() - started, 2)
        _measure(point, es, args)
        _latencies(point, es, path, "r0", path, args.samples)
        point.fan_out_s, point.verified = _fan_out(es, [path], ("r0", "r1"), args,
                                                   key_of=lambda _: [i * 1000 + 7 for i in range(t)])
    return point


def run_replicas(r: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("replicas", r)
    with EngineSet(base, names=("meta", "r0", "r1")) as es:
        started = time.monotonic()
        path = "//tmp/fan"
        targets = [("r0" if i % 2 == 0 else "r1", f"//tmp/fan_{i}") for i in range(r)]
        _all_enabled(es, _replicated(es, path, targets), 60)
        point.create_s = round(time.monotonic() - started, 2)
        _measure(point, es, args)
        _latencies(point, es, path, targets[0][0], targets[0][1], args.samples)
        meta = es.meta
        marker = f"fan-out-{time.time_ns()}"
        fan_started = time.monotonic()
        meta.insert_rows(path, [{"k": 7, "v": marker}], require_sync_replica=False)

        def arrived(target: tuple[str, str]) -> bool:
            rows = es.client(target[0]).lookup_rows(target[1], [{"k": 7}])
            return bool(rows) and rows[0] is not None and rows[0]["v"] == marker

        _await_all("fan-out", set(targets), arrived, args.fan_out_timeout)
        point.fan_out_s, point.verified = round(time.monotonic() - fan_started, 3), True
    return point


def run_members(m: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("members", m)
    names = tuple(f"x{i}" for i in range(m))
    with EngineSet(base, names=names, cluster_ids=True) as es:
        started = time.monotonic()
        path = "//tmp/xdcr"
        for name in names:
            es.client(name).create("table", path, recursive=True,
                                   attributes={"dynamic": True, "schema": KV_SCHEMA, "xdcr": True})
            es.client(name).mount_table(path)
        es.connect()  # every member connected with every other (the group's directory)
        point.create_s = round(time.monotonic() - started, 2)
        _measure(point, es, args)
        first = es.client(names[0])
        counter = iter(range(10**9))
        point.commit_p50_ms = timed(lambda: first.insert_rows(path, [{"k": 10**8 + next(counter), "v": "l"}]),
                                    args.samples)
        point.lookup_p50_ms = timed(lambda: first.lookup_rows(path, [{"k": 10**8}]), args.samples)
        marker = f"fan-out-{time.time_ns()}"
        fan_started = time.monotonic()
        for i, name in enumerate(names):
            es.client(name).insert_rows(path, [{"k": i, "v": marker}])

        def arrived(item: tuple[str, int]) -> bool:
            rows = es.client(item[0]).lookup_rows(path, [{"k": item[1]}])
            return bool(rows) and rows[0] is not None and rows[0]["v"] == marker

        _await_all("XDCR fan-out", {(n, i) for n in names for i in range(m)}, arrived, args.fan_out_timeout)
        point.fan_out_s, point.verified = round(time.monotonic() - fan_started, 3), True
    return point


# -- the operator: kopf reconciling TableReplicas against the emulated API ---------------------------------

API_GROUP_PATH = "/apis/reptables.io/v1alpha1"
API_VERSION = "reptables.io/v1alpha1"
NAMESPACE = "scale-bench"
#: this benchmark's requests to the emulator carry it, so that its access log tells them from the operator's
BENCH_AGENT = "reptables-scale-bench"
CRD_SCHEMA = [{"name": "k", "type": "int64", "sortOrder": "ascending"}, {"name": "v", "type": "string"}]
CREDENTIALS_LABELS = {"reptables.io/credentials": "true"}
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ACCESS_LINE = re.compile(r'aiohttp\.access:.*?"([A-Z]+) [^"]*" \d+ \S+ "[^"]*" "([^"]*)"')
APPLY_THREADS = 4


class Child:
    """A helper program in a session of its own, its output in ``log``; stopped by its pid (SIGTERM to
    its process group, SIGKILL after a bounded wait)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.log = name, log
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), environ.get("PYTHONPATH", "")) if p)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=environ,
                                         start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.output()[-2000:]}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # a session of its own: pgid == pid
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def spawn_emulator(base: Path, stack: contextlib.ExitStack) -> tuple[Child, Path]:
    """The operator tests' Kubernetes API emulator as a program (stopped when ``stack`` closes), and the
    path where it writes a kubeconfig for itself; :func:`emulator_url` waits for it."""
    kubeconfig = base / "kubeconfig"
    emulator = Child("the API emulator", [sys.executable, "-m", "tests.k8s.emulator", "--kubeconfig",
                                          str(kubeconfig)], base / "api.log")
    stack.callback(emulator.stop)
    return emulator, kubeconfig


def emulator_url(emulator: Child, kubeconfig: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not (match := re.search(r"emulator at (http://\S+);", emulator.output())) or not kubeconfig.exists():
        emulator.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the API emulator did not start within {timeout:g} s")
        time.sleep(0.1)
    return match.group(1)


def wait_quiet(emulator: Child, objects: int, window: float = 2.0, limit: float = 300.0) -> float:
    """Wait until the operator's API writes fall to at most 1 % of ``objects`` in a ``window``: every
    object Ready is not the end of its work (kopf still finishes creation handlers it retried, each
    with an annotation patch and a status patch; at 1,000 TableReplicas that went on for more than
    30 s after the last Ready). Returns the seconds waited (``limit`` if it never fell)."""
    started = time.monotonic()
    writes = api_requests(emulator)[1]
    while time.monotonic() - started < limit:
        time.sleep(window)
        now = api_requests(emulator)[1]
        if now - writes <= max(1, objects // 100):
            break
        writes = now
    return round(time.monotonic() - started, 1)


def api_requests(emulator: Child) -> tuple[int, int]:
    """(requests, writes) the emulator has served to anyone but this benchmark: its access log's lines
    (aiohttp logs a request when it ends; a watch, when its stream ends)."""
    total = writes = 0
    for match in ACCESS_LINE.finditer(emulator.output()):
        if match.group(2) != BENCH_AGENT:
            total += 1
            writes += match.group(1) in WRITE_METHODS
    return total, writes


class Api:
    """The few calls the benchmark makes to the emulated API (plain HTTP, its own User-Agent)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"User-Agent": BENCH_AGENT}, timeout=60.0)

    def close(self) -> None:
        self.http.close()

    def create(self, path: str, obj: dict[str, Any]) -> None:
        response = self.http.post(path, json=obj)
        if response.status_code >= 300:
            raise RuntimeError(f"POST {path} {obj['metadata']['name']}: {response.status_code} {response.text[:500]}")

    def items(self, path: str) -> list[dict[str, Any]]:
        response = self.http.get(path)
        if response.status_code >= 300:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:500]}")
        return list(response.json()["items"])


def _collection(plural: str) -> str:
    """The API path of a kind's objects: TableClusters are cluster-scoped, the others in ``NAMESPACE``."""
    return f"{API_GROUP_PATH}/{plural}" if plural == "tableclusters" else \
        f"{API_GROUP_PATH}/namespaces/{NAMESPACE}/{plural}"


def _ready(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _not_ready_example(items: list[dict[str, Any]]) -> str:
    for obj in items:
        if not _ready(obj):
            ready = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
            why = f"{ready[0].get('reason')}: {ready[0].get('message')}" if ready else "no Ready condition yet"
            return f"{obj['metadata']['name']}: {why}"
    return "-"


def _manifests(n: int) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) of ceil(n/2) ReplicatedTables, each followed by its (two) TableReplicas."""
    objects: list[tuple[str, dict[str, Any]]] = []
    for t in range(math.ceil(n / 2)):
        path = f"//bench/t{t}"
        objects.append((_collection("replicatedtables"), {
            "apiVersion": API_VERSION, "kind": "ReplicatedTable", "metadata": {"name": f"t{t}", "namespace": NAMESPACE},
            "spec": {"cluster": "meta", "path": path, "schema": CRD_SCHEMA, "deletionPolicy": "Retain"}}))
        for r in range(2 * t, min(n, 2 * t + 2)):
            objects.append((_collection("tablereplicas"), {
                "apiVersion": API_VERSION, "kind": "TableReplica",
                "metadata": {"name": f"t{t}-r{r % 2}", "namespace": NAMESPACE},
                "spec": {"table": f"t{t}", "cluster": f"r{r % 2}", "replicaPath": path, "mode": "async",
                         "deletionPolicy": "Retain"}}))
    return objects


@dataclass
class Readiness:
    """What :func:`await_ready` saw: seconds until each kind was all Ready, and the last counts."""

    done: dict[str, float]
    counts: dict[str, int]
    example: str = "-"
    #: [seconds, count of each kind in order] about every 10 s
    samples: list[tuple[float, *tuple[int, ...]]] = field(default_factory=list)


def await_ready(api: Api, operator: Child, wanted: dict[str, int], started: float, timeout: float,
                poll: float, strict: bool = True) -> Readiness:
    """Until ``wanted[plural]`` objects of each kind are Ready (listed every ``poll`` s), for at most
    ``timeout`` s after ``started``; then a TimeoutError, or (not ``strict``) what was seen."""
    seen = Readiness({}, dict.fromkeys(wanted, 0))
    reported = time.monotonic()
    while True:
        operator.check_alive()
        for plural, want in wanted.items():
            if plural in seen.done:
                continue
            items = api.items(_collection(plural))
            seen.counts[plural] = sum(map(_ready, items))
            if seen.counts[plural] >= want:
                seen.done[plural] = round(time.monotonic() - started, 2)
            else:
                seen.example = _not_ready_example(items)
        now = time.monotonic()
        if len(seen.done) == len(wanted):
            return seen
        if now - started > timeout:
            if strict:
                raise TimeoutError(f"Ready after {timeout:g} s: {seen.counts} of {wanted} (e.g. {seen.example})")
            return seen
        if now - reported >= 10:
            progress(f"    {now - started:.0f} s: Ready {seen.counts} of {wanted}")
            seen.samples.append((round(now - started, 1), *seen.counts.values()))
            reported = now
        time.sleep(poll)


def run_operator(n: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("operator", n)
    tables = math.ceil(n / 2)
    figures = point.operator = OperatorFigures(n, tables, args.status_refresh)
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        # the emulator and the operator import for seconds: each starts while something else does
        emulator, kubeconfig = spawn_emulator(base, stack)
        figures.pids["emulator"] = emulator.pid
        es = stack.enter_context(EngineSet(base, names=("meta", "r0", "r1"), cluster_ids=True))
        point.engines, point.pids = list(es.names), es.pids()
        api = Api(emulator_url(emulator, kubeconfig))
        stack.callback(api.close)
        # (kopf watches only the namespaces that exist when it starts)
        api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        operator = Child("the operator", [
            sys.executable, "-m", "reptables.operator.cli", "operator", "--standalone", "--namespace", NAMESPACE,
            "--operator-namespace", NAMESPACE, "--status-refresh", f"{args.status_refresh:g}",
            "--liveness", f"http://127.0.0.1:{free_port()}/healthz", "--metrics-port", "0"],
            base / "operator.log", env={"KUBECONFIG": str(kubeconfig)})
        stack.callback(operator.stop)
        figures.pids["operator"] = operator.pid
        for index, name in enumerate(es.names, start=1):
            api.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": f"{name}-token", "namespace": NAMESPACE, "labels": CREDENTIALS_LABELS},
                "stringData": {"token": es.engines[name].read_token()}})
            api.create(_collection("tableclusters"), {
                "apiVersion": API_VERSION, "kind": "TableCluster", "metadata": {"name": name},
                "spec": {"endpoint": es.engines[name].url, "clusterId": index,
                         "credentialsSecret": {"name": f"{name}-token", "namespace": NAMESPACE}}})
        try:
            # the operator's start (kopf's import, its watches, the TableClusters' probes) is not measured
            await_ready(api, operator, {"tableclusters": len(es.names)}, time.monotonic(), 90.0, 0.1)
            progress(f"    engines, API emulator and operator up in {time.monotonic() - started:.1f} s")
            _run_operator_point(point, figures, es, api, emulator, operator, args)
        except (TimeoutError, RuntimeError):
            progress(f"    the operator's log ends:\n{operator.output()[-3000:]}")
            raise
    return point


def _run_operator_point(point: Point, figures: OperatorFigures, es: EngineSet, api: Api, emulator: Child,
                        operator: Child, args: argparse.Namespace) -> None:
    n, tables = figures.replica_objects, figures.table_objects
    pids = {"operator": operator.pid, "emulator": emulator.pid, **es.pids()}
    ticks = {name: cpu_ticks(pid) for name, pid in pids.items()}
    requests = api_requests(emulator)
    objects = _manifests(n)
    progress(f"    applying {tables} ReplicatedTables and {n} TableReplicas ...")
    started = time.monotonic()
    with ThreadPoolExecutor(APPLY_THREADS) as pool:
        list(pool.map(lambda item: api.create(*item), objects))
    figures.apply_s = round(time.monotonic() - started, 2)
    progress(f"    applied in {figures.apply_s:.1f} s")
    figures.ready_timeout_s = args.ready_timeout if args.ready_timeout is not None else 120.0 + 3.0 * n
    seen = await_ready(api, operator, {"tablereplicas": n, "replicatedtables": tables}, started,
                       figures.ready_timeout_s, poll=min(1.0, max(0.25, n / 1000)), strict=False)
    used = {name: (cpu_ticks(pid) - ticks[name]) / CLK_TCK for name, pid in pids.items()}
    figures.api_requests, figures.api_writes = (a - b for a, b in zip(api_requests(emulator), requests, strict=True))
    figures.replicas_ready_s = seen.done.get("tablereplicas")
    figures.tables_ready_s = seen.done.get("replicatedtables")
    figures.ready_replicas, figures.ready_tables = seen.counts["tablereplicas"], seen.counts["replicatedtables"]
    # each sample: seconds, then the count of each kind awaited (TableReplicas, ReplicatedTables)
    figures.progress = [(t, r, tb) for t, *counts in seen.samples for r, tb in [counts]]
    figures.operator_cpu_s = round(used["operator"], 2)
    figures.emulator_cpu_s = round(used["emulator"], 2)
    figures.engines_cpu_s = round(sum(used[name] for name in es.names), 2)
    point.create_s = figures.apply_s
    if figures.ready_s is None:
        # what it cost so far is the finding: no idle to measure, the operator is still at work
        figures.threads = status_value(operator.pid, "Threads")
        figures.rss_mib = round(status_value(operator.pid, "VmRSS") / 1024.0, 1)
        point.notes.append(f"not all Ready within {figures.ready_timeout_s:g} s: {figures.ready_replicas}/{n} "
                           f"TableReplicas, {figures.ready_tables}/{tables} ReplicatedTables (e.g. {seen.example})")
        progress(f"    {point.notes[-1]}")
        return
    progress(f"    all Ready after {figures.ready_s:.1f} s; settling {args.settle_seconds:g} s (more while the "
             f"operator still writes), then idle CPU over {args.idle_seconds:g} s ...")
    time.sleep(args.settle_seconds)
    figures.quiet_after_s = wait_quiet(emulator, n + tables)
    figures.threads = status_value(operator.pid, "Threads")
    figures.rss_mib = round(status_value(operator.pid, "VmRSS") / 1024.0, 1)
    point.threads = {name: status_value(pid, "Threads") for name, pid in es.pids().items()}
    point.rss_mib = {name: round(status_value(pid, "VmRSS") / 1024.0, 1) for name, pid in es.pids().items()}
    idle_requests = api_requests(emulator)[0]
    idle_started = time.monotonic()
    idle = idle_cpu_pct(pids, args.idle_seconds)
    figures.idle_api_requests_per_s = round((api_requests(emulator)[0] - idle_requests)
                                            / (time.monotonic() - idle_started), 2)
    figures.idle_cpu_pct, figures.emulator_idle_cpu_pct = idle["operator"], idle["emulator"]
    point.idle_cpu_pct = {name: idle[name] for name in es.names}
    # still Ready after the idle window, and the engines agree: the meta-cluster holds n enabled replicas
    figures.ready_replicas = sum(map(_ready, api.items(_collection("tablereplicas"))))
    figures.ready_tables = sum(map(_ready, api.items(_collection("replicatedtables"))))
    enabled = sum(1 for t in range(tables) for r in (es.meta.get(f"//bench/t{t}/@replicas") or {}).values()
                  if r.get("state") == "enabled")
    point.verified = figures.ready_replicas == n and figures.ready_tables == tables and enabled == n
    if not point.verified:
        point.notes.append(f"after the idle window: {figures.ready_replicas}/{n} TableReplicas and "
                           f"{figures.ready_tables}/{tables} ReplicatedTables Ready, {enabled} replicas enabled")


RUNNERS: dict[str, Callable[[int, Path, argparse.Namespace], Point]] = {
    "tables": run_tables, "tablets": run_tablets, "replicas": run_replicas, "members": run_members,
    "operator": run_operator}


# -- the report ----------------------------------------------------------------------------------------------


def _print_table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], out: Any) -> None:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("-" * w for w in widths)
    print(rule, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), file=out)
    print(rule, file=out)
    for r in rows:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))),
              file=out)
    print(rule, file=out)


def render_operator(points: list[Point], out: Any) -> None:
    """The operator's table: time to Ready, its CPU, threads, RSS and API requests, per point."""
    head = ("TableReplicas", "ReplicatedTables", "apply s", "Ready s (replicas/tables)", "operator CPU s",
            "CPU % of a core", "API requests (writes)", "threads", "RSS MiB", "quiet after s", "idle CPU %",
            "idle API req/s", "emulator CPU s", "engines CPU s", "engines idle CPU % (max)")
    rows = []

    def secs(value: float | None, f: OperatorFigures) -> str:
        return f">{f.ready_timeout_s:g}" if value is None else f"{value:.1f}"

    def opt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    for p in points:
        f = p.operator
        if f is None or f.apply_s == 0:  # failed before the objects were applied
            rows.append((str(p.size), *("-" for _ in head[1:])))
            continue
        rows.append((str(f.replica_objects), str(f.table_objects), f"{f.apply_s:.1f}",
                     f"{secs(f.replicas_ready_s, f)}/{secs(f.tables_ready_s, f)}", f"{f.operator_cpu_s:.1f}",
                     f"{100.0 * f.operator_cpu_s / max(f.measured_s, 1e-9):.0f}", f"{f.api_requests} ({f.api_writes})",
                     str(f.threads), f"{f.rss_mib:.0f}", opt(f.quiet_after_s), opt(f.idle_cpu_pct),
                     opt(f.idle_api_requests_per_s),
                     f"{f.emulator_cpu_s:.1f}", f"{f.engines_cpu_s:.1f}",
                     opt(max(p.idle_cpu_pct.values(), default=None))))
    _print_table(head, rows, out)
    refresh = sorted({p.operator.status_refresh_s for p in points if p.operator is not None})
    print(f"operator: kopf against the emulated API, status refresh every {'/'.join(f'{r:g}' for r in refresh)} s; "
          "Ready s from the first POST (>T: not within T s); CPU and requests over that time; idle from when its "
          "API writes fell quiet (quiet after s: past the settle)", file=out)
    for p in points:
        if p.notes:
            print(f"operator {p.size}: {'; '.join(p.notes)}", file=out)


def render(points: list[Point], args: argparse.Namespace, out: Any = None) -> bool:
    """The tables of every point (the operator's last); True when the goals held at the largest
    ``tables`` point measured."""
    out = sys.stdout if out is None else out
    operator_points = [p for p in points if p.dimension == "operator"]
    points = [p for p in points if p.dimension != "operator"]
    try:
        return render_engines(points, out) if points else True
    finally:
        if operator_points:
            render_operator(operator_points, out)


def render_engines(points: list[Point], out: Any) -> bool:
    """The engines' table and the goals (see :func:`render`)."""
    head = ("dimension", "size", "threads (max)", "RSS MiB (max)", "idle CPU % (max)", "after writes", "create s",
            "s/table first/last", "commit p50 ms", "lookup p50 ms", "fan-out s")
    rows = []
    for p in points:
        rows.append((p.dimension, str(p.size), str(max(p.threads.values(), default=0)),
                     f"{max(p.rss_mib.values(), default=0):.0f}", f"{max(p.idle_cpu_pct.values(), default=0):.1f}",
                     f"{max(p.idle_after_cpu_pct.values()):.1f}" if p.idle_after_cpu_pct else "-",
                     f"{p.create_s:.1f}",
                     "-" if p.first_batch_s_per_table is None else
                     f"{p.first_batch_s_per_table:.3f}/{p.last_batch_s_per_table:.3f}",
                     "-" if p.commit_p50_ms is None else f"{p.commit_p50_ms:.2f}",
                     "-" if p.lookup_p50_ms is None else f"{p.lookup_p50_ms:.2f}",
                     "-" if p.fan_out_s is None else f"{p.fan_out_s:.2f}"))
    _print_table(head, rows, out)
    for p in points:
        print(f"{p.dimension} {p.size}: threads {p.threads}, idle CPU % {p.idle_cpu_pct}" +
              (f", after the fan-out {p.idle_after_cpu_pct}" if p.idle_after_cpu_pct else ""), file=out)
    tables = [p for p in points if p.dimension == "tables"]
    if not tables:
        return True
    small, large = tables[0], tables[-1]
    goals = {
        f"idle CPU <= {IDLE_CPU_GOAL_PCT:g} % of a core per engine at {large.size} tables":
            max(large.idle_cpu_pct.values()) <= IDLE_CPU_GOAL_PCT,
        f"idle CPU <= {IDLE_CPU_GOAL_PCT:g} % of a core per engine at {large.size} tables, every table written once":
            bool(large.idle_after_cpu_pct) and max(large.idle_after_cpu_pct.values()) <= IDLE_CPU_GOAL_PCT,
        f"one row into every one of {large.size} tables replicated within {FAN_OUT_GOAL_S:g} s":
            large.fan_out_s is not None and large.fan_out_s <= FAN_OUT_GOAL_S,
        f"the last tables created as fast as the first (within {LATENCY_GOAL_RATIO:g}x)":
            large.last_batch_s_per_table is not None and small.first_batch_s_per_table is not None and
            large.last_batch_s_per_table <= LATENCY_GOAL_RATIO * max(small.first_batch_s_per_table, 1e-9),
        f"commit p50 within {LATENCY_GOAL_RATIO:g}x of {small.size} tables":
            large.commit_p50_ms is not None and small.commit_p50_ms is not None and
            large.commit_p50_ms <= LATENCY_GOAL_RATIO * small.commit_p50_ms,
        f"lookup p50 within {LATENCY_GOAL_RATIO:g}x of {small.size} tables":
            large.lookup_p50_ms is not None and small.lookup_p50_ms is not None and
            large.lookup_p50_ms <= LATENCY_GOAL_RATIO * small.lookup_p50_ms,
        "engine threads at the largest point no more than at the smallest + 4":
            max(large.threads.values()) <= max(small.threads.values()) + 4,
    }
    for goal, ok in goals.items():
        print(f"{'PASS' if ok else 'MISS'}  {goal}", file=out)
    return all(goals.values())


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, not {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected positive numbers, not {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dimensions", default=",".join(DIMENSIONS),
                        help=f"which to grow, in order (default all: {','.join(DIMENSIONS)})")
    parser.add_argument("--tables", type=parse_sizes, default=[10, 100, 1000])
    parser.add_argument("--tablets", type=parse_sizes, default=[1, 16, 64])
    parser.add_argument("--replicas", type=parse_sizes, default=[2, 4, 8])
    parser.add_argument("--members", type=parse_sizes, default=[2, 3, 5])
    parser.add_argument("--replica-objects", type=parse_sizes, default=[10, 100, 1000],
                        help="operator: TableReplica objects (half as many ReplicatedTables)")
    parser.add_argument("--status-refresh", type=float, default=5.0,
                        help="operator: seconds between its status refreshes (the operator's default: 5)")
    parser.add_argument("--ready-timeout", type=float, default=None,
                        help="operator: seconds to wait for every object Ready (default 120 + 3 per "
                             "TableReplica: 1,000 took 16-24 min)")
    parser.add_argument("--batch", type=int, default=10, help="tables per creation batch (first vs last)")
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--idle-after-seconds", type=float, default=31.0,
                        help="the idle CPU window after the fan-out (tables): longer than the engines' 30 s "
                             "compaction period, so that it holds a pass over the tables just written")
    parser.add_argument("--samples", type=int, default=200, help="single-row commits and lookups timed per point")
    parser.add_argument("--fan-out-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="small points: 10,40 tables; 1,8 tablets; 2,4 "
                                                             "replicas; 2,3 members; 40 TableReplicas; "
                                                             "short idle windows")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="also write every figure as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.tables, args.tablets, args.replicas, args.members = [10, 40], [1, 8], [2, 4], [2, 3]
        args.replica_objects = [40]  # ~20 s a point (engines, emulator and operator start; one refresh)
        args.settle_seconds, args.idle_seconds, args.samples = 2.0, 3.0, 50
    dimensions = [d.strip() for d in args.dimensions.split(",") if d.strip()]
    unknown = [d for d in dimensions if d not in RUNNERS]
    if unknown:
        parser.error(f"unknown dimension(s) {', '.join(unknown)}: choose from {', '.join(DIMENSIONS)}")
    points: list[Point] = []
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="reptables-scale-", dir=args.workdir) as tmp:
        for dimension in dimensions:
            for size in getattr(args, SIZE_OPTIONS.get(dimension, dimension)):
                progress(f"[{dimension} = {size}] ...")
                try:
                    point = RUNNERS[dimension](size, Path(tmp) / f"{dimension}-{size}", args)
                except (YtError, TimeoutError, RuntimeError, httpx.HTTPError) as exc:
                    point = Point(dimension, size, notes=[f"failed: {exc}"])
                    progress(f"    FAILED: {exc}")
                points.append(point)
                if point.operator is not None:
                    f = point.operator
                    ready = "not all Ready" if f.ready_s is None else f"Ready after {f.ready_s:.1f} s"
                    progress(f"    {ready}, operator CPU {f.operator_cpu_s:.1f} s, "
                             f"{f.api_requests} API requests; idle CPU % {f.idle_cpu_pct}, threads {f.threads}")
                else:
                    progress(f"    threads {point.threads}, idle CPU % {point.idle_cpu_pct}, "
                             f"fan-out {point.fan_out_s} s")
    print()
    print(f"replication cost by scale ({time.monotonic() - started:.0f} s; {os.cpu_count()} CPUs; load average "
          f"{load_start:.2f} at start, {os.getloadavg()[0]:.2f} at end)")
    all_ok = render(points, args)
    failed = [p for p in points if not p.verified]
    if args.json:
        Path(args.json).write_text(json.dumps({"config": {k: v for k, v in vars(args).items() if k != "json"},
                                               "points": [asdict(p) for p in points], "goals_met": all_ok},
                                              indent=2, default=str))
        print(f"figures written to {args.json}")
    if failed:
        print(f"FAILED points: {', '.join(f'{p.dimension} {p.size}' for p in failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
