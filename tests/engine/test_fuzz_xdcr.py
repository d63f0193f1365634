"""The bounded fuzzer of tests/engine/test_fuzz.py, aimed at XDCR, change streams and consumers.

The generic fuzzer rarely reaches these paths: their parameters are tokens, positions and
versions that random text almost never resembles, and the XDCR calls need an engine with a
cluster id, an XDCR table, a peer in its directory and a join under way. So every request here
starts from a *valid-looking* one (a :class:`Case`: real event tokens of the engine's tables, a
real ``xdcr_apply`` batch, a real page of a join) and hypothesis replaces one to three of its
fields with values that break what a parser assumes: positions such as ``["a", 0]``,
``[2**63 + 5, 0]`` or ``[-1, 0]``, timestamps at 2**63 and 2**64 (SQL stores signed 64-bit
integers), negative numbers, lone surrogates, missing fields, wrong types, huge images, or
random values.

Two real engines: ``a`` (``--cluster-id 1``) is fuzzed; ``b`` (``--cluster-id 2``) is its XDCR
peer both ways, the donor of a join that ``a`` keeps under way on ``//tmp/xj``, and the cluster
in whose name the internal calls come (``b``'s peer credential for ``a``). The assertions are the
generic fuzzer's: no 5xx; a 4xx carries a specific YT error code; a refused request changes
nothing watched (the tree, the rows, the consumers and their offsets, the attributes of ``//sys``
and of the tables, the pause, the join); the engine is healthy afterwards and still replicates to
its peer. One more after every request: ``a``'s own writes to an XDCR table still work (the
versions a batch or a page carries move the cluster's XDCR clock, which its later writes follow).
After an accepted request the fixture puts the XDCR configuration, the consumers and the join
back, so that every example starts from the same state.

Left out on purpose: ``dr_drop`` with a timeout it accepts (it drains, tells ``b`` to forget ``a``
and leaves the group, which no later example could undo: it is fuzzed with refused timeouts
only), ``dr_pause`` with ``wait`` (a drain waits up to its timeout), and waits of pulls beyond a
few milliseconds (a pull that finds nothing waits out its ``wait_timeout``).

Hypothesis stops at the first failing example of a test; the cases are plain data (the
``*_cases`` functions), so a script can also post every single mutation of them one by one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.process import start_all
from reptables.testing import EngineProcess, wait_for
from tests.engine.test_fuzz import FUZZ, _check_answer, _values

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "n", "type": "int64"}]
#: the schema as an XDCR peer describes it (``schema_signature`` in engine/xdcr/settings.py)
SIGNATURE = [{"name": "k", "type": "int64", "sort_order": "ascending", "required": False},
             {"name": "v", "type": "string", "sort_order": None, "required": False},
             {"name": "n", "type": "int64", "sort_order": None, "required": False}]
ORDERED = [{"name": "msg", "type": "string"}]
#: an XDCR table written on a; an XDCR table a joins from b; a sorted, an ordered and an empty table
XT, XJ, SORTED, LOG, EMPTY = "//tmp/xt", "//tmp/xj", "//tmp/s", "//tmp/log", "//tmp/e"
TABLES = (XT, XJ, SORTED, LOG)
QUEUES = (SORTED, LOG, XT)
CONSUMERS = {SORTED: ["c1", "c2"], LOG: ["c1"], XT: ["c1"]}

#: a location's value left out of the request
MISSING = "<missing>"
# Every list below puts what breaks parsers most first: hypothesis draws the first elements of a
# list most often (they are its simplest examples).
#: integers at the edges of what a position, a timestamp or a count may be
EDGE_INTS = [2**63, 2**64 - 1, 2**63 + 5, -(2**63) - 1, -1, 2**64, 2**63 - 1, 0, 1, 2**31, 2**62, 2**70, -(2**63)]
#: where what a request may hold ends: SQL's signed 64-bit integers, JSON's text (any value of an
#: open location is one of these a quarter of the time)
BOUNDARY = [2**63, 2**63 + 5, 2**64 - 1, -(2**63) - 1, [2**63, 0], float("inf"), "\ud800"]
#: values that break what a parser of positions and versions assumes
NASTY = [["a", 0], 2**63, [2**63 + 5, 0], 2**64 - 1, [None, None], None, [-1, 0], -1, [5], [{"p": None}],
         {"o": [2**62, 2]}, "\ud800", [0], [1, 2, 3], [], {}, [[1], 0], [{}, 0], [1.5, 0], [True, 0], [0, "a"], [0, -1],
         [2**64, 0], [None], True, 1.5, float("inf"), "", "a", "5", "x" * 100_000, MISSING, *EDGE_INTS]
PATHS = ["\ud800", "//tmp/nowhere", XT, XJ, SORTED, LOG, EMPTY, "//sys", "//tmp/xt/@xdcr", "", "#0-0-0-0", 5, None,
         [XT], MISSING]
TIMESTAMPS = [*EDGE_INTS, "5", 1.5, None, MISSING]
COUNTS = [2**63, 2**64, 0, -1, 100_001, "5", 1.5, True, None, MISSING, 1, 2, 1000, 100_000]
#: waits that answer at once or are refused (a null or missing wait is the default, a second)
WAITS = [2**63, 2**64, -1, 60_001, "10", 1.5, True, [5], 0, 1, 20]
PAGES = [*EDGE_INTS, *range(8), "0", None, 1.5, True, MISSING]
CONSUMER_NAMES = ["\ud800", "new", "c2", "", "x" * 1001, 5, None, ["c1"], MISSING, "c1"]
#: timeouts dr_drop refuses (a null or missing timeout is the default, 60 s: accepted)
REFUSED_TIMEOUTS = [-1, 0, 3_600_001, 2**64, "60000", 1.5, True, [1]]
LONG_ROW = {"k": 7, "v": "x" * 1_000_000, "n": 1}

#: the generic fuzzer's settings (derandomized, no example database; hack/fuzz.sh's long mode), with
#: fewer examples a test (three tenths) and no shrinking: an example is a template and at most three
#: changes, small already
XFUZZ = settings(FUZZ, max_examples=max(1, FUZZ.max_examples * 3 // 10), phases=[Phase.explicit, Phase.generate])


@dataclass(frozen=True)
class Case:
    """A valid-looking request and, per location in it, the values the fuzzer puts there.

    ``template`` is ``{"params": ..., "body": ...}`` for an API command (no ``body``: none sent)
    and ``{"caller": ..., "body": ...}`` for an internal call. A location is a path into it.
    Locations in ``closed`` take their listed values only, the others also random ones."""

    route: str
    name: str
    template: dict[str, Any]
    values: dict[tuple[Any, ...], list[Any]]
    closed: frozenset[tuple[Any, ...]] = frozenset()
    #: a location that takes a new integer in every request (a key: a change to a key the table
    #: has seen at the same version loses its conflict, and is never written)
    fresh: tuple[Any, ...] | None = None


@dataclass(repr=False)
class Target:
    """The fuzzed engine ``a``, its peer ``b``, and what the cases are built from."""

    a: EngineProcess
    b: EngineProcess
    http: httpx.Client
    #: valid tokens of each queue of a, and (key "b") of a table of b
    tokens: dict[str, list[str]]
    table_ids: dict[str, str]
    #: two snapshots a took for b: one the examples read, one they may release
    snapshots: tuple[str, str]
    #: page 0 of the join of XJ, as dr_join_read gives it
    page: list[dict[str, Any]]
    #: b's API, with b's token
    peer: httpx.Client
    #: the consumers of each queue, as registered at the start
    consumers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the state at the start (what ``restore`` puts back)
    baseline: Any = None
    last_state: Any = None

    def __repr__(self) -> str:  # (hypothesis prints the arguments of a failing example)
        return f"Target(a={self.a.url}, b={self.b.url})"

    def call(self, command: str, params: Any, body: Any = MISSING) -> httpx.Response:
        headers = {"X-YT-Parameters": json.dumps(params, ensure_ascii=True), "X-YT-Input-Format": "json",
                   "X-YT-Output-Format": "json"}
        content = b"" if body == MISSING else json.dumps(body, ensure_ascii=True).encode()
        return self.http.post(f"/api/v4/{command}", headers=headers, content=content)

    def internal(self, method: str, body: Any, caller: Any = "b") -> httpx.Response:
        credential = peer_credential(self.a.token or "", str(caller))
        content = b"" if body == MISSING else json.dumps(body, ensure_ascii=True).encode()
        return self.http.post(f"/internal/v1/{method}", content=content,
                              headers={"Authorization": f"OAuth {credential}"})

    def join_again(self) -> None:
        """XJ joining afresh from b, no page loaded."""
        begun = self.call("dr_join_begin", {"path": XJ, "source": "b", "page_rows": 1, "restart": True})
        if begun.status_code != 200 and "written on this cluster" in begun.text:
            # a page loaded with versions of a's own cluster id (a page may carry any): XJ counts as
            # written here and cannot join again; a new XJ can
            self.ok("unmount_table", {"path": XJ})
            self.ok("remove", {"path": XJ})
            self.ok("create", {"path": XJ, "type": "table",
                               "attributes": {"dynamic": True, "schema": SCHEMA, "xdcr": True}})
            self.ok("mount_table", {"path": XJ})
            begun = self.call("dr_join_begin", {"path": XJ, "source": "b", "page_rows": 1, "restart": True})
        assert begun.status_code == 200, f"XJ could not join again: {begun.text[:500]}"

    def restart(self) -> None:
        """A new process for engine a, on its data and its port."""
        self.http.close()
        self.a.stop()
        self.a.start()
        self.http = httpx.Client(base_url=self.a.url, headers={"Authorization": f"OAuth {self.a.token}"}, timeout=30)
        self.last_state = None

    def send(self, case: Case, request: dict[str, Any]) -> httpx.Response:
        if case.route == "internal":
            return self.internal(case.name, request.get("body", MISSING), request.get("caller", "b"))
        return self.call(case.name, request.get("params", {}), request.get("body", MISSING))

    def ok(self, command: str, params: dict[str, Any], body: Any = MISSING) -> Any:
        answer = self.call(command, params, body)
        assert answer.status_code == 200, f"{command} {params}: {answer.status_code} {answer.text[:500]}"
        return answer.json() if answer.content else None

    def state(self) -> Any:
        """What a refused request must not change."""
        rows = {p: self.call("select_rows", {"query": f"* from [{p}]"}).text for p in TABLES}
        consumers = {q: self.call("list_queue_consumer_registrations", {"queue_path": q}).text for q in QUEUES}
        attributes = {p: self.call("get", {"path": f"{p}/@"}).text for p in ("//sys", *TABLES, EMPTY)}
        status = self.ok("dr_status", {})
        return {"tree": self.call("get", {"path": "//"}).text, "rows": rows, "consumers": consumers,
                "attributes": attributes, "dr_status": {k: status[k] for k in ("paused", "connections", "joining")}}

    def before(self) -> Any:
        if self.last_state is None:
            self.last_state = self.state()
        return self.last_state

    def check(self, answer: httpx.Response, what: str, before: Any) -> None:
        """The fuzzer's assertions on one answer; then the state for the next example."""
        _check_answer(answer, what)
        after = self.state()
        if answer.status_code >= 400:
            assert after == before, f"{what}: a refused request changed the state{_difference(before, after)}"
        elif self.restore(after, sink=answer.content.startswith(b'{"applied":true')):  # (an applied batch)
            after = self.state()
        self.last_state = after

    def restore(self, state: Any, sink: bool = False) -> bool:
        """Put back what an accepted request changed of the XDCR configuration, the pause, the join
        of XJ and the consumers (``sink``: also forget b's position, so that a batch at the
        template's position applies again). Whether anything was put back."""
        # b is never told to forget a (an accepted dr_drop would): the whole run relies on it
        assert self.peer.get("/api/v4/get", params={"path": "//sys/@xdcr_connections"}).json() == {"value": ["a"]}, \
            "b was told to forget a: was a dr_drop accepted?"
        if not sink and _restorable(state) == _restorable(self.baseline):
            return False
        attributes = self.ok("get", {"path": "//sys/@"})["value"]
        for name in ("xdcr_conflict_retention", "xdcr_preferred_source"):
            if name in attributes:
                self.ok("remove", {"path": f"//sys/@{name}"})
        if sink:
            self.internal("xdcr_forget", {"cluster": "b", "cluster_id": 2})
        if sink or attributes.get("xdcr_connections") != ["b"]:
            self.ok("set", {"path": "//sys/@xdcr_connections"}, ["b"])
        status = self.ok("dr_status", {})
        if status["paused"]:
            self.ok("dr_resume", {})
        join = status["joining"].get(XJ)
        if join is None or join["loaded_pages"] or not join["snapshot_id"]:
            self.join_again()
        for queue, registered in self.consumers.items():
            now = {r["consumer_path"]: r for r in self.ok("list_queue_consumer_registrations",
                                                           {"queue_path": queue})["value"]}
            for name in set(now) - set(registered):
                self.ok("unregister_queue_consumer", {"queue_path": queue, "consumer_path": name})
            for name, record in registered.items():
                if now.get(name) != record:
                    self.ok("register_queue_consumer", {"queue_path": queue, "consumer_path": name, "vital": False})
                    self.ok("advance_consumer", {"queue_path": queue, "consumer_path": name,
                                                 "new_offset": record["offset"]})
        return True


