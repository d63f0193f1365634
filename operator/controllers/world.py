"""What a reconciler sees and what it returns — independent of the operator framework and of Kubernetes.

The reconcile core is plain Python: desired state (the resources, as parsed models) plus observed
state (the engines, reached through :class:`Engines`) gives actions and a status. The handlers and
the local runner (``reptables up``) both build a :class:`World` and call the same functions, so the
product behaves identically with and without a Kubernetes API.

A :class:`Resource` is one custom resource: identity (kind, namespace, name, uid, generation,
creation time), its parsed spec and its current status. Two resources claiming the same engine
object are resolved by :func:`oldest_claimant` ("the oldest wins", as CloudNativePG does).
"""

from __future__ import annotations

import functools
import ssl
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import httpx

from reptables.engine.client import Client
from reptables.engine.errors import YtError

from ..jobs.launcher import Launcher
from ..models import MAX_TRACKER_SWITCHES
from ..models.common import now_text

#: how long an operator call to an engine may take before the cluster counts as unreachable
ENGINE_TIMEOUT = 5.0


@dataclass(frozen=True)
class Resource:
    kind: str
    namespace: str | None
    name: str
    uid: str
    generation: int
    created: str
    spec: Any
    status: dict[str, Any]
    deleting: bool = False

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.kind, self.namespace, self.name)

    @property
    def display(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    """The result of reconciling one resource."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    #: seconds until the resource should be looked at again (None: only on change)
    retry_after: float | None = None
    #: the spec cannot work as written; retrying will not help until it changes
    invalid: str | None = None
    #: for deletion: True when the engine side is done and the finalizer may go
    finished: bool = True


@dataclass(frozen=True)
class ClusterRef:
    """A TableCluster as the operator uses it: where the engine is, and its token."""

    name: str
    endpoint: str
    token: str
    cluster_id: int
    read_only: bool = False


class ClusterNotFound(Exception):
    def __init__(self, name: str, why: str = "no such TableCluster") -> None:
        super().__init__(f"TableCluster {name}: {why}")
        self.name = name


Directory = dict[str, dict[str, str]]
"""A ``//sys/clusters`` value: cluster name -> ``{proxy_url, token}``."""


class Engines:
    """Clients for the engines of the known TableClusters (cached, rebuilt when one changes).

    It also remembers the ``//sys/clusters`` value last written to each engine. Tokens cannot be
    read back from an engine, so this memory is how the operator notices that a token changed —
    kept here, in the operator's memory, rather than as a fingerprint in a status anyone may read.
    An operator that restarts has no memory and rewrites each directory once.
    """

    def __init__(self, timeout: float = ENGINE_TIMEOUT) -> None:
        self.timeout = timeout
        #: guards the maps and the set below; a leaf (closing a client only closes its sockets)
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterRef] = {}  # guarded by _lock
        self._clients: dict[str, tuple[ClusterRef, Client]] = {}  # guarded by _lock
        self._written: dict[str, Directory] = {}  # guarded by _lock
        #: uids of the XdcrGroups whose engines this operator found running with their ids
        #: (``xdcr_members.applicable``); guarded by _lock
        self._checked_groups: set[str] = set()

    def update(self, clusters: Iterable[ClusterRef]) -> None:
        with self._lock:
            previous, self._clusters = self._clusters, {c.name: c for c in clusters}
            for name, (ref, client) in list(self._clients.items()):
                if self._clusters.get(name) != ref:
                    client.close()
                    del self._clients[name]
            for name in list(self._written):
                old, new = previous.get(name), self._clusters.get(name)
                if new is None or old is None or old.endpoint != new.endpoint:
                    del self._written[name]

    def set(self, cluster: ClusterRef) -> None:
        with self._lock:
            previous = self._clusters.get(cluster.name)
            self._clusters[cluster.name] = cluster
            if previous is not None and previous.endpoint != cluster.endpoint:
                self._written.pop(cluster.name, None)  # another engine, maybe: write its directory anew
            cached = self._clients.get(cluster.name)
            if cached is not None and cached[0] != cluster:
                cached[1].close()
                del self._clients[cluster.name]

    def forget(self, name: str) -> None:
        with self._lock:
            self._clusters.pop(name, None)
            self._written.pop(name, None)
            cached = self._clients.pop(name, None)
        if cached is not None:
            cached[1].close()

    def note_group_checked(self, uid: str, ok: bool) -> None:
        """Whether the engines of XdcrGroup ``uid`` were just found running with their ids (True) or
        not (False): a group whose engines were never checked lists no peers in any directory."""
        with self._lock:
            if ok:
                self._checked_groups.add(uid)
            else:
                self._checked_groups.discard(uid)

    def group_checked(self, uid: str) -> bool:
        with self._lock:
            return uid in self._checked_groups

    def written_directory(self, name: str) -> Directory | None:
        """The directory last written to ``name``'s engine by this operator, if any."""
        with self._lock:
            return self._written.get(name)

    def remember_directory(self, name: str, value: Directory) -> None:
        with self._lock:
            if name in self._clusters:
                self._written[name] = value

    def clusters(self) -> dict[str, ClusterRef]:
        with self._lock:
            return dict(self._clusters)

    def ref(self, name: str) -> ClusterRef:
        with self._lock:
            ref = self._clusters.get(name)
        if ref is None:
            raise ClusterNotFound(name)
        return ref

    def client(self, name: str) -> Client:
        with self._lock:
            ref = self._clusters.get(name)
            if ref is None:
                raise ClusterNotFound(name)
            cached = self._clients.get(name)
            if cached is None:
                cached = (ref, Client(ref.endpoint, ref.token, timeout=self.timeout))
                self._clients[name] = cached
            return cached[1]

    def close(self) -> None:
        with self._lock:
            for _, client in self._clients.values():
                client.close()
            self._clients.clear()


