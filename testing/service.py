"""A Kubernetes Service in front of a leader/standby group, on loopback, for tests.

On Kubernetes the engines of an HA table cluster sit behind a Service whose endpoints are the Ready
pods, and readiness is leadership (a standby answers ``/readyz`` 503, docs/ha.md): what knows a
cluster by one address - a TableCluster's endpoint, so the operator and its tracker - reaches the
leader through it, also after a takeover. Tests have no kube-proxy; :class:`LeaderService` stands in
for one: a listener on a free loopback port that forwards each connection, byte for byte, to the
engine whose ``/readyz`` answered 200 at the last look (every 0.2 s).

What is tricky, and kept as kube-proxy does it:

* a connection made while no engine leads (a takeover under way) waits, up to ``wait_for_leader``
  seconds, before anything is forwarded: nothing was sent, so the client sees a slow answer, never
  a reset of a request no engine got;
* once forwarded, a connection stays with its engine: when that engine dies the client sees the
  connection end (a request in flight has an unknown outcome), and its next connection reaches the
  new leader; a paused engine holds its connections, as a paused pod does;
* threads of its own, stopped by :meth:`LeaderService.stop` (the listener and every forwarded
  connection closed).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import httpx

__all__ = ["LeaderService"]


class LeaderService:
    """Forwards ``127.0.0.1:<port>`` to the engine of ``engines`` (URLs) that is ready, i.e. leads."""

    def __init__(self, engines: Sequence[str], look_period: float = 0.2, wait_for_leader: float = 15.0) -> None:
        self.engines = list(engines)
        self.look_period = look_period
        self.wait_for_leader = wait_for_leader
        #: the engine whose /readyz answered 200 at the last look (None: none); a reference, read by threads
        self.leader: str | None = None
        #: (monotonic time, engine) each time the connections started going elsewhere
        self.changes: list[tuple[float, str | None]] = []
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port: int = self._listener.getsockname()[1]
        #: guards _open; a leaf
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # guarded by _lock
        self._threads = [threading.Thread(target=self._look, daemon=True, name="service-look"),
                         threading.Thread(target=self._accept, daemon=True, name="service-accept")]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            open_now, self._open = self._open, set()
        self._drop(*open_now)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- readiness --------------------------------------------------------------------------------------

    def _look(self) -> None:
        with httpx.Client(timeout=self.look_period * 2) as http:
            while not self._stopped.is_set():
                ready = None
                for engine in self.engines:
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get(f"{engine}/readyz").status_code == 200:
                            ready = engine
                            break
                if ready != self.leader:
                    self.leader = ready
                    self.changes.append((time.monotonic(), ready))
                self._stopped.wait(self.look_period)

    # -- forwarding ---------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            self._keep(client)
            threading.Thread(target=self._forward, args=(client,), daemon=True, name="service-conn").start()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.difference_update(socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's recv
            with contextlib.suppress(OSError):
                sock.close()

    def _connect_to_leader(self) -> socket.socket | None:
        """A connection to the engine that leads, waited for (None: none led in time, or stopped)."""
        deadline = time.monotonic() + self.wait_for_leader
        while not self._stopped.is_set() and time.monotonic() < deadline:
            leader = self.leader
            if leader is not None:
                parts = urlsplit(leader)
                try:
                    return socket.create_connection((parts.hostname, parts.port), timeout=2)
                except OSError:
                    pass  # it died since the last look: nothing was sent, wait for the next look
            time.sleep(0.05)
        return None

    def _forward(self, client: socket.socket) -> None:
        upstream = self._connect_to_leader()
        if upstream is None:
            self._drop(client)
            return
        upstream.settimeout(None)
        self._keep(upstream)
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True, name="service-pump")
        back.start()
        self._pump(client, upstream)
        back.join()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        """Bytes from ``source`` to ``target`` until either side ends; then both are closed."""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
        except OSError:
            pass
        self._drop(source, target)
