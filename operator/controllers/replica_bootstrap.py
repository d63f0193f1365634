"""Bootstrapping a new replica of a table whose history was trimmed: choose T, copy, verify, enable.

A replica added to a replicated table whose replication queue was trimmed cannot get the old
changes from the queue, and the engine refuses to enable it (code 1740, docs/replication.md,
"Adding a replica to a table with history"). The cure is a bootstrap: pick a timestamp T on the
meta-cluster, create the replica *disabled* with ``start_replication_timestamp = T`` (the replica
then pins the queue at T), copy the table as of T into the replica table (the Spark bootstrap job),
compare the copy with its source at T (the verify job) and enable the replica: the replicator sends
every change after T.

The copy takes seconds to hours, and a reconcile must never wait for it: the kopf handlers and the
local runner call the reconcile core again and again, so each call advances the bootstrap by at
most one step — start a job and return, or look at the job it started and move on — and records
where it is in ``status.bootstrap`` (``phase``, ``jobRef``, ``attempts``...). The status is the only
memory between calls, so a job this operator does not know (it restarted) is a lost attempt.

Jobs are run by a :class:`Launcher`. :class:`LocalLauncher` runs them as local processes (local
Spark), for ``reptables up`` and the tests; a SparkApplication launcher for Kubernetes is the next
increment (docs/operator.md). The jobs need the meta-cluster's token and two peer credentials:
the launcher receives them as values, writes them to files of mode 0600 in a private directory and
gives the job their paths — never on a command line (``ps`` shows it), in a status, an event or a
log line. The job's error line is what the user sees on failure; known secrets are masked in it
all the same.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError

from . import conditions, metrics, models
from .conditions import Cond
from .world import ClusterNotFound, Event, Resource, World, describe_error

BOOTSTRAP_MODULE = "reptables.sparkapps.bootstrap"
VERIFY_MODULE = "reptables.sparkapps.verify"
#: how often a running job is looked at
POLL_SECONDS = 2.0
#: the longest wait between two attempts
MAX_BACKOFF_SECONDS = 600.0
#: how long the copy job waits for its source to be in sync at T
SOURCE_WAIT_SECONDS = 120
_ROWS_COPIED = re.compile(r"bootstrap copied (\d+) rows")
_FAILED_LINE = re.compile(r"((?:bootstrap|verify|xdcr join) failed: .*)$")
_VERIFY_SUMMARY = re.compile(r"(verify of .* differing ranges.*)$")
_MASK = "***"


# --- launching jobs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """The resource a job works for: a launcher that creates objects for the job makes them its children."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None


@dataclass(frozen=True)
class JobSpec:
    """One run of a job: ``python -m <module> <args> --<secret option> <file> ...``."""

    name: str
    """Unique among the launcher's jobs (a new one per attempt)."""
    module: str
    args: tuple[str, ...]
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Option name (such as ``meta-token-file``) -> secret value; the launcher passes a file."""
    owner: Owner | None = None
    """The TableReplica being bootstrapped."""

    @property
    def job(self) -> str:
        """``bootstrap`` or ``verify``: the last part of the module's name."""
        return self.module.rsplit(".", 1)[-1]


class LaunchError(Exception):
    """A launcher could not start or follow a job; the message says why (it becomes the attempt's error)."""


@dataclass(frozen=True)
class JobState:
    """What a launcher knows of a job."""

    running: bool
    exit_code: int | None = None
    error: str | None = None
    """One line: why the job failed (secrets masked); None when it succeeded or runs."""
    rows_copied: int | None = None
    """From the bootstrap job's log line ``bootstrap copied N rows``."""


class Launcher(Protocol):
    """Runs the bootstrap and verify jobs somewhere; the reconcile core only starts and polls them."""

    def start(self, job: JobSpec) -> str:
        """Start the job and return its reference (``jobRef``) at once, without waiting for it."""
        ...

    def poll(self, ref: str) -> JobState | None:
        """The job's state, or None when this launcher does not know ``ref`` (e.g. it was restarted)."""
        ...

    def stop(self, ref: str) -> None:
        """Stop the job if it still runs (nothing else)."""
        ...

    def close(self) -> None:
        """Stop every job still running and release what the launcher holds."""
        ...


