"""Named crash points for fault tests.

Crash-safety claims ("a transaction killed between prepare and commit is recovered") need a way to
die at exactly that point. ``REPTABLES_CRASH_AT=<point>[,<point>...]`` makes the process SIGKILL
itself when it reaches one of the named points; unset (the default) it costs one set lookup.
"""

from __future__ import annotations

import os
import signal

_POINTS = frozenset(p for p in os.environ.get("REPTABLES_CRASH_AT", "").split(",") if p)


def crash_point(name: str) -> None:
    if name in _POINTS:
        os.kill(os.getpid(), signal.SIGKILL)
