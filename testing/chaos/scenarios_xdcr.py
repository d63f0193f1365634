"""Scenarios of XDCR groups: members that all write, and the faults that make their clocks and links lie.

Why XDCR needs its own: every member takes writes, so a partition does not stop writes - it makes
conflicts, and the rule that resolves them ("later version wins", versions from each member's own
clock) is exactly what clock skew bends. Each scenario builds a group (:func:`xdcr_group`) of
``a``, ``b``, ``c`` (cluster ids 1-3) with one table, ``//chaos/users``, written by
:class:`~.workloads.XdcrWorkload` on every member and read as a change stream on every member:

* ``xdcr-partitions``: one member split from the others, one-way cuts, lossy links, SIGKILL and
  SIGSTOP of members;
* ``xdcr-clock``: ``a`` runs 5 s ahead and ``b`` 5 s behind from the start, and members' clocks jump
  by +-10 s and +-30 s while partitions make conflicts;
* ``xdcr-drain``: ``dr_pause`` (which waits for the drain) on one member after another while links
  fail; a pause that says "drained" is checked against the peers' logs at once;
* ``xdcr-join``: ``a`` and ``b`` form the group with trimmed logs; a new engine joins from a
  snapshot (the ``dr_join_*`` commands the Spark job runs) while the donor or the joiner is killed
  or cut off, writes for a while, leaves with ``dr_drop``, and the next one joins.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.testing.engines import USERS_SCHEMA
from reptables.testing.waits import wait_for

from .cluster import ChaosEngines, NetnsEngine
from .history import OpType
from .nemesis import ClockOffset, Fault, FaultGenerator, Kill, Lossy, Partition, Pause
from .runner import RunContext, Scenario
from .scenarios import done, mixed, respawn
from .workloads import StreamWorkload, Tables, XdcrWorkload, pull_all

__all__ = ["XDCR_SCENARIOS", "xdcr_group"]

USERS = "//chaos/users"
MEMBERS = ("a", "b", "c")


def xdcr_group(ctx: RunContext, names: tuple[str, ...] = MEMBERS, clocks: dict[str, float] | None = None,
               table_attributes: dict[str, Any] | None = None, logs: bool = True) -> ChaosEngines:
    """Members ``names`` (ids 1..n, clocks at ``clocks`` offsets), connected, with ``//chaos/users``,
    its workload and a stream consumer per member."""
    engines = ctx.run.engines(names, cluster_ids=True, clocks=clocks)
    ctx.engines = engines
    ctx.tables = Tables(urls={n: e.url for n, e in engines.engines.items()},
                        tokens={n: e.read_token() for n, e in engines.engines.items()}, meta=names[0])
    engines.connect()
    for name in names:
        engines.client(name).create("table", USERS, recursive=True, attributes={
            "dynamic": True, "schema": USERS_SCHEMA, "xdcr": True, **(table_attributes or {})})
        engines.client(name).mount_table(USERS)
    ctx.workload(XdcrWorkload("xdcr", ctx.history, USERS, {n: i for i, n in enumerate(names, start=1)}, logs=logs))
    if logs:
        for name in names:
            ctx.workload(StreamWorkload(f"stream_{name}", ctx.history, name, USERS, "xdcr", "xdcr", name,
                                        key_column="id", value_column="name"))
    ctx.converge = converge_xdcr
    return engines


def _members(ctx: RunContext) -> list[str]:
    workload = next(w for w in ctx.workloads if isinstance(w, XdcrWorkload))
    return sorted(workload.members)


def converge_xdcr(ctx: RunContext, timeout: float) -> None:
    """Until no member owes a peer a change and every member holds the same rows (twice in a row)."""
    assert ctx.tables is not None
    members = _members(ctx)
    clients = {m: ctx.tables.client(m, timeout=10.0) for m in members}
    try:
        def settled() -> bool:
            for client in clients.values():
                peers = client.dr_status()["peers"]
                if any(p["queued_rows"] for p in peers.values()):
                    return False
            contents = [client.select_rows(f"* from [{USERS}]", output_row_limit=10_000_000)
                        for client in clients.values()]
            return all(c == contents[0] for c in contents)

        wait_for(lambda: settled() and settled(), timeout, "the XDCR members to drain and converge", interval=0.5)
    finally:
        for client in clients.values():
            client.close()


def xdcr_faults(ctx: RunContext) -> FaultGenerator:
    """A member split from the others (and maybe from its clients), one-way cuts, lossy links,
    SIGKILL and SIGSTOP of members."""
    engines, net = ctx.engines, ctx.run.network
    assert engines is not None

    def generate(rng: random.Random) -> tuple[Fault, float]:
        members = [m for m in _members(ctx) if m in engines.engines]
        node = rng.choice(members)
        others = [m for m in members if m != node]
        choice = rng.randrange(7)
        hold = rng.uniform(4.0, 12.0)
        if choice == 0:
            return Partition(net, "split", [node], others, note="member split from the group"), hold
        if choice == 1:
            return Partition(net, "isolate", [node], from_host=True, note="member cut from everything"), hold
        if choice == 2 and others:
            return Partition(net, "one_way", [node, rng.choice(others)]), hold
        if choice == 3:
            return Lossy(net, node, rng.choice((20, 40))), hold
        engine = engines.engine(node)
        if choice in (4, 5):
            return Kill(node, engine, respawn(engine)), rng.uniform(2.0, 8.0)
        return Pause(node, engine), rng.uniform(2.0, 8.0)

    return generate


def xdcr_clocks(ctx: RunContext, base: dict[str, float]) -> FaultGenerator:
    """Jumps of a member's clock by +-10 s or +-30 s from its skew (healing jumps it back)."""
    engines = ctx.engines
    assert engines is not None

    def generate(rng: random.Random) -> tuple[Fault, float]:
        node = rng.choice(MEMBERS)
        offset = base.get(node, 0.0) + rng.choice((10.0, -10.0, 30.0, -30.0))
        return ClockOffset(node, engines.clocks[node], offset, base.get(node, 0.0)), rng.uniform(5.0, 15.0)

    return generate


