"""Prometheus metrics of one engine process.

Each engine has its own ``EngineMetrics`` (built by the composition root, handed to the layers that
count) with its own registry, not the process-global one: several engines can live in one test
process without sharing counters, and ``/metrics`` shows exactly this engine's figures.

Two kinds of figures, kept apart on purpose:

* **events** (requests, commits, pushes, push errors, 2PC latencies) are counters and histograms
  incremented where they happen, once per request or batch, never per row;
* **state** (replication lag, rows behind, queue depth, trimmed rows, sync replicas, in-doubt
  transactions) is read at scrape time by :class:`StateCollector` from the sources a higher layer
  registers (``register_state``): nothing is bookkept on the write path, a scrape always shows the
  state as the engine itself reports it (``@replicas``, a replica's ``tablets``), and a replica or
  table that is gone simply stops being reported.

This module sits at the bottom of the engine's layers: it knows the shapes of the samples
(:class:`ReplicaTabletSample`, :class:`QueueTabletSample`, :class:`TableSample`) but not where they
come from (``replication/status.py`` makes them). docs/metrics.md lists every metric.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("reptables.engine.metrics")

#: latency buckets of the commit path (seconds): a local commit takes ~1 ms, a sync replica's 2PC a few
_COMMIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class ReplicaTabletSample:
    """One replica's position in one tablet of its replicated table's queue, at scrape time."""

    table: str
    replica_id: str
    cluster: str
    tablet: int
    #: seconds the replica is behind (``replication_lag_time``; 0 for an in-sync sync replica)
    lag_seconds: float
    #: ``flushed_row_count - current_replication_row_index``
    rows_behind: int


@dataclass(frozen=True)
class QueueTabletSample:
    """One tablet of a replicated table's replication queue."""

    table: str
    tablet: int
    #: rows still held in the queue (``flushed_row_count - trimmed_row_count``)
    rows_held: int
    #: ``trimmed_row_count``: rows dropped because every replica has them
    trimmed_rows: int
    #: ``flushed_row_count``: rows ever appended
    flushed_rows: int


@dataclass(frozen=True)
class ReplicaInfoSample:
    """A replica object and its current state and mode."""

    table: str
    replica_id: str
    cluster: str
    mode: str
    state: str


@dataclass(frozen=True)
class TableSample:
    """A replicated table of this meta-cluster."""

    table: str
    #: sync replicas that take part in every commit now (enabled, mode sync, in sync)
    sync_replicas: int


@dataclass(frozen=True)
class ConsumerSample:
    """A registered change-stream consumer (YT's queue consumer) of a table."""

    table: str
    consumer: str
    vital: bool
    #: seconds between the newest commit and the consumer's offset (how far behind it reads)
    lag_seconds: float


@dataclass
class StateSamples:
    """Everything a state source reports at one scrape."""

    replica_tablets: list[ReplicaTabletSample] = field(default_factory=list)
    queue_tablets: list[QueueTabletSample] = field(default_factory=list)
    replicas: list[ReplicaInfoSample] = field(default_factory=list)
    tables: list[TableSample] = field(default_factory=list)
    consumers: list[ConsumerSample] = field(default_factory=list)
    #: transactions prepared here by another cluster's coordinator, undecided for over a second
    #: (None: this source does not know)
    in_doubt: int | None = None


StateSource = Callable[[], StateSamples]

_REPLICA_LABELS = ["table", "replica_id", "cluster"]


