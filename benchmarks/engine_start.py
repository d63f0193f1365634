"""How long engines take to start: one engine, and three one after another against ``start_all``.

Every test module, ``reptables up`` and the tour start engines, so their start time is paid
hundreds of times per test run. This measures it: the time from spawning ``engine serve`` to its
``/readyz`` answering, for one engine alone (with the query parser's tables in the user's cache, as
after any first start, and without them), for three started one after another (``LocalEngine.start``
each), and for three started side by side (``reptables.engine.process.start_all``). Each figure is
the median of ``--rounds`` rounds; the engines run on free loopback ports, in a temporary directory,
each in its own process group, and are stopped by pid after each round. Beside the time, the CPU
an engine used from its spawn to its first answers (its ``/proc/PID/stat``, read before it is
stopped).

Each case runs both ways an engine is launched (``engine/process.py``): spawned (``exec``, a new
interpreter that imports the engine) and forked by the zygote (``fork``, what the test suite uses;
the zygote is started once, before the rounds, and its own start is printed on its own line).

    .venv/bin/python benchmarks/engine_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reptables.engine.process import LAUNCH_ENV, LocalEngine, start_all

EXEC = {LAUNCH_ENV: "exec"}
FORK = {LAUNCH_ENV: "fork"}


def _one(base: Path, launch: dict[str, str]) -> list[LocalEngine]:
    engine = LocalEngine("solo", base / "solo", env=dict(launch))
    engine.start()
    return [engine]


def _uncached(base: Path, launch: dict[str, str]) -> list[LocalEngine]:
    # an empty cache directory: the engine builds the YT QL parser's tables (engine/query/grammar.py)
    engine = LocalEngine("uncached", base / "uncached", env={"XDG_CACHE_HOME": str(base / "empty-cache"), **launch})
    engine.start()
    return [engine]


def _sequential(base: Path, launch: dict[str, str]) -> list[LocalEngine]:
    engines = [LocalEngine(f"seq{i}", base / f"seq{i}", env=dict(launch)) for i in range(3)]
    for engine in engines:
        engine.start()
    return engines


def _side_by_side(base: Path, launch: dict[str, str]) -> list[LocalEngine]:
    return start_all([LocalEngine(f"all{i}", base / f"all{i}", env=dict(launch)) for i in range(3)])


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) the process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _zygote_start(tmp: Path) -> float:
    """The first forked engine's start: it spawns this process's zygote, which imports the engine."""
    started = time.monotonic()
    engine = LocalEngine("warm", tmp / "warm", env=dict(FORK)).start()
    elapsed = time.monotonic() - started
    engine.stop()
    return elapsed


def measure(rounds: int) -> tuple[float, dict[str, list[float]], dict[str, list[float]]]:
    """The zygote's start, and per case the start times (s) and the CPU seconds an engine used."""
    shapes: dict[str, Callable[[Path, dict[str, str]], list[LocalEngine]]] = {
        "1 engine": _one, "1 engine, parser not cached": _uncached,
        "3 engines, one after another": _sequential, "3 engines, start_all": _side_by_side}
    cases = {f"{name}, {launch[LAUNCH_ENV]}": (shape, launch)
             for launch in (EXEC, FORK) for name, shape in shapes.items()
             if not (launch is FORK and shape is _uncached)}  # a forked engine has the zygote's parser
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="engine-start-") as tmp:
        zygote = _zygote_start(Path(tmp))
        for index in range(rounds):
            for name, (shape, launch) in cases.items():
                base = Path(tmp) / f"{index}-{len(times[name])}-{name[0]}-{launch[LAUNCH_ENV]}"
                started = time.monotonic()
                engines: list[LocalEngine] = []
                try:
                    engines = shape(base, launch)
                    times[name].append(time.monotonic() - started)
                    cpu[name].append(statistics.fmean(_cpu(engine.pid) for engine in engines))
                finally:
                    for engine in engines:
                        engine.stop()
    return zygote, times, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each case (default 5)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    zygote, times, cpu = measure(max(1, args.rounds))
    print(f"engine start, median of {args.rounds} rounds (1-min load average {load_before:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end)")
    print(f"the zygote's start with the first forked engine (once per process): {zygote:.2f} s")
    print(f"{'case':38} {'median s':>9} {'min s':>7} {'max s':>7} {'CPU s an engine':>16}")
    for name, values in times.items():
        print(f"{name:38} {statistics.median(values):9.2f} {min(values):7.2f} {max(values):7.2f} "
              f"{statistics.median(cpu[name]):16.2f}")


if __name__ == "__main__":
    main()
