"""Clock faults: each engine of a fault run reads its wall clock through an offset the nemesis sets.

Why not libfaketime: it is the usual tool (``LD_PRELOAD``, ``FAKETIME``, a file it re-reads for
jumps), and Debian 12 has it (0.9.10), but it cannot drive a Python engine here. With the monotonic
clock faked too (its default), ``threading.Event.wait(0.2)`` never returns - every thread that
waits with a timeout (replicators, shippers, the HTTP server's workers) hangs; with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, ``time.sleep`` fails with ``OSError: [Errno 22] Invalid
argument`` (its ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` is rewritten wrongly). Both are
reproduced by ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 FAKETIME=+5s python3
-c 'import threading; threading.Event().wait(0.2)'`` (hangs) and the same with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` and ``import time; time.sleep(0.1)`` (EINVAL).

So the skew is applied inside the engine's process, without a change to the engine: the engine is
started as ``python -m reptables.testing.chaos.clock --clock-file F serve ...``, which replaces
``time.time`` and ``time.time_ns`` with the real clock plus the offset held in ``F`` and then runs
the engine's own command line. Everything of the engine that reads the wall clock does so through
``time.time()``/``time.time_ns()`` (timestamps, the XDCR version clock, lags, retention, logs); the
monotonic clock, which every timeout and sleep uses, is left alone - as on a machine whose clock is
stepped by NTP, where ``CLOCK_MONOTONIC`` does not jump. Not covered: C code reading the clock
itself (SQLite's date functions, ``datetime.now()``, which names the XDCR conflict CSV files).

A skew is an offset held from the start of the fault; a *jump* is a change of the offset while the
engine runs (forward, or back: the engine's clock then reads earlier than a moment ago). The file
holds one number, seconds, written whole (a temporary file renamed over it); the engine re-reads it
every 20 ms, so a jump takes effect within that.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

__all__ = ["ClockFile", "install", "main"]

#: how often an engine looks at its clock file (seconds): a jump lands within this
POLL_INTERVAL = 0.02


class ClockFile:
    """The offset of one engine's wall clock, in seconds, as a file the engine re-reads."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, offset_seconds: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_seconds!r}\n")
        os.replace(tmp, self.path)

    def get(self) -> float:
        try:
            return float(self.path.read_text().strip() or 0.0)
        except (OSError, ValueError):
            return 0.0


def install(clock_file: ClockFile, interval: float = POLL_INTERVAL) -> None:
    """From now on ``time.time()``/``time.time_ns()`` of this process are the real clock plus the
    file's offset, re-read every ``interval`` seconds by a daemon thread."""
    real_time, real_time_ns = time.time, time.time_ns
    offset = [clock_file.get()]

    def follow() -> None:
        while True:
            time.sleep(interval)
            offset[0] = clock_file.get()

    def skewed_time() -> float:
        return real_time() + offset[0]

    def skewed_time_ns() -> int:
        return real_time_ns() + int(offset[0] * 1e9)

    time.time = skewed_time
    time.time_ns = skewed_time_ns
    threading.Thread(target=follow, name="chaos-clock", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """``--clock-file F <engine command line>``: the engine's CLI (``serve ...``) with a skewable clock."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--clock-file":
        raise SystemExit("usage: python -m reptables.testing.chaos.clock --clock-file FILE serve ...")
    install(ClockFile(Path(args[1])))
    from reptables.engine.cli import app

    app(args=args[2:], prog_name="reptables engine")


if __name__ == "__main__":
    main()
