"""Workloads: client sessions that drive the engines through the faults and record every operation.

Why they only record: a workload never judges what it sees (the :mod:`.checkers` do, from the
history), so a run can be checked again from its history file. Each workload has

* ``setup(tables)``: its tables (through :class:`Tables`, which knows the run's clusters);
* ``step(session)``: one operation, recorded as invoke + ok/fail/unknown (:func:`perform`);
* ``final(tables)``: after the faults are healed and the clusters have converged, the reads the
  checkers compare against (``final`` operations in the history);
* ``spec()``: what :func:`~.checkers.check_history` needs to pick its checker.

Sessions are threads; each holds its own clients with a short timeout (a partitioned engine must
cost a session seconds, not minutes). A session whose operation ended ``unknown`` continues as a new
process (:mod:`.history` says why).

The workloads: :class:`SetWorkload` (unique inserts into a replicated table, ordered by default so
that a row applied twice is visible), :class:`RegisterWorkload` (one register per key, one writer
per key, readers through the meta-cluster), :class:`BankWorkload` (transfers in tablet
transactions, snapshot reads), :class:`XdcrWorkload` (every member writes and deletes shared keys
and inserts keys of its own) and :class:`StreamWorkload` (a consumer of a change stream, resumed
from its last event token after every error).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reptables.engine.client import ChangeEvent, Client
from reptables.engine.errors import YtError

from .checkers import OWN_KEYS
from .history import History, Op, OpType, classify, describe

__all__ = ["BankWorkload", "RegisterWorkload", "Session", "SetWorkload", "StreamWorkload", "Tables", "Workload",
           "XdcrWorkload", "perform"]

#: seconds a client of a workload waits for an answer (connecting included)
OP_TIMEOUT = 5.0
ORDERED_SCHEMA: list[dict[str, Any]] = [{"name": "k", "type": "int64"}, {"name": "v", "type": "string"}]
SORTED_SCHEMA: list[dict[str, Any]] = [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                       {"name": "v", "type": "string"}]
REGISTER_SCHEMA: list[dict[str, Any]] = [{"name": "k", "type": "int64", "sort_order": "ascending"},
                                         {"name": "v", "type": "int64"}]
BANK_SCHEMA: list[dict[str, Any]] = [{"name": "account", "type": "int64", "sort_order": "ascending"},
                                     {"name": "balance", "type": "int64"}]


@dataclass
class Tables:
    """Where the workloads' tables live: the engines' URLs and tokens, and each table's replicas."""

    urls: dict[str, str]
    tokens: dict[str, str]
    meta: str = "meta"
    #: replicated table path -> {replica id: (cluster, replica path)}
    replicas: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)

    def client(self, cluster: str, timeout: float = 15.0) -> Client:
        return Client(self.urls[cluster], self.tokens[cluster], timeout=timeout)

    def replica_tables(self, path: str) -> list[tuple[str, str]]:
        """(cluster, replica path) of every replica of ``path``."""
        return sorted(set(self.replicas.get(path, {}).values()))


class Session:
    """One client thread: a process id in the history, clients of its own, a random source."""

    def __init__(self, history: History, kind: str, index: int, tables: Tables, seed: int) -> None:
        self.history = history
        self.kind = kind
        self.index = index
        self.tables = tables
        self.rng = random.Random(seed)
        self.process = history.process(kind)
        self._clients: dict[str, Client] = {}

    def client(self, cluster: str) -> Client:
        if cluster not in self._clients:
            self._clients[cluster] = self.tables.client(cluster, OP_TIMEOUT)
        return self._clients[cluster]

    def retire(self) -> None:
        """The last operation may still be in flight: go on as a new process, on new connections."""
        self.process = self.history.process(self.kind)
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def perform(session: Session, f: str, value: Any, action: Callable[[], Any],
            result: Callable[[Any], Any] | None = None) -> tuple[Op, Any]:
    """Invoke ``f``, run ``action`` and record its outcome; returns (completion, action's result or None)."""
    invoked = session.history.invoke(session.process, f, value)
    try:
        answer = action()
    except Exception as exc:  # noqa: BLE001 - every outcome is recorded; classify() says which it is
        outcome = classify(exc)
        done = session.history.complete(invoked, outcome, error=describe(exc))
        if outcome is OpType.UNKNOWN:
            session.retire()
        return done, None
    return session.history.complete(invoked, OpType.OK, result(answer) if result else None), answer


