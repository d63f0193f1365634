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

Jobs are run by the world's launcher (``jobs/``: local processes for ``reptables up`` and the
tests, SparkApplications on Kubernetes). The jobs need the meta-cluster's token and two peer
credentials: the launcher receives them as values and hands them to the job as files — never on a
command line (``ps`` shows it), in a status, an event or a log line. The job's error line is what
the user sees on failure; known secrets are masked in it all the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.engine.replica_types import ReplicaMode, ReplicaState

from .. import metrics, models
from ..jobs.launcher import POLL_SECONDS, JobSpec, LaunchError, Owner, mask
from ..models import BootstrapPhase, ConditionType
from ..models.common import now_text, parse_time
from .conditions import Cond
from .world import ClusterNotFound, Event, Resource, World, describe_error

BOOTSTRAP_MODULE = "reptables.sparkapps.bootstrap"
VERIFY_MODULE = "reptables.sparkapps.verify"
#: the longest wait between two attempts
MAX_BACKOFF_SECONDS = 600.0
#: how long the copy job waits for its source to be in sync at T
SOURCE_WAIT_SECONDS = 120


# --- deciding and advancing a bootstrap --------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A bootstrap about to begin: the snapshot timestamp and the replica to copy from."""

    timestamp: int
    source_replica_id: str
    reason: str = "the table's history was trimmed"
    """Why the replica is bootstrapped (for the BootstrapPending event)."""


def history_trimmed(meta: Client, table_path: str) -> bool:
    """Whether the replication queue of the table lost rows to trimming (some tablet trimmed some)."""
    return any(int(t.get("trimmed_row_count") or 0) > 0 for t in meta.get(f"{table_path}/@tablets") or [])


def holds_rows(meta: Client, table_path: str) -> bool:
    """Whether anything was ever written to the table (some tablet of its queue has rows)."""
    return any(int(t.get("flushed_row_count") or 0) > 0 for t in meta.get(f"{table_path}/@tablets") or [])


def pick_source(meta: Client, table_path: str, world: World, cluster: str, replica_path: str) -> str | None:
    """An enabled replica of the table, on a known cluster, other than the new one: sync ones first."""
    known = world.engines.clusters()
    candidates = []
    for replica_id, info in (meta.get(f"{table_path}/@replicas") or {}).items():
        if (info.get("cluster_name"), info.get("replica_path")) == (cluster, replica_path):
            continue
        if info.get("state") == ReplicaState.ENABLED and info.get("cluster_name") in known:
            candidates.append((info.get("mode") != ReplicaMode.SYNC, int(info.get("replication_lag_time") or 0),
                               str(replica_id)))
    return min(candidates)[2] if candidates else None


def plan(res: Resource, table: Resource, meta: Client, world: World) -> Start | None:
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
    def phase(self) -> BootstrapPhase | None:
        return phase_of(self.status)


def phase_of(boot: Mapping[str, Any]) -> BootstrapPhase | None:
    """The phase a ``status.bootstrap`` is in; None when it names none this operator knows."""
    try:
        return BootstrapPhase(str(boot.get("phase")))
    except ValueError:
        return None


def pending_status(start: Start) -> dict[str, Any]:
    return {"phase": BootstrapPhase.PENDING, "snapshotTimestamp": start.timestamp,
            "sourceReplicaId": start.source_replica_id, "attempts": 0}


def created_step(boot: Mapping[str, Any]) -> Step:
    """The reconcile that created the replica stops there: the copy starts on the next one."""
    return Step(dict(boot), [], 0.5, Cond(ConditionType.BOOTSTRAPPED, False, BootstrapPhase.PENDING,
                                          f"the copy as of {int(boot['snapshotTimestamp']):#x} is about to start"))


def _now() -> datetime:
    return datetime.now(UTC)


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


