"""The network of a fault run: one network namespace per engine, joined by veth pairs on a bridge.

Why namespaces: a partition must cut exactly the traffic between two engines of *this* run and
nothing else on the machine. Each engine (and the tracker) runs in a namespace of its own with one
interface, ``eth0``, whose other end hangs on a bridge inside a hub namespace; the runner itself (the
workload clients, the Spark jobs) reaches the bridge through one more veth pair whose host end holds
``10.241.<slot>.1/24``. Every fault is then a rule or a qdisc *inside a namespace of the run*:

* a drop of the packets from A to B is an nftables rule in A's own ``output`` chain (or, when A is
  the runner, in B's ``input`` chain: the runner's namespace is the machine's, and it is never given
  a rule); a two-way partition is both directions, isolating a node is every pair it is in;
* loss is an nftables rule that drops a random share of the packets a node sends and receives;
  a slow link is a ``tbf`` qdisc (a rate) on its ``eth0``; delay is a ``tc netem`` qdisc where the
  kernel has ``sch_netem`` (the machine this was written on runs a kernel without it: ``tc qdisc ...
  netem`` answers "Specified qdisc kind is unknown", so :meth:`Network.netem` says so, and the
  scenarios use loss, whose retransmissions delay TCP by hundreds of milliseconds, and ``tbf``).

What is tricky:

* **Which addresses are ours.** A run takes a *slot* N (0-255): the subnet ``10.241.N.0/24``, the
  namespaces ``rtcN-*`` and the host interface ``rtcNh``. The slot is held with ``flock`` on
  ``/run/reptables-chaos/slot-N.lock`` for the life of the run (the kernel releases it when the
  runner dies, however it dies), so two runs on one machine never share one; a slot whose subnet
  overlaps a route of the machine is skipped.
* **Leftovers.** Namespaces outlive their creator. A slot whose lock is free but whose namespaces
  exist belongs to a run that died: its namespaces are deleted when the slot is taken again, if no
  process still runs in them (:func:`sweep_stale`); ``python -m reptables.testing.chaos cleanup
  --kill`` also stops such processes, by pid, for a human who asks.
* **TCP and one-way drops.** Dropping A->B also breaks B's calls to A (the answers are dropped):
  from A's side, its calls to B time out; B's calls to A reach A and hang for an answer. That is
  what a one-way link failure does to request/response traffic, and why Jepsen's one-way partitions
  look like this too.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HOST", "LOCK_DIR", "Network", "NetworkError", "Node", "missing_tools", "netns_unavailable", "sweep_stale"]

#: the pseudo-node of the runner itself (workload clients, Spark jobs): the machine's namespace
HOST = "host"
#: slot locks: tmpfs, emptied at boot (a slot can never stay locked by a process that is gone)
LOCK_DIR = Path("/run/reptables-chaos")
SUBNET = "10.241.{slot}.0/24"
PREFIX = "rtc"
SLOTS = 256
#: the first host number of the nodes (.1 is the runner, .2-.9 are left for helpers)
FIRST_NODE = 10
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
_STALE_NS = re.compile(rf"^{PREFIX}(\d+)-")


class NetworkError(RuntimeError):
    """A namespace, link, rule or qdisc could not be made or removed (the command's stderr inside)."""


def _run(argv: list[str], input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def netns_unavailable() -> str | None:
    """Why this machine cannot make network namespaces at all (None: it can): not root, no ``ip netns``."""
    if os.geteuid() != 0:
        return "fault runs need root (network namespaces, nftables, tc)"
    if shutil.which("ip") is None:
        return "ip is not installed (Debian package iproute2)"
    try:
        _run(["ip", "netns", "list"])
    except (NetworkError, OSError) as exc:
        return f"ip netns is unavailable: {exc}"
    return None


def missing_tools() -> str | None:
    """Why fault runs cannot work on this machine (None: they can): root, ``ip netns``, ``nft``, ``tc``."""
    if os.geteuid() != 0:
        return "fault runs need root (network namespaces, nftables, tc)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; hack/bootstrap.sh installs it)"
    try:
        _run(["ip", "netns", "list"])
    except (NetworkError, OSError) as exc:
        return f"ip netns is unavailable: {exc}"
    return None


@dataclass(frozen=True)
class Node:
    """A namespace of the run: ``name`` (the engine's cluster name, or ``op`` for the tracker)."""

    name: str
    netns: str
    address: str

    def exec_argv(self) -> list[str]:
        """The prefix that runs a command inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns]


@dataclass
class Network:
    """The namespaces, links, rules and qdiscs of one run; :meth:`close` removes every one of them."""

    slot: int
    _lock_fd: int
    nodes: dict[str, Node] = field(default_factory=dict)
    #: directed pairs (and the destination's port, None: every port) whose packets are dropped now
    blocked: set[tuple[str, str, int | None]] = field(default_factory=set)
    #: nodes whose link is lossy, slow or delayed now, and how
    shaped: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(cls) -> Network:
        """Take a free slot and build its hub (a bridge) and the runner's link to it."""
        problem = missing_tools()
        if problem is not None:
            raise NetworkError(problem)
        slot, fd = _take_slot()
        net = cls(slot, fd)
        try:
            _run(["ip", "netns", "add", net.hub])
            _run(["ip", "-n", net.hub, "link", "set", "lo", "up"])
            _run(["ip", "-n", net.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", net.hub, "link", "set", "br0", "up"])
            _run(["ip", "link", "add", net.host_link, "type", "veth", "peer", "name", f"{net.host_link}b",
                  "netns", net.hub])
            _run(["ip", "-n", net.hub, "link", "set", f"{net.host_link}b", "master", "br0", "up"])
            _run(["ip", "addr", "add", f"{net.host_address}/24", "dev", net.host_link])
            _run(["ip", "link", "set", net.host_link, "up"])
        except BaseException:
            net.close()
            raise
        return net

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.slot}"

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    @property
    def host_link(self) -> str:
        return f"{self.prefix}h"

    @property
    def host_address(self) -> str:
        return self._address(1)

    def _address(self, host: int) -> str:
        return str(ipaddress.ip_network(SUBNET.format(slot=self.slot)).network_address + host)

    def add(self, name: str) -> Node:
        """A namespace for ``name`` with ``eth0`` on the bridge, its address, and empty fault chains."""
        if not _NAME.match(name) or name == HOST or name in self.nodes:
            raise ValueError(f"invalid or repeated node name {name!r}")
        index = len(self.nodes)
        node = Node(name, f"{self.prefix}-{name}", self._address(FIRST_NODE + index))
        self.nodes[name] = node
        _run(["ip", "netns", "add", node.netns])
        link = f"{self.prefix}n{index}"
        _run(["ip", "-n", self.hub, "link", "add", link, "type", "veth", "peer", "name", "eth0",
              "netns", node.netns])
        _run(["ip", "-n", self.hub, "link", "set", link, "master", "br0", "up"])
        _run(["ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0"])
        _run(["ip", "-n", node.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", node.netns, "link", "set", "lo", "up"])
        self._nft(node, "table inet chaos {\n"
                        "  chain input { type filter hook input priority -10; policy accept; }\n"
                        "  chain output { type filter hook output priority -10; policy accept; }\n"
                        "  chain loss_in { type filter hook input priority -9; policy accept; }\n"
                        "  chain loss_out { type filter hook output priority -9; policy accept; }\n"
                        "}\n")
        return node

    def address(self, name: str) -> str:
        return self.host_address if name == HOST else self.nodes[name].address

    def pids(self) -> dict[str, list[int]]:
        """Processes running in each namespace of the run (every one of them was started by the run)."""
        out: dict[str, list[int]] = {}
        for ns in [self.hub, *(n.netns for n in self.nodes.values())]:
            text = _run(["ip", "netns", "pids", ns], check=False)
            out[ns] = [int(p) for p in text.split() if p.isdigit()]
        return out

    def close(self) -> list[str]:
        """Delete every namespace (and so every link and rule) of the run and free its slot; returns the
        problems met (each step is tried whatever failed before). Processes still running inside the
        run's namespaces were started by the run: they are SIGKILLed by pid first."""
        if self.closed:
            return []
        problems: list[str] = []
        for ns, pids in self.pids().items():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    problems.append(f"process {pid} was still running in {ns} (SIGKILLed)")
        for ns in [*(n.netns for n in self.nodes.values()), self.hub]:
            try:
                _run(["ip", "netns", "del", ns], check=ns in _run(["ip", "netns", "list"], check=False))
            except NetworkError as exc:
                problems.append(str(exc))
        if _link_exists(self.host_link):  # normally gone with its peer in the hub
            try:
                _run(["ip", "link", "del", self.host_link])
            except NetworkError as exc:
                problems.append(str(exc))
        self.blocked.clear()
        self.shaped.clear()
        os.close(self._lock_fd)
        self.closed = True
        return problems

    # -- partitions -----------------------------------------------------------------------------

    def drop(self, src: str, dst: str, port: int | None = None) -> None:
        """Drop every packet from ``src`` to ``dst`` (node names or ``HOST``; with ``port``, only those to
        that TCP port of ``dst``: one service of it) until :meth:`heal_partitions`."""
        if src == dst or (src, dst, port) in self.blocked:
            return
        match = f"ip daddr {self.address(dst)}" + (f" tcp dport {port}" if port is not None else "")
        if src != HOST:
            self._nft(self.nodes[src], f"add rule inet chaos output {match} drop\n")
        elif port is None:
            self._nft(self.nodes[dst], f"add rule inet chaos input ip saddr {self.host_address} drop\n")
        else:
            raise ValueError("a port-only cut from the runner's namespace is not supported (no rule goes there)")
        self.blocked.add((src, dst, port))

    def partition(self, side_a: list[str], side_b: list[str]) -> None:
        """No packet between any node of ``side_a`` and any of ``side_b``, either way."""
        for a in side_a:
            for b in side_b:
                self.drop(a, b)
                self.drop(b, a)

    def isolate(self, name: str, from_host: bool = True) -> None:
        """``name`` cut off from every other node (and from the runner's clients with ``from_host``)."""
        others = [n for n in self.nodes if n != name] + ([HOST] if from_host else [])
        self.partition([name], others)

    def heal_partitions(self) -> None:
        for node in self.nodes.values():
            self._nft(node, "flush chain inet chaos input\nflush chain inet chaos output\n")
        self.blocked.clear()

    # -- loss, rate and delay -------------------------------------------------------------------

    def lossy(self, name: str, percent: int) -> None:
        """Drop ``percent`` % of the packets ``name`` sends and of those it receives, at random."""
        if not 0 < percent < 100:
            raise ValueError(f"loss must be 1-99 %, not {percent}")
        node = self.nodes[name]
        self._nft(node, "flush chain inet chaos loss_in\nflush chain inet chaos loss_out\n"
                        f"add rule inet chaos loss_in numgen random mod 100 < {percent} drop\n"
                        f"add rule inet chaos loss_out numgen random mod 100 < {percent} drop\n")
        self.shaped[name] = f"loss {percent}%"

    def slow(self, name: str, kbit: int) -> None:
        """What ``name`` sends leaves at ``kbit`` kbit/s at most (a ``tbf`` qdisc on its ``eth0``)."""
        node = self.nodes[name]
        _run([*node.exec_argv(), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{kbit}kbit",
              "burst", "16kbit", "latency", "2s"])
        self.shaped[name] = f"rate {kbit}kbit"

    def netem(self, name: str, delay_ms: int, jitter_ms: int = 0) -> None:
        """Delay what ``name`` sends (a ``netem`` qdisc); :class:`NetworkError` where the kernel lacks netem."""
        node = self.nodes[name]
        args = ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        try:
            _run([*node.exec_argv(), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *args])
        except NetworkError as exc:
            raise NetworkError(f"netem is not available in this kernel (no sch_netem): {exc}") from None
        self.shaped[name] = " ".join(args)

    def heal_shaping(self) -> None:
        for name in list(self.shaped):
            node = self.nodes[name]
            self._nft(node, "flush chain inet chaos loss_in\nflush chain inet chaos loss_out\n")
            _run([*node.exec_argv(), "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            del self.shaped[name]

    def heal(self) -> None:
        """Every partition, loss rule and qdisc gone (the network as it was built)."""
        self.heal_partitions()
        self.heal_shaping()

    def _nft(self, node: Node, script: str) -> None:
        _run([*node.exec_argv(), "nft", "-f", "-"], input=script)


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the machine routes or holds addresses in (a slot must overlap none)."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _run(["ip", "-4", "route", "show", "table", "all"], check=False).splitlines():
        word = line.split()[0] if line.split() else ""
        if word in ("broadcast", "local", "unicast", "multicast"):
            word = line.split()[1]
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(word, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                nets.append(net)
    for line in _run(["ip", "-4", "-o", "addr"], check=False).splitlines():
        parts = line.split()
        if "inet" in parts:
            network = ipaddress.ip_interface(parts[parts.index("inet") + 1]).network
            if isinstance(network, ipaddress.IPv4Network):
                nets.append(network)
    return nets


def _take_slot() -> tuple[int, int]:
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in range(SLOTS):
        fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _clean_slot(slot, kill=False):
            os.close(fd)  # a dead run's processes still run there: leave the slot alone
            continue
        subnet = ipaddress.ip_network(SUBNET.format(slot=slot))
        if any(subnet.overlaps(net) for net in _host_networks()):
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return slot, fd
    raise NetworkError(f"no free fault-run slot: every subnet 10.241.0-255.0/24 is in use or locked ({LOCK_DIR})")


def _clean_slot(slot: int, kill: bool) -> bool:
    """Remove what a dead run left in ``slot`` (its lock must be held); False if processes still run
    there and ``kill`` is off (nothing is removed then)."""
    prefix = f"{PREFIX}{slot}-"
    names = [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).splitlines()
             if line.split() and line.split()[0].startswith(prefix)]
    pids = [int(p) for ns in names for p in _run(["ip", "netns", "pids", ns], check=False).split() if p.isdigit()]
    if pids and not kill:
        return False
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for ns in names:
        _run(["ip", "netns", "del", ns], check=False)
    if _link_exists(f"{PREFIX}{slot}h"):
        _run(["ip", "link", "del", f"{PREFIX}{slot}h"], check=False)
    return True


def sweep_stale(kill: bool = False) -> list[str]:
    """Remove the namespaces of every run that died without cleaning up (its slot lock is free);
    with ``kill``, processes still running in them are SIGKILLed by pid first. Returns what was
    removed or left (and why)."""
    report: list[str] = []
    slots = sorted({int(m.group(1)) for line in _run(["ip", "netns", "list"], check=False).splitlines()
                    if (m := _STALE_NS.match(line.split()[0] if line.split() else ""))})
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in slots:
        fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.append(f"slot {slot}: in use by a live run, left alone")
            os.close(fd)
            continue
        try:
            if _clean_slot(slot, kill):
                report.append(f"slot {slot}: namespaces of a dead run removed")
            else:
                report.append(f"slot {slot}: processes of a dead run still run there (use --kill)")
        finally:
            os.close(fd)
    return report