# -- dr_pause drains ---------------------------------------------------------------------------


def drain_loop(ctx: RunContext, stop: threading.Event) -> None:
    """``dr_pause`` with its wait on one member after another; when it answers "drained", every peer is
    asked at once which of the member's changes it lacks (the answer is the history's ``drain-check``)."""
    assert ctx.tables is not None
    tables, rng = ctx.tables, random.Random(ctx.seed + 13)
    while not stop.wait(rng.uniform(3.0, 8.0)):
        member = rng.choice(MEMBERS)
        process = ctx.history.process("drain")
        invoked = ctx.history.invoke(process, "pause", {"member": member})
        try:
            with tables.client(member, timeout=20.0) as client:
                client.dr_pause(wait=True, timeout=8000)
        except YtError as exc:
            ctx.history.complete(invoked, OpType.FAIL, error=str(exc).splitlines()[0][:300])
        else:
            ctx.history.complete(invoked, OpType.OK)
            try:
                ctx.history.record(process, "drain-check", {"workload": "xdcr", "member": member,
                                                            "missing": _undelivered(tables, member)})
            except YtError as exc:
                ctx.history.info(process, "drain-check-failed", str(exc)[:300])
        # resume whatever happened (a pause that timed out stays paused)
        wait_for(done(partial(_resume, tables, member)), 120, f"dr_resume of {member}", interval=0.5)


def _resume(tables: Tables, member: str) -> None:
    with tables.client(member, timeout=10.0) as client:
        client.dr_resume()


