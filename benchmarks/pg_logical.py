"""PostgreSQL 15 logical replication: the peer measurement for reptables' own replication.

What it measures
----------------

1. **Replicated batch-insert throughput** (:func:`run_logical_replication`). Three PostgreSQL
   servers on loopback: one publisher (``wal_level=logical``) and two subscribers. Each has the
   table ``t(k bigint primary key, v text, d double precision)``; the publisher has
   ``CREATE PUBLICATION ... FOR TABLE t`` and each subscriber a ``CREATE SUBSCRIPTION`` to it over
   TCP ``127.0.0.1``. Only once both subscriptions are streaming and their initial table sync of
   the empty table is done, rows are written into the publisher with ``COPY ... FROM STDIN``
   (psycopg 3 ``cursor.copy`` / ``write_row``), ``batch_size`` rows per ``COPY``, one transaction
   (one durable commit) per batch. Two clocks start at the first ``COPY``:

   * ``insert_seconds`` stops after the last batch's commit returns on the publisher;
   * ``replicated_seconds`` stops when *both* subscribers have every row. Polling starts after the
     last commit, every ~50 ms, with a cheap primary-key probe for the last key written (one
     writer, and logical replication applies transactions in commit order, so the last key being
     visible means every earlier batch is too); when it is seen, ``count(*)`` confirms it equals
     ``rows`` (if not, polling goes on with ``count(*)``). The time recorded is that of the probe
     that saw the last key, so the ``count(*)`` of a million rows is not charged to replication.

   After the clocks stop (untimed) every server's ``count(*)`` and an order-independent checksum
   (``md5`` of ``k:v:hex(float8send(d))`` joined in key order) are read and compared with the
   checksum of the rows the client generated, so the figures only count if all data arrived
   intact.

2. **Synchronous-standby commit latency** (:func:`run_sync_commit_latency`). A publisher and one
   subscriber; the subscription's name (which is its walsender's ``application_name``) is put in
   the publisher's ``synchronous_standby_names`` and ``synchronous_commit=on`` (the default), so
   a commit on the publisher returns only after the subscriber reported the transaction flushed.
   Then ``samples`` sequential single-row ``INSERT`` s in autocommit mode (each its own commit)
   are timed on the client; p50/p99 are nearest-rank percentiles, like ``engine_bench.py``.
   Every other setting is left at its default, including the subscriber's apply worker
   committing with the subscription default ``synchronous_commit=off``: its flush position, and
   so the feedback that releases the waiting publisher, advances only when the WAL writer
   flushes (``wal_writer_delay`` = 200 ms), which dominates the latency. That is what a
   PostgreSQL user gets out of the box, so it is not tuned away.

Why it is a fair peer
---------------------

* Same rows as ``benchmarks/engine_bench.py``: ``k`` int64 key, ``v`` = ``value-<k:012d>``
  (a short string), ``d`` = ``k * 0.5``; same batch size (10,000) and one durable transaction per
  batch; row tuples are made before the clock starts, while client-side encoding, the protocol
  and the server's work are timed, as in the engine benchmark.
* Durability on the write path is PostgreSQL's default (``fsync=on``, ``synchronous_commit=on``,
  full-page writes): each batch commit is fsynced on the publisher before it returns.
  Subscribers apply with PostgreSQL's defaults too (asynchronous local commit, which is crash
  safe because the publisher keeps the WAL until the subscriber confirms it flushed).
* ``COPY`` is PostgreSQL's fastest bulk-load path from a client (much faster than
  ``executemany``), so the peer is measured at its best honest throughput.
* Every server runs on this machine with loopback-only networking (``listen_addresses``
  ``127.0.0.1``, unix sockets in the private temporary directory), the same place the reptables
  replicas run in their benchmark; both sides share the same 2 cores.

How it runs
-----------

Servers are PostgreSQL 15's own ``initdb``/``pg_ctl``/``postgres`` (``/usr/lib/postgresql/15/bin``
or the directory of ``pg_ctl`` on ``PATH``; ``PG_BINDIR`` overrides). PostgreSQL refuses to run as
root, so when this runs as root every server command runs as the ``postgres`` OS user (via
``runuser``), and the data directories live in a fresh temporary directory owned by that user.
The Debian package ``postgresql-15`` creates that user; without it a clear error is raised.
One cluster is made with ``initdb`` and copied for each server. Each server is started with
``pg_ctl start`` in a new session and stopped with ``pg_ctl -D <its data dir> stop -m fast``
(``-m immediate`` if that fails) - exactly the servers this module started, never by name - in
``finally`` blocks and from ``atexit``, and then the temporary directory is removed. Ports are
free ones found by binding port 0 (a start that loses a port race is retried on another port).
Every wait is bounded in count and in time.

Run from the repository root::

    .venv/bin/python benchmarks/pg_logical.py                       # 1,000,000 rows, 1,000 samples
    .venv/bin/python benchmarks/pg_logical.py --rows 20000 --latency-samples 20
    .venv/bin/python benchmarks/pg_logical.py --json out.json       # also write the results as JSON

Needs ``psycopg[binary]>=3.1`` in the environment.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import math
import os
import pwd
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

try:
    import psycopg
except ImportError:  # reported by _require_psycopg() with the install line
    psycopg = None  # type: ignore[assignment]

from reptables.engine.process import free_port
from reptables.testing import wait_for

if TYPE_CHECKING:
    from psycopg import Connection, Cursor

PG_MAJOR = 15
PG_OS_USER = "postgres"
DB_USER = "postgres"
DB_NAME = "postgres"
TABLE_DDL = "CREATE TABLE t (k bigint PRIMARY KEY, v text, d double precision)"
PUBLICATION = "bench_pub"

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
SETUP_TIMEOUT_S = 120.0  # subscriptions streaming + initial sync done
REPLICATION_TIMEOUT_S = 600.0  # bound of the wait for the subscribers to have every row
LATENCY_TIMEOUT_S = 1800.0  # bound of the whole latency sample loop
SAMPLE_STATEMENT_TIMEOUT_MS = 60_000
LATENCY_WARMUP = 5
MAX_SOCKET_PATH = 90  # unix socket paths are limited to ~107 bytes, and PostgreSQL appends its file name


class PgUnavailableError(RuntimeError):
    """PostgreSQL binaries, the ``postgres`` OS user or psycopg are missing."""


# -- results ---------------------------------------------------------------------------------------


@dataclass
class PgThroughputResult:
    rows: int
    batch_size: int
    insert_seconds: float  # time to COPY all rows into the publisher (commit per batch)
    replicated_seconds: float  # from first insert until BOTH subscribers have every row
    insert_rows_per_s: float
    end_to_end_rows_per_s: float
    # verification, read after the clocks stopped
    expected_checksum: str = ""
    publisher_count: int = 0
    publisher_checksum: str = ""
    subscriber_counts: list[int] = field(default_factory=list)
    subscriber_checksums: list[str] = field(default_factory=list)
    server_version: str = ""
    #: CPU seconds of each server (its postmaster's processes) from the first insert until both
    #: subscribers had every row: what replicating the rows cost PostgreSQL, beside reptables' engines
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        """True when the publisher and every subscriber hold exactly the rows written."""
        return (
            self.publisher_count == self.rows
            and self.publisher_checksum == self.expected_checksum
            and len(self.subscriber_counts) == 2
            and all(c == self.rows for c in self.subscriber_counts)
            and all(c == self.expected_checksum for c in self.subscriber_checksums)
        )


@dataclass
class PgLatencyResult:
    samples: int
    p50_ms: float
    p99_ms: float  # single-row INSERT commit latency with the subscriber as a synchronous standby
    mean_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    sync_state: str = ""  # pg_stat_replication.sync_state of the subscriber while sampling
    subscriber_count: int = 0  # rows on the subscriber afterwards (samples + warm-up)
    server_version: str = ""


# -- helpers ---------------------------------------------------------------------------------------


def _require_psycopg() -> None:
    if psycopg is None:
        raise PgUnavailableError(
            "psycopg 3 is not installed: .venv/bin/pip install 'psycopg[binary]>=3.1'")


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100), as in engine_bench.py."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def make_rows(start: int, count: int) -> list[tuple[int, str, float]]:
    """The benchmark's rows: the same shape and values as engine_bench.py."""
    return [(k, f"value-{k:012d}", k * 0.5) for k in range(start, start + count)]


