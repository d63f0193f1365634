"""An engine as a child process: started on a loopback port, awaited, stopped by its pid.

The local runner, the tests and the benchmarks all run real engines. Each engine gets its own
session (so its process group id is its pid) and is stopped through that group — SIGTERM, then
SIGKILL — never by name, so nothing else on the machine is touched. ``kill`` is a SIGKILL of the
group, for crash tests.

Two ways to launch one. ``exec`` (the default) spawns ``python -m reptables.engine.cli serve``.
``fork`` (``REPTABLES_ENGINE_LAUNCH=fork``; the test suite sets it) asks this process's zygote
(``engine/zygote.py``: one process per caller that imported the engine once) to fork the engine,
which skips the second of CPU the imports cost - the largest part of an engine's start. A forked
engine is the same engine in its own session; :class:`ForkedProcess` gives it the part of
``subprocess.Popen`` callers use (``pid``, ``poll``, ``wait``, ``returncode``). An engine whose
environment changes how Python itself starts (``PYTHON*``, ``LD_*``) is always spawned, and so is
every engine once the zygote could not be started.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypeVar

import httpx

E = TypeVar("E", bound="LocalEngine")

#: the environment variable that picks how engines are launched: ``exec`` (default) or ``fork``
LAUNCH_ENV = "REPTABLES_ENGINE_LAUNCH"


#: the loopback ports :func:`free_port` handed out lately, oldest first, and the same as a set
_issued_ports: deque[int] = deque(maxlen=4096)
_issued_set: set[int] = set()
_issued_ports_lock = threading.Lock()  # guards _issued_ports and _issued_set; a leaf
_MAX_TRIES = 64


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, and not one this process handed out lately.

    The kernel may give the same port to two binds in a row once the first socket is closed, and
    callers take several ports before any server binds them (the endpoints of a set of engines):
    two engines handed one port made one answer for the other's URL, with the other's token
    refused. So the port is also checked against the last 4,096 this process handed out.
    """
    with _issued_ports_lock:
        for _ in range(_MAX_TRIES):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port in _issued_set:
                continue
            if len(_issued_ports) == _issued_ports.maxlen:
                _issued_set.discard(_issued_ports[0])
            _issued_ports.append(port)
            _issued_set.add(port)
            return port
    raise RuntimeError(f"no free loopback port in {_MAX_TRIES} tries that this process had not handed out lately")


class ForkedProcess:
    """An engine the zygote forked: not this process's child, so its exit is read from the status
    pipe the zygote writes the exit code into when it reaps it (``-N`` for signal N, as ``Popen``)."""

    def __init__(self, pid: int, status_fd: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._status_fd = status_fd
        self._orphaned = False  # the zygote went away without a code: the pid is watched instead
        self._status_lock = threading.Lock()  # guards returncode, _status_fd and _orphaned; a leaf
        os.set_blocking(status_fd, False)

    def poll(self) -> int | None:
        with self._status_lock:
            if self.returncode is not None:
                return self.returncode
            if self._orphaned:
                if not _running(self.pid):
                    self.returncode = -1  # exited; its code went with the zygote
                return self.returncode
            try:
                data = os.read(self._status_fd, 32)
            except BlockingIOError:
                return None
            os.close(self._status_fd)
            if data:
                self.returncode = int(data)
            else:
                self._orphaned = True
        return self.poll()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout if timeout is not None else 0.0)
            if self._orphaned:
                time.sleep(0.05 if left is None else min(0.05, left))
                continue
            with contextlib.suppress(OSError, ValueError):  # closed by another thread's poll
                select.select([self._status_fd], [], [], 0.5 if left is None else min(0.5, left))
        return code


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie no longer does: its parent may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


Process: TypeAlias = subprocess.Popen[bytes] | ForkedProcess


class _Zygote:
    """This process's zygote (``engine/zygote.py``): spawned on first use, asked over a socket pair."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reptables.engine.zygote", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True)
        self.sock = mine
        try:
            self.sock.settimeout(120.0)
            hello = json.loads(self.sock.recv(1 << 16) or b"{}")
            if "ready" not in hello:
                raise RuntimeError(f"the engine zygote did not start: {hello.get('error', 'it exited')}")
        except BaseException:
            self.close()
            raise

    def fork(self, argv: list[str], env: dict[str, str], log_fd: int) -> ForkedProcess:
        status_r, status_w = os.pipe()
        try:
            request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
            socket.send_fds(self.sock, [request], [log_fd, status_w])
            answer = json.loads(self.sock.recv(1 << 16) or b"{}")
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        if "pid" not in answer:
            os.close(status_r)
            raise RuntimeError(f"the engine zygote could not fork: {answer.get('error', 'it went away')}")
        return ForkedProcess(int(answer["pid"]), status_r, argv)

    def close(self) -> None:
        self.sock.close()  # end of file: the zygote exits (its engines run on)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_zygote: _Zygote | None = None
_zygote_failed = False
_zygote_lock = threading.Lock()  # guards _zygote, _zygote_failed and the zygote's socket; a leaf


def _fork_engine(argv: list[str], env: dict[str, str], log_fd: int) -> ForkedProcess | None:
    """The engine forked by this process's zygote, or None if there is none to be had (then spawn)."""
    global _zygote, _zygote_failed
    with _zygote_lock:
        if _zygote is not None and _zygote.owner != os.getpid():
            _zygote = None  # a forked copy of the process that started it: it is not ours to ask
        if _zygote is None and not _zygote_failed:
            try:
                _zygote = _Zygote()
            except (OSError, RuntimeError, ValueError):
                _zygote_failed = True
        if _zygote is None:
            return None
        try:
            return _zygote.fork(argv, env, log_fd)
        except (OSError, RuntimeError, ValueError):
            _zygote.close()
            _zygote, _zygote_failed = None, True
            return None