@dataclass(frozen=True)
class TrackerSwitch:
    """One mode change the tracker made (``status.tracker.recentSwitches``)."""

    time: float
    """Seconds since the epoch."""
    replica: str
    """The TableReplica's name, or the replica id when no TableReplica names it."""
    replica_id: str
    cluster: str
    previous_mode: str
    mode: str
    reason: str

    def status(self) -> dict[str, Any]:
        return {"time": _time_text(self.time), "replica": self.replica, "replicaId": self.replica_id,
                "cluster": self.cluster, "mode": self.mode, "reason": self.reason}


def _time_text(seconds: float) -> str:
    return now_text(datetime.fromtimestamp(seconds, UTC))


@dataclass
class _TrackerEntry:
    summary: str = ""
    decision: str | None = None
    reason: str | None = None
    time: float | None = None
    switches: deque[TrackerSwitch] = field(default_factory=lambda: deque(maxlen=MAX_TRACKER_SWITCHES))


class TrackerJournal:
    """What the tracker saw and did per ReplicatedTable, kept for the table's ``status.tracker``.

    The tracker loop writes it (a summary per check, the switches it made); the ReplicatedTable's
    reconciler and the kopf tracker timer read it, so both front ends publish the same status. It
    lives in the operator's memory: after a restart the status already written is kept and extended
    (:meth:`status` merges the previous one), not replaced by an empty one."""

    def __init__(self) -> None:
        #: guards ``_tables``; a leaf
        self._lock = threading.Lock()
        self._tables: dict[tuple[str | None, str], _TrackerEntry] = {}

    def checked(self, key: tuple[str | None, str], summary: str) -> None:
        """One check of the table saw this (its sync replicas, the counts, why nothing moved)."""
        with self._lock:
            self._tables.setdefault(key, _TrackerEntry()).summary = summary

    def switched(self, key: tuple[str | None, str], switches: list[TrackerSwitch], reason: str) -> None:
        """The switches of one decision, all applied, oldest first."""
        if not switches:
            return
        with self._lock:
            entry = self._tables.setdefault(key, _TrackerEntry())
            entry.decision = "; ".join(f"{s.replica}: {s.previous_mode} -> {s.mode}" for s in switches)
            entry.reason = reason
            entry.time = switches[-1].time
            entry.switches.extend(switches)

    def forget(self, key: tuple[str | None, str]) -> None:
        with self._lock:
            self._tables.pop(key, None)

    def status(self, key: tuple[str | None, str], previous: Any = None) -> dict[str, Any] | None:
        """``status.tracker`` of the table: what this operator saw merged over ``previous`` (the status
        already written); None when the tracker has not looked at the table since this operator started."""
        with self._lock:
            entry = self._tables.get(key)
            if entry is None:
                return None
            summary, decision, reason, when = entry.summary, entry.decision, entry.reason, entry.time
            switches = [s.status() for s in reversed(entry.switches)]
        out: dict[str, Any] = {k: v for k, v in (previous or {}).items()
                               if k in ("lastDecision", "reason", "time", "recentSwitches")}
        if decision is not None and when is not None:
            out.update({"lastDecision": decision, "reason": reason, "time": _time_text(when)})
        if switches:
            known = {(s.get("time"), s.get("replicaId"), s.get("mode")) for s in switches}
            older = [s for s in out.get("recentSwitches") or []
                     if isinstance(s, dict) and (s.get("time"), s.get("replicaId"), s.get("mode")) not in known]
            out["recentSwitches"] = (switches + older)[:MAX_TRACKER_SWITCHES]
        out.setdefault("recentSwitches", [])
        out["summary"] = summary
        return out