class Workload:
    """A kind of client load; subclasses define its table, its operations and its final reads."""

    kind = "workload"
    #: sessions (threads) it runs
    sessions = 2
    #: pause between two operations of a session (seconds), so that 2 cores also serve the engines
    pause = 0.02

    def __init__(self, name: str, history: History) -> None:
        self.name = name
        self.history = history

    def setup(self, tables: Tables) -> None:
        raise NotImplementedError

    def step(self, session: Session) -> None:
        raise NotImplementedError

    def final(self, tables: Tables) -> None:
        raise NotImplementedError

    def spec(self) -> dict[str, str]:
        return {"kind": self.kind}


def _select_all(client: Client, query: str) -> list[dict[str, Any]]:
    return client.select_rows(query, output_row_limit=10_000_000, input_row_limit=10_000_000)


class SetWorkload(Workload):
    """Unique keys inserted into replicated table ``path``, one per ``insert_rows``."""

    kind = "set"
    sessions = 3

    def __init__(self, name: str, history: History, path: str) -> None:
        super().__init__(name, history)
        self.path = path
        self._keys = itertools.count(1)

    def step(self, session: Session) -> None:
        key = next(self._keys)
        client = session.client(session.tables.meta)
        perform(session, "add", key, lambda: client.insert_rows(self.path, [{"k": key, "v": f"s{key}"}]))

    def final(self, tables: Tables) -> None:
        for cluster, path in tables.replica_tables(self.path):
            with tables.client(cluster) as client:
                keys = [r["k"] for r in _select_all(client, f"k from [{path}]")]
            self.history.record("final", "final-read", {"workload": self.name, "cluster": cluster, "keys": keys})


class RegisterWorkload(Workload):
    """Registers ``k`` = 0..keys-1 in a sorted replicated table: writer sessions own keys (key %
    writers), reader sessions look keys up through the meta-cluster."""

    kind = "register"

    def __init__(self, name: str, history: History, path: str, keys: int = 12, writers: int = 2,
                 readers: int = 2) -> None:
        super().__init__(name, history)
        self.path, self.keys, self.writers = path, keys, writers
        self.sessions = writers + readers
        self._values = itertools.count(1)

    def step(self, session: Session) -> None:
        client = session.client(session.tables.meta)
        if session.index < self.writers:
            key = session.rng.randrange(session.index, self.keys, self.writers)
            value = next(self._values)
            perform(session, "write", {"k": key, "v": value},
                    lambda: client.insert_rows(self.path, [{"k": key, "v": value}]))
        else:
            key = session.rng.randrange(self.keys)

            def read() -> dict[str, Any]:
                rows = client.lookup_rows(self.path, [{"k": key}])
                row = rows[0] if rows else None
                return {"k": key, "v": row["v"] if row is not None else None}

            perform(session, "read", {"k": key}, read, result=lambda r: r)

    def final(self, tables: Tables) -> None:
        for cluster, path in tables.replica_tables(self.path):
            with tables.client(cluster) as client:
                rows = {str(r["k"]): r["v"] for r in _select_all(client, f"k, v from [{path}]")}
            self.history.record("final", "final-read", {"workload": self.name, "cluster": cluster, "rows": rows})


