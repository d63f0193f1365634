"""A cluster joins an XDCR group that holds data and has trimmed its change logs (seed 001).

Three real engines: ``a`` and ``b`` form the group, write (with conflicts and deletes) until their
logs are trimmed, then ``c`` joins from a snapshot of one of them while both keep writing. What
the users rely on: no member ships a partial log to the newcomer (it waits, and says so), the join
loses and repeats nothing, and afterwards all three converge, with deletes and conflicts resolved
alike everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import YtError
from reptables.testing import wait_for

from .conftest import ALL, SCHEMA, Writers, XdcrGroup, trimmed_group


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    group = XdcrGroup(tmp_path_factory.mktemp("xdcr_join"), names=ALL).start()
    try:
        yield group
    finally:
        group.stop()


def join(client: Client, path: str, source: str | None = None, page_rows: int = 100) -> dict[str, Any]:
    """What the Spark job does (sparkapps/xdcr_join.py), page by page in one thread."""
    begun = client.call("dr_join_begin", {"path": path, "page_rows": page_rows,
                                          **({"source": source} if source else {})})
    for page in begun["missing_pages"]:
        entries = client.call("dr_join_read", {"path": path, "page": page})["entries"]
        assert client.call("dr_join_write", {"path": path, "page": page}, entries)["applied"]
    finished: dict[str, Any] = client.call("dr_join_finish", {"path": path})
    return finished


def test_a_member_whose_log_is_trimmed_waits_for_the_newcomers_snapshot_instead_of_shipping_part(
        trio: XdcrGroup) -> None:
    path = "//tmp/users_wait"
    trimmed_group(trio, path)
    trio.connect(ALL)
    for name in ("a", "b"):
        wait_for(lambda n=name: trio.client(n).call("dr_status", {})["peers"]["c"]["state"] == "waiting_for_snapshot",
                 30, f"{name} waiting for c's snapshot")
        status = trio.client(name).call("dr_status", {})["peers"]["c"]
        assert "dr join" in status["last_error"] and path in status["last_error"]
    assert trio.rows("c", path) == []  # nothing partial arrived
    join(trio.client("c"), path)
    wait_for(lambda: trio.converged(path), 30, "c converged with a and b")
    assert len(trio.rows("c", path)) == 420
    for name in ("a", "b"):
        wait_for(lambda n=name: trio.client(n).call("dr_status", {})["peers"]["c"]["state"] == "connected", 30,
                 f"{name} shipping to c")


def test_a_cluster_joins_from_a_snapshot_while_the_group_writes_and_all_three_converge(trio: XdcrGroup) -> None:
    path = "//tmp/users_live"
    trimmed_group(trio, path)
    trio.connect(ALL)
    c = trio.client("c")
    with Writers(trio, path, ("a", "b")) as writers:
        wait_for(lambda: min(writers.writes.values()) > 20, 30, "both writers running")
        begun = c.call("dr_join_begin", {"path": path, "source": "b", "page_rows": 50})
        assert begun["source"] == "b" and begun["pages"] >= 8 and begun["rows"] >= 420
        # while it joins, its table takes no client writes (and says why)
        with pytest.raises(YtError, match="joining") as refused:
            c.insert_rows(path, [{"id": 1, "name": "early", "password": "z"}])
        assert path in str(refused.value)
        assert c.call("dr_status", {})["joining"][path]["missing_pages"] == list(range(begun["pages"]))
        # finishing before every page is there is refused
        with pytest.raises(YtError, match="misses"):
            c.call("dr_join_finish", {"path": path})
        for page in begun["missing_pages"]:
            entries = c.call("dr_join_read", {"path": path, "page": page})["entries"]
            assert c.call("dr_join_write", {"path": path, "page": page}, entries)["applied"]
            # a page written twice (a retried task) is loaded once
            assert not c.call("dr_join_write", {"path": path, "page": page}, entries)["applied"]
        # a join run again before its finish resumes the same snapshot
        again = c.call("dr_join_begin", {"path": path, "source": "b"})
        assert again["snapshot_id"] == begun["snapshot_id"] and again["missing_pages"] == []
        finished = c.call("dr_join_finish", {"path": path})
        assert finished["joined"] and path not in c.call("dr_status", {})["joining"]
        wait_for(lambda: len(trio.rows("c", path)) > 420, 30, "changes after the snapshot reaching c")
        time.sleep(0.5)
    wait_for(lambda: trio.converged(path), 60, "a, b and c converged")
    rows = trio.rows("a", path)
    assert len(rows) == 420 + sum(writers.writes.values())
    assert not any(r["id"] < 40 for r in rows)  # the deletes made before the join hold on c too
    # the newcomer is a full member: its writes and deletes reach both, conflicts resolve alike
    c.insert_rows(path, [{"id": 7_000_000, "name": "from-c", "password": "c"}])
    c.delete_rows(path, [{"id": 100}])
    trio.client("a").insert_rows(path, [{"id": 101, "name": "a-late", "password": "a"}])
    # (a's change to the key may be applied on c at that moment: 1700, retried as a client does)
    wait_for(lambda: c.insert_rows(path, [{"id": 101, "name": "c-late", "password": "c"}]) is None, 10,
             "c's write of key 101")
    wait_for(lambda: trio.converged(path), 30, "the newcomer's writes converged")
    final = {r["id"]: r for r in trio.rows("b", path)}
    assert final[7_000_000]["name"] == "from-c" and 100 not in final and final[101]["name"] in ("a-late", "c-late")


def test_a_table_written_on_the_joining_cluster_cannot_join_from_a_snapshot(trio: XdcrGroup) -> None:
    path = "//tmp/users_own"
    for name in ALL:
        trio.client(name).create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True})
        trio.client(name).mount_table(path)
    trio.client("c").insert_rows(path, [{"id": 1, "name": "mine", "password": "c"}])
    with pytest.raises(YtError, match="written on this cluster") as refused:
        trio.client("c").call("dr_join_begin", {"path": path, "source": "a"})
    assert path in str(refused.value)
    assert trio.rows("c", path) == [{"id": 1, "name": "mine", "password": "c"}]
    with pytest.raises(YtError, match="not an XDCR connection"):
        trio.client("a").call("dr_join_begin", {"path": path, "source": "nowhere"})


def test_a_join_survives_the_sigkill_of_the_joiner_and_of_the_donor(trio: XdcrGroup) -> None:
    path = "//tmp/users_killed"
    trimmed_group(trio, path)
    trio.connect(ALL)
    begun = trio.client("c").call("dr_join_begin", {"path": path, "source": "a", "page_rows": 60})
    half = begun["missing_pages"][: begun["pages"] // 2]
    for page in half:
        entries = trio.client("c").call("dr_join_read", {"path": path, "page": page})["entries"]
        trio.client("c").call("dr_join_write", {"path": path, "page": page}, entries)
    trio.restart("c")  # SIGKILL, then started again
    trio.restart("a")
    resumed = trio.client("c").call("dr_join_begin", {"path": path})
    assert resumed["snapshot_id"] == begun["snapshot_id"] and resumed["loaded_pages"] == half
    finished = join(trio.client("c"), path)
    assert finished["joined"]
    wait_for(lambda: trio.converged(path), 30, "a, b and c converged after the kills")
    assert len(trio.rows("c", path)) == 420
