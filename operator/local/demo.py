"""The demo of `reptables up` (``LocalRunner.demo``): rows written with the official client to every
replicated table and XDCR group of the manifests, and shown on every copy.

Kept apart from ``runner.py`` (the runner: engines, manifests, reconciles, state) because it is what
a user watches, not how the product runs; it only reads the runner's registry and engines and asks
it for another reconcile pass while it waits, which is all :class:`Runner` says (so this module
never imports the runner that calls it). Its lines name paths from the manifests and quote the
engines: they go through :func:`~reptables.operator.terminal.display`, as every line of ``up`` does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ..controllers.world import Engines, Resource
from ..registry import Registry
from ..terminal import display

if TYPE_CHECKING:
    from yt.wrapper import YtClient  # the official client (no type information of its own)


class Runner(Protocol):
    """What the demo needs of the local runner."""

    @property
    def registry(self) -> Registry: ...

    @property
    def engines(self) -> Engines: ...

    def reconcile_all(self) -> None:
        """One reconcile pass (the tracker too): the demo waits for the engines to converge."""
        ...


def demo(runner: Runner, rows: int = 1000) -> list[str]:
    """Write rows to every replicated table with the official client; show every replica gets them.
    The tables written (CLUSTER:PATH)."""
    import yt.wrapper as yt

    written: list[str] = []
    for table in runner.registry.of_kind("ReplicatedTable"):
        ref = runner.engines.ref(table.spec.cluster)
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
                print(display(f"  waiting to write {table.spec.path}: {str(exc).splitlines()[0]}"))
                runner.reconcile_all()
                time.sleep(0.2)
        written.append(f"{table.spec.cluster}:{table.spec.path}")
        print(display(f"wrote {rows} rows to {table.spec.cluster}:{table.spec.path} with yt.wrapper"))
        for replica in runner.registry.of_kind("TableReplica"):
            if replica.spec.table != table.name or not replica.spec.enabled:
                continue
            rref = runner.engines.ref(replica.spec.cluster)
            rclient = yt.YtClient(proxy=rref.endpoint, token=rref.token)
            query = f"sum(1) as n from [{replica.spec.replica_path}] group by 1"
            count = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                found = list(rclient.select_rows(query))
                count = found[0]["n"] if found else 0
                if count >= rows:
                    break
                runner.reconcile_all()
                time.sleep(0.2)
            mode = runner.engines.client(table.spec.cluster).get(f"#{replica.status.get('replicaId')}/@mode")
            print(display(f"  replica {replica.name} on {replica.spec.cluster} ({mode}): {count} rows"))
        if keys:
            _show_lookup(runner, client, table, {k.name: 0 for k in keys})
    for group in runner.registry.of_kind("XdcrGroup"):
        written += _demo_xdcr(runner, group, rows)
    return written


def _demo_xdcr(runner: Runner, group: Resource, rows: int) -> list[str]:
    """Active-active: each member writes its own rows to every XDCR table; every member gets them all."""
    import yt.wrapper as yt

    members = list(group.spec.members)
    if group.spec.paused or not members:
        print(display(f"XdcrGroup {group.name} is paused: client writes are refused, nothing written"))
        return []
    clients = {m: yt.YtClient(proxy=runner.engines.ref(m).endpoint, token=runner.engines.ref(m).token)
               for m in members}
    per_member = max(1, rows // len(members))
    for table in group.spec.tables:
        for index, (member, client) in enumerate(clients.items()):
            batch = [_demo_row(table.table_schema, index * per_member + i) for i in range(per_member)]
            client.insert_rows(table.path, batch)
            print(display(f"wrote {per_member} rows to {member}:{table.path} with yt.wrapper"))
        total = per_member * len(members)
        query = f"sum(1) as n from [{table.path}] group by 1"
        for member, client in clients.items():
            count = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                found = list(client.select_rows(query))
                count = found[0]["n"] if found else 0
                if count >= total:
                    break
                time.sleep(0.2)
            print(display(f"  {member}:{table.path} (XDCR group {group.name}): {count} of {total} rows"))
    return [f"{member}:{table.path}" for table in group.spec.tables for member in members]

def _show_lookup(runner: Runner, client: YtClient, table: Resource, key: dict[str, Any]) -> None:
    """A read of the replicated table is served by its in-sync sync replica (once the tracker made one)."""
    # the official client retries "no in-sync replicas" for minutes by itself; here the runner
    # must keep reconciling (the tracker promotes the sync replica), so it asks once per pass
    import yt.common as yt_errors

    client.config["dynamic_table_retries"]["enable"] = False
    deadline = time.monotonic() + 60
    while True:
        try:
            found = list(client.lookup_rows(table.spec.path, [key]))
            print(display(f"  lookup {key} on {table.spec.path} (served by the sync replica): {found}"))
            return
        except yt_errors.YtError as exc:
            if time.monotonic() > deadline:
                raise
            inner = exc.inner_errors[0].get("message") if exc.inner_errors else exc.message
            print(display(f"  waiting for an in-sync replica (the tracker picks one): {inner}"))
            runner.reconcile_all()
            time.sleep(0.5)



def _demo_row(schema: list[Any], i: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for col in schema:
        value: Any = {"int64": i, "uint64": i, "double": i * 1.5, "boolean": i % 2 == 0,
                      "string": f"{col.name}-{i}", "any": {"i": i}}[col.type.value]
        row[col.name] = value
    return row


