"""Named crash points for fault tests.

Crash-safety claims ("a transaction killed between prepare and commit is recovered") need a way to
die at exactly that point. ``REPTABLES_CRASH_AT=<point>[,<point>...]`` (read once into
``EngineConfig.crash_points`` by the command line) makes the engine SIGKILL itself when it reaches
one of the named points; with none set, a check costs one set lookup.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable


class Faults:
    """The crash points of one engine."""

    def __init__(self, points: Iterable[str] = ()) -> None:
        self._points = frozenset(points)

    def crash_point(self, name: str) -> None:
        if name in self._points:
            os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = Faults()
