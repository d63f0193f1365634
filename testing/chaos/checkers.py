"""Checkers: what a history proves about a run - nothing acknowledged lost, nothing applied twice.

Each checker reads only the :class:`~.history.History` (the workloads' operations and the final
reads recorded in it), so a history file can be checked again anywhere (``python -m
reptables.testing.chaos check FILE``). The rules for outcomes are Jepsen's: an ``ok`` operation
happened; a ``fail`` did not; an ``unknown`` one may have, at any time after it was invoked (also
after the client gave up on it), and is never counted against the system unless its effect is
seen twice.

Real-time order is what orders two operations: A *precedes* B when A was acknowledged before B was
invoked. Only then may a checker say that B's effect must come after A's. The history's own order
(its entries' ``index``, appended under one lock as the events happen) is that real-time order,
exactly - clock readings of two events a microsecond apart may tie.

* :func:`check_set` - every acknowledged insert present exactly once on every replica; no row that
  was never written, none whose insert failed.
* :func:`check_register` - one register per key, written by one owner: reads never go back in time
  within a session, never miss a write acknowledged before they began (reads of a replicated table
  are served by an in-sync sync replica), and every value read or left at the end was written by an
  insert that did not fail; the end value is the latest acknowledged one (or a later unknown one),
  the same on every replica.
* :func:`check_bank` - every snapshot read (and each replica at the end) holds every account and
  the constant total.
* :func:`check_xdcr` - the members of a group end identical; each change a member made is applied
  or logged as rejected exactly once on every other member; acknowledged writes are in their
  member's change log exactly once; a key never deleted ends with the change of the latest version
  ("later wins"), and how often that winner was written *before* a loser in real time (clock skew)
  is reported.
* :func:`check_stream` - a change stream read through the faults delivered every acknowledged
  change once, in an order that respects real time per key, with event tokens only growing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from .history import History, Op, OpType

__all__ = ["OWN_KEYS", "CheckResult", "check_bank", "check_history", "check_register", "check_set", "check_stream",
           "check_xdcr", "final_reads"]

#: how many lost/duplicated items and anomalies a result lists (all are counted)
LIST_LIMIT = 50
#: an XDCR member's own keys start at (cluster id) * this; shared keys are below it
OWN_KEYS = 1_000_000


@dataclass
class CheckResult:
    checker: str
    workload: str
    ops: dict[str, int] = field(default_factory=lambda: {"ok": 0, "fail": 0, "unknown": 0})
    lost: list[Any] = field(default_factory=list)
    lost_count: int = 0
    duplicated: list[Any] = field(default_factory=list)
    duplicated_count: int = 0
    anomalies: list[str] = field(default_factory=list)
    anomaly_count: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not (self.lost_count or self.duplicated_count or self.anomaly_count)

    def add_lost(self, item: Any) -> None:
        self.lost_count += 1
        if len(self.lost) < LIST_LIMIT:
            self.lost.append(item)

    def add_duplicated(self, item: Any) -> None:
        self.duplicated_count += 1
        if len(self.duplicated) < LIST_LIMIT:
            self.duplicated.append(item)

    def anomaly(self, text: str) -> None:
        self.anomaly_count += 1
        if len(self.anomalies) < LIST_LIMIT:
            self.anomalies.append(text)

    def count(self, pairs: list[tuple[Op, Op | None]]) -> None:
        for _, done in pairs:
            key = "unknown" if done is None or done.type is OpType.UNKNOWN else done.type.value
            self.ops[key] = self.ops.get(key, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "valid": self.valid}


def final_reads(history: History, workload: str) -> list[dict[str, Any]]:
    return [op.value for op in history if op.process == "final" and op.type is OpType.OK
            and isinstance(op.value, dict) and op.value.get("workload") == workload]


def _outcome(done: Op | None) -> OpType:
    return OpType.UNKNOWN if done is None else done.type


@dataclass(frozen=True)
class _Write:
    """An operation's place in real time: the history indexes of its invocation and completion."""

    invoked: int
    completed: int | None  # None: not acknowledged
    outcome: OpType

    def precedes(self, other: _Write) -> bool:
        """This write was acknowledged before ``other`` was invoked."""
        return self.outcome is OpType.OK and self.completed is not None and self.completed < other.invoked


