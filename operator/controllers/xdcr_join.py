"""A cluster joins an XdcrGroup that holds data: the operator runs the XDCR join job for it (seed 001).

A cluster added to a group whose members trimmed their change logs (``@change_retention``) cannot
get the group's rows from the logs, and no member ships it a partial log: each member's
``dr_status`` shows the newcomer with state ``waiting_for_snapshot`` and a ``last_error`` naming the
table (``engine/node/xdcr.py``). The cure is a join from a snapshot (``engine/node/xdcr_join.py``):
the newcomer loads a consistent cut of the table from one member (the donor, ``preferredSource``)
and the members then ship it their changes after the cut. The Spark job
``reptables.sparkapps.xdcr_join`` does it with nothing but the joining cluster's URL and token.

So after the group is applied (``xdcr.py``), this module looks at every member's
``dr_status``: a (cluster X, table P) pair needs a join when another member waits for X's snapshot
of P, or when X's own ``dr_status`` lists P under ``joining`` (a join begun and not finished, e.g.
before an operator restart: the job resumes the same cut). It runs the job with the launcher the
replica bootstraps use (``world.launcher``, ``jobs/``) — one join per group at a time
(seed 001: one cluster joins at a time), a join already begun on an engine first.

As with a bootstrap, a reconcile never waits for the job: each call starts a job or looks at the one
it started and returns, and ``status.joins`` is the only memory between calls (a job the launcher
no longer knows — the operator restarted — is a lost attempt; the next one resumes the engine's
cut). A failed attempt is shown as ``Failed`` with the job's error line (secrets masked) and tried
again after a backoff that doubles up to ten minutes: a join is never given up, because the
newcomer cannot replicate without it — until no member waits for it any more (the cluster left the
group, or was joined by hand), when its entry is dropped. The job gets the joining cluster's token as a file
(``JobSpec.secrets``), never on a command line, in a status, an event or a log line.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from reptables.engine.client import XdcrJoinProgress, XdcrStatus

from .. import models
from ..jobs.launcher import POLL_SECONDS, JobSpec, LaunchError, Owner, mask
from ..models import XdcrJoinPhase, XdcrPairState
from ..models.common import now_text, parse_time
from .world import ClusterNotFound, Event, Resource, World

JOIN_MODULE = "reptables.sparkapps.xdcr_join"
#: the first wait after a failed attempt; it doubles with each attempt, up to MAX_BACKOFF_SECONDS
FIRST_BACKOFF_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 600.0
#: after a join succeeded, the members' shippers need a pass to see it: a waiting_for_snapshot
#: this recent is their old news, not a reason to join again
SETTLE_SECONDS = 30.0
#: without a launcher, look again this often
NO_LAUNCHER_RETRY = 60.0
#: characters a YPath may continue with: a path named in a message ends before anything else
_PATH_CHARS = r"A-Za-z0-9_./@-"



@dataclass
class JoinStep:
    """What one reconcile did to the group's joins."""

    joins: list[dict[str, Any]]
    """The new ``status.joins``."""
    events: list[Event] = field(default_factory=list)
    retry_after: float | None = None
    """When to look again for the join's sake (None: the group's own refresh will do)."""
    active: dict[str, Any] | None = None
    """The join under way (Running, or Pending to start), for the Ready condition."""
    failed: list[dict[str, Any]] = field(default_factory=list)
    """Joins whose last attempt failed (waiting for the next one)."""
    expected: set[str] = field(default_factory=set)
    """Clusters whose peers wait for their snapshot as expected: joining, next in line, or just joined."""

    def joining(self, cluster: str) -> bool:
        """Whether the members' waiting_for_snapshot for ``cluster`` is the join's doing, not a fault."""
        return cluster in self.expected


def names_path(text: str, path: str) -> bool:
    """Whether ``text`` names the table ``path`` (not merely a longer path that starts with it)."""
    return re.search(rf"(?<![{_PATH_CHARS}]){re.escape(path)}(?![{_PATH_CHARS}])", text) is not None


def wanted_joins(spec: Any, statuses: Mapping[str, XdcrStatus]) -> list[tuple[str, str]]:
    """The (cluster, table) pairs that need a join, by the members' dr_status: joins begun on an
    engine first, then in the order of ``clusters`` and ``tables``."""
    members = list(spec.members)
    begun: list[tuple[str, str]] = []
    waited: list[tuple[str, str]] = []
    for cluster in members:
        own = statuses.get(cluster)
        if own is None:
            continue  # the joining cluster must answer: the job talks to it
        joining = own.get("joining") or {}
        for table in spec.tables:
            if table.path in joining:
                begun.append((cluster, table.path))
                continue
            for sender in members:
                sent = statuses.get(sender) if sender != cluster else None
                peer = (sent.get("peers") or {}).get(cluster) if sent is not None else None
                if peer and peer.get("state") == XdcrPairState.WAITING_FOR_SNAPSHOT and \
                        names_path(str(peer.get("last_error") or ""), table.path):
                    waited.append((cluster, table.path))
                    break
    return begun + waited


