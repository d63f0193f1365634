"""Which XdcrGroups may act, judged from the resources alone, and so which clusters replicate with which.

Two readers need the answer: the XdcrGroup's reconciler (``xdcr.py``), which refuses to touch any
engine while the manifest cannot be applied, and the directory (``directory.py``), which lists a
cluster's XDCR peers in its ``//sys/clusters`` only for a group that may act. Kept apart from
both so that neither imports the other.

A group may act when every cluster of it is a TableCluster, their ``clusterId``\\ s differ, no older
group holds one of them, and its engines were checked and not found running with another id or
none (the Ready reason the reconciler wrote, ``ENGINE_ID_PROBLEMS``; a new group's engines count as
checked once this operator's reconciler has looked at them, ``Engines.note_group_checked``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import ConditionType
from . import conditions
from .world import Resource, World, oldest_claimant

# reasons of a manifest that cannot be applied
UNKNOWN_CLUSTER = "UnknownCluster"
DUPLICATE_CLUSTER_ID = "DuplicateClusterId"
CLUSTER_IN_ANOTHER_GROUP = "ClusterInAnotherGroup"
CLUSTER_ID_MISSING = "ClusterIdMissing"
CLUSTER_ID_MISMATCH = "ClusterIdMismatch"
#: found on the engines, not in the manifests: the directory leaves such a group out too
ENGINE_ID_PROBLEMS = frozenset({CLUSTER_ID_MISSING, CLUSTER_ID_MISMATCH})


@dataclass(frozen=True)
class GroupProblem:
    """Why a group cannot be applied as written: the reason of its Ready=False and a message."""

    reason: str
    message: str


def group_problem(res: Resource, world: World) -> GroupProblem | None:
    """What is wrong with the group judged from the resources alone (no engine is asked)."""
    spec = res.spec
    found = {name: world.find("TableCluster", None, name) for name in spec.clusters}
    missing = [name for name, cluster in found.items() if cluster is None]
    if missing:
        return GroupProblem(UNKNOWN_CLUSTER, f"{res.display}: no TableCluster {', '.join(missing)}; nothing is "
                                             "applied to any cluster until every cluster of the group exists")
    by_id: dict[int, list[str]] = {}
    for name, cluster in found.items():
        assert cluster is not None
        by_id.setdefault(int(cluster.spec.cluster_id), []).append(name)
    shared = {cid: names for cid, names in sorted(by_id.items()) if len(names) > 1}
    if shared:
        text = "; ".join(f"TableClusters {' and '.join(names)} share clusterId {cid}" for cid, names in shared.items())
        return GroupProblem(DUPLICATE_CLUSTER_ID, f"{res.display}: {text}; every cluster of an XDCR group needs its "
                                                  "own id (it tags each change with its origin); nothing is applied")
    for other in world.of_kind("XdcrGroup"):
        if other.uid == res.uid or other.deleting:
            continue
        common = sorted(set(other.spec.clusters) & set(spec.clusters))
        if common and oldest_claimant([res, other]).uid == other.uid:
            return GroupProblem(CLUSTER_IN_ANOTHER_GROUP, f"{res.display}: TableCluster {', '.join(common)} already "
                                                          f"belongs to {other.display} (a cluster has one set of XDCR "
                                                          "connections); nothing is applied")
    return None


def applicable(group: Resource, world: World) -> bool:
    """Whether the group may act on its engines: a valid manifest whose engines run with their ids.

    A new group is not applicable until its reconciler has looked at its engines (it then writes a
    Ready condition, and this operator remembers the check: ``Engines.note_group_checked``): a
    TableCluster's reconcile that ran in between listed the group's peers in its engine's
    directory, and a group then refused for an engine without ``--cluster-id`` had changed that
    engine after all, though its condition says nothing is applied."""
    reason = conditions.reason_of(group.status.get("conditions"), ConditionType.READY)
    if reason in ENGINE_ID_PROBLEMS:
        return False
    if reason is None and not world.engines.group_checked(group.uid):
        return False
    return not group.deleting and group_problem(group, world) is None


def xdcr_peers(name: str, world: World) -> set[str]:
    """The clusters the engine of TableCluster ``name`` replicates with, by the XdcrGroups that can apply."""
    peers: set[str] = set()
    for group in world.of_kind("XdcrGroup"):
        members = group.spec.members
        if name in members and applicable(group, world):
            peers |= set(members) - {name}
    return peers
