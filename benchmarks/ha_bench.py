"""HA benchmark: how long writes stop when the meta-cluster's leader engine dies, and when its database's primary does.

What. A meta-cluster of two engine processes over one PostgreSQL database (``engine serve --standby``,
docs/ha.md): one leads, the other stands by. A replicated table on it has a *sync* replica on a
third engine (SQLite), so every acknowledged write is also on the replica. Writers insert one new
key per commit through the typed client given both meta engines' URLs (it follows the leader an
engine names, and goes on to the next URL when a connection is refused). Two cases:

* ``leader``: each trial SIGKILLs the process group of the leading engine; the standby takes over
  once the leader's lease has run out (``--leader-lease``, the engine's default unless given) and it has loaded the
  cluster from the database. The killed engine is started again afterwards, as the new standby, so
  the next trial kills the other one. The database is a plain PostgreSQL server the benchmark starts
  (:class:`reptables.testing.postgres.PostgresServer`), or ``--pg-server``'s.
* ``postgres``: the database is a Patroni cluster (:class:`reptables.testing.patroni.PatroniCluster`:
  etcd, a primary and a synchronous standby, ``synchronous_mode_strict``; docs/ha-postgres.md), and
  each trial SIGKILLs the primary's postmaster. Beside the writers a probe commits straight to
  PostgreSQL (psycopg, the same multi-host URL, a database of its own) in a loop: its first commit
  after the kill is when PostgreSQL's own failover was over, so the engines' share of the window is
  what comes after it. An engine that steps down meanwhile (its lease ran out while the database was
  away and the standby took the row over when it came back: exit status 75) is started again at once,
  as a supervisor (the kubelet) would.

What is measured, per trial (``time.monotonic``):

* the **write-unavailability window**: from the last acknowledgement before the kill to the first
  acknowledgement after it (any writer); and ``from kill``, the kill to that first acknowledgement.
  Target for the leader kill: p50 <= 2 s;
* where the time goes. Leader kill: ``before kill`` (last ack -> kill), ``lease left`` (what the
  database said was left of the leader's lease just before the kill: ``expires_at - now()``),
  ``standby look`` (the lease's end -> the standby won it: it looks every quarter of the lease, at
  most every 0.5 s), ``load`` (the new leader building the node from the database: ``load_seconds`` of
  its log line "engine serving as the leader"), ``client`` (serving -> the first acknowledged write:
  the writer's retry pause, a redirect, the commit). "Serving" is when a probe polling each engine's
  ``/readyz`` every 20 ms first saw 200. PostgreSQL kill: ``postgresql`` (kill -> the direct probe's
  first commit), ``engine`` (that -> the engines' first acknowledged write), ``promoted`` (kill ->
  Patroni's REST API showing a new primary), and whether the leader changed;
* **no acknowledged write lost**: after each trial every key acknowledged so far must be on the sync
  replica (a select of the replica table; waited for, bounded), and no write the engines refused
  (105 and the like: nothing applied) may be there. Writes without an answer (the request was at the
  killed engine) may be either.

Run from the repository root::

    .venv/bin/python benchmarks/ha_bench.py                          # both cases: 10 + 5 trials, ~4 min
    .venv/bin/python benchmarks/ha_bench.py --quick                  # 2 + 1 trials
    .venv/bin/python benchmarks/ha_bench.py --case leader --trials 10 --json out.json --plot docs/ha-failover.svg

``--plot PATH`` draws one trial of each case that ran (the median-window one) as an SVG timeline:
acknowledged commits per 100 ms, refused ones, which engine served, the direct PostgreSQL commits,
the kill and what followed. Every process the benchmark started (engines, PostgreSQL, Patroni, etcd)
is stopped by its pid at the end, also on an error, Ctrl-C or SIGTERM; its directories are removed
unless ``--keep-data``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import httpx

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError, never_sent
from reptables.engine.config import DEFAULT_LEASE
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.testing import KV_SCHEMA, TEST_TOKEN, EngineProcess, backends, wait_for

CASES = ("leader", "postgres")
TARGET_LEADER_P50_S = 2.0
PATH = "//home/bench/ha"
CLUSTER = "meta"
META_NAMES = ("meta_a", "meta_b")
PROBE_PERIOD_S = 0.02
#: the lines of the engines' JSON logs this benchmark reads
SERVING_LINE = "engine serving as the leader"
LEADER_PHASES = ("before_kill", "lease_left", "standby_look", "load", "client")
POSTGRES_PHASES = ("before_kill", "postgresql", "engine")


# -- configuration and results ----------------------------------------------------------------------------


@dataclass
class Config:
    cases: tuple[str, ...] = CASES
    trials: int = 10
    """Leader kills."""
    pg_trials: int = 5
    """PostgreSQL primary kills."""
    writers: int = 2
    warmup_s: float = 2.0
    """Seconds of writes before each kill, plus a random part of one lease renewal period."""
    after_s: float = 1.0
    """Seconds of writes after the first acknowledgement that follows the kill."""
    retry_pause_s: float = 0.05
    client_timeout_s: float = 5.0
    """The writers' request timeout in the leader case (a SIGKILLed engine refuses connections at once)."""
    pg_client_timeout_s: float = 60.0
    """The writers' request timeout in the PostgreSQL case: with two servers in strict synchronous mode a
    commit waits until the old primary has rejoined as the standby."""
    leader_lease_s: float = DEFAULT_LEASE
    pg_server: str | None = None
    """``HOST:PORT`` of an existing PostgreSQL server (loopback, trust auth) for the leader case."""
    recovery_timeout_s: float = 60.0
    settle_timeout_s: float = 120.0
    workdir: str | None = None
    keep_data: bool = False
    seed: int = 1


@dataclass
class Attempt:
    key: int
    start: float
    end: float
    ok: bool
    code: int = 0
    """0 acknowledged, else the error code; -1: no answer (the outcome is unknown)."""
    url: str = ""


@dataclass
class Trial:
    case: str
    index: int
    killed: str
    """The engine (leader case) or PostgreSQL member (postgres case) that was killed."""
    ok: bool = False
    problem: str = ""
    window_s: float | None = None
    from_kill_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    leader_before: str = ""
    leader_after: str = ""
    serving_s: float | None = None
    """Kill -> the new leader's /readyz 200 (leader case; postgres case: the leader's again)."""
    promoted_s: float | None = None
    pg_window_s: float | None = None
    pg_from_kill_s: float | None = None
    pg_share: float | None = None
    """postgresql / from kill: the share of the window that is PostgreSQL's own failover."""
    restarts: list[str] = field(default_factory=list)
    """Engines that exited during the trial (postgres case: stepped down) and were started again."""
    refused: dict[str, int] = field(default_factory=dict)
    """Error code -> writes refused between the kill and the first acknowledgement after it."""
    unknown: int = 0
    acked_trial: int = 0
    acked_total: int = 0
    lost: int = -1
    applied_failed: int = -1
    settle_s: float | None = None


