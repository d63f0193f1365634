"""Kept for the modules that import their engine from here: the harness is ``reptables.testing``.

New code imports ``EngineProcess`` and ``free_port`` from :mod:`reptables.testing` (tests,
benchmarks and fault runs share it; nothing may import from tests/).
"""

from __future__ import annotations

from reptables.testing import EngineProcess, free_port

__all__ = ["EngineProcess", "free_port"]