def rows_checksum(rows: Iterable[tuple[int, str, float]]) -> str:
    """The client-side twin of :data:`CHECKSUM_SQL` (rows must be in key order)."""
    text = ",".join(f"{k}:{v}:{struct.pack('>d', d).hex()}" for k, v, d in rows)
    return hashlib.md5(text.encode()).hexdigest()


CHECKSUM_SQL = (
    "SELECT count(*), md5(coalesce(string_agg(k::text || ':' || v || ':' || encode(float8send(d), 'hex'), ','"
    " ORDER BY k), '')) FROM t"
)


def find_pg_bindir() -> Path:
    """The directory of PostgreSQL's server binaries (initdb, pg_ctl, postgres), or a clear error."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    candidates.append(Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin"))
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        candidates.append(Path(pg_ctl).resolve().parent)
    for d in candidates:
        if all(os.access(d / b, os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    raise PgUnavailableError(
        f"PostgreSQL {PG_MAJOR} server binaries (initdb, pg_ctl, postgres) not found in "
        f"{', '.join(str(c) for c in candidates)}; install them with `apt-get install postgresql-{PG_MAJOR}` "
        "(Debian) or set PG_BINDIR")


def server_version(bindir: Path) -> str:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=30,
                         check=True).stdout.strip()
    m = re.search(r"(\d+)(?:\.(\d+))?", out)
    if not m or int(m.group(1)) < PG_MAJOR:
        raise PgUnavailableError(f"need PostgreSQL >= {PG_MAJOR}, {bindir / 'postgres'} is {out!r}")
    return out


def _run_as_root() -> bool:
    return os.geteuid() == 0


def _pg_account() -> pwd.struct_passwd | None:
    """The OS account servers run as: ``postgres`` when we are root, else ourselves (None)."""
    if not _run_as_root():
        return None
    try:
        return pwd.getpwnam(PG_OS_USER)
    except KeyError:
        raise PgUnavailableError(
            f"running as root, but PostgreSQL refuses to run as root and there is no '{PG_OS_USER}' OS user "
            f"to run it as; `apt-get install postgresql-{PG_MAJOR}` creates it (or "
            f"`useradd --system --no-create-home {PG_OS_USER}`)") from None


# -- servers ---------------------------------------------------------------------------------------


class _Run:
    """A temporary directory with PostgreSQL servers in it; closing stops them all and removes it."""

    def __init__(self, workdir: Path | None) -> None:
        _require_psycopg()
        self.bindir = find_pg_bindir()
        self.version = server_version(self.bindir)
        self.account = _pg_account()
        self.servers: list[_Server] = []
        self._template: Path | None = None
        self._closed = False
        parent = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="pg-logical-", dir=parent))
        self.sockdir = self.dir / "s"
        self._own_sockdir: Path | None = None
        atexit.register(self.close)
        try:
            self.sockdir.mkdir()
            if len(str(self.sockdir)) > MAX_SOCKET_PATH:  # a deep workdir: keep the sockets short
                self._own_sockdir = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
                self.sockdir = self._own_sockdir
            for d in (self.dir, self.sockdir):
                self._chown(d)
            probe = self._cmd(["test", "-w", str(self.dir), "-a", "-x", str(self.dir)])
            if subprocess.run(probe, timeout=30).returncode != 0:
                raise PgUnavailableError(
                    f"the '{PG_OS_USER}' OS user cannot use {self.dir}: every directory above it must be "
                    "traversable by that user (pass another workdir, e.g. under /tmp)")
        except BaseException:
            self.close()
            raise

    def _chown(self, path: Path) -> None:
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _cmd(self, argv: list[str]) -> list[str]:
        if self.account is None:
            return argv
        return ["runuser", "-u", self.account.pw_name, "--", *argv]

    def run(self, argv: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self._cmd(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return proc

    def _template_dir(self) -> Path:
        if self._template is None:
            tmpl = self.dir / "template"
            self.run([str(self.bindir / "initdb"), "-D", str(tmpl), "-U", DB_USER, "--auth=trust", "-E", "UTF8",
                      "--no-locale", "--no-sync", "--no-instructions"], 120, "initdb")
            self._template = tmpl
        return self._template

    def server(self, name: str, settings: dict[str, str]) -> _Server:
        datadir = self.dir / name
        self.run(["cp", "-a", str(self._template_dir()), str(datadir)], 120, f"copying the cluster for {name}")
        conf = {"listen_addresses": "'127.0.0.1'", "unix_socket_directories": f"'{self.sockdir}'",
                "logging_collector": "off", **settings}
        with open(datadir / "postgresql.conf", "a", encoding="utf-8") as f:  # appending keeps the owner
            f.write("\n# pg_logical.py\n" + "".join(f"{k} = {v}\n" for k, v in conf.items()))
        srv = _Server(self, name, datadir)
        self.servers.append(srv)
        srv.start()
        return srv

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for srv in reversed(self.servers):
            try:
                srv.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{srv.name}: {exc}")
        if not errors:
            shutil.rmtree(self.dir, ignore_errors=True)
            if self._own_sockdir is not None:
                shutil.rmtree(self._own_sockdir, ignore_errors=True)
        atexit.unregister(self.close)
        if errors:
            raise RuntimeError(f"could not stop every server (data left in {self.dir}): {'; '.join(errors)}")

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Server:
    """One PostgreSQL server of a :class:`_Run`, started and stopped with pg_ctl on its data dir."""

    def __init__(self, run: _Run, name: str, datadir: Path) -> None:
        self.run = run
        self.name = name
        self.datadir = datadir
        self.logfile = run.dir / f"{name}.log"
        self.port = 0
        self.started = False

    def _pg_ctl(self, *args: str) -> list[str]:
        return [str(self.run.bindir / "pg_ctl"), "-D", str(self.datadir), *args]

    def start(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            self.port = free_port()
            self.started = True  # from here on stop() must try, even if start fails halfway
            try:
                self.run.run(self._pg_ctl("-l", str(self.logfile), "-w", "-t", str(int(START_TIMEOUT_S)),
                                          "-o", f"-p {self.port}", "start"), START_TIMEOUT_S + 30,
                             f"starting {self.name}")
                return
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                self.stop()
                log = self.logfile.read_text(errors="replace")[-3000:] if self.logfile.exists() else ""
                if "could not bind" in log and attempt + 1 < attempts:
                    continue  # lost a race for the port: take another
                raise RuntimeError(f"{exc}\n--- {self.logfile} ---\n{log}") from exc

    def stop(self) -> None:
        if not self.started:
            return
        pidfile = self.datadir / "postmaster.pid"
        if pidfile.exists():
            try:
                self.run.run(self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(int(STOP_TIMEOUT_S))),
                             STOP_TIMEOUT_S + 30, f"stopping {self.name}")
            except (RuntimeError, subprocess.TimeoutExpired):
                if pidfile.exists():
                    self.run.run(self._pg_ctl("stop", "-m", "immediate", "-w", "-t", str(int(STOP_TIMEOUT_S))),
                                 STOP_TIMEOUT_S + 30, f"stopping {self.name} (immediate)")
        self.started = False

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={DB_NAME} user={DB_USER}"

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by this server: its postmaster, the backends it reaped, its live children."""
        try:
            from benchmarks.engine_bench import process_tree_cpu_seconds
        except ImportError:  # run as a script from benchmarks/
            from engine_bench import process_tree_cpu_seconds  # type: ignore[import-not-found,no-redef]
        return process_tree_cpu_seconds(int((self.datadir / "postmaster.pid").read_text().split()[0]))

    def connect(self, autocommit: bool = True) -> Connection[Any]:
        return psycopg.connect(self.conninfo, autocommit=autocommit, connect_timeout=30)