@dataclass
class Timeline:
    """What ``--plot`` draws of one trial; times in seconds relative to the kill."""

    case: str
    index: int
    attempts: list[tuple[float, float, bool, int]]
    lanes: dict[str, list[tuple[float, str]]]
    """Engine -> its /readyz state changes (time, "leader" | "standby" | "unavailable" | "down")."""
    direct: list[float] = field(default_factory=list)
    """The ends of the direct PostgreSQL commits (postgres case)."""
    events: list[tuple[float, str]] = field(default_factory=list)
    window: tuple[float, float] | None = None


@dataclass
class CaseResult:
    case: str
    trials: list[Trial]
    summary: dict[str, Any]
    setup: dict[str, Any]
    timelines: list[Timeline] = field(default_factory=list)


@dataclass
class Result:
    config: Config
    cases: list[CaseResult]
    load: dict[str, list[float]]
    pids: list[int] = field(default_factory=list)
    """Every engine process the run started (all stopped when ``run`` returns)."""


# -- the processes ------------------------------------------------------------------------------------------


class ReadyProbe(threading.Thread):
    """Polls one engine's ``/readyz`` every :data:`PROBE_PERIOD_S` and records each change of its state."""

    def __init__(self, engine: EngineProcess, name: str) -> None:
        super().__init__(name=f"probe-{name}", daemon=True)
        self.engine, self.engine_name = engine, name
        self.changes: list[tuple[float, str]] = []
        self.stop_event = threading.Event()

    @property
    def state(self) -> str:
        return self.changes[-1][1] if self.changes else "down"

    def run(self) -> None:
        with httpx.Client(timeout=1.0) as http:
            while not self.stop_event.is_set():
                try:
                    answer = http.get(f"{self.engine.url}/readyz")
                    status = "leader" if answer.status_code == 200 else (
                        "standby" if answer.json().get("status") == "standby" else "unavailable")
                except (httpx.HTTPError, ValueError):
                    status = "down"
                if status != self.state:
                    self.changes.append((time.monotonic(), status))
                self.stop_event.wait(PROBE_PERIOD_S)

    def first(self, status: str, after: float) -> float | None:
        return next((t for t, s in list(self.changes) if s == status and t > after), None)


class Writer(threading.Thread):
    """Inserts one new key per commit through a client given every meta engine, until stopped."""

    def __init__(self, urls: list[str], first_key: int, timeout: float, retry_pause: float) -> None:
        super().__init__(name="writer", daemon=True)
        self.client = Client(urls, TEST_TOKEN, timeout=timeout)
        self.key = first_key
        self.retry_pause = retry_pause
        self.attempts: list[Attempt] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.key += 1
                start = time.monotonic()
                try:
                    self.client.insert_rows(PATH, [{"k": self.key, "v": f"v{self.key}"}])
                except TransportError as exc:
                    self.attempts.append(Attempt(self.key, start, time.monotonic(), False,
                                                 int(exc.code) if never_sent(exc) else -1))
                    self.stop_event.wait(self.retry_pause)
                except YtError as exc:
                    self.attempts.append(Attempt(self.key, start, time.monotonic(), False, int(exc.code)))
                    self.stop_event.wait(self.retry_pause)
                else:
                    self.attempts.append(Attempt(self.key, start, time.monotonic(), True, 0, self.client.proxy_url))
        finally:
            self.client.close()

    def finish(self) -> None:
        self.stop_event.set()
        self.join(120)


class DirectProbe(threading.Thread):
    """Commits one row at a time straight to PostgreSQL (psycopg, autocommit, reconnecting after any
    error): when its commits stop and start again is PostgreSQL's own failover."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(name="pg-probe", daemon=True)
        self.conninfo = conninfo
        self.acks: list[float] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        import psycopg

        conn: Any = None
        n = 0
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=2)
                n += 1
                conn.execute("INSERT INTO probe (n) VALUES (%s)", (n,))
                self.acks.append(time.monotonic())
            except psycopg.Error:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                conn = None
                self.stop_event.wait(0.02)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class Group:
    """The meta-cluster (two engines, ``--standby``, one database), its sync replica, the probes."""

    def __init__(self, base: Path, url: str, lease: float, pids: list[int]) -> None:
        self.base, self.url, self.pids = base, url, pids
        self.metas: dict[str, EngineProcess] = {}
        for name in META_NAMES:
            engine = EngineProcess(CLUSTER, base / name, log_level="info")
            engine.extra_args = ["--storage", url, "--standby", "--advertise-url", engine.url,
                                 "--leader-lease", f"{lease:g}"]
            self.metas[name] = engine
        with backends.using(backends.SQLITE):
            self.replica = EngineProcess("replica", base / "replica")
        self.probes: dict[str, ReadyProbe] = {}
        self.replica_id = ""
        self.supervising = threading.Event()
        self.restarts: list[tuple[float, str, int | None]] = []
        self._supervisor: threading.Thread | None = None

    def spawn(self, name: str) -> None:
        engine = self.metas[name]
        with signals_deferred():
            engine.spawn()
            self.pids.append(engine.pid)

    def start(self, timeout: float) -> None:
        with signals_deferred():
            self.replica.spawn()
            self.pids.append(self.replica.pid)
        for name in META_NAMES:
            self.spawn(name)
        self.replica.wait_ready(timeout)
        for engine in self.metas.values():
            engine.wait_up(timeout)
        for name, engine in self.metas.items():
            self.probes[name] = ReadyProbe(engine, name)
            self.probes[name].start()
        leader = self.wait_settled(timeout)
        with Client([e.url for e in self.metas.values()], TEST_TOKEN, timeout=30) as meta, \
                self.replica.client() as replica:
            meta.set("//sys/clusters", {
                CLUSTER: {"proxy_url": self.metas[leader].url, "token": peer_credential(TEST_TOKEN, CLUSTER)},
                "replica": {"proxy_url": self.replica.url, "token": peer_credential(TEST_TOKEN, CLUSTER)}})
            replica.set("//sys/clusters", {
                CLUSTER: {"proxy_url": self.metas[leader].url, "token": peer_credential(TEST_TOKEN, "replica")},
                "replica": {"proxy_url": self.replica.url, "token": peer_credential(TEST_TOKEN, "replica")}})
            meta.create("replicated_table", PATH, attributes={"dynamic": True, "schema": KV_SCHEMA}, recursive=True)
            meta.mount_table(PATH)
            self.replica_id = meta.create("table_replica", attributes={
                "table_path": PATH, "cluster_name": "replica", "replica_path": PATH, "mode": "sync"})
            replica.create("table", PATH, attributes={"dynamic": True, "schema": KV_SCHEMA,
                                                      "upstream_replica_id": self.replica_id}, recursive=True)
            replica.mount_table(PATH)
            meta.alter_table_replica(self.replica_id, enabled=True)
            wait_for(lambda: meta.get(f"#{self.replica_id}/@state") == "enabled", timeout, "the sync replica enabled")
        self.wait_in_sync(timeout)

    def leader(self) -> str | None:
        return next((n for n, p in self.probes.items() if p.state == "leader" and self.metas[n].alive()), None)

    def wait_settled(self, timeout: float) -> str:
        """Until one engine leads and the other stands by: the leader's name."""
        def settled() -> str | None:
            leader = self.leader()
            if leader is None:
                return None
            others = [n for n in self.metas if n != leader]
            return leader if all(self.probes[n].state == "standby" for n in others) else None

        return str(wait_for(settled, timeout, "a leader and a standby", interval=0.05))

    def point_replica_at(self, leader: str) -> None:
        """The replica's entry of the meta-cluster at the leader (what a Service over the engines gives it):
        the replica asks it about the transactions it holds in doubt."""
        with self.replica.client() as replica:
            replica.set(f"//sys/clusters/{CLUSTER}", {"proxy_url": self.metas[leader].url,
                                                      "token": peer_credential(TEST_TOKEN, "replica")})

    def wait_in_sync(self, timeout: float) -> None:
        with Client([e.url for e in self.metas.values()], TEST_TOKEN, timeout=10) as meta:
            wait_for(lambda: self.replica_id in meta.get_in_sync_replicas(PATH, meta.generate_timestamp()), timeout,
                     "the sync replica in sync", retry_on=(YtError,))

    def replica_keys(self) -> set[int]:
        with self.replica.client(timeout=60) as replica:
            return {int(r["k"]) for r in replica.select_rows(f"k from [{PATH}]", output_row_limit=100_000_000)}

    def supervise(self) -> None:
        """Start an exited meta engine again at once (a stepped-down leader exits with 75), as a kubelet does."""
        self.supervising.set()

        def loop() -> None:
            while self.supervising.is_set():
                for name, engine in self.metas.items():
                    if engine.proc is not None and engine.proc.poll() is not None and self.supervising.is_set():
                        self.restarts.append((time.monotonic(), name, engine.proc.returncode))
                        self.spawn(name)
                time.sleep(0.05)

        self._supervisor = threading.Thread(target=loop, name="supervisor", daemon=True)
        self._supervisor.start()

    def stop(self) -> None:
        self.supervising.clear()
        if self._supervisor is not None:
            self._supervisor.join(5)
        for probe in self.probes.values():
            probe.stop_event.set()
        for engine in [*self.metas.values(), self.replica]:
            engine.stop()
        for probe in self.probes.values():
            probe.join(5)


