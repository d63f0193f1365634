"""The operator's Prometheus metrics, on the process-global registry the operator serves.

``reptables operator --metrics-port`` serves ``prometheus_client``'s default registry
(``handlers.run``), so the metrics live there, defined once here and imported by the modules that
count: the tracker loop (``tracker/loop.py``), the bootstrap steps (``controllers/replica_bootstrap.py``)
and the reconcile dispatch (``controllers/dispatch.py``). The engine's figures (lag, queues, 2PC) are the engines' own
``/metrics``; these are the control plane's: what the tracker checked and switched, where each
bootstrap is, and how often reconciling failed.

Labels stay bounded: a namespace and a resource name, a mode, a phase from a fixed list, a kind.
The tracker's reasons are free text (cluster names, lag figures) and go to the table's status and
the log, never into a label. docs/metrics.md lists every metric.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from .models import BootstrapPhase

TRACKER_CHECKS = Counter("reptables_tracker_checks", "Tracker checks run by the active operator")

MODE_SWITCHES = Counter("reptables_tracker_mode_switches",
                        "Replica mode changes made by the tracker (mode: the new mode; sync = promotion, "
                        "async = demotion)", ["namespace", "table", "mode"])

#: the phases of ``status.bootstrap.phase`` (controllers/replica_bootstrap.py), each a label value
BOOTSTRAP_PHASES = tuple(BootstrapPhase)

BOOTSTRAP_PHASE = Gauge("reptables_bootstrap_phase",
                        "1 for the current bootstrap phase of a TableReplica, 0 for the others",
                        ["namespace", "replica", "phase"])

BOOTSTRAP_ROWS_COPIED = Gauge("reptables_bootstrap_rows_copied",
                              "Rows the bootstrap copy of a TableReplica has written so far "
                              "(status.bootstrap.rowsCopied)",
                              ["namespace", "replica"])

BOOTSTRAP_FAILURES = Counter("reptables_bootstrap_failures",
                             "Failed bootstrap attempts of a TableReplica (final: the last allowed attempt failed)",
                             ["namespace", "replica", "final"])

RECONCILE_ERRORS = Counter("reptables_reconcile_errors",
                           "Reconciles that raised an error or found the spec invalid", ["kind", "reason"])


def record_bootstrap(namespace: str | None, replica: str, phase: object, rows_copied: object) -> None:
    """Publish where one TableReplica's bootstrap is (called after every bootstrap step)."""
    ns = namespace or ""
    for known in BOOTSTRAP_PHASES:
        BOOTSTRAP_PHASE.labels(ns, replica, known).set(1 if phase == known else 0)
    # nothing known yet (pending, or failed before copying): 0 rows
    BOOTSTRAP_ROWS_COPIED.labels(ns, replica).set(rows_copied if isinstance(rows_copied, int) else 0)


def forget_replica(namespace: str | None, replica: str) -> None:
    """A deleted TableReplica: its bootstrap series go (a gone replica is not "Failed" forever)."""
    ns = namespace or ""
    for known in BOOTSTRAP_PHASES:
        try:
            BOOTSTRAP_PHASE.remove(ns, replica, known)
        except KeyError:
            pass
    try:
        BOOTSTRAP_ROWS_COPIED.remove(ns, replica)
    except KeyError:
        pass
