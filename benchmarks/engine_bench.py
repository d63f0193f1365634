"""Benchmark of one reptables engine: batch-insert throughput, commit and lookup latency, memory.

What it measures, and why these figures (the targets come from the performance issue):

1. **Batch insert throughput** (target >= 100,000 rows/s). Rows of three columns (``k`` int64 key,
   ``s`` string, ``d`` double) are written in batches of 10,000 rows, one ``insert_rows`` per
   batch (each its own implicit tablet transaction, atomicity=full, durability=sync), through the
   HTTP API into one sorted dynamic table of one engine. It is measured with two clients, each
   on its fastest honest path: reptables' own :class:`reptables.engine.client.Client` (JSON lines)
   and the official ``yt.wrapper.YtClient`` (YSON, its default format). The clock runs only
   around the ``insert_rows`` calls (making the rows in Python is not timed), so the figure is
   client encoding + HTTP + engine decode/validate/commit.
2. **Raw SQLite ceiling**: the same rows written with ``executemany`` straight into SQLite (WAL,
   ``synchronous=FULL``, one transaction per 10,000-row batch), in two shapes: ``minimal`` (one
   table keyed by ``k`` - the physical ceiling), and ``engine layout`` (what the engine must do
   as a minimum: move the images a batch replaces into the versions table - ``INSERT ... SELECT``
   by key lists, which finds nothing for new keys - and upsert the batch into the latest-image
   table with its timestamp and lock mask). The ratio engine/raw shows how much of the ceiling the
   engine reaches.
3. **Single-row commit latency** (targets p50 <= 2 ms, p99 <= 10 ms): sequential ``insert_rows``
   of one row each, each a durable (fsynced) commit, over loopback, with our ``Client``.
4. **Single-key lookup latency** (target p50 <= 1 ms): sequential ``lookup_rows`` of one random
   existing key, with our ``Client``.
5. **Engine RSS** (target <= 300 MiB): ``VmRSS`` of the engine process (read from
   ``/proc/<pid>/status``; the engine, not this benchmark) right after loading ``--rows`` rows
   (default 1,000,000). ``VmHWM`` (peak RSS) is reported beside it.

Floors and breakdowns, so that a missed target can be attributed:

* the engine's own mean time per request (from its ``/metrics`` histogram sum/count) beside each
  client-side figure: engine time versus client and HTTP time;
* the same commits and lookups over a raw keep-alive socket (no client library), and ``GET
  /healthz`` round trips with the Client's own keep-alive connections and with the raw socket
  (the HTTP floor with no engine work);
* durable single-row commits straight into SQLite (the fsync floor of item 3);
* the 1-minute load average at start and end: other work on the 2-core machine shows up in
  every figure, so compare runs only at a low load.

A storage answer with code 105 ("database is locked") is retried by the benchmark (at most 3
attempts, as a YT client would; yt.wrapper retries on its own) and counted in the table.

The benchmark starts its own engine (``python -m reptables.operator.cli engine serve``) on a free
loopback port in a temporary directory, in its own process group, and stops it by pid at the end
- also on Ctrl-C, SIGTERM or an exception. All loops are bounded in count and in time
(``--phase-timeout``). Only loopback traffic is sent.

Run from the repository root::

    .venv/bin/python benchmarks/engine_bench.py            # full run (1,000,000 rows)
    .venv/bin/python benchmarks/engine_bench.py --quick    # smoke run, < 60 s
    .venv/bin/python benchmarks/engine_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from reptables.engine.client import Client, UnavailableError
from reptables.engine.process import LocalEngine

BATCH_SIZE = 10_000
TABLE_SCHEMA: list[dict[str, Any]] = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "s", "type": "string"},
    {"name": "d", "type": "double"},
]
TOKEN = "bench-token-0123456789abcdef"

# -- targets ---------------------------------------------------------------------------------------

TARGET_INSERT_ROWS_PER_S = 100_000.0
TARGET_COMMIT_P50_MS = 2.0
TARGET_COMMIT_P99_MS = 10.0
TARGET_LOOKUP_P50_MS = 1.0
TARGET_RSS_MIB = 300.0


# -- the engine process ----------------------------------------------------------------------------


@dataclass
class Engine(LocalEngine):
    """The engine under test (its own process group, stopped by pid), plus what the benchmark reads."""

    def memory_mib(self) -> dict[str, float]:
        """VmRSS and VmHWM (peak RSS) of the engine process, in MiB."""
        out: dict[str, float] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) / 1024.0
        return out

    def server_stats(self, command: str) -> tuple[float, int, int]:
        """(seconds, requests, failed requests) of ``command`` so far, from the engine's ``/metrics``."""
        text = httpx.get(f"{self.url}/metrics", timeout=10,
                         headers={"Authorization": f"OAuth {self.read_token()}"}).text

        def value(pattern: str) -> float:
            m = re.search(pattern + r" (\S+)$", text, re.M)
            return float(m.group(1)) if m else 0.0

        label = re.escape(f'{{command="{command}"}}')
        return (value(f"^reptables_request_seconds_sum{label}"), int(value(f"^reptables_request_seconds_count{label}")),
                int(value(re.escape(f'reptables_requests_total{{command="{command}",outcome="error"}}'))))