class BankWorkload(Workload):
    """Accounts in a sorted replicated table; transfers read both accounts and write both in one tablet
    transaction; reads take the whole table, through the meta-cluster or from one replica."""

    kind = "bank"
    sessions = 3

    def __init__(self, name: str, history: History, path: str, accounts: int = 6, balance: int = 100) -> None:
        super().__init__(name, history)
        self.path, self.accounts, self.balance = path, accounts, balance

    def initial_rows(self) -> list[dict[str, Any]]:
        return [{"account": a, "balance": self.balance} for a in range(self.accounts)]

    def record_setup(self) -> None:
        self.history.info(self.name, "setup", {"accounts": self.accounts, "total": self.accounts * self.balance})

    def step(self, session: Session) -> None:
        meta = session.client(session.tables.meta)
        if session.index == 0:
            sources = [(session.tables.meta, self.path), *session.tables.replica_tables(self.path)]
            cluster, path = sources[session.rng.randrange(len(sources))]
            client = session.client(cluster)

            def read() -> dict[str, Any]:
                rows = _select_all(client, f"account, balance from [{path}]")
                return {"source": cluster, "balances": {str(r["account"]): r["balance"] for r in rows}}

            perform(session, "read", {"source": cluster}, read, result=lambda r: r)
            return
        a, b = session.rng.sample(range(self.accounts), 2)
        amount = session.rng.randint(1, 5)

        def transfer() -> None:
            tx = meta.start_transaction()
            try:
                rows = {r["account"]: r["balance"] for r in
                        meta.lookup_rows(self.path, [{"account": a}, {"account": b}], transaction_id=tx)
                        if r is not None}
                if rows.get(a, 0) < amount or b not in rows:
                    raise YtError(f"account {a} holds {rows.get(a)}, less than {amount}", code=1802)
                meta.insert_rows(self.path, [{"account": a, "balance": rows[a] - amount},
                                             {"account": b, "balance": rows[b] + amount}], transaction_id=tx)
            except BaseException:
                try:
                    meta.abort_transaction(tx)
                except YtError:
                    pass  # the transaction expires on its own; nothing of it was committed
                raise
            meta.commit_transaction(tx)

        perform(session, "transfer", {"from": a, "to": b, "amount": amount}, transfer)

    def final(self, tables: Tables) -> None:
        for cluster, path in tables.replica_tables(self.path):
            with tables.client(cluster) as client:
                rows = _select_all(client, f"account, balance from [{path}]")
            self.history.record("final", "final-read", {"workload": self.name, "cluster": cluster,
                                                        "balances": {str(r["account"]): r["balance"] for r in rows}})


