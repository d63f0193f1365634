"""``reptables up``: the command's life around a :class:`~.runner.LocalRunner`.

The runner reconciles the manifests; this module is what the command adds around it: the checks
before anything starts (another ``up`` on the directory, missing manifest files), the private
umask, converging and the demo (in the first ``up`` on a data directory only: a later one never
writes demo rows over what the user did with the tables, ``state.demo_due``), then - with
``--keep-running`` or ``--live`` - the loop that watches the manifests, answers ``reptables cluster
stop|start`` and reconciles every second, and stopping the engines on the way out (Ctrl-C,
SIGTERM, an error).
"""

from __future__ import annotations

import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from reptables.engine.errors import YtError

from ..terminal import display
from .manifests import ManifestError, load_file, manifest_files
from .runner import LocalRunner
from .state import demo_due, demo_skipped, record_demo, running_up


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- `reptables up` ----------------------------------------------------------------------------------


def _live_frame(runner: LocalRunner, console: Any) -> Any:
    """One frame of the live view: the status view of the current objects and events."""
    from rich.text import Text

    from ..kubectl import statusview

    state = runner.state()
    view = statusview.build_view(state["objects"], state["events"])
    with console.capture() as capture:
        statusview.render(view, console)
    running = display(", ".join(f"{n} {'up' if e['running'] else 'STOPPED'}" for n, e in state["engines"].items()))
    return Text.from_ansi(capture.get() + f"\nengines: {running}   updated {state['updated']}   "
                          f"(Ctrl-C stops the engines)")


def _tick(runner: LocalRunner) -> None:
    runner.poll_manifests()
    runner.handle_control()
    runner.reconcile_all()


def run(paths: list[Path], data_dir: Path, keep_running: bool, timeout: float = 90.0, live: bool = False,
        demo: bool | None = None) -> int:
    """``reptables up``: start, converge, demo; with ``keep_running`` (or ``live``) watch and reconcile till stopped.

    ``demo``: write the demo rows (True), never (False), or - None, the default - only when this is
    the first ``up`` on ``data_dir`` (:func:`~.state.demo_due`)."""
    # SIGTERM ends the runner like Ctrl-C: the engines it started are stopped on the way out
    signal.signal(signal.SIGTERM, _terminate)
    # everything up creates from here on is its user's alone, whatever mode the code creating it asks
    # for: the state file and control answers (0600 anyway), and what its engines and Spark jobs write
    # (job logs, the jobs' own files) under the data directory
    os.umask(0o077)
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # a log file follows the run line by line
    keep_running = keep_running or live
    other = running_up(data_dir)
    if other is not None:
        print(display(f"error: another `reptables up` (pid {other}) runs on {data_dir}; stop it first"),
              file=sys.stderr)
        return 1
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(display(f"error: no such manifest file or directory: {', '.join(missing)}"), file=sys.stderr)
        return 1
    if demo is None:
        demo = demo_due(data_dir)  # before the runner creates anything in the directory
    try:
        manifests = [doc for file in manifest_files(paths) for doc in load_file(file)]
        runner = LocalRunner(manifests, data_dir)
    except (ManifestError, ValueError) as exc:
        print(display(f"error: {exc}", multiline=True), file=sys.stderr)
        return 1
    runner.watch(paths)
    try:
        runner.start_engines()
        runner.write_state()
        ready = runner.converge(timeout)
        runner.print_status()
        if not ready:
            print("not every resource became Ready; see the conditions above")
            if not keep_running:
                return 1
        elif demo:
            tables = runner.demo()
            record_demo(data_dir, runner.DEMO_ROWS, tables)
            runner.reconcile_all()
            runner.print_status()
        else:
            print(display(demo_skipped(data_dir)))
        if not keep_running:
            return 0
        if live:
            from rich.console import Console
            from rich.live import Live

            console = Console()
            with Live(_live_frame(runner, console), console=console, refresh_per_second=2) as view:
                while True:
                    time.sleep(1)
                    _tick(runner)
                    view.update(_live_frame(runner, console))
        print(display(f"reconciling every second, watching {', '.join(map(str, paths))}; Ctrl-C stops the engines"))
        while True:
            time.sleep(1)
            _tick(runner)
    except (YtError, RuntimeError, ValueError) as exc:
        print(display(f"error: {exc}", multiline=True), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        runner.stop()
