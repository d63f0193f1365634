"""How long engines take to start: one engine, and three one after another against ``start_all``.

Every test module, ``reptables up`` and the tour start engines, so their start time is paid
hundreds of times per test run. This measures it: the time from spawning ``engine serve`` to its
``/readyz`` answering, for one engine alone (with the query parser's tables in the user's cache, as
after any first start, and without them), for three started one after another (``LocalEngine.start``
each), and for three started side by side (``reptables.engine.process.start_all``). Each figure is
the median of ``--rounds`` rounds; the engines run on free loopback ports, in a temporary directory,
each in its own process group, and are stopped by pid after each round. Beside the time, the CPU
an engine used from its spawn to its exit (the children's rusage: start, the first answers, stop).

    .venv/bin/python benchmarks/engine_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reptables.engine.process import LocalEngine, start_all


def _one(base: Path) -> list[LocalEngine]:
    engine = LocalEngine("solo", base / "solo")
    engine.start()
    return [engine]


def _uncached(base: Path) -> list[LocalEngine]:
    # an empty cache directory: the engine builds the YT QL parser's tables (engine/query/grammar.py)
    engine = LocalEngine("uncached", base / "uncached", env={"XDG_CACHE_HOME": str(base / "empty-cache")})
    engine.start()
    return [engine]


def _sequential(base: Path) -> list[LocalEngine]:
    engines = [LocalEngine(f"seq{i}", base / f"seq{i}") for i in range(3)]
    for engine in engines:
        engine.start()
    return engines


def _side_by_side(base: Path) -> list[LocalEngine]:
    return start_all([LocalEngine(f"all{i}", base / f"all{i}") for i in range(3)])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per case, the start times (s) and the CPU seconds an engine used (start to exit)."""
    cases: dict[str, Callable[[Path], list[LocalEngine]]] = {
        "1 engine": _one, "1 engine, parser not cached": _uncached,
        "3 engines, one after another": _sequential, "3 engines, start_all": _side_by_side}
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="engine-start-") as tmp:
        for index in range(rounds):
            for name, case in cases.items():
                base = Path(tmp) / f"{index}-{len(times[name])}-{name[0]}"
                cpu_before = _children_cpu()
                started = time.monotonic()
                engines: list[LocalEngine] = []
                try:
                    engines = case(base)
                    times[name].append(time.monotonic() - started)
                finally:
                    for engine in engines:
                        engine.stop()
                if engines:
                    cpu[name].append((_children_cpu() - cpu_before) / len(engines))
    return times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each case (default 5)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    times, cpu = measure(max(1, args.rounds))
    print(f"engine start, median of {args.rounds} rounds (1-min load average {load_before:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end)")
    print(f"{'case':32} {'median s':>9} {'min s':>7} {'max s':>7} {'CPU s an engine':>16}")
    for name, values in times.items():
        print(f"{name:32} {statistics.median(values):9.2f} {min(values):7.2f} {max(values):7.2f} "
              f"{statistics.median(cpu[name]):16.2f}")


if __name__ == "__main__":
    main()
