"""The registry the reconcilers read other resources from (operator/registry.py).

It keeps each resource parsed once per version of its body and hands out copies, so that a
refresh round over N resources is not N^2 validations (benchmarks/scale_bench.py --dimensions
operator). What the reconcilers rely on through that cache: an edit is always seen, even one made in
place on a body the registry was handed before (the local runner and ``kubectl patch`` through the
tests do that); a reconciler that changes a status it read changes nobody else's; the filters and
lookups answer what a scan would.
"""

from __future__ import annotations

from typing import Any

import pytest

from reptables.operator.controllers.world import Engines
from reptables.operator.models import InvalidResourceError
from reptables.operator.registry import CredentialPolicy, Registry

API = "reptables.io/v1alpha1"


def replica(name: str, table: str, namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableReplica",
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {"table": table, "cluster": "c0", "replicaPath": f"//home/{table}", **spec}}


def cluster(name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name, "generation": 1},
            "spec": {"endpoint": f"http://{name}.example:9012", "clusterId": 1,
                     "credentialsSecret": {"name": f"{name}-token", "namespace": "ops"}}}


def registry(*docs: dict[str, Any]) -> Registry:
    reg = Registry(Engines(), "ops", CredentialPolicy(frozenset({"ops"})))
    for doc in docs:
        reg.upsert(doc)
    return reg


def test_an_edit_made_in_place_on_a_body_already_handed_over_is_seen() -> None:
    body = replica("r0", "orders", mode="async")
    reg = registry(body)
    assert reg.find("TableReplica", "shop", "r0").spec.mode.value == "async"  # type: ignore[union-attr]
    body["spec"]["mode"] = "sync"  # the same nested map the registry was handed
    body["metadata"]["generation"] = 2
    reg.upsert(body)
    found = reg.find("TableReplica", "shop", "r0")
    assert found is not None and found.spec.mode.value == "sync" and found.generation == 2
    assert [r.spec.mode.value for r in reg.of_kind("TableReplica")] == ["sync"]


def test_a_status_changed_by_one_reader_is_not_what_the_next_one_reads() -> None:
    reg = registry(replica("r0", "orders") | {"status": {"replicaId": "1-2-3-4"}})
    first = reg.of_kind("TableReplica")[0]
    first.status["replicaId"] = "changed by a reconciler"
    first.status["extra"] = True
    again = reg.find("TableReplica", "shop", "r0")
    assert again is not None and again.status == {"replicaId": "1-2-3-4"}
    assert reg.of_kind("TableReplica")[0].status == {"replicaId": "1-2-3-4"}


def test_filters_and_lookups_answer_what_a_scan_would() -> None:
    docs = [replica("a-r0", "a"), replica("a-r1", "a", cluster="c1"), replica("b-r0", "b"),
            replica("a-r0", "a", namespace="other"), cluster("c0")]
    reg = registry(*docs)
    assert [r.name for r in reg.of_kind("TableReplica")] == ["a-r0", "a-r1", "b-r0", "a-r0"]  # in the order stored
    assert [r.name for r in reg.of_kind("TableReplica", "shop")] == ["a-r0", "a-r1", "b-r0"]
    assert [(r.namespace, r.name) for r in reg.of_kind("TableReplica", where=lambda r: r.spec.table == "a")] == \
        [("shop", "a-r0"), ("shop", "a-r1"), ("other", "a-r0")]
    assert [r.name for r in reg.of_kind("TableReplica", "shop", lambda r: r.spec.cluster == "c1")] == ["a-r1"]
    assert reg.find("TableReplica", "other", "a-r0").namespace == "other"  # type: ignore[union-attr]
    assert reg.find("TableReplica", None, "b-r0").namespace == "shop"  # type: ignore[union-attr]
    assert reg.find("TableCluster", None, "c0").name == "c0"  # type: ignore[union-attr]
    assert reg.find("TableReplica", "shop", "missing") is None
    assert reg.world().find("TableReplica", "shop", "a-r1").spec.cluster == "c1"  # type: ignore[union-attr]
    assert len(reg.world().read_only("TableReplica")) == 4
    reg.remove("TableReplica", "shop", "a-r0")
    assert [(r.namespace, r.name) for r in reg.of_kind("TableReplica")] == \
        [("shop", "a-r1"), ("shop", "b-r0"), ("other", "a-r0")]
    assert reg.find("TableReplica", "shop", "a-r0") is None


def test_an_invalid_resource_is_left_out_and_read_again_once_fixed() -> None:
    body = replica("r0", "orders", mode="sometimes")
    reg = registry(body, replica("r1", "orders"))
    assert [r.name for r in reg.of_kind("TableReplica")] == ["r1"]
    assert reg.find("TableReplica", "shop", "r0") is None
    with pytest.raises(InvalidResourceError, match="mode"):
        reg.upserted(body)  # (what a reconcile of the body just upserted reads)
    body["spec"]["mode"] = "async"
    reg.upsert(body)
    assert [r.name for r in reg.of_kind("TableReplica")] == ["r0", "r1"]
    stored = reg.upserted(body)
    assert stored.spec.mode.value == "async"
    stored.status["mine"] = True
    assert reg.upserted(body).status == {} and reg.upserted(body | {"status": {"a": 1}}).status == {"a": 1}


