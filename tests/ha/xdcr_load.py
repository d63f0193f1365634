"""The set-up, the writers and the checks of the HA XDCR tests (test_ha_xdcr.py; its primary kill in
test_postgres_failover.py): see test_ha_xdcr.py's docstring for what they promise.

* :func:`build`: on members a, b, c (a a leader and standbys or not), the XDCR table ``//home/users``
  with a few shared keys, and the replicated tables ``//tmp/orders`` (meta-cluster a, sync replica on
  b, async on c) and ``//tmp/inbox`` (meta-cluster b, sync and async replicas on a);
* :class:`Load`: writers on every member and table, each through a client given every engine of its
  member, one new key per commit (and updates of the shared keys: conflicts);
* :func:`check_group`: every acknowledged write once everywhere it belongs, nothing that failed, the
  group converged, the conflict log consistent, the peers' directories unchanged.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError, never_sent
from reptables.engine.errors import YtError
from reptables.testing import KV_SCHEMA, TEST_TOKEN, USERS_SCHEMA, EngineProcess, EngineSet, WaitTimeout, wait_for

MEMBERS = ("a", "b", "c")
USERS = "//home/users"
ORDERS = "//tmp/orders"
INBOX = "//tmp/inbox"
INBOX_ASYNC = "//tmp/inbox_async"
#: keys of the XDCR table every member updates (their conflicts); fresh keys are above
SHARED = range(1, 21)
#: keys sent to a replaced leader: none may be anywhere
OLD_LEADER_KEYS = range(900_000_000, 900_000_010)


def build(engines: EngineSet) -> EngineSet:
    """On a started set of members a, b, c: the XDCR table with its shared keys, connected; the two
    replicated tables with their replicas enabled and the sync ones in sync."""
    engines.table(USERS, USERS_SCHEMA)
    for name in MEMBERS:  # the shared keys, on every member before the connections
        engines.client(name).insert_rows(USERS, [{"id": k, "name": "first", "password": "p"} for k in SHARED])
    engines.connect()
    # //tmp/orders: meta-cluster a, sync replica on b, async on c
    engines.replicated_table(ORDERS)
    orders_sync = engines.replica(ORDERS, "b", ORDERS, mode="sync")
    engines.replica(ORDERS, "c", ORDERS, mode="async")
    engines.wait_in_sync(orders_sync)
    # //tmp/inbox: meta-cluster b, sync and async replicas on a
    b, a = engines.client("b"), engines.client("a")
    b.create("replicated_table", INBOX, attributes={"dynamic": True, "schema": KV_SCHEMA})
    b.mount_table(INBOX)
    for path, mode in ((INBOX, "sync"), (INBOX_ASYNC, "async")):
        replica_id = b.create("table_replica", attributes={"table_path": INBOX, "cluster_name": "a",
                                                           "replica_path": path, "mode": mode})
        a.create("table", path, attributes={"dynamic": True, "schema": KV_SCHEMA,
                                            "upstream_replica_id": replica_id}, recursive=True)
        a.mount_table(path)
        b.alter_table_replica(replica_id, enabled=True)
        wait_for(lambda r=replica_id: b.get(f"#{r}/@state") == "enabled", 60, f"replica {path} enabled")
    inbox_sync = next(r for r, v in b.get(f"{INBOX}/@replicas").items() if v["mode"] == "sync")
    wait_for(lambda: inbox_sync in b.get_in_sync_replicas(INBOX, b.generate_timestamp()), 60,
             "the inbox's sync replica in sync")
    wait_for(lambda: engines.converged(USERS), 60, "the shared keys everywhere")
    # the replica tables' change streams show a change applied twice: they keep a log (an XDCR table
    # always does)
    for name, path in (("b", ORDERS), ("c", ORDERS), ("a", INBOX), ("a", INBOX_ASYNC)):
        engines.client(name).set(f"{path}/@enable_change_log", True)
    return engines


# -- writers -------------------------------------------------------------------------------------------


class Writer(threading.Thread):
    """Inserts one new key per commit into ``path`` on one member until stopped: what was acknowledged
    (and by which engine), what failed (an error answer: nothing applied), what has no known outcome."""

    def __init__(self, client: Client, path: str, first_key: int, row: Callable[[int], dict[str, Any]],
                 shared: Callable[[int], dict[str, Any]] | None = None) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.key, self.row, self.shared = client, path, first_key, row, shared
        self.acked: list[tuple[int, float, str]] = []
        self.failed: dict[int, int] = {}
        self.unknown: list[int] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.key += 1
            try:
                self.client.insert_rows(self.path, [self.row(self.key)])
            except TransportError as exc:
                (self.failed.__setitem__(self.key, int(exc.code)) if never_sent(exc) else self.unknown.append(self.key))
                time.sleep(0.05)
                continue
            except YtError as exc:
                self.failed[self.key] = int(exc.code)
                time.sleep(0.05)
                continue
            self.acked.append((self.key, time.monotonic(), self.client.proxy_url))
            if self.shared is not None and self.key % 4 == 0:
                try:  # an update of a shared key (conflicts with the other members'); its outcome is not tracked
                    self.client.insert_rows(self.path, [self.shared(self.key)])
                except YtError:
                    pass
            time.sleep(0.01)

    def keys(self) -> set[int]:
        return {k for k, _, _ in self.acked}


class Load:
    """A writer per member on ``//home/users``, one on ``//tmp/orders`` (at ``a``), one on ``//tmp/inbox``
    (at ``b``); each its own client of every engine of its member."""

    def __init__(self, group: EngineSet, round_: int) -> None:
        self.group = group
        base = round_ * 10_000_000
        self.clients: list[Client] = []
        self.users = {name: Writer(self._client(name), USERS, base + i * 1_000_000 + 1000,
                                   lambda k, n=name: {"id": k, "name": f"{n}{k}", "password": "x"},
                                   lambda k, n=name: {"id": SHARED[k % len(SHARED)], "name": f"{n}-upd{k}",
                                                      "password": "y"})
                      for i, name in enumerate(MEMBERS)}
        self.orders = Writer(self._client("a"), ORDERS, base, lambda k: {"k": k, "v": f"v{k}"})
        self.inbox = Writer(self._client("b"), INBOX, base, lambda k: {"k": k, "v": f"v{k}"})
        self.writers = [*self.users.values(), self.orders, self.inbox]
        # where each change stream is read from: a timestamp of each member before the first write
        self.since = {name: group.client(name).generate_timestamp() for name in MEMBERS}

    def _client(self, name: str) -> Client:
        client = Client(self.group.urls(name), TEST_TOKEN, timeout=3)
        self.clients.append(client)
        return client

    def __enter__(self) -> Load:
        for writer in self.writers:
            writer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.stop_event.set()
        for writer in self.writers:
            writer.join(60)
        for client in self.clients:
            client.close()

    def acked_after(self, count: int, timeout: float, writers: list[Writer] | None = None) -> None:
        """Until each writer (of ``writers``, by default all) has ``count`` more acknowledged writes."""
        for writer in writers or self.writers:
            target = len(writer.acked) + count
            wait_for(lambda w=writer, t=target: len(w.acked) >= t, timeout,
                     f"{count} more acknowledged writes to {writer.path} at {writer.client.proxy_url}")

    def first_ack_after(self, moment: float, at: str) -> float:
        times = [t for w in (self.users["a"], self.orders) for _, t, url in w.acked if t > moment and url == at]
        assert times, f"no write was acknowledged by {at} after the fault"
        return min(times) - moment

    def summary(self) -> str:
        return ", ".join(f"{w.path}@{w.client.proxy_url.rsplit(':', 1)[1]}: {len(w.acked)} acked, "
                         f"{len(w.failed)} failed, {len(w.unknown)} unknown" for w in self.writers)


# -- checks --------------------------------------------------------------------------------------------


def stream_counts(client: Client, path: str, since: int, wanted: set[int], key: str) -> Counter[int]:
    """Events per key of ``path``'s change stream after timestamp ``since``, pulled until it holds every
    key of ``wanted``."""
    events: Counter[int] = Counter()
    position: dict[str, Any] = {"from_timestamp": since}

    def pulled_all() -> bool:
        answer = client.pull_changes(path, **position, max_row_count=100_000, wait_timeout=500)
        events.update(int(e["row"][key]) for e in answer["events"] if e["kind"] != "heartbeat" and "row" in e)
        position.clear()
        position["from_event_token"] = answer["event_token"]
        return wanted <= set(events)

    try:
        wait_for(pulled_all, 90, f"every acknowledged write in the change stream of {path} at {client.proxy_url}")
    except WaitTimeout as exc:
        # (what a diagnosis needs: which writes are missing, and where the stream stands - its token's
        # first 16 hex digits are the timestamp it has read up to)
        missing = sorted(wanted - set(events))
        raise AssertionError(f"{exc}: {len(missing)} of {len(wanted)} missing (first {missing[:10]}); the stream "
                             f"stands at {position.get('from_event_token')}; the engine's timestamp now "
                             f"{client.generate_timestamp():016x}") from None
    return events


def check_once(client: Client, path: str, since: int, writers: list[Writer], key: str, value: str,
               absent: set[int]) -> int:
    """On the table ``path`` behind ``client``: every acknowledged write of ``writers`` once, with its
    value; no failed write and no key of ``absent``. The number of rows checked."""
    acked = {k for w in writers for k in w.keys()}
    failed = {k for w in writers for k in w.failed}
    where = f"{path} at {client.proxy_url}"

    def present() -> dict[int, Any]:
        return {r[key]: r[value] for r in client.select_rows(f"{key}, {value} from [{path}]",
                                                             output_row_limit=10_000_000)}

    wait_for(lambda: acked <= set(present()), 90, f"every acknowledged write in {where}")
    rows = present()
    assert not set(rows) & failed, f"writes answered with an error are in {where}: {sorted(set(rows) & failed)[:10]}"
    assert not set(rows) & absent, f"writes sent to a replaced leader are in {where}: {sorted(set(rows) & absent)}"
    expected = {w.row(k)[key]: w.row(k)[value] for w in writers for k in w.keys()}
    wrong = {k: (rows[k], v) for k, v in expected.items() if rows[k] != v}
    assert not wrong, f"values that differ from the acknowledged ones in {where}: {dict(list(wrong.items())[:5])}"
    events = stream_counts(client, path, since, acked, key)
    twice = {k: n for k, n in events.items() if n > 1 and k in acked | failed}
    assert not twice, f"writes applied more than once in {where}: {dict(list(twice.items())[:10])}"
    return len(acked)


def check_group(group: EngineSet, load: Load, directories: dict[str, Any], absent: range = range(0)) -> None:
    """Everything the module docstring promises, after the writers stopped."""
    gone = set(absent)
    users = list(load.users.values())
    checked = {name: check_once(group.client(name), USERS, load.since[name], users, "id", "name", gone)
               for name in MEMBERS}
    # //tmp/orders on its replicas b (sync) and c (async); //tmp/inbox on its replicas at a
    check_once(group.client("b"), ORDERS, load.since["b"], [load.orders], "k", "v", gone)
    check_once(group.client("c"), ORDERS, load.since["c"], [load.orders], "k", "v", gone)
    check_once(group.client("a"), INBOX, load.since["a"], [load.inbox], "k", "v", gone)
    check_once(group.client("a"), INBOX_ASYNC, load.since["a"], [load.inbox], "k", "v", gone)
    # converged: the same rows everywhere, every pair connected with nothing queued
    wait_for(lambda: group.converged(USERS), 90, "the three members holding the same rows")

    def drained() -> bool:
        for name in MEMBERS:
            status = group.client(name).dr_status()
            if sorted(status["peers"]) != sorted(n for n in MEMBERS if n != name):
                return False
            if any(p["state"] != "connected" or p["queued_rows"] for p in status["peers"].values()):
                return False
        return True

    try:
        wait_for(drained, 60, "every pair connected with nothing queued")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {[group.client(n).dr_status()['peers'] for n in MEMBERS]}") from None
    # the conflict log: only the shared keys, all consistent
    for name in MEMBERS:
        conflicts = group.client(name).select_rows("KEY, DIVERGENCE from [//sys/xdcr_conflicts]",
                                                   output_row_limit=1_000_000)
        keys = {json.loads(r["KEY"])["id"] for r in conflicts if r["KEY"]}
        assert keys <= set(SHARED), f"conflicts on keys written once, at {name}: {sorted(keys - set(SHARED))[:10]}"
        assert {r["DIVERGENCE"] for r in conflicts} <= {"C"}
    # the peers found a's new leader through the directory entries they had
    for name in ("b", "c"):
        assert group.client(name).get("//sys/clusters") == directories[name], f"//sys/clusters of {name} changed"
    print(f"\nchecked {checked}; {load.summary()}")


def directories(group: EngineSet) -> dict[str, Any]:
    return {name: group.client(name).get("//sys/clusters") for name in ("b", "c")}


def raw_writes(keys: range) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in keys:
        yield (USERS, {"id": key, "name": "old", "password": "old"}) if key % 2 else (ORDERS, {"k": key, "v": "old"})


def send_raw(engine: EngineProcess, path: str, row: dict[str, Any], outcomes: list[Any]) -> None:
    """One insert straight to ``engine`` (no client that would follow a leader): its outcome."""
    try:
        answer = httpx.put(f"{engine.url}/api/v4/insert_rows", content=json.dumps(row).encode(),
                           headers={"Authorization": f"OAuth {TEST_TOKEN}", "X-YT-Header-Format": "json",
                                    "X-YT-Parameters": json.dumps({"path": path, "input_format": "json"})},
                           timeout=30)
    except httpx.TransportError:
        outcomes.append("gone")
        return
    if answer.status_code == 503:
        error = json.loads(answer.headers["X-YT-Error"])
        outcomes.append("refused" if error["attributes"].get("not_leader") else ("unavailable", error["message"]))
        return
    outcomes.append((answer.status_code, answer.headers.get("X-YT-Error")))
