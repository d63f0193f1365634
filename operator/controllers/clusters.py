"""TableCluster reconciliation: probe the engine, keep its ``//sys/clusters`` to what it needs, and
say who leads an HA table cluster (``leadership.py``).

Each engine's directory lists only the clusters its tables and replicas link it to
(``directory.py`` says which, and how changes are detected without reading tokens back). The
status says which clusters the directory lists — names only: no token, and nothing derived from
one (the status used to carry a hash of every token).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from reptables.engine.client import Client
from reptables.engine.errors import YtError

from ..models import ConditionType
from ..models.common import now_text
from . import conditions
from .conditions import Cond
from .directory import sync_directory
from .leadership import leadership_text, observe
from .world import ClusterNotFound, Event, Outcome, Resource, World, describe_error, probe_tls

PROBE_TIMEOUT = 2.0
REFRESH_SECONDS = 10.0
#: a TableCluster whose credentials cannot be used is looked at again this often
CREDENTIALS_RETRY = 10.0


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str | None, int | None, str]:
    """(healthy, version, latency ms, reason) of one engine, from its /healthz."""
    started = time.perf_counter()
    try:
        response = httpx.get(f"{endpoint.rstrip('/')}/healthz", timeout=timeout, verify=probe_tls())
    except httpx.HTTPError as exc:
        return False, None, None, f"{type(exc).__name__}: {exc}"
    latency = int((time.perf_counter() - started) * 1000)
    if response.status_code != 200:
        return False, None, latency, f"/healthz answered HTTP {response.status_code}"
    body: dict[str, Any] = response.json()
    return True, body.get("version"), latency, "healthy"


def credentials_refused(res: Resource, reason: str, message: str) -> Outcome:
    """The status of a TableCluster whose credentials cannot be used (``Runtime.admit`` says so before
    any reconcile): Ready=False with the reason, a Warning event only when the reason is new. It is
    not reconciled: nothing is sent to its endpoint, and no engine's directory lists it."""
    conds = res.status.get("conditions")
    out = Outcome(retry_after=CREDENTIALS_RETRY, status={"conditions": conditions.merge(
        conds, [Cond(ConditionType.READY, False, reason, message)], res.generation)})
    if conditions.reason_of(conds, ConditionType.READY) != reason:
        out.events.append(Event("Warning", reason, message))
    return out


def reconcile_table_cluster(res: Resource, world: World) -> Outcome:
    try:
        ref = world.engines.ref(res.name)
    except ClusterNotFound as exc:
        return Outcome(retry_after=REFRESH_SECONDS, status={"conditions": conditions.merge(
            res.status.get("conditions"), [Cond(ConditionType.READY, False, "NotRegistered", str(exc))],
            res.generation)})
    healthy, version, latency, reason = probe(ref.endpoint)
    out = Outcome(retry_after=REFRESH_SECONDS)
    status: dict[str, Any] = {"healthy": healthy, "lastProbeTime": now_text(),
                              "observedGeneration": res.generation}
    if version is not None:
        status["version"] = version
    if latency is not None:
        status["latencyMs"] = latency
    leadership: dict[str, Any] | None = None
    if res.spec.members:
        # an HA table cluster: who leads, who stands by, where the database's primary is (leadership.py)
        leadership, changes = observe(res, world, ref.token)
        status["leadership"] = leadership
        out.events.extend(changes)
    elif res.status.get("leadership") is not None:
        status["leadership"] = None  # members removed from the spec: a merge patch with null removes it
    conds: list[Cond] = []
    if not healthy:
        conds.append(Cond(ConditionType.READY, False, "Unreachable", f"engine at {ref.endpoint}: {reason}"))
        if res.status.get("healthy") is not False:
            out.events.append(Event("Warning", "Unreachable", f"engine at {ref.endpoint}: {reason}"))
    else:
        try:
            desired, written = sync_directory(res.name, world)
            listed = ", ".join(desired) or "no cluster"
            if written:
                out.events.append(Event("Normal", "DirectoryUpdated", f"//sys/clusters now lists {listed}"))
            event = sync_read_only(world.engines.client(res.name), bool(res.spec.read_only),
                                   "read_only" in res.spec.model_fields_set)
            if event is not None:
                out.events.append(event)
            led = f"; {leadership_text(leadership)}" if leadership is not None else ""
            conds.append(Cond(ConditionType.READY, True, "Healthy",
                              f"engine {version} answers in {latency} ms; directory lists {listed}{led}"))
        except (YtError, httpx.HTTPError, ClusterNotFound) as exc:
            conds.append(Cond(ConditionType.READY, False, "DirectorySyncFailed", describe_error(exc)))
            out.retry_after = 5.0
    if res.status.get("directoryFingerprint") is not None:
        status["directoryFingerprint"] = None  # written by older operators: a merge patch with null removes it
    status["conditions"] = conditions.merge(res.status.get("conditions"), conds, res.generation)
    out.status = status
    return out


def sync_read_only(client: Client, read_only: bool, explicit: bool = True) -> Event | None:
    """``spec.readOnly`` onto the engine's ``//sys/@read_only``: a read-only engine refuses client row
    writes (code 605) while replication into its replica tables goes on. Returns the event of a change
    (``explicit``: the spec names the field; otherwise its default applies)."""
    try:
        current = client.get("//sys/@read_only") is True
    except YtError:
        current = False  # never set
    if current == read_only:
        return None
    client.set("//sys/@read_only", read_only)
    how = "is true" if read_only else "is false" if explicit else "not set (the default: false)"
    return Event("Normal", "ReadOnly" if read_only else "Writable",
                 f"spec.readOnly {how}: client writes are "
                 f"{'now refused' if read_only else 'accepted again'}")


def cluster_references(res: Resource, world: World) -> list[str]:
    """Resources that still use this TableCluster (deleting it is refused while any remain)."""
    users = []
    for kind in ("ReplicatedTable", "TableReplica"):
        for other in world.of_kind(kind):
            if other.spec.cluster == res.name and not other.deleting:
                users.append(other.display)
    for group in world.of_kind("XdcrGroup"):
        if res.name in group.spec.clusters and not group.deleting:
            users.append(group.display)
    return users


def finalize_table_cluster(res: Resource, world: World) -> Outcome:
    users = cluster_references(res, world)
    if users:
        message = f"still referenced by {', '.join(users)}"
        return Outcome(finished=False, retry_after=5.0, status={"conditions": conditions.merge(
            res.status.get("conditions"), [Cond(ConditionType.READY, False, "InUse", message)], res.generation)},
            events=[Event("Warning", "DeletionBlocked", message)])
    world.engines.forget(res.name)
    return Outcome()