def test_what_reconcilers_derive_from_whole_kinds_follows_every_spec_change_but_not_status_ones() -> None:
    from reptables.operator.controllers.directory import needed_clusters
    from reptables.operator.controllers.replicas import replica_place

    def table(name: str, cluster_name: str) -> dict[str, Any]:
        return {"apiVersion": API, "kind": "ReplicatedTable",
                "metadata": {"name": name, "namespace": "shop", "generation": 1},
                "spec": {"cluster": cluster_name, "path": f"//home/{name}",
                         "schema": [{"name": "k", "type": "int64", "sortOrder": "ascending"}]}}

    body = replica("r0", "orders")
    reg = registry(table("orders", "meta"), body)
    world = reg.world()
    computed: list[int] = []

    def count() -> int:
        computed.append(1)
        return len(reg.shared("TableReplica"))

    assert world.derived(("TableReplica",), "n", count) == 1
    # a status refresh (every resource, every few seconds) keeps what was derived
    reg.upsert(body | {"status": {"replicaId": "1-2-3-4", "lagSeconds": 3}})
    assert world.derived(("TableReplica",), "n", count) == 1 and len(computed) == 1
    assert needed_clusters("meta", world) == {"c0"} and needed_clusters("c0", world) == {"meta"}
    # a spec edit made in place on the body already handed over, a new resource, a removal, a deletion
    body["spec"]["cluster"] = "c1"
    reg.upsert(body)
    assert needed_clusters("meta", world) == {"c1"} and needed_clusters("c0", world) == set()
    twin = replica("r1", "orders", cluster="c1")
    reg.upsert(twin)
    assert world.derived(("TableReplica",), "n", count) == 2 and len(computed) == 2
    assert [r.name for r in world.grouped("TableReplica", replica_place)[("shop", "orders", "c1", "//home/orders")]] \
        == ["r0", "r1"]
    reg.upsert(twin | {"metadata": {**twin["metadata"], "deletionTimestamp": "2026-11-28T00:00:00Z"}})
    assert [r.deleting for r in world.grouped("TableReplica", replica_place)[("shop", "orders", "c1",
                                                                              "//home/orders")]] == [False, True]
    reg.remove("TableReplica", "shop", "r1")
    assert world.derived(("TableReplica",), "n", count) == 1 and len(computed) == 3
    reg.remove("TableReplica", "shop", "r0")
    assert needed_clusters("meta", world) == set()


def test_a_new_xdcr_groups_peers_reach_no_directory_until_its_engines_were_checked() -> None:
    """A TableCluster's reconcile that runs before the group's own (which checks that every engine
    runs with its ``--cluster-id``) must not list the group's peers: a group then refused for an
    engine without an id would have changed that engine's ``//sys/clusters`` after all."""
    from reptables.operator.controllers.xdcr_members import xdcr_peers

    def cluster_with_id(name: str, cluster_id: int) -> dict[str, Any]:
        doc = cluster(name)
        doc["spec"]["clusterId"] = cluster_id
        return doc

    group = {"apiVersion": API, "kind": "XdcrGroup", "metadata": {"name": "users", "uid": "u-1", "generation": 1},
             "spec": {"clusters": ["east", "west"],
                      "tables": [{"path": "//home/users", "schema": [
                          {"name": "id", "type": "int64", "sortOrder": "ascending"}]}]}}
    reg = registry(cluster_with_id("east", 1), cluster_with_id("west", 2), group)
    world = reg.world()
    assert xdcr_peers("east", world) == set()  # not looked at yet
    world.engines.note_group_checked("u-1", True)  # its reconciler found both engines with their ids
    assert xdcr_peers("east", world) == {"west"} and xdcr_peers("west", world) == {"east"}
    world.engines.note_group_checked("u-1", False)  # an engine found without its id
    assert xdcr_peers("east", world) == set()


def test_a_deleted_group_is_forgotten_by_the_engines_memory_of_checked_groups() -> None:
    """The operator remembers which XdcrGroups' engines it found running with their ids; a group's
    deletion ends that memory (uids never come back: the set only grew, one entry per group ever
    deleted), whether the deletion reset members or had nothing to touch."""
    from reptables.operator.controllers.xdcr import finalize_xdcr_group

    group = {"apiVersion": API, "kind": "XdcrGroup", "metadata": {"name": "users", "uid": "u-1", "generation": 1},
             "spec": {"clusters": ["c0", "north"],  # (no TableCluster north: the deletion touches no engine)
                      "tables": [{"path": "//home/users", "schema": [
                          {"name": "id", "type": "int64", "sortOrder": "ascending"}]}]}}
    reg = registry(cluster("c0"), group)
    world = reg.world()
    world.engines.note_group_checked("u-1", True)
    res = reg.find("XdcrGroup", None, "users")
    assert res is not None and world.engines.group_checked("u-1")
    outcome = finalize_xdcr_group(res, world)
    assert outcome.finished and not outcome.events
    assert not world.engines.group_checked("u-1")
