"""A bounded fuzzer over the public commands and the internal API of a real engine.

Hand-written bad-input tests cover the cases someone thought of; this covers the rest: hypothesis
sends commands with random parameters and bodies (deep nesting, huge integers, lone surrogates,
``$`` keys, garbage encodings and formats) and random internal calls, derandomized so that CI runs
the same examples every time. What a user relies on, asserted for every request:

* the engine answers every request, and never with a 5xx (a 5xx is reserved for faults of the
  engine itself: a broken disk, a bug);
* a refused request (4xx) carries a YT error with a specific code (never the generic code 1) and
  changes nothing: the tree and the rows of the tables read the same before and after;
* after the whole run the engine is ready and still reads and writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.testing import EngineProcess

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "d", "type": "double"}]
COMMANDS = ["create", "get", "set", "remove", "exists", "list", "mount_table", "unmount_table", "remount_table",
            "freeze_table", "unfreeze_table", "reshard_table", "trim_rows", "alter_table", "alter_table_replica",
            "insert_rows", "delete_rows", "lock_rows", "lookup_rows", "select_rows", "generate_timestamp",
            "start_transaction", "ping_transaction", "commit_transaction", "abort_transaction",
            "get_in_sync_replicas", "no_such_command"]
INTERNAL = ["prepare", "commit", "abort", "push", "transaction_status", "table_info", "no_such_method"]
PATHS = ["//tmp/t", "//tmp/log", "//tmp/rt", "//tmp/r", "//tmp/x", "//tmp/x/y", "//sys", "//sys/clusters",
         "//sys/clusters/self", "//sys/clusters/self/token", "/", "//", "#0-0-12f-0", "//tmp/t/@schema",
         "//tmp/t/@tablet_state", "//tmp/rt/@replicas", "//tmp/@", "//tmp/t/@", "//tmp/x/@attr", "//home/a",
         "//tmp/" + "d/" * 70 + "leaf", "//tmp/\ud800", "//tmp/x\0y", "//tmp/x y", ""]
WATCHED = ("//tmp/t", "//tmp/log", "//tmp/r")

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
            | st.sampled_from(["\ud800", "$value", "<hidden>", "#0-0-12f-0", "1e30", "%true", "", "x" * 300]))
_keys = st.text(max_size=8) | st.sampled_from(["$value", "$attributes", "k", "v", "d", "path", "token",
                                                "proxy_url", "schema", "dynamic", "\ud800"])
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
                       max_leaves=12)
_rows = st.lists(st.dictionaries(st.sampled_from(["k", "v", "d", "x", "$tablet_index"]), _scalars, max_size=4),
                 max_size=4)


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


_params = st.fixed_dictionaries({}, optional={
    "path": st.sampled_from(PATHS) | st.text(max_size=12),
    "type": st.sampled_from(["table", "map_node", "string_node", "replicated_table", "table_replica",
                             "table_collocation", "document", "no_such_type"]),
    "attributes": _values | st.just({"dynamic": True, "schema": SCHEMA}) | st.just(_deep(700)),
    "recursive": st.booleans(), "force": st.booleans(), "ignore_existing": st.booleans(),
    "query": st.sampled_from(["* from [//tmp/t]", "k, v from [//tmp/t] where k > 1 limit 3", "* from [//tmp/log]",
                              "* from [//tmp/rt]", "sum(k) from [//tmp/t] group by 1", "garbage", "",
                              "* from [//tmp/t] where " + "(" * 500 + "k" + ")" * 500]) | st.text(max_size=30),
    "timestamp": st.integers(min_value=-1, max_value=2**64),
    "transaction_id": st.sampled_from(["0-0-0-0", "1-2-3-4", "bad"]) | st.text(max_size=10),
    "replica_id": st.text(max_size=12), "mode": st.sampled_from(["sync", "async", "bogus"]),
    "enabled": st.booleans(), "tablet_index": st.integers(min_value=-2, max_value=2**64),
    "trimmed_row_count": st.integers(min_value=-2, max_value=2**64),
    "pivot_keys": _values, "tablet_count": _scalars,
    "input_format": st.sampled_from(["json", "yson", "<format=text>yson", "dsv", "bogus", ""]),
    "output_format": st.sampled_from(["json", "yson", "bogus"]),
    "atomicity": st.sampled_from(["full", "none", "bogus"]), "durability": st.sampled_from(["sync", "async", "x"]),
    "require_sync_replica": st.booleans(), "keep_missing_rows": st.booleans(),
    "output_row_limit": st.integers(min_value=-1, max_value=2**40),
    "attributes_list": st.lists(st.text(max_size=6), max_size=3),
})


def _body(rows: list[dict[str, Any]] | Any, kind: str) -> bytes:
    if kind == "json_rows" and isinstance(rows, list):
        return b"\n".join(json.dumps(r, ensure_ascii=True).encode() for r in rows)
    if kind == "json_value":
        return json.dumps(rows, ensure_ascii=True).encode()
    if kind == "garbage":
        return b"\xff\xfe{[;<>\x00" * 3
    return b""


_requests = st.tuples(st.sampled_from(COMMANDS), _params, _rows | _values,
                      st.sampled_from(["json_rows", "json_rows", "json_value", "json_value", "garbage", "none"]),
                      # mostly well-formed envelopes, so that most examples reach the commands themselves
                      st.sampled_from(["", "", "", "", "", "", "gzip", "br", "deflate", "x-unknown"]),
                      st.sampled_from(["json", "json", "json", "json", "yson", "bogus"]))


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProcess, httpx.Client]]:
    engine = EngineProcess("self", Path(tmp_path_factory.mktemp("fuzz"))).start()
    try:
        with Client(engine.url, engine.token) as client:
            client.set("//sys/clusters", {"self": {"proxy_url": engine.url,
                                                     "token": peer_credential(engine.token, "self")}})
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table("//tmp/t")
            client.insert_rows("//tmp/t", [{"k": i, "v": f"v{i}", "d": i / 2} for i in range(5)])
            client.create("table", "//tmp/log", attributes={"dynamic": True, "schema": SCHEMA[1:]})
            client.mount_table("//tmp/log")
            client.create("replicated_table", "//tmp/rt", attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table("//tmp/rt")
            replica = client.call("create", {"type": "table_replica", "attributes": {
                "table_path": "//tmp/rt", "cluster_name": "self", "replica_path": "//tmp/r"}})["node_id"]
            client.create("table", "//tmp/r", attributes={"dynamic": True, "schema": SCHEMA,
                                                          "upstream_replica_id": replica})
            client.mount_table("//tmp/r")
            client.call("alter_table_replica", {"replica_id": replica, "enabled": True})
        with httpx.Client(base_url=engine.url, headers={"Authorization": f"OAuth {engine.token}"},
                          timeout=30.0) as http:
            yield engine, http
    finally:
        engine.stop()


def _state(http: httpx.Client) -> Any:
    """What a refused request must not change: the tree and the rows of the watched tables."""
    tree = http.get("/api/v4/get", params={"path": "//"}).json()
    rows = {}
    for path in WATCHED:
        answer = http.get("/api/v4/select_rows", params={"query": f"* from [{path}]"},
                          headers={"X-YT-Output-Format": "json"})
        rows[path] = answer.text if answer.status_code == 200 else answer.status_code
    return tree, rows


def _check_answer(answer: httpx.Response, what: str) -> None:
    assert answer.status_code < 500, f"{what}: {answer.status_code} {answer.text[:500]}"
    if answer.status_code >= 400:
        error = json.loads(answer.headers["X-YT-Error"])
        assert error["code"] != 1, f"{what}: generic error code 1: {error['message'][:300]}"
        assert len(answer.headers["X-YT-Error"]) <= 16_384, f"{what}: X-YT-Error of {len(answer.headers['X-YT-Error'])}"


#: examples a test sends: the suite's short mode by default, derandomized (the same examples every
#: run: a regression check). ``bash hack/fuzz.sh`` is the long mode: thousands of examples a test
#: (``REPTABLES_FUZZ_EXAMPLES``), fresh ones from the seed in ``REPTABLES_FUZZ_SEED`` (which it prints
#: and also hands pytest as ``--hypothesis-seed``: give it again to send the same examples)
EXAMPLES = int(os.environ.get("REPTABLES_FUZZ_EXAMPLES", "200"))
SEED = os.environ.get("REPTABLES_FUZZ_SEED")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(request=_requests)
def test_public_commands_never_fail_with_5xx_and_refusals_change_nothing(
        fuzzed: tuple[EngineProcess, httpx.Client], request: tuple[Any, ...]) -> None:
    engine, http = fuzzed
    command, params, payload, body_kind, encoding, header_format = request
    params = dict(params)
    if "attributes_list" in params:
        params["attributes"] = params.pop("attributes_list")
    before = _state(http)
    headers = {"X-YT-Header-Format": header_format, "X-YT-Parameters": json.dumps(params, ensure_ascii=True)}
    if encoding:
        headers["Content-Encoding"] = encoding
    answer = http.post(f"/api/v4/{command}", headers=headers, content=_body(payload, body_kind))
    what = f"{command} {json.dumps(params, ensure_ascii=True)[:300]} body={body_kind} enc={encoding}"
    _check_answer(answer, what)
    if answer.status_code >= 400:
        assert _state(http) == before, f"{what}: a refused request changed the state"


_internal_bodies = st.fixed_dictionaries({}, optional={
    "transaction_id": st.text(max_size=10), "coordinator": st.sampled_from(["self", "nowhere", ""]),
    "replica_id": st.text(max_size=10), "upstream_replica_id": st.text(max_size=10),
    "replica_path": st.sampled_from(["//tmp/r", "//tmp/t", "//tmp/nowhere", ""]),
    "tablet_index": _scalars, "start_timestamp": _scalars, "prepare_timestamp": _scalars,
    "commit_timestamp": _scalars, "prev_row_index": _scalars, "row_index": _scalars,
    "entries": st.lists(st.fixed_dictionaries({"timestamp": _scalars, "kind": st.sampled_from(["write", "delete", "x"]),
                                               "payload": _values}), max_size=3),
    "columns": _values, "kinds": _values, "rows": _values, "path": st.sampled_from(PATHS),
    "progress": _values, "preserve_timestamps": st.booleans(),
})


@FUZZ
@given(method=st.sampled_from(INTERNAL), body=_internal_bodies | _values)
def test_internal_calls_never_fail_with_5xx(fuzzed: tuple[EngineProcess, httpx.Client], method: str,
                                            body: Any) -> None:
    engine, http = fuzzed
    before = _state(http)
    # as the cluster itself (its directory names it "self"): a peer credential, which internal calls take
    answer = http.post(f"/internal/v1/{method}", content=json.dumps(body, ensure_ascii=True).encode(),
                       headers={"Authorization": f"OAuth {peer_credential(engine.token or '', 'self')}"})
    what = f"internal {method} {json.dumps(body, ensure_ascii=True)[:300]}"
    _check_answer(answer, what)
    if answer.status_code >= 400:
        assert _state(http) == before, f"{what}: a refused call changed the state"


def test_the_engine_is_healthy_after_the_fuzzing(fuzzed: tuple[EngineProcess, httpx.Client]) -> None:
    engine, http = fuzzed
    assert http.get("/readyz").status_code == 200
    with Client(engine.url, engine.token) as client:
        if not client.exists("//tmp/t"):  # the fuzzer may have removed it (remove is fuzzed too)
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": SCHEMA})
        state = client.get("//tmp/t/@tablet_state")  # the fuzzer may have frozen or unmounted it
        if state == "frozen":
            client.unfreeze_table("//tmp/t")
        elif state == "unmounted":
            client.mount_table("//tmp/t")
        client.insert_rows("//tmp/t", [{"k": 10_000, "v": "after"}])
        assert client.lookup_rows("//tmp/t", [{"k": 10_000}])[0]["v"] == "after"
        assert client.get("//tmp/@type") == "map_node"