# -- replication set-up ----------------------------------------------------------------------------


def _one_row(cursor: Cursor[Any]) -> Any:
    """The row of a query that always returns one (an aggregate, SHOW)."""
    row = cursor.fetchone()
    assert row is not None, "the query returned no row"
    return row


def _create_table(conns: Iterable[Connection[Any]]) -> None:
    for c in conns:
        c.execute(TABLE_DDL)


def _subscribe(pub: _Server, pub_conn: Connection[Any], subs: list[tuple[Connection[Any], str]]) -> None:
    """Publication on ``pub``; one subscription per (subscriber connection, name); wait until all stream."""
    pub_conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE t")
    for conn, name in subs:
        conn.execute(f"CREATE SUBSCRIPTION {name} CONNECTION '{pub.conninfo}' PUBLICATION {PUBLICATION}")

    def ready() -> bool:
        for conn, name in subs:
            not_ready, total = _one_row(conn.execute(
                "SELECT count(*) FILTER (WHERE r.srsubstate <> 'r'), count(*) FROM pg_subscription_rel r"
                " JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = %s", (name,)))
            worker = conn.execute("SELECT pid FROM pg_stat_subscription WHERE subname = %s AND relid IS NULL"
                                  " AND pid IS NOT NULL", (name,)).fetchone()
            if not_ready or total < 1 or worker is None:
                return False
        streaming = _one_row(pub_conn.execute(
            "SELECT count(DISTINCT application_name) FROM pg_stat_replication"
            " WHERE state = 'streaming' AND application_name = ANY(%s)", ([n for _, n in subs],)))[0]
        return streaming == len(subs)

    wait_for(ready, SETUP_TIMEOUT_S, "the subscriptions to finish their initial sync and stream")


