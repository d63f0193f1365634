"""Real engine processes for tests: started on free loopback ports, stopped by pid.

Every engine runs as ``python -m reptables.operator.cli engine serve`` in its own process group, so a
test can SIGKILL exactly the engine it started (and nothing else) to prove crash safety.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProcess:
    cluster_name: str
    data_dir: Path
    token: str = "test-token-0123456789"
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> EngineProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "engine.log", "ab")
        env = {**os.environ, "REPTABLES_TOKEN": self.token, **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reptables.operator.cli", "engine", "serve", "--cluster-name", self.cluster_name,
             "--data-dir", str(self.data_dir), "--port", str(self.port)],
            stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine {self.cluster_name} exited with {self.proc.returncode}:\n"
                                   + (self.data_dir / "engine.log").read_text()[-4000:])
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"engine {self.cluster_name} did not become ready in {timeout} s")

    def kill(self) -> None:
        """SIGKILL the engine's process group (the engine and nothing else)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def yt_env(self, config_patch: str = "{}") -> dict[str, str]:
        return {**os.environ, "YT_PROXY": self.url, "YT_TOKEN": self.token, "YT_CONFIG_PATCHES": config_patch}

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

        return yt.YtClient(proxy=self.url, token=self.token)