def mask(text: str, secrets: Mapping[str, str] | list[str]) -> str:
    values = secrets.values() if isinstance(secrets, Mapping) else secrets
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, _MASK)
    return text


def error_line(log: str, exit_code: int) -> str:
    """The one line that says why a job failed: its ``... failed: ...`` line, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        found = _FAILED_LINE.search(line)
        if found:
            return found.group(1)[:1000]
    if exit_code == 1:
        for line in reversed(lines):
            found = _VERIFY_SUMMARY.search(line)
            if found:
                return found.group(1)[:1000]
    tail = lines[-1][:1000] if lines else "no output"
    return f"exit status {exit_code}: {tail}"


@dataclass
class _LocalJob:
    spec: JobSpec
    process: subprocess.Popen[bytes]
    directory: Path
    log: Path
    state: JobState | None = None


class LocalLauncher:
    """Runs each job as a local process with local Spark (``reptables up``, tests).

    Every job runs in a process group of its own (``start_new_session``), so stopping it stops its
    Spark JVM too and nothing else: the launcher signals exactly the groups of the processes it
    started, by pid. Secrets go to files of mode 0600 in a directory of mode 0700 that only this
    launcher uses, deleted when the job ends.
    """

    def __init__(self, base_dir: Path | None = None, python: str = sys.executable, master: str = "local[2]",
                 env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.master = master
        self.env = dict(env or {})
        self.directory = Path(tempfile.mkdtemp(prefix="reptables-jobs-", dir=base_dir))
        self.directory.chmod(0o700)
        #: guards _jobs; a leaf (starting or signalling a process never waits for another lock)
        self._lock = threading.Lock()
        self._jobs: dict[str, _LocalJob] = {}  # guarded by _lock

    def start(self, job: JobSpec) -> str:
        ref = f"local:{job.name}"
        with self._lock:
            if ref in self._jobs:
                return ref
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job.name)
            directory = self.directory / safe
            directory.mkdir(mode=0o700)
            argv = [self.python, "-m", job.module, *job.args]
            for option, value in job.secrets.items():
                path = directory / option
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(value)
                argv += [f"--{option}", str(path)]
            argv += ["--master", self.master]
            env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": self.python, **self.env}
            for name in ("REPTABLES_META_TOKEN", "REPTABLES_SOURCE_CREDENTIAL", "REPTABLES_TARGET_CREDENTIAL",
                         "REPTABLES_LEFT_TOKEN", "REPTABLES_RIGHT_TOKEN"):
                env.pop(name, None)  # the files are the only secrets a job gets
            log = directory / "log"
            with open(log, "wb") as out:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True, close_fds=True)
            self._jobs[ref] = _LocalJob(job, process, directory, log)
        return ref

    def poll(self, ref: str) -> JobState | None:
        with self._lock:
            job = self._jobs.get(ref)
        if job is None:
            return None
        if job.state is not None:
            return job.state
        code = job.process.poll()
        if code is None:
            return JobState(running=True)
        text = job.log.read_text(errors="replace")
        rows = _ROWS_COPIED.findall(text)
        state = JobState(running=False, exit_code=code,
                         error=None if code == 0 else mask(error_line(text, code), job.spec.secrets),
                         rows_copied=int(rows[-1]) if rows else None)
        self._forget_secrets(job)
        job.state = state
        return state

    def log_of(self, ref: str) -> str:
        """The job's output (for a person debugging; secrets masked)."""
        with self._lock:
            job = self._jobs.get(ref)
        if job is None or not job.log.exists():
            return ""
        return mask(job.log.read_text(errors="replace"), job.spec.secrets)

    def pids(self) -> list[int]:
        """Process ids of the jobs still running."""
        with self._lock:
            return [j.process.pid for j in self._jobs.values() if j.process.poll() is None]

    def stop(self, ref: str) -> None:
        with self._lock:
            job = self._jobs.get(ref)
        if job is not None:
            self._stop(job)

    def _stop(self, job: _LocalJob) -> None:
        if job.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
                try:
                    os.killpg(job.process.pid, sig)  # the group this launcher created: the job and its JVM
                except ProcessLookupError:
                    break
                try:
                    job.process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._forget_secrets(job)

    @staticmethod
    def _forget_secrets(job: _LocalJob) -> None:
        for option in job.spec.secrets:
            (job.directory / option).unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            self._stop(job)
        shutil.rmtree(self.directory, ignore_errors=True)


