"""``python -m reptables.testing.chaos``: long fault runs (``hack/chaos.sh``), re-checks of a history, clean-up.

* ``run --scenarios a,b --duration S --seed N --out DIR [--storage postgresql]``: each scenario for
  ``S`` seconds of faults, into ``DIR/<scenario>/`` (``history.jsonl``, ``summary.json``, ``data/``),
  then ``DIR/summary.json``
  with every run's operations, faults, lost, duplicated and anomalies; exit status 1 on any
  anomaly (2 when the machine cannot run faults at all);
* ``check HISTORY``: the checkers again, from a history file alone (what the run recorded is all
  they need), printing the same summary;
* ``list``: the scenarios and what each does;
* ``cleanup [--kill]``: remove the namespaces of runs that died without cleaning up (``--kill``: and
  the processes still running in them, by pid).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .catalog import SCENARIOS
from .checkers import check_history
from .cluster import STORAGES, exit_on_signals
from .history import History
from .net import missing_tools, sweep_stale
from .runner import run_scenario, summarise


def _line(summary: dict[str, Any]) -> str:
    ops = summary["operations"]
    faults = sum(summary["faults"].values())
    return (f"{summary['scenario']}: {'ok' if summary['valid'] else 'ANOMALIES'} - operations ok {ops['ok']} "
            f"fail {ops['fail']} unknown {ops['unknown']}; faults {faults} {summary['faults']}; lost "
            f"{summary['lost']}; duplicated {summary['duplicated']}; anomalies {summary['anomalies']} "
            f"({summary['seconds']} s)")


def _run(args: argparse.Namespace) -> int:
    problem = missing_tools()
    if problem is not None:
        print(f"chaos: cannot run: {problem}", file=sys.stderr)
        return 2
    names = [n for n in args.scenarios.split(",") if n] if args.scenarios != "all" else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"chaos: unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    for line in sweep_stale():
        print(f"chaos: {line}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    with exit_on_signals():
        for i, name in enumerate(names):
            summary = run_scenario(SCENARIOS[name], out / name, args.duration, args.seed + i, storage=args.storage)
            summaries.append(summary)
            print(_line(summary), flush=True)
            for check in summary["checks"]:
                if not check["valid"]:
                    print(f"  {check['checker']} {check['workload']}: lost {check['lost'][:5]} duplicated "
                          f"{check['duplicated'][:5]} anomalies {check['anomalies'][:5]}")
            for problem in summary["scenario_anomalies"] + summary["errors"]:
                print(f"  {problem.splitlines()[0]}")
    total = {
        "scenarios": [{k: s[k] for k in ("scenario", "seed", "duration", "seconds", "operations", "faults", "lost",
                                         "duplicated", "anomalies", "valid")} for s in summaries],
        "lost": sum(s["lost"] for s in summaries), "duplicated": sum(s["duplicated"] for s in summaries),
        "anomalies": sum(s["anomalies"] for s in summaries), "valid": all(s["valid"] for s in summaries),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / "summary.json").write_text(json.dumps(total, indent=2) + "\n")
    print(f"chaos: {len(summaries)} scenarios, lost {total['lost']}, duplicated {total['duplicated']}, "
          f"anomalies {total['anomalies']}: {'ok' if total['valid'] else 'FAILED'} (summary in {out / 'summary.json'})")
    return 0 if total["valid"] else 1


def _check(args: argparse.Namespace) -> int:
    history = History.load(args.history)
    start = next((op.value for op in history if op.process == "run" and op.f == "start"), None)
    if start is None:
        print(f"chaos: {args.history} has no run start entry (not a fault run's history?)", file=sys.stderr)
        return 2
    results = check_history(history, start["workloads"])
    # what the run itself found (convergence, bootstraps, joins, its own errors) is in the history too
    recorded = [str(op.value) for op in history if op.process == "run" and op.f == "anomaly"]
    summary = summarise(start["scenario"], start["seed"], start["duration"], history, results, [], recorded, 0.0)
    print(json.dumps(summary, indent=2, default=str) if args.json else _line(summary))
    for check in summary["checks"]:
        if not check["valid"]:
            print(f"  {check['checker']} {check['workload']}: lost {check['lost'][:5]} duplicated "
                  f"{check['duplicated'][:5]} anomalies {check['anomalies'][:5]}")
    return 0 if summary["valid"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.testing.chaos", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios with faults")
    run.add_argument("--scenarios", default="all", help="comma-separated names, or all")
    run.add_argument("--duration", type=float, default=600.0, help="seconds of faults per scenario")
    run.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    run.add_argument("--out", type=Path, default=Path("chaos-out"))
    run.add_argument("--storage", choices=STORAGES, default="sqlite",
                     help="the engines' storage: SQLite in their data directories, or a PostgreSQL database each "
                          "on the run's server (which the faults then also cut off and crash)")
    check = sub.add_parser("check", help="check a history file again")
    check.add_argument("history", type=Path)
    check.add_argument("--json", action="store_true")
    sub.add_parser("list", help="list the scenarios")
    cleanup = sub.add_parser("cleanup", help="remove what runs that died left behind")
    cleanup.add_argument("--kill", action="store_true", help="also SIGKILL processes still running in them")
    args = parser.parse_args(argv)
    # SIGUSR1 prints every thread's stack to stderr: a run that does not stop can be asked where it is
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl-C always ends a run, its cleanup included, even when started with SIGINT ignored (a parent that
    # ignores it passes that on: Python then installs no KeyboardInterrupt, as a suite run of the test met)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.command == "run":
        return _run(args)
    if args.command == "check":
        return _check(args)
    if args.command == "list":
        for name, scenario in SCENARIOS.items():
            print(f"{name}: {scenario.description}")
        return 0
    for line in sweep_stale(kill=args.kill) or ["nothing to clean"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
