"""A Kubernetes Service on loopback: the one address of a local HA table cluster, forwarding to its leader.

On Kubernetes an HA table cluster's engines sit behind a Service whose endpoints are the Ready pods,
and readiness is leadership (a standby answers ``/readyz`` 503): so the TableCluster's endpoint, the
other engines' directory entries and the ``yt`` CLI all reach the leader through one address, also
after a takeover. ``reptables up`` has no kube-proxy, so for a TableCluster with ``spec.members`` it
runs this instead: a TCP listener on the endpoint's port that forwards each connection, byte for byte,
to the member whose ``/readyz`` answered 200 at the last look (every quarter second, the members side by
side).

What is tricky:

* **A connection while no member leads** (a takeover under way) is held, not refused, until one leads
  (at most :data:`WAIT_FOR_LEADER` seconds, then closed): the client's request waits in the socket as
  it would at a slow engine. Nothing was forwarded yet, so the client never sees a connection reset
  for a request no engine got. A member that refuses the connection (it died since the last look) is
  skipped the same way.
* **Once forwarded, a connection stays with its engine**, as kube-proxy's do: when that engine dies,
  the client sees the connection close (a request in flight has an unknown outcome, as on
  Kubernetes), and its next connection reaches the new leader.
* **Its own thread and event loop**, started and stopped by the runner; :meth:`stop` closes the
  listener and every forwarded connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlparse

import httpx

#: seconds between two looks at the members' /readyz
LOOK_PERIOD = 0.25
#: seconds a connection is held while no member leads, before it is closed
WAIT_FOR_LEADER = 15.0
_CHUNK = 65536


class LocalService:
    """Forwards ``127.0.0.1:port`` to the leader among ``members`` (see the module docstring)."""

    def __init__(self, name: str, port: int, members: list[str], look_period: float = LOOK_PERIOD) -> None:
        self.name = name
        self.port = port
        self.members = list(members)
        self.look_period = look_period
        #: the member whose /readyz answered 200 at the last look (a reference: read from any thread)
        self.leader: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> LocalService:
        """Listen (an error naming the port if it is taken) and look at the members from now on."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=f"service-{self.name}",
                                        daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            self._thread.join(5)
            raise RuntimeError(f"TableCluster {self.name}: cannot listen on {self.url} to forward to its leader: "
                               f"{self._error}")
        return self

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # (the loop ended meanwhile)
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping, self._changed = asyncio.Event(), asyncio.Event()
        try:
            server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        except OSError as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        looking = asyncio.create_task(self._look_loop())
        try:
            await self._stopping.wait()
        finally:
            looking.cancel()
            server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(looking, *self._connections, return_exceptions=True)

    async def _look_loop(self) -> None:
        assert self._changed is not None
        async with httpx.AsyncClient(timeout=max(self.look_period * 2, 0.5)) as http:
            while True:
                answers = await asyncio.gather(*(self._ready(http, m) for m in self.members))
                ready = [m for m, ok in zip(self.members, answers, strict=True) if ok]
                leader = self.leader if self.leader in ready else (ready[0] if ready else None)
                if leader != self.leader:
                    self.leader = leader
                    self._changed.set()
                    self._changed = asyncio.Event()
                await asyncio.sleep(self.look_period)

    @staticmethod
    async def _ready(http: httpx.AsyncClient, member: str) -> bool:
        try:
            return (await http.get(f"{member}/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            upstream = await self._connect_leader()
            if upstream is None:
                return
            up_reader, up_writer = upstream
            try:
                pipes = [asyncio.create_task(_pipe(reader, up_writer)), asyncio.create_task(_pipe(up_reader, writer))]
                try:
                    # either side closing ends the connection (an engine that died: the client sees it close)
                    await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for pipe in pipes:
                        pipe.cancel()
                    await asyncio.gather(*pipes, return_exceptions=True)
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._connections.discard(task)

    async def _connect_leader(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the leader; waits while none leads (or the one seen refuses), None after
        :data:`WAIT_FOR_LEADER` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_FOR_LEADER
        while loop.time() < deadline:
            leader = self.leader
            if leader is not None:
                where = urlparse(leader)
                try:
                    return await asyncio.open_connection(where.hostname, where.port)
                except OSError:
                    pass  # it died since the last look: wait for the next one
            assert self._changed is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(self.look_period * 2, deadline - loop.time()))
        return None


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