# -- set ---------------------------------------------------------------------------------------


def check_set(history: History, workload: str = "set") -> CheckResult:
    result = CheckResult("set", workload)
    pairs = history.pairs("add", kind=workload)
    result.count(pairs)
    outcome = {inv.value: _outcome(done) for inv, done in pairs}
    ok = {k for k, o in outcome.items() if o is OpType.OK}
    finals = final_reads(history, workload)
    if not finals:
        result.anomaly("no final read was recorded")
    for final in finals:
        cluster = final["cluster"]
        present = Counter(final["keys"])
        for key in sorted(ok - set(present)):
            result.add_lost(f"{cluster}:{key}")
        for key, n in sorted(present.items()):
            if n > 1:
                result.add_duplicated(f"{cluster}:{key} x{n}")
            if key not in outcome:
                result.anomaly(f"{cluster}: key {key} present but never inserted")
            elif outcome[key] is OpType.FAIL:
                result.anomaly(f"{cluster}: key {key} present although its insert failed")
        result.stats[cluster] = {"rows": sum(present.values()),
                                 "unknown_present": sum(1 for k in present if outcome.get(k) is OpType.UNKNOWN)}
    acked = sorted(done.time for _, done in pairs if done is not None and done.type is OpType.OK)
    result.stats["acknowledged"] = len(ok)
    # how long writes stood still at worst (a failover, a partitioned meta-cluster): reported, not judged
    result.stats["longest_gap_between_acknowledged_inserts_s"] = round(
        max((b - a for a, b in zip(acked, acked[1:], strict=False)), default=0.0), 2)
    return result


# -- register ----------------------------------------------------------------------------------


def _register_writes(history: History, workload: str) -> tuple[dict[int, _Write], dict[int, int],
                                                                 list[tuple[Op, Op | None]]]:
    """value -> its write, value -> key, and the write pairs (values are unique per run)."""
    writes: dict[int, _Write] = {}
    key_of: dict[int, int] = {}
    pairs = history.pairs("write", kind=workload)
    for inv, done in pairs:
        value = inv.value["v"]
        writes[value] = _Write(inv.index, done.index if done is not None else None, _outcome(done))
        key_of[value] = inv.value["k"]
    return writes, key_of, pairs


def check_register(history: History, workload: str = "register") -> CheckResult:
    result = CheckResult("register", workload)
    writes, key_of, write_pairs = _register_writes(history, workload)
    read_pairs = history.pairs("read", kind=workload)
    result.count(write_pairs + read_pairs)
    ok_by_key: dict[int, list[tuple[int, _Write]]] = defaultdict(list)
    for written, w in writes.items():
        if w.outcome is OpType.OK:
            ok_by_key[key_of[written]].append((written, w))

    def known(key: int, value: int | None, where: str) -> bool:
        if value is None:
            return True
        w = writes.get(value)
        if w is None or key_of.get(value) != key:
            result.anomaly(f"{where}: key {key} holds {value}, which no write of that key wrote")
            return False
        if w.outcome is OpType.FAIL:
            result.anomaly(f"{where}: key {key} holds {value}, whose write failed")
            return False
        return True

    last_seen: dict[tuple[str, int], int | None] = {}
    stale = 0
    for inv, done in read_pairs:
        if done is None or done.type is not OpType.OK:
            continue
        key, value = done.value["k"], done.value.get("v")
        where = f"read #{inv.index} by {inv.process}"
        if not known(key, value, where):
            continue
        read = _Write(inv.index, done.index, OpType.OK)
        mine = writes.get(value) if value is not None else None
        # a write acknowledged before the read began must be visible (or a later one)
        for other_value, other in ok_by_key[key]:
            if other.precedes(read) and (mine is None or mine.precedes(other)) and other_value != value:
                stale += 1
                result.anomaly(f"{where}: key {key} read {value}, but {other_value} was acknowledged "
                               f"(entry #{other.completed}) before the read began (#{inv.index}, {inv.time:.3f} s)")
                break
        previous = last_seen.get((inv.process, key))
        if previous is not None and previous != value:
            before = writes[previous]
            if value is None or (mine is not None and mine.precedes(before)):
                result.anomaly(f"{where}: key {key} went back in time within the session: read {value} "
                               f"after {previous}")
        last_seen[(inv.process, key)] = value
    finals = final_reads(history, workload)
    if not finals:
        result.anomaly("no final read was recorded")
    end_values: dict[int, set[Any]] = defaultdict(set)
    for final in finals:
        cluster = final["cluster"]
        rows: dict[int, int | None] = {int(k): v for k, v in final["rows"].items()}
        for key in sorted(set(ok_by_key) | set(rows)):
            end = rows.get(key)
            end_values[key].add(end)
            if not known(key, end, f"final read of {cluster}"):
                continue
            last = writes.get(end) if end is not None else None
            for other_value, other in ok_by_key[key]:
                if other_value != end and (last is None or last.precedes(other)):
                    result.add_lost(f"{cluster}:{key}={other_value} (ends at {end})")
                    break
    for key, values in sorted(end_values.items()):
        if len(values) > 1:
            result.anomaly(f"replicas disagree on key {key} at the end: {sorted(map(str, values))}")
    result.stats.update(stale_reads=stale, keys=len(end_values))
    return result


