"""What one member of an XDCR group can make another do: only what its own changes may.

The issue's reproducers, replayed with the peer credential of ONE cluster (``b``, a member) or of a
cluster that is in the directory but not in the group (``d``): a member claiming another member's
id or a position far in the future, making a receiver forget another member, pushing versions that
would move every member's clock; a directory peer pushing rows into an XDCR table or into
``//sys``; bodies that used to answer 500; unbounded conflict-log images, snapshots and settings.
Each is refused with a 4xx that names the reason, and afterwards the group still replicates
everything its members write.

Four engines for the module: ``a``, ``b`` and ``c`` form a group, ``d`` is only in the directories.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.testing import wait_for

from .conftest import SCHEMA, XdcrGroup

MEMBERS = ("a", "b", "c")
_n = itertools.count()
SIGNATURE = [{"name": "id", "type": "int64", "sort_order": "ascending", "required": False},
             {"name": "name", "type": "string", "sort_order": None, "required": False},
             {"name": "password", "type": "string", "sort_order": None, "required": False}]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    g = XdcrGroup(tmp_path_factory.mktemp("trust"), names=("a", "b", "c", "d")).start()
    g.connect(MEMBERS)
    try:
        yield g
    finally:
        g.stop()


def table(group: XdcrGroup) -> str:
    return group.table(f"//tmp/trust{next(_n)}", names=MEMBERS)


def internal(group: XdcrGroup, target: str, caller: str, method: str, body: Any) -> httpx.Response:
    engine = group.engines[target]
    return httpx.post(f"{engine.url}/internal/v1/{method}", content=json.dumps(body), timeout=20,
                      headers={"Authorization": f"OAuth {peer_credential(engine.token or '', caller)}",
                               "Content-Type": "application/json"})


def refused(response: httpx.Response, status: int, code: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text[:800])
    error: dict[str, Any] = response.json()
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error


def now_us() -> int:
    return time.time_ns() // 1000


def commit_ts(group: XdcrGroup, name: str) -> int:
    return int(group.client(name).generate_timestamp())


def apply_body(group: XdcrGroup, path: str, origin: str, origin_id: int, **overrides: Any) -> dict[str, Any]:
    """A well-formed ``xdcr_apply`` of one insert, as ``origin``'s shipper would send it."""
    ts = commit_ts(group, origin)
    body = {"path": path, "origin_cluster": origin, "origin_cluster_id": origin_id, "schema": SIGNATURE,
            "start": [0, 0], "end": [ts, 1],
            "actions": [{"p": [ts, 1], "k": "insert", "key": None, "row": {"id": 1, "name": "x", "password": "p"},
                         "o": [now_us(), origin_id], "e": None, "b": None}]}
    body.update(overrides)
    return body


def converges_after_writes(group: XdcrGroup, path: str) -> None:
    """Every member's own write reaches every other member."""
    for i, name in enumerate(MEMBERS):
        group.client(name).insert_rows(path, [{"id": 1000 + i, "name": f"by {name}", "password": "-"}])
    wait_for(lambda: all({r["id"] for r in group.rows(n, path)} >= {1000, 1001, 1002} for n in MEMBERS), 30,
             "every member's write on every member")


# -- identity and authority --------------------------------------------------------------------------

def test_a_member_cannot_send_changes_as_another_member(group: XdcrGroup) -> None:
    path = table(group)
    # b claims c's cluster id (3), with a position far in the future
    body = apply_body(group, path, "b", 3, end=[1 << 62, 0])
    body["actions"][0]["p"] = [1 << 62, 0]
    body["actions"][0]["o"] = [now_us(), 3]
    refused(internal(group, "a", "b", "xdcr_apply", body), 400, 101, "end")
    # the same with a plausible position: b's engine has id 2, not 3
    refused(internal(group, "a", "b", "xdcr_apply", apply_body(group, path, "b", 3)), 403, 901,
            "may not act as XDCR cluster id 3")
    # or in the name of c
    refused(internal(group, "a", "b", "xdcr_apply", apply_body(group, path, "c", 3)), 403, 901,
            "in the name of c")
    assert group.rows("a", path) == []
    # c's real changes still reach a, and dr_status tells the truth
    converges_after_writes(group, path)


def test_a_member_can_make_a_receiver_forget_only_itself(group: XdcrGroup) -> None:
    path = table(group)
    refused(internal(group, "a", "b", "xdcr_forget", {"cluster": "b", "cluster_id": 3}), 403, 901,
            "may not act as XDCR cluster id 3")
    refused(internal(group, "a", "b", "xdcr_forget", {"cluster": "c", "cluster_id": 3}), 403, 901)
    assert group.client("a").get("//sys/@xdcr_connections") == ["b", "c"]
    converges_after_writes(group, path)


