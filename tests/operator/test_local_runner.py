"""``reptables up``: the examples run on one machine, as the README's first command does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from reptables.engine.process import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_reptables_up_runs_the_examples_and_replicates(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    for source in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "TableCluster":
                # the examples use ports 9012-9014; tests use free ones
                doc["spec"]["endpoint"] = f"http://127.0.0.1:{free_port()}"
        (manifests / source.name).write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [sys.executable, "-m", "reptables.operator.cli", "up", str(manifests), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "wrote 1000 rows to primary://home/shop/orders with yt.wrapper" in out
    assert "replica orders-remote-0 on remote-0" in out and "replica orders-remote-1 on remote-1" in out
    assert ": 1000 rows" in out and "served by the sync replica" in out
    final = out[out.rindex("TableCluster     primary"):]
    assert final.count("Ready=True") == 7 and "Ready=False" not in final
    assert "sync=orders-remote-0" in final  # the preferred cluster of the examples
