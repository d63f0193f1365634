"""Shared fixtures: real engine processes on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reptables.testing import backends
from tests.harness import EngineProcess

#: the modules whose behaviour depends on storage: collected a second time as ``test_x.py[postgresql]``,
#: whose engines keep their state in databases of the run's PostgreSQL server (testing/backends.py).
#: (The SQLite-only modules - a damaged database file, the data directory's files and lock - and the
#: ones that never touch storage are not in it.)
BACKEND_MODULES = (
    "tests/engine/test_transactions.py", "tests/engine/test_versions.py", "tests/engine/test_crash_safety.py",
    "tests/engine/test_yt_cli.py", "tests/engine/test_alter_schema.py", "tests/engine/test_query.py",
    "tests/engine/test_fuzz.py", "tests/engine/test_fuzz_xdcr.py",
    "tests/replication/test_replication.py", "tests/replication/test_faults.py",
    "tests/replication/test_transitions.py", "tests/replication/test_trimmed_history.py",
    "tests/replication/test_bootstrap_write.py", "tests/replication/test_seed_walkthrough.py",
    "tests/replication/test_state_changes_beside_writes.py",
    "tests/streams/test_streams.py", "tests/streams/test_replicated_streams.py", "tests/streams/test_change_tail.py",
    "tests/xdcr/test_xdcr.py", "tests/xdcr/test_join.py", "tests/xdcr/test_trust.py",
)
#: REPTABLES_TEST_BACKENDS=sqlite runs the suite without the PostgreSQL half (a machine without it)
_BACKENDS = tuple(os.environ.get("REPTABLES_TEST_BACKENDS", "sqlite,postgresql").split(","))
_ROOT = Path(__file__).resolve().parent.parent
_pg_server: Any = None
# engines of the run are forked by a zygote that imported the engine once (engine/process.py,
# engine/zygote.py), not spawned: the imports are most of an engine's start, and a run starts
# hundreds. Set here, so every process of the run (workers, reptables up) inherits it; a test that
# needs a spawned engine's own command line or environment asks for exec
os.environ.setdefault("REPTABLES_ENGINE_LAUNCH", "fork")


def pytest_configure(config: pytest.Config) -> None:
    global _pg_server
    # pyspark reads PYSPARK_SUBMIT_ARGS when it launches its JVM: set by the process that runs the session
    # (the controller under pytest-xdist), every worker and child process inherits it. The options of
    # every local Spark of the run - the session of tests/sparkapps, and the jobs that the launchers,
    # reptables up and the spark-operator stand-in run as processes - with the class-data-sharing
    # archive (testing/spark_jvm.py), made here first when this environment has none
    if "PYTEST_XDIST_WORKER" not in os.environ and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        from reptables.testing.spark_jvm import jvm_options

        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options '{jvm_options()}' pyspark-shell"
    # one PostgreSQL server for the whole run (the PostgreSQL half, reptables up on PostgreSQL, the
    # mirror's target), started by the process that runs the session (the controller under
    # pytest-xdist: its workers inherit the address) and stopped by its pid at the end
    if "PYTEST_XDIST_WORKER" not in os.environ and not os.environ.get(backends.SERVER_ENV):
        from reptables.testing.postgres import PostgresServer

        _pg_server = PostgresServer().start()
        os.environ[backends.SERVER_ENV] = f"127.0.0.1:{_pg_server.port}"


def pytest_unconfigure(config: pytest.Config) -> None:
    global _pg_server
    if _pg_server is not None:
        _pg_server.stop()
        _pg_server = None
        os.environ.pop(backends.SERVER_ENV, None)


class BackendModule(pytest.Module):
    """A test module collected for another storage backend: its tests' engines use that backend."""

    backend = backends.POSTGRESQL

    def setup(self) -> None:
        self._using = backends.using(self.backend)
        self._using.__enter__()
        super().setup()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self._using.__exit__(None, None, None)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if backends.POSTGRESQL not in _BACKENDS:
        return None
    relative = file_path.resolve().relative_to(_ROOT).as_posix() if file_path.is_relative_to(_ROOT) else ""
    if relative in BACKEND_MODULES:
        # a node id of its own (the path's and "[postgresql]"): pytest-xdist tells tests apart by it
        return BackendModule.from_parent(parent, path=file_path, name=f"{file_path.name}[{backends.POSTGRESQL}]",
                                         nodeid=f"{relative}[{backends.POSTGRESQL}]")
    return None


@pytest.fixture(scope="session")
def postgres() -> backends.RunServer:
    """The run's PostgreSQL server: ``create_database()``, ``psql()``, ``conninfo``, ``connect()``."""
    return backends.run_server()


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


#: the modules that take minutes (Spark jobs, operator bootstraps), heaviest first: the workers
#: take modules in collection order, so these start first and the run does not end on one worker
#: still busy with a long module while the other is idle (longest first)
HEAVY_FIRST = ("tests/sparkapps/", "tests/operator/test_bootstrap.py", "tests/operator/test_sparkapplication.py",
               "tests/operator/test_tour.py", "tests/operator/test_local_runner.py",
               "tests/operator/test_xdcr_join.py", "tests/operator/test_operator_e2e.py", "tests/test_chart.py",
               "tests/test_docs.py", "tests/chaos/", "tests/ha/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy modules first (a stable sort: each module keeps its tests' order)."""
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::", 1)[0]
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if module.startswith(prefix)), len(HEAVY_FIRST))

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (hack/test.sh runs three workers), one worker per module, and one for all Spark tests.

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
