"""Each engine a port of its own: ports handed out never repeat, and a taken port is an error.

A clean-clone CI run once failed because the kernel gave two ``free_port()`` calls the same port:
``reptables up`` started two engines on it, the survivor answered for both, and the meta-cluster's
token was refused by a replica engine. Three guards now, each checked here: :func:`free_port`
never hands out a port it handed out lately, an engine that finds another engine answering on its
port is refused at start instead of looking ready, and ``up`` refuses two TableClusters that name
one port before it starts anything.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reptables.engine.process import LocalEngine, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_free_port_hands_out_distinct_ports_that_are_free() -> None:
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: binding it raises nothing


def test_an_engine_started_on_a_port_another_engine_serves_is_refused_naming_it(tmp_path: Path) -> None:
    first = LocalEngine("first", tmp_path / "first", token="t-first").start()
    try:
        second = LocalEngine("second", tmp_path / "second", port=first.port, token="t-second")
        with pytest.raises(RuntimeError) as refused:
            second.start()
        message = str(refused.value)
        # the usual case: the first engine answers before the second one's failed bind ends it
        assert (f"engine second: port {first.port} is served by engine first" in message
                or "engine second exited with" in message), message
        assert not second.alive()
        assert first.alive()
    finally:
        first.stop()


def test_up_refuses_two_table_clusters_on_one_port_and_starts_nothing(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    port = free_port()
    for source in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "TableCluster":
                taken = doc["metadata"]["name"] in ("primary", "remote-0")
                doc["spec"]["endpoint"] = f"http://127.0.0.1:{port if taken else free_port()}"
        (manifests / source.name).write_text(yaml.safe_dump_all(docs))
    result = subprocess.run([sys.executable, "-m", "reptables.operator.cli", "up", str(manifests), "--data-dir",
                             str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert (f"TableCluster primary: port {port} is also TableCluster remote-0's (http://127.0.0.1:{port})"
            in result.stderr), result.stderr[-2000:]
    assert not [p for p in (tmp_path / "data").iterdir() if p.is_dir()]  # no engine's data directory
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # nothing listens on it