def _serving_load_seconds(engine: EngineProcess, offset: int) -> float | None:
    """``load_seconds`` of the first "engine serving as the leader" line of ``engine``'s log after ``offset``."""
    try:
        with open(engine.log_path, "rb") as log:
            log.seek(offset)
            for line in log:
                if SERVING_LINE.encode() not in line:
                    continue
                with contextlib.suppress(ValueError):
                    return float(json.loads(line)["load_seconds"])
    except OSError:
        pass
    return None


def _log_size(engine: EngineProcess) -> int:
    try:
        return engine.log_path.stat().st_size
    except OSError:
        return 0


# -- the databases ------------------------------------------------------------------------------------------


class PlainDatabase:
    """The leader case's database: on a PostgreSQL server this benchmark starts (stopped at the end), or on
    ``--pg-server``'s (the database is dropped at the end)."""

    def __init__(self, address: str | None, base: Path | None) -> None:
        from reptables.testing.postgres import DB_USER, PostgresServer

        self.server: PostgresServer | None = None
        if address is None:
            self.server = PostgresServer(base).start()
            self.host, self.port = "127.0.0.1", self.server.port
        else:
            host, _, port = address.rpartition(":")
            if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
                raise ValueError(f"--pg-server {address!r}: expected HOST:PORT on loopback")
            self.host, self.port = host.strip("[]"), int(port)
        self.user = DB_USER
        self.name = f"ha_bench_{os.getpid()}_{random.randrange(1 << 30)}"
        self._sql(f'CREATE DATABASE "{self.name}"')
        self.url = f"postgresql://{self.user}@{self.host}:{self.port}/{self.name}"

    def conninfo(self, database: str) -> str:
        return f"host={self.host} port={self.port} dbname={database} user={self.user}"

    def _sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.conninfo("postgres"), autocommit=True, connect_timeout=30) as conn:
            conn.execute(statement)

    def describe(self) -> str:
        return f"{'a server the benchmark started' if self.server else 'the given server'} at {self.host}:{self.port}"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        else:
            with contextlib.suppress(Exception):
                self._sql(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def lease_left(conninfo: str) -> float | None:
    """Seconds left of the lease in ``_rt_leader``, by the database's clock."""
    import psycopg

    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT extract(epoch FROM expires_at - now()) FROM _rt_leader WHERE id = 1").fetchone()
    except psycopg.Error:
        return None
    return float(row[0]) if row is not None and row[0] is not None else None


# -- the benchmark ---------------------------------------------------------------------------------------------


def p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def load_average() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return [math.nan] * 3


class Bench:
    """One case: its database, its group, its trials."""

    def __init__(self, cfg: Config, case: str, base: Path, pids: list[int], progress: TextIO) -> None:
        self.cfg, self.case, self.base, self.pids, self.progress = cfg, case, base, pids, progress
        self.rng = random.Random(cfg.seed)
        self.acked: set[int] = set()
        self.failed: set[int] = set()
        self.next_key = 0
        self.group: Group | None = None
        self.plain: PlainDatabase | None = None
        self.patroni: Any = None
        self.probe_conninfo = ""
        self.setup: dict[str, Any] = {}
        #: where PostgreSQL and Patroni make their own directories (removed by their stop): not under ``base``,
        #: which is private to this user, while the servers run as the ``postgres`` OS user when root
        self.server_base = Path(cfg.workdir) if cfg.workdir else None

    def say(self, text: str) -> None:
        print(f"[{self.case}] {text}", file=self.progress, flush=True)

    # -- set-up -----------------------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        if self.case == "leader":
            self.say(f"starting PostgreSQL{' (given: ' + self.cfg.pg_server + ')' if self.cfg.pg_server else ''}")
            self.plain = PlainDatabase(self.cfg.pg_server, self.server_base)
            url = self.plain.url
            self.setup["database"] = self.plain.describe()
        else:
            from reptables.testing.patroni import PatroniCluster

            self.say("starting etcd and two Patroni-managed PostgreSQL servers")
            self.patroni = PatroniCluster(base=self.server_base).start()
            url = self.patroni.create_database("ha_bench")
            probe_url = self.patroni.create_database("ha_probe")
            probe_db = probe_url.split("?", 1)[0].rsplit("/", 1)[1]
            self.patroni.psql("CREATE TABLE probe (n bigint, at timestamptz DEFAULT now())", probe_db)
            hosts = [m.address.rsplit(":", 1) for m in self.patroni.members]
            self.probe_conninfo = (f"host={','.join(h for h, _ in hosts)} port={','.join(p for _, p in hosts)} "
                                   f"dbname={probe_db} user={backends.DB_USER} target_session_attrs=read-write")
            self.setup["database"] = (f"Patroni: {len(self.patroni.members)} members, synchronous_mode_strict, "
                                      "ttl 10 s, loop_wait 1 s, retry_timeout 3 s, primary_start_timeout 0")
        self.setup["leader_lease_s"] = self.cfg.leader_lease_s
        self.say("starting the meta-cluster's two engines (--standby) and the replica's engine")
        self.group = Group(self.base / "engines", url, self.cfg.leader_lease_s, self.pids)
        self.group.start(self.cfg.settle_timeout_s)
        if self.case == "postgres":
            self.group.supervise()
        self.setup["start_s"] = round(time.monotonic() - started, 2)
        self.say(f"ready in {self.setup['start_s']:.1f} s")

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
        if self.plain is not None:
            self.plain.close()
            self.plain = None
        if self.patroni is not None:
            self.patroni.stop()
            self.patroni = None

    # -- trials -----------------------------------------------------------------------------------------

    def settle(self) -> float:
        assert self.group is not None
        started = time.monotonic()
        if self.patroni is not None:
            self.patroni.wait_healthy(self.cfg.settle_timeout_s)
        leader = self.group.wait_settled(self.cfg.settle_timeout_s)
        self.group.point_replica_at(leader)
        self.group.wait_in_sync(self.cfg.settle_timeout_s)
        return time.monotonic() - started

    def writers(self) -> list[Writer]:
        assert self.group is not None
        timeout = self.cfg.client_timeout_s if self.case == "leader" else self.cfg.pg_client_timeout_s
        urls = [e.url for e in self.group.metas.values()]
        out = []
        for _ in range(self.cfg.writers):
            out.append(Writer(urls, self.next_key, timeout, self.cfg.retry_pause_s))
            self.next_key += 1_000_000_000
        return out

    def trial(self, index: int) -> tuple[Trial, Timeline | None]:
        assert self.group is not None
        group = self.group
        settle_s = self.settle()
        leader = group.leader() or group.wait_settled(self.cfg.settle_timeout_s)
        killed = leader if self.case == "leader" else ""
        trial = Trial(self.case, index, killed, leader_before=leader, settle_s=round(settle_s, 2))
        writers = self.writers()
        direct = DirectProbe(self.probe_conninfo) if self.case == "postgres" else None
        for thread in [*writers, *([direct] if direct else [])]:
            thread.start()
        offsets = {name: _log_size(e) for name, e in group.metas.items()}
        restarts_before = len(group.restarts)
        promoted_at: list[float] = []
        t_kill = 0.0
        try:
            wait_for(lambda: sum(a.ok for w in writers for a in list(w.attempts)) >= 20, 60, "writes acknowledged")
            time.sleep(self.cfg.warmup_s + self.rng.uniform(0, self.cfg.leader_lease_s / 3))
            if self.case == "leader":
                assert self.plain is not None
                left = lease_left(self.plain.conninfo(self.plain.name))
                os.killpg(group.metas[leader].pid, signal.SIGKILL)
                t_kill = time.monotonic()
                group.metas[leader].kill()  # (waits for it)
                trial.phases["lease_left"] = round(max(left or 0.0, 0.0), 3)
            else:
                member = self.patroni.kill_primary()
                t_kill = time.monotonic()
                trial.killed = member.name

                def watch() -> None:
                    with contextlib.suppress(AssertionError, Exception):
                        self.patroni.wait_for_primary(self.cfg.recovery_timeout_s, other_than=member)
                        promoted_at.append(time.monotonic())

                threading.Thread(target=watch, name="promotion", daemon=True).start()

            def acked_after() -> float | None:
                # a commit started after the kill (one in flight may still have been answered by the dying one)
                ends = [a.end for w in writers for a in list(w.attempts) if a.ok and a.start > t_kill]
                return min(ends) if ends else None

            first = wait_for(acked_after, self.cfg.recovery_timeout_s, "a write acknowledged after the kill",
                             interval=0.02)
            # the replica's entry of the meta-cluster at the new leader, as a Service over the engines
            # would route it (outside the window: the writes above did not need it)
            url = next(a.url for w in writers for a in list(w.attempts) if a.ok and a.end == first)
            group.point_replica_at(next(n for n, e in group.metas.items() if e.url == url))
            wait_for(lambda: time.monotonic() >= first + self.cfg.after_s, self.cfg.after_s + 5, "writes after")
        except AssertionError as exc:
            trial.problem = str(exc).splitlines()[0][:200]
        finally:
            for writer in writers:
                writer.finish()
            if direct is not None:
                direct.stop_event.set()
                direct.join(30)
        attempts = sorted((a for w in writers for a in w.attempts), key=lambda a: a.end)
        self.analyse(trial, attempts, t_kill, offsets, promoted_at, direct)
        trial.restarts = [f"{name} (exit {code})" for _, name, code in group.restarts[restarts_before:]]
        # the killed engine back, as the standby (the leader case; the supervisor does it in the other)
        if self.case == "leader" and not group.metas[killed].alive():
            self.group.spawn(killed)
        self.check(trial, attempts)
        timeline = self.timeline(trial, attempts, t_kill, direct, promoted_at)
        return trial, timeline

    def analyse(self, trial: Trial, attempts: list[Attempt], t_kill: float, offsets: dict[str, int],
                promoted_at: list[float], direct: DirectProbe | None) -> None:
        assert self.group is not None
        # the window: the longest stretch without an acknowledgement that ends after the kill (an answer
        # the killed engine or the dying primary had sent may still arrive a few ms after it)
        acks = sorted((a for a in attempts if a.ok), key=lambda a: a.end)
        gaps = [(b.end - a.end, a.end, b) for a, b in zip(acks, acks[1:], strict=False) if b.end > t_kill]
        last_before, first_after, first = None, None, None
        if gaps:
            _, last_before, first = max(gaps, key=lambda g: g[0])
            first_after = first.end
        trial.acked_trial = len(acks)
        trial.unknown = sum(a.code == -1 for a in attempts)
        trial.refused = dict(Counter(str(a.code) for a in attempts
                                     if not a.ok and t_kill < a.end <= (first_after or math.inf)))
        if promoted_at:
            trial.promoted_s = round(promoted_at[0] - t_kill, 3)
        new_leader = first.url if first is not None else ""
        trial.leader_after = next((n for n, e in self.group.metas.items() if e.url == new_leader), "")
        if last_before is None or first_after is None:
            trial.problem = trial.problem or "no acknowledged write before or after the kill"
            return
        trial.window_s = round(first_after - last_before, 3)
        trial.from_kill_s = round(first_after - t_kill, 3)
        trial.phases["before_kill"] = round(t_kill - last_before, 3)
        probe = self.group.probes.get(trial.leader_after)
        serving = probe.first("leader", t_kill) if probe is not None else None
        if serving is not None:
            trial.serving_s = round(serving - t_kill, 3)
        if self.case == "leader":
            load = _serving_load_seconds(self.group.metas[trial.leader_after], offsets[trial.leader_after]) \
                if trial.leader_after else None
            if serving is not None and load is not None:
                won = serving - load - t_kill
                trial.phases["standby_look"] = round(won - trial.phases["lease_left"], 3)
                trial.phases["load"] = round(load, 3)
                trial.phases["client"] = round(first_after - serving, 3)
            else:
                trial.problem = trial.problem or "the new leader's serving time or load is unknown"
        elif direct is not None:
            direct_gaps = [(b - a, a, b) for a, b in zip(direct.acks, direct.acks[1:], strict=False) if b > t_kill]
            if direct_gaps:
                gap, _, pg_first = max(direct_gaps)
                trial.pg_window_s = round(gap, 3)
                trial.pg_from_kill_s = round(pg_first - t_kill, 3)
                trial.phases["postgresql"] = trial.pg_from_kill_s
                trial.phases["engine"] = round(first_after - pg_first, 3)
                trial.pg_share = round(trial.pg_from_kill_s / trial.from_kill_s, 3) if trial.from_kill_s else None

    def check(self, trial: Trial, attempts: list[Attempt]) -> None:
        """Every key acknowledged so far on the sync replica; no refused write there."""
        assert self.group is not None
        self.acked |= {a.key for a in attempts if a.ok}
        self.failed |= {a.key for a in attempts if not a.ok and a.code > 0}
        trial.acked_total = len(self.acked)
        present: set[int] = set()
        error = ""
        deadline = time.monotonic() + self.cfg.recovery_timeout_s
        while time.monotonic() < deadline:
            try:
                present = self.group.replica_keys()
            except YtError as exc:
                error = exc.message.splitlines()[0][:200]
            else:
                if self.acked <= present:
                    break
            time.sleep(0.2)
        trial.lost = len(self.acked - present)
        trial.applied_failed = len(self.failed & present)
        trial.ok = not trial.problem and trial.lost == 0 and trial.applied_failed == 0 and trial.window_s is not None
        if not trial.problem and not trial.ok:
            trial.problem = f"{trial.lost} acknowledged writes lost, {trial.applied_failed} refused ones applied" + (
                f" (the replica's last answer: {error})" if error else "")

    def timeline(self, trial: Trial, attempts: list[Attempt], t_kill: float, direct: DirectProbe | None,
                 promoted_at: list[float]) -> Timeline | None:
        assert self.group is not None
        if not attempts or not t_kill:
            return None
        lo = min(a.start for a in attempts) - 0.5
        lanes = {name: [(t - t_kill, s) for t, s in probe.changes if t >= lo]
                 for name, probe in self.group.probes.items()}
        for name, probe in self.group.probes.items():  # the state when the drawing starts
            earlier = [s for t, s in probe.changes if t < lo]
            if earlier:
                lanes[name].insert(0, (lo - t_kill, earlier[-1]))
        events = [(0.0, f"SIGKILL {trial.killed}")]
        if self.case == "leader" and "lease_left" in trial.phases:
            events.append((trial.phases["lease_left"], "lease expired"))
            if "standby_look" in trial.phases:
                events.append((trial.phases["lease_left"] + trial.phases["standby_look"],
                               f"{trial.leader_after} takes the lease over"))
        if trial.promoted_s is not None:
            events.append((trial.promoted_s, "PostgreSQL standby promoted"))
        if trial.pg_from_kill_s is not None:
            events.append((trial.pg_from_kill_s, "first direct PostgreSQL commit"))
        if trial.serving_s is not None:
            events.append((trial.serving_s, f"{trial.leader_after} serving"))
        window = None
        if trial.window_s is not None and trial.from_kill_s is not None:
            window = (trial.from_kill_s - trial.window_s, trial.from_kill_s)
        return Timeline(self.case, trial.index, [(a.start - t_kill, a.end - t_kill, a.ok, a.code) for a in attempts],
                        lanes, [t - t_kill for t in direct.acks] if direct is not None else [], events, window)

    def run(self) -> CaseResult:
        trials: list[Trial] = []
        timelines: list[Timeline] = []
        count = self.cfg.trials if self.case == "leader" else self.cfg.pg_trials
        self.start()
        for index in range(1, count + 1):
            trial, timeline = self.trial(index)
            trials.append(trial)
            if timeline is not None:
                timelines.append(timeline)
            self.say(f"trial {index}/{count}: killed {trial.killed}, window {fmt(trial.window_s)} s, from the kill "
                     f"{fmt(trial.from_kill_s)} s, {trial.leader_before} -> {trial.leader_after or '?'}"
                     + (f", PostgreSQL's own {fmt(trial.pg_from_kill_s)} s" if self.case == "postgres" else "")
                     + f", lost {trial.lost}" + ("" if trial.ok else f"  PROBLEM: {trial.problem}"))
        return CaseResult(self.case, trials, summarise(self.case, trials), self.setup, timelines)


def summarise(case: str, trials: list[Trial]) -> dict[str, Any]:
    windows = [t.window_s for t in trials if t.window_s is not None]
    from_kill = [t.from_kill_s for t in trials if t.from_kill_s is not None]
    phases = LEADER_PHASES if case == "leader" else POSTGRES_PHASES
    summary: dict[str, Any] = {
        "trials": len(trials),
        "window_p50_s": p50(windows), "window_max_s": max(windows, default=None),
        "from_kill_p50_s": p50(from_kill), "from_kill_max_s": max(from_kill, default=None),
        "phases_p50_s": {p: p50([t.phases[p] for t in trials if p in t.phases]) for p in phases},
        "lost_writes": sum(max(t.lost, 0) for t in trials),
        "applied_failed": sum(max(t.applied_failed, 0) for t in trials),
        "acknowledged": trials[-1].acked_total if trials else 0,
        "unknown_outcome": sum(t.unknown for t in trials),
        "refused": dict(sum((Counter(t.refused) for t in trials), Counter())),
        "all_ok": bool(trials) and all(t.ok for t in trials),
    }
    if case == "leader":
        summary["target_p50_s"] = TARGET_LEADER_P50_S
        summary["window_ok"] = summary["window_p50_s"] is not None and summary["window_p50_s"] <= TARGET_LEADER_P50_S
    else:
        summary["promoted_p50_s"] = p50([t.promoted_s for t in trials if t.promoted_s is not None])
        summary["pg_from_kill_p50_s"] = p50([t.pg_from_kill_s for t in trials if t.pg_from_kill_s is not None])
        summary["pg_from_kill_max_s"] = max((t.pg_from_kill_s for t in trials if t.pg_from_kill_s is not None),
                                            default=None)
        summary["pg_share_p50"] = p50([t.pg_share for t in trials if t.pg_share is not None])
        summary["leader_changed"] = sum(1 for t in trials if t.leader_after and t.leader_after != t.leader_before)
        summary["engine_restarts"] = sum(len(t.restarts) for t in trials)
    return summary


# -- output ---------------------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(result: Result, out: TextIO) -> None:
    print(f"HA failover, load average {result.load['start'][0]:.2f} -> {result.load['end'][0]:.2f}", file=out)
    for case in result.cases:
        s = case.summary
        print("", file=out)
        if case.case == "leader":
            print(f"The meta-cluster's leader SIGKILLed ({len(case.trials)} trials; lease "
                  f"{case.setup.get('leader_lease_s')} s; database: {case.setup.get('database')})", file=out)
            header = (f"{'#':>2} {'killed':7} {'new':7} {'window':>7} {'f.kill':>7} | {'pre':>5} {'lease':>5} "
                      f"{'look':>5} {'load':>5} {'client':>6} | {'refused':14} {'unkn':>4} {'acked':>6} {'lost':>4} ok")
        else:
            print(f"The PostgreSQL primary SIGKILLed ({len(case.trials)} trials; {case.setup.get('database')})",
                  file=out)
            header = (f"{'#':>2} {'killed':7} {'leader':15} {'window':>7} {'f.kill':>7} | {'pre':>5} {'pg':>5} "
                      f"{'engine':>6} {'promo':>5} {'share':>5} | {'refused':14} {'unkn':>4} {'acked':>6} "
                      f"{'lost':>4} ok")
        print(header, file=out)
        print("-" * len(header), file=out)
        for t in case.trials:
            ph = t.phases
            refused = ",".join(f"{n}x{c}" for c, n in sorted(t.refused.items())) or "-"
            ok = "yes" if t.ok else "NO " + t.problem
            if case.case == "leader":
                print(f"{t.index:>2} {t.killed:7} {t.leader_after or '-':7} {fmt(t.window_s):>7} "
                      f"{fmt(t.from_kill_s):>7} | {fmt(ph.get('before_kill')):>5} {fmt(ph.get('lease_left')):>5} "
                      f"{fmt(ph.get('standby_look')):>5} {fmt(ph.get('load')):>5} {fmt(ph.get('client')):>6} | "
                      f"{refused[:14]:14} {t.unknown:>4} {t.acked_trial:>6} {t.lost:>4} {ok}", file=out)
            else:
                moved = f"{t.leader_before}->{t.leader_after or '?'}"
                print(f"{t.index:>2} {t.killed:7} {moved:15} {fmt(t.window_s):>7} {fmt(t.from_kill_s):>7} | "
                      f"{fmt(ph.get('before_kill')):>5} {fmt(ph.get('postgresql')):>5} {fmt(ph.get('engine')):>6} "
                      f"{fmt(t.promoted_s):>5} {fmt(t.pg_share):>5} | {refused[:14]:14} {t.unknown:>4} "
                      f"{t.acked_trial:>6} {t.lost:>4} {ok}", file=out)
        print("-" * len(header), file=out)
        if case.case == "leader":
            print("seconds; window = last ack before the kill -> first ack after it; f.kill = kill -> that ack; pre = "
                  "last ack -> kill; lease = left of the leader's lease at the kill (database clock); look = lease end "
                  "-> the standby won it; load = the new leader building the node; client = serving -> first ack; "
                  "refused = code x count; unkn = writes without an answer (at the killed engine)", file=out)
            mark = "PASS" if s["window_ok"] else "MISS"
            print(f"write-unavailability window  p50 {fmt(s['window_p50_s'])} s  max {fmt(s['window_max_s'])} s   "
                  f"(from the kill p50 {fmt(s['from_kill_p50_s'])} s, max {fmt(s['from_kill_max_s'])} s)   "
                  f"target p50 <= {TARGET_LEADER_P50_S:g} s   {mark}", file=out)
        else:
            print("seconds; pg = kill -> the first commit straight to PostgreSQL (its own failover); engine = that -> "
                  "the engines' first ack; promo = kill -> Patroni shows a new primary; share = pg / f.kill", file=out)
            print(f"write-unavailability window  p50 {fmt(s['window_p50_s'])} s  max {fmt(s['window_max_s'])} s   "
                  f"(from the kill p50 {fmt(s['from_kill_p50_s'])} s, max {fmt(s['from_kill_max_s'])} s); "
                  f"PostgreSQL's own failover p50 {fmt(s['pg_from_kill_p50_s'])} s (max {fmt(s['pg_from_kill_max_s'])} "
                  f"s), share p50 {fmt(s['pg_share_p50'])}; promoted p50 {fmt(s['promoted_p50_s'])} s; leader moved "
                  f"in {s['leader_changed']} of {len(case.trials)} trials, {s['engine_restarts']} engine restart(s)",
                  file=out)
        print("phases p50: " + ", ".join(f"{k} {fmt(v)}" for k, v in s["phases_p50_s"].items()), file=out)
        print(f"acknowledged writes {s['acknowledged']}, lost {s['lost_writes']}, refused writes applied "
              f"{s['applied_failed']}, no answer {s['unknown_outcome']}; all trials ok: "
              f"{'yes' if s['all_ok'] else 'NO'}", file=out)


def to_json(result: Result) -> dict[str, Any]:
    return {"config": asdict(result.config), "load": result.load, "engine_pids": result.pids,
            "cases": {c.case: {"summary": c.summary, "setup": c.setup, "trials": [asdict(t) for t in c.trials]}
                      for c in result.cases}}


# -- the plot (--plot) ------------------------------------------------------------------------------------------

SVG_WIDTH = 960
PLOT_LEFT, PLOT_RIGHT = 150, 930
PANEL_HEIGHT = 285
BIN_S = 0.1
GREEN, RED, BLUE, GREY, ORANGE = "#2e7d32", "#c62828", "#1565c0", "#616161", "#ef6c00"
LANE_COLOURS = {"leader": GREEN, "standby": "#bdbdbd", "unavailable": ORANGE, "down": "#ffcdd2"}


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _nice_step(span: float, ticks: int = 6) -> float:
    raw = max(span, 1e-9) / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _panel(tl: Timeline, title: str, top: float) -> list[str]:
    """One trial: acknowledged commits per 100 ms and refused ones, direct PostgreSQL commits, the engines'
    /readyz states, the events; ``top`` is the panel's y offset."""
    ends = [end for _, end, _, _ in tl.attempts]
    t0 = math.floor(max(min([*ends, -1.0]), -3.0) * 2) / 2
    t1 = math.ceil(max([*ends, 1.0]) * 2) / 2

    def x(t: float) -> float:
        return PLOT_LEFT + (min(max(t, t0), t1) - t0) / (t1 - t0) * (PLOT_RIGHT - PLOT_LEFT)

    writes_top, writes_bottom = top + 40, top + 140
    direct_top, direct_bottom = top + 150, top + 175
    lanes_top = direct_bottom + 8 if tl.direct else top + 150
    lane_h = 16
    bottom = lanes_top + lane_h * len(tl.lanes)
    out = [f'<text x="{PLOT_LEFT}" y="{top + 14}" font-size="14" font-weight="bold">{_esc(title)}</text>']
    if tl.window is not None:
        lo, hi = tl.window
        out.append(f'<rect x="{x(lo):.1f}" y="{writes_top}" width="{x(hi) - x(lo):.1f}" height="{bottom - writes_top}" '
                   f'fill="{RED}" fill-opacity="0.08"/>')
        out.append(f'<text x="{(x(lo) + x(hi)) / 2:.1f}" y="{writes_bottom - 6}" text-anchor="middle" '
                   f'fill="{RED}" font-weight="bold">writes unavailable {hi - lo:.2f} s</text>')
    step = _nice_step(t1 - t0, 10)
    tick = math.ceil(t0 / step) * step
    while tick <= t1 + 1e-9:
        out.append(f'<line x1="{x(tick):.1f}" y1="{writes_top}" x2="{x(tick):.1f}" y2="{bottom}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{x(tick):.1f}" y="{bottom + 14}" text-anchor="middle">{tick:g}</text>')
        tick += step
    out.append(f'<text x="{(PLOT_LEFT + PLOT_RIGHT) / 2}" y="{bottom + 30}" text-anchor="middle">seconds since the '
               'kill</text>')
    out.append(f'<rect x="{PLOT_LEFT}" y="{writes_top}" width="{PLOT_RIGHT - PLOT_LEFT}" '
               f'height="{writes_bottom - writes_top}" fill="none" stroke="{GREY}"/>')
    bins: Counter[int] = Counter(math.floor((end - t0) / BIN_S) for _, end, ok, _ in tl.attempts
                                 if ok and t0 <= end <= t1)
    top_count = max(bins.values(), default=1)
    bar_w = max(1.0, x(t0 + BIN_S) - x(t0) - 1)
    scale = (writes_bottom - writes_top - 24) / top_count
    for index, count in sorted(bins.items()):
        h = count * scale
        out.append(f'<rect x="{x(t0 + index * BIN_S):.1f}" y="{writes_bottom - h:.1f}" width="{bar_w:.1f}" '
                   f'height="{h:.1f}" fill="{GREEN}"/>')
    refused = [(start, code) for start, _, ok, code in tl.attempts if not ok and t0 <= start <= t1]
    for start, _code in refused:
        out.append(f'<line x1="{x(start):.1f}" y1="{writes_top + 3}" x2="{x(start):.1f}" y2="{writes_top + 15}" '
                   f'stroke="{RED}" stroke-width="1.2"/>')
    codes = Counter("no answer" if code == -1 else f"code {code}" for _, code in refused)
    out.append(f'<text x="{PLOT_LEFT - 8}" y="{writes_top + 13}" text-anchor="end" fill="{RED}">refused</text>')
    out.append(f'<text x="{PLOT_LEFT - 8}" y="{writes_bottom}" text-anchor="end">0</text>')
    out.append(f'<text x="{PLOT_LEFT - 8}" y="{writes_bottom - top_count * scale + 4:.1f}" text-anchor="end">'
               f'{top_count}</text>')
    out.append(f'<text x="{PLOT_LEFT - 8}" y="{(writes_top + writes_bottom) / 2 + 4:.1f}" text-anchor="end">'
               'acks / 100 ms</text>')
    out.append(f'<text x="{PLOT_LEFT}" y="{top + 30}">green: writes acknowledged per 100 ms through the engines; red '
               'ticks: writes refused or unanswered ('
               + (", ".join(f"{n} x {c}" for c, n in sorted(codes.items())) or "none") + ')</text>')
    if tl.direct:
        out.append(f'<rect x="{PLOT_LEFT}" y="{direct_top}" width="{PLOT_RIGHT - PLOT_LEFT}" '
                   f'height="{direct_bottom - direct_top}" fill="none" stroke="{GREY}"/>')
        dbins: Counter[int] = Counter(math.floor((t - t0) / BIN_S) for t in tl.direct if t0 <= t <= t1)
        dtop = max(dbins.values(), default=1)
        for index, count in sorted(dbins.items()):
            h = count / dtop * (direct_bottom - direct_top - 2)
            out.append(f'<rect x="{x(t0 + index * BIN_S):.1f}" y="{direct_bottom - h:.1f}" width="{bar_w:.1f}" '
                       f'height="{h:.1f}" fill="{BLUE}"/>')
        out.append(f'<text x="{PLOT_LEFT - 8}" y="{direct_bottom - 8}" text-anchor="end" fill="{BLUE}">'
                   'direct to PostgreSQL</text>')
    for row, (name, changes) in enumerate(sorted(tl.lanes.items())):
        y = lanes_top + row * lane_h
        out.append(f'<text x="{PLOT_LEFT - 8}" y="{y + 12}" text-anchor="end">{_esc(name)} /readyz</text>')
        for i, (at, state) in enumerate(changes):
            end = changes[i + 1][0] if i + 1 < len(changes) else t1
            if end <= t0 or at >= t1:
                continue
            out.append(f'<rect x="{x(at):.1f}" y="{y + 2}" width="{max(x(end) - x(at), 0.5):.1f}" '
                       f'height="{lane_h - 4}" fill="{LANE_COLOURS.get(state, GREY)}">'
                       f'<title>{_esc(state)}</title></rect>')
    for offset, (at, label) in enumerate(sorted(tl.events)):
        colour = RED if at == 0.0 else (BLUE if "PostgreSQL" in label else GREY)
        out.append(f'<line x1="{x(at):.1f}" y1="{writes_top}" x2="{x(at):.1f}" y2="{bottom}" stroke="{colour}" '
                   f'stroke-width="1.4" stroke-dasharray="5,3"/>')
        right = x(at) > PLOT_LEFT + 0.6 * (PLOT_RIGHT - PLOT_LEFT)  # labels near the right edge end at their line
        out.append(f'<text x="{x(at) + (-3 if right else 3):.1f}" y="{writes_top + 28 + 13 * offset}" fill="{colour}" '
                   f'text-anchor="{"end" if right else "start"}">{_esc(label)} {at:+.2f} s</text>')
    return out


def plot_svg(panels: list[tuple[Timeline, str]]) -> str:
    height = 40 + PANEL_HEIGHT * len(panels)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}" '
           f'viewBox="0 0 {SVG_WIDTH} {height}" font-family="sans-serif" font-size="11">',
           "<title>reptables HA failover timelines (benchmarks/ha_bench.py)</title>",
           f'<rect width="{SVG_WIDTH}" height="{height}" fill="white"/>']
    legend = " ".join(f'<tspan fill="{c}">&#9632; {s}</tspan>' for s, c in LANE_COLOURS.items())
    out.append(f'<text x="{PLOT_LEFT}" y="20">engine states (/readyz polled every 20 ms): {legend}</text>')
    for index, (tl, title) in enumerate(panels):
        out.extend(_panel(tl, title, 30 + index * PANEL_HEIGHT))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plot(result: Result, path: Path) -> bool:
    """The median-window trial of each case that ran, one panel each; False when no trial can be drawn."""
    panels: list[tuple[Timeline, str]] = []
    for case in result.cases:
        drawn = [t for t in case.timelines if t.window is not None]
        if not drawn:
            continue
        drawn.sort(key=lambda t: t.window[1] - t.window[0] if t.window else 0.0)
        tl = drawn[(len(drawn) - 1) // 2]
        what = ("the meta-cluster's leader engine SIGKILLed; the standby takes over" if case.case == "leader" else
                "the PostgreSQL primary SIGKILLed under both engines (Patroni fails over)")
        panels.append((tl, f"Trial {tl.index} of {len(case.trials)}: {what}"))
    if not panels:
        return False
    path.write_text(plot_svg(panels))
    return True


# -- running ----------------------------------------------------------------------------------------------------


def run(cfg: Config, progress: TextIO = sys.stderr) -> Result:
    """Run the benchmark's cases; every process it started is stopped before this returns or raises."""
    pids: list[int] = []
    load = {"start": load_average()}
    base = Path(tempfile.mkdtemp(prefix="reptables-ha-bench-", dir=cfg.workdir))
    cases: list[CaseResult] = []
    try:
        for case in cfg.cases:
            bench = Bench(cfg, case, base / case, pids, progress)
            (base / case).mkdir()
            atexit.register(bench.stop)
            try:
                cases.append(bench.run())
            finally:
                bench.stop()
                atexit.unregister(bench.stop)
    finally:
        if not cfg.keep_data:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"data and logs kept in {base}", file=progress)
    load["end"] = load_average()
    return Result(cfg, cases, load, pids)