# --- deciding and advancing a bootstrap --------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A bootstrap about to begin: the snapshot timestamp and the replica to copy from."""

    timestamp: int
    source_replica_id: str
    reason: str = "the table's history was trimmed"
    """Why the replica is bootstrapped (for the BootstrapPending event)."""


def history_trimmed(meta: Any, table_path: str) -> bool:
    """Whether the replication queue of the table lost rows to trimming (some tablet trimmed some)."""
    return any(int(t.get("trimmed_row_count") or 0) > 0 for t in meta.get(f"{table_path}/@tablets") or [])


def holds_rows(meta: Any, table_path: str) -> bool:
    """Whether anything was ever written to the table (some tablet of its queue has rows)."""
    return any(int(t.get("flushed_row_count") or 0) > 0 for t in meta.get(f"{table_path}/@tablets") or [])


def pick_source(meta: Any, table_path: str, world: World, cluster: str, replica_path: str) -> str | None:
    """An enabled replica of the table, on a known cluster, other than the new one: sync ones first."""
    known = world.engines.clusters()
    candidates = []
    for replica_id, info in (meta.get(f"{table_path}/@replicas") or {}).items():
        if (info.get("cluster_name"), info.get("replica_path")) == (cluster, replica_path):
            continue
        if info.get("state") == "enabled" and info.get("cluster_name") in known:
            candidates.append((info.get("mode") != "sync", int(info.get("replication_lag_time") or 0), str(replica_id)))
    return min(candidates)[2] if candidates else None


def plan(res: Resource, table: Resource, meta: Any, world: World) -> Start | None:
    """For a replica about to be created: whether it needs a bootstrap, and then T and its source.

    A bootstrap is wanted when ``spec.bootstrap`` is enabled and the table already holds rows: it is
    required when the table's queue was trimmed (the engine refuses to enable the replica without
    one), and it is the default for any table with rows when this operator can run jobs (a launcher):
    the copy moves the rows in parallel instead of replaying the queue one batch at a time. Without a
    launcher an untrimmed queue is replayed (exact, only slower); ``always`` asks for a copy even of
    an empty table. It is possible only with another enabled replica to copy from. T is generated on
    the meta-cluster now, unless the spec gives ``startReplicationTimestamp``.
    """
    spec = res.spec
    if not spec.bootstrap.enabled or not spec.preserve_timestamps:
        return None
    if not table.spec.is_sorted:
        # a copy fills sorted tables only (an ordered table's rows have positions a parallel copy cannot
        # keep): an untrimmed queue is replayed, and a trimmed one leaves the replica refused at enable
        # (1740), which the Ready condition reports
        return None
    if history_trimmed(meta, table.spec.path):
        reason = f"the history of {table.spec.path} was trimmed"
    elif world.launcher is not None and holds_rows(meta, table.spec.path):
        reason = f"{table.spec.path} already holds rows"
    elif spec.bootstrap.always:
        reason = "spec.bootstrap.always is set"
    else:
        return None
    source = pick_source(meta, table.spec.path, world, spec.cluster, spec.replica_path)
    if source is None:
        return None
    timestamp = spec.start_replication_timestamp or int(meta.generate_timestamp())
    return Start(timestamp, source, reason)


@dataclass
class Step:
    """What one reconcile did to a bootstrap."""

    status: dict[str, Any]
    """The new ``status.bootstrap``."""
    events: list[Event]
    retry_after: float
    condition: Cond
    """Bootstrapped."""

    @property
    def phase(self) -> str:
        return str(self.status.get("phase"))


def pending_status(start: Start) -> dict[str, Any]:
    return {"phase": "Pending", "snapshotTimestamp": start.timestamp, "sourceReplicaId": start.source_replica_id,
            "attempts": 0}