# -- bank --------------------------------------------------------------------------------------


def check_bank(history: History, workload: str = "bank") -> CheckResult:
    result = CheckResult("bank", workload)
    setup = [op.value for op in history if op.type is OpType.INFO and op.f == "setup" and op.process == workload]
    if not setup:
        result.anomaly("the bank's setup (accounts and total) is not in the history")
        return result
    accounts, total = int(setup[0]["accounts"]), int(setup[0]["total"])
    transfers = history.pairs("transfer", kind=workload)
    reads = history.pairs("read", kind=workload)
    result.count(transfers + reads)
    snapshots = [(f"read #{inv.index} of {done.value['source']}", done.value["balances"])
                 for inv, done in reads if done is not None and done.type is OpType.OK]
    snapshots += [(f"final read of {f['cluster']}", f["balances"]) for f in final_reads(history, workload)]
    for where, balances in snapshots:
        values = list(balances.values())
        if len(values) != accounts or sum(values) != total or any(v < 0 for v in values):
            result.anomaly(f"{where}: {len(values)} accounts holding {sum(values)} (expected {accounts} "
                           f"holding {total}): {balances}")
    result.stats.update(snapshots=len(snapshots))
    return result


# -- XDCR --------------------------------------------------------------------------------------


def check_xdcr(history: History, workload: str = "xdcr") -> CheckResult:
    result = CheckResult("xdcr", workload)
    writes = history.pairs("write", kind=workload)
    deletes = history.pairs("delete", kind=workload)
    result.count(writes + deletes)
    finals = final_reads(history, workload)
    if not finals:
        result.anomaly("no final read was recorded")
        return result
    by_cluster = {f["cluster"]: f for f in finals}
    # 1. identical contents
    contents = {name: sorted(map(tuple, f["rows"])) for name, f in by_cluster.items()}
    first_name, first = next(iter(contents.items()))
    for name, rows in contents.items():
        if rows != first:
            diff = sorted(set(rows) ^ set(first))[:5]
            result.anomaly(f"{name} and {first_name} differ at the end ({len(rows)} and {len(first)} rows; "
                           f"e.g. {diff})")
    # 2. each member's acknowledged inserts of its own keys (never deleted) are on every member at the end
    written = {(inv.value["k"], inv.value["v"]): _outcome(done) for inv, done in writes}
    for name, rows in contents.items():
        present = {key for key, _ in rows}
        for (key, value), outcome in written.items():
            if key >= OWN_KEYS and outcome is OpType.OK and key not in present:
                result.add_lost(f"{name}: acknowledged insert {key}={value} missing")
        for key, value in rows:
            if written.get((key, value), OpType.FAIL) is OpType.FAIL:
                result.anomaly(f"{name}: key {key} ends as {value!r}, which no successful or unknown write wrote")
    # 3. a dr_pause that said "drained" had delivered every change of its member
    for op in history:
        if op.f == "drain-check" and op.type is OpType.OK and op.value.get("workload") == workload:
            for peer, missing in op.value["missing"].items():
                if peer != "compared" and missing:
                    result.anomaly(f"dr_pause of {op.value['member']} answered drained, but {peer} lacked "
                                   f"{len(missing)} of its changes then, e.g. {missing[:3]}")
    result.stats.update(members=sorted(by_cluster), rows=len(first), logs=all("changes" in f for f in finals))
    if all("changes" in f for f in finals):
        _check_xdcr_logs(result, history, workload, by_cluster, writes, deletes, dict(first))
    return result


