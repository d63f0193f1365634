"""The fault injection itself: partitions cut exactly what they name, clocks move as told, and a run
leaves nothing behind - no namespace, no link, no process - also when it fails or is interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reptables.engine.timestamps import COUNTER_BITS
from reptables.testing.chaos.cluster import ChaosRun
from reptables.testing.chaos.net import HOST, Network
from reptables.testing.waits import wait_for

from .conftest import needs_netns

pytestmark = needs_netns


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


@pytest.fixture
def net() -> Iterator[Network]:
    network = Network.create()
    try:
        yield network
    finally:
        network.close()


def _reachable(net: Network, src: str, dst: str) -> bool:
    """Whether an HTTP GET from ``src`` (a node or ``HOST``) to ``dst``'s server answers within 1 s."""
    code = f"import urllib.request; urllib.request.urlopen('http://{net.address(dst)}:8000/', timeout=1)"
    prefix = net.nodes[src].exec_argv() if src != HOST else []
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True).returncode == 0


def test_a_partition_drops_only_the_pairs_it_names_and_heals(net: Network) -> None:
    servers = []
    try:
        for name in ("a", "b", "c"):
            node = net.add(name)
            servers.append(subprocess.Popen([*node.exec_argv(), sys.executable, "-m", "http.server", "8000", "--bind",
                                             node.address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True))
        wait_for(lambda: all(_reachable(net, HOST, n) for n in "abc"), 10, "the three servers", interval=0.1)
        net.drop("a", "b")
        assert not _reachable(net, "a", "b")
        assert _reachable(net, "a", "c") and _reachable(net, "c", "b") and _reachable(net, HOST, "b")
        net.isolate("c", from_host=True)
        assert not _reachable(net, HOST, "c") and not _reachable(net, "b", "c")
        net.heal()
        assert _reachable(net, "a", "b") and _reachable(net, HOST, "c") and _reachable(net, "b", "c")
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)


def test_closing_a_network_after_an_error_removes_its_namespaces_and_link() -> None:
    with pytest.raises(RuntimeError, match="the run failed"):
        network = Network.create()
        try:
            network.add("a")
            network.add("b")
            network.isolate("a")
            assert len(_namespaces(f"{network.prefix}-")) == 3
            raise RuntimeError("the run failed")
        finally:
            assert network.close() == []
    assert _namespaces(f"{network.prefix}-") == []
    assert subprocess.run(["ip", "link", "show", network.host_link], capture_output=True).returncode != 0


def test_an_engine_clock_offset_moves_its_timestamps_and_a_jump_back_keeps_them_monotonic(tmp_path: Path) -> None:
    with ChaosRun(tmp_path) as run:
        engines = run.engines(["solo"])
        client, clock = engines.client("solo"), engines.clocks["solo"]
        clock.set(30.0)

        def skewed() -> int | None:
            timestamp = client.generate_timestamp()
            return timestamp if 25 <= (timestamp >> COUNTER_BITS) - time.time() <= 35 else None

        ahead = wait_for(skewed, 5, "the engine's timestamps 30 s ahead")
        clock.set(-30.0)  # a jump back of a minute while the engine runs
        time.sleep(0.2)
        after = client.generate_timestamp()
        assert after > ahead  # never back: the clock keeps its last timestamp as the floor
        assert engines.engine("solo").alive()


def test_an_interrupted_run_leaves_no_namespace_or_process_behind(tmp_path: Path) -> None:
    run = subprocess.Popen([sys.executable, "-m", "reptables.testing.chaos", "run", "--scenarios", "xdcr-partitions",
                            "--duration", "300", "--seed", "1", "--out", str(tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert run.stdout is not None
        slot = None
        for line in run.stdout:
            if "building (slot" in line:
                slot = int(line.split("slot ")[1].split(",")[0])
            if "running" in line:
                break
        assert slot is not None, "the run did not start"
        namespaces = _namespaces(f"rtc{slot}-")
        pids = [int(p) for ns in namespaces for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                                    text=True).stdout.split()]
        assert len(namespaces) == 4 and len(pids) >= 3  # the hub, a, b, c; an engine in each member
        os.kill(run.pid, signal.SIGINT)  # Ctrl-C
        try:
            # (reading on while it stops: a run blocked on a full pipe would look like a run that hangs)
            rest, _ = run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.kill(run.pid, signal.SIGUSR1)  # (the run's stacks, faulthandler: where it hangs)
            time.sleep(1)
            os.killpg(run.pid, signal.SIGKILL)
            rest, _ = run.communicate()
            pytest.fail("the interrupted run did not end within 90 s; its output after 'running', with its "
                        f"threads' stacks:\n{rest[-6000:]}")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert _namespaces(f"rtc{slot}-") == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