def advance(res: Resource, table: Resource, meta: Client, world: World, replica_id: str,
            boot: Mapping[str, Any]) -> Step:
    """Move the bootstrap one step on: never waits for a job, only starts or looks at one."""
    step = _advance(res, table, meta, world, replica_id, boot)
    metrics.record_bootstrap(res.namespace, res.name, step.status.get("phase"), step.status.get("rowsCopied"))
    return step


def _advance(res: Resource, table: Resource, meta: Client, world: World, replica_id: str,
             boot: Mapping[str, Any]) -> Step:
    status = dict(boot)
    events: list[Event] = []
    phase = phase_of(status)

    def step(retry: float, cond: Cond) -> Step:
        return Step(status, events, retry, cond)

    def waiting(reason: str, message: str, retry: float) -> Step:
        return step(retry, Cond(ConditionType.BOOTSTRAPPED, False, reason, message))

    if phase is BootstrapPhase.DONE:
        return step(30.0, Cond(ConditionType.BOOTSTRAPPED, True, "Copied", _done_message(status)))
    if phase is BootstrapPhase.FAILED:
        if int(status.get("attempts") or 0) < res.spec.bootstrap.max_attempts:
            # the user raised spec.bootstrap.maxAttempts after the failure: try again, at once
            status.update(phase=BootstrapPhase.PENDING, nextAttemptTime=None)
            events.append(Event("Normal", "BootstrapRetrying",
                                f"spec.bootstrap.maxAttempts is now {res.spec.bootstrap.max_attempts}: attempt "
                                f"{int(status.get('attempts') or 0) + 1} starts"))
            return waiting(BootstrapPhase.PENDING, "retrying after spec.bootstrap.maxAttempts was raised", 0.5)
        return step(60.0, Cond(ConditionType.BOOTSTRAPPED, False, "BootstrapFailed", _failed_message(status)))
    launcher = world.launcher
    if launcher is None:
        return waiting("NoLauncher", "this operator runs no bootstrap jobs: enable the chart's bootstrap.spark "
                                     "(REPTABLES_SPARK_JOBS), or bootstrap by hand (docs/spark.md)", 60.0)
    try:
        if phase is BootstrapPhase.PENDING:
            retry_at = parse_time(status.get("nextAttemptTime"))
            if retry_at is not None and retry_at > _now():
                return waiting(phase, f"attempt {int(status.get('attempts') or 0) + 1} of "
                                          f"{res.spec.bootstrap.max_attempts} starts at {status['nextAttemptTime']}; "
                                          f"last error: {status.get('lastError')}",
                               max(1.0, (retry_at - _now()).total_seconds()))
            source = _source_info(meta, status)
            attempt = int(status.get("attempts") or 0) + 1
            ref = launcher.start(_copy_job(res, table, world, status, replica_id, str(source["cluster_name"]),
                                           attempt))
            status.update(phase=BootstrapPhase.COPYING, attempts=attempt, jobRef=ref)
            status["nextAttemptTime"] = None  # null: a merge patch removes it
            events.append(Event("Normal", "BootstrapCopying",
                                f"attempt {attempt}: copying replica {status['sourceReplicaId']} as of "
                                f"{int(status['snapshotTimestamp']):#x} ({ref})"))
            return waiting(BootstrapPhase.COPYING, f"copying as of {int(status['snapshotTimestamp']):#x}, "
                                                   f"attempt {attempt}", POLL_SECONDS)
        if phase is BootstrapPhase.COPYING or phase is BootstrapPhase.VERIFYING:
            job = launcher.poll(str(status.get("jobRef")))
            if job is None:
                raise _JobError(f"job {status.get('jobRef')} is lost (the operator restarted)")
            if job.running:
                if phase is BootstrapPhase.COPYING:
                    status["rowsCopied"] = copied_rows(world, res, status.get("rowsCopied"))
                return waiting(phase, f"{phase.lower()} as of {int(status['snapshotTimestamp']):#x}, "
                                           f"attempt {status.get('attempts')} ({status.get('jobRef')})"
                                           + (f", {status['rowsCopied']} rows so far"
                                              if phase is BootstrapPhase.COPYING
                                              and status.get("rowsCopied") is not None
                                              else ""), POLL_SECONDS)
            if job.exit_code != 0:
                what = "copy" if phase is BootstrapPhase.COPYING else "verify"
                raise _JobError(f"the {what} job failed: {job.error}")
            if phase is BootstrapPhase.COPYING:
                status["rowsCopied"] = (job.rows_copied if job.rows_copied is not None
                                        else copied_rows(world, res, status.get("rowsCopied")))
                if res.spec.bootstrap.verify:
                    source = _source_info(meta, status)
                    ref = launcher.start(_verify_job(res, table, world, status, source, replica_id,
                                                     int(status["attempts"])))
                    status.update(phase=BootstrapPhase.VERIFYING, jobRef=ref)
                    events.append(Event("Normal", "BootstrapVerifying",
                                        f"copied {job.rows_copied} rows; comparing with replica "
                                        f"{status['sourceReplicaId']} ({ref})"))
                    return waiting(BootstrapPhase.VERIFYING, f"verifying as of {int(status['snapshotTimestamp']):#x}",
                                   POLL_SECONDS)
            status["phase"] = BootstrapPhase.ENABLING
            events.append(Event("Normal", "BootstrapEnabling", f"{status.get('rowsCopied')} rows copied"
                                f"{' and verified' if res.spec.bootstrap.verify else ''}; enabling replica "
                                f"{replica_id}"))
            phase = BootstrapPhase.ENABLING
        if phase is BootstrapPhase.ENABLING:
            if res.spec.enabled:
                state = meta.get(f"#{replica_id}/@state")
                if state == ReplicaState.DISABLED:
                    meta.alter_table_replica(replica_id, enabled=True)
                    state = meta.get(f"#{replica_id}/@state")
                if state != ReplicaState.ENABLED:
                    return waiting(phase, f"replica {replica_id} is {state}", 1.0)
            status["phase"] = BootstrapPhase.DONE
            status["lastError"] = None
            events.append(Event("Normal", "BootstrapDone", _done_message(status)))
            return step(0.0, Cond(ConditionType.BOOTSTRAPPED, True, "Copied", _done_message(status)))
        raise _JobError(f"unknown bootstrap phase {status.get('phase')!r}")
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