class DatabaseClusterError(Exception):
    """A database cluster's state could not be read (its message names the cluster and says why)."""


class DatabaseClusters(Protocol):
    """Reads the clusters that keep table clusters' databases available (CloudNativePG's ``Cluster``):
    the kopf front end reads them through the Kubernetes API (``operator/cnpg.py``)."""

    def current_primary(self, namespace: str | None, name: str) -> str | None:
        """The Cluster's ``status.currentPrimary`` (None: not reported yet); ``namespace`` None is the
        operator's own. Raises :class:`DatabaseClusterError`."""
        ...


@functools.cache
def probe_tls() -> ssl.SSLContext:
    """httpx's default TLS context, made once for every probe of an engine (``/healthz``, ``/readyz``):
    ``httpx.get`` alone makes a new one per call, several milliseconds of CPU (4 % of an idle
    operator's at 600 resources; benchmarks/scale_bench.py --dimensions operator). Each probe still
    opens a connection of its own: what it measures and how a refused one reads are unchanged."""
    return httpx.create_ssl_context()


T = TypeVar("T")


class Resources(Protocol):
    """Where the reconcilers read the other resources (the registry): each answer a copy of what is
    stored, so a reconciler may change the status maps it gets (but :meth:`shared`'s)."""

    def of_kind(self, kind: str, namespace: str | None = None,
                where: Callable[[Resource], bool] | None = None) -> list[Resource]:
        """The valid resources of ``kind`` (in ``namespace``; that ``where``, handed a shared
        resource it must only read, accepts)."""
        ...

    def find(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        """The valid resource ``namespace/name`` of ``kind`` (``namespace`` None: in any namespace)."""
        ...

    def shared(self, kind: str) -> list[Resource]:
        """The valid resources of ``kind`` as stored, not copied: the caller must only read them."""
        ...

    def derived(self, kinds: tuple[str, ...], key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, kept until the spec or metadata of a resource of ``kinds`` changes (see
        :meth:`~reptables.operator.registry.Registry.derived`): shared, read only."""
        ...


@dataclass
class World:
    """Everything the reconcilers may look at besides the resource being reconciled."""

    engines: Engines
    resources: Resources
    #: runs the bootstrap and verify jobs of new replicas (None: this front end cannot run them)
    launcher: Launcher | None = None
    #: what the tracker decided per table, for ``status.tracker`` (None: no tracker runs)
    tracker_journal: TrackerJournal | None = None
    #: reads a CloudNativePG Cluster's primary for ``status.leadership`` (None: this front end cannot)
    database_clusters: DatabaseClusters | None = None

    def of_kind(self, kind: str, namespace: str | None = None,
                where: Callable[[Resource], bool] | None = None) -> list[Resource]:
        """Resources of ``kind`` (see :class:`Resources`): filter with ``where`` rather than after,
        so that only the resources kept are copied (a reconcile stays O(1) copies, not O(N))."""
        return self.resources.of_kind(kind, namespace, where)

    def find(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        return self.resources.find(kind, namespace, name)

    def read_only(self, kind: str) -> list[Resource]:
        """Every resource of ``kind``, not copied (see :meth:`Resources.shared`): never change them."""
        return self.resources.shared(kind)

    def derived(self, kinds: tuple[str, ...], key: Hashable, compute: Callable[[], T]) -> T:
        """A value ``compute`` derives from the specs of whole kinds, made again only when one of them
        changes (see :class:`Resources`): a reconcile reads it in O(1), not O(N)."""
        return self.resources.derived(kinds, key, compute)

    def grouped(self, kind: str, by: Callable[[Resource], Hashable]) -> dict[Hashable, list[Resource]]:
        """The valid resources of ``kind`` grouped by ``by`` (a module-level function of a resource's
        spec and metadata only: its identity keys the cache), shared and read only. Their statuses
        may be older than the registry's: read a member's status through :meth:`find`."""
        def group() -> dict[Hashable, list[Resource]]:
            out: dict[Hashable, list[Resource]] = {}
            for r in self.resources.shared(kind):
                out.setdefault(by(r), []).append(r)
            return out
        return self.derived((kind,), ("grouped", kind, by), group)


def oldest_claimant(candidates: list[Resource]) -> Resource:
    """Of several resources claiming one engine object, the oldest wins (ties: by namespace/name)."""
    return min(candidates, key=lambda r: (r.created, r.namespace or "", r.name))


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, YtError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