class StateCollector(Collector):
    """Reads the registered sources at scrape time (see the module docstring).

    A source must not hold an engine lock across anything slow; it runs on the scraping thread
    (a worker thread, never the event loop: ``api``). A failing source is logged and skipped, so
    one broken table never takes the whole ``/metrics`` down."""

    def __init__(self) -> None:
        self.sources: list[StateSource] = []

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("reptables_replication_lag_seconds",
                                "How far a replica is behind in one tablet (replication_lag_time; 0 when in sync)",
                                labels=[*_REPLICA_LABELS, "tablet"])
        yield GaugeMetricFamily("reptables_replication_rows_behind",
                                "Queue rows a replica does not have yet in one tablet "
                                "(flushed_row_count - current_replication_row_index)",
                                labels=[*_REPLICA_LABELS, "tablet"])
        yield GaugeMetricFamily("reptables_replication_queue_rows",
                                "Rows held in a replicated table tablet's replication queue "
                                "(flushed_row_count - trimmed_row_count)", labels=["table", "tablet"])
        yield GaugeMetricFamily("reptables_replication_queue_trimmed_rows",
                                "Rows trimmed from a replicated table tablet's replication queue (trimmed_row_count)",
                                labels=["table", "tablet"])
        yield GaugeMetricFamily("reptables_replication_queue_flushed_rows",
                                "Rows ever appended to a replicated table tablet's replication queue "
                                "(flushed_row_count)", labels=["table", "tablet"])
        yield GaugeMetricFamily("reptables_replica_info",
                                "1 for each replica object of a replicated table, with its current mode and state",
                                labels=[*_REPLICA_LABELS, "mode", "state"])
        yield GaugeMetricFamily("reptables_sync_replicas",
                                "Sync replicas of a replicated table that take part in every commit now",
                                labels=["table"])
        yield GaugeMetricFamily("reptables_stream_consumer_lag_seconds",
                                "How far a registered change-stream consumer's offset is behind the newest "
                                "commit (docs/streams.md)", labels=["table", "consumer", "vital"])
        yield GaugeMetricFamily("reptables_in_doubt_pending_transactions",
                                "Transactions prepared here by another cluster's coordinator, undecided for over "
                                "a second (in doubt)")

    def collect(self) -> Iterable[Metric]:
        lag, behind, queue, trimmed, flushed, info, sync, consumers, in_doubt = self._families()
        pending = 0
        for source in list(self.sources):
            try:
                samples = source()
            except Exception:  # noqa: BLE001 - a broken source must not take /metrics down
                log.exception("metrics source failed")
                continue
            for r in samples.replica_tablets:
                labels = [r.table, r.replica_id, r.cluster, str(r.tablet)]
                lag.add_metric(labels, r.lag_seconds)
                behind.add_metric(labels, r.rows_behind)
            for q in samples.queue_tablets:
                labels = [q.table, str(q.tablet)]
                queue.add_metric(labels, q.rows_held)
                trimmed.add_metric(labels, q.trimmed_rows)
                flushed.add_metric(labels, q.flushed_rows)
            for i in samples.replicas:
                info.add_metric([i.table, i.replica_id, i.cluster, i.mode, i.state], 1)
            for t in samples.tables:
                sync.add_metric([t.table], t.sync_replicas)
            for c in samples.consumers:
                consumers.add_metric([c.table, c.consumer, str(c.vital).lower()], c.lag_seconds)
            pending += samples.in_doubt or 0
        in_doubt.add_metric([], pending)
        return [lag, behind, queue, trimmed, flushed, info, sync, consumers, in_doubt]


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("reptables_requests", "HTTP API requests", ["command", "outcome"],
                                registry=self.registry)
        self.latency = Histogram("reptables_request_seconds", "HTTP API request latency", ["command"],
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                          2.5, 5, 10),
                                 registry=self.registry)
        self.commits = Counter("reptables_commits", "Committed tablet transactions", ["kind"],
                               registry=self.registry)
        self.rows_written = Counter("reptables_rows_written", "Rows written by commits", registry=self.registry)
        self.conflicts = Counter("reptables_conflicts", "Transactions aborted by a row lock conflict",
                                 registry=self.registry)
        #: in-doubt resolution on a replica: outcome committed / aborted (the coordinator's word),
        #: aborted_unknown_coordinator (it left //sys/clusters), stalled (undecided past in_doubt_timeout)
        self.in_doubt = Counter("reptables_in_doubt_transactions",
                                "Transactions prepared here by another cluster, resolved or reported stalled "
                                "by in-doubt resolution", ["outcome"], registry=self.registry)
        #: two-phase commits coordinated here; participants: "sync_replicas" when sync replicas on other
        #: clusters took part, else "local" (several tablets of this cluster)
        self.prepare_seconds = Histogram("reptables_two_phase_prepare_seconds",
                                         "Prepare phase of two-phase commits coordinated here (remote sync "
                                         "replica prepares and local conflict checks)", ["participants"],
                                         buckets=_COMMIT_BUCKETS, registry=self.registry)
        self.two_phase_seconds = Histogram("reptables_two_phase_commit_seconds",
                                           "Two-phase commits coordinated here, from the first prepare to the "
                                           "durable commit decision", ["participants"],
                                           buckets=_COMMIT_BUCKETS, registry=self.registry)
        # async replication: one increment per pushed batch, never per row
        self.pushes = Counter("reptables_replication_pushes", "Batches a replicator pushed and a replica accepted",
                              _REPLICA_LABELS, registry=self.registry)
        self.push_errors = Counter("reptables_replication_push_errors",
                                   "Pushes that failed (the replica unreachable, refusing the batch, or behind)",
                                   _REPLICA_LABELS, registry=self.registry)
        self.rows_pushed = Counter("reptables_replication_pushed_rows",
                                   "Queue rows replicators delivered to async replicas", _REPLICA_LABELS,
                                   registry=self.registry)
        self.state = StateCollector()
        self.registry.register(self.state)
        #: remembered children of labelled metrics (``child``)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: prometheus_client resolves the labels again on
        every call (a lock and a key), a visible share of a single-row commit's CPU. Only for labels
        from a fixed set (a commit's kind, a command's name): a remembered child lives as long as
        the engine, so labels that come and go (a replica's) are not for this."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def register_state(self, source: StateSource) -> None:
        """Add a source of state figures read at every scrape (see :class:`StateCollector`)."""
        self.state.sources.append(source)