class ServerClock:
    """Engine-side figures of one command over a phase (from ``/metrics``): mean time, failures."""

    def __init__(self, engine: Engine, command: str) -> None:
        self.engine, self.command = engine, command
        self.start = engine.server_stats(command) if command != "-" else (0.0, 0, 0)
        self.end = self.start

    def stop(self) -> ServerClock:
        if self.command != "-":
            self.end = self.engine.server_stats(self.command)
        return self

    def mean_ms(self) -> float | None:
        n = self.end[1] - self.start[1]
        return (self.end[0] - self.start[0]) / n * 1000.0 if n > 0 else None

    @property
    def errors(self) -> int:
        return self.end[2] - self.start[2]


class Retries:
    """Bounded retry of answers with code 105 (storage unavailable), as a YT client would; counted.

    The time of failed attempts stays inside the timed call, so retries cost what they cost.
    """

    ATTEMPTS = 3

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.messages: list[str] = []

    def call(self, phase: str, fn: Callable[[], Any]) -> Any:
        for attempt in range(self.ATTEMPTS):
            try:
                return fn()
            except UnavailableError as exc:
                if attempt == self.ATTEMPTS - 1:
                    raise
                self.count[phase] = self.count.get(phase, 0) + 1
                if len(self.messages) < 20:
                    self.messages.append(f"{phase}: {exc}")
        raise AssertionError("unreachable")


RETRIES = Retries()


