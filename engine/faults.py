"""Named crash points for fault tests.

Crash-safety claims ("a transaction killed between prepare and commit is recovered") need a way to
die at exactly that point. ``REPTABLES_CRASH_AT=<point>[,<point>...]`` (read once into
``EngineConfig.crash_points`` by the command line) makes the engine SIGKILL itself when it reaches
one of the named points; with none set, a check costs one set lookup.

Races need the same precision: ``REPTABLES_DELAY_AT=<point>:<seconds>[,...]`` (``delay_points``)
makes the thread that reaches a named point sleep there (some points are inside a write transaction,
the writer lock held: a test-only widening), so that a test can make the other side
of a race happen inside the window (a commit landing while the replicator takes a barrier).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping


class Faults:
    """The crash points of one engine."""

    def __init__(self, points: Iterable[str] = (), delays: Mapping[str, float] | None = None) -> None:
        self._points = frozenset(points)
        self._delays = dict(delays or {})

    def crash_point(self, name: str) -> None:
        if name in self._points:
            os.kill(os.getpid(), signal.SIGKILL)

    def delay_point(self, name: str) -> None:
        """Sleep here if ``name`` is a delay point (no lock may be held by the caller)."""
        delay = self._delays.get(name)
        if delay:
            time.sleep(delay)


def parse_delays(spec: str) -> dict[str, float]:
    """``point:seconds[,point:seconds...]`` (``REPTABLES_DELAY_AT``); malformed entries are refused."""
    delays: dict[str, float] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, sep, seconds = item.partition(":")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or not name or not 0 <= value <= 60:
            raise ValueError(f"Invalid REPTABLES_DELAY_AT entry {item!r}: expected <point>:<seconds>, "
                             "0 to 60 seconds")
        delays[name] = value
    return delays


NO_FAULTS = Faults()
