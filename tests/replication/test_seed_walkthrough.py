"""Seed 002, "Use cases": the replicated-table walkthrough, replayed with the official ``yt`` CLI.

The seed runs every command with ``YT_PROXY=<cluster>``: a meta-cluster holding ``//tmp/replicated``
and two replica clusters each holding ``//tmp/replica``. Here the meta-cluster is ``primary`` and the
seed's first and second replica clusters are ``remote_0`` and ``remote_1``; ``walk.yt(cluster, ...)``
runs the real CLI against that cluster's engine.

The tests are the phases of one walkthrough and share one set of clusters: they run in file order,
each phase starting from the state the previous one left (as in the seed). Every command the seed
shows is run with the CLI and asserted on its output, exit code and error text. Asynchronous steps
(enabling, replication, freezing) are first awaited with a bounded poll through the cheap HTTP client
(a CLI call costs a Python start-up), then the seed's CLI command is run once and checked.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yt.yson as yson

from reptables.engine.client import Client
from reptables.testing import wait_for
from tests.replication.conftest import ClusterSet

META, FIRST, SECOND = "primary", "remote_0", "remote_1"
SCHEMA = "schema=[{name=k;type=int64;sort_order=ascending};{name=v;type=int64}]"
GUID = re.compile(r"^[0-9a-f]{1,8}-[0-9a-f]{1,8}-[0-9a-f]{1,8}-[0-9a-f]{1,8}$")
# The keys the seed prints for one element of `yt get '#replica-id/@tablets'`; replication_error is
# not among them: "If there is no error, this tag will also be missing".
SEED_TABLET_KEYS = {"flushed_row_count", "tablet_id", "trimmed_row_count", "replication_lag_time",
                    "current_replication_timestamp", "current_replication_row_index", "state"}
WAIT = 20.0

ROW_1 = {"k": 1, "v": 100}
ROW_2 = {"k": 2, "v": 200}


class CliFailure(AssertionError):
    """A `yt` command that should have succeeded failed."""


@dataclass
class Walkthrough:
    clusters: ClusterSet
    first_replica: str = ""   # the seed's 730e-7bcd8-3ff02c5-fd0b36ee (replica on the first cluster)
    second_replica: str = ""  # the seed's 730e-8611b-3ff02c5-f647333f (replica on the second cluster)
    phases: set[int] = field(default_factory=set)

    def enter(self, phase: int) -> None:
        if phase > 1 and phase - 1 not in self.phases:
            pytest.skip("a phase of the seed walkthrough: run the whole module, in order")
        self.phases.add(phase)

    # -- the official CLI ----------------------------------------------------------------------------

    def yt(self, cluster: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        """`YT_PROXY=<cluster> yt ...`; the command must succeed."""
        result = self.clusters.engines[cluster].yt(*args, input=input, check=False)
        if result.returncode != 0:
            raise CliFailure(f"YT_PROXY={cluster} yt {' '.join(args)} failed ({result.returncode}):\n"
                             + result.stderr[-3000:])
        return result

    def yt_fails(self, cluster: str, *args: str, input: str | None = None) -> tuple[str, set[int]]:
        """A command the seed shows failing: its stderr and the YT error codes printed there.

        The official client retries some errors of dynamic tables for up to ten minutes (e.g.
        NoInSyncReplicas, 1736); the seed shows the first answer, so retries are switched off here.
        """
        result = self.clusters.engines[cluster].yt(*args, input=input, check=False,
                                                   config_patch="{dynamic_table_retries={enable=%false}}")
        assert result.returncode != 0, f"yt {' '.join(args)} succeeded, the seed says it fails:\n{result.stdout}"
        codes = {int(c) for c in re.findall(r"^\s*code\s+(\d+)\s*$", result.stderr, flags=re.MULTILINE)}
        return result.stderr, codes

    def get(self, cluster: str, path: str) -> Any:
        """`yt get PATH`, its YSON output parsed."""
        return yson.loads(self.yt(cluster, "get", path).stdout.encode())

    def select_json(self, cluster: str, table: str) -> list[dict[str, Any]]:
        """`yt select-rows '* from [TABLE]' --format json`, one JSON row a line."""
        out = self.yt(cluster, "select-rows", f"* from [{table}]", "--format", "json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    # -- cheap polling through HTTP --------------------------------------------------------------------

    def api(self, cluster: str) -> Client:
        return self.clusters.client(cluster)

    def wait_rows(self, cluster: str, table: str, expected: list[dict[str, Any]]) -> None:
        seen: list[Any] = []

        def arrived() -> bool:
            seen[:] = self.api(cluster).select_rows(f"* from [{table}]")
            return seen == expected

        try:
            wait_for(arrived, WAIT, f"{expected} in {cluster}:{table}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last read {seen}") from None

    def wait_attr(self, cluster: str, path: str, expected: Any) -> None:
        wait_for(lambda: self.api(cluster).get(path) == expected, WAIT, f"{cluster}:{path} == {expected!r}")


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walkthrough]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("seed_walkthrough"))).start()
    try:
        yield Walkthrough(clusters)
    finally:
        clusters.stop()


def test_phase1_create_replicated_table_replicas_and_replica_tables(walk: Walkthrough) -> None:
    walk.enter(1)
    # Creating a replicated table.
    out = walk.yt(META, "create", "replicated_table", "//tmp/replicated", "--attr", f"""{{
        dynamic=%true;
        {SCHEMA}
    }}""").stdout.strip()
    assert GUID.match(out), out

    # Creating a replica associated with the first cluster, then a second replica on the second one.
    walk.first_replica = walk.yt(META, "create", "table_replica", "--attr", f"""{{
        table_path="//tmp/replicated";
        cluster_name="{FIRST}";
        replica_path="//tmp/replica"
    }}""").stdout.strip()
    walk.second_replica = walk.yt(META, "create", "table_replica", "--attr", f"""{{
        table_path="//tmp/replicated";
        cluster_name="{SECOND}";
        replica_path="//tmp/replica"
    }}""").stdout.strip()
    assert GUID.match(walk.first_replica) and GUID.match(walk.second_replica)
    assert walk.first_replica != walk.second_replica

    # (Replicas section) `yt get //tmp/replicated/@replicas`: a new replica is async and disabled.
    replicas = walk.get(META, "//tmp/replicated/@replicas")
    assert set(replicas) == {walk.first_replica, walk.second_replica}
    for replica_id, cluster in ((walk.first_replica, FIRST), (walk.second_replica, SECOND)):
        info = replicas[replica_id]
        assert (info["cluster_name"], info["replica_path"], info["state"], info["mode"]) == \
            (cluster, "//tmp/replica", "disabled", "async")
    # (Replicas section) `yt get '#replica-id/@'`.
    attrs = walk.get(META, f"#{walk.first_replica}/@")
    assert (attrs["table_path"], attrs["cluster_name"], attrs["replica_path"], attrs["mode"], attrs["state"]) == \
        ("//tmp/replicated", FIRST, "//tmp/replica", "async", "disabled")
    assert attrs["enable_replicated_table_tracker"]  # default %true
    assert "start_replication_timestamp" in attrs and len(attrs["tablets"]) == 1

    # Creating a replica table on each replica cluster, bound to its replica by upstream_replica_id.
    for cluster, replica_id in ((FIRST, walk.first_replica), (SECOND, walk.second_replica)):
        out = walk.yt(cluster, "create", "table", "//tmp/replica", "--attr", f"""{{
            dynamic=%true;
            upstream_replica_id="{replica_id}";
            {SCHEMA}
        }}""").stdout.strip()
        assert GUID.match(out), out
        assert walk.api(cluster).get("//tmp/replica/@upstream_replica_id") == replica_id

    # Mounting a replica table and a replicated table.
    walk.yt(META, "mount-table", "//tmp/replicated")
    walk.yt(FIRST, "mount-table", "//tmp/replica")
    walk.yt(SECOND, "mount-table", "//tmp/replica")
    for cluster, path in ((META, "//tmp/replicated"), (FIRST, "//tmp/replica"), (SECOND, "//tmp/replica")):
        walk.wait_attr(cluster, f"{path}/@tablet_state", "mounted")


def test_phase2_write_needs_a_sync_replica_unless_told_otherwise(walk: Walkthrough) -> None:
    walk.enter(2)
    # Writing data to a replicated table: refused, there is no synchronous replica.
    stderr, codes = walk.yt_fails(META, "insert-rows", "//tmp/replicated", "--format", "yson", input="{k=1;v=100}")
    assert "Table //tmp/replicated has no synchronous replicas" in stderr
    assert 1714 in codes, codes  # NoSyncReplicas

    # Setting the no-require-sync-replica flag to force a write.
    walk.yt(META, "insert-rows", "//tmp/replicated", "--format", "yson", "--no-require-sync-replica",
            input="{k=1;v=100}")

    # Write was successful, but there is no data in the replica (disabled: nothing is pushed to it).
    time.sleep(0.5)
    out = walk.yt(FIRST, "select-rows", "* from [//tmp/replica]", "--format", "yson").stdout
    assert list(yson.loads(out.encode(), yson_type="list_fragment")) == []

    # Viewing replica state.
    assert walk.yt(META, "get", f"#{walk.first_replica}/@state").stdout.strip() == '"disabled"'


def test_phase3_enabled_replicas_receive_rows_but_the_table_is_not_readable(walk: Walkthrough) -> None:
    walk.enter(3)
    # Replica was not enabled. Enabling a replica (the seed enables the second one first).
    walk.yt(META, "alter-table-replica", walk.second_replica, "--enable")
    walk.yt(META, "alter-table-replica", walk.first_replica, "--enable")
    for replica_id in (walk.second_replica, walk.first_replica):  # enabling -> enabled
        walk.wait_attr(META, f"#{replica_id}/@state", "enabled")

    # Checking replication progress.
    walk.wait_rows(FIRST, "//tmp/replica", [ROW_1])
    assert walk.select_json(FIRST, "//tmp/replica") == [ROW_1]
    # The seed later shows the second cluster holding {k=1}: it got the row before being disabled.
    walk.wait_rows(SECOND, "//tmp/replica", [ROW_1])

    # Attempting to read data directly from a replicated table: no synchronous replica, no read.
    stderr, codes = walk.yt_fails(META, "select-rows", "* from [//tmp/replicated]", "--format", "json")
    assert "No in-sync replicas found for table //tmp/replicated" in stderr
    assert 1736 in codes, codes  # NoInSyncReplicas (yt.common.YtError.is_no_in_sync_replicas)


def test_phase4_a_disabled_replica_falls_behind_with_a_growing_lag(walk: Walkthrough) -> None:
    walk.enter(4)
    # Reading is not possible without synchronous replicas. Disabling the second replica and rewriting.
    walk.yt(META, "alter-table-replica", walk.second_replica, "--disable")
    walk.wait_attr(META, f"#{walk.second_replica}/@state", "disabled")
    walk.yt(META, "insert-rows", "//tmp/replicated", "--format", "yson", "--no-require-sync-replica",
            input="{k=2;v=200}")

    # Reading from replicas: the first cluster received the data, the second did not.
    walk.wait_rows(FIRST, "//tmp/replica", [ROW_1, ROW_2])
    assert walk.select_json(FIRST, "//tmp/replica") == [ROW_1, ROW_2]
    assert walk.select_json(SECOND, "//tmp/replica") == [ROW_1]

    # Failed replication can be noticed by a growing lag (`yt get '#id/@replication_lag_time'`, in ms).
    lag_path = f"#{walk.second_replica}/@replication_lag_time"
    wait_for(lambda: walk.api(META).get(lag_path) > 0, 5.0, "a replication lag on the disabled replica")
    first_lag = walk.get(META, lag_path)
    assert isinstance(first_lag, int) and first_lag > 0, first_lag
    lags = [first_lag]

    def grew() -> bool:
        lags.append(walk.api(META).get(lag_path))
        return lags[-1] > first_lag

    try:  # timestamps have one-second resolution: the lag must have grown within a few seconds
        wait_for(grew, 5.0, "the lag of the disabled replica to grow")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; lags read over time: {sorted(set(lags))}") from None
    assert walk.api(SECOND).select_rows("* from [//tmp/replica]") == [ROW_1]


def test_phase5_sync_replica_catches_up_serves_reads_and_gets_deletes(walk: Walkthrough) -> None:
    walk.enter(5)
    # Changing the replication type of the second replica to sync and enabling the replica.
    walk.yt(META, "alter-table-replica", walk.second_replica, "--enable", "--mode", "sync")
    walk.wait_attr(META, f"#{walk.second_replica}/@state", "enabled")
    assert walk.api(META).get(f"#{walk.second_replica}/@mode") == "sync"

    # Reading data from the second cluster and checking data availability.
    walk.wait_rows(SECOND, "//tmp/replica", [ROW_1, ROW_2])
    assert walk.select_json(SECOND, "//tmp/replica") == [ROW_1, ROW_2]

    # A synchronous replica makes it possible to read directly from the replicated table.
    walk.wait_rows(META, "//tmp/replicated", [ROW_1, ROW_2])  # once the sync replica has caught up
    assert walk.select_json(META, "//tmp/replicated") == [ROW_1, ROW_2]

    # Deleting the first row, this time in sync mode (no --no-require-sync-replica needed).
    walk.yt(META, "delete-rows", "//tmp/replicated", "--format", "yson", input="{k=1}")

    # Checking the command execution: the sync replica has it at once, the async one soon after.
    assert walk.select_json(SECOND, "//tmp/replica") == [ROW_2]
    walk.wait_rows(FIRST, "//tmp/replica", [ROW_2])
    assert walk.select_json(FIRST, "//tmp/replica") == [ROW_2]


def test_phase6_freeze_and_check_the_replication_queue(walk: Walkthrough) -> None:
    walk.enter(6)
    # Disabling writing to a replicated table.
    walk.yt(META, "freeze-table", "//tmp/replicated")

    # Checking that the tablet is frozen, i.e. all data was written to the disk.
    walk.wait_attr(META, "//tmp/replicated/@tablet_state", "frozen")
    assert walk.yt(META, "get", "//tmp/replicated/@tablet_state").stdout.strip() == '"frozen"'

    # Checking that all rows were successfully replicated in each of the replicas:
    # flushed_row_count == current_replication_row_index in `yt get '#replica-id/@tablets'`.
    tablets: dict[str, list[dict[str, Any]]] = {}
    for replica_id in (walk.first_replica, walk.second_replica):
        wait_for(lambda r=replica_id: all(t["flushed_row_count"] == t["current_replication_row_index"]
                                          for t in walk.api(META).get(f"#{r}/@tablets")),
                 WAIT, f"replica {replica_id} fully replicated")
        tablets[replica_id] = walk.get(META, f"#{replica_id}/@tablets")
        assert tablets[replica_id] and all(
            t["flushed_row_count"] == t["current_replication_row_index"] for t in tablets[replica_id])
    first, second = tablets[walk.first_replica], tablets[walk.second_replica]
    assert len(first) == len(second) == 1
    # {k=1}, {k=2} and the delete of k=1 all went through the queue of the one tablet
    assert first[0]["flushed_row_count"] == second[0]["flushed_row_count"] >= 3
    # both have replicated up to the last change at least (an idle, caught-up async replica's
    # timestamp moves on with a barrier, so the two need not be equal)
    last_write = walk.api(META).generate_timestamp()
    assert min(first[0]["current_replication_timestamp"], second[0]["current_replication_timestamp"]) > 0
    assert max(first[0]["current_replication_timestamp"], second[0]["current_replication_timestamp"]) < last_write

    # The rest of what the seed prints for each tablet of each replica.
    table_tablet_id = walk.api(META).get("//tmp/replicated/@tablets")[0]["tablet_id"]
    problems = []
    for name, tablet in (("first", first[0]), ("second", second[0])):
        assert tablet["state"] == "enabled"
        assert tablet["replication_lag_time"] == 0
        assert 0 <= tablet["trimmed_row_count"] <= tablet["flushed_row_count"]
        assert tablet["tablet_id"] == table_tablet_id  # the replicated table's tablet
        if set(tablet) != SEED_TABLET_KEYS:
            problems.append(f"{name} replica tablet keys {sorted(tablet)} != seed's {sorted(SEED_TABLET_KEYS)}")
        if not GUID.match(str(tablet["tablet_id"])):
            problems.append(f"{name} replica tablet_id {tablet['tablet_id']!r} is not a GUID")
        if not isinstance(tablet["current_replication_timestamp"], yson.YsonUint64):
            problems.append(f"{name} replica current_replication_timestamp "
                            f"{tablet['current_replication_timestamp']!r} is not a uint64 (the seed prints ...u)")
    assert not problems, "\n".join(problems)