def _undelivered(tables: Tables, member: str) -> dict[str, Any]:
    """For each peer, the member's own changes the peer has neither applied nor rejected (and under
    ``compared``, how many own changes were looked for)."""
    with tables.client(member, timeout=30.0) as client:
        own_id = client.dr_status()["cluster_id"]
        own = {(e.get("origin_cluster_id"), e.get("origin_timestamp")) for e in pull_all(client, USERS, 1 << 30)
               if e.get("origin_cluster_id") == own_id}
    missing: dict[str, Any] = {"compared": len(own)}
    for peer in MEMBERS:
        if peer == member:
            continue
        with tables.client(peer, timeout=30.0) as client:
            have = {(e.get("origin_cluster_id"), e.get("origin_timestamp"))
                    for e in pull_all(client, USERS, 1 << 30) if e.get("origin_cluster_id") == own_id}
            have |= {(r["CLUSTER_ID"], r["TIMESTAMP"]) for r in client.select_rows(
                "CLUSTER_ID, TIMESTAMP, ROW_TYPE, DECISION, TABLE_NAME from [//sys/xdcr_conflicts]",
                output_row_limit=10_000_000)
                if r["TABLE_NAME"] == USERS and r["ROW_TYPE"] in ("NEW", "DEL") and r["DECISION"] == "R"}
        missing[peer] = [list(v) for v in sorted(own - have, key=str)]
    return missing


# -- joins from a snapshot ---------------------------------------------------------------------

JOIN_BASE = ("a", "b")


def _publish(clients: dict[str, Client], engines: dict[str, NetnsEngine]) -> None:
    """Every engine's ``//sys/clusters``: exactly ``engines``, each with the credential for the pair."""
    for caller, client in clients.items():
        client.set("//sys/clusters", {name: {"proxy_url": e.url, "token": peer_credential(e.read_token(), caller)}
                                      for name, e in engines.items()})


def _join(client: Client, path: str, donor: str, at_page: Callable[[int], None]) -> dict[str, Any]:
    """What the Spark job does (``reptables.sparkapps.xdcr_join``), page by page in this thread;
    ``at_page(n)`` is called before the n-th page this call loads."""
    begun = client.dr_join_begin(path, source=donor, page_rows=20)
    for n, page in enumerate(begun["missing_pages"]):
        at_page(n)
        client.dr_join_write(path, page, client.dr_join_read(path, page)["entries"])
    finished = client.dr_join_finish(path)
    return {"pages": begun["pages"], "resumed_at": len(begun["loaded_pages"]), "joined": finished["joined"]}


def join_loop(ctx: RunContext, stop: threading.Event) -> None:
    """New engines join ``//chaos/users`` of ``a`` and ``b`` from a snapshot, one after another, while the
    donor or the joiner is killed, paused or cut off; each writes for a while and leaves (``dr_drop``)."""
    workload = next(w for w in ctx.workloads if isinstance(w, XdcrWorkload))
    rng = random.Random(ctx.seed + 17)
    current: NetnsEngine | None = None
    for n in itertools.count(1):
        if stop.is_set():
            return
        if current is not None:
            _leave(ctx, workload, current)
        current = _one_join(ctx, workload, f"j{n}", 2 + n, rng)
        stop.wait(rng.uniform(10.0, 20.0))


def _one_join(ctx: RunContext, workload: XdcrWorkload, name: str, cluster_id: int, rng: random.Random) -> NetnsEngine:
    assert ctx.engines is not None and ctx.tables is not None and ctx.nemesis is not None
    nemesis, tables = ctx.nemesis, ctx.tables
    joiner = ctx.run.engines([name], extra_args=["--cluster-id", str(cluster_id)]).engine(name)
    tables.urls[name], tables.tokens[name] = joiner.url, joiner.read_token()
    engines = {**{m: ctx.engines.engine(m) for m in JOIN_BASE}, name: joiner}
    clients = {m: tables.client(m, timeout=10.0) for m in engines}
    try:
        wait_for(done(partial(_publish, clients, engines)), 60, "the directories with the joiner")
        clients[name].create("table", USERS, recursive=True, attributes={
            "dynamic": True, "schema": USERS_SCHEMA, "xdcr": True, "change_retention": 1})
        clients[name].mount_table(USERS)
        for member, client in clients.items():
            wait_for(done(partial(client.set, "//sys/@xdcr_connections", [m for m in engines if m != member])),
                     60, f"the connections of {member}")
        donor = rng.choice(JOIN_BASE)
        strike = _join_fault(ctx, rng, joiner, name, donor)
        hold, strike_at = rng.uniform(2.0, 6.0), rng.randrange(4)
        attempts = 0
        started = time.monotonic()

        def at_page(n: int) -> None:
            if attempts == 1 and n == strike_at:  # the fault strikes in the middle of the first attempt
                nemesis.inject(strike, hold)

        def attempt() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            return _join(clients[name], USERS, donor, at_page)

        outcome = wait_for(attempt, 240, f"{name} to join from {donor}", interval=1.0)
        ctx.history.info("join", "joined", {"member": name, "donor": donor, "fault": strike.describe(),
                                            "seconds": round(time.monotonic() - started, 1), "attempts": attempts,
                                            **outcome})
        workload.add(name, cluster_id)
    except TimeoutError as exc:
        ctx.anomalies.append(f"{name} could not join from a snapshot: {exc}")
        ctx.history.info("join", "failed", {"member": name, "error": str(exc)[:500]})
    finally:
        for client in clients.values():
            client.close()
    return joiner


