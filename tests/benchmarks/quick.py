"""What the smoke tests of the benchmarks that run as scripts share: one ``--quick`` run in a subprocess.

stream_bench.py and xdcr_bench.py are tested by running them as a user would (a subprocess, its JSON
document read back), once for the checks and, when a ratio is beyond its limit, once more for
benchmarks/regression.py's second measurement: both runs go through :func:`run_quick`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_quick(bench: Path, out: Path, data_dir: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str],
                                                                                dict[str, Any]]:
    """``bench --quick --json out --data-dir data_dir``: the finished process (exit 0 asserted, with the
    tail of its output if not) and the JSON document it wrote."""
    proc = subprocess.run([sys.executable, str(bench), "--quick", "--json", str(out), "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (what the tests ask of the processes a benchmark started)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