def created_step(boot: Mapping[str, Any]) -> Step:
    """The reconcile that created the replica stops there: the copy starts on the next one."""
    return Step(dict(boot), [], 0.5, Cond(conditions.BOOTSTRAPPED, False, "Pending",
                                          f"the copy as of {int(boot['snapshotTimestamp']):#x} is about to start"))


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


class _JobError(Exception):
    pass


def _secrets(res: Resource, table: Resource, world: World, source_cluster: str) -> dict[str, str]:
    """The meta-cluster's token and its peer credentials for the source and the target cluster."""
    meta_name = table.spec.cluster
    meta_ref = world.engines.ref(meta_name)
    return {"meta-token-file": meta_ref.token,
            "source-credential-file": peer_credential(world.engines.ref(source_cluster).token, meta_name),
            "target-credential-file": peer_credential(world.engines.ref(res.spec.cluster).token, meta_name)}


def _job_name(res: Resource, what: str, replica_id: str, attempt: int) -> str:
    """``<replica>-<copy|verify>-<attempt>-<hash>``: one name per attempt.

    Deterministic, so that two reconciles of one replica that both saw the same status (the operator's
    event handler and its refresh timer can overlap) start one job, not two: a launcher starts a
    name once, and answers a name it started before with that job. The hash is of the resource's
    uid (a TableReplica deleted and created again under the same name) and of the engine replica's
    id (a replica started over after its table was lost): a new bootstrap never gets an old job's
    result.
    """
    digest = hashlib.sha256(f"{res.uid}\0{replica_id}".encode()).hexdigest()[:6]
    return f"{res.name}-{what}-{attempt}-{digest}"


def _owner(res: Resource) -> Owner:
    return Owner(models.API_VERSION, res.kind, res.name, res.uid, res.namespace)


def _copy_job(res: Resource, table: Resource, world: World, boot: Mapping[str, Any], replica_id: str,
              source_cluster: str, attempt: int) -> JobSpec:
    secrets = _secrets(res, table, world, source_cluster)
    args = ("--meta-proxy", world.engines.ref(table.spec.cluster).endpoint, "--replica-id", replica_id,
            "--source-replica-id", str(boot["sourceReplicaId"]), "--partitions", str(res.spec.bootstrap.parallelism),
            "--wait", str(SOURCE_WAIT_SECONDS))
    return JobSpec(_job_name(res, "copy", replica_id, attempt), BOOTSTRAP_MODULE, args, secrets, _owner(res))


def _verify_job(res: Resource, table: Resource, world: World, boot: Mapping[str, Any], source: Mapping[str, Any],
                replica_id: str, attempt: int) -> JobSpec:
    secrets = _secrets(res, table, world, str(source["cluster_name"]))
    args = ("--left-proxy", world.engines.ref(str(source["cluster_name"])).endpoint,
            "--left-path", str(source["replica_path"]),
            "--right-proxy", world.engines.ref(res.spec.cluster).endpoint, "--right-path", res.spec.replica_path,
            "--timestamp", str(boot["snapshotTimestamp"]), "--partitions", str(res.spec.bootstrap.parallelism))
    return JobSpec(_job_name(res, "verify", replica_id, attempt), VERIFY_MODULE, args,
                   {"left-token-file": secrets["source-credential-file"],
                    "right-token-file": secrets["target-credential-file"]}, _owner(res))


def _known_secrets(world: World) -> list[str]:
    return [ref.token for ref in world.engines.clusters().values()]


def advance(res: Resource, table: Resource, meta: Any, world: World, replica_id: str,
            boot: Mapping[str, Any]) -> Step:
    """Move the bootstrap one step on: never waits for a job, only starts or looks at one."""
    step = _advance(res, table, meta, world, replica_id, boot)
    metrics.record_bootstrap(res.namespace, res.name, step.status.get("phase"), step.status.get("rowsCopied"))
    return step


