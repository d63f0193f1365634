"""A process that has imported the engine once and forks engines from it: starts without the imports.

Why: an engine's start is mostly its imports (SQLAlchemy, the API, the node, the query parser's
tables): about a second of CPU, paid again by every engine a test, ``reptables up`` or a benchmark
starts - hundreds per test run. A zygote (as Android's, or ``multiprocessing``'s forkserver) pays
them once: it imports the modules ``engine serve`` uses, then waits on a socket for requests and
forks a child per request. The child is a real engine process - its own pid, its own session and
process group, its own log, the environment it was asked for - that runs ``engine serve`` as
``python -m reptables.engine.cli serve`` would, and exits through the interpreter's normal exit
(``atexit`` handlers, non-daemon threads joined). Only the imports are shared, copied on write.

The zygote itself never runs a thread (a fork copies only the forking thread, so a lock held by
another would stay locked in the child forever): it checks that after its imports and refuses to
serve otherwise. ``engine/process.py`` is its client and falls back to a plain spawn whenever the
zygote cannot be used.

Protocol (a ``SOCK_SEQPACKET`` socket pair, one message per request, one answer per request):
the request is JSON ``{"argv", "env", "cwd"}`` with two descriptors beside it: the log file (the
child's stdout and stderr) and the write end of a status pipe. The answer is JSON ``{"pid": N}``
or ``{"error": "..."}``. When the zygote reaps the child it writes the exit code (``-N`` for
signal N, as ``subprocess`` reports it) into that child's status pipe and closes it, so the client
reads the child's exit without being its parent. At end of file on its socket the zygote exits,
leaving running engines running (they belong to their own sessions, as spawned ones do).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import selectors
import signal
import socket
import sys
import threading
from typing import Any

#: what ``engine serve`` imports, at its start or on its first requests; a module that fails to
#: import (an optional driver) is left to the child, which fails as a spawned engine would
PRELOAD = (
    "reptables.engine.cli", "reptables.engine.logs", "reptables.engine.api", "reptables.engine.api.server",
    "reptables.engine.errors", "reptables.engine.node", "reptables.engine.node.tables",
    "reptables.engine.storage", "reptables.engine.storage.database", "reptables.engine.storage.leadership",
    "reptables.engine.httpconn", "yt.yson", "sqlalchemy", "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql", "uvicorn", "uvicorn.loops.asyncio", "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl", "uvicorn.lifespan.on", "psycopg", "psycopg_pool",
    "uvicorn.loops.auto", "uvloop", "uvicorn.protocols.websockets.auto", "anyio._backends._asyncio",
    "httpcore", "typer._click.decorators", "pydantic.plugin._loader",
    "typer._adapters",  # typer builds its parameters with pydantic, imported at the first command line parsed
)

#: the largest request: argv and an environment
_MAX_MESSAGE = 1 << 20


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class _Zygote:
    """The serving loop: requests on the socket, children reaped on SIGCHLD."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.status_fds: dict[int, int] = {}  # child pid -> write end of its status pipe
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def serve(self) -> dict[str, Any] | None:
        """Serve until the client goes away (None) or, in a forked child, return the child's request."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to be woken: reaped below
        with selectors.DefaultSelector() as selector:
            selector.register(self.control, selectors.EVENT_READ)
            selector.register(self.wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self.wake_r:
                        while True:
                            try:
                                if not os.read(self.wake_r, 512):
                                    break
                            except BlockingIOError:
                                break
                        continue
                    message, fds, _, _ = socket.recv_fds(self.control, _MAX_MESSAGE, 2)
                    if not message:
                        self._close_all(fds)
                        return None
                    request = self._fork(message, fds)
                    if request is not None:
                        return request
                self._reap()

    def _fork(self, message: bytes, fds: list[int]) -> dict[str, Any] | None:
        if len(fds) != 2:
            self._close_all(fds)
            self._answer({"error": f"expected 2 descriptors (log, status), got {len(fds)}"})
            return None
        log_fd, status_fd = fds
        try:
            request = json.loads(message)
            pid = os.fork()
        except (ValueError, OSError) as exc:
            self._close_all(fds)
            self._answer({"error": f"{type(exc).__name__}: {exc}"})
            return None
        if pid == 0:
            os.close(status_fd)
            self._become_child(log_fd)
            request["_log_fd"] = log_fd
            return request
        os.close(log_fd)
        self.status_fds[pid] = status_fd
        self._answer({"pid": pid})
        self._reap()
        return None

    def _become_child(self, log_fd: int) -> None:
        """In the child: nothing of the zygote's left open or installed."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.control.close()
        self._close_all([self.wake_r, self.wake_w, *self.status_fds.values()])
        self.status_fds.clear()

    def _answer(self, answer: dict[str, Any]) -> None:
        self.control.sendall(json.dumps(answer).encode())

    def _reap(self) -> None:
        while self.status_fds:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = self.status_fds.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
                except OSError:  # the client closed its end: no one is waiting for this child
                    pass
                os.close(fd)

    @staticmethod
    def _close_all(fds: list[int]) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _run_child(request: dict[str, Any]) -> None:
    """Become the engine the request asked for; raises SystemExit with its exit code."""
    log_fd = int(request["_log_fd"])
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # the zygote's state is every child's: each engine draws its own
    argv = list(request["argv"])
    sys.argv = ["reptables.engine.cli", *argv]
    from .cli import app

    app(args=argv, prog_name="python -m reptables.engine.cli")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m reptables.engine.zygote CONTROL_FD")
    control = socket.socket(fileno=int(sys.argv[1]))
    _preload()
    if threading.active_count() != 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        control.sendall(json.dumps({"error": f"threads after the imports ({names}): forking is unsafe"}).encode())
        sys.exit(1)
    control.sendall(json.dumps({"ready": os.getpid()}).encode())
    request = _Zygote(control).serve()
    if request is not None:
        _run_child(request)


if __name__ == "__main__":
    main()