def test_versions_and_positions_far_ahead_of_the_clock_are_refused(group: XdcrGroup) -> None:
    path = table(group)
    for o in ([1 << 62, 2], [(1 << 63) + 5, 2], [-1, 2], ["1", 2], [now_us(), 3]):
        body = apply_body(group, path, "b", 2)
        body["actions"][0]["o"] = o
        refused(internal(group, "a", "b", "xdcr_apply", body), 400, 101, "actions[0].o")
    for end in ([1 << 62, 0], [(1 << 63) + 5, 0], [-5, 0], ["a", 0], [1, 2, 3]):
        refused(internal(group, "a", "b", "xdcr_apply", apply_body(group, path, "b", 2, end=end)), 400, 101, "end")
    # nothing moved a's clocks: its next XDCR change carries a version of now, and b applies it
    group.client("a").insert_rows(path, [{"id": 5, "name": "after", "password": "-"}])
    wait_for(lambda: [r["id"] for r in group.rows("b", path)] == [5], 20, "a's change on b")
    answer = group.client("b").pull_changes(path, from_timestamp=1 << 30, wait_timeout=0)
    [event] = [e for e in answer["events"] if e["kind"] != "heartbeat"]
    assert abs(event["origin_timestamp"] - now_us()) < 60_000_000, event


def test_malformed_xdcr_bodies_are_protocol_errors_never_500(group: XdcrGroup) -> None:
    path = table(group)
    good = apply_body(group, path, "b", 2)
    action = good["actions"][0]
    bodies = [
        {**good, "end": ["a", 0]}, {**good, "actions": [5]}, {**good, "actions": [{**action, "p": None}]},
        {**good, "actions": [{**action, "p": ["x", 1]}]}, {**good, "actions": [{**action, "o": None}]},
        {**good, "actions": [{**action, "e": ["a", 1, False]}]}, {**good, "actions": [{**action, "e": [1, 1]}]},
        {**good, "actions": [{**action, "k": "delete", "key": 5}]}, {**good, "actions": [{**action, "row": [1]}]},
        {**good, "actions": [{**action, "b": "not a row"}]}, {**good, "start": {"x": 1}},
        {**good, "origin_cluster_id": "2"}, {**good, "actions": {"0": action}}, {**good, "path": 7},
        # a delete horizon that is not a version, or that the change's own history cannot have
        {**good, "actions": [{**action, "h": ["x", 1]}]}, {**good, "actions": [{**action, "h": [1, 1]}]},
        {**good, "actions": [{**action, "e": [5, 1, True], "h": [4, 1]}]},
        {**good, "actions": [{**action, "k": "delete", "key": [1], "h": [1, 1]}]},
    ]
    for body in bodies:
        response = internal(group, "a", "b", "xdcr_apply", body)
        assert 400 <= response.status_code < 500 and response.json()["code"] not in (1, None), \
            (body, response.status_code, response.text[:300])
    for method, body in (("xdcr_forget", {"cluster": "b", "cluster_id": "2"}), ("xdcr_forget", {"cluster": 2}),
                         ("xdcr_snapshot_read", {"snapshot_id": "x", "page": "0"}),
                         ("xdcr_snapshot_release", {"snapshot_id": None}), ("xdcr_snapshot", {"path": 5})):
        response = internal(group, "a", "b", method, body)
        assert 400 <= response.status_code < 500, (method, body, response.text[:300])
    assert group.rows("a", path) == []


def test_a_directory_peer_outside_the_group_cannot_write_xdcr_or_system_tables(group: XdcrGroup) -> None:
    path = table(group)
    ts = commit_ts(group, "d")
    push = {"upstream_replica_id": "1-2-3-4", "replica_path": path, "tablet_index": 0, "prev_row_index": 0,
            "row_index": 1, "preserve_timestamps": False,
            "entries": [{"timestamp": ts, "kind": "write", "payload": {"row": {"id": 7, "name": "forged"}}}]}
    refused(internal(group, "a", "d", "push", push), 403, 901, "XDCR table")
    # nor the conflict log, nor any other table under //sys
    forged = {**push, "replica_path": "//sys/xdcr_conflicts",
              "entries": [{"timestamp": ts, "kind": "write", "payload": {"row": {"ROW_TYPE": "NEW"}}}]}
    refused(internal(group, "a", "d", "push", forged), 403, 901, "system table")
    refused(internal(group, "a", "d", "table_info", {"path": "//sys/xdcr_conflicts"}), 403, 901, "system table")
    refused(internal(group, "a", "d", "table_info", {"path": path}), 403, 901, "XDCR table")
    # a member's push is no better: XDCR tables change only through XDCR
    refused(internal(group, "a", "b", "push", push), 403, 901, "XDCR table")
    assert group.rows("a", path) == []
    assert not group.client("a").select_rows("* from [//sys/xdcr_conflicts] where ROW_TYPE = 'NEW' and "
                                             "is_null(TABLE_NAME)")