def _check_xdcr_logs(result: CheckResult, history: History, workload: str, by_cluster: dict[str, dict[str, Any]],
                     writes: list[tuple[Op, Op | None]], deletes: list[tuple[Op, Op | None]],
                     final_rows: dict[Any, Any]) -> None:
    """The accounting that needs every member's change log from the beginning (its final read's
    ``changes``: [origin id, origin timestamp, kind, key, value, token]) and rejected changes."""
    ids = {name: f["cluster_id"] for name, f in by_cluster.items()}
    # each member's own changes applied or rejected exactly once on every other member
    own = {name: [c for c in f["changes"] if c[0] == ids[name]] for name, f in by_cluster.items()}
    for name, f in by_cluster.items():
        received = Counter((c[0], c[1]) for c in f["changes"] if c[0] != ids[name])
        rejected = Counter((r[0], r[1]) for r in f["rejected"])
        for other, changes in own.items():
            if other == name:
                continue
            for change in changes:
                version = (change[0], change[1])
                n = received[version] + rejected[version]
                if n == 0:
                    result.add_lost(f"{other}->{name}: change {version} of key {change[3]} neither applied nor "
                                    "logged as rejected")
                elif n > 1:
                    result.add_duplicated(f"{other}->{name}: change {version} of key {change[3]} applied "
                                          f"{received[version]}x, rejected {rejected[version]}x")
    # acknowledged writes in their member's change log exactly once; failed ones never
    logged = {name: Counter((c[3], c[4]) for c in changes if c[2] != "delete") for name, changes in own.items()}
    for inv, done in writes:
        cluster, key, value = inv.value["c"], inv.value["k"], inv.value["v"]
        if cluster not in own:
            continue
        n = logged[cluster][(key, value)]
        outcome = _outcome(done)
        if outcome is OpType.OK and n == 0:
            result.add_lost(f"{cluster}: acknowledged write {key}={value} is not in its change log")
        elif n > 1:
            result.add_duplicated(f"{cluster}: write {key}={value} is {n}x in its change log")
        elif outcome is OpType.FAIL and n:
            result.anomaly(f"{cluster}: write {key}={value} is in its change log although it failed")
    # later wins, on keys never deleted; how often the winner was written first in real time
    deleted = {inv.value["k"] for inv, _ in deletes}
    times = {(inv.value["k"], inv.value["v"]): (inv.index, done.index if done is not None and
                                                 done.type is OpType.OK else None) for inv, done in writes}
    versions: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)
    for changes in own.values():
        for c in changes:
            if c[3] not in deleted and c[2] != "delete":
                versions[c[3]].append((c[1], c[0], c[4]))
    inversions = pairs = 0
    for key, vs in versions.items():
        vs.sort()
        winner = vs[-1]
        if final_rows.get(key) != winner[2]:
            result.anomaly(f"key {key} ends as {final_rows.get(key)!r}, not as the change of the latest version "
                           f"{winner[:2]} ({winner[2]!r})")
        # consecutive versions of the key: was the later version written before the earlier one, in real time?
        for earlier, later in zip(vs, vs[1:], strict=False):
            t_earlier, t_later = times.get((key, earlier[2])), times.get((key, later[2]))
            if t_earlier and t_later and t_later[1] is not None:
                pairs += 1
                inversions += t_later[1] < t_earlier[0]
    result.stats.update(deleted_keys=len(deleted), keys_checked_later_wins=len(versions),
                        version_pairs=pairs, version_order_against_real_time=inversions,
                        rejected={n: len(f["rejected"]) for n, f in by_cluster.items()})


