"""Each engine's ``//sys/clusters``: only the peers it needs, from the resources.

An engine calls another cluster for two reasons: a meta-cluster pushes to, prepares on and reads
from the clusters holding replicas of its replicated tables; a replica cluster asks the
meta-clusters of the tables it holds replicas of about in-doubt transactions. So the directory of
cluster X lists exactly

* the replica clusters of the ReplicatedTables whose ``cluster`` is X, and
* the meta-clusters of the TableReplicas whose ``cluster`` is X,
* the other members of the XdcrGroup X replicates in (``xdcr_members.xdcr_peers``),

(X itself only when a table on X has a replica on X), each with its URL and the peer credential for
X calling it (``reptables.engine.credentials``: good for that ordered pair's cluster-to-cluster
calls only, never the peer's API token) — never the whole set. Before, every engine got every
cluster's token, so one TableCluster with any endpoint collected them all; now a cluster no table
relates to gets an empty directory. Resources being deleted still count (their finalizers may still
need the link), and a TableCluster the credential policy refused is not registered in
:class:`~.world.Engines` and so is in no directory.

A replica kept on the engines after its TableReplica is deleted with ``deletionPolicy: Retain``
no longer links the two clusters: it stops replicating until a TableReplica adopts it again.

Change detection: names and URLs are read back from the engine; tokens are not readable, so the
value last written is remembered in the operator's memory (:meth:`Engines.written_directory`),
never in a status. A restarted operator rewrites each directory once.
"""

from __future__ import annotations

from reptables.engine.credentials import peer_credential

from .world import Directory, World
from .xdcr_members import xdcr_peers


def needed_clusters(name: str, world: World) -> set[str]:
    """The clusters the engine of TableCluster ``name`` calls, per ReplicatedTables, TableReplicas, XdcrGroups."""
    # (every new TableReplica's reconcile asks, twice: the links of every cluster are derived once per
    # change of a table or replica spec, not once per call, which made N new replicas cost N^2)
    links = world.derived(("ReplicatedTable", "TableReplica"), "replication_links", lambda: _replication_links(world))
    return set(links.get(name, ())) | xdcr_peers(name, world)


def _replication_links(world: World) -> dict[str, frozenset[str]]:
    """Cluster -> the clusters its engine calls for replicated tables: the replica clusters of its tables,
    and the meta-clusters of the replicas it holds."""
    meta_of = {(t.namespace, t.name): t.spec.cluster for t in world.read_only("ReplicatedTable")}
    links: dict[str, set[str]] = {}
    for replica in world.read_only("TableReplica"):
        meta = meta_of.get((replica.namespace, replica.spec.table))
        if meta is None:
            continue
        links.setdefault(meta, set()).add(replica.spec.cluster)
        links.setdefault(replica.spec.cluster, set()).add(meta)
    return {cluster: frozenset(peers) for cluster, peers in links.items()}


def desired_directory(name: str, world: World) -> Directory:
    """The ``//sys/clusters`` value for ``name``'s engine: the needed clusters that are registered."""
    known = world.engines.clusters()
    # a credential for this ordered pair only (engine/credentials.py), never the peer's API token
    return {peer: {"proxy_url": known[peer].endpoint, "token": peer_credential(known[peer].token, name)}
            for peer in sorted(needed_clusters(name, world)) if peer in known}


def sync_directory(name: str, world: World) -> tuple[Directory, bool]:
    """Write ``name``'s directory if it differs from what it should be: (the directory, whether written).

    Raises ClusterNotFound for an unregistered cluster and the engine's errors (YtError,
    httpx.HTTPError) when it cannot be read or written.
    """
    desired = desired_directory(name, world)
    client = world.engines.client(name)
    current = client.get("//sys/clusters") or {}
    visible = {peer: entry.get("proxy_url") if isinstance(entry, dict) else None for peer, entry in current.items()}
    if visible == {peer: entry["proxy_url"] for peer, entry in desired.items()} and \
            world.engines.written_directory(name) == desired:
        return desired, False
    client.set("//sys/clusters", desired)
    world.engines.remember_directory(name, desired)
    return desired, True