def _advance(res: Resource, table: Resource, meta: Any, world: World, replica_id: str,
             boot: Mapping[str, Any]) -> Step:
    status = dict(boot)
    events: list[Event] = []
    phase = status.get("phase")

    def step(retry: float, cond: Cond) -> Step:
        return Step(status, events, retry, cond)

    def waiting(reason: str, message: str, retry: float) -> Step:
        return step(retry, Cond(conditions.BOOTSTRAPPED, False, reason, message))

    if phase == "Done":
        return step(30.0, Cond(conditions.BOOTSTRAPPED, True, "Copied", _done_message(status)))
    if phase == "Failed":
        if int(status.get("attempts") or 0) < res.spec.bootstrap.max_attempts:
            # the user raised spec.bootstrap.maxAttempts after the failure: try again, at once
            status.update(phase="Pending", nextAttemptTime=None)
            events.append(Event("Normal", "BootstrapRetrying",
                                f"spec.bootstrap.maxAttempts is now {res.spec.bootstrap.max_attempts}: attempt "
                                f"{int(status.get('attempts') or 0) + 1} starts"))
            return waiting("Pending", "retrying after spec.bootstrap.maxAttempts was raised", 0.5)
        return step(60.0, Cond(conditions.BOOTSTRAPPED, False, "BootstrapFailed", _failed_message(status)))
    launcher = world.launcher
    if launcher is None:
        return waiting("NoLauncher", "this operator runs no bootstrap jobs: enable the chart's bootstrap.spark "
                                     "(REPTABLES_SPARK_JOBS), or bootstrap by hand (docs/spark.md)", 60.0)
    try:
        if phase == "Pending":
            retry_at = _parse_time(status.get("nextAttemptTime"))
            if retry_at is not None and retry_at > _now():
                return waiting("Pending", f"attempt {int(status.get('attempts') or 0) + 1} of "
                                          f"{res.spec.bootstrap.max_attempts} starts at {status['nextAttemptTime']}; "
                                          f"last error: {status.get('lastError')}",
                               max(1.0, (retry_at - _now()).total_seconds()))
            source = _source_info(meta, status)
            attempt = int(status.get("attempts") or 0) + 1
            ref = launcher.start(_copy_job(res, table, world, status, replica_id, str(source["cluster_name"]),
                                           attempt))
            status.update(phase="Copying", attempts=attempt, jobRef=ref)
            status["nextAttemptTime"] = None  # null: a merge patch removes it
            events.append(Event("Normal", "BootstrapCopying",
                                f"attempt {attempt}: copying replica {status['sourceReplicaId']} as of "
                                f"{int(status['snapshotTimestamp']):#x} ({ref})"))
            return waiting("Copying", f"copying as of {int(status['snapshotTimestamp']):#x}, attempt {attempt}",
                           POLL_SECONDS)
        if phase in ("Copying", "Verifying"):
            job = launcher.poll(str(status.get("jobRef")))
            if job is None:
                raise _JobError(f"job {status.get('jobRef')} is lost (the operator restarted)")
            if job.running:
                if phase == "Copying":
                    status["rowsCopied"] = copied_rows(world, res, status.get("rowsCopied"))
                return waiting(str(phase), f"{str(phase).lower()} as of {int(status['snapshotTimestamp']):#x}, "
                                           f"attempt {status.get('attempts')} ({status.get('jobRef')})"
                                           + (f", {status['rowsCopied']} rows so far"
                                              if phase == "Copying" and status.get("rowsCopied") is not None
                                              else ""), POLL_SECONDS)
            if job.exit_code != 0:
                what = "copy" if phase == "Copying" else "verify"
                raise _JobError(f"the {what} job failed: {job.error}")
            if phase == "Copying":
                status["rowsCopied"] = (job.rows_copied if job.rows_copied is not None
                                        else copied_rows(world, res, status.get("rowsCopied")))
                if res.spec.bootstrap.verify:
                    source = _source_info(meta, status)
                    ref = launcher.start(_verify_job(res, table, world, status, source, replica_id,
                                                     int(status["attempts"])))
                    status.update(phase="Verifying", jobRef=ref)
                    events.append(Event("Normal", "BootstrapVerifying",
                                        f"copied {job.rows_copied} rows; comparing with replica "
                                        f"{status['sourceReplicaId']} ({ref})"))
                    return waiting("Verifying", f"verifying as of {int(status['snapshotTimestamp']):#x}",
                                   POLL_SECONDS)
            status["phase"] = "Enabling"
            events.append(Event("Normal", "BootstrapEnabling", f"{status.get('rowsCopied')} rows copied"
                                f"{' and verified' if res.spec.bootstrap.verify else ''}; enabling replica "
                                f"{replica_id}"))
            phase = "Enabling"
        if phase == "Enabling":
            if res.spec.enabled:
                state = meta.get(f"#{replica_id}/@state")
                if state == "disabled":
                    meta.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
                    state = meta.get(f"#{replica_id}/@state")
                if state != "enabled":
                    return waiting("Enabling", f"replica {replica_id} is {state}", 1.0)
            status["phase"] = "Done"
            status["lastError"] = None
            events.append(Event("Normal", "BootstrapDone", _done_message(status)))
            return step(0.0, Cond(conditions.BOOTSTRAPPED, True, "Copied", _done_message(status)))
        raise _JobError(f"unknown bootstrap phase {phase!r}")
    except (_JobError, LaunchError, YtError, ClusterNotFound) as exc:
        message = mask(str(exc) if isinstance(exc, _JobError | LaunchError) else describe_error(exc),
                       _known_secrets(world))
        return _failed_attempt(res, status, events, message)