class RawHttp:
    """A minimal keep-alive HTTP/1.1 client over one socket: the same API with no client library.

    It shows how much of a latency is the client library's rather than the engine's.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def __enter__(self) -> RawHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body or method != "GET":
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        length = int(m.group(1)) if m else 0
        while len(self.buf) < length:
            self._recv()
        answer, self.buf = self.buf[:length], self.buf[length:]
        if not head.startswith(b"HTTP/1.1 200") or re.search(rb"(?i)\r\nx-yt-error:", head):
            raise RuntimeError(f"unexpected answer {head[:300]!r} {answer[:300]!r}")
        return answer

    def get(self, path: str) -> bytes:
        return self.request("GET", path)

    def command(self, name: str, params: dict[str, Any], rows: list[dict[str, Any]]) -> bytes:
        """A tabular YT command with JSON rows in and out (as reptables' Client sends it)."""
        fmt = {"$value": "json", "$attributes": {"encode_utf8": False}}
        headers = {"Authorization": f"OAuth {TOKEN}", "X-YT-Header-Format": "json",
                   "X-YT-Parameters": json.dumps({**params, "input_format": fmt, "output_format": fmt})}
        body = "".join(json.dumps(r) + "\n" for r in rows).encode()
        return self.request("PUT", f"/api/v4/{name}", headers, body)

    def _recv(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        self.buf += chunk


# -- data -----------------------------------------------------------------------------------------


def make_rows(start: int, count: int) -> list[dict[str, Any]]:
    return [{"k": k, "s": f"value-{k:012d}", "d": k * 0.5} for k in range(start, start + count)]


def batches(first_key: int, total: int, size: int = BATCH_SIZE) -> Iterator[tuple[int, int]]:
    """(first key, row count) of each batch."""
    for start in range(first_key, first_key + total, size):
        yield start, min(size, first_key + total - start)


def percentile(samples: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


# -- measurements ---------------------------------------------------------------------------------


@dataclass
class Throughput:
    rows: int
    seconds: float
    batch_ms_p50: float
    batch_ms_max: float
    complete: bool

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def timed_batches(make: Callable[[int, int], Any], insert: Callable[[Any], None], total: int,
                  deadline: float) -> Throughput:
    """Per batch: ``make(start, count)`` (not timed), then ``insert(batch)`` (timed)."""
    elapsed = 0.0
    done = 0
    per_batch: list[float] = []
    for start, count in batches(0, total):
        if time.monotonic() > deadline:
            break
        batch = make(start, count)
        t0 = time.perf_counter()
        insert(batch)
        dt = time.perf_counter() - t0
        elapsed += dt
        per_batch.append(dt * 1000.0)
        done += count
    return Throughput(done, elapsed, percentile(per_batch, 50) if per_batch else 0.0,
                      max(per_batch, default=0.0), done == total)


def create_table(client: Client, path: str) -> None:
    client.create("table", path, attributes={"dynamic": True, "schema": TABLE_SCHEMA})
    client.mount_table(path)


def bench_client_insert(engine: Engine, client: Client, path: str, rows: int,
                        deadline: float) -> tuple[Throughput, ServerClock]:
    """reptables' Client: JSON lines, one insert_rows (one implicit transaction) per batch."""
    clock = ServerClock(engine, "insert_rows")
    result = timed_batches(make_rows, lambda batch: RETRIES.call("insert_client",
                                                                 lambda: client.insert_rows(path, batch)),
                           rows, deadline)
    return result, clock.stop()


def bench_wrapper_insert(engine: Engine, path: str, rows: int, deadline: float) -> tuple[Throughput, ServerClock]:
    """The official yt.wrapper client with its defaults (YSON; it retries code 105/503 itself)."""
    import yt.wrapper as yt

    wrapper = yt.YtClient(proxy=engine.url, token=TOKEN)
    clock = ServerClock(engine, "insert_rows")
    result = timed_batches(make_rows, lambda batch: wrapper.insert_rows(path, batch), rows, deadline)
    return result, clock.stop()


def bench_raw_sqlite(db_path: Path, rows: int, layout: str, deadline: float) -> Throughput:
    """The same rows by ``executemany``: WAL, synchronous=FULL, one transaction per batch."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if layout == "minimal":
            conn.execute("CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY, s TEXT, d DOUBLE)")
        else:
            # the shape of engine/storage.py's UserTables for a sorted table
            conn.execute("CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY, s TEXT, d DOUBLE, _rt_ts BIGINT NOT NULL, "
                         "_rt_lock_mask INTEGER NOT NULL)")
            conn.execute("CREATE TABLE t_versions (k BIGINT NOT NULL, s TEXT, d DOUBLE, _rt_ts BIGINT NOT NULL, "
                         "_rt_deleted BOOLEAN NOT NULL, _rt_lock_mask INTEGER NOT NULL, PRIMARY KEY (k, _rt_ts))")
            conn.execute("CREATE INDEX t_versions_ts ON t_versions (_rt_ts)")
        ts = 1 << 40

        def make(start: int, count: int) -> list[tuple[Any, ...]]:
            return [(k, f"value-{k:012d}", k * 0.5, ts + start) for k in range(start, start + count)]

        def insert(batch: list[tuple[Any, ...]]) -> None:
            conn.execute("BEGIN")
            if layout == "minimal":
                conn.executemany("INSERT INTO t (k, s, d) VALUES (?, ?, ?)", [r[:3] for r in batch])
            else:
                keys = [r[0] for r in batch]
                for i in range(0, len(keys), 4000):
                    chunk = keys[i:i + 4000]
                    conn.execute("INSERT INTO t_versions SELECT k, s, d, _rt_ts, 0, _rt_lock_mask FROM t "
                                 f"WHERE k IN ({','.join('?' * len(chunk))})", chunk)
                conn.executemany("INSERT INTO t (k, s, d, _rt_ts, _rt_lock_mask) VALUES (?, ?, ?, ?, 1) ON CONFLICT "
                                 "(k) DO UPDATE SET s = excluded.s, d = excluded.d, _rt_ts = excluded._rt_ts, "
                                 "_rt_lock_mask = excluded._rt_lock_mask", batch)
            conn.execute("COMMIT")

        return timed_batches(make, insert, rows, deadline)
    finally:
        conn.close()


def raw_sqlite_commit_latency(db_path: Path, samples: int, deadline: float) -> list[float]:
    """Durable single-row commits straight into SQLite (WAL, synchronous=FULL): the floor of item 3."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (k BIGINT NOT NULL PRIMARY KEY, s TEXT, d DOUBLE)")
        times: list[float] = []
        for k in range(samples):
            if time.monotonic() > deadline:
                break
            t0 = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t (k, s, d) VALUES (?, ?, ?)", (k, f"value-{k:012d}", k * 0.5))
            conn.execute("COMMIT")
            times.append((time.perf_counter() - t0) * 1000.0)
        return times
    finally:
        conn.close()


@dataclass
class Latency:
    samples: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    server_mean_ms: float | None
    server_errors: int


def measure_latency(engine: Engine, command: str, call: Callable[[int], Any], samples: int, warmup: int,
                    deadline: float) -> Latency:
    for i in range(warmup):
        call(-1 - i)
    clock = ServerClock(engine, command)
    times: list[float] = []
    for i in range(samples):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        call(i)
        times.append((time.perf_counter() - t0) * 1000.0)
    if not times:
        raise RuntimeError(f"no {command} sample finished before the phase deadline")
    clock.stop()
    return Latency(len(times), percentile(times, 50), percentile(times, 90), percentile(times, 99), max(times),
                   sum(times) / len(times), clock.mean_ms(), clock.errors)


# -- report ---------------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""

    @property
    def mark(self) -> str:
        return "" if self.ok is None else ("PASS" if self.ok else "MISS")


class StreamFollower:
    """The loop of a benchmark's consumer process: pull a table's change stream from a token until
    the parent writes a stop timestamp on stdin and an answer covers it.

    Heartbeats are skipped; every other event goes to ``on_event(event, receive time)``, and an
    event token not above the one before it is counted (``token_violations``). It prints
    ``ready`` once the first pull answered. The token comes from ``$YT_TOKEN``. Stdin closing
    without a stop timestamp (the parent is gone), or ``max_s``, ends it early: ``follow`` then
    says so on stderr and returns False."""

    def __init__(self, url: str, path: str, from_token: str, max_s: float, pull_rows: int | None = None) -> None:
        self.url, self.path, self.token, self.max_s, self.pull_rows = url, path, from_token, max_s, pull_rows
        self.pulls = self.token_violations = 0
        self._stop: int | None = None
        self._gone = threading.Event()

    def _read_stop(self) -> None:
        line = sys.stdin.readline()
        if line.strip():
            self._stop = int(line)
        else:
            self._gone.set()

    def follow(self, on_event: Callable[[dict[str, Any], float], None]) -> bool:
        threading.Thread(target=self._read_stop, name="stop-reader", daemon=True).start()
        deadline = time.monotonic() + self.max_s
        token = self.token
        with Client(self.url, timeout=120.0) as client:
            answer = client.pull_changes(self.path, from_event_token=token, max_row_count=self.pull_rows,
                                         wait_timeout=0)
            received = time.monotonic()
            print("ready", flush=True)
            while True:
                self.pulls += 1
                previous = token
                for event in answer["events"]:
                    if event["kind"] == "heartbeat":
                        continue
                    if not event["event_token"] > previous:
                        self.token_violations += 1
                    previous = event["event_token"]
                    on_event(event, received)
                token = answer["event_token"]
                if self._stop is not None and answer["timestamp"] >= self._stop:
                    return True
                if self._gone.is_set() or time.monotonic() > deadline:
                    print("consumer: stopped without a stop timestamp (parent gone or time limit)", file=sys.stderr)
                    return False
                answer = client.pull_changes(self.path, from_event_token=token, max_row_count=self.pull_rows)
                received = time.monotonic()


class Child:
    """A child process of a benchmark script (its ``--write`` or ``--consume`` mode), in its own
    session, stopped by its pid. It writes ``ready`` on stdout once set up, takes lines on stdin
    (``send``), writes its records as JSON to ``out`` and exits 0; its stderr goes beside ``out``."""

    def __init__(self, script: str, mode: str, args: list[str], out: Path, token: str) -> None:
        self.out = out
        self.stderr_path = out.with_suffix(".stderr")
        cmd = [sys.executable, script, mode, *args, "--out", str(out)]
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env={**os.environ, "YT_TOKEN": token}, start_new_session=True)

    def _stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text(errors="replace")[-3000:]
        return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.kill()
            raise RuntimeError(f"child (pid {self.proc.pid}) did not become ready in {timeout:.0f} s:\n"
                               + self._stderr())

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the child to exit (bounded) and return what it wrote; a clear error if it failed."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"child (pid {self.proc.pid}) did not finish within {timeout:.0f} s") from None
        if code != 0:
            detail = self._stderr()
            raise RuntimeError(f"child (pid {self.proc.pid}) exited with {code} (an error of the engine, not "
                               f"noise):\n{detail}")
        data: dict[str, Any] = json.loads(self.out.read_text())
        return data

    def kill(self) -> None:
        """SIGTERM its process group (its pid), SIGKILL after a bounded wait."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_main(title: str, prefix: str, args: argparse.Namespace,
               run: Callable[[argparse.Namespace, Path], dict[str, Any]],
               figures: Callable[[dict[str, Any], argparse.Namespace], list[Figure]],
               failure: Callable[[dict[str, Any]], str | None]) -> int:
    """The life of a benchmark run (stream_bench.py, xdcr_bench.py): a temporary data directory under
    ``args.data_dir`` (kept with ``args.keep_data``), SIGTERM as Ctrl-C (``run`` stops what it
    started either way), the table of figures, ``args.json``, and exit status 1 with a banner when
    ``failure`` names a correctness check that failed (timings never fail a run)."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    if args.data_dir is not None:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    # (mkdtemp, not TemporaryDirectory: whose finalizer would remove a directory --keep-data keeps)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=args.data_dir))
    try:
        result = run(args, workdir)
    except KeyboardInterrupt:
        print("interrupted; every process the benchmark started was stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_data:
            print(f"data kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    total = time.monotonic() - started
    table = figures(result, args)
    print()
    print(f"reptables {title} ({'quick' if args.quick else 'full'}; {total:.0f} s; {os.cpu_count()} CPUs; "
          f"load average {result['load_average_start']} at start, {result['load_average_end']} at end)")
    print_table(table)
    missed = [f.name for f in table if f.ok is False]
    print("all targets met" if not missed else f"targets missed: {', '.join(missed)}")
    if args.json is not None:
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        payload = {"config": {**config, "cpus": os.cpu_count(), "seconds_total": total},
                   "figures": [{**asdict(f), "status": f.mark or None} for f in table], **result}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"figures written to {args.json}")
    problem = failure(result)
    if problem is not None:
        print("\n" + "!" * 78 + "\n" + problem + "\n" + "!" * 78, file=sys.stderr)
        return 1
    return 0


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "rows/s":
        return f"{value:,.0f}"
    if unit in ("x", "%"):
        return f"{value:.2f}" if unit == "x" else f"{value:.1f}"
    return f"{value:,.2f}"


def print_table(figures: list[Figure]) -> None:
    head = ("figure", "value", "unit", "target", "")
    rows = [(f.name, fmt(f.value, f.unit), f.unit, f.target, f.mark) for f in figures]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    print(line)
    print("  ".join(str(h).ljust(w) for h, w in zip(head, widths, strict=True)))
    print(line)
    for f, r in zip(figures, rows, strict=True):
        cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]), r[3].ljust(widths[3]),
                 r[4].ljust(widths[4])]
        print(("  ".join(cells) + (f"  ({f.note})" if f.note else "")).rstrip())
    print(line)


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=None,
                   help="rows loaded with reptables' Client (insert throughput and the RSS figure); "
                        "default 1,000,000 (50,000 with --quick)")
    p.add_argument("--wrapper-rows", type=int, default=None,
                   help="rows loaded with yt.wrapper into a second table; default 500,000 (20,000 with --quick); "
                        "0 skips it")
    p.add_argument("--raw-rows", type=int, default=None,
                   help="rows of the raw SQLite ceiling; default = --rows")
    p.add_argument("--latency-samples", type=int, default=None,
                   help="commits and lookups timed for the latency figures; default 2,000 (300 with --quick)")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run (< 60 s)")
    p.add_argument("--phase-timeout", type=float, default=900.0,
                   help="seconds after which a phase stops early and reports what it did (default 900)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="parent directory for the engine's and raw SQLite's files (default: a temp dir); "
                        "must be on the disk you want to measure, not tmpfs")
    p.add_argument("--keep-data", action="store_true", help="do not delete the data directory at the end")
    p.add_argument("--json", type=Path, default=None, help="also write all figures to this JSON file")
    p.add_argument("--seed", type=int, default=1, help="seed of the random lookup keys")
    args = p.parse_args(argv)
    args.rows = args.rows if args.rows is not None else (50_000 if args.quick else 1_000_000)
    args.wrapper_rows = args.wrapper_rows if args.wrapper_rows is not None else (
        20_000 if args.quick else 500_000)
    args.raw_rows = args.raw_rows if args.raw_rows is not None else args.rows
    args.latency_samples = args.latency_samples if args.latency_samples is not None else (
        300 if args.quick else 2_000)
    if args.rows < 1 or args.latency_samples < 1 or args.raw_rows < 1 or args.wrapper_rows < 0:
        p.error("--rows, --raw-rows and --latency-samples must be positive, --wrapper-rows >= 0")
    return args