class XdcrWorkload(Workload):
    """Every member of an XDCR group writes table ``path``: inserts of keys of its own, updates of
    shared keys (the lower half of them are never deleted: "later wins" is checked there) and
    deletes of the upper half. Members may join and leave while it runs (:meth:`add`, :meth:`remove`).

    ``logs``: the final reads include each member's change log and rejected changes (for the
    exactly-once accounting); a group whose logs are trimmed on purpose (a join from a snapshot)
    has them no more, and is checked on its contents only."""

    kind = "xdcr"

    def __init__(self, name: str, history: History, path: str, members: dict[str, int], shared: int = 16,
                 sessions: int = 3, logs: bool = True) -> None:
        super().__init__(name, history)
        self.path, self.shared, self.logs = path, shared, logs
        self.members = dict(members)
        self.sessions = sessions
        self._n = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, member: str, cluster_id: int) -> None:
        with self._lock:
            self.members[member] = cluster_id
        self.history.info(self.name, "member", {"join": member, "cluster_id": cluster_id})

    def remove(self, member: str) -> None:
        with self._lock:
            self.members.pop(member, None)
        self.history.info(self.name, "member", {"leave": member})

    def step(self, session: Session) -> None:
        with self._lock:
            members = sorted(self.members.items())
        member, cluster_id = members[(session.index + session.rng.randrange(len(members))) % len(members)]
        client = session.client(member)
        n = next(self._n)
        roll = session.rng.random()
        if roll < 0.35:
            key, value = cluster_id * OWN_KEYS + n, f"{member}-{n}"
        elif roll < 0.85:
            key, value = session.rng.randrange(self.shared), f"{member}-{n}"
        else:
            key = session.rng.randrange(self.shared // 2, self.shared)
            perform(session, "delete", {"c": member, "k": key}, lambda: client.delete_rows(self.path, [{"id": key}]))
            return
        perform(session, "write", {"c": member, "k": key, "v": value},
                lambda: client.insert_rows(self.path, [{"id": key, "name": value, "password": "x"}]))

    def final(self, tables: Tables) -> None:
        with self._lock:
            members = dict(self.members)
        for member, cluster_id in members.items():
            with tables.client(member, timeout=60.0) as client:
                rows = [[r["id"], r["name"]] for r in _select_all(client, f"id, name from [{self.path}]")]
                value: dict[str, Any] = {"workload": self.name, "cluster": member, "cluster_id": cluster_id,
                                         "rows": rows}
                if self.logs:
                    value["changes"] = [[e.get("origin_cluster_id"), e.get("origin_timestamp"), e["kind"],
                                         (e.get("key") or {}).get("id"), (e.get("row") or {}).get("name"),
                                         e["event_token"]] for e in pull_all(client, self.path, 1 << 30)]
                    value["rejected"] = [[r["CLUSTER_ID"], r["TIMESTAMP"]] for r in _select_all(
                        client, "CLUSTER_ID, TIMESTAMP, ROW_TYPE, DECISION, TABLE_NAME from [//sys/xdcr_conflicts]")
                        if r["TABLE_NAME"] == self.path and r["ROW_TYPE"] in ("NEW", "DEL") and r["DECISION"] == "R"]
            self.history.record("final", "final-read", value)


def pull_all(client: Client, path: str, from_timestamp: int) -> list[ChangeEvent]:
    """Every change of ``path`` from ``from_timestamp`` up to now (heartbeats left out)."""
    events: list[ChangeEvent] = []
    answer = client.pull_changes(path, from_timestamp=from_timestamp, wait_timeout=0, max_row_count=100_000)
    while True:
        changes = [e for e in answer["events"] if e["kind"] != "heartbeat"]
        if not changes:
            return events
        events += changes
        answer = client.pull_changes(path, from_event_token=answer["event_token"], wait_timeout=0,
                                     max_row_count=100_000)


class StreamWorkload(Workload):
    """A consumer of the change stream of ``path`` on ``cluster``, through every fault: it pulls from
    its last event token again after any error, and records each answer's changes."""

    kind = "stream"
    sessions = 1
    pause = 0.0

    def __init__(self, name: str, history: History, cluster: str, path: str, source: str, source_kind: str,
                 clock_cluster: str, key_column: str = "k", value_column: str = "v") -> None:
        super().__init__(name, history)
        self.cluster, self.path, self.source, self.source_kind = cluster, path, source, source_kind
        #: the cluster whose timestamps the stream's events carry (a replica's are its meta-cluster's)
        self.clock_cluster = clock_cluster
        self.key_column, self.value_column = key_column, value_column
        self.token: str | None = None
        self.timestamp = 0
        self.errors = 0
        self._lock = threading.Lock()

    def spec(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source, "source_kind": self.source_kind, "cluster": self.cluster}

    def step(self, session: Session) -> None:
        client = session.client(self.cluster)
        try:
            if self.token is None:
                answer = client.pull_changes(self.path, from_timestamp=1 << 30, wait_timeout=1000)
            else:
                answer = client.pull_changes(self.path, from_event_token=self.token, wait_timeout=1000,
                                             max_row_count=1000)
        except YtError as exc:
            self.errors += 1
            if classify(exc) is OpType.UNKNOWN and exc.code not in (105, 1713):
                self.history.info(self.name, "pull-error", describe(exc))
            session.close()
            time.sleep(0.3)
            return
        events = [[e["event_token"], e["kind"], (e.get("key") or e.get("row") or {}).get(self.key_column),
                   (e.get("row") or {}).get(self.value_column)] for e in answer["events"] if e["kind"] != "heartbeat"]
        if events:
            self.history.record(session.process, "pull", {"events": events})
        with self._lock:
            self.token, self.timestamp = answer["event_token"], int(answer["timestamp"])

    def final(self, tables: Tables) -> None:
        """Wait until the consumer has read up to a timestamp taken now (``caught_up``), then record it."""

    def caught_up(self, until: int) -> bool:
        with self._lock:
            return self.timestamp >= until

    def record_end(self, complete: bool, until: int) -> None:
        self.history.record("final", "final-read", {"workload": self.name, "complete": complete, "until": until,
                                                    "errors": self.errors})