def copied_rows(world: World, res: Resource, default: Any = None) -> int | None:
    """Rows the copy has written into the new replica's table so far, as its cluster counts them.

    The target cluster records every applied chunk of a bootstrap with its row count (the replica
    table's ``@bootstrap_progress``), so this is exact whichever launcher ran the job and however
    often its tasks were retried. ``default`` when the cluster cannot say (unreachable, nothing yet).
    """
    try:
        progress = world.engines.client(res.spec.cluster).get(f"{res.spec.replica_path}/@bootstrap_progress")
    except (YtError, ClusterNotFound):
        return int(default) if isinstance(default, int) else None
    return int(progress["rows"]) if isinstance(progress, Mapping) and "rows" in progress else None


def _source_info(meta: Any, status: Mapping[str, Any]) -> dict[str, Any]:
    source_id = status.get("sourceReplicaId")
    if not source_id or not meta.exists(f"#{source_id}"):
        raise _JobError(f"the source replica {source_id} no longer exists")
    info: dict[str, Any] = meta.get(f"#{source_id}/@")
    return info


def _failed_attempt(res: Resource, status: dict[str, Any], events: list[Event], message: str) -> Step:
    attempts = int(status.get("attempts") or 0)
    limit = res.spec.bootstrap.max_attempts
    status["lastError"] = message
    metrics.BOOTSTRAP_FAILURES.labels(res.namespace or "", res.name, str(attempts >= limit).lower()).inc()
    if attempts >= limit:
        status["phase"] = "Failed"
        status["nextAttemptTime"] = None  # null: a merge patch removes it
        events.append(Event("Warning", "BootstrapFailed", _failed_message(status)))
        return Step(status, events, 60.0, Cond(conditions.BOOTSTRAPPED, False, "BootstrapFailed",
                                               _failed_message(status)))
    delay = min(MAX_BACKOFF_SECONDS, res.spec.bootstrap.backoff_seconds * 2 ** max(0, attempts - 1))
    retry_at = _now() + timedelta(seconds=delay)
    status.update(phase="Pending", nextAttemptTime=conditions.now_text(retry_at))
    events.append(Event("Warning", "BootstrapRetrying",
                        f"attempt {attempts} of {limit} failed: {message}; retrying in {delay:g} s"))
    return Step(status, events, delay, Cond(conditions.BOOTSTRAPPED, False, "Pending",
                                            f"attempt {attempts} of {limit} failed: {message}"))


def _done_message(status: Mapping[str, Any]) -> str:
    return (f"{status.get('rowsCopied')} rows copied from replica {status.get('sourceReplicaId')} as of "
            f"{int(status.get('snapshotTimestamp') or 0):#x}")


def _failed_message(status: Mapping[str, Any]) -> str:
    return f"bootstrap failed after {status.get('attempts')} attempts: {status.get('lastError')}"