def _restorable(state: Any) -> Any:
    """What ``Target.restore`` puts back, of a state (a join begun again has a new snapshot id)."""
    status = dict(state["dr_status"])
    status["joining"] = {p: {k: v for k, v in join.items() if k != "snapshot_id"}
                         for p, join in status["joining"].items()}
    return state["consumers"], status, state["attributes"]["//sys"]


def _difference(before: Any, after: Any) -> str:
    """Where two states differ first, and how."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            if before.get(key) != after.get(key):
                return f"[{key!r}]{_difference(before.get(key), after.get(key))}"
    return f": {str(before)[:600]} -> {str(after)[:600]}"


def start_target(base: Path) -> Target:
    """Engines a and b connected for XDCR, the tables, consumers and a join of a under way."""
    a = EngineProcess("a", base / "a", extra_args=["--cluster-id", "1"])
    b = EngineProcess("b", base / "b", extra_args=["--cluster-id", "2"])
    start_all([a, b])
    try:
        engines = {"a": a, "b": b}
        for name, engine in engines.items():
            with Client(engine.url, engine.token) as client:
                client.set("//sys/clusters", {n: {"proxy_url": e.url, "token": peer_credential(e.token or "", name)}
                                              for n, e in engines.items()})
                client.set("//sys/@xdcr_connections", [n for n in engines if n != name])
                for path in (XT, XJ):
                    client.create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True})
                    client.mount_table(path)
        with Client(b.url, b.token) as client:
            client.insert_rows(XJ, [{"k": i, "v": f"b{i}", "n": i} for i in range(6)])
            other = client.pull_changes(XJ, from_timestamp=0, wait_timeout=0)["events"][0]["event_token"]
        with Client(a.url, a.token) as client:
            # (streamed: their change logs on from the start)
            client.create("table", SORTED, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True})
            client.create("table", LOG, attributes={"dynamic": True, "schema": ORDERED, "enable_change_log": True})
            client.create("table", EMPTY, attributes={"dynamic": True, "schema": SCHEMA, "enable_change_log": True})
            for path in (SORTED, LOG, EMPTY):
                client.mount_table(path)
            # (k -1: the row written again after every example, ``fuzz_one``)
            client.insert_rows(XT, [{"k": i, "v": f"a{i}", "n": i} for i in range(-1, 5)])
            client.insert_rows(SORTED, [{"k": i, "v": f"s{i}", "n": i} for i in range(5)])
            client.insert_rows(LOG, [{"msg": f"m{i}"} for i in range(3)])
            tokens, table_ids = {}, {}
            for queue in QUEUES:
                table_ids[queue] = client.get(f"{queue}/@id")
                answer = client.pull_changes(queue, from_timestamp=0, wait_timeout=0)
                tokens[queue] = [e["event_token"] for e in answer["events"]] + [answer["event_token"]]
                for consumer in CONSUMERS[queue]:
                    client.call("register_queue_consumer", {"queue_path": queue, "consumer_path": consumer})
            tokens["b"] = [other]
            # b's rows of XJ have reached a or not: the join clears them either way
            client.call("dr_join_begin", {"path": XJ, "source": "b", "page_rows": 1})
            page = client.call("dr_join_read", {"path": XJ, "page": 0})["entries"]
        credential = {"Authorization": f"OAuth {peer_credential(a.token or '', 'b')}"}
        snapshots = [httpx.post(f"{a.url}/internal/v1/xdcr_snapshot", headers=credential, timeout=30,
                                json={"path": XT, "schema": SIGNATURE, "page_rows": 2}).json()["snapshot_id"]
                     for _ in range(2)]
        target = Target(a, b, httpx.Client(base_url=a.url, headers={"Authorization": f"OAuth {a.token}"}, timeout=30),
                        tokens, table_ids, (snapshots[0], snapshots[1]), page,
                        httpx.Client(base_url=b.url, headers={"Authorization": f"OAuth {b.token}"}, timeout=30))
        target.consumers = {q: {r["consumer_path"]: r for r in target.ok(
            "list_queue_consumer_registrations", {"queue_path": q})["value"]} for q in QUEUES}
        target.baseline = target.state()
        return target
    except BaseException:
        a.stop()
        b.stop()
        raise


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    fuzzed = start_target(Path(tmp_path_factory.mktemp("fuzz_xdcr")))
    try:
        yield fuzzed
    finally:
        fuzzed.http.close()
        fuzzed.peer.close()
        fuzzed.a.stop()
        fuzzed.b.stop()


# -- the cases ----------------------------------------------------------------------------------------------

def crafted_tokens(table_id: str) -> list[str]:
    """Tokens of a table that look valid (32 hex digits and its id), most at the edges of a position
    (their timestamps and seqs are unsigned 64-bit, SQL's integers signed)."""
    positions = [(2**63, 0), (2**63 + 5, 5), (2**64 - 1, 2**64 - 1), (2**63, 2**64 - 1), (2**63 - 1, 0), (5, 2**63),
                 (0, 0), (1, 2**64 - 1)]
    return [f"{ts:016x}{seq:016x}{table_id}" for ts, seq in positions] + [
        f"{'F' * 16}{'0' * 16}{table_id}", f"{'0' * 15}{'0' * 16}{table_id}", f"{'0' * 32}{table_id}x", "0" * 32]


def _params(values: dict[str, list[Any]]) -> dict[tuple[Any, ...], list[Any]]:
    return {("params", name): v for name, v in values.items()}


def xdcr_cases(target: Target) -> list[Case]:
    """The dr_* commands, a join's included."""
    join = {"page_rows": [0, -1, 100_001, 2**63, 2**64, "5", 1.5, True, None, MISSING, 1, 2],
            "source": [2, 99, "a", "nowhere", "", 1, -1, 2**64, 1.5, True, ["b"], None, MISSING, "b"],
            "restart": [False, "maybe", None, MISSING], "path": PATHS}
    page: dict[tuple[Any, ...], list[Any]] = {
        ("body", *location): [*NASTY, LONG_ROW] for location in [
            (0, "v"), (0, "v", 0), (0, "v", 1), (0, "p"), (0, "p", 0), (0, "key"), (0, "key", 0), (0, "row"),
            (0, "row", "k"), (0, "row", "v"), (0, "row", "x"), (0, "d"), (0,), (1,), ()]}
    write = Case("api", "dr_join_write", {"params": {"path": XJ, "page": 0}, "body": target.page},
                 {**page, **_params({"page": PAGES, "path": PATHS})})
    begin = Case("api", "dr_join_begin", {"params": {"path": XJ, "source": "b", "page_rows": 1, "restart": True}},
                 _params(join))
    return [
        # (a join's page is the largest input here, and its begin changes most: they weigh more)
        write, write, write, begin, begin,
        Case("api", "dr_join_read", {"params": {"path": XJ, "page": 0}}, _params({"page": PAGES, "path": PATHS})),
        Case("api", "dr_join_finish", {"params": {"path": XJ}}, _params({"path": PATHS})),
        Case("api", "dr_reset", {"params": {"cluster": "b", "force": False}},
             _params({"cluster": ["a", "nowhere", "", 2, None, ["b"], {"b": 1}, MISSING],
                      "force": [True, "maybe", "true", 1, None, MISSING]})),
        # never waiting for a drain (a null or missing wait waits)
        Case("api", "dr_pause", {"params": {"wait": False, "timeout": 1000}},
             _params({"wait": [False, "false", 0, "0", "maybe", [False]], "timeout": REFUSED_TIMEOUTS}),
             frozenset({("params", "wait")})),
        Case("api", "dr_drop", {"params": {"timeout": -1}}, _params({"timeout": REFUSED_TIMEOUTS, "wait": [False]}),
             frozenset({("params", "timeout")})),
        Case("api", "dr_resume", {"params": {}}, _params({"force": [True]})),
        Case("api", "dr_status", {"params": {}}, _params({"cluster": ["b", 5]})),
    ]


def setting_cases(target: Target) -> list[Case]:
    """``set`` of the XDCR settings of //sys and of a table's @xdcr."""
    flags = [False, "true", "%true", 1, 0, None, "false", [True]]
    return [
        Case("api", "set", {"params": {"path": "//sys/@xdcr_connections"}, "body": ["b"]}, {("body",): [
            [5], [None], [["b"]], {"b": 1}, "b", None, [""], ["x" * 1000], ["a"], ["nowhere"], ["b", "b"],
            ["b", "nowhere"], [], ""]}),
        Case("api", "set", {"params": {"path": "//sys/@xdcr_conflict_retention"}, "body": 3_600_000}, {("body",): [
            "week", None, float("inf"), float("nan"), [1], -1, 2**63, 2**64, 2**70, -(2**70), 1.5, "1000", True, 0,
            1]}),
        Case("api", "set", {"params": {"path": "//sys/@xdcr_preferred_source"}, "body": "b"}, {("body",): [
            "a", "nowhere", 2, 1, 99, -1, 2**64, True, "", None, ["b"]]}),
        *(Case("api", "set", {"params": {"path": f"{path}/@xdcr"}, "body": True}, {("body",): flags})
          for path in (*TABLES, EMPTY)),
    ]


def _tokens(target: Target, queue: str) -> list[Any]:
    """Tokens of ``queue`` (the crafted ones weigh most), of the other tables, and no tokens at all."""
    others = [t for q, tokens in target.tokens.items() if q != queue for t in tokens[:1]]
    crafted = crafted_tokens(target.table_ids[queue])
    return [*crafted * 4, *others, *target.tokens[queue], *NASTY, -5, "", "x"]


def stream_cases(target: Target) -> list[Case]:
    """pull_changes of each queue, from a token and from a timestamp."""
    cases = []
    for queue in QUEUES:
        values = {"from_event_token": _tokens(target, queue), "from_timestamp": TIMESTAMPS, "max_row_count": COUNTS,
                  "wait_timeout": WAITS, "path": PATHS}
        for start in ({"from_event_token": target.tokens[queue][0]}, {"from_timestamp": 0}):
            cases.append(Case("api", "pull_changes", {"params": {"path": queue, **start, "max_row_count": 10,
                                                                 "wait_timeout": 0}},
                              _params(values), frozenset({("params", "wait_timeout")})))
    return cases


def consumer_cases(target: Target) -> list[Case]:
    """The queue-consumer commands on each queue."""
    cases = []
    for queue in QUEUES:
        tokens = _tokens(target, queue)
        offset = target.consumers[queue]["c1"]["offset"]
        cases += [
            Case("api", "advance_consumer", {"params": {"queue_path": queue, "consumer_path": "c1",
                                                        "old_offset": offset, "new_offset": target.tokens[queue][-1]}},
                 _params({"new_offset": tokens, "old_offset": tokens, "consumer_path": CONSUMER_NAMES,
                          "queue_path": PATHS})),
            Case("api", "register_queue_consumer", {"params": {"queue_path": queue, "consumer_path": "new",
                                                               "vital": False, "from_timestamp": 0}},
                 _params({"from_timestamp": TIMESTAMPS, "consumer_path": CONSUMER_NAMES,
                          "vital": [True, "maybe", 1, None], "queue_path": PATHS})),
            Case("api", "pull_consumer", {"params": {"queue_path": queue, "consumer_path": "c1", "max_row_count": 10,
                                                     "wait_timeout": 0}},
                 _params({"consumer_path": CONSUMER_NAMES, "max_row_count": COUNTS, "wait_timeout": WAITS,
                          "queue_path": PATHS}), frozenset({("params", "wait_timeout")})),
            Case("api", "unregister_queue_consumer", {"params": {"queue_path": queue, "consumer_path": "c1"}},
                 _params({"consumer_path": CONSUMER_NAMES, "queue_path": PATHS})),
            Case("api", "list_queue_consumer_registrations", {"params": {"queue_path": queue}},
                 _params({"queue_path": PATHS})),
        ]
    return cases


APPLY_LOCATIONS: list[tuple[Any, ...]] = [
    ("actions", 0, "o"), ("end",), ("actions", 0), ("actions", 0, "p"), ("actions", 0, "e"), ("start",),
    ("actions", 0, "k"), ("actions", 0, "row", "k"), ("actions", 0, "row", "v"), ("actions", 0, "o", 0),
    ("actions", 0, "o", 1), ("end", 0), ("end", 1), ("start", 0), ("actions", 0, "p", 0), ("actions",),
    ("actions", 1), ("actions", 0, "key"), ("actions", 0, "row"), ("actions", 0, "b"), ("actions", 0, "row", "n"),
    ("actions", 0, "row", "x"), ("path",), ("origin_cluster",), ("origin_cluster_id",), ("schema",), ("schema", 0),
    ()]
APPLY_VALUES: list[Any] = [
    *NASTY, LONG_ROW, "insert", "update", "delete", "upsert", "bogus", [1, 1, True], [1, 2, 0], [1], ["a", 0, 0],
    [2**63, 0, 0], [100], ["a"], [[1]], [{"a": 1}], {"k": 1}, [2**62, 2], [1, 3], [1, 1], [1, 128]]
#: where the template batch ends in b's change log: past every position b itself ships to a (b's
#: shipper moves a's record of it along with b's log, whose positions are commit timestamps, about
#: 2**60.7 today), so that the batch is applied rather than answered as a retry; a's record of b is
#: forgotten after each accepted batch
APPLY_POSITION = 2**62
#: the version (microseconds, cluster id) of the template's change: a plausible one
APPLY_VERSION = [1_700_000_000_000_000, 2]


def apply_template() -> dict[str, Any]:
    """A batch b could send: one insert, with its version."""
    return {"path": XT, "origin_cluster": "b", "origin_cluster_id": 2, "schema": SIGNATURE, "start": [0, 0],
            "end": [APPLY_POSITION, 0], "actions": [{"p": [APPLY_POSITION, 0], "k": "insert", "key": None,
                                                     "o": APPLY_VERSION, "row": {"k": 100, "v": "from b", "n": 1},
                                                     "e": None, "b": None}]}


CALLERS = ["a", "c", "nowhere"]


def apply_cases(target: Target) -> list[Case]:
    """xdcr_apply, as b: the template batch, each change to a new key."""
    values: dict[tuple[Any, ...], list[Any]] = {("body", *loc): APPLY_VALUES for loc in APPLY_LOCATIONS}
    return [Case("internal", "xdcr_apply", {"caller": "b", "body": apply_template()},
                 {**values, ("caller",): CALLERS}, frozenset({("caller",)}), fresh=("body", "actions", 0, "row", "k"))]


def internal_cases(target: Target) -> list[Case]:
    """The other internal XDCR calls."""
    kept, spare = target.snapshots
    ids = ["x" * 1000, "", "0" * 32, "../a", "a/b", 5, None, [kept], MISSING]

    def case(method: str, body: dict[str, Any], values: dict[str, list[Any]], closed: bool = False) -> Case:
        locations = {("body", name): v for name, v in values.items()}
        return Case("internal", method, {"caller": "b", "body": body}, {**locations, ("caller",): CALLERS,
                                                                         ("body",): NASTY},
                    frozenset({("caller",), *(locations if closed else ())}))

    return [
        case("xdcr_forget", {"cluster": "b", "cluster_id": 2}, {"cluster_id": NASTY,
                                                                "cluster": ["a", "nowhere", "", 2, None, MISSING]}),
        case("xdcr_snapshot", {"path": XT, "schema": SIGNATURE, "page_rows": 2},
             {"page_rows": [0, -1, 100_001, 2**63, 2**64, "5", 1.5, True, None, MISSING, 1, 100_000],
              "schema": [SIGNATURE[:1], [], None, "x", [5], [{}], MISSING], "path": PATHS}),
        case("xdcr_snapshot_read", {"snapshot_id": kept, "page": 0}, {"snapshot_id": ids, "page": PAGES}),
        # (never the snapshot the reads use)
        case("xdcr_snapshot_release", {"snapshot_id": spare}, {"snapshot_id": ids}, closed=True),
        case("xdcr_identity", {}, {"cluster": ["b", 5]}),
    ]


# -- mutating and sending -------------------------------------------------------------------------------------

def mutated(template: Any, mutations: list[tuple[tuple[Any, ...], Any]]) -> Any:
    """A copy of ``template`` with the value at each location replaced (MISSING: removed); a
    location that an earlier mutation made unreachable is skipped."""
    value = json.loads(json.dumps(template))
    for location, new in mutations:
        if not location:
            value = new
            continue
        *steps, last = location
        container = value
        for step in steps:
            if not (isinstance(container, dict) and step in container or isinstance(container, list)
                    and isinstance(step, int) and step < len(container)):
                break
            container = container[step]
        else:
            index = isinstance(container, list) and isinstance(last, int)
            if new == MISSING:
                if isinstance(container, dict):
                    container.pop(last, None)
                elif index and last < len(container):
                    del container[last]
            elif isinstance(container, dict) or index and last < len(container):
                container[last] = new
            elif index:
                container.append(new)
    return value


def requests(cases: list[Case]) -> st.SearchStrategy[tuple[Case, dict[str, Any]]]:
    """A case and up to three mutations of it."""

    def mutations(case: Case) -> st.SearchStrategy[tuple[Case, dict[str, Any]]]:
        def value(location: tuple[Any, ...]) -> st.SearchStrategy[Any]:
            listed = st.sampled_from(case.values[location])
            return listed if location in case.closed else st.one_of(listed, listed, st.sampled_from(BOUNDARY), _values)

        one = st.sampled_from(list(case.values)).flatmap(
            lambda location: st.tuples(st.just(location), value(location)))
        changes = st.lists(one, min_size=1, max_size=3)
        if case.fresh is not None:
            fresh = case.fresh
            changes = st.tuples(st.integers(1_000, 2**31), changes).map(lambda c: [(fresh, c[0]), *c[1]])
        return changes.map(lambda c: (case, mutated(case.template, c)))

    return st.sampled_from(cases).flatmap(mutations)


def fuzz_one(target: Target, case: Case, request: dict[str, Any]) -> None:
    before = target.before()
    answer = target.send(case, request)
    what = f"{case.route} {case.name} {json.dumps(request, ensure_ascii=True)[:600]}"
    try:
        if case.name == "set" and answer.status_code == 200:
            # an accepted setting is one the engine works with: its status reads them
            _check_answer(target.call("dr_status", {}), f"dr_status after {what}")
        target.check(answer, what, before)
    finally:
        # the versions a batch or a join's page carries move this cluster's XDCR clock: whatever a
        # request said, the cluster's own writes to its XDCR tables still work (this one changes no row)
        write = target.call("insert_rows", {"path": XT}, {"k": -1, "v": "a-1", "n": -1})
        if write.status_code != 200:
            # (the clock lives in memory: a restart lets the examples after this one start afresh)
            target.restart()
            raise AssertionError(f"{what}: afterwards a write to {XT} fails: {write.status_code} {write.text[:300]}")


# -- the tests ----------------------------------------------------------------------------------------------

#: the requests each test sends, named after what it fuzzes
GROUPS = {"xdcr_commands": xdcr_cases, "xdcr_settings": setting_cases, "pull_changes": stream_cases,
          "consumer_commands": consumer_cases, "xdcr_apply": apply_cases, "internal_xdcr_calls": internal_cases}


@pytest.mark.parametrize("group", list(GROUPS))
@XFUZZ
@given(data=st.data())
def test_requests_never_fail_with_5xx_and_refusals_change_nothing(target: Target, group: str,
                                                                  data: st.DataObject) -> None:
    fuzz_one(target, *data.draw(requests(GROUPS[group](target))))


def test_the_engine_is_healthy_and_replicates_after_the_fuzzing(target: Target) -> None:
    a, b = target.a, target.b
    assert target.http.get("/readyz").status_code == 200
    with Client(a.url, a.token) as client, Client(b.url, b.token) as peer:
        assert client.call("dr_status", {})["connections"] == ["b"]
        client.insert_rows(XT, [{"k": 10_000, "v": "after", "n": 1}])
        assert client.lookup_rows(XT, [{"k": 10_000}]) == [{"k": 10_000, "v": "after", "n": 1}]
        wait_for(lambda: peer.lookup_rows(XT, [{"k": 10_000}]) != [], 10, "the row written after the fuzzing at b")
        client.insert_rows(SORTED, [{"k": 10_000, "v": "after", "n": 1}])
        assert client.pull_changes(SORTED, from_event_token=target.tokens[SORTED][-1], wait_timeout=0)["events"]
