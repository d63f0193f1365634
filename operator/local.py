"""The local runner behind ``reptables up DIR``: the whole product on one machine, no Kubernetes.

It reads the same manifests ``kubectl apply`` takes (Secrets, TableClusters, ReplicatedTables,
TableReplicas, TableCollocations), starts one engine per TableCluster on the loopback port of its
``endpoint`` (a child process in its own process group, token from the Secret), and runs the same
reconcile core and tracker the operator runs — status is written back into the in-memory objects
instead of the API server. Then it shows replication working with the official YTsaurus client:
rows written to each replicated table through ``yt.wrapper`` appear on every replica.

It shares the operator's core, not its Kubernetes front end: the reconcile functions come from the
table in ``reconcile.py`` and the engines, registry and tracker from a :class:`~.runtime.Runtime`,
so this module never imports ``handlers.py`` or the operator framework. Mode switches made by the
tracker are printed like the reconcilers' events (the operator posts them as Kubernetes Events).

A replica added to a table whose history was trimmed is bootstrapped with local Spark: the runtime's
:class:`~.bootstrap.LocalLauncher` runs the copy and verify jobs as child processes (own process
groups, secrets in 0600 files under the data directory), stopped with the engines.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from reptables.engine.errors import YtError
from reptables.engine.process import LocalEngine

from . import models
from .bootstrap import LocalLauncher
from .reconcile import ORDER, is_ready, reconcile
from .registry import (
    CREDENTIALS_LABEL,
    CREDENTIALS_LABEL_VALUE,
    CREDENTIALS_SELECTOR,
    CredentialPolicy,
    Registry,
)
from .runtime import Runtime
from .tracking import TrackerLoop
from .world import Engines, Resource

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        files = sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path]
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if doc:
                    docs.append(doc)
    return docs


class LocalRunner:
    """The manifests, the engines started for them, and the operator's runtime, in one process."""

    def __init__(self, manifests: list[dict[str, Any]], data_dir: Path, namespace: str = "default") -> None:
        self.data_dir = data_dir
        self.namespace = namespace
        # the manifests are the user's own files, not a shared API: any namespace, and a Secret
        # without the credentials label is used with a warning (the operator would not read it)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = Runtime.start(namespace, policy=CredentialPolicy(None, require_label=False),
                                     launcher=LocalLauncher(base_dir=data_dir))
        self.processes: dict[str, LocalEngine] = {}
        self.bodies: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        for doc in manifests:
            self._add(doc)

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

    def _add(self, doc: dict[str, Any]) -> None:
        kind = doc.get("kind")
        meta = doc.setdefault("metadata", {})
        if kind == "Secret":
            meta.setdefault("namespace", self.namespace)
            self.registry.upsert_secret(doc)
            if (meta.get("labels") or {}).get(CREDENTIALS_LABEL) != CREDENTIALS_LABEL_VALUE:
                print(f"warning: Secret {meta['namespace']}/{meta.get('name')} lacks the label "
                      f"{CREDENTIALS_SELECTOR}: the operator on Kubernetes would not use it", file=sys.stderr)
            return
        if kind not in ORDER:
            raise ValueError(f"{kind} {meta.get('name')}: the local runner manages {', '.join(ORDER)} and Secrets")
        models.parse_resource(doc)  # a clear error naming the resource and field, before anything starts
        if kind != "TableCluster":
            meta.setdefault("namespace", self.namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        doc.setdefault("status", {})
        self.bodies[(kind, meta.get("namespace"), meta["name"])] = doc
        self.registry.upsert(doc)

    def start_engines(self) -> None:
        for res in self.registry.of_kind("TableCluster"):
            problem = self.registry.refresh_cluster(res.name)
            if problem is not None:
                raise RuntimeError(f"TableCluster {res.name}: {problem}")
            ref = self.engines.ref(res.name)
            url = urlparse(ref.endpoint)
            if url.hostname not in LOOPBACK or url.port is None:
                raise RuntimeError(f"TableCluster {res.name}: the local runner starts engines on loopback only; "
                                   f"endpoint {ref.endpoint} is not http://127.0.0.1:<port>")
            self.processes[res.name] = LocalEngine(res.name, self.data_dir / res.name, port=url.port,
                                                   token=ref.token).start()
            print(f"engine {res.name} serving {ref.endpoint} (data in {self.data_dir / res.name})")

    def reconcile_all(self) -> None:
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                outcome = reconcile(res, self.registry.world())
                body = self.bodies[res.key]
                body["status"] = {**body.get("status", {}), **outcome.status}
                self.registry.upsert(body)
                for event in outcome.events:
                    print(f"  {event.type:7} {res.display}: {event.reason}: {event.message}")
        self.tracker.maybe_check()
        for switch in self.runtime.pending_switches():
            print(f"  {'Normal':7} {switch.table.display}: ReplicaModeChanged: {switch.message}")

    def all_ready(self) -> bool:
        return all(is_ready(r.status) for kind in ORDER for r in self.registry.of_kind(kind))

    def converge(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.reconcile_all()
            if self.all_ready():
                return True
            time.sleep(0.5)
        return False

    def print_status(self) -> None:
        for kind in ORDER:
            for res in self.registry.of_kind(kind):
                ready: dict[str, Any] = next(
                    (c for c in res.status.get("conditions", []) if c.get("type") == "Ready"), {})
                extra = _status_summary(res)
                print(f"{kind:16} {res.name:20} Ready={ready.get('status', 'Unknown'):7} {extra} "
                      f"({ready.get('reason', '')}: {ready.get('message', '')})")

    def demo(self, rows: int = 1000) -> None:
        """Write rows to every replicated table with the official client; show every replica gets them."""
        import yt.wrapper as yt

        for table in self.registry.of_kind("ReplicatedTable"):
            ref = self.engines.ref(table.spec.cluster)
            client = yt.YtClient(proxy=ref.endpoint, token=ref.token)
            keys = [c for c in table.spec.table_schema if c.sort_order is not None]
            batch = [_demo_row(table.spec.table_schema, i) for i in range(rows)]
            for attempt in range(100):
                try:
                    client.insert_rows(table.spec.path, batch, require_sync_replica=False)
                    break
                except yt.YtError as exc:
                    if attempt == 99:
                        raise
                    print(f"  waiting to write {table.spec.path}: {str(exc).splitlines()[0]}")
                    self.reconcile_all()
                    time.sleep(0.2)
            print(f"wrote {rows} rows to {table.spec.cluster}:{table.spec.path} with yt.wrapper")
            for replica in self.registry.of_kind("TableReplica"):
                if replica.spec.table != table.name or not replica.spec.enabled:
                    continue
                rref = self.engines.ref(replica.spec.cluster)
                rclient = yt.YtClient(proxy=rref.endpoint, token=rref.token)
                query = f"sum(1) as n from [{replica.spec.replica_path}] group by 1"
                count = 0
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    found = list(rclient.select_rows(query))
                    count = found[0]["n"] if found else 0
                    if count >= rows:
                        break
                    self.reconcile_all()
                    time.sleep(0.2)
                mode = self.engines.client(table.spec.cluster).get(f"#{replica.status.get('replicaId')}/@mode")
                print(f"  replica {replica.name} on {replica.spec.cluster} ({mode}): {count} rows")
            if keys:
                self._show_lookup(client, table, {k.name: 0 for k in keys})

    def _show_lookup(self, client: Any, table: Resource, key: dict[str, Any]) -> None:
        """A read of the replicated table is served by its in-sync sync replica (once the tracker made one)."""
        # the official client retries "no in-sync replicas" for minutes by itself; here the runner
        # must keep reconciling (the tracker promotes the sync replica), so it asks once per pass
        import yt.common as yt_errors

        client.config["dynamic_table_retries"]["enable"] = False
        deadline = time.monotonic() + 60
        while True:
            try:
                found = list(client.lookup_rows(table.spec.path, [key]))
                print(f"  lookup {key} on {table.spec.path} (served by the sync replica): {found}")
                return
            except yt_errors.YtError as exc:
                if time.monotonic() > deadline:
                    raise
                inner = exc.inner_errors[0].get("message") if exc.inner_errors else exc.message
                print(f"  waiting for an in-sync replica (the tracker picks one): {inner}")
                self.reconcile_all()
                time.sleep(0.5)

    def stop(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.runtime.close()
        for engine in self.processes.values():
            engine.stop()


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
    return f"id={status.get('collocationId', '-')}"


def _demo_row(schema: list[Any], i: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for col in schema:
        value: Any = {"int64": i, "uint64": i, "double": i * 1.5, "boolean": i % 2 == 0,
                      "string": f"{col.name}-{i}", "any": {"i": i}}[col.type.value]
        row[col.name] = value
    return row


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(paths: list[Path], data_dir: Path, keep_running: bool, timeout: float = 90.0) -> int:
    # SIGTERM ends the runner like Ctrl-C: the engines it started are stopped on the way out
    signal.signal(signal.SIGTERM, _terminate)
    runner = LocalRunner(load_manifests(paths), data_dir)
    try:
        runner.start_engines()
        ready = runner.converge(timeout)
        runner.print_status()
        if not ready:
            print("not every resource became Ready; see the conditions above")
            return 1
        runner.demo()
        runner.reconcile_all()
        runner.print_status()
        if keep_running:
            print("reconciling every second; Ctrl-C stops the engines")
            while True:
                time.sleep(1)
                runner.reconcile_all()
        return 0
    except (YtError, RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        runner.stop()