# -- streams -----------------------------------------------------------------------------------


def check_stream(history: History, workload: str, source: str, source_kind: str, cluster: str = "") -> CheckResult:
    """The stream ``workload`` (pulls recorded as ``pull`` ops: [token, kind, key, value] per change)
    against what ``source`` wrote: a set or register workload (``source_kind``), or an XDCR workload,
    whose final read of ``cluster``'s change log is then the complete list to compare with."""
    result = CheckResult("stream", workload)
    pulls = history.pairs("pull", kind=workload)
    events: list[list[Any]] = []
    for _, done in pulls:
        if done is not None and done.type is OpType.OK:
            events.extend(done.value["events"])
    result.ops["ok"] = len(events)
    tokens = [e[0] for e in events]
    for a, b in zip(tokens, tokens[1:], strict=False):
        if b <= a:
            result.anomaly(f"event token went back or repeated: {b} after {a}")
            break
    complete = any(f.get("complete") for f in final_reads(history, workload))
    if not complete:
        result.anomaly("the stream did not catch up with the end of the run")
    expected: dict[Any, OpType] = {}
    if source_kind == "set":
        expected = {k: _outcome(done) for k, done in ((inv.value, done) for inv, done in
                                                        history.pairs("add", kind=source))}
        seen = Counter(e[2] for e in events)
    elif source_kind == "register":
        writes, key_of, _ = _register_writes(history, source)
        expected = {(key_of[v], v): w.outcome for v, w in writes.items()}
        seen = Counter((e[2], e[3]) for e in events)
    else:
        logs = [f for f in final_reads(history, source) if f["cluster"] == cluster]
        expected = {c[5]: OpType.OK for f in logs for c in f["changes"]}
        seen = Counter(tokens)
    for item, n in seen.items():
        o = expected.get(item)
        if n > 1:
            result.add_duplicated(f"{item} delivered {n}x")
        if o is None:
            result.anomaly(f"{item} delivered but never written")
        elif o is OpType.FAIL:
            result.anomaly(f"{item} delivered although its write failed")
    if complete:
        for item, o in expected.items():
            if o is OpType.OK and not seen[item]:
                result.add_lost(f"{item} acknowledged but never delivered")
    if source_kind == "register":
        _check_order(result, events, _register_writes(history, source)[0])
    result.stats.update(events=len(events), pulls=len(pulls))
    return result


def _check_order(result: CheckResult, events: list[list[Any]], writes: dict[int, _Write]) -> None:
    """Per key, no value delivered after one whose write was acknowledged before it was written."""
    order: dict[int, list[int]] = defaultdict(list)
    for e in events:
        order[e[2]].append(e[3])
    for key, values in order.items():
        earliest_ack_after: float = float("inf")
        for v in reversed(values):
            w = writes.get(v)
            if w is None:
                continue
            if earliest_ack_after < w.invoked:
                result.anomaly(f"key {key}: {v} delivered before a value acknowledged before {v} was written")
                break
            if w.outcome is OpType.OK and w.completed is not None:
                earliest_ack_after = min(earliest_ack_after, w.completed)


def check_history(history: History, workloads: dict[str, dict[str, str]]) -> list[CheckResult]:
    """Run the checker of every workload named in ``workloads`` (name -> {"kind", and for streams
    "source" and "source_kind"}), as recorded in the history's ``run`` info entry."""
    out: list[CheckResult] = []
    for name, spec in workloads.items():
        kind = spec["kind"]
        if kind == "set":
            out.append(check_set(history, name))
        elif kind == "register":
            out.append(check_register(history, name))
        elif kind == "bank":
            out.append(check_bank(history, name))
        elif kind == "xdcr":
            out.append(check_xdcr(history, name))
        elif kind == "stream":
            out.append(check_stream(history, name, spec["source"], spec["source_kind"], spec.get("cluster", "")))
        else:
            raise ValueError(f"unknown workload kind {kind!r} of {name}")
    return out