def test_a_push_into_a_plain_table_is_refused_while_the_cluster_is_paused(group: XdcrGroup) -> None:
    a = group.client("a")
    plain = f"//tmp/plain{next(_n)}"
    a.create("table", plain, attributes={"dynamic": True, "schema": SCHEMA})
    a.mount_table(plain)
    push = {"upstream_replica_id": "1-2-3-4", "replica_path": plain, "tablet_index": 0, "prev_row_index": 0,
            "row_index": 1, "preserve_timestamps": False,
            "entries": [{"timestamp": commit_ts(group, "d"), "kind": "write",
                         "payload": {"row": {"id": 7, "name": "while paused"}}}]}
    a.call("dr_pause", {"wait": False})
    try:
        refused(internal(group, "a", "d", "push", push), 400, 605, "paused")
    finally:
        a.call("dr_resume", {})
    assert a.select_rows(f"* from [{plain}]") == []


# -- bounded resources -------------------------------------------------------------------------------

def test_conflict_log_images_are_checked_and_bounded(group: XdcrGroup) -> None:
    path = table(group)
    group.client("a").insert_rows(path, [{"id": 1, "name": "here", "password": "-"}])
    wait_for(lambda: len(group.rows("b", path)) == 1, 20, "the row on b")
    # an update made on a version a does not have: a conflict, whose EXP row logs the row the update
    # was made on; that row is checked like any row, and a bad one refuses the whole batch
    body = apply_body(group, path, "b", 2)
    body["actions"][0].update({"k": "update", "row": {"id": 1, "name": "y", "password": "p"},
                               "e": [now_us() - 10_000_000, 2, False], "b": {"id": "not a number"}})
    refused(internal(group, "a", "b", "xdcr_apply", body), 400, 307, "id")
    assert group.rows("a", path) == [{"id": 1, "name": "here", "password": "-"}]
    # a 3 MB row meets a row it did not expect: the log keeps 1 MB of each image (seed 001's TUPLE)
    big = "x" * 3_000_000
    body = apply_body(group, path, "b", 2)
    body["actions"][0].update({"k": "update", "row": {"id": 1, "name": big, "password": "p"},
                               "e": [now_us() - 10_000_000, 2, False],
                               "b": {"id": 1, "name": big, "password": "-"}})
    # (b's stored record of a's position is unknown here: send past it)
    answer = internal(group, "a", "b", "xdcr_apply", body)
    assert answer.status_code == 200, answer.text[:500]
    rows = [r for r in group.client("a").select_rows("* from [//sys/xdcr_conflicts]", output_row_limit=10_000)
            if r["TABLE_NAME"] == path]
    assert rows and all(len(r["TUPLE"].encode()) <= 1_000_000 for r in rows)
    assert {r["KEY"] for r in rows} == {'{"id": 1}'}


def test_snapshots_belong_to_the_member_that_took_them_and_are_capped(group: XdcrGroup) -> None:
    path = table(group)
    group.client("a").insert_rows(path, [{"id": 1, "name": "in the cut", "password": "-"}])
    taken = internal(group, "a", "b", "xdcr_snapshot", {"path": path, "schema": SIGNATURE})
    assert taken.status_code == 200, taken.text[:500]
    snapshot_id = taken.json()["snapshot_id"]
    refused(internal(group, "a", "c", "xdcr_snapshot_read", {"snapshot_id": snapshot_id, "page": 0}), 403, 901,
            "taken for another cluster")
    refused(internal(group, "a", "c", "xdcr_snapshot_release", {"snapshot_id": snapshot_id}), 403, 901)
    assert internal(group, "a", "b", "xdcr_snapshot_read", {"snapshot_id": snapshot_id, "page": 0}).status_code == 200
    # a second cut of the same table replaces the first; other tables count against a cap
    again = internal(group, "a", "b", "xdcr_snapshot", {"path": path, "schema": SIGNATURE})
    assert again.status_code == 200
    refused(internal(group, "a", "b", "xdcr_snapshot_read", {"snapshot_id": snapshot_id, "page": 0}), 400, 500)
    others = [table(group) for _ in range(4)]
    answers = [internal(group, "a", "b", "xdcr_snapshot", {"path": p, "schema": SIGNATURE}) for p in others]
    assert [r.status_code for r in answers[:3]] == [200, 200, 200]
    refused(answers[3], 400, 1802, "holds 4 XDCR snapshots")
    for r in [again, *answers[:3]]:
        assert internal(group, "a", "b", "xdcr_snapshot_release",
                        {"snapshot_id": r.json()["snapshot_id"]}).status_code == 200
    assert not list((group.engines["a"].data_dir / "xdcr_snapshots").iterdir())