def _joining(statuses: Mapping[str, XdcrStatus], cluster: str) -> Mapping[str, XdcrJoinProgress]:
    """The tables ``cluster`` is joining from a snapshot, by its dr_status (none when it did not answer)."""
    own = statuses.get(cluster)
    return (own.get("joining") or {}) if own is not None else {}


def _now() -> datetime:
    return datetime.now(UTC)


def _clean(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A status entry without empty fields (the CRD's fields are not nullable)."""
    return {k: v for k, v in entry.items() if v is not None}


def _job_name(res: Resource, cluster: str, path: str, join_round: int, attempt: int) -> str:
    """One name per attempt, the same for two reconciles that saw the same status (a launcher starts
    a name once, and answers a name it started before with that job); the hash tells apart tables,
    rounds (a cluster joining again after a reset must not be answered with its last join's job),
    and a group deleted and created again."""
    digest = hashlib.sha256(f"{res.uid}\0{cluster}\0{path}\0{join_round}".encode()).hexdigest()[:8]
    return f"{res.name}-join-{cluster}-{attempt}-{digest}"


def _source(spec: Any, cluster: str) -> str | None:
    """The donor to ask for: ``preferredSource`` when it is another replicating member."""
    preferred = spec.preferred_source
    return preferred if preferred is not None and preferred != cluster and preferred in spec.members else None


def join_job(res: Resource, world: World, cluster: str, path: str, join_round: int, attempt: int) -> JobSpec:
    """The job of one attempt: the joining cluster's URL and the table; its token as a file."""
    ref = world.engines.ref(cluster)
    source = _source(res.spec, cluster)
    args = ("--proxy", ref.endpoint, "--path", path, *(("--source", source) if source else ()))
    return JobSpec(_job_name(res, cluster, path, join_round, attempt), JOIN_MODULE, args, {"token-file": ref.token},
                   Owner(models.API_VERSION, res.kind, res.name, res.uid, res.namespace))


def _known_secrets(world: World) -> list[str]:
    return [ref.token for ref in world.engines.clusters().values()]


def advance_joins(res: Resource, world: World, statuses: Mapping[str, XdcrStatus]) -> JoinStep:
    """Move the group's joins one step on: poll the running join, else start the next one wanted."""
    spec = res.spec
    members = set(spec.members)
    paths = {t.path for t in spec.tables}
    launcher = world.launcher
    kept: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in res.status.get("joins") or []:
        if not isinstance(entry, Mapping):
            continue
        key = (str(entry.get("cluster")), str(entry.get("path")))
        if key[0] in members and key[1] in paths:
            kept[key] = dict(entry)
        elif entry.get("phase") == XdcrJoinPhase.RUNNING and launcher is not None and entry.get("jobRef"):
            with contextlib.suppress(LaunchError):
                launcher.stop(str(entry["jobRef"]))  # the cluster or the table left the group
    step = JoinStep(joins=[])
    wanted = wanted_joins(spec, statuses)
    running = next((e for e in kept.values() if e.get("phase") == XdcrJoinPhase.RUNNING), None)
    if running is not None:
        _poll(running, world, statuses, step)
    else:
        _start_next(res, world, statuses, wanted, kept, step)
        for key, entry in list(kept.items()):
            waiting = entry.get("phase") in (XdcrJoinPhase.PENDING, XdcrJoinPhase.FAILED)
            if waiting and key not in wanted and key[0] in statuses:
                del kept[key]  # no member waits for it any more (joined by hand, say): nothing to retry
    step.joins = [_clean(kept[k]) for k in sorted(kept, key=lambda k: (spec.clusters.index(k[0]), k[1]))]
    step.failed = [e for e in step.joins if e.get("phase") == XdcrJoinPhase.FAILED]
    step.expected = {c for c, _ in wanted} - {str(e["cluster"]) for e in step.failed}
    return step


def _poll(entry: dict[str, Any], world: World, statuses: Mapping[str, XdcrStatus], step: JoinStep) -> None:
    cluster, path = str(entry["cluster"]), str(entry["path"])
    launcher = world.launcher
    job = launcher.poll(str(entry.get("jobRef"))) if launcher is not None else None
    if job is None:
        _failed(entry, world, step, f"job {entry.get('jobRef')} is lost (the operator restarted); the next "
                                    "attempt resumes the same snapshot")
        return
    progress = _joining(statuses, cluster).get(path)
    if isinstance(progress, Mapping) and progress.get("source"):
        entry["source"] = str(progress["source"])  # the donor the engine asked
    if job.running:
        entry["message"] = (f"attempt {entry.get('attempts')}: loading the snapshot of {path}"
                            + (f" from {entry['source']}" if entry.get("source") else ""))
        if isinstance(progress, Mapping) and progress.get("pages"):
            entry["message"] += f", {len(progress.get('loaded_pages') or [])} of {progress['pages']} pages loaded"
        step.active, step.retry_after = entry, POLL_SECONDS
        return
    if job.exit_code != 0:
        _failed(entry, world, step, f"the join job failed: {job.error}")
        return
    entry.update(phase=XdcrJoinPhase.SUCCEEDED, completionTime=now_text(), nextAttemptTime=None,
                 message=f"joined {path} from a snapshot" + (f" of {entry['source']}" if entry.get("source") else "")
                         + f" (attempt {entry.get('attempts')}); the members ship it their changes after it")
    step.events.append(Event("Normal", "Joined", f"{cluster} {entry['message']}"))
    step.retry_after = POLL_SECONDS  # the next join, if one waits


def _start_next(res: Resource, world: World, statuses: Mapping[str, XdcrStatus],
                wanted: list[tuple[str, str]], kept: dict[tuple[str, str], dict[str, Any]], step: JoinStep) -> None:
    now = _now()
    for cluster, path in wanted:
        entry = kept.get((cluster, path))
        begun = path in _joining(statuses, cluster)
        if entry is not None and entry.get("phase") == XdcrJoinPhase.SUCCEEDED and not begun:
            done = parse_time(entry.get("completionTime"))
            if done is None or (now - done).total_seconds() < SETTLE_SECONDS:
                continue  # the members have not looked since: their waiting_for_snapshot is stale
        if entry is not None and entry.get("phase") == XdcrJoinPhase.FAILED:
            retry_at = parse_time(entry.get("nextAttemptTime"))
            if retry_at is not None and retry_at > now:
                wait = max(1.0, (retry_at - now).total_seconds())
                step.retry_after = wait if step.retry_after is None else min(step.retry_after, wait)
                if begun:
                    return  # its cut is half loaded on the engine: no other cluster joins meanwhile
                continue
        if entry is None or entry.get("phase") == XdcrJoinPhase.SUCCEEDED:
            # (joined before, and reset since: the next round)
            join_round = 1 if entry is None else int(entry.get("round") or 1) + 1
            entry = {"cluster": cluster, "path": path, "attempts": 0, "round": join_round}
        kept[(cluster, path)] = entry
        entry["source"] = _source(res.spec, cluster)
        launcher = world.launcher
        if launcher is None:
            entry.update(phase=XdcrJoinPhase.PENDING, message=(
                f"{cluster} must join {path} from a snapshot, and this operator runs no Spark jobs: enable the "
                f"chart's bootstrap.spark (REPTABLES_SPARK_JOBS), or run `reptables dr join --path {path}` "
                f"against {cluster}"))
            step.active, step.retry_after = entry, NO_LAUNCHER_RETRY
            return
        attempt = int(entry.get("attempts") or 0) + 1
        entry.update(attempts=attempt, startTime=now_text(), completionTime=None, nextAttemptTime=None)
        try:
            ref = launcher.start(join_job(res, world, cluster, path, int(entry.get("round") or 1), attempt))
        except (LaunchError, ClusterNotFound) as exc:
            entry["jobRef"] = None
            _failed(entry, world, step, f"the join job could not start: {exc}")
            return
        entry.update(phase=XdcrJoinPhase.RUNNING, jobRef=ref, message=f"attempt {attempt}: the join job starts ({ref})")
        step.events.append(Event("Normal", "Joining", (
            f"{cluster} joins {path} from a snapshot" + (f" of {entry['source']}" if entry.get("source") else "")
            + f", attempt {attempt} ({ref})")))
        step.active, step.retry_after = entry, POLL_SECONDS
        return


def _failed(entry: dict[str, Any], world: World, step: JoinStep, message: str) -> None:
    """A failed attempt: Failed with the (masked) reason, a Warning event, the next attempt after a backoff."""
    attempts = int(entry.get("attempts") or 0)
    delay = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** max(0, attempts - 1))
    message = mask(message, _known_secrets(world))
    entry.update(phase=XdcrJoinPhase.FAILED, message=message,
                 nextAttemptTime=now_text(_now() + timedelta(seconds=delay)))
    step.events.append(Event("Warning", "JoinFailed", (
        f"{entry['cluster']} could not join {entry['path']} from a snapshot (attempt {attempts}): {message}; "
        f"retrying in {delay:g} s")))
    step.retry_after = delay