def _checksum(conn: Connection[Any]) -> tuple[int, str]:
    count, digest = _one_row(conn.execute(CHECKSUM_SQL))
    return int(count), str(digest)


# -- 1. throughput ---------------------------------------------------------------------------------


def run_logical_replication(rows: int = 1_000_000, batch_size: int = 10_000,
                            workdir: Path | None = None) -> PgThroughputResult:
    """COPY ``rows`` rows into a publisher, one transaction per batch; time until two subscribers have them."""
    if rows < 1 or batch_size < 1:
        raise ValueError("rows and batch_size must be >= 1")
    batches = [make_rows(start, min(batch_size, rows - start)) for start in range(0, rows, batch_size)]
    expected = rows_checksum(r for batch in batches for r in batch)
    last_key = rows - 1

    with _Run(workdir) as run:
        pub = run.server("publisher", {"wal_level": "logical"})
        subs = [run.server(f"subscriber{i}", {}) for i in (1, 2)]
        with pub.connect() as pub_conn, subs[0].connect() as s1, subs[1].connect() as s2:
            sub_conns = [s1, s2]
            _create_table([pub_conn, *sub_conns])
            _subscribe(pub, pub_conn, [(s1, "bench_sub1"), (s2, "bench_sub2")])

            servers = [pub, *subs]
            cpu_before = [s.cpu_seconds() for s in servers]
            with pub.connect(autocommit=False) as writer, writer.cursor() as cur:
                t0 = time.perf_counter()
                for batch in batches:
                    with cur.copy("COPY t (k, v, d) FROM STDIN") as copy:
                        for row in batch:
                            copy.write_row(row)
                    writer.commit()
                insert_seconds = time.perf_counter() - t0

            # Poll both subscribers: cheap probe for the last key, then count(*) to confirm.
            done_at: list[float | None] = [None, None]
            confirmed = [False, False]

            def replicated() -> bool:
                for i, conn in enumerate(sub_conns):
                    if confirmed[i]:
                        continue
                    if done_at[i] is None:
                        if conn.execute("SELECT 1 FROM t WHERE k = %s", (last_key,)).fetchone() is None:
                            continue
                        done_at[i] = time.perf_counter()
                    if _one_row(conn.execute("SELECT count(*) FROM t"))[0] == rows:
                        confirmed[i] = True
                    else:  # cannot happen with one ordered writer; then the count decides
                        done_at[i] = None
                return all(confirmed)

            wait_for(replicated, REPLICATION_TIMEOUT_S, f"both subscribers to have {rows:,} rows")
            replicated_seconds = max(t for t in done_at if t is not None) - t0
            cpu = {s.name: s.cpu_seconds() - before for s, before in zip(servers, cpu_before, strict=True)}

            pub_count, pub_sum = _checksum(pub_conn)
            sub_sums = [_checksum(c) for c in sub_conns]

    return PgThroughputResult(
        rows=rows, batch_size=batch_size, insert_seconds=insert_seconds, replicated_seconds=replicated_seconds,
        insert_rows_per_s=rows / insert_seconds, end_to_end_rows_per_s=rows / replicated_seconds,
        expected_checksum=expected, publisher_count=pub_count, publisher_checksum=pub_sum,
        subscriber_counts=[c for c, _ in sub_sums], subscriber_checksums=[s for _, s in sub_sums],
        server_version=run.version, cpu_seconds=cpu)