def _join_fault(ctx: RunContext, rng: random.Random, joiner: NetnsEngine, name: str, donor: str) -> Fault:
    assert ctx.engines is not None
    net, donor_engine = ctx.run.network, ctx.engines.engine(donor)
    choice = rng.randrange(4)
    if choice == 0:
        return Kill(name, joiner, respawn(joiner))
    if choice == 1:
        return Kill(donor, donor_engine, respawn(donor_engine))
    if choice == 2:
        return Partition(net, "split", [name], [donor], note="joiner cut from its donor")
    return Pause(donor, donor_engine)


def _leave(ctx: RunContext, workload: XdcrWorkload, joiner: NetnsEngine) -> None:
    """The joiner leaves the group (``dr_drop``: it drains to every member, which forget it), then stops."""
    assert ctx.tables is not None
    name = joiner.cluster_name
    if name not in workload.members:
        joiner.stop()
        return
    workload.remove(name)
    with ctx.tables.client(name, timeout=90.0) as client:
        try:
            wait_for(done(partial(client.dr_drop, timeout=30_000)), 180, f"{name} to leave the group", interval=1.0)
            ctx.history.info("join", "left", {"member": name})
        except TimeoutError as exc:
            ctx.anomalies.append(f"{name} could not leave the group: {exc}")
    joiner.stop()


# -- the scenarios -----------------------------------------------------------------------------

SKEWS = {"a": 5.0, "b": -5.0}


def _build(generator: Callable[[RunContext], FaultGenerator] | None,
           activities: tuple[Callable[[RunContext, threading.Event], None], ...] = (),
           clocks: dict[str, float] | None = None,
           gap: tuple[float, float] = (2.0, 6.0)) -> Callable[[RunContext], None]:
    def build(ctx: RunContext) -> None:
        xdcr_group(ctx, clocks=clocks)
        ctx.generator = generator(ctx) if generator is not None else None
        ctx.gap = gap
        ctx.activities.extend(activities)

    return build


def _build_join(ctx: RunContext) -> None:
    xdcr_group(ctx, JOIN_BASE, table_attributes={"change_retention": 1}, logs=False)
    ctx.generator = xdcr_faults(ctx)
    ctx.gap = (4.0, 10.0)
    ctx.activities.append(join_loop)


XDCR_SCENARIOS = [
    Scenario("xdcr-partitions", "a member split from the group or cut from everything, one-way cuts, lossy links, "
             "SIGKILL and SIGSTOP of members", _build(xdcr_faults)),
    Scenario("xdcr-clock", "a 5 s ahead and b 5 s behind from the start; members' clocks jump by +-10/30 s while "
             "partitions make conflicts", _build(lambda ctx: mixed(xdcr_clocks(ctx, SKEWS), xdcr_faults(ctx)),
                                                 clocks=SKEWS)),
    Scenario("xdcr-drain", "dr_pause (waiting for the drain) on one member after another while links fail and "
             "members crash; every drained pause checked against the peers at once",
             _build(xdcr_faults, (drain_loop,))),
    Scenario("xdcr-join", "new members join from a snapshot while the donor or the joiner is killed, paused or "
             "cut off; each writes, then leaves with dr_drop", _build_join),
]
