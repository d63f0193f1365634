"""The nemesis: faults as composable steps, each started, held and healed, each recorded in the history.

Why steps with a heal: a fault run must end with every fault undone (partitions healed, clocks true,
processes running) before the final reads, and also when the run fails half way; a fault that
knows how to undo itself makes "heal everything" one loop. A :class:`Fault` has a ``category`` (the
network, one engine's clock, one process): at most one fault per category is active at a time, so
two faults never undo each other's state, while faults of different categories compose (a
partition while the meta-cluster's clock jumps).

The faults:

* :class:`Partition` - isolate a node (optionally from the clients too), split the nodes in two, or
  drop one direction (``one_way``); :mod:`.net` says what one-way means for TCP;
* :class:`Lossy` and :class:`Slow` - random packet loss, a rate limit (netem's delay where the
  kernel has it: :class:`Delay`);
* :class:`ClockOffset` - an engine's wall clock set to an offset (a skew, or a jump when it changes
  while the engine runs); healing sets it back to true time, which is itself a jump;
* :class:`Kill` - SIGKILL of a process, started again on heal (without waiting for it: a node that
  is also partitioned from the runner could not say it is ready);
* :class:`Pause` - SIGSTOP, SIGCONT on heal.

:class:`Nemesis` runs a schedule of random faults from a seeded generator in a thread, and lets
scenarios inject a fault *now* (:meth:`Nemesis.inject`) at a risky moment they know of.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .clock import ClockFile
from .history import History
from .net import Network

__all__ = ["ClockOffset", "Delay", "Fault", "FaultGenerator", "Kill", "Lossy", "Nemesis", "Partition", "Pause",
           "Slow", "scripted"]


class Fault:
    """One fault: :meth:`start` it, :meth:`heal` it; :meth:`describe` is what the history records."""

    category = "fault"

    def start(self) -> None:
        raise NotImplementedError

    def heal(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class Partition(Fault):
    """``kind``: ``isolate`` (``nodes[0]`` from all; ``from_host``: also from the clients), ``split``
    (``nodes`` from ``others``), ``one_way`` (packets from ``nodes[0]`` to ``nodes[1]`` dropped) or
    ``port`` (packets from ``nodes[0]`` to port ``port`` of ``nodes[1]``: an engine cut from its
    database on the runner's host alone)."""

    net: Network
    kind: str
    nodes: list[str]
    others: list[str] = field(default_factory=list)
    from_host: bool = False
    #: what the cut nodes are at the time (the sync replica...), for the history
    note: str = ""
    port: int | None = None
    category = "network"

    def start(self) -> None:
        if self.kind == "isolate":
            self.net.isolate(self.nodes[0], from_host=self.from_host)
        elif self.kind == "split":
            self.net.partition(self.nodes, self.others)
        elif self.kind == "one_way":
            self.net.drop(self.nodes[0], self.nodes[1])
        elif self.kind == "port":
            self.net.drop(self.nodes[0], self.nodes[1], self.port)
        else:
            raise ValueError(f"unknown partition kind {self.kind!r}")

    def heal(self) -> None:
        self.net.heal_partitions()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": "partition", "kind": self.kind, "nodes": self.nodes}
        if self.others:
            out["others"] = self.others
        if self.from_host:
            out["from_clients"] = True
        if self.note:
            out["note"] = self.note
        if self.port is not None:
            out["port"] = self.port
        return out


@dataclass
class Lossy(Fault):
    net: Network
    node: str
    percent: int
    category = "link"

    def start(self) -> None:
        self.net.lossy(self.node, self.percent)

    def heal(self) -> None:
        self.net.heal_shaping()

    def describe(self) -> dict[str, Any]:
        return {"fault": "loss", "node": self.node, "percent": self.percent}


@dataclass
class Slow(Fault):
    net: Network
    node: str
    kbit: int
    category = "link"

    def start(self) -> None:
        self.net.slow(self.node, self.kbit)

    def heal(self) -> None:
        self.net.heal_shaping()

    def describe(self) -> dict[str, Any]:
        return {"fault": "slow", "node": self.node, "kbit": self.kbit}


@dataclass
class Delay(Fault):
    net: Network
    node: str
    delay_ms: int
    jitter_ms: int = 0
    category = "link"

    def start(self) -> None:
        self.net.netem(self.node, self.delay_ms, self.jitter_ms)

    def heal(self) -> None:
        self.net.heal_shaping()

    def describe(self) -> dict[str, Any]:
        return {"fault": "delay", "node": self.node, "ms": self.delay_ms, "jitter_ms": self.jitter_ms}


@dataclass
class ClockOffset(Fault):
    """Engine ``node``'s clock at ``offset`` seconds from true time; back to ``base`` on heal."""

    node: str
    clock: ClockFile
    offset: float
    base: float = 0.0

    @property
    def category(self) -> str:  # type: ignore[override]
        return f"clock:{self.node}"

    def start(self) -> None:
        self.clock.set(self.offset)

    def heal(self) -> None:
        self.clock.set(self.base)

    def describe(self) -> dict[str, Any]:
        return {"fault": "clock", "node": self.node, "offset_s": self.offset, "heal_to_s": self.base}


class Stoppable(Protocol):
    def kill(self) -> None: ...

    def alive(self) -> bool: ...


@dataclass
class Kill(Fault):
    """SIGKILL ``target`` (an engine or a :class:`~.cluster.ChaosProcess`); ``restart`` on heal."""

    name: str
    target: Stoppable
    restart: Callable[[], None]

    @property
    def category(self) -> str:  # type: ignore[override]
        return f"process:{self.name}"

    def start(self) -> None:
        self.target.kill()

    def heal(self) -> None:
        if not self.target.alive():
            self.restart()

    def describe(self) -> dict[str, Any]:
        return {"fault": "kill", "node": self.name}


class Pausable(Protocol):
    def pause(self) -> None: ...

    def resume(self) -> None: ...


@dataclass
class Pause(Fault):
    name: str
    target: Pausable

    @property
    def category(self) -> str:  # type: ignore[override]
        return f"process:{self.name}"

    def start(self) -> None:
        self.target.pause()

    def heal(self) -> None:
        self.target.resume()

    def describe(self) -> dict[str, Any]:
        return {"fault": "pause", "node": self.name}


#: a scenario's fault generator: given the random source, the next fault and how long to hold it
#: (None: no more faults)
FaultGenerator = Callable[[random.Random], "tuple[Fault, float] | None"]


def scripted(steps: list[tuple[Callable[[], Fault], float]]) -> FaultGenerator:
    """The faults ``steps`` make, in this order, each held its time; then none (the short mode's
    fixed schedules: each test knows which fault it asserts about)."""
    pending = list(steps)

    def generate(rng: random.Random) -> tuple[Fault, float] | None:
        if not pending:
            return None
        make, hold = pending.pop(0)
        return make(), hold

    return generate


class Nemesis:
    """Runs ``generator``'s faults one after another (each held its time, then a quiet gap) until
    stopped; :meth:`inject` adds a fault now. Every start and heal is an ``info`` entry of the history."""

    def __init__(self, history: History, generator: FaultGenerator | None, seed: int,
                 gap: tuple[float, float] = (2.0, 6.0)) -> None:
        self.history = history
        self.generator = generator
        self.rng = random.Random(seed)
        self.gap = gap
        self.active: dict[str, Fault] = {}
        self.started = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.errors: list[str] = []

    def start(self) -> Nemesis:
        if self.generator is not None:
            self._thread.start()
        return self

    def _run(self) -> None:
        assert self.generator is not None
        while not self._stop.wait(self.rng.uniform(*self.gap)):
            step = self.generator(self.rng)
            if step is None:
                return
            fault, hold = step
            if not self.begin(fault):
                continue
            self._stop.wait(hold)
            self.end(fault)

    def begin(self, fault: Fault) -> bool:
        """Start ``fault`` unless one of its category is active; whether it started."""
        with self._lock:
            if fault.category in self.active or self._stop.is_set():
                return False
            self.active[fault.category] = fault
        self.history.info("nemesis", "start", fault.describe())
        try:
            fault.start()
        except Exception as exc:  # noqa: BLE001 - a fault that cannot start is recorded, the run goes on
            self.errors.append(f"{fault.describe()}: {exc}")
            self.history.info("nemesis", "start-failed", {**fault.describe(), "error": str(exc)[:300]})
            with self._lock:
                self.active.pop(fault.category, None)
            with contextlib.suppress(Exception):
                fault.heal()
            return False
        with self._lock:
            self.started += 1
        return True

    def end(self, fault: Fault) -> None:
        with self._lock:
            if self.active.get(fault.category) is not fault:
                return
            del self.active[fault.category]
        try:
            fault.heal()
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"heal {fault.describe()}: {exc}")
        self.history.info("nemesis", "heal", fault.describe())

    def inject(self, fault: Fault, hold: float) -> bool:
        """Start ``fault`` now and heal it after ``hold`` seconds (in a thread); whether it started."""
        if not self.begin(fault):
            return False

        def later() -> None:
            self._stop.wait(hold)
            self.end(fault)

        threading.Thread(target=later, name="nemesis-inject", daemon=True).start()
        return True

    def stop(self) -> None:
        """No new fault; every active one healed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)
        with self._lock:
            faults = list(self.active.values())
        for fault in faults:
            self.end(fault)