# -- 2. synchronous-standby commit latency ---------------------------------------------------------


def run_sync_commit_latency(samples: int = 1000, workdir: Path | None = None) -> PgLatencyResult:
    """Sequential single-row INSERT commits on a publisher whose subscriber is its synchronous standby."""
    if samples < 1:
        raise ValueError("samples must be >= 1")
    sub_name = "bench_sync"
    with _Run(workdir) as run:
        pub = run.server("publisher", {"wal_level": "logical"})
        sub = run.server("subscriber", {})
        with pub.connect() as pub_conn, sub.connect() as sub_conn:
            _create_table([pub_conn, sub_conn])
            _subscribe(pub, pub_conn, [(sub_conn, sub_name)])
            pub_conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{sub_name}'")
            pub_conn.execute("SELECT pg_reload_conf()")

            def sync_state() -> str | None:
                row = pub_conn.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                                       (sub_name,)).fetchone()
                return row[0] if row and row[0] == "sync" else None

            wait_for(sync_state, SETUP_TIMEOUT_S, "the subscriber to become the synchronous standby")

            with pub.connect() as writer:  # autocommit: every INSERT is one commit
                writer.execute(f"SET statement_timeout = {SAMPLE_STATEMENT_TIMEOUT_MS}")
                setting = _one_row(writer.execute("SHOW synchronous_commit"))[0]
                if setting != "on":
                    raise RuntimeError(f"synchronous_commit is {setting!r}, expected 'on'")
                insert = "INSERT INTO t (k, v, d) VALUES (%s, %s, %s)"
                for k, v, d in make_rows(-LATENCY_WARMUP, LATENCY_WARMUP):
                    writer.execute(insert, (k, v, d))
                deadline = time.monotonic() + LATENCY_TIMEOUT_S
                times: list[float] = []
                for k, v, d in make_rows(0, samples):
                    t = time.perf_counter()
                    writer.execute(insert, (k, v, d))
                    times.append(time.perf_counter() - t)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{len(times)} of {samples} commits took over {LATENCY_TIMEOUT_S:.0f} s")
            state = sync_state() or "not sync"
            total = samples + LATENCY_WARMUP

            def sub_has_all() -> int | None:
                n = int(_one_row(sub_conn.execute("SELECT count(*) FROM t"))[0])
                return n if n == total else None

            sub_count = wait_for(sub_has_all, SETUP_TIMEOUT_S, f"the subscriber to have {total} rows")

    ms = [t * 1000.0 for t in times]
    return PgLatencyResult(samples=samples, p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99),
                           mean_ms=sum(ms) / len(ms), min_ms=min(ms), max_ms=max(ms), sync_state=state,
                           subscriber_count=int(sub_count), server_version=run.version)