@pytest.mark.parametrize(("path", "value", "words"), [
    ("//sys/@xdcr_connections", [f"peer{i}" for i in range(300)], "more than the 127"),
    ("//sys/@xdcr_connections", ["b", "a"], "its own name"),
    ("//sys/@xdcr_connections", ["b", "b"], "listed twice"),
    ("//sys/@xdcr_connections", {"b": 1}, "expected a list"),
    ("//sys/@xdcr_connections", ["b", "nowhere"], "not in //sys/clusters"),
    ("//sys/@xdcr_conflict_retention", "abc", "milliseconds"),
    ("//sys/@xdcr_conflict_retention", -1, "milliseconds"),
    ("//sys/@xdcr_preferred_source", "nowhere", "//sys/clusters name"),
    ("//sys/@xdcr_preferred_source", 300, "0-127"),
])
def test_xdcr_settings_are_checked_when_set(group: XdcrGroup, path: str, value: Any, words: str) -> None:
    a = group.client("a")
    with pytest.raises(YtError) as error:
        a.set(path, value)
    assert error.value.code == 1802 and words in error.value.message, error.value.message
    assert a.get("//sys/@xdcr_connections") == ["b", "c"]


def test_a_table_xdcr_flag_is_a_boolean(group: XdcrGroup) -> None:
    a = group.client("a")
    with pytest.raises(YtError) as error:
        a.create("table", f"//tmp/flag{next(_n)}", attributes={"dynamic": True, "schema": SCHEMA, "xdcr": "yes"})
    assert "must be a boolean" in error.value.message
    plain = f"//tmp/flag{next(_n)}"
    a.create("table", plain, attributes={"dynamic": True, "schema": SCHEMA})
    with pytest.raises(YtError, match="must be a boolean"):
        a.set(f"{plain}/@xdcr", 1)


def test_connecting_clusters_that_share_an_id_is_refused(tmp_path: Path) -> None:
    group = XdcrGroup(tmp_path, names=("x", "y")).start()
    other = XdcrGroup(tmp_path / "other", names=("z",)).start()  # cluster id 1, like x
    try:
        z = other.engines["z"]
        group.client("x").set("//sys/clusters/z", {"proxy_url": z.url, "token": peer_credential(z.token or "", "x")})
        other.client("z").set("//sys/clusters/x", {"proxy_url": group.engines["x"].url,
                                                   "token": peer_credential(group.engines["x"].token or "", "z")})
        with pytest.raises(YtError) as error:
            group.client("x").set("//sys/@xdcr_connections", ["y", "z"])
        assert "clusters x and z both have XDCR cluster id 1" in error.value.message
        group.client("x").set("//sys/@xdcr_connections", ["y"])
    finally:
        other.stop()
        group.stop()


def test_differing_schemas_are_reported_by_column_in_plain_words(group: XdcrGroup) -> None:
    path = f"//tmp/schemas{next(_n)}"
    other = [*SCHEMA[:2], {"name": "password", "type": "int64"}, {"name": "extra", "type": "string"}]
    for name, schema in (("a", SCHEMA), ("b", other), ("c", SCHEMA)):
        group.client(name).create("table", path, attributes={"dynamic": True, "schema": schema, "xdcr": True})
        group.client(name).mount_table(path)
    group.client("a").insert_rows(path, [{"id": 1, "name": "n", "password": "p"}])

    def waiting() -> str | None:
        error = group.client("a").call("dr_status", {})["peers"]["b"]["last_error"]
        return error if error and path in error else None

    try:
        message = wait_for(waiting, 20, "a to report the schema difference with b")
        assert "column password is string on a but int64 on b" in message, message
        assert "column extra (string) exists only on b" in message, message
        assert "None" not in message and "'" not in message, message
    finally:
        for name in MEMBERS:
            group.client(name).unmount_table(path)
            group.client(name).remove(path)
