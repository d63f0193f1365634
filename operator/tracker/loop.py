"""The tracker loop around the pure decision of ``decision.py``: probe, read, decide, act, report.

One check: probe every TableCluster's engine with a short timeout (a read-only cluster counts as
unhealthy), read ``@replicas`` of every tracked ReplicatedTable from its meta-cluster (and whether
each replica table exists and is mounted), let ``TrackerState``/``decide`` pick the sync replicas,
send ``alter_table_replica`` for the replicas whose mode changes, and record per table what the
check saw and the switches it made in the world's :class:`~..controllers.world.TrackerJournal`,
which the table's status shows (``status.tracker``), replicas named by their TableReplicas. Only
the active operator runs checks (see ``handlers.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from reptables.engine.client import TransportError
from reptables.engine.errors import YtError
from reptables.engine.replica_types import ReplicaMode, ReplicaState
from reptables.engine.tablets import TabletState

from ..controllers.world import Engines, Resource, TrackerJournal, TrackerSwitch, World, describe_error, probe_tls
from ..metrics import MODE_SWITCHES, TRACKER_CHECKS
from ..models import Atomicity
from . import decision as tk

log = logging.getLogger("reptables.operator.tracker")

#: default check period (YTsaurus checks every 3 s; its tests use 100 ms)
CHECK_PERIOD = 1.0
PROBE_TIMEOUT = 0.5
#: between checks, the clusters are probed this often (``/healthz`` only): a cluster that refuses
#: connections triggers a check at once instead of at the next period
PROBE_PERIOD = 0.2
#: seconds a check waits for a replica cluster to say whether a replica table is mounted: a cluster
#: that answers its probe but not this (cut off just after the probe, overloaded) counts as a bad
#: probe for this check, and one slow cluster never holds up the check of every table (with the
#: operator's 5 s request timeout, three tables on a cut cluster kept a check waiting for 15 s)
TABLE_READ_TIMEOUT = 1.5



@dataclass(frozen=True)
class TableVerdict:
    """What the tracker last decided for one ReplicatedTable (published in its status)."""

    decision: str
    reason: str
    time: float
    sync_replica_ids: tuple[str, ...]


class TrackerLoop:
    def __init__(self, world: World, period: float = CHECK_PERIOD, probe_timeout: float = PROBE_TIMEOUT,
                 on_switch: Callable[[Resource, str, str, str], None] | None = None,
                 probe_period: float = PROBE_PERIOD) -> None:
        self.world = world
        self.period = period
        self.probe_timeout = probe_timeout
        self.probe_period = probe_period
        self.state = tk.TrackerState()
        self.verdicts: dict[tuple[str | None, str], TableVerdict] = {}
        self._on_switch = on_switch
        #: where each check's summary and switches go (the world's, so that statuses show them)
        self.journal = world.tracker_journal if world.tracker_journal is not None else TrackerJournal()
        #: guards the checks and what follows: _last_check, _last_probe, _healthy, _active_until
        self._lock = threading.Lock()
        self._last_check = 0.0
        self._last_probe = 0.0
        #: the clusters healthy at the last probe (a check's or a quick one's)
        self._healthy: set[str] = set()
        #: the watch probes only while this operator runs checks (its timers call maybe_check): a
        #: standby operator, whose timers kopf pauses, must not act
        self._active_until = 0.0
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tracker-probe")
        #: clients with a short timeout for the reads of replica tables (``_replica_tables``)
        self._readers = Engines(timeout=TABLE_READ_TIMEOUT)

    def maybe_check(self) -> bool:
        """Run a check if a period has passed since the last one (callable from many places); between
        checks, probe the clusters every ``probe_period`` and check at once when one that was healthy
        now refuses connections (``quick_probe``). True if a check ran."""
        with self._lock:
            now = time.monotonic()
            self._active_until = now + 2 * self.period + 1.0
            if now - self._last_check >= self.period:
                self._last_check = now
                self.check(now)
                return True
        return self.quick_probe()

    @property
    def healthy_clusters(self) -> frozenset[str]:
        """The clusters healthy at the last probe (a check's or a quick one's)."""
        with self._lock:
            return frozenset(self._healthy)

    def quick_probe(self) -> bool:
        """Probe the clusters (``/healthz`` only) if ``probe_period`` has passed; a cluster healthy at
        the last probe that now refuses connections starts a check at once (a killed engine is
        certain: no need to wait for the period, nor to tolerate one bad probe). True if it checked."""
        with self._lock:
            now = time.monotonic()
            if now - self._last_probe < self.probe_period or now - self._last_check < self.probe_period:
                return False
            self._last_probe = now
            clusters = self._probe_clusters()
            lost = [name for name, health in clusters.items() if health.definitive and name in self._healthy]
            self._healthy = {name for name, health in clusters.items() if health.healthy}
            if not lost:
                return False
            log.info("tracker checks now: a cluster refuses connections", extra={"clusters": lost})
            self._last_check = now
            self.check(now, clusters)
            return True

    def start_watch(self) -> None:
        """Probe between checks from a thread of its own (``quick_probe`` every ``probe_period``), while
        this operator is the active one; ``close`` stops it."""
        if self._watch is not None:
            return

        def watch() -> None:
            while not self._stop.wait(self.probe_period):
                if time.monotonic() < self._active_until:
                    try:
                        self.quick_probe()
                    except Exception:  # noqa: BLE001 - the watch must go on; the next check retries
                        log.exception("tracker quick probe failed")

        self._watch = threading.Thread(target=watch, name="tracker-watch", daemon=True)
        self._watch.start()

    def check(self, now: float, clusters: dict[str, tk.ClusterHealth] | None = None) -> None:
        TRACKER_CHECKS.inc()
        if clusters is None:
            clusters = self._probe_clusters()
            self._last_probe = now
            self._healthy = {name for name, health in clusters.items() if health.healthy}
        tables, owners, clusters = self._tracked_tables(clusters)
        if not tables:
            return
        decision = tk.decide(*self.state.observe(tables, clusters, now))
        by_id = {t.table_id: owners[t.table_id] for t in tables}
        names = self._replica_names()
        applied: dict[str, list[tuple[tk.ModeChange, float]]] = {}
        # promotions first: demoting the dead sync replica before its successor is promoted would
        # leave a moment with no sync replica at all (writes would get "no synchronous replicas")
        ordered = sorted(decision.changes, key=lambda c: c.new_mode is not ReplicaMode.SYNC)
        for change in ordered:
            owner = by_id[change.table_id]
            try:
                self.world.engines.client(owner.spec.cluster).alter_table_replica(change.replica_id,
                                                                                  mode=change.new_mode)
            except YtError as exc:
                log.warning("tracker could not switch replica", extra={
                    "table": owner.display, "replica_id": change.replica_id, "error": describe_error(exc)})
                continue
            applied.setdefault(change.table_id, []).append((change, time.time()))
            MODE_SWITCHES.labels(owner.namespace or "", owner.name, change.new_mode.value).inc()
            log.info("tracker switched replica", extra={"table": owner.display, "replica_id": change.replica_id,
                                                        "cluster": change.cluster, "mode": change.new_mode.value,
                                                        "reason": change.reason})
            if self._on_switch is not None:
                self._on_switch(owner, change.replica_id, change.new_mode.value, change.reason)
        wall = time.time()
        for table_id, owner in by_id.items():
            changes = [c for c in decision.changes if c.table_id == table_id]
            text = ", ".join(f"{c.replica_id} -> {c.new_mode.value}" for c in changes) or "no change"
            self.verdicts[(owner.namespace, owner.name)] = TableVerdict(
                text, decision.reasons.get(table_id, ""), wall, decision.sync_replicas.get(table_id, ()))
            self._record(owner, decision.reasons.get(table_id, ""), applied.get(table_id, []), names)

    def _record(self, owner: Resource, summary: str, done: list[tuple[tk.ModeChange, float]],
                names: dict[tuple[str | None, str], str]) -> None:
        """The check's summary and the switches applied, replicas named by their TableReplicas."""
        key = (owner.namespace, owner.name)
        mine = {replica_id: name for (ns, replica_id), name in names.items() if ns == owner.namespace}
        self.journal.checked(key, _named(summary, mine))
        switches = [TrackerSwitch(at, mine.get(c.replica_id, c.replica_id), c.replica_id, c.cluster,
                                  (ReplicaMode.ASYNC if c.new_mode is ReplicaMode.SYNC else ReplicaMode.SYNC).value,
                                  c.new_mode.value, _named(c.reason, mine)) for c, at in done]
        self.journal.switched(key, switches, "; ".join(f"{s.replica}: {s.reason}" for s in switches))

    def _replica_names(self) -> dict[tuple[str | None, str], str]:
        """(namespace, replica id) -> the name of the TableReplica that manages it."""
        return {(r.namespace, str(r.status["replicaId"])): r.name for r in self.world.of_kind("TableReplica")
                if r.status.get("replicaId")}

    def _probe_clusters(self) -> dict[str, tk.ClusterHealth]:
        refs = self.world.engines.clusters()
        read_only = {r.name for r in self.world.of_kind("TableCluster") if getattr(r.spec, "read_only", False)}

        def probe(name: str) -> tk.ClusterHealth:
            if name in read_only:
                return tk.ClusterHealth(False, "cluster is read-only")
            try:
                response = httpx.get(f"{refs[name].endpoint.rstrip('/')}/healthz", timeout=self.probe_timeout,
                                     verify=probe_tls())
            except httpx.ConnectError as exc:
                # refused: no process at the address (a timeout or a reset may be a slow engine)
                refused = "refused" in str(exc).lower() or isinstance(exc.__cause__, ConnectionRefusedError)
                return tk.ClusterHealth(False, f"probe failed: {type(exc).__name__}"
                                        + (" (connection refused)" if refused else ""), definitive=refused)
            except httpx.HTTPError as exc:
                return tk.ClusterHealth(False, f"probe failed: {type(exc).__name__}")
            if response.status_code != 200:
                return tk.ClusterHealth(False, f"probe answered HTTP {response.status_code}")
            return tk.ClusterHealth(True)

        names = list(refs)
        return dict(zip(names, self._pool.map(probe, names), strict=True))

    def _tracked_tables(self, clusters: dict[str, tk.ClusterHealth]) -> tuple[
            list[tk.TrackedTable], dict[str, Resource], dict[str, tk.ClusterHealth]]:
        """The tracked tables with their replicas, their owners by table id, and ``clusters`` with
        the clusters that did not answer a replica table read marked unhealthy."""
        collocations: dict[tuple[str | None, str], tuple[str, tuple[str, ...] | None]] = {}
        for col in self.world.of_kind("TableCollocation"):
            collocation_id = col.status.get("collocationId")
            if not collocation_id:
                continue
            preferred = tuple(col.spec.preferred_sync_replica_clusters) \
                if col.spec.preferred_sync_replica_clusters else None
            for name in col.spec.tables:
                collocations[(col.namespace, name)] = (collocation_id, preferred)
        tracked: list[Resource] = []
        for res in self.world.of_kind("ReplicatedTable"):
            opts = res.spec.replicated_table_options
            table_id = res.status.get("tableId")
            if not opts.enable_replicated_table_tracker or not table_id or res.deleting:
                continue
            if not clusters.get(res.spec.cluster, tk.ClusterHealth(False)).healthy:
                continue  # the meta-cluster itself is down: nothing can be switched
            tracked.append(res)

        def replicas_of(res: Resource) -> dict[str, Any] | None:
            try:
                info: dict[str, Any] = self.world.engines.client(res.spec.cluster).get(f"{res.spec.path}/@replicas")
            except YtError as exc:
                log.warning("tracker cannot read replicas", extra={"table": res.display, "error": describe_error(exc)})
                return None
            return info

        # every table's @replicas at once: a meta-cluster cut off after its probe costs one timeout, not one per table
        read: list[tuple[Resource, dict[str, Any], tuple[str, ...] | None, str | None]] = []
        for res, info in zip(tracked, self._pool.map(replicas_of, tracked), strict=True):
            if info is None:
                continue
            collocation = collocations.get((res.namespace, res.name))
            read.append((res, info, collocation[1] if collocation else None,
                         collocation[0] if collocation else None))
        # every replica table on a healthy cluster, read at once
        places = {(r["cluster_name"], r["replica_path"]) for _, info, _, _ in read for r in info.values()
                  if clusters.get(r["cluster_name"], tk.ClusterHealth(False)).healthy}
        mounted = self._replica_tables(places)
        clusters = dict(clusters)
        for (cluster, _), state in mounted.items():
            if isinstance(state, str) and clusters[cluster].healthy:
                clusters[cluster] = tk.ClusterHealth(False, state)
        tables: list[tk.TrackedTable] = []
        owners: dict[str, Resource] = {}
        for res, info, preferred, collocation_id in read:
            opts = res.spec.replicated_table_options
            table_id = str(res.status["tableId"])
            # (a replica on a cluster that is unhealthy or did not answer is judged by the cluster's health)
            replicas = [_tracked_replica(replica_id, r,
                                         mounted.get((r["cluster_name"], r["replica_path"])) is not False)
                        for replica_id, r in info.items()]
            tables.append(tk.TrackedTable(
                table_id=table_id,
                options=tk.TableOptions(
                    tracker_enabled=True, min_sync_replica_count=opts.min_sync_replica_count,
                    max_sync_replica_count=opts.max_sync_replica_count,
                    preferred_sync_replica_clusters=tuple(opts.preferred_sync_replica_clusters or ()),
                    sync_replica_lag_threshold=opts.sync_replica_lag_threshold.total_seconds()),
                replicas=tuple(replicas),
                collocation_id=collocation_id,
                collocation_preferred_clusters=preferred))
            owners[table_id] = res
        return tables, owners, clusters

    def _replica_tables(self, places: set[tuple[str, str]]) -> dict[tuple[str, str], bool | str]:
        """Whether each (cluster, path) is a mounted (or frozen) table, all read in parallel with a
        short timeout; a cluster that did not answer gets the reason instead (a str)."""
        self._readers.update(self.world.engines.clusters().values())

        def mounted(place: tuple[str, str]) -> bool | str:
            cluster, path = place
            try:
                return self._readers.client(cluster).get(f"{path}/@tablet_state") in (
                    TabletState.MOUNTED, TabletState.FROZEN)
            except TransportError as exc:
                return f"replica table read failed: {type(exc.cause).__name__}"
            except Exception:  # noqa: BLE001 - any other failure to see the table makes the replica bad
                return False

        ordered = sorted(places)
        return dict(zip(ordered, self._pool.map(mounted, ordered), strict=True))

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._readers.close()


def _tracked_replica(replica_id: str, r: dict[str, Any], table_exists: bool) -> tk.TrackedReplica:
    """A replica as the decision sees it, from its ``@replicas`` entry."""
    return tk.TrackedReplica(
        replica_id=str(replica_id), cluster=r["cluster_name"], mode=ReplicaMode(r["mode"]),
        enabled=r["state"] == ReplicaState.ENABLED, enabling=r["state"] == ReplicaState.ENABLING,
        tracker_enabled=bool(r["replicated_table_tracker_enabled"])
        # a non-atomic replica can only be asynchronous: the tracker leaves it alone
        and r.get("atomicity", Atomicity.FULL) == Atomicity.FULL,
        lag=None if r.get("errors") else float(r.get("replication_lag_time", 0)) / 1000.0,
        table_exists=table_exists)


def _named(text: str, names: dict[str, str]) -> str:
    """``text`` (a decision's summary or reason), each replica id in it replaced by its TableReplica's name."""
    for replica_id, name in names.items():
        text = text.replace(replica_id, name)
    return text
