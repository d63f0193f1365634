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
* **members**: one XDCR table on M engines (an XDCR group, every pair connected).

At each point, on every engine (``/proc``, the engine's own process): its **threads** and **RSS**
after the setup, its **idle CPU** (% of one core over ``--idle-seconds`` with nothing written, after
``--settle-seconds``), the **time to create** the setup (for tables also the time of the last batch
of ``--batch`` tables against the first: creating the 1,000th table should cost what the 10th
did), the **single-row commit p50** (one row into one replicated table, async replicas: what every
writer pays) and the **lookup p50** (one key of a replica table), and the
**fan-out time**: one row written into every table (every tablet; on every member) until every
replica (member) holds it.

Goals (issue 27) at 1,000 tables x 2 async replicas: idle CPU <= 2 % of a core per engine, engine
threads bounded by a pool size (not by replicas), the last batch created as fast as the first,
commit and lookup p50 within 20 % of the 10-table point, fan-out within 5 s. The table marks them.

Engines are started with :class:`reptables.testing.EngineSet` on free loopback ports in a temporary
directory, each in its own process group, and stopped by pid at the end of each point, also on an
error or Ctrl-C. Every wait is bounded.

    .venv/bin/python benchmarks/scale_bench.py                 # 10, 100, 1000 tables; tablets; replicas; members
    .venv/bin/python benchmarks/scale_bench.py --quick         # small points, ~2 min (the suite's smoke test)
    .venv/bin/python benchmarks/scale_bench.py --tables 10,300 --dimensions tables --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reptables.engine.errors import YtError  # noqa: E402
from reptables.testing import KV_SCHEMA, EngineSet  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
DIMENSIONS = ("tables", "tablets", "replicas", "members")
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
class Point:
    dimension: str
    size: int
    engines: list[str] = field(default_factory=list)
    #: the engines' pids (all stopped when the point ends)
    pids: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    idle_cpu_pct: dict[str, float] = field(default_factory=dict)
    create_s: float = 0.0
    #: tables only: seconds per table of the first and the last batch created
    first_batch_s_per_table: float | None = None
    last_batch_s_per_table: float | None = None
    commit_p50_ms: float | None = None
    lookup_p50_ms: float | None = None
    fan_out_s: float | None = None
    verified: bool = False
    notes: list[str] = field(default_factory=list)


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
    return point


def _fan_out(es: EngineSet, paths: list[str], clusters: tuple[str, ...], args: argparse.Namespace,
             key_of: Callable[[str], list[int]] | None = None) -> tuple[float, bool]:
    """One row (or one per key of ``key_of(path)``) written into every table, then the seconds until
    every replica table on ``clusters`` (same paths) holds it."""
    meta = es.meta
    marker = f"fan-out-{time.time_ns()}"
    started = time.monotonic()
    for path in paths:
        keys = key_of(path) if key_of else [7]
        meta.insert_rows(path, [{"k": k, "v": marker} for k in keys], require_sync_replica=False)
    clients = {c: es.client(c) for c in clusters}

    def arrived(item: tuple[str, str]) -> bool:
        cluster, path = item
        keys = key_of(path) if key_of else [7]
        rows = clients[cluster].lookup_rows(path, [{"k": k} for k in keys])
        return len(rows) == len(keys) and all(r["v"] == marker for r in rows)

    pending = {(c, p) for c in clusters for p in paths}
    _await_all("fan-out", pending, arrived, args.fan_out_timeout)
    return round(time.monotonic() - started, 3), True


def run_tablets(t: int, base: Path, args: argparse.Namespace) -> Point:
    point = Point("tablets", t)
    with EngineSet(base, names=("meta", "r0", "r1")) as es:
        started = time.monotonic()
        pivots = [[]] + [[i * 1000] for i in range(1, t)]
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
            return bool(rows) and rows[0]["v"] == marker

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
            return bool(rows) and rows[0]["v"] == marker

        _await_all("XDCR fan-out", {(n, i) for n in names for i in range(m)}, arrived, args.fan_out_timeout)
        point.fan_out_s, point.verified = round(time.monotonic() - fan_started, 3), True
    return point


RUNNERS: dict[str, Callable[[int, Path, argparse.Namespace], Point]] = {
    "tables": run_tables, "tablets": run_tablets, "replicas": run_replicas, "members": run_members}


# -- the report ----------------------------------------------------------------------------------------------


def render(points: list[Point], args: argparse.Namespace, out: Any = None) -> bool:
    """The table of every point; True when the goals held at the largest ``tables`` point measured."""
    out = sys.stdout if out is None else out
    head = ("dimension", "size", "threads (max)", "RSS MiB (max)", "idle CPU % (max)", "create s",
            "s/table first/last", "commit p50 ms", "lookup p50 ms", "fan-out s")
    rows = []
    for p in points:
        rows.append((p.dimension, str(p.size), str(max(p.threads.values(), default=0)),
                     f"{max(p.rss_mib.values(), default=0):.0f}", f"{max(p.idle_cpu_pct.values(), default=0):.1f}",
                     f"{p.create_s:.1f}",
                     "-" if p.first_batch_s_per_table is None else
                     f"{p.first_batch_s_per_table:.3f}/{p.last_batch_s_per_table:.3f}",
                     "-" if p.commit_p50_ms is None else f"{p.commit_p50_ms:.2f}",
                     "-" if p.lookup_p50_ms is None else f"{p.lookup_p50_ms:.2f}",
                     "-" if p.fan_out_s is None else f"{p.fan_out_s:.2f}"))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    rule = "  ".join("-" * w for w in widths)
    print(rule, file=out)
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), file=out)
    print(rule, file=out)
    for r in rows:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))),
              file=out)
    print(rule, file=out)
    for p in points:
        print(f"{p.dimension} {p.size}: threads {p.threads}, idle CPU % {p.idle_cpu_pct}", file=out)
    tables = [p for p in points if p.dimension == "tables"]
    if not tables:
        return True
    small, large = tables[0], tables[-1]
    goals = {
        f"idle CPU <= {IDLE_CPU_GOAL_PCT:g} % of a core per engine at {large.size} tables":
            max(large.idle_cpu_pct.values()) <= IDLE_CPU_GOAL_PCT,
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
    parser.add_argument("--batch", type=int, default=10, help="tables per creation batch (first vs last)")
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--samples", type=int, default=200, help="single-row commits and lookups timed per point")
    parser.add_argument("--fan-out-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="small points: 10,40 tables; 1,8 tablets; 2,4 "
                                                             "replicas; 2,3 members; short idle windows")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="also write every figure as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.tables, args.tablets, args.replicas, args.members = [10, 40], [1, 8], [2, 4], [2, 3]
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
            for size in getattr(args, dimension):
                progress(f"[{dimension} = {size}] ...")
                try:
                    point = RUNNERS[dimension](size, Path(tmp) / f"{dimension}-{size}", args)
                except (YtError, TimeoutError, RuntimeError) as exc:
                    point = Point(dimension, size, notes=[f"failed: {exc}"])
                    progress(f"    FAILED: {exc}")
                points.append(point)
                progress(f"    threads {point.threads}, idle CPU % {point.idle_cpu_pct}, fan-out {point.fan_out_s} s")
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