def fs_type(path: Path) -> str:
    """The filesystem type of ``path`` (from /proc/mounts; the longest matching mount point)."""
    best, kind = "", "?"
    real = str(path.resolve())
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and (real == parts[1] or real.startswith(parts[1].rstrip("/") + "/")) \
                    and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _errors_note(errors: int) -> str:
    return f"; {errors} answered 105 'database is locked' and were retried" if errors else ""


def load_average() -> str:
    """The 1-minute load average: other work on the machine shows up in every figure."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    details: dict[str, Any] = {"load_average_start": load_average()}

    def deadline() -> float:
        return time.monotonic() + args.phase_timeout

    engine = Engine("bench", workdir / "engine", token=TOKEN, log_level="warning")
    print(f"data dir {workdir} ({fs_type(workdir)}); starting engine ...", flush=True)
    engine.start()
    details["engine_pid"] = engine.pid
    print(f"engine pid {engine.pid} at {engine.url}", flush=True)
    try:
        details["rss_mib_idle"] = engine.memory_mib()
        with Client(engine.url, token=TOKEN, timeout=300.0) as client:
            main_path = "//tmp/bench_client"
            create_table(client, main_path)

            # 1a. insert throughput, our Client (JSON lines)
            print(f"[1/8] inserting {args.rows:,} rows with reptables Client (batches of {BATCH_SIZE:,}) ...",
                  flush=True)
            ours, ours_clock = bench_client_insert(engine, client, main_path, args.rows, deadline())
            details["insert_client"] = {**asdict(ours), "rows_per_s": ours.rows_per_s,
                                        "server_mean_ms_per_batch": ours_clock.mean_ms(),
                                        "server_errors": ours_clock.errors}
            # 5. RSS right after the load
            details["rss_mib_after_load"] = engine.memory_mib()
            print(f"      {ours.rows_per_s:,.0f} rows/s; engine RSS "
                  f"{details['rss_mib_after_load'].get('VmRSS', 0):.1f} MiB", flush=True)

            # 1b. insert throughput, yt.wrapper (YSON)
            wrapper: Throughput | None = None
            wrapper_clock: ServerClock | None = None
            if args.wrapper_rows:
                wrapper_path = "//tmp/bench_wrapper"
                create_table(client, wrapper_path)
                print(f"[2/8] inserting {args.wrapper_rows:,} rows with yt.wrapper (YSON) ...", flush=True)
                wrapper, wrapper_clock = bench_wrapper_insert(engine, wrapper_path, args.wrapper_rows, deadline())
                details["insert_wrapper"] = {**asdict(wrapper), "rows_per_s": wrapper.rows_per_s,
                                             "server_mean_ms_per_batch": wrapper_clock.mean_ms(),
                                             "server_errors": wrapper_clock.errors}
                print(f"      {wrapper.rows_per_s:,.0f} rows/s", flush=True)

            # the HTTP floor: a round trip that does no work in the engine (GET /healthz)
            print(f"[3/8] {args.latency_samples:,} GET /healthz round trips (HTTP floor) ...", flush=True)
            pool = client._pool  # the Client's own connections, so the floor matches its requests
            assert pool is not None

            def ping(_: int) -> None:
                answer = pool.request("GET", "/healthz")
                if not answer.is_success:
                    raise RuntimeError(f"GET /healthz answered HTTP {answer.status_code}")

            floor = measure_latency(engine, "-", ping, args.latency_samples, 20, deadline())
            details["http_floor_latency"] = asdict(floor)
            with RawHttp(engine.port) as raw:
                raw_floor = measure_latency(engine, "-", lambda _: raw.get("/healthz"), args.latency_samples, 20,
                                            deadline())
            details["http_floor_raw_socket_latency"] = asdict(raw_floor)

            # 3. single-row commit latency (new keys above the loaded ones)
            print(f"[4/8] {args.latency_samples:,} single-row commits ...", flush=True)
            base = args.rows + 10_000_000

            def commit_one(i: int) -> None:
                k = base + i + 1_000
                row = {"k": k, "s": f"value-{k:012d}", "d": k * 0.5}
                RETRIES.call("commit", lambda: client.insert_rows(main_path, [row]))

            commit = measure_latency(engine, "insert_rows", commit_one, args.latency_samples, 20, deadline())
            details["commit_latency"] = asdict(commit)
            print(f"      p50 {commit.p50_ms:.2f} ms, p99 {commit.p99_ms:.2f} ms", flush=True)

            # 4. lookup latency (random loaded keys)
            print(f"[5/8] {args.latency_samples:,} single-key lookups ...", flush=True)
            rng = random.Random(args.seed)
            keys = [rng.randrange(max(ours.rows, 1)) for _ in range(args.latency_samples + 20)]

            def lookup_one(i: int) -> None:
                k = keys[i]
                found = RETRIES.call("lookup", lambda: client.lookup_rows(main_path, [{"k": k}]))
                if len(found) != 1 or found[0]["k"] != k:
                    raise RuntimeError(f"lookup of key {k} returned {found!r}")

            lookup = measure_latency(engine, "lookup_rows", lookup_one, args.latency_samples, 20, deadline())
            details["lookup_latency"] = asdict(lookup)
            print(f"      p50 {lookup.p50_ms:.2f} ms, p99 {lookup.p99_ms:.2f} ms", flush=True)

            # the same commits and lookups over a raw socket: what is left without the client library
            print("[6/8] the same commits and lookups over a raw socket ...", flush=True)
            with RawHttp(engine.port) as raw:
                def raw_commit(i: int) -> None:
                    k = base + 5_000_000 + i + 1_000
                    row = {"k": k, "s": f"value-{k:012d}", "d": k * 0.5}
                    RETRIES.call("commit_raw", lambda: raw.command("insert_rows", {"path": main_path}, [row]))

                def raw_lookup(i: int) -> None:
                    if not raw.command("lookup_rows", {"path": main_path}, [{"k": keys[i]}]).strip():
                        raise RuntimeError(f"lookup of key {keys[i]} found nothing")

                raw_commit_lat = measure_latency(engine, "insert_rows", raw_commit, args.latency_samples, 20,
                                                 deadline())
                raw_lookup_lat = measure_latency(engine, "lookup_rows", raw_lookup, args.latency_samples, 20,
                                                 deadline())
            details["commit_latency_raw_socket"] = asdict(raw_commit_lat)
            details["lookup_latency_raw_socket"] = asdict(raw_lookup_lat)
        details["rss_mib_end"] = engine.memory_mib()
    finally:
        engine.stop()

    # 2. raw SQLite ceilings, after the engine stopped so that they do not share the CPUs with it
    print(f"[7/8] raw SQLite executemany, {args.raw_rows:,} rows, minimal table ...", flush=True)
    raw_min = bench_raw_sqlite(workdir / "raw_minimal.sqlite", args.raw_rows, "minimal", deadline())
    print(f"      {raw_min.rows_per_s:,.0f} rows/s", flush=True)
    print(f"[8/8] raw SQLite executemany, {args.raw_rows:,} rows, engine layout (data + versions) ...", flush=True)
    raw_layout = bench_raw_sqlite(workdir / "raw_layout.sqlite", args.raw_rows, "engine", deadline())
    print(f"      {raw_layout.rows_per_s:,.0f} rows/s", flush=True)
    raw_commits = raw_sqlite_commit_latency(workdir / "raw_commit.sqlite", args.latency_samples, deadline())
    details["raw_sqlite_commit_ms"] = {"samples": len(raw_commits), "p50": percentile(raw_commits, 50),
                                       "p99": percentile(raw_commits, 99)}
    details["raw_sqlite_minimal"] = {**asdict(raw_min), "rows_per_s": raw_min.rows_per_s}
    details["raw_sqlite_engine_layout"] = {**asdict(raw_layout), "rows_per_s": raw_layout.rows_per_s}
    details["load_average_end"] = load_average()
    details["client_retries"] = dict(RETRIES.count)
    details["client_retry_messages"] = list(RETRIES.messages)

    figures: list[Figure] = []
    partial = "; stopped early at --phase-timeout"
    figures.append(Figure("insert, reptables Client (JSON)", ours.rows_per_s, "rows/s", ">= 100,000",
                          ours.rows_per_s >= TARGET_INSERT_ROWS_PER_S,
                          f"{ours.rows:,} rows, batch p50 {ours.batch_ms_p50:.0f} ms, engine "
                          f"{ours_clock.mean_ms() or 0:.0f} ms/batch" + ("" if ours.complete else partial)
                          + _errors_note(ours_clock.errors)))
    if wrapper is not None and wrapper_clock is not None:
        figures.append(Figure("insert, yt.wrapper (YSON)", wrapper.rows_per_s, "rows/s", ">= 100,000",
                              wrapper.rows_per_s >= TARGET_INSERT_ROWS_PER_S,
                              f"{wrapper.rows:,} rows, batch p50 {wrapper.batch_ms_p50:.0f} ms, engine "
                              f"{wrapper_clock.mean_ms() or 0:.0f} ms/batch" + ("" if wrapper.complete else partial)
                              + _errors_note(wrapper_clock.errors)))
    figures.append(Figure("raw SQLite executemany, minimal table", raw_min.rows_per_s, "rows/s", "ceiling",
                          note=f"{raw_min.rows:,} rows, one table keyed by k" + ("" if raw_min.complete else partial)))
    figures.append(Figure("raw SQLite executemany, engine layout", raw_layout.rows_per_s, "rows/s", "ceiling",
                          note="move replaced images to versions (none: new keys) + upsert into data"))
    for label, t in (("Client", ours), ("yt.wrapper", wrapper)):
        if t is not None:
            figures.append(Figure(f"ratio {label} / raw minimal", t.rows_per_s / raw_min.rows_per_s * 100.0, "%"))
            figures.append(Figure(f"ratio {label} / raw engine layout",
                                  t.rows_per_s / raw_layout.rows_per_s * 100.0, "%"))
    figures.append(Figure("single-row commit p50", commit.p50_ms, "ms", "<= 2", commit.p50_ms <= TARGET_COMMIT_P50_MS,
                          f"{commit.samples:,} commits, engine mean {commit.server_mean_ms or 0:.2f} ms"
                          + _errors_note(commit.server_errors)))
    figures.append(Figure("single-row commit p99", commit.p99_ms, "ms", "<= 10",
                          commit.p99_ms <= TARGET_COMMIT_P99_MS, f"max {commit.max_ms:.2f} ms"))
    figures.append(Figure("single-row commit p50, raw socket", raw_commit_lat.p50_ms, "ms",
                          note=f"p99 {raw_commit_lat.p99_ms:.2f} ms; no client library"
                          + _errors_note(raw_commit_lat.server_errors)))
    rc = details["raw_sqlite_commit_ms"]
    figures.append(Figure("raw SQLite single-row commit p50", rc["p50"], "ms", "floor",
                          note=f"p99 {rc['p99']:.2f} ms; BEGIN/INSERT/COMMIT with fsync, no engine"))
    figures.append(Figure("lookup one key p50", lookup.p50_ms, "ms", "<= 1", lookup.p50_ms <= TARGET_LOOKUP_P50_MS,
                          f"{lookup.samples:,} lookups, engine mean {lookup.server_mean_ms or 0:.2f} ms"))
    figures.append(Figure("lookup one key p99", lookup.p99_ms, "ms", note=f"max {lookup.max_ms:.2f} ms"))
    figures.append(Figure("lookup one key p50, raw socket", raw_lookup_lat.p50_ms, "ms",
                          note=f"p99 {raw_lookup_lat.p99_ms:.2f} ms; no client library"))
    figures.append(Figure("HTTP floor p50, Client (GET /healthz)", floor.p50_ms, "ms",
                          note=f"p99 {floor.p99_ms:.2f} ms; the Client's connections, no engine work"))
    figures.append(Figure("HTTP floor p50, raw socket (GET /healthz)", raw_floor.p50_ms, "ms",
                          note=f"p99 {raw_floor.p99_ms:.2f} ms; keep-alive socket: server-side HTTP cost"))
    rss = details["rss_mib_after_load"].get("VmRSS")
    figures.append(Figure(f"engine RSS after {ours.rows:,} rows", rss, "MiB", "<= 300",
                          None if rss is None else rss <= TARGET_RSS_MIB,
                          f"peak {details['rss_mib_after_load'].get('VmHWM', 0):.1f} MiB, idle "
                          f"{details['rss_mib_idle'].get('VmRSS', 0):.1f} MiB, at end "
                          f"{details['rss_mib_end'].get('VmRSS', 0):.1f} MiB"
                          + ("" if ours.rows >= 1_000_000 else "; the target is for 1,000,000 rows")))
    return {"figures": figures, "details": details}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.perf_counter()
    parent = args.data_dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="reptables-bench-", dir=parent)
    workdir = Path(tmp.name)
    try:
        result = run(args, workdir)
    except KeyboardInterrupt:
        print("interrupted; the engine was stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep_data:
            print(f"data kept in {workdir}")
        else:
            tmp.cleanup()
    figures: list[Figure] = result["figures"]
    total = time.perf_counter() - started
    print()
    details = result["details"]
    print(f"reptables engine benchmark ({'quick' if args.quick else 'full'}; {total:.0f} s; "
          f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}; load average "
          f"{details['load_average_start']} at start, {details['load_average_end']} at end)")
    print_table(figures)
    missed = [f.name for f in figures if f.ok is False]
    print("all targets met" if not missed else f"targets missed: {', '.join(missed)}")
    if args.json is not None:
        payload = {
            "config": {"rows": args.rows, "wrapper_rows": args.wrapper_rows, "raw_rows": args.raw_rows,
                       "latency_samples": args.latency_samples, "batch_size": BATCH_SIZE, "quick": args.quick,
                       "cpus": os.cpu_count(), "python": sys.version.split()[0], "seconds": total},
            "figures": [{**asdict(f), "status": f.mark or None} for f in figures],
            "details": result["details"],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
