"""One ``EngineConfig``: every tunable of an engine, built once and handed down.

The composition root (``reptables.engine.node``) receives an ``EngineConfig`` and gives each layer
the object (or the fields) it needs. Nothing in the engine reads the environment at import time:
``EngineConfig.from_env`` is called by the command line (``reptables engine serve``) only, so tests
and benchmarks can run several engines with different settings in one process.

The defaults are the figures of the seeds (YTsaurus' replicator batch cuts, transaction limits) and
of this engine's own measurements (queue tail, conflict memory); ``docs/engine.md`` lists the
user-visible ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .faults import parse_delays

MiB = 1024 * 1024


@dataclass(frozen=True)
class EngineConfig:
    # -- transactions (seed 003) ---------------------------------------------------------------------
    #: a tablet transaction lives at most this long (seconds)
    max_transaction_lifetime: float = 60.0
    #: rows one transaction may write
    max_rows_per_transaction: int = 100_000
    #: how long a sync replica's prepare waits for row locks of an earlier remote transaction
    remote_lock_wait: float = 1.0
    #: a non-atomic commit's client timestamp may be off the server clock by this much (seconds)
    client_timestamp_threshold: float = 60.0

    # -- tablets ---------------------------------------------------------------------------------------
    #: newest replication queue rows per tablet kept in memory for the replicators
    queue_tail_rows: int = 200_000
    #: commits a table remembers for conflict checks: at most this many keys in all...
    recent_commit_keys: int = 20_000
    #: ...and, within that, every commit of the last seconds (a sync replica's prepare carries a
    #: start timestamp of its meta-cluster)
    recent_commit_grace_seconds: float = 2.0

    # -- replication (seed 002) -----------------------------------------------------------------------
    #: worker threads that run the replicators' passes and heartbeats (docs/replication.md,
    #: "How replicators are scheduled"): the engine's replication threads, however many replicas
    #: (``--replicator-threads``)
    replicator_threads: int = 4
    #: how often a sync replica catching up or draining looks at its queue again, and the unit of
    #: the wait for a replica behind the sync commits in flight to it (seconds)
    replicator_tick: float = 0.1
    #: an idle tablet's heartbeat (its replica table's freshness moves on) goes out this long after a
    #: commit or a push, then at this interval while the replica cluster reads the table's freshness
    #: (change streams, event tokens) or traffic goes on (seconds)...
    replica_heartbeat_interval: float = 1.0
    #: ...and otherwise at this one: what a replica whose freshness nobody reads costs (seconds)
    replica_idle_heartbeat_interval: float = 30.0
    #: a replicator batch is cut at this many rows, bytes or distinct commit timestamps
    batch_rows: int = 90_000
    batch_bytes: int = 128 * MiB
    batch_timestamps: int = 10_000
    #: backoff after a failed push, or after an unexpected replicator failure (seconds)
    soft_backoff: float = 3.0
    #: a replica switching to sync stops catching up and starts draining at this many pending rows
    drain_threshold_rows: int = 1_000
    #: extra answer time a sync replica gets per row of a prepare (a 10,000-row batch: +2 s)
    prepare_seconds_per_row: float = 0.0002
    #: threads for calls to sync replicas (prepare fan-out, commit delivery, aborts)
    replication_rpc_workers: int = 16
    #: how long a push of one batch may take (seconds)
    push_timeout: float = 60.0

    # -- peers -----------------------------------------------------------------------------------------
    #: a sync replica that does not answer a prepare within this many seconds fails the commit
    sync_timeout: float = 1.0

    # -- peer input --------------------------------------------------------------------------------------
    #: a timestamp received from another cluster (a pushed change, a prepare, a commit decision) may
    #: be at most this far ahead of this cluster's clock (seconds); as YT's client timestamp
    #: threshold. Any distance behind is accepted (a replica catching up gets old changes)
    max_peer_clock_skew: float = 60.0
    #: changes one replicator batch may carry (at least the meta-cluster's batch_rows)
    max_peer_batch_rows: int = 100_000
    #: bytes of row data one replicator batch may carry (at least the meta-cluster's batch_bytes)
    max_peer_batch_bytes: int = 512 * MiB
    #: a transaction prepared here by another cluster and still undecided after this many seconds
    #: is reported, and reads that would wait for it fail at once (retriable, 1713) instead of
    #: waiting; it is aborted if its coordinator has left //sys/clusters for this long
    in_doubt_timeout: float = 60.0

    # -- replicas ----------------------------------------------------------------------------------------
    #: a replica never enabled holds the replication queue back (it pins the history its bootstrap
    #: copy will not carry) for at most this many seconds after its creation; past it, an abandoned
    #: bootstrap no longer stops trimming, and the replica is marked as missing that history
    bootstrap_pin_ttl: float = 24 * 3600.0

    # -- node ------------------------------------------------------------------------------------------
    #: period of the background jobs: transaction expiry, replication maintenance
    background_period: float = 1.0
    #: how often old row versions are compacted (seconds)
    compaction_period: float = 30.0
    #: the engine process' GIL switch interval (seconds, ``sys.setswitchinterval``; Python's default
    #: is 0.005). A thread waiting for the GIL - a peer's XDCR batch, a replicator push, a client's
    #: commit behind the SQL writer - gets it sooner. xdcr_bench at 3,300 rows/s per side: median of
    #: the runs' lag p50 72 ms (6 runs) against 83 ms at 5 ms (5 runs); the p99 (198 against 202 ms)
    #: and the flat-out throughput did not change beyond the runs' spread
    gil_switch_interval: float = 0.001

    # -- API -------------------------------------------------------------------------------------------
    #: largest request body accepted, counted after decompression (Content-Encoding) and for
    #: chunked bodies as they arrive: past it the request is refused with 413
    max_body_bytes: int = 512 * MiB
    #: bodies up to this size of commands that cannot wait run on the event loop
    inline_body_bytes: int = 64 * 1024

    # -- limits ----------------------------------------------------------------------------------------
    #: keys one lookup_rows (or get_in_sync_replicas) request may carry, counted while the body is
    #: parsed (rows of a write are bounded the same way by max_rows_per_transaction)
    max_lookup_keys: int = 1_000_000
    #: change streams (docs/streams.md): pulls that may wait for changes at once (each holds a
    #: worker thread while it waits; more are answered at once), and the changes one answer carries
    max_waiting_pulls: int = 16
    max_pull_rows: int = 100_000
    #: changes of a streamed table kept in memory for its pulls (``changes.ChangeTail``): a consumer
    #: within this many changes of the newest reads no SQL. About 0.3-0.6 KB each (the rows as maps),
    #: for a table a pull read in the last minute only: a few seconds of flat-out writes
    change_tail_rows: int = 65_536
    #: seconds a pull woken by a commit waits before it reads, so that the commits of a busy table
    #: travel in fewer, larger answers (each answer costs the writers' CPU); well inside the
    #: delivery target of 50 ms
    pull_linger: float = 0.005
    #: bytes one select_rows or lookup_rows answer may have in its output format; a larger answer is
    #: refused (1802) rather than built: add a WHERE condition or a LIMIT
    max_output_bytes: int = 64 * MiB
    #: seconds a select_rows query may run in the database before it is stopped (code 3, timeout)
    query_timeout: float = 60.0
    #: seconds a client has to send the headers of a request, counted from the connection (or from
    #: the first byte of a later request on it); a slower client is disconnected (slowloris)
    header_timeout: float = 10.0
    #: seconds an idle keep-alive connection stays open between requests
    keep_alive_timeout: float = 5.0
    #: open client connections; a request on a connection beyond them is answered 503 (retriable)
    max_connections: int = 1000

    # -- transport (docs/security.md) --------------------------------------------------------------------
    #: PEM certificate chain and private key of the API listener: both set, it serves HTTPS only;
    #: neither, plain HTTP (``--tls-cert-file``/``--tls-key-file``)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: CA bundle (PEM) that verifies the certificates of peers with an ``https://`` proxy_url;
    #: None: the system trust store (``--tls-ca-file``)
    peer_ca_file: str | None = None

    # -- active-active replication (XDCR, docs/xdcr.md) ----------------------------------------------
    #: this cluster's XDCR id, 0-127 (``--cluster-id``): persisted at the first start, a restart with
    #: another id is refused. None: the one stored (or none yet)
    cluster_id: int | None = None
    #: start with client writes refused while replicated changes are applied (``--paused``: a
    #: read-only standby, seed 001's ``voltdb start --pause``)
    start_paused: bool = False

    # -- fault tests -----------------------------------------------------------------------------------
    #: named crash points at which the process SIGKILLs itself (``REPTABLES_CRASH_AT``)
    crash_points: frozenset[str] = field(default_factory=frozenset)
    #: named points at which the thread reaching them sleeps, in seconds (``REPTABLES_DELAY_AT``)
    delay_points: Mapping[str, float] = field(default_factory=dict)

    def with_changes(self, **changes: object) -> EngineConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> EngineConfig:
        """The settings of ``reptables engine serve``: defaults, the environment, then options."""
        env = os.environ if environ is None else environ
        points = frozenset(p for p in env.get("REPTABLES_CRASH_AT", "").split(",") if p)
        delays = parse_delays(env.get("REPTABLES_DELAY_AT", ""))
        return cls(crash_points=points, delay_points=delays).with_changes(**overrides)


DEFAULT_CONFIG = EngineConfig()
#: seconds a group leader's lease lasts (``engine serve --leader-lease``; storage/leadership.py)
DEFAULT_LEASE = 1.5
