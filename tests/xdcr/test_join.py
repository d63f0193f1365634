"""A cluster joins an XDCR group that holds data and has trimmed its change logs (seed 001).

Three real engines: ``a`` and ``b`` form the group, write (with conflicts and deletes) until their
logs are trimmed, then ``c`` joins from a snapshot of one of them while both keep writing. What
the users rely on: no member ships a partial log to the newcomer (it waits, and says so), the join
loses and repeats nothing, and afterwards all three converge, with deletes and conflicts resolved
alike everywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import LockConflict, YtError
from tests.replication.conftest import wait_for

from .conftest import SCHEMA, XdcrGroup

ALL = ("a", "b", "c")


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    group = XdcrGroup(tmp_path_factory.mktemp("xdcr_join"), names=ALL).start()
    try:
        yield group
    finally:
        group.stop()


def trimmed_group(trio: XdcrGroup, path: str) -> None:
    """``path`` on a, b and c; a and b connected, written on both, converged and their logs trimmed."""
    trio.connect(("a", "b"))
    for name in ALL:
        trio.client(name).create("table", path, attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True,
                                                            "change_retention": 1})
        trio.client(name).mount_table(path)
    start = trio.client("a").generate_timestamp()
    a, b = trio.client("a"), trio.client("b")
    a.insert_rows(path, [{"id": i, "name": f"a{i}", "password": "pa"} for i in range(300)])
    b.insert_rows(path, [{"id": i, "name": f"b{i}", "password": "pb"} for i in range(200, 500)])
    wait_for(lambda: trio.converged(path, ("a", "b")) and len(trio.rows("a", path)) == 500, 30, "a and b converged")
    a.delete_rows(path, [{"id": i} for i in range(0, 40)])
    b.delete_rows(path, [{"id": i} for i in range(460, 500)])
    wait_for(lambda: trio.converged(path, ("a", "b")) and len(trio.rows("a", path)) == 420, 30,
             "the deletes on both")
    for name in ("a", "b"):
        wait_for(lambda n=name: _trimmed(trio.client(n), path, start), 30, f"the change log of {name} trimmed")


def _trimmed(client: Client, path: str, start: int) -> bool:
    try:
        client.pull_changes(path, from_timestamp=start, wait_timeout=0)
    except YtError as exc:
        return exc.code == 1760
    return False


def join(client: Client, path: str, source: str | None = None, page_rows: int = 100) -> dict[str, Any]:
    """What the Spark job does (sparkapps/xdcr_join.py), page by page in one thread."""
    begun = client.call("dr_join_begin", {"path": path, "page_rows": page_rows,
                                          **({"source": source} if source else {})})
    for page in begun["missing_pages"]:
        entries = client.call("dr_join_read", {"path": path, "page": page})["entries"]
        assert client.call("dr_join_write", {"path": path, "page": page}, entries)["applied"]
    finished: dict[str, Any] = client.call("dr_join_finish", {"path": path})
    return finished


class Writers:
    """A writer per cluster: fresh keys and updates of old ones, each its own client, until stopped."""

    def __init__(self, trio: XdcrGroup, path: str, names: tuple[str, ...]) -> None:
        self.trio, self.path = trio, path
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.writes = dict.fromkeys(names, 0)
        self.threads = [threading.Thread(target=self.run, args=(n, i), daemon=True) for i, n in enumerate(names)]

    def run(self, name: str, index: int) -> None:
        engine = self.trio.engines[name]
        with Client(engine.url, engine.token, timeout=60) as client:
            n = 0
            while not self.stop_event.is_set():
                rows = [{"id": 10_000 * (index + 1) + n, "name": f"{name}-new{n}", "password": "x"},
                        {"id": 100 + n % 300, "name": f"{name}-upd{n}", "password": "y"}]
                try:
                    client.insert_rows(self.path, rows)
                except LockConflict:
                    continue  # a peer's change to the key was applied meanwhile (1700): retried, as a client does
                except YtError as exc:
                    self.errors.append(exc)
                    return
                n += 1
                self.writes[name] = n
                time.sleep(0.01)

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, self.errors


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
    c.insert_rows(path, [{"id": 101, "name": "c-late", "password": "c"}])
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
