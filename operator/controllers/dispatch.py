"""Which reconcile and finalize function serves which kind: the one table both front ends use.

The reconcile core (one module per kind in this package) is plain Python and knows nothing of the
operator framework. Two front ends drive it: the handlers (``handlers.py``, events from the API
server) and the local runner (``local/runner.py``, manifests from files). Both look the functions up here, so a kind
is wired once and the local runner never has to import the handlers (nor the framework) to find
them.

``ORDER`` is the dependency order of the kinds: clusters before the tables on them, tables before
their replicas and collocations; XDCR groups last (they need only their clusters, whose
directories the TableCluster pass has just written). A front end that reconciles everything in one
pass (the local runner) follows it, so one pass goes as far as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from .. import metrics
from ..models import ConditionType
from .clusters import finalize_table_cluster, reconcile_table_cluster
from .collocations import finalize_table_collocation, reconcile_table_collocation
from .conditions import is_true
from .replicas import finalize_table_replica, reconcile_table_replica
from .tables import finalize_replicated_table, reconcile_replicated_table
from .world import Outcome, Resource, World
from .xdcr import finalize_xdcr_group, reconcile_xdcr_group

Reconciler = Callable[[Resource, World], Outcome]
"""Desired state (the resource) plus observed state (the world) -> actions taken and a status."""

ORDER: tuple[str, ...] = ("TableCluster", "ReplicatedTable", "TableReplica", "TableCollocation", "XdcrGroup")

RECONCILERS: Mapping[str, Reconciler] = MappingProxyType({
    "TableCluster": reconcile_table_cluster,
    "ReplicatedTable": reconcile_replicated_table,
    "TableReplica": reconcile_table_replica,
    "TableCollocation": reconcile_table_collocation,
    "XdcrGroup": reconcile_xdcr_group,
})
"""Kind -> the function that brings the engines in line with a resource and reports its status."""

FINALIZERS: Mapping[str, Reconciler] = MappingProxyType({
    "TableCluster": finalize_table_cluster,
    "ReplicatedTable": finalize_replicated_table,
    "TableReplica": finalize_table_replica,
    "TableCollocation": finalize_table_collocation,
    "XdcrGroup": finalize_xdcr_group,
})
"""Kind -> the function that runs when a resource is deleted (``Outcome.finished``: the finalizer may go)."""


def reconcile(res: Resource, world: World) -> Outcome:
    """Reconcile one resource with the function of its kind (errors counted: ``metrics.py``)."""
    try:
        outcome = RECONCILERS[res.kind](res, world)
    except Exception:
        metrics.RECONCILE_ERRORS.labels(res.kind, "exception").inc()
        raise
    if outcome.invalid is not None:
        metrics.RECONCILE_ERRORS.labels(res.kind, "invalid").inc()
    return outcome


def finalize(res: Resource, world: World) -> Outcome:
    """Run the deletion of one resource with the function of its kind."""
    try:
        outcome = FINALIZERS[res.kind](res, world)
    except Exception:
        metrics.RECONCILE_ERRORS.labels(res.kind, "exception").inc()
        raise
    if outcome.finished and res.kind == "TableReplica":
        metrics.forget_replica(res.namespace, res.name)
    return outcome


def is_ready(status: Mapping[str, object]) -> bool:
    """Whether a status (or an Outcome's status) carries ``Ready=True``."""
    conds = status.get("conditions")
    return is_true(conds if isinstance(conds, list) else None, ConditionType.READY)