def _source_info(meta: Client, status: Mapping[str, Any]) -> dict[str, Any]:
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
        status["phase"] = BootstrapPhase.FAILED
        status["nextAttemptTime"] = None  # null: a merge patch removes it
        events.append(Event("Warning", "BootstrapFailed", _failed_message(status)))
        return Step(status, events, 60.0, Cond(ConditionType.BOOTSTRAPPED, False, "BootstrapFailed",
                                               _failed_message(status)))
    delay = min(MAX_BACKOFF_SECONDS, res.spec.bootstrap.backoff_seconds * 2 ** max(0, attempts - 1))
    retry_at = _now() + timedelta(seconds=delay)
    status.update(phase=BootstrapPhase.PENDING, nextAttemptTime=now_text(retry_at))
    events.append(Event("Warning", "BootstrapRetrying",
                        f"attempt {attempts} of {limit} failed: {message}; retrying in {delay:g} s"))
    return Step(status, events, delay, Cond(ConditionType.BOOTSTRAPPED, False, BootstrapPhase.PENDING,
                                            f"attempt {attempts} of {limit} failed: {message}"))


def _done_message(status: Mapping[str, Any]) -> str:
    return (f"{status.get('rowsCopied')} rows copied from replica {status.get('sourceReplicaId')} as of "
            f"{int(status.get('snapshotTimestamp') or 0):#x}")


def _failed_message(status: Mapping[str, Any]) -> str:
    return f"bootstrap failed after {status.get('attempts')} attempts: {status.get('lastError')}"
