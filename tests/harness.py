"""Real engine processes for tests: started on free loopback ports, stopped by pid.

Every engine is a :class:`reptables.engine.process.LocalEngine` (its own process group, so a test can
SIGKILL exactly the engine it started, and nothing else, to prove crash safety); this adds the
official ``yt`` CLI and ``yt.wrapper`` pointed at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from reptables.engine.process import LocalEngine, free_port

__all__ = ["EngineProcess", "free_port"]

VENV_BIN = Path(sys.executable).parent


@dataclass
class EngineProcess(LocalEngine):
    """A real engine for a test, with the official ``yt`` CLI and ``yt.wrapper`` pointed at it."""

    token: str | None = "test-token-0123456789"

    def yt_env(self, config_patch: str = "{}") -> dict[str, str]:
        return {**os.environ, "YT_PROXY": self.url, "YT_TOKEN": self.read_token(), "YT_CONFIG_PATCHES": config_patch}

    def yt(self, *args: str, input: str | None = None, check: bool = True,
           config_patch: str = "{}") -> subprocess.CompletedProcess:
        """Run the official ``yt`` CLI against this engine (``config_patch``: YSON, YT_CONFIG_PATCHES)."""
        result = subprocess.run([str(VENV_BIN / "yt"), *args], input=input, capture_output=True, text=True,
                                env=self.yt_env(config_patch), timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"yt {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def wrapper_client(self):
        import yt.wrapper as yt

        return yt.YtClient(proxy=self.url, token=self.read_token())