_defer_depth = 0
_pending_signal: int | None = None


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold back Ctrl-C/SIGTERM (once ``main`` installed its handler) while a process is being spawned, so
    that every process started is one the benchmark knows and stops."""
    global _defer_depth, _pending_signal
    _defer_depth += 1
    try:
        yield
    finally:
        _defer_depth -= 1
    if _defer_depth == 0 and _pending_signal is not None:
        signum, _pending_signal = _pending_signal, None
        raise KeyboardInterrupt(f"signal {signum}")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _pending_signal
    if _defer_depth:
        _pending_signal = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=[*CASES, "all"], default="all",
                        help="leader: SIGKILL the leading engine; postgres: SIGKILL the PostgreSQL primary (Patroni)")
    parser.add_argument("--trials", type=int, default=None, help="leader kills (default 10; --quick 2)")
    parser.add_argument("--pg-trials", type=int, default=None, help="PostgreSQL primary kills (default 5; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="few trials, short warm-up: a smoke run")
    parser.add_argument("--writers", type=int, default=Config.writers)
    parser.add_argument("--warmup", type=float, default=None, help="seconds of writes before each kill (default 2)")
    parser.add_argument("--after", type=float, default=None, help="seconds of writes after the failover (default 1)")
    parser.add_argument("--leader-lease", type=float, default=Config.leader_lease_s,
                        help=f"the engines' --leader-lease (default {DEFAULT_LEASE:g}, the engine's)")
    parser.add_argument("--pg-server", default=None, metavar="HOST:PORT",
                        help="the leader case's PostgreSQL server (loopback, trust auth; a test run's): a database is "
                        "made there and dropped afterwards. Default: a server the benchmark starts")
    parser.add_argument("--workdir", default=None, help="parent of the temporary directory")
    parser.add_argument("--keep-data", action="store_true", help="keep the engines' data and logs")
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also draw the median trial of each case as an SVG timeline")
    args = parser.parse_args(argv)
    quick = args.quick
    cfg = Config(cases=CASES if args.case == "all" else (args.case,),
                 trials=args.trials if args.trials is not None else (2 if quick else Config.trials),
                 pg_trials=args.pg_trials if args.pg_trials is not None else (1 if quick else Config.pg_trials),
                 writers=args.writers,
                 warmup_s=args.warmup if args.warmup is not None else (1.0 if quick else Config.warmup_s),
                 after_s=args.after if args.after is not None else (0.5 if quick else Config.after_s),
                 leader_lease_s=args.leader_lease, pg_server=args.pg_server, workdir=args.workdir,
                 keep_data=args.keep_data, seed=args.seed)
    if cfg.trials < 1 or cfg.pg_trials < 1 or cfg.writers < 1:
        parser.error("--trials, --pg-trials and --writers must be at least 1")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    out = sys.stdout
    try:
        result = run(cfg)
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc}); every process started was stopped", file=sys.stderr)
        return 130
    render(result, out)
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(result), indent=2, default=str))
        print(f"JSON written to {args.json}", file=out)
    if args.plot:
        if write_plot(result, Path(args.plot)):
            print(f"plot written to {args.plot}", file=out)
        else:
            print("no trial to plot", file=sys.stderr)
    ok = all(c.summary["all_ok"] for c in result.cases)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
