"""One engine per data directory: a second one is refused at start, a killed one's lock never blocks.

Two engines on one data directory used to meet only inside SQLite: the second died with a
"database is locked" traceback, after it had rewritten the first one's token file. The engine
that serves a directory holds an advisory lock on
``DIR/engine.lock`` (its pid written in it); a second ``engine serve`` on the directory exits
non-zero with one line naming the directory and that pid, and touches nothing. The kernel drops
the lock when its holder dies, so the lock file left by a SIGKILL does not stop a restart. In one
process (tests and tools open clusters in-process), a second ``Cluster.open`` of a directory is
refused while the first is open, and an open refused after its checks holds nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.config import EngineConfig
from reptables.engine.errors import DataDirError, DataDirInUseError
from reptables.engine.node import Cluster
from reptables.testing import EngineProcess, free_port

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]


def serve_again(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``reptables engine serve`` on ``data_dir``, as a user would type it, until it exits (60 s at most)."""
    env = {k: v for k, v in os.environ.items() if k != "REPTABLES_TOKEN"}
    return subprocess.run([sys.executable, "-m", "reptables.operator.cli", "engine", "serve", "--cluster-name", "x",
                           "--data-dir", str(data_dir), "--port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
                          start_new_session=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    engine = EngineProcess("x", tmp_path_factory.mktemp("served") / "data").start()
    try:
        with Client(engine.url, engine.token) as client:
            client.create("table", "//tmp/t", attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table("//tmp/t")
            client.insert_rows("//tmp/t", [{"k": 1, "v": "before"}])
        yield engine
    finally:
        engine.stop()


def test_a_second_engine_on_a_served_data_directory_exits_with_one_line_naming_the_holder(
        served: EngineProcess) -> None:
    result = serve_again(served.data_dir)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert str(served.data_dir) in lines[0] and str(served.pid) in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_the_serving_engine_keeps_serving_after_a_second_one_was_refused(served: EngineProcess) -> None:
    assert serve_again(served.data_dir).returncode != 0
    assert httpx.get(f"{served.url}/readyz", timeout=5).status_code == 200
    with Client(served.url, served.token) as client:
        client.insert_rows("//tmp/t", [{"k": 2, "v": "after"}])
        assert client.select_rows("* from [//tmp/t]") == [{"k": 1, "v": "before"}, {"k": 2, "v": "after"}]


def test_a_refused_second_engine_leaves_the_token_file_alone(served: EngineProcess) -> None:
    token_file = served.data_dir / "token"
    before = token_file.read_bytes()
    assert serve_again(served.data_dir, "--token", "another-token-0123456789").returncode != 0
    assert token_file.read_bytes() == before


def test_the_lock_file_of_a_killed_engine_does_not_block_a_restart(tmp_path: Path) -> None:
    engine = EngineProcess("x", tmp_path / "data").start()
    first = engine.pid
    engine.kill()
    assert (tmp_path / "data" / "engine.lock").read_text().strip() == str(first)  # left behind
    engine.start()
    try:
        assert engine.pid != first
        assert (tmp_path / "data" / "engine.lock").read_text().strip() == str(engine.pid)
        assert httpx.get(f"{engine.url}/readyz", timeout=5).status_code == 200
    finally:
        engine.stop()


def test_a_cluster_opened_twice_in_one_process_is_refused_until_the_first_is_closed(tmp_path: Path) -> None:
    cluster = Cluster.open("local", tmp_path / "data")
    try:
        with pytest.raises(DataDirInUseError) as refused:
            Cluster.open("local", tmp_path / "data")
        assert refused.value.attributes["pid"] == os.getpid()
        assert str(tmp_path / "data") in refused.value.message
    finally:
        cluster.close()
    Cluster.open("local", tmp_path / "data").close()


def test_a_cluster_whose_open_was_refused_leaves_the_directory_unlocked(tmp_path: Path) -> None:
    Cluster.open("local", tmp_path / "data", EngineConfig(cluster_id=3)).close()
    with pytest.raises(DataDirError, match="XDCR cluster id 3"):
        Cluster.open("local", tmp_path / "data", EngineConfig(cluster_id=4))
    cluster = Cluster.open("local", tmp_path / "data")
    try:
        assert cluster.cluster_id == 3
    finally:
        cluster.close()
