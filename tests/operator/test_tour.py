"""The README's first command, run in CI: the tour of examples/quickstart exits 0 and shows each step.

The tour is what a newcomer sees first (``bash hack/up.sh``), so it is run exactly as that command
runs it — ``python -m reptables.operator.local.tour``, real engines, the official ``yt`` CLI, local Spark —
only on free ports and in a temporary data directory. Each assertion is a line the tour promises
the reader: the rows on every replica, the sync replica moving off the killed cluster while writes
continue, the bootstrap of a replica added after the queue was trimmed, and the seed's queue check.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


def _processes_using(data_dir: Path) -> list[str]:
    """Command lines of live processes that name ``data_dir`` (the tour's engines and Spark jobs)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(data_dir) in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.timeout(420)
def test_the_tour_shows_every_step_and_exits_0(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "reptables.operator.local.tour", "--free-ports", "--data-dir", str(tmp_path / "tour")],
        capture_output=True, text=True, timeout=400)
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-3000:]
    for step in range(1, 8):
        assert f"== Step {step}: " in out
    # 1-3: Ready, rows written with the yt CLI, and every replica holds them
    assert "events: sync replica events-remote-0" in out
    assert "yt insert-rows //home/quickstart/events --format json: 1000 rows (sorted table)" in out
    assert "yt insert-rows //home/quickstart/audit --format json: 100 rows (ordered table)" in out
    for replica, cluster, rows in (("events-remote-0", "remote-0", 1000), ("events-remote-1", "remote-1", 1000),
                                   ("audit-remote-0", "remote-0", 100), ("audit-remote-1", "remote-1", 100)):
        assert re.search(rf"replica {replica} on {cluster} \((sync|async)\): {rows} rows", out), replica
    # 4: the tracker moves the sync replica off the killed cluster and writes go on
    assert "killed the engine of remote-0 (SIGKILL)" in out
    assert "the sync replica moved to remote-1: events sync=events-remote-1, audit sync=audit-remote-1" in out
    moved = re.search(r"writes continued: (\d+) before the kill, (\d+) after it", out)
    assert moved and int(moved.group(1)) > 0 and int(moved.group(2)) > 0, out[-3000:]
    assert "remote-0 caught up" in out
    # 5: a replica added after the queue was trimmed is bootstrapped with Spark and holds every row
    assert "the replication queue of //home/quickstart/events was trimmed" in out
    phases = re.findall(r"bootstrap phase (\w+)", out)
    assert phases == ["Pending", "Copying", "Verifying", "Enabling", "Done"], phases
    done = re.search(r"bootstrap Done: (\d+) rows copied by Spark; events-copy holds (\d+) of (\d+) rows", out)
    assert done, out[-3000:]
    total = 1000 + int(moved.group(1)) + int(moved.group(2))
    assert int(done.group(2)) == int(done.group(3)) == total
    assert 0 < int(done.group(1)) <= total
    # 6: the seed's queue check: frozen, then flushed_row_count == current_replication_row_index everywhere
    assert "@tablet_state: frozen" in out
    assert out.count("flushed_row_count = current_replication_row_index") == 3
    assert "queue check: equal for every replica and tablet" in out
    assert "unfreeze-table //home/quickstart/events: mounted again" in out
    # 7: everything stopped, a summary
    assert "The tour passed in" in out
    final = out[out.rindex("TableCluster     primary"):]
    assert "Ready=False" not in final and "bootstrap=Done" in final
    assert _processes_using(tmp_path / "tour") == []


def test_the_tour_names_the_step_that_failed(tmp_path: Path) -> None:
    """Manifests without the tour's ordered table: step 1 fails with the reason, exit status 1."""
    manifests = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
    partial = tmp_path / "manifests"
    partial.mkdir()
    for name in ("tableclusters.yaml", "tablereplicas.yaml"):
        (partial / name).write_text((manifests / name).read_text())
    text = (manifests / "replicatedtables.yaml").read_text()
    (partial / "replicatedtables.yaml").write_text(text[:text.index("\n---\n")] + "\n")
    (partial / "tablereplicas.yaml").write_text(
        "\n---\n".join(d for d in (manifests / "tablereplicas.yaml").read_text().split("\n---\n") if "audit" not in d))
    result = subprocess.run(
        [sys.executable, "-m", "reptables.operator.local.tour", "--free-ports", "--data-dir", str(tmp_path / "tour"),
         "--manifests", str(partial)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("step 1 (start the clusters and reconcile until Ready) failed: "
            "ReplicatedTable audit is not in the manifests") in result.stderr
    assert _processes_using(tmp_path / "tour") == []  # the engines it had started are stopped