@atexit.register
def _close_zygote() -> None:
    global _zygote
    with _zygote_lock:
        if _zygote is not None and _zygote.owner == os.getpid():
            _zygote.close()
        _zygote = None


def _forkable(env: dict[str, str], own: dict[str, str]) -> bool:
    """Whether an engine may be forked: ``fork`` was asked for, and nothing of its own environment
    (``own``) changes how the interpreter starts (that takes effect only in a new interpreter)."""
    return env.get(LAUNCH_ENV, "exec") == "fork" and not any(
        name.startswith(("PYTHON", "LD_")) and value != os.environ.get(name) for name, value in own.items())


@dataclass
class LocalEngine:
    cluster_name: str
    data_dir: Path
    port: int = field(default_factory=free_port)
    #: the engine's token; None lets the engine use (or make) DATA_DIR/token
    token: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    extra_args: list[str] = field(default_factory=list)
    proc: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"engine {self.cluster_name} is not running")
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.data_dir / "engine.log"

    def start(self, timeout: float = 30.0) -> LocalEngine:
        """Start the engine and wait until ``/readyz`` answers; a clear error with its log if not."""
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> LocalEngine:
        """Start the engine's process without waiting for it (:meth:`wait_ready` waits)."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, like everything in it
        env = {**os.environ, **self.env}
        if self.token is not None:
            env["REPTABLES_TOKEN"] = self.token
        argv = ["serve", "--cluster-name", self.cluster_name, "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--log-level", self.log_level, *self.extra_args]
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            forked = _fork_engine(argv, env, log.fileno()) if _forkable(env, self.env) else None
            self.proc = forked or subprocess.Popen(
                [sys.executable, "-m", "reptables.engine.cli", *argv],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 30.0) -> LocalEngine:
        """Wait until the spawned engine answers ``/readyz``; stopped, and a clear error with its log, if not."""
        return self._wait_for("/readyz", "ready", timeout)

    def wait_up(self, timeout: float = 30.0) -> LocalEngine:
        """Wait until the spawned engine answers ``/healthz``: it serves, or stands by (``--standby``: a
        standby is never ready until it leads); stopped, and a clear error with its log, if not."""
        return self._wait_for("/healthz", "up", timeout)

    def _wait_for(self, path: str, what: str, timeout: float) -> LocalEngine:
        if self.proc is None:
            raise RuntimeError(f"engine {self.cluster_name} was not started")
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine {self.cluster_name} exited with {self.proc.returncode}:\n"
                                       + self.log_path.read_text(errors="replace")[-4000:])
                with contextlib.suppress(httpx.HTTPError):
                    answer = http.get(f"{self.url}{path}")
                    if answer.status_code == 200:
                        self._check_identity(answer)
                        return self
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"engine {self.cluster_name} did not become {what} in {timeout} s; see {self.log_path}")

    def _check_identity(self, answer: httpx.Response) -> None:
        """The engine that answered on this port must be this one: another engine already listening on
        it (two handed one port) would answer for it, and this one would exit on its failed bind."""
        with contextlib.suppress(ValueError):
            body = answer.json()
            name = body.get("cluster_name") if isinstance(body, dict) else None
            if name is not None and name != self.cluster_name:
                self.stop()
                raise RuntimeError(f"engine {self.cluster_name}: port {self.port} is served by engine {name}, "
                                   "not by this one: give each engine a port of its own")

    def read_token(self) -> str:
        return self.token if self.token is not None else (self.data_dir / "token").read_text().strip()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the engine's process group (the engine and nothing else)."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the engine's process group; SIGKILL it if it has not exited after ``timeout``."""
        self.begin_stop()
        self.finish_stop(timeout)

    def begin_stop(self) -> None:
        """SIGTERM the engine's process group and return: :meth:`finish_stop` waits for it."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def finish_stop(self, timeout: float = 15.0) -> None:
        """Wait up to ``timeout`` for an engine :meth:`begin_stop` signalled to exit; SIGKILL it after."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()


def stop_all(engines: Iterable[LocalEngine], timeout: float = 15.0) -> list[str]:
    """Stop several engines side by side: every one is sent SIGTERM before any is waited for, so their
    graceful stops (uvicorn's, then the node's close) overlap; one still running after ``timeout`` is
    SIGKILLed. Each engine is stopped whatever another does: the answer lists the ones that failed
    (``"<cluster name> (pid N): <error>"``), empty if none did."""
    errors: list[str] = []
    signalled: list[LocalEngine] = []
    for engine in engines:
        try:
            engine.begin_stop()
            signalled.append(engine)
        except Exception as exc:  # noqa: BLE001 - the others are stopped still
            errors.append(f"{engine.cluster_name} (pid {engine.proc.pid if engine.proc else '-'}): {exc}")
    deadline = time.monotonic() + timeout
    for engine in signalled:
        try:
            engine.finish_stop(deadline - time.monotonic())
        except Exception as exc:  # noqa: BLE001 - the others are stopped still
            errors.append(f"{engine.cluster_name} (pid {engine.proc.pid if engine.proc else '-'}): {exc}")
    return errors


def start_all(engines: Iterable[E], timeout: float = 30.0) -> list[E]:
    """Start several engines side by side: every process is spawned before any is waited for, so
    their imports and recoveries overlap (``benchmarks/engine_start.py`` measures it). If one fails,
    every engine of the call is stopped and the first error is raised."""
    started: list[E] = []
    try:
        for engine in engines:
            engine.spawn()
            started.append(engine)
        for engine in started:
            engine.wait_ready(timeout)
    except BaseException:
        for engine in started:
            engine.stop()
        raise
    return started
