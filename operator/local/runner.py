"""The local runner behind ``reptables up DIR``: the whole product on one machine, no Kubernetes.

It reads the same manifests ``kubectl apply`` takes (Secrets, TableClusters, ReplicatedTables,
TableReplicas, TableCollocations, XdcrGroups), starts one engine per TableCluster on the loopback
port of its ``endpoint`` (a child process in its own process group, token from the Secret, XDCR
cluster id from ``clusterId``, a PostgreSQL database from ``spec.local`` when it names one: the
URL's password, if any, only in that engine's environment; a TableCluster with ``spec.members`` is
several engines on that database, a leader and standbys, behind a forwarder on the endpoint's port:
``group.py``), and runs the same
reconcile core and tracker the operator runs — status is written back into the in-memory objects
instead of the API server. Then it shows replication working with the official YTsaurus client:
rows written to each replicated table through ``yt.wrapper`` appear on every replica (the first
``up`` on a data directory only: ``up.py`` never writes them over a user's tables).

It shares the operator's core, not its Kubernetes front end: the reconcile functions come from the
table in ``controllers/dispatch.py`` and the engines, registry and tracker from a
:class:`~reptables.operator.runtime.Runtime`, so this module never imports ``handlers.py`` or the
operator framework. Before each reconcile it asks the runtime, as the handlers do, whether the
resource may be reconciled (``Runtime.admit``: a TableCluster whose credentials cannot be used is
not). Mode switches made by the tracker are printed like the reconcilers' events (the operator
posts them as Kubernetes Events).

A replica added to a table whose history was trimmed is bootstrapped with local Spark: the runtime's
:class:`~reptables.operator.jobs.processes.LocalLauncher` runs the copy and verify jobs as child
processes (own process groups, secrets in 0600 files under the data directory), stopped with the
engines.

The local mode has the same face as ``kubectl reptables`` (docs/local.md). There is no API server
for other commands to ask, so the running ``up`` keeps a *state directory* instead: after every
reconcile pass it writes ``DATA_DIR/state.json`` (the objects with their status, the recent events,
its engines — never a Secret or token), which ``reptables status`` renders with the same
:mod:`~reptables.operator.kubectl.statusview` the kubectl plugin uses; ``reptables cluster
stop|start|kill`` leave a request file in ``DATA_DIR/control/`` that the ``up`` loop carries out (only
that process holds the engines' pids). ``up`` also watches its manifest paths, like a ``kubectl
apply``/``delete`` on each edit.

The data directory is private (``state.make_private_dir``: 0700, files 0600, tightened with a
notice when it is not), and ``up`` runs with the umask 0o077, so the files that it, its engines and
its Spark jobs create later are private too, whatever mode the code creating them asks for. Every
line ``up`` prints passes names, paths and messages through
:func:`~reptables.operator.terminal.display`: a manifest's table path may hold terminal escape
sequences, and they are shown, not obeyed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import sys
import time
import uuid
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from reptables.engine.process import LocalEngine, start_all

from .. import models
from ..controllers.dispatch import ORDER, finalize, is_ready, reconcile
from ..controllers.world import Engines, Resource
from ..jobs.processes import LocalLauncher
from ..models import ConditionType, XdcrPairState
from ..registry import (
    CREDENTIALS_LABEL,
    CREDENTIALS_LABEL_VALUE,
    CREDENTIALS_SELECTOR,
    ClusterProblem,
    CredentialPolicy,
    Registry,
)
from ..runtime import Runtime
from ..terminal import display
from ..tracker.loop import TrackerLoop
from .demo import demo
from .group import LocalGroup
from .manifests import ManifestError, load_file, manifest_files, port_conflict
from .service import LocalService
from .state import (
    CONTROL_DIR,
    LOOPBACK,
    STATE_FILE,
    make_private_dir,
    write_private,
)

#: how many recent events state.json keeps
MAX_EVENTS = 200

Key = tuple[str, str | None, str]


def _key_of(doc: dict[str, Any], namespace: str) -> Key:
    meta = doc.get("metadata") or {}
    kind = str(doc.get("kind"))
    ns = None if _cluster_scoped(kind) else (meta.get("namespace") or namespace)
    return (kind, ns, str(meta.get("name")))


def _cluster_scoped(kind: str) -> bool:
    """TableCluster and XdcrGroup have no namespace (a manifest's namespace is ignored, as kubectl does)."""
    model = models.KINDS.get(kind)
    return model is not None and model.info.scope is models.Scope.CLUSTER


#: how long ``up`` waits for objects whose Spark job still runs (JVM start, copy, verify on a busy laptop)
JOB_WAIT_SECONDS = 600.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LocalRunner:
    """The manifests, the engines started for them, and the operator's runtime, in one process."""

    def __init__(self, manifests: list[dict[str, Any]], data_dir: Path, namespace: str = "default") -> None:
        self.data_dir = data_dir
        self.namespace = namespace
        # the manifests are the user's own files, not a shared API: any namespace, and a Secret
        # without the credentials label is used with a warning (the operator would not read it)
        notice = make_private_dir(data_dir)
        if notice is not None:
            print(display(notice), file=sys.stderr)
        self.runtime = Runtime.start(namespace, policy=CredentialPolicy(None, require_label=False),
                                     launcher=LocalLauncher(base_dir=data_dir))
        self.processes: dict[str, LocalEngine] = {}
        #: the HA TableClusters (``spec.members``): their engines and the service in front (``group.py``)
        self.groups: dict[str, LocalGroup] = {}
        self.bodies: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        #: recent events, oldest first, as Kubernetes Event dicts (what state.json and the status view show)
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        #: the manifest paths being watched (set by :meth:`watch`); each file's mtime and objects
        self.manifest_paths: list[Path] = []
        self._mtimes: dict[Path, int] = {}
        self._file_keys: dict[Path, list[Key]] = {}
        self._secret_keys: dict[Path, list[tuple[str, str]]] = {}
        #: objects whose manifest went away: finalized (as ``kubectl delete`` would) on each pass until done
        self._deleting: set[Key] = set()
        for doc in manifests:
            self.add(doc)

    @property
    def engines(self) -> Engines:
        return self.runtime.engines

    @property
    def registry(self) -> Registry:
        return self.runtime.registry

    @property
    def tracker(self) -> TrackerLoop:
        return self.runtime.tracker

    @tracker.setter
    def tracker(self, tracker: TrackerLoop) -> None:
        """Swap the tracker loop (benchmarks put an instrumented one in)."""
        self.runtime.tracker = tracker

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    def add(self, doc: dict[str, Any]) -> None:
        """Apply one manifest document (a Secret or a resource of the four kinds), as ``kubectl apply`` would."""
        kind = doc.get("kind")
        meta = doc.setdefault("metadata", {})
        if kind == "Secret":
            meta.setdefault("namespace", self.namespace)
            self.registry.upsert_secret(doc)
            if (meta.get("labels") or {}).get(CREDENTIALS_LABEL) != CREDENTIALS_LABEL_VALUE:
                print(display(f"warning: Secret {meta['namespace']}/{meta.get('name')} lacks the label "
                              f"{CREDENTIALS_SELECTOR}: the operator on Kubernetes would not use it"), file=sys.stderr)
            return
        if kind not in ORDER:
            raise ValueError(f"{kind} {meta.get('name')}: the local runner manages {', '.join(ORDER)} and Secrets")
        models.parse_resource(doc)  # a clear error naming the resource and field, before anything starts
        if _cluster_scoped(kind):
            meta.pop("namespace", None)
        else:
            meta.setdefault("namespace", self.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", _now())
        doc.setdefault("status", {})
        self.bodies[(kind, meta.get("namespace"), meta["name"])] = doc
        self.registry.upsert(doc)

    def start_engines(self) -> None:
        """Start an engine for every TableCluster without one, side by side (``start_all``); the engines of
        an HA TableCluster (``spec.members``) as a group with its service."""
        clusters = [res for res in self.registry.of_kind("TableCluster")
                    if res.name not in self.processes and res.name not in self.groups]
        self._start([self._engine_for(res.name) for res in clusters if not res.spec.members])
        for res in clusters:
            if res.spec.members:
                self._start_engine(res.name)

    def _start_engine(self, name: str) -> None:
        body = self.bodies.get(("TableCluster", None, name))
        if body is None or not self.registry.resource(body).spec.members:
            self._start([self._engine_for(name)])
            return
        group = self._group_for(name)
        group.start()
        self.groups[name] = group
        print(display(f"engine {name}: {len(group.members)} engines over {_data_of(group.members[0])} "
                      f"({', '.join(group.member_urls)}, with --standby); {group.url} forwards to the leader, "
                      f"now {group.service.leader}"))

    def _group_for(self, name: str) -> LocalGroup:
        """The engines of an HA TableCluster: one per member (its loopback port, ``--standby``, advertised as
        the member), on the PostgreSQL database of ``spec.local``; the service on the endpoint's port."""
        problem = self.registry.refresh_cluster(name)
        if problem is not None:
            raise RuntimeError(f"TableCluster {name}: {problem}")
        ref = self.engines.ref(name)
        spec = self.registry.resource(self.bodies[("TableCluster", None, name)]).spec
        endpoint = urlparse(ref.endpoint)
        ports = []
        for member in [ref.endpoint, *spec.members]:
            url = urlparse(member)
            if url.scheme != "http" or url.hostname not in LOOPBACK or url.port is None:
                raise RuntimeError(f"TableCluster {name}: the local runner starts engines on loopback only; {member} "
                                   "is not http://127.0.0.1:<port>")
            ports.append(url.port)
        if len(set(ports)) != len(ports):
            raise RuntimeError(f"TableCluster {name}: the endpoint and each member need a port of their own "
                               f"(up listens on the endpoint's, {endpoint.port}, and forwards to the leader)")
        self._check_ports_unshared(name, ports)
        args, env = self._storage_for(name)
        if not args and not env.get("REPTABLES_STORAGE"):
            raise RuntimeError(f"TableCluster {name}: spec.members needs a PostgreSQL database in spec.local "
                               "(storage or storageSecret): the engines of an HA table cluster share one database")
        engines = [LocalEngine(name, self.data_dir / name / f"member-{port}", port=port, token=ref.token, env=env,
                               extra_args=["--cluster-id", str(ref.cluster_id), *args, "--standby",
                                           "--advertise-url", f"http://127.0.0.1:{port}"])
                   for port in ports[1:]]
        assert endpoint.port is not None
        return LocalGroup(name, engines, LocalService(name, endpoint.port, [e.url for e in engines]))

    def _start(self, engines: list[LocalEngine]) -> None:
        for engine in start_all(engines):
            self.processes[engine.cluster_name] = engine
            print(display(f"engine {engine.cluster_name} serving {engine.url} (data in {_data_of(engine)})"))

    def _engine_for(self, name: str) -> LocalEngine:
        problem = self.registry.refresh_cluster(name)
        if problem is not None:
            raise RuntimeError(f"TableCluster {name}: {problem}")
        ref = self.engines.ref(name)
        url = urlparse(ref.endpoint)
        if url.hostname not in LOOPBACK or url.port is None:
            raise RuntimeError(f"TableCluster {name}: the local runner starts engines on loopback only; "
                               f"endpoint {ref.endpoint} is not http://127.0.0.1:<port>")
        self._check_ports_unshared(name, [url.port])
        args, env = self._storage_for(name)
        # the XDCR cluster id (docs/xdcr.md): stored in the data directory at the first start
        return LocalEngine(name, self.data_dir / name, port=url.port, token=ref.token, env=env,
                           extra_args=["--cluster-id", str(ref.cluster_id), *args])

    def _check_ports_unshared(self, name: str, ports: list[int]) -> None:
        clusters = [(c.name, [c.spec.endpoint, *(c.spec.members or [])]) for c in self.registry.of_kind("TableCluster")]
        problem = port_conflict(clusters, name, ports, LOOPBACK)
        if problem is not None:
            raise RuntimeError(problem)

    def _storage_for(self, name: str) -> tuple[list[str], dict[str, str]]:
        """The engine's arguments and environment for ``spec.local``: ``--storage URL`` (the models
        refuse a password in it), or the Secret's whole URL in ``REPTABLES_STORAGE``. Otherwise SQLite,
        and ``REPTABLES_STORAGE`` empty: one in up's environment would send every engine to one database."""
        body = self.bodies.get(("TableCluster", None, name))
        local = self.registry.resource(body).spec.local if body is not None else None
        if local is not None and local.storage is not None:
            return ["--storage", local.storage], {"REPTABLES_STORAGE": ""}
        if local is not None and local.storage_secret is not None:
            secret = local.storage_secret
            url = self.registry.credentials(name, secret.namespace or self.namespace, secret.name, secret.key)
            if isinstance(url, ClusterProblem):
                raise RuntimeError(f"TableCluster {name}: spec.local.storageSecret: {url}")
            return [], {"REPTABLES_STORAGE": url}
        return [], {"REPTABLES_STORAGE": ""}

    def record(self, type_: str, kind: str, namespace: str | None, name: str, reason: str, message: str) -> None:
        """Print one event line and keep it, Kubernetes-shaped, for state.json."""
        what = f"{kind} {namespace + '/' if namespace else ''}{name}"
        print(display(f"  {type_:7} {what}: {reason}: {message}"))
        self.events.append({"type": type_, "reason": reason, "message": message,
                            "involvedObject": {"kind": kind, "namespace": namespace, "name": name},
                            "lastTimestamp": _now()})

    def reconcile_all(self) -> None:
        for group in self.groups.values():  # up restarts the engines of an HA cluster as its supervisor
            for line in group.supervise():
                print(display(line))
        self._finalize_deleted()
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                if res.deleting or res.key not in self.bodies:
                    continue
                refused = self.runtime.admit(res)
                outcome = refused if refused is not None else reconcile(res, self.registry.world())
                body = self.bodies[res.key]
                body["status"] = {**body.get("status", {}), **outcome.status}
                self.registry.upsert(body)
                for event in outcome.events:
                    self.record(event.type, res.kind, res.namespace, res.name, event.reason, event.message)
        self.tracker.maybe_check()
        for switch in self.runtime.pending_switches():
            table = switch.table
            self.record("Normal", table.kind, table.namespace, table.name, "ReplicaModeChanged", switch.message)
        self.write_state()

    def _finalize_deleted(self) -> None:
        """Run the finalizer of every object whose manifest went away; drop it once the engine side is done."""
        for kind in reversed(ORDER):  # replicas before their tables, tables before their clusters
            for key in sorted(k for k in self._deleting if k[0] == kind):
                body = self.bodies.get(key)
                if body is None:
                    self._deleting.discard(key)
                    continue
                res = self.registry.resource(body)
                outcome = finalize(res, self.registry.world())
                if outcome.status:
                    body["status"] = {**body.get("status", {}), **outcome.status}
                    self.registry.upsert(body)
                for event in outcome.events:
                    self.record(event.type, res.kind, res.namespace, res.name, event.reason, event.message)
                if outcome.finished:
                    self.registry.remove(*key)
                    self.bodies.pop(key, None)
                    self._deleting.discard(key)
                    if kind == "TableCluster" and key[2] in self.processes:
                        self.processes.pop(key[2]).stop()
                    if kind == "TableCluster" and key[2] in self.groups:
                        self.groups.pop(key[2]).stop()
                    print(display(f"{res.display} deleted"))

    def delete(self, key: Key) -> None:
        """Delete an object as ``kubectl delete`` would: mark it, and let the finalizer run on the next passes."""
        body = self.bodies.get(key)
        if body is None or key in self._deleting:
            return
        body.setdefault("metadata", {})["deletionTimestamp"] = _now()
        self.registry.upsert(body)
        self._deleting.add(key)

    # -- the manifests, watched -------------------------------------------------------------------

    def watch(self, paths: list[Path]) -> None:
        """Remember the manifest files as they are now; :meth:`poll_manifests` applies what changes."""
        self.manifest_paths = list(paths)
        for file in manifest_files(paths):
            with contextlib.suppress(OSError):
                self._mtimes[file] = file.stat().st_mtime_ns
            try:
                docs = load_file(file)
            except ManifestError:
                docs = []
            self._file_keys[file] = [_key_of(d, self.namespace) for d in docs if d.get("kind") != "Secret"]
            self._secret_keys[file] = [_secret_key(d, self.namespace) for d in docs if d.get("kind") == "Secret"]

    def poll_manifests(self) -> bool:
        """Apply added, edited and removed manifest files (one pass); whether anything changed."""
        current: dict[Path, int] = {}
        for file in manifest_files(self.manifest_paths):
            with contextlib.suppress(OSError):
                current[file] = file.stat().st_mtime_ns
        changed = [f for f, m in current.items() if self._mtimes.get(f) != m]
        removed = [f for f in self._mtimes if f not in current]
        if not changed and not removed:
            return False
        for file in changed:
            self._mtimes[file] = current[file]
            try:
                docs = load_file(file)
            except ManifestError as exc:
                print(display(f"error: {exc}; the previous version stays", multiline=True), file=sys.stderr,
                      flush=True)
                continue
            self._apply_file(file, docs)
        for file in removed:
            self._mtimes.pop(file, None)
            print(display(f"manifest {file} removed"))
            self._apply_file(file, [])
            self._file_keys.pop(file, None)
            self._secret_keys.pop(file, None)
        return True

    def _apply_file(self, file: Path, docs: list[dict[str, Any]]) -> None:
        old_keys = set(self._file_keys.get(file, []))
        old_secrets = set(self._secret_keys.get(file, []))
        new_keys: list[Key] = []
        new_secrets: list[tuple[str, str]] = []
        new_clusters: list[str] = []
        for doc in docs:
            if doc.get("kind") == "Secret":
                new_secrets.append(_secret_key(doc, self.namespace))
                self.add(doc)
                continue
            key = _key_of(doc, self.namespace)
            new_keys.append(key)
            old = self.bodies.get(key)
            if old is None:
                self.add(doc)
                print(display(f"{key[0]} {key[1] + '/' if key[1] else ''}{key[2]} created (manifest {file.name})"))
                if key[0] == "TableCluster":
                    new_clusters.append(key[2])
            elif key in self._deleting:
                print(display(f"warning: {key[0]} {key[2]} is being deleted; apply it again once it is gone"),
                      file=sys.stderr)
            elif old.get("spec") != doc.get("spec") or _labels(old) != _labels(doc):
                meta = old["metadata"]
                meta["generation"] = int(meta.get("generation") or 1) + (old.get("spec") != doc.get("spec"))
                for field in ("labels", "annotations"):
                    if field in (doc.get("metadata") or {}):
                        meta[field] = doc["metadata"][field]
                    else:
                        meta.pop(field, None)
                old["spec"] = doc.get("spec")
                self.registry.upsert(old)
                print(display(f"{key[0]} {key[1] + '/' if key[1] else ''}{key[2]} configured (manifest "
                              f"{file.name})"))
                if key[0] == "TableCluster":
                    print(display(f"warning: TableCluster {key[2]}: its engine keeps its endpoint and storage until "
                                  "`reptables up` restarts"), file=sys.stderr)
        self._file_keys[file] = new_keys
        self._secret_keys[file] = new_secrets
        elsewhere = {k for f, keys in self._file_keys.items() if f != file for k in keys}
        for key in sorted(old_keys - set(new_keys) - elsewhere):
            print(display(f"{key[0]} {key[1] + '/' if key[1] else ''}{key[2]}: its manifest is gone; deleting it"))
            self.delete(key)
        secrets_elsewhere = {k for f, keys in self._secret_keys.items() if f != file for k in keys}
        for ns, name in sorted(old_secrets - set(new_secrets) - secrets_elsewhere):
            self.registry.remove_secret(ns, name)
        for name in new_clusters:
            try:
                self._start_engine(name)
            except RuntimeError as exc:
                print(display(f"error: {exc}", multiline=True), file=sys.stderr)

    # -- requests from other commands ---------------------------------------------------------------

    def handle_control(self) -> None:
        """Carry out the ``reptables cluster stop|start|kill`` requests waiting in DATA_DIR/control/."""
        control = self.data_dir / CONTROL_DIR
        if not control.is_dir():
            return
        for request in sorted(control.glob("*.request.json")):
            try:
                body = json.loads(request.read_text())
            except (OSError, ValueError):
                continue  # still being written (it is renamed into place, so this is rare) or foreign
            with contextlib.suppress(OSError):
                request.unlink()
            ok, message = self._control(str(body.get("action")), str(body.get("cluster")))
            print(display(message))
            # state.json first: once the command has its answer, `reptables status` shows the change
            self.write_state()
            write_private(request.with_name(request.name.replace(".request.", ".result.")),
                          json.dumps({"ok": ok, "message": message}))

    def _control(self, action: str, cluster: str) -> tuple[bool, str]:
        group = self.groups.get(cluster)
        if group is not None:
            return group.control(action)
        engine = self.processes.get(cluster)
        if engine is None:
            return False, f"TableCluster {cluster}: no engine of that name runs under this `reptables up`"
        if action == "kill":
            if not engine.alive():
                return True, f"engine {cluster} is already stopped"
            pid = engine.pid
            engine.kill()
            return True, f"engine {cluster} (pid {pid}) killed (SIGKILL); `reptables cluster start {cluster}` starts it"
        if action == "stop":
            if not engine.alive():
                return True, f"engine {cluster} is already stopped"
            pid = engine.pid
            engine.stop()
            return True, f"engine {cluster} (pid {pid}) stopped"
        if action == "start":
            if engine.alive():
                return True, f"engine {cluster} is already running (pid {engine.pid})"
            try:
                engine.start()
            except RuntimeError as exc:
                return False, f"engine {cluster} did not start: {str(exc).splitlines()[0]}"
            return True, f"engine {cluster} started again on {engine.url} (pid {engine.pid})"
        return False, f"unknown action {action!r} (stop, start or kill)"

    # -- state ------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What state.json holds: objects with status, recent events, engines. Never a Secret or token."""
        objects = [copy.deepcopy(self.bodies[k]) for k in sorted(self.bodies, key=lambda k: (
            ORDER.index(k[0]) if k[0] in ORDER else len(ORDER), k[1] or "", k[2]))]
        engines = {name: {"endpoint": e.url, "pid": e.proc.pid if e.proc is not None else None,
                          "running": e.alive()} for name, e in sorted(self.processes.items())}
        engines.update({name: g.state() for name, g in sorted(self.groups.items())})
        engines = dict(sorted(engines.items()))
        return {"pid": os.getpid(), "dataDir": str(self.data_dir.resolve()),
                "manifests": [str(p.resolve()) for p in self.manifest_paths], "updated": _now(),
                "objects": objects, "events": list(self.events), "engines": engines}

    def write_state(self) -> None:
        """Write DATA_DIR/state.json atomically, mode 0600 (``reptables status`` reads it)."""
        write_private(self.state_path, json.dumps(self.state(), indent=1, default=str))

    def all_ready(self) -> bool:
        return all(is_ready(r.status) for kind in ORDER for r in self.registry.of_kind(kind))

    def jobs_running(self) -> bool:
        """Whether a Spark job (bootstrap copy or verify, XDCR join) this runner started still runs."""
        launcher = self.registry.launcher
        return isinstance(launcher, LocalLauncher) and bool(launcher.pids())

    def converge(self, timeout: float = 60.0, job_timeout: float = JOB_WAIT_SECONDS) -> bool:
        """Reconcile until every object is Ready, for ``timeout`` seconds counted from the start or from
        the last moment a Spark job of this runner ran, whichever is later, and ``job_timeout`` in all
        (a copy and its verify on a slow machine are progress, not a hang, and enabling the replica
        after them takes its own seconds; a job that fails is retried or reported by its own status)."""
        start = busy = time.monotonic()
        while True:
            self.reconcile_all()
            if self.all_ready():
                return True
            now = time.monotonic()
            if self.jobs_running():
                busy = now
            if now - busy >= timeout or now - start >= job_timeout:
                return False
            time.sleep(0.5)

    def print_status(self) -> None:
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                ready: dict[str, Any] = next(
                    (c for c in res.status.get("conditions", []) if c.get("type") == ConditionType.READY), {})
                extra = _status_summary(res)
                print(display(f"{kind:16} {res.name:20} Ready={ready.get('status', 'Unknown'):7} {extra} "
                              f"({ready.get('reason', '')}: {ready.get('message', '')})"))

    #: rows the demo writes to each table
    DEMO_ROWS = 1000

    def demo(self, rows: int = DEMO_ROWS) -> list[str]:
        """Write rows to every table with the official client and show every copy gets them (``demo.py``);
        the tables written."""
        return demo(self, rows)

    def stop(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.runtime.close()
        for engine in self.processes.values():
            engine.stop()
        for group in self.groups.values():
            group.stop()
        with contextlib.suppress(OSError):
            self.write_state()  # every engine shows running: false


def _data_of(engine: LocalEngine) -> str:
    """Where an engine of :meth:`LocalRunner._engine_for` keeps its data, for a log line (no password)."""
    if "--storage" in engine.extra_args:
        return engine.extra_args[engine.extra_args.index("--storage") + 1]
    return "the database of its storageSecret" if engine.env.get("REPTABLES_STORAGE") else str(engine.data_dir)


def _secret_key(doc: dict[str, Any], namespace: str) -> tuple[str, str]:
    meta = doc.get("metadata") or {}
    return (str(meta.get("namespace") or namespace), str(meta.get("name")))


def _labels(doc: dict[str, Any]) -> tuple[Any, Any]:
    meta = doc.get("metadata") or {}
    return (meta.get("labels"), meta.get("annotations"))


def _status_summary(res: Resource) -> str:
    status = res.status
    if res.kind == "ReplicatedTable":
        return f"sync={','.join(status.get('syncReplicas', [])) or '-'} lag={status.get('maxLagSeconds', '-')}s"
    if res.kind == "TableReplica":
        boot = status.get("bootstrap") or {}
        phase = f" bootstrap={boot['phase']}" if boot.get("phase") else ""
        return (f"mode={status.get('mode', '-')} state={status.get('state', '-')} "
                f"lag={status.get('lagSeconds', '-')}s{phase}")
    if res.kind == "TableCluster":
        return f"version={status.get('version', '-')} latency={status.get('latencyMs', '-')}ms"
    if res.kind == "XdcrGroup":
        connected = sum(1 for p in status.get("pairs", [])
                        if p.get("state") in (XdcrPairState.CONNECTED, XdcrPairState.PAUSED))
        return (f"pairs={connected}/{len(status.get('pairs', []))} connected paused={status.get('paused', '-')} "
                f"conflicts={status.get('conflicts', '-')}")
    return f"id={status.get('collocationId', '-')}"
