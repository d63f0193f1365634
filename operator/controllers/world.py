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

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reptables.engine.client import Client
from reptables.engine.errors import YtError

from ..jobs.launcher import Launcher

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
        #: guards the three maps below; a leaf (closing a client only closes its sockets)
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterRef] = {}  # guarded by _lock
        self._clients: dict[str, tuple[ClusterRef, Client]] = {}  # guarded by _lock
        self._written: dict[str, Directory] = {}  # guarded by _lock

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


@dataclass
class World:
    """Everything the reconcilers may look at besides the resource being reconciled."""

    engines: Engines
    resources: Callable[[str], list[Resource]]
    #: runs the bootstrap and verify jobs of new replicas (None: this front end cannot run them)
    launcher: Launcher | None = None

    def of_kind(self, kind: str, namespace: str | None = None) -> list[Resource]:
        return [r for r in self.resources(kind) if namespace is None or r.namespace == namespace]

    def find(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        for r in self.resources(kind):
            if r.name == name and (namespace is None or r.namespace == namespace):
                return r
        return None


def oldest_claimant(candidates: list[Resource]) -> Resource:
    """Of several resources claiming one engine object, the oldest wins (ties: by namespace/name)."""
    return min(candidates, key=lambda r: (r.created, r.namespace or "", r.name))


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, YtError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
