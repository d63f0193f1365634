"""Prometheus metrics of one engine process.

Each engine has its own ``EngineMetrics`` (built by the composition root, handed to the layers that
count) with its own registry, not the process-global one: several engines can live in one test
process without sharing counters, and ``/metrics`` shows exactly this engine's figures.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


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

