"""The operator's runtime pieces: engine clients, the resource registry, the tracker loop.

They hold connections, a thread pool and caches, so they are built when an operator starts and
closed when it stops — never at import. The kopf front end builds one :class:`Runtime` in its
startup handler (from the :class:`~.settings.OperatorSettings`) and the local runner builds one
for ``reptables up``; both then drive the same reconcile core with it.

Mode switches made by the tracker are queued in :attr:`Runtime.switches` rather than published
directly: the tracker runs in a worker thread with no Kubernetes context, and the front end decides
how to announce them (kopf posts Events, the local runner prints them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .controllers.clusters import credentials_refused
from .controllers.world import DatabaseClusters, Engines, Outcome, Resource, World
from .jobs.launcher import Launcher
from .registry import CredentialPolicy, Registry
from .tracker.loop import CHECK_PERIOD, TrackerLoop

#: switches not yet announced are dropped beyond this many (nobody may be draining the queue)
MAX_PENDING_SWITCHES = 1000


@dataclass(frozen=True)
class ModeSwitch:
    """A replica mode the tracker changed, waiting to be announced."""

    table: Resource
    replica_id: str
    mode: str
    reason: str

    @property
    def message(self) -> str:
        return f"replica {self.replica_id} is now {self.mode}: {self.reason}"


@dataclass
class Runtime:
    """What a running operator holds; build it with :meth:`start`, release it with :meth:`close`."""

    engines: Engines
    registry: Registry
    tracker: TrackerLoop
    switches: deque[ModeSwitch] = field(default_factory=lambda: deque(maxlen=MAX_PENDING_SWITCHES))

    @classmethod
    def start(cls, namespace: str, tracker_period: float = CHECK_PERIOD,
              policy: CredentialPolicy | None = None, launcher: Launcher | None = None,
              database_clusters: DatabaseClusters | None = None) -> Runtime:
        """A runtime whose Secrets default to ``namespace`` and whose tracker checks every ``tracker_period`` s.

        ``policy`` says which Secrets TableClusters may use (default: labelled ones in ``namespace``);
        ``launcher`` runs the bootstrap jobs of new replicas (default: none, they wait);
        ``database_clusters`` reads CloudNativePG Clusters for ``status.leadership`` (default: none).
        """
        engines = Engines()
        registry = Registry(engines, namespace, policy)
        registry.launcher = launcher
        registry.database_clusters = database_clusters
        switches: deque[ModeSwitch] = deque(maxlen=MAX_PENDING_SWITCHES)

        def queue_switch(table: Resource, replica_id: str, mode: str, reason: str) -> None:
            switches.append(ModeSwitch(table, replica_id, mode, reason))

        tracker = TrackerLoop(registry.world(), period=tracker_period, on_switch=queue_switch)
        tracker.start_watch()  # quick probes between checks, only while this operator runs the checks
        return cls(engines=engines, registry=registry, tracker=tracker, switches=switches)

    def world(self) -> World:
        return self.registry.world()

    def admit(self, res: Resource) -> Outcome | None:
        """What both front ends ask before they reconcile ``res``; None: go on.

        A TableCluster's credentials are read again first (its Secret may have changed, or gone, without
        the TableCluster changing). One whose credentials cannot be used is not reconciled — the engines
        are told nothing about it — and the Outcome returned is its status (``credentials_refused``)."""
        if res.kind != "TableCluster":
            return None
        problem = self.registry.refresh_cluster(res.name)
        return None if problem is None else credentials_refused(res, problem.reason, problem.message)

    def pending_switches(self) -> list[ModeSwitch]:
        """The queued switches, oldest first, removed from the queue (safe from any thread)."""
        out = []
        while True:
            try:
                out.append(self.switches.popleft())
            except IndexError:
                return out

    def close(self) -> None:
        self.tracker.close()
        if self.registry.launcher is not None:
            self.registry.launcher.close()
        closing = getattr(self.registry.database_clusters, "close", None)
        if closing is not None:
            closing()
        self.engines.close()
