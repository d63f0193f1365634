"""TableCluster reconciliation: probe the engine, keep every engine's ``//sys/clusters`` in sync.

Every engine must know every other engine (name -> proxy URL and token) to run sync writes and
replicators. The operator owns that directory: whenever the set of TableClusters, their
endpoints or their Secrets change, each engine's ``//sys/clusters`` is rewritten. Tokens are never
readable back (the engine masks them), so the operator remembers a fingerprint of what it wrote in
the status and rewrites when the fingerprint or the visible part (names and URLs) differs.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import httpx

from reptables.engine.errors import YtError

from . import conditions
from .conditions import Cond
from .world import ClusterNotFound, Engines, Event, Outcome, Resource, World, describe_error

PROBE_TIMEOUT = 2.0
REFRESH_SECONDS = 10.0


def directory_value(engines: Engines) -> dict[str, dict[str, str]]:
    return {name: {"proxy_url": ref.endpoint, "token": ref.token} for name, ref in sorted(engines.clusters().items())}


def directory_fingerprint(value: dict[str, dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str | None, int | None, str]:
    """(healthy, version, latency ms, reason) of one engine, from its /healthz."""
    started = time.perf_counter()
    try:
        response = httpx.get(f"{endpoint.rstrip('/')}/healthz", timeout=timeout)
    except httpx.HTTPError as exc:
        return False, None, None, f"{type(exc).__name__}: {exc}"
    latency = int((time.perf_counter() - started) * 1000)
    if response.status_code != 200:
        return False, None, latency, f"/healthz answered HTTP {response.status_code}"
    body: dict[str, Any] = response.json()
    return True, body.get("version"), latency, "healthy"


def reconcile_table_cluster(res: Resource, world: World) -> Outcome:
    try:
        ref = world.engines.ref(res.name)
    except ClusterNotFound as exc:
        return Outcome(retry_after=REFRESH_SECONDS, status={"conditions": conditions.merge(
            res.status.get("conditions"), [Cond(conditions.READY, False, "NotRegistered", str(exc))], res.generation)})
    healthy, version, latency, reason = probe(ref.endpoint)
    out = Outcome(retry_after=REFRESH_SECONDS)
    status: dict[str, Any] = {"healthy": healthy, "lastProbeTime": conditions.now_text(),
                              "observedGeneration": res.generation}
    if version is not None:
        status["version"] = version
    if latency is not None:
        status["latencyMs"] = latency
    conds: list[Cond] = []
    if not healthy:
        conds.append(Cond(conditions.READY, False, "Unreachable", f"engine at {ref.endpoint}: {reason}"))
        if res.status.get("healthy") is not False:
            out.events.append(Event("Warning", "Unreachable", f"engine at {ref.endpoint}: {reason}"))
    else:
        desired = directory_value(world.engines)
        fingerprint = directory_fingerprint(desired)
        try:
            client = world.engines.client(res.name)
            current = client.get("//sys/clusters") or {}
            visible = {n: e.get("proxy_url") for n, e in current.items()}
            if visible != {n: e["proxy_url"] for n, e in desired.items()} or \
                    res.status.get("directoryFingerprint") != fingerprint:
                client.set("//sys/clusters", desired)
                out.events.append(Event("Normal", "DirectoryUpdated",
                                        f"//sys/clusters now lists {', '.join(desired)}"))
            status["directoryFingerprint"] = fingerprint
            conds.append(Cond(conditions.READY, True, "Healthy",
                              f"engine {version} answers in {latency} ms; directory lists {len(desired)} clusters"))
        except (YtError, httpx.HTTPError) as exc:
            conds.append(Cond(conditions.READY, False, "DirectorySyncFailed", describe_error(exc)))
            out.retry_after = 5.0
    status["conditions"] = conditions.merge(res.status.get("conditions"), conds, res.generation)
    out.status = status
    return out


def cluster_references(res: Resource, world: World) -> list[str]:
    """Resources that still use this TableCluster (deleting it is refused while any remain)."""
    users = []
    for kind in ("ReplicatedTable", "TableReplica"):
        for other in world.of_kind(kind):
            if other.spec.cluster == res.name and not other.deleting:
                users.append(other.display)
    return users


def finalize_table_cluster(res: Resource, world: World) -> Outcome:
    users = cluster_references(res, world)
    if users:
        message = f"still referenced by {', '.join(users)}"
        return Outcome(finished=False, retry_after=5.0, status={"conditions": conditions.merge(
            res.status.get("conditions"), [Cond(conditions.READY, False, "InUse", message)], res.generation)},
            events=[Event("Warning", "DeletionBlocked", message)])
    world.engines.forget(res.name)
    return Outcome()
