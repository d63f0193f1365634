"""Shared fixtures: real engine processes on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import EngineProcess

#: the JVM options of every local Spark the tests start (the session of tests/sparkapps, and the jobs
#: that the launchers, ``reptables up`` and the spark-operator stand-in run as processes): the client
#: compiler only and the serial collector. A job's JVM lives seconds on small data, where C2's
#: compilations and G1's threads cost more than they return (``bash hack/spark-jvm-cost.sh`` measures
#: the CPU and wall time of a start with and without them).
SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    # pyspark reads PYSPARK_SUBMIT_ARGS when it launches its JVM; set here, every child process inherits it
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", f"--driver-java-options '{SPARK_TEST_JVM_OPTIONS}' pyspark-shell")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProcess]:
    proc = EngineProcess("primary", tmp_path / "primary").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    proc = EngineProcess("shared", tmp_path_factory.mktemp("shared")).start()
    try:
        yield proc
    finally:
        proc.stop()


def reset_engine(proc: EngineProcess) -> None:
    """Remove everything a test created under //tmp and //home (unmounting tables first)."""
    from reptables.engine.client import Client

    with Client(proc.url, proc.token) as client:
        for root in ("//tmp", "//home"):
            for name in client.list(root):
                path = f"{root}/{name}"
                for table in _tables_under(client, path):
                    if client.get(f"{table}/@tablet_state") != "unmounted":
                        client.unmount_table(table)
                client.remove(path, recursive=True, force=True)


def _tables_under(client: object, path: str) -> list[str]:
    node_type = client.get(f"{path}/@type")  # type: ignore[attr-defined]
    if node_type in ("table", "replicated_table"):
        return [path]
    if node_type == "map_node":
        return [t for child in client.list(path) for t in _tables_under(client, f"{path}/{child}")]  # type: ignore[attr-defined]
    return []


@pytest.fixture
def clean_engine(shared_engine: EngineProcess) -> Iterator[EngineProcess]:
    """The module's shared engine, emptied after the test: cheaper than a new process per test."""
    try:
        yield shared_engine
    finally:
        reset_engine(shared_engine)


#: the modules that take minutes (Spark jobs, operator bootstraps), heaviest first: the two workers
#: take modules in collection order, so these start first and the run does not end on one worker
#: still busy with a long module while the other is idle (longest first)
HEAVY_FIRST = ("tests/sparkapps/", "tests/operator/test_bootstrap.py", "tests/operator/test_sparkapplication.py",
               "tests/operator/test_tour.py", "tests/operator/test_local_runner.py",
               "tests/operator/test_xdcr_join.py", "tests/operator/test_operator_e2e.py", "tests/test_chart.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy modules first (a stable sort: each module keeps its tests' order)."""
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::", 1)[0]
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if module.startswith(prefix)), len(HEAVY_FIRST))

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (hack/test.sh runs two workers), one worker per module, and one for all Spark tests.

    * each module's tests run in order on one worker and share its module-scoped engines (several
      modules build each test on the one before, as a walkthrough does);
    * the PySpark tests share one session-scoped Spark session (tests/sparkapps/conftest.py): all of
      tests/sparkapps goes to one worker, so a run starts one session.
    """
    from xdist.scheduler import LoadScopeScheduling

    # modules in collection order (heavy ones first, pytest_collection_modifyitems), not xdist's
    # default of the modules with the most tests first: that left the few-test, minutes-long
    # operator modules to the end, on one worker while the other sat idle
    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "tests/sparkapps" if module.startswith("tests/sparkapps/") else module

    return ModuleScheduling(config, log)
