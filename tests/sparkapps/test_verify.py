"""The verify job with real local Spark against two real engines: equal copies pass, planted
differences are found key by key, at one timestamp."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from reptables.engine.client import Client
from reptables.sparkapps.options import SourceOptions
from reptables.sparkapps.verify import verify
from reptables.testing import wait_for
from tests.harness import EngineProcess

from .conftest import client_of, create_table, table_name

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "a", "type": "any"}]
ROWS = [{"k": k, "v": f"v{k}", "a": {"k": [k, "x"]} if k % 2 else None} for k in range(600)]


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    base = Path(tmp_path_factory.mktemp("verify"))
    left = EngineProcess("left", base / "left", token="token-left-0123456789").start()
    right = EngineProcess("right", base / "right", token="token-right-0123456789").start()
    try:
        yield left, right
    finally:
        right.stop()
        left.stop()


def copies(left: EngineProcess, right: EngineProcess) -> str:
    path = table_name("verified")
    for engine in (left, right):
        create_table(engine, path, SCHEMA, pivot_keys=[[], [200], [400]])
        with client_of(engine) as client:
            client.insert_rows(path, ROWS)
    return path


def options(engine: EngineProcess, path: str, ts: int) -> SourceOptions:
    return SourceOptions.parse({"proxy": engine.url, "token": engine.read_token(), "path": path,
                                "timestamp": str(ts)})


def now(engine: EngineProcess) -> int:
    with client_of(engine) as client:
        return int(client.generate_timestamp())


def test_equal_copies_match_in_every_range(spark: SparkSession, sides: tuple[EngineProcess, EngineProcess]) -> None:
    left, right = sides
    path = copies(left, right)
    ts = max(now(left), now(right))
    results = verify(spark, options(left, path, ts), options(right, path, ts), ts, partitions=4)
    assert len(results) == 4 and all(r.matches for r in results)
    assert sum(r.left_rows for r in results) == 600 and all(r.differences == () for r in results)


def test_planted_differences_are_found_key_by_key(spark: SparkSession,
                                                  sides: tuple[EngineProcess, EngineProcess]) -> None:
    left, right = sides
    path = copies(left, right)
    before = max(now(left), now(right))
    # each engine has its own clock: the changes below must commit after `before` on both
    wait_for(lambda: now(left) > before and now(right) > before, 10, "both clocks past the snapshot")
    with Client(right.url, right.read_token()) as client:
        client.insert_rows(path, [{"k": 5, "v": "changed", "a": None}, {"k": 10_000, "v": "extra", "a": None}])
        client.delete_rows(path, [{"k": 450}])
    with Client(left.url, left.read_token()) as client:
        client.insert_rows(path, [{"k": 301, "v": "v301", "a": {"k": [301, "y"]}}])  # a change inside `any`
    ts = max(now(left), now(right))
    results = verify(spark, options(left, path, ts), options(right, path, ts), ts, partitions=3)
    found = {(key[0], how) for r in results for key, how in r.differences}
    assert found == {(5, "differs"), (10_000, "missing on the left"), (450, "missing on the right"),
                     (301, "differs")}
    assert [r.matches for r in results] == [False, False, False]  # one difference in each tablet's range
    # at the earlier timestamp, before the changes, the copies were equal
    assert all(r.matches for r in verify(spark, options(left, path, before), options(right, path, before), before))


def test_the_command_exits_1_listing_the_keys_or_0(sides: tuple[EngineProcess, EngineProcess],
                                                   tmp_path: Path) -> None:
    left, right = sides
    path = copies(left, right)
    with Client(right.url, right.read_token()) as client:
        client.delete_rows(path, [{"k": 7}])
    for name, engine in (("left", left), ("right", right)):
        (tmp_path / name).write_text(engine.read_token())
    command = [sys.executable, "-m", "reptables.sparkapps.verify", "--master", "local[2]",
               "--left-proxy", left.url, "--left-token-file", str(tmp_path / "left"), "--left-path", path,
               "--right-proxy", right.url, "--right-token-file", str(tmp_path / "right"), "--right-path", path]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    differing = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert differing.returncode == 1, differing.stderr[-2000:]
    assert "key [7]: missing on the right" in differing.stderr and "1 differing ranges" in differing.stderr
    assert "token-" not in differing.stderr
    with Client(right.url, right.read_token()) as client:
        client.insert_rows(path, [ROWS[7]])
    # (each cluster has its own clock: a timestamp after the repair on both sides)
    ts = max(now(left), now(right))
    equal = subprocess.run([*command, "--timestamp", hex(ts)], env=env, capture_output=True, text=True,
                           timeout=300, start_new_session=True)
    assert equal.returncode == 0, equal.stderr[-2000:]
    assert "600 rows on the left, 0 differing ranges" in equal.stderr