# -- command line ----------------------------------------------------------------------------------


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so the finally blocks stop the servers


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows written in the throughput run")
    p.add_argument("--batch-size", type=int, default=10_000, help="rows per COPY / transaction")
    p.add_argument("--latency-samples", type=int, default=1000, help="single-row commits in the latency run "
                   "(0 skips it)")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the temporary data directory")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON "
                   "('-' for stdout)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    json_to_stdout = args.json is not None and str(args.json) == "-"
    human = sys.stderr if json_to_stdout else sys.stdout  # keep stdout pure JSON with --json -

    out: dict[str, Any] = {}
    print(f"[1/2] logical replication: {args.rows:,} rows in COPY batches of {args.batch_size:,} into a "
          "publisher with 2 subscribers ...", file=sys.stderr, flush=True)
    tp = run_logical_replication(args.rows, args.batch_size, args.workdir)
    out["throughput"] = {**asdict(tp), "verified": tp.verified}
    print(f"      {tp.server_version}", file=sys.stderr, flush=True)
    print(f"insert (publisher, COPY):   {tp.insert_seconds:8.2f} s  {tp.insert_rows_per_s:12,.0f} rows/s", file=human)
    print(f"end to end (2 subscribers): {tp.replicated_seconds:8.2f} s  {tp.end_to_end_rows_per_s:12,.0f} rows/s",
          file=human)
    print(f"verified: {tp.verified} (publisher {tp.publisher_count:,} rows, subscribers "
          f"{', '.join(f'{c:,}' for c in tp.subscriber_counts)}; checksum {tp.expected_checksum})", file=human)

    lat: PgLatencyResult | None = None
    if args.latency_samples > 0:
        print(f"[2/2] {args.latency_samples:,} single-row commits with the subscriber as synchronous standby ...",
              file=sys.stderr, flush=True)
        lat = run_sync_commit_latency(args.latency_samples, args.workdir)
        out["sync_commit_latency"] = asdict(lat)
        print(f"sync-standby commit latency: p50 {lat.p50_ms:.2f} ms, p99 {lat.p99_ms:.2f} ms "
              f"(mean {lat.mean_ms:.2f}, min {lat.min_ms:.2f}, max {lat.max_ms:.2f}; {lat.samples:,} samples, "
              f"sync_state {lat.sync_state})", file=human)

    if args.json is not None:
        text = json.dumps(out, indent=2)
        if json_to_stdout:
            print(text)
        else:
            args.json.write_text(text + "\n")
    ok = tp.verified and (lat is None or lat.sync_state == "sync")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
