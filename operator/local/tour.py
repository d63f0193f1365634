"""The tour: the README's first command, showing what reptables does, one numbered step at a time.

``reptables up`` proves the manifests reconcile and rows replicate; a newcomer also wants to *see*
why the product exists: writes that keep going when the sync replica's cluster dies, a replica
added long after its history was trimmed, and the check that tells an operator every change has
reached every replica. This module runs that story on one machine with the manifests of
``examples/quickstart`` and the same :class:`~.runner.LocalRunner` that ``reptables up`` uses (the
reconcile core, the tracker, the local Spark launcher), and drives the tables the way a user does:
the official ``yt`` CLI and ``yt.wrapper``.

Each step prints what happens and why before doing it, and checks its own outcome; the first step
that does not get the outcome it shows stops the tour with the step's number and the reason (exit
status 1). Whatever happens, every engine and Spark job the tour started is stopped on the way out.

Run it with ``python -m reptables.operator.local.tour`` (``bash hack/up.sh`` does); ``--free-ports``
moves the three clusters off 9012-9014 onto free loopback ports (the tests use it). Its data
directory is private like ``up``'s (0700, its files 0600), and the lines that quote the manifests or
the engines go through :func:`~reptables.operator.terminal.display`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from reptables.engine.process import free_port
from reptables.engine.tablets import TabletState

if TYPE_CHECKING:
    from yt.wrapper import YtClient  # the official client (no type information of its own)

from ..controllers.replica_bootstrap import phase_of
from ..controllers.world import Resource
from ..models import BootstrapPhase
from ..terminal import display
from .manifests import load_manifests
from .runner import LocalRunner
from .state import make_private_dir, write_private

#: the quickstart manifests of the repository this module was installed from (editable install), else
#: those under the current directory
QUICKSTART = next((p for p in (Path(__file__).resolve().parents[2] / "examples" / "quickstart",
                               Path("examples") / "quickstart") if p.is_dir()), Path("examples") / "quickstart")
DEFAULT_DATA_DIR = Path(".data/tour")
#: a tour's data directory holds this file; only such a directory is wiped when the tour starts again
MARKER = ".reptables-tour"

SORTED_TABLE = "events"
ORDERED_TABLE = "audit"
SYNC_CLUSTER = "remote-0"
FALLBACK_CLUSTER = "remote-1"
NEW_REPLICA = "events-copy"
NEW_REPLICA_PATH = "//home/quickstart/events_copy"
EVENT_ROWS = 1000
AUDIT_ROWS = 100

PHASE_WHY = {
    BootstrapPhase.PENDING: "a snapshot timestamp T is chosen and the replica is created disabled, pinning the queue "
                            "at T",
    BootstrapPhase.COPYING: "the Spark bootstrap job copies the table as of T into the new replica table",
    BootstrapPhase.VERIFYING: "the Spark verify job compares the copy with its source at T",
    BootstrapPhase.ENABLING: "the replica is enabled: the replicator sends every change after T",
    BootstrapPhase.DONE: "the replica is bootstrapped and replicating",
}


class StepFailed(Exception):
    """A step did not get the outcome it shows; the message says what was expected and what happened."""


@dataclass
class Tour:
    runner: LocalRunner
    yt_cli: Path
    step: int = 0
    title: str = ""
    facts: list[str] = field(default_factory=list)
    #: rows in the sorted table after the failover (what a new replica must hold)
    expected_rows: int = 0

    # --- helpers ---------------------------------------------------------------------------------

    def announce(self, title: str, why: str) -> None:
        self.step += 1
        self.title = title
        print(f"\n== Step {self.step}: {title}\n   {why}", flush=True)

    def table(self, name: str) -> Resource:
        found = [t for t in self.runner.registry.of_kind("ReplicatedTable") if t.name == name]
        if not found:
            raise StepFailed(f"ReplicatedTable {name} is not in the manifests")
        return found[0]

    def replicas(self, table: str) -> list[Resource]:
        return [r for r in self.runner.registry.of_kind("TableReplica") if r.spec.table == table]

    def replica(self, name: str) -> Resource:
        found = [r for r in self.runner.registry.of_kind("TableReplica") if r.name == name]
        if not found:
            raise StepFailed(f"TableReplica {name} is not in the manifests")
        return found[0]

    def _has_sync(self, table: str) -> Callable[[], bool]:
        return lambda: bool(self.sync_replicas(table))

    def sync_replicas(self, table: str) -> list[str]:
        return list(self.table(table).status.get("syncReplicas", []))

    def yt_client(self, cluster: str) -> YtClient:
        import yt.wrapper as yt

        ref = self.runner.engines.ref(cluster)
        client = yt.YtClient(proxy=ref.endpoint, token=ref.token)
        # the tour reconciles between attempts itself; the client must not wait minutes on its own
        client.config["dynamic_table_retries"]["enable"] = False
        client.config["proxy"]["retries"]["count"] = 1
        return client

    def yt(self, cluster: str, *args: str, stdin: str | None = None) -> str:
        """Run the official ``yt`` CLI against ``cluster`` (YT_PROXY/YT_TOKEN in its environment only)."""
        ref = self.runner.engines.ref(cluster)
        env = {**os.environ, "YT_PROXY": ref.endpoint, "YT_TOKEN": ref.token}
        result = subprocess.run([str(self.yt_cli), *args], input=stdin, capture_output=True, text=True, env=env,
                                timeout=120)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            raise StepFailed(f"yt {args[0]} on {cluster} failed: {' '.join(lines[-3:])[:500]}")
        return result.stdout

    def count(self, cluster: str, path: str) -> int:
        found = list(self.yt_client(cluster).select_rows(f"sum(1) as n from [{path}] group by 1"))
        return int(found[0]["n"]) if found else 0

    def wait(self, what: str, done: Callable[[], bool], timeout: float, reconcile: bool = True) -> float:
        """Reconcile (the operator's loop, the tracker) until ``done()``; the seconds it took."""
        start = time.monotonic()
        while True:
            if reconcile:
                self.runner.reconcile_all()
            if done():
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise StepFailed(f"{what} did not happen within {timeout:.0f} s")
            time.sleep(0.3)

    def replica_counts(self, table: str, expected: int, timeout: float = 60.0) -> dict[str, int]:
        """Wait until every enabled replica of ``table`` holds ``expected`` rows; print each."""
        counts: dict[str, int] = {}

        def all_there() -> bool:
            for rep in self.replicas(table):
                counts[rep.name] = self.count(rep.spec.cluster, rep.spec.replica_path)
            return all(n == expected for n in counts.values())

        try:
            self.wait(f"{expected} rows on every replica of {table}", all_there, timeout)
        finally:
            for rep in self.replicas(table):
                mode = rep.status.get("mode", "-")
                print(display(f"   {table} replica {rep.name} on {rep.spec.cluster} ({mode}): "
                              f"{counts.get(rep.name, 0)} rows"))
        return counts

    # --- the steps -------------------------------------------------------------------------------

    def start(self) -> None:
        self.announce("start the clusters and reconcile until Ready",
                      "three engines (primary holds the replicated tables, remote-0 and remote-1 their replicas); "
                      "the operator's reconcile core creates the tables and replicas, the tracker picks the sync "
                      "replica (preferably on remote-0)")
        self.runner.start_engines()
        if not self.runner.converge(90.0):
            self.runner.print_status()
            raise StepFailed("not every resource became Ready within 90 s; see the conditions above")
        for name in (SORTED_TABLE, ORDERED_TABLE):
            self.wait(f"a sync replica for {name}", self._has_sync(name), 60)
        self.runner.print_status()
        for name in (SORTED_TABLE, ORDERED_TABLE):
            print(f"   {name}: sync replica {', '.join(self.sync_replicas(name))}")

    def write(self) -> None:
        self.announce("write rows with the official yt CLI",
                      "a write goes to the meta-cluster (primary); it commits on the sync replica in the same "
                      "two-phase commit and is queued for the async one")
        events, audit = self.table(SORTED_TABLE), self.table(ORDERED_TABLE)
        rows = "\n".join(json.dumps({"id": i, "kind": "signup" if i % 3 else "order", "payload": f"event {i}"})
                         for i in range(EVENT_ROWS))
        self.yt(events.spec.cluster, "insert-rows", events.spec.path, "--format", "json", stdin=rows)
        print(display(f"   yt insert-rows {events.spec.path} --format json: {EVENT_ROWS} rows (sorted table)"))
        rows = "\n".join(json.dumps({"actor": f"user-{i % 7}", "action": f"action {i}"}) for i in range(AUDIT_ROWS))
        self.yt(audit.spec.cluster, "insert-rows", audit.spec.path, "--format", "json", stdin=rows)
        print(display(f"   yt insert-rows {audit.spec.path} --format json: {AUDIT_ROWS} rows (ordered table)"))
        first = self.yt(SYNC_CLUSTER, "select-rows", f"* from [{events.spec.path}] where id = 1", "--format", "json")
        print(display(f"   yt select-rows on remote-0: {first.strip()}"))

    def show_replicas(self) -> None:
        self.announce("show the rows on every replica",
                      "the sync replica got them in the commit, the replicator pushed them to the async one, "
                      "exactly once and in commit order")
        self.replica_counts(SORTED_TABLE, EVENT_ROWS)
        self.replica_counts(ORDERED_TABLE, AUDIT_ROWS)
        self.facts.append(f"{EVENT_ROWS} + {AUDIT_ROWS} rows on every replica")

    def failover(self) -> None:
        self.announce(f"kill the sync replica's cluster ({SYNC_CLUSTER}) while writing",
                      "a write needs its sync replica; the tracker sees the cluster fail and makes the healthy "
                      f"async replica on {FALLBACK_CLUSTER} sync (both collocated tables move together), so "
                      "writes go on")
        if self.sync_replicas(SORTED_TABLE) != [f"{SORTED_TABLE}-{SYNC_CLUSTER}"]:
            raise StepFailed(f"the sync replica of {SORTED_TABLE} is {self.sync_replicas(SORTED_TABLE)}, "
                             f"not {SORTED_TABLE}-{SYNC_CLUSTER}")
        writer = Writer(self.yt_client(self.table(SORTED_TABLE).spec.cluster), self.table(SORTED_TABLE).spec.path)
        writer.start()
        try:
            self.wait("the first writes", lambda: writer.ok >= 20, 30, reconcile=False)
            print(f"   writing one row at a time from a thread (yt.wrapper): {writer.ok} writes so far")
            self.runner.processes[SYNC_CLUSTER].kill()
            at_kill = writer.ok
            print(f"   killed the engine of {SYNC_CLUSTER} (SIGKILL) after {at_kill} successful writes")
            target = f"{SORTED_TABLE}-{FALLBACK_CLUSTER}"
            took = self.wait(f"the tracker moving the sync replica of {SORTED_TABLE} to {FALLBACK_CLUSTER}",
                             lambda: self.sync_replicas(SORTED_TABLE) == [target], 60)
            at_switch = writer.ok
            print(f"   the sync replica moved to {FALLBACK_CLUSTER}: {SORTED_TABLE} sync={target}, "
                  f"{ORDERED_TABLE} sync={','.join(self.sync_replicas(ORDERED_TABLE)) or '-'} "
                  f"({took:.1f} s after the kill; {writer.failed} writes were refused meanwhile)")
            self.wait("writes after the switch", lambda: writer.ok >= at_switch + 20, 30, reconcile=False)
            writer.stop()
            after = writer.ok - at_kill
            print(f"   writes continued: {at_kill} before the kill, {after} after it "
                  f"({writer.ok} successful writes, {writer.failed} refused while {SYNC_CLUSTER} was the dead sync "
                  f"replica)")
            if after <= 0:
                raise StepFailed("no write succeeded after the kill")
            self.facts.append(f"sync replica moved {SYNC_CLUSTER} -> {FALLBACK_CLUSTER} {took:.1f} s after the kill; "
                              f"writes continued ({at_kill} before, {after} after)")
        finally:
            writer.stop()
        print(f"   starting {SYNC_CLUSTER} again; the replicator sends it what it missed")
        self.runner.processes[SYNC_CLUSTER].start()
        total = EVENT_ROWS + writer.ok
        counts = self.replica_counts(SORTED_TABLE, total, timeout=90)
        print(f"   {SYNC_CLUSTER} caught up: {counts[f'{SORTED_TABLE}-{SYNC_CLUSTER}']} rows, like {FALLBACK_CLUSTER}")
        back = [f"{SORTED_TABLE}-{SYNC_CLUSTER}"]
        try:
            self.wait("the sync replica returning to the preferred cluster",
                      lambda: self.sync_replicas(SORTED_TABLE) == back, 20)
            print(f"   healthy again, the preferred cluster {SYNC_CLUSTER} got the sync replica back: "
                  f"{SORTED_TABLE} sync={','.join(self.sync_replicas(SORTED_TABLE))}")
        except StepFailed:
            print(f"   {SORTED_TABLE} sync={','.join(self.sync_replicas(SORTED_TABLE))}")
        self.expected_rows = total

    def bootstrap(self) -> None:
        self.announce(f"add a replica of {SORTED_TABLE} after its history was trimmed",
                      "with minReplicationLogTtl 0s the meta-cluster drops queued rows every replica has; a new "
                      "replica cannot replay them, so the operator bootstraps it with a Spark copy at a timestamp T")
        events = self.table(SORTED_TABLE)
        meta = self.runner.engines.client(events.spec.cluster)

        def trimmed() -> int:
            return sum(int(t.get("trimmed_row_count", 0)) for t in meta.get(f"{events.spec.path}/@tablets"))

        self.wait(f"the queue of {events.spec.path} being trimmed", lambda: trimmed() > 0, 60)
        print(display(f"   the replication queue of {events.spec.path} was trimmed: {trimmed()} rows are gone from it"))
        doc = {"apiVersion": "reptables.io/v1alpha1", "kind": "TableReplica", "metadata": {"name": NEW_REPLICA},
               "spec": {"table": SORTED_TABLE, "cluster": SYNC_CLUSTER, "replicaPath": NEW_REPLICA_PATH,
                        "mode": "async", "bootstrap": {"parallelism": 2}}}
        print(f"   new TableReplica {NEW_REPLICA}: {SORTED_TABLE} on {SYNC_CLUSTER} at {NEW_REPLICA_PATH}")
        self.runner.add(doc)  # as if its manifest had been applied
        seen: list[BootstrapPhase] = []

        def phase() -> BootstrapPhase | None:
            boot = self.replica(NEW_REPLICA).status.get("bootstrap") or {}
            now = phase_of(boot)
            if now is not None and (not seen or seen[-1] is not now):
                order = list(PHASE_WHY)
                if seen and seen[-1] in order and now in order:
                    # a phase can start and end within one reconcile pass (its event is printed above)
                    for passed in order[order.index(seen[-1]) + 1:order.index(now)]:
                        seen.append(passed)
                        print(f"   bootstrap phase {passed} (passed within one reconcile): {PHASE_WHY[passed]}")
                seen.append(now)
                print(f"   bootstrap phase {now}: {PHASE_WHY.get(now, '')}", flush=True)
            if now is BootstrapPhase.FAILED:
                raise StepFailed(f"the bootstrap of {NEW_REPLICA} failed: {boot.get('lastError', '')}")
            return now

        self.wait(f"the bootstrap of {NEW_REPLICA}", lambda: phase() is BootstrapPhase.DONE, 240)
        copied = (self.replica(NEW_REPLICA).status.get("bootstrap") or {}).get("rowsCopied")
        count = 0

        def holds_all() -> bool:
            nonlocal count
            count = self.count(SYNC_CLUSTER, NEW_REPLICA_PATH)
            return count == self.expected_rows

        self.wait(f"{self.expected_rows} rows in {NEW_REPLICA_PATH}", holds_all, 60)
        print(f"   bootstrap Done: {copied} rows copied by Spark; {NEW_REPLICA} holds {count} of "
              f"{self.expected_rows} rows (phases: {' -> '.join(seen)})")
        self.facts.append(f"{NEW_REPLICA} bootstrapped ({' -> '.join(seen)}), {count} rows")

    def queue_check(self) -> None:
        self.announce(f"check the replication queue of {SORTED_TABLE}",
                      "the seed's procedure before re-creating a replicated table: freeze it, wait until every "
                      "tablet is frozen, then for each replica compare flushed_row_count with "
                      "current_replication_row_index per tablet")
        events = self.table(SORTED_TABLE)
        client = self.yt_client(events.spec.cluster)
        client.freeze_table(events.spec.path)
        print(display(f"   freeze-table {events.spec.path}"))
        try:
            self.wait("tablet_state frozen",
                      lambda: client.get(f"{events.spec.path}/@tablet_state") == TabletState.FROZEN, 30,
                      reconcile=False)
            print("   @tablet_state: frozen")
            for rep in self.replicas(SORTED_TABLE):
                replica_id = rep.status.get("replicaId")
                tablets: list[dict[str, Any]] = []

                def caught_up(rid: Any = replica_id, tablets: list[dict[str, Any]] = tablets) -> bool:
                    tablets[:] = list(client.get(f"#{rid}/@tablets"))
                    return all(t.get("flushed_row_count") == t.get("current_replication_row_index") for t in tablets)

                self.wait(f"replica {rep.name} to replicate the whole queue", caught_up, 60, reconcile=False)
                pairs = ", ".join(f"tablet {i}: {t.get('flushed_row_count')} = {t.get('current_replication_row_index')}"
                                  for i, t in enumerate(tablets))
                print(f"   #{replica_id}/@tablets ({rep.name}): flushed_row_count = "
                      f"current_replication_row_index ({pairs})")
            print("   queue check: equal for every replica and tablet: every change reached every replica")
        finally:
            client.unfreeze_table(events.spec.path)
            self.wait("tablet_state mounted",
                      lambda: client.get(f"{events.spec.path}/@tablet_state") == TabletState.MOUNTED, 30,
                      reconcile=False)
            print(display(f"   unfreeze-table {events.spec.path}: mounted again"))
        self.facts.append("queue check: flushed_row_count == current_replication_row_index on every replica")


class Writer:
    """Writes one row at a time to a table from a thread, counting the writes that succeed and fail."""

    def __init__(self, client: YtClient, path: str, first_id: int = 1_000_000) -> None:
        self.client = client
        self.path = path
        self.next_id = first_id
        self.ok = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tour-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            row = {"id": self.next_id, "kind": "live", "payload": f"written during the failover {self.next_id}"}
            try:
                self.client.insert_rows(self.path, [row])
            except Exception:  # noqa: BLE001 - a refused write is what the tour counts, then retries
                self.failed += 1
                self._stop.wait(0.2)
                continue
            self.ok += 1
            self.next_id += 1
            self._stop.wait(0.02)


def _prepare(manifests: Path, data_dir: Path, ports_from: int | None) -> list[dict[str, Any]]:
    if not manifests.exists():
        raise ValueError(f"manifests {manifests}: no such file or directory")
    docs = load_manifests([manifests])
    clusters = [d for d in docs if d.get("kind") == "TableCluster"]
    for i, doc in enumerate(clusters):
        endpoint = str(doc.get("spec", {}).get("endpoint", ""))
        if ports_from is not None:
            port = free_port() if ports_from == 0 else ports_from + i
            doc["spec"]["endpoint"] = f"http://127.0.0.1:{port}"
            continue
        url = urlparse(endpoint)
        if url.port is not None and _in_use(url.port):
            raise ValueError(f"TableCluster {doc['metadata'].get('name')}: port {url.port} of {endpoint} is in use "
                             f"(another `reptables up`?); stop it or run the tour with --free-ports")
    if data_dir.exists() and any(data_dir.iterdir()):
        if not (data_dir / MARKER).exists():
            raise ValueError(f"data directory {data_dir} is not empty and was not made by the tour; "
                             f"give another --data-dir")
        shutil.rmtree(data_dir)  # the tour starts from empty clusters every time
    notice = make_private_dir(data_dir)
    if notice is not None:
        print(display(notice), file=sys.stderr)
    write_private(data_dir / MARKER,
                  "made by python -m reptables.operator.local.tour; removed when the tour runs again\n")
    return docs


def _in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run_tour(data_dir: Path, manifests: Path = QUICKSTART, ports_from: int | None = None) -> int:
    """Run the tour; 0 when every step showed what it promises, 1 (with the failed step and why) if not.

    ``ports_from``: None keeps the manifests' endpoints, 0 picks a free loopback port per cluster,
    a port N puts the clusters on N, N+1, ...
    """
    began = time.monotonic()
    yt_cli = Path(sys.executable).parent / "yt"
    try:
        if not yt_cli.exists():
            raise ValueError(f"the official yt CLI is not at {yt_cli}: install ytsaurus-client into this Python")
        docs = _prepare(manifests, data_dir, ports_from)
        runner = LocalRunner(docs, data_dir)
    except (ValueError, RuntimeError) as exc:
        print(display(f"the tour could not start: {exc}", multiline=True), file=sys.stderr)
        return 1
    tour = Tour(runner, yt_cli)
    print(display(f"reptables tour: manifests {manifests}, data in {data_dir}"))
    try:
        for step in (tour.start, tour.write, tour.show_replicas, tour.failover, tour.bootstrap, tour.queue_check):
            step()
        tour.announce("stop everything", "the engines and the Spark jobs the tour started are stopped")
        runner.reconcile_all()
        runner.print_status()
    except KeyboardInterrupt:
        print(f"\nthe tour was interrupted in step {tour.step} ({tour.title})", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any failure ends the tour with its step and reason
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"\nstep {tour.step} ({tour.title}) failed: {display(reason)}", file=sys.stderr)
        print(f"(engine logs: {data_dir}/<cluster>/engine.log)", file=sys.stderr)
        return 1
    finally:
        runner.stop()
    print(f"\nThe tour passed in {time.monotonic() - began:.0f} s:")
    for fact in tour.facts:
        print(f"  - {fact}")
    print("Next: docs/getting-started.md (`reptables up examples/quickstart`, the yt CLI, Kubernetes with Helm)")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.operator.local.tour",
                                     description="Show what reptables does, step by step, on this machine.")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="where the engines keep their data (wiped at the start of each tour)")
    parser.add_argument("--manifests", type=Path, default=QUICKSTART, help="the quickstart manifests")
    parser.add_argument("--free-ports", action="store_true",
                        help="put the clusters on free loopback ports instead of the manifests' 9012-9014")
    args = parser.parse_args(argv)
    # SIGTERM ends the tour like Ctrl-C: the engines it started are stopped on the way out
    signal.signal(signal.SIGTERM, _terminate)
    os.umask(0o077)  # what the tour, its engines and Spark jobs create is private, as under `reptables up`
    return run_tour(args.data_dir, args.manifests, 0 if args.free_ports else None)


if __name__ == "__main__":
    sys.exit(main())
