"""An HA table cluster under ``reptables up``: a leader and standby engines, and the address in front.

A TableCluster with ``spec.members`` (and a PostgreSQL database in ``spec.local``) is run as one
engine per member, each on its member's loopback port with ``--standby`` and ``--advertise-url`` its
member's address, all over the one database (docs/ha.md): one leads, the others stand by. In front of
them, on the endpoint's port, a :class:`~.service.LocalService` forwards to the leader, as a
Kubernetes Service over the engines' pods does.

``up`` is also their supervisor, as Kubernetes' restart policy is on the chart's pods: an engine that
exits by itself - replaced by another and stepped down (status 75), killed - is started again, as a
standby, by the runner's first pass :data:`RESTART_DELAY` seconds later (:meth:`LocalGroup.supervise`).
Only ``reptables cluster stop`` keeps them down. ``reptables cluster kill`` SIGKILLs the leader: a
standby takes over after the rest of its lease, and the killed one comes back as a standby.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from reptables.engine.process import LocalEngine

from .service import LocalService

#: seconds ``up`` waits before it starts an engine that exited again (the kubelet waits 10 s and more
#: between restarts): a standby that was standing by takes over first, as on Kubernetes
RESTART_DELAY = 3.0


@dataclass
class LocalGroup:
    """The engines of one HA TableCluster and the service in front of them."""

    name: str
    members: list[LocalEngine]
    service: LocalService
    #: stopped by ``reptables cluster stop``: not started again until ``cluster start``
    stopped: bool = False
    #: when ``supervise`` first found a member exited (monotonic seconds), by its URL
    exited: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.service.url

    def start(self, timeout: float = 60.0) -> None:
        """Start every member side by side, the service in front, and wait until one leads."""
        for engine in self.members:
            if not engine.alive():
                engine.spawn()
        try:
            for engine in self.members:
                engine.wait_up(timeout)
            if not self.service.running:
                self.service.start()
            deadline = time.monotonic() + timeout
            while self.service.leader is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"TableCluster {self.name}: no member of {', '.join(self.member_urls)} took the "
                                       f"lead in {timeout:.0f} s; see {self.members[0].log_path}")
                time.sleep(0.1)
        except Exception:
            self.stop()
            raise
        self.stopped = False

    @property
    def member_urls(self) -> list[str]:
        return [e.url for e in self.members]

    def leader(self) -> LocalEngine | None:
        """The member that serves now (its /readyz answers 200), asked directly."""
        for engine in self.members:
            if engine.alive() and _ready(engine.url):
                return engine
        return None

    def supervise(self) -> list[str]:
        """Start again, as standbys, the members that exited by themselves :data:`RESTART_DELAY` seconds
        ago or more; a line for each."""
        if self.stopped:
            return []
        lines = []
        now = time.monotonic()
        for engine in self.members:
            if engine.proc is not None and (status := engine.proc.poll()) is not None:
                seen = self.exited.setdefault(engine.url, now)
                if now - seen < RESTART_DELAY:
                    continue
                del self.exited[engine.url]
                engine.spawn()
                how = "was killed" if status < 0 else f"exited with status {status}" + (
                    " (another engine took over)" if status == 75 else "")
                lines.append(f"engine {self.name} at {engine.url} {how}; started again (pid {engine.pid}), "
                             "as a standby")
        return lines

    def kill_leader(self) -> tuple[bool, str]:
        """SIGKILL the member that leads (a crash): a standby takes over, ``supervise`` restarts it."""
        engine = self.leader()
        if engine is None:
            return False, f"no engine of {self.name} leads right now ({', '.join(self.member_urls)})"
        pid = engine.pid
        engine.kill()
        return True, (f"engine {self.name} at {engine.url} (pid {pid}), the leader, killed (SIGKILL); a standby takes "
                      "over when its lease runs out, and up starts the killed one again as a standby")

    def control(self, action: str) -> tuple[bool, str]:
        """``reptables cluster stop|start|kill NAME`` of the group: (done, the line to print)."""
        if action == "kill":
            return self.kill_leader()
        if action == "stop":
            if not self.alive():
                return True, f"the engines of {self.name} are already stopped"
            self.stop_members()
            return True, f"the {len(self.members)} engines of {self.name} stopped"
        if action == "start":
            if self.alive() and not self.stopped:
                return True, f"the engines of {self.name} are already running"
            try:
                self.start(timeout=25.0)  # (within the 30 s `reptables cluster start` waits for its answer)
            except RuntimeError as exc:
                return False, f"the engines of {self.name} did not start: {str(exc).splitlines()[0]}"
            return True, f"the engines of {self.name} started again; {self.service.leader} leads"
        return False, f"unknown action {action!r} (stop, start or kill)"

    def alive(self) -> bool:
        return any(e.alive() for e in self.members)

    def stop(self) -> None:
        """Stop every member (SIGTERM: the leader ends its lease as it goes) and the service."""
        for engine in self.members:
            engine.stop()
        self.service.stop()

    def stop_members(self) -> None:
        """``cluster stop``: every member down, and kept down; the service stays (it holds connections)."""
        self.stopped = True
        for engine in self.members:
            engine.stop()

    def state(self) -> dict[str, Any]:
        """What ``state.json`` says of the group (``reptables status`` shows it)."""
        leader = self.service.leader
        members = [{"url": e.url, "pid": e.proc.pid if e.proc is not None else None, "running": e.alive(),
                    "leads": e.url == leader} for e in self.members]
        return {"endpoint": self.url, "pid": None, "running": self.alive(), "leader": leader, "members": members}


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
