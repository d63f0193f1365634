"""Heartbeats of idle tablets (meta-cluster side): a replica table's freshness moves on without traffic.

A replica cluster knows how fresh a replica table is from what its meta-cluster recorded there:
the least timestamp over the meta table's tablets (``sink.replica_freshness``), which a push moves
to its last commit and a heartbeat to a *barrier*: a fresh timestamp below which every commit is
applied, sent only for a tablet whose every queued row the replica has. Change streams of replica
tables and reads with ``include_event_token``/``compare_event_token`` read it; without heartbeats
an idle tablet would hold it back for good, and the last commit before a pause would stay out of
it (a pushed commit's own timestamp may be a commit only partly applied).

What a heartbeat costs is what matters with thousands of replicas, so:

* one **sweep** serves every replica whose heartbeat is due: one barrier (one timestamp, one wait
  for the commits before it), then one request per replica cluster carrying all their heartbeats
  (``{"heartbeats": [...]}`` to ``push``, recorded there a few hundred to a write transaction:
  ``ReplicaSink.handle_heartbeats``), at most ``HEARTBEATS_PER_REQUEST`` to a request;
* a replica is due at the next tick of a grid of ``replica_heartbeat_interval`` after a commit
  to its table or a push of its rows (a tablet that got a change within the interval is passed
  over, so the last commit of a burst enters its freshness one to two intervals later), and again
  after each heartbeat while its replica cluster says the table's freshness was read within
  ``replica_idle_heartbeat_interval`` (the answers' ``freshness_read_ago``: a stream or a read
  that cares is there); otherwise ``replica_idle_heartbeat_interval`` later. When it is due is
  the pool's business (``scheduler.py``); what a sweep sends, and how, is this module's.

The rules of the old per-replica barrier stand: a tablet that got a change within the interval
is passed over (its pushes move its record; a heartbeat follows once it is quiet), the barrier is
taken and waited for before a tablet's queue end is read, and a tablet goes in only while the
replica has every row up to that end, so a heartbeat never claims a row the replica lacks (a
replica table with no record yet would take that claim and then skip the rows as already
applied); the replica records it only while its record holds that row index. A heartbeat also
moves the replica's replication timestamp on this cluster (``Replica.advance_timestamp``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode, YtError
from ..peers import Peers
from ..replica_types import ReplicaState
from ..timestamps import COUNTER_BITS
from .host import ReplicationHost
from .registry import ReplicaRegistry
from .replicator import Replicator, layout, queue_end

log = logging.getLogger("reptables.engine.replication")

#: heartbeats one request carries at most (the replica cluster records them in write transactions
#: of ``sink.HEARTBEATS_PER_TRANSACTION``)
HEARTBEATS_PER_REQUEST = 256
#: how long a request of heartbeats may take: short, so that a slow replica cluster holds up a
#: worker of the pool (and the heartbeats of other replicas of that cluster) only briefly
HEARTBEAT_TIMEOUT = 5.0


@dataclass
class Sweep:
    """What one sweep found: the heartbeats to send, by replica cluster, and who had none to send."""

    barrier: int = 0
    #: cluster -> [(replicator, heartbeat body)]
    batches: dict[str, list[tuple[Replicator, dict[str, Any]]]] = field(default_factory=dict)
    #: replicas enabled (or enabling) with none to send now: rows waiting, or a change just sent, on
    #: every tablet
    waiting: list[Replicator] = field(default_factory=list)
    #: ids of the replicas with a tablet passed over for a change just sent (a heartbeat follows soon)
    recent: set[str] = field(default_factory=set)
    #: replicas that need no heartbeat any more (disabled, removed, without preserve_timestamps)
    inactive: list[Replicator] = field(default_factory=list)


def collect(replicators: Sequence[Replicator], host: ReplicationHost, registry: ReplicaRegistry,
            interval: float) -> Sweep:
    """Take one barrier for all of ``replicators`` and build the heartbeats of their idle tablets:
    those whose every queued row the replica has, and whose last change it got is older than
    ``interval`` (a busy tablet's pushes and sync commits move its record themselves)."""
    barrier = host.timestamps.generate()
    host.transactions.faults.delay_point("replicator_barrier")  # (fault tests: widen the race)
    host.transactions.wait_visible(barrier)  # no lock held while waiting
    # a change of a timestamp in the barrier's second (with a 1 s interval) was "just sent":
    # timestamps count whole seconds, and the pool's grid ticks just after each one
    recent = (barrier >> COUNTER_BITS) - interval
    sweep = Sweep(barrier)
    for replicator in replicators:
        replica = replicator.replica
        table = replicator.table()
        if table is None or not replica.preserve_timestamps or registry.find(replica.id) is not replica or \
                replica.state not in (ReplicaState.ENABLED, ReplicaState.ENABLING):
            # (a replica without preserve_timestamps writes with its cluster's own timestamps: no freshness)
            sweep.inactive.append(replicator)
            continue
        items = []
        for tablet in range(table.tablet_count):
            end = queue_end(table, tablet)  # read after the barrier is visible: every commit before it counted
            progress = replica.progress_of(tablet)
            if progress.row_index < end:
                continue  # rows waiting: the replica lacks a change before the barrier; pushes come
            if progress.timestamp >> COUNTER_BITS > recent:
                sweep.recent.add(replica.id)  # a change just went out: a heartbeat follows the traffic
                continue
            replica.advance_timestamp(tablet, barrier, end)
            revision, tablet_count = layout(table)
            items.append((replicator, {
                "upstream_replica_id": replica.id, "replica_path": replica.replica_path, "tablet_index": tablet,
                "prev_row_index": end, "row_index": end, "preserve_timestamps": True, "entries": [],
                "barrier_timestamp": barrier, "tablet_count": tablet_count, "layout_revision": revision,
                "table_id": table.table_id}))
        if items:
            sweep.batches.setdefault(replica.cluster_name, []).extend(items)
        else:
            sweep.waiting.append(replicator)
    return sweep


def send(peers: Peers, cluster: str, items: Sequence[tuple[Replicator, dict[str, Any]]]) -> list[Any] | None:
    """Send one request of heartbeats; the answer of each (None: the request failed).

    A replica cluster that refuses the batch as malformed (an engine from before batches, which takes
    one heartbeat per push) gets them one by one; its answers say nothing of its reads, and are
    taken as if the freshness were read (heartbeats go on at the short interval, as before)."""
    body = json.dumps({"heartbeats": [b for _, b in items]}).encode()
    try:
        client = peers.client(cluster)
    except YtError as exc:  # (a cluster that left the directory, or lost its credential)
        log.debug("replica heartbeats failed", extra={"cluster": cluster, "error": exc.message})
        return None
    try:
        # network: no lock held
        answer = client.call("push", raw_body=body, timeout=HEARTBEAT_TIMEOUT)
    except YtError as exc:
        if exc.code != ErrorCode.PROTOCOL_ERROR:
            log.debug("replica heartbeats failed", extra={"cluster": cluster, "error": exc.message})
            return None
        answers: list[Any] = []
        for _, item in items:
            try:
                one = client.call("push", raw_body=json.dumps(item).encode(), timeout=HEARTBEAT_TIMEOUT)
                answers.append({**one, "freshness_read_ago": 0.0})
            except YtError as single:
                answers.append({"error": {"code": single.code, "message": single.message}})
        return answers
    got = answer.get("heartbeats") if isinstance(answer, dict) else None
    if not isinstance(got, list) or len(got) != len(items):
        log.warning("malformed answer to replica heartbeats", extra={"cluster": cluster})
        return None
    return got


def freshness_wanted(answer: Any, within: float) -> bool:
    """Whether a heartbeat's answer says the replica table's freshness was read within ``within`` seconds."""
    if not isinstance(answer, dict):
        return False
    ago = answer.get("freshness_read_ago")
    return isinstance(ago, (int, float)) and not isinstance(ago, bool) and ago < within
