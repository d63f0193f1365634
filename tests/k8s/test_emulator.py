"""Tests of the Kubernetes API emulator (tests/k8s/emulator.py) and of kopf running against it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.k8s.emulator import (
    DEFAULT_CRD_DIR,
    SPARK_CRD_PATH,
    ApiError,
    K8sApi,
    KopfProcess,
    crd_files,
    k8s_api,  # noqa: F401  (the fixture, used through request.getfixturevalue)
    label_selector_matcher,
    load_crd_documents,
    merge_patch,
)

GROUP = "test.reptables.io"
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wg"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["path", "size"],
                        "properties": {
                            "path": {"type": "string", "pattern": "^/[a-z0-9/]*$",
                                     "x-kubernetes-validations": [{"rule": "self == oldSelf",
                                                                   "message": "path is immutable"}]},
                            "size": {"type": "integer", "minimum": 1, "maximum": 10},
                            "mode": {"type": "string", "enum": ["sync", "async"], "default": "async"},
                            "tags": {"type": "array", "maxItems": 3, "items": {"type": "string"},
                                     "x-kubernetes-list-type": "set"},
                            "options": {"type": "object", "properties": {
                                "retries": {"type": "integer", "default": 3},
                                "verbose": {"type": "boolean"}}},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                        "x-kubernetes-validations": [{"rule": "self.mode != 'sync' || self.size <= 5",
                                                      "message": "sync widgets are limited to size 5",
                                                      "fieldPath": ".size"}],
                    },
                    "status": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {"phase": {"type": "string", "enum": ["Pending", "Ready"]},
                                       "observedGeneration": {"type": "integer"}},
                    },
                },
            }},
        }],
    },
}
GADGET_CRD: dict[str, Any] = {  # cluster-scoped, no status subresource; created through the API in a test
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gadgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Cluster",
        "names": {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                           "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }}}],
    },
}


def widget(name: str, namespace: str = "test", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name, "namespace": namespace},
            "spec": {"path": "/data", "size": 3, **spec}}


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sApi]:
    crd_dir = tmp_path_factory.mktemp("crds")
    (crd_dir / "widgets.yaml").write_text(yaml.safe_dump(WIDGET_CRD), encoding="utf-8")
    with K8sApi(crd_dirs=[crd_dir], crd_files=[SPARK_CRD_PATH], namespaces=["default", "test"]) as server:
        yield server
        assert server.server_errors() == []


# --- discovery ----------------------------------------------------------------------------------------------


def test_discovery_serves_what_kopf_needs(api: K8sApi) -> None:
    http = httpx.Client(base_url=api.url)
    assert http.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"]: g for g in http.get("/apis").json()["groups"]}
    for group in (GROUP, "sparkoperator.k8s.io", "kopf.dev", "apiextensions.k8s.io", "coordination.k8s.io"):
        assert group in groups
    assert groups["sparkoperator.k8s.io"]["preferredVersion"]["version"] == "v1beta2"

    resources = {r["name"]: r for r in http.get(f"/apis/{GROUP}/v1").json()["resources"]}
    assert resources["widgets"]["kind"] == "Widget" and resources["widgets"]["namespaced"] is True
    assert "watch" in resources["widgets"]["verbs"] and resources["widgets"]["shortNames"] == ["wg"]
    assert "widgets/status" in resources
    core = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert {"namespaces", "events", "secrets", "configmaps"} <= set(core)
    assert core["namespaces"]["namespaced"] is False
    peering = {r["name"]: r for r in http.get("/apis/kopf.dev/v1").json()["resources"]}
    assert peering["clusterkopfpeerings"]["namespaced"] is False and peering["kopfpeerings"]["namespaced"] is True
    assert http.get("/apis/nope.example.com/v1").status_code == 404

    crds = {c["metadata"]["name"]: c for c in api.list("customresourcedefinitions")}
    assert {f"widgets.{GROUP}", "sparkapplications.sparkoperator.k8s.io", "kopfpeerings.kopf.dev"} <= set(crds)
    conditions = {c["type"]: c["status"] for c in crds[f"widgets.{GROUP}"]["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert api.resource("wg").plural == "widgets" and api.resource("Widget").group == GROUP
    assert api.resource("sparkapp").kind == "SparkApplication"


def test_default_crd_directory_and_fixture(request: pytest.FixtureRequest) -> None:
    """The k8s_api fixture loads every CRD in crds/ (whatever is there) plus the SparkApplication CRD."""
    server: K8sApi = request.getfixturevalue("k8s_api")
    expected = [crd for path in crd_files(DEFAULT_CRD_DIR) for crd in load_crd_documents(path)]
    expected += load_crd_documents(SPARK_CRD_PATH)
    for crd in expected:
        assert crd["metadata"]["name"] in server.loaded_crds
        spec = crd["spec"]
        for version in spec["versions"]:
            rdef = server.resource(f"{spec['group']}/{version['name']}/{spec['names']['plural']}")
            assert rdef.kind == spec["names"]["kind"]
            assert rdef.namespaced == (spec["scope"] == "Namespaced")
            assert rdef.has_status == ("status" in (version.get("subresources") or {}))
            assert server.request("GET", rdef.path("default" if rdef.namespaced else None))["items"] == []
    assert server.get("namespaces", "default")["status"]["phase"] == "Active"
    kubeconfig = yaml.safe_load(server.kubeconfig(request.getfixturevalue("tmp_path")).read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == server.url


# --- metadata semantics ---------------------------------------------------------------------------------------


def test_uid_resource_version_generation(api: K8sApi) -> None:
    created = api.create({**widget("meta"), "status": {"phase": "Ready"}})
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert "status" not in created  # dropped on create: the status subresource is enabled
    assert created["spec"]["mode"] == "async"  # defaulted
    assert "options" not in created["spec"]  # nested defaults only apply where the parent exists

    secret = api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "meta-secret", "namespace": "test"},
                         "stringData": {"password": "hunter2"}})
    assert rv(secret) > rv(created)  # one cluster-wide counter
    assert secret["data"] == {"password": "aHVudGVyMg=="} and "stringData" not in secret

    labelled = api.patch("widgets", "meta", {"metadata": {"labels": {"tier": "gold"}}}, "test")
    assert rv(labelled) > rv(secret) and labelled["metadata"]["generation"] == 1
    resized = api.patch("widgets", "meta", {"spec": {"size": 4, "options": {}}}, "test")
    assert resized["metadata"]["generation"] == 2 and rv(resized) > rv(labelled)
    assert resized["spec"]["options"] == {"retries": 3}
    same = api.patch("widgets", "meta", {"spec": {"size": 4}}, "test")
    assert rv(same) == rv(resized) and same["metadata"]["generation"] == 2  # no-op: nothing written
    assert api.get("wg", "meta", "test")["metadata"]["uid"] == meta["uid"]

    generated = api.create({"apiVersion": f"{GROUP}/v1", "kind": "Widget",
                            "metadata": {"generateName": "gen-", "namespace": "test"},
                            "spec": {"path": "/g", "size": 1}})
    assert generated["metadata"]["name"].startswith("gen-") and len(generated["metadata"]["name"]) == 9
    with pytest.raises(ApiError) as exc:
        api.create(widget("meta"))
    assert exc.value.status == 409 and exc.value.reason == "AlreadyExists"


def test_status_subresource_is_separate(api: K8sApi) -> None:
    created = api.create(widget("stat"))
    with_status = api.patch_status("widgets", "stat", {"phase": "Pending", "observedGeneration": 1}, "test")
    assert with_status["status"] == {"phase": "Pending", "observedGeneration": 1}
    assert rv(with_status) > rv(created) and with_status["metadata"]["generation"] == 1

    # Status changes through the main resource are ignored; spec changes through /status too.
    ignored = api.patch("widgets", "stat", {"status": {"phase": "Ready"}}, "test")
    assert ignored["status"]["phase"] == "Pending" and rv(ignored) == rv(with_status)
    status_only = api.patch("widgets", "stat", {"spec": {"size": 9}, "status": {"phase": "Ready"}}, "test",
                            subresource="status")
    assert status_only["spec"]["size"] == 3 and status_only["status"]["phase"] == "Ready"
    assert status_only["metadata"]["generation"] == 1

    full = copy.deepcopy(status_only)
    full["spec"]["size"] = 5
    full["status"]["phase"] = "Pending"
    replaced = api.replace(full)  # PUT on the main resource: spec changes, status is kept
    assert replaced["spec"]["size"] == 5 and replaced["status"]["phase"] == "Ready"
    assert replaced["metadata"]["generation"] == 2
    replaced["status"] = {"phase": "Pending"}
    status_put = api.replace(replaced, subresource="status")
    assert status_put["status"] == {"phase": "Pending"} and status_put["metadata"]["generation"] == 2

    with pytest.raises(ApiError) as exc:  # the status is validated as well
        api.patch_status("widgets", "stat", {"phase": "Exploded"}, "test")
    assert exc.value.status == 422 and 'status.phase: Unsupported value: "Exploded"' in exc.value.message


# --- patches and concurrency ----------------------------------------------------------------------------------


def test_merge_and_json_patches(api: K8sApi) -> None:
    api.create({**widget("patchy", labels={"a": "1", "b": "2"}), "metadata": {
        "name": "patchy", "namespace": "test", "labels": {"keep": "yes", "drop": "me"}}})
    merged = api.patch("widgets", "patchy", {"metadata": {"labels": {"drop": None}}, "spec": {"labels": {"a": None}}},
                       "test")
    assert merged["metadata"]["labels"] == {"keep": "yes"} and merged["spec"]["labels"] == {"b": "2"}
    strategic = api.patch("widgets", "patchy", {"spec": {"tags": ["x"]}}, "test", patch_type="strategic")
    assert strategic["spec"]["tags"] == ["x"]

    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": strategic["metadata"]["resourceVersion"]},
           {"op": "add", "path": "/metadata/finalizers", "value": ["test.reptables.io/x"]},
           {"op": "replace", "path": "/spec/size", "value": 7}]
    patched = api.patch("widgets", "patchy", ops, "test", patch_type="json")
    assert patched["metadata"]["finalizers"] == ["test.reptables.io/x"] and patched["spec"]["size"] == 7

    stale = [{"op": "test", "path": "/metadata/resourceVersion", "value": strategic["metadata"]["resourceVersion"]},
             {"op": "remove", "path": "/metadata/finalizers"}]
    with pytest.raises(ApiError) as exc:  # kopf relies on a 422 for a failed test op
        api.patch("widgets", "patchy", stale, "test", patch_type="json")
    assert exc.value.status == 422
    assert api.get("widgets", "patchy", "test")["metadata"]["finalizers"] == ["test.reptables.io/x"]
    api.patch("widgets", "patchy", [{"op": "remove", "path": "/metadata/finalizers"}], "test", patch_type="json")
    assert "finalizers" not in api.get("widgets", "patchy", "test")["metadata"]
    assert merge_patch({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": None}, "d": [2]}) == {"a": {"c": 2}, "d": [2]}


def test_stale_resource_version_conflicts(api: K8sApi) -> None:
    original = api.create(widget("racy"))
    api.patch("widgets", "racy", {"spec": {"size": 2}}, "test")
    stale = copy.deepcopy(original)
    stale["spec"]["size"] = 9
    with pytest.raises(ApiError) as exc:
        api.replace(stale)
    assert exc.value.status == 409 and exc.value.reason == "Conflict"
    assert "the object has been modified" in exc.value.message
    with pytest.raises(ApiError) as exc:
        api.patch("widgets", "racy", {"metadata": {"resourceVersion": original["metadata"]["resourceVersion"]},
                                      "spec": {"size": 9}}, "test")
    assert exc.value.status == 409
    with pytest.raises(ApiError) as exc:
        api.delete("widgets", "racy", "test",
                   preconditions={"resourceVersion": original["metadata"]["resourceVersion"]})
    assert exc.value.status == 409

    unversioned = copy.deepcopy(original)
    del unversioned["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as exc:  # custom resources do not allow unconditional updates
        api.replace(unversioned)
    assert exc.value.status == 422 and "metadata.resourceVersion" in exc.value.message

    current = api.get("widgets", "racy", "test")
    current["spec"]["size"] = 9
    assert api.replace(current)["spec"]["size"] == 9


# --- deletion -------------------------------------------------------------------------------------------------


def test_finalizer_deletion_flow_and_watch_events(api: K8sApi) -> None:
    start = api.request("GET", api.resource("widgets").path("test"))["metadata"]["resourceVersion"]
    api.create({**widget("final"), "metadata": {"name": "final", "namespace": "test",
                                                 "finalizers": ["test.reptables.io/block"]}})
    deleting = api.delete("widgets", "final", "test")
    assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["finalizers"]
    assert api.get("widgets", "final", "test")["metadata"]["deletionTimestamp"]
    assert rv(api.delete("widgets", "final", "test")) == rv(deleting)  # deleting again changes nothing

    with pytest.raises(ApiError) as exc:
        api.patch("widgets", "final", {"metadata": {"finalizers": ["test.reptables.io/block", "new"]}}, "test")
    assert exc.value.status == 422 and "no new finalizers can be added" in exc.value.message

    released = api.patch("widgets", "final", {"metadata": {"finalizers": None}}, "test")
    assert released["metadata"]["deletionTimestamp"]
    assert api.get_or_none("widgets", "final", "test") is None

    events = [e for e in api.watch("widgets", "test", resource_version=start, timeout_seconds=0.5)
              if e["object"]["metadata"]["name"] == "final"]
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert "deletionTimestamp" not in events[0]["object"]["metadata"]
    assert events[1]["object"]["metadata"]["deletionTimestamp"]
    assert not events[2]["object"]["metadata"].get("finalizers")
    assert rv(events[0]["object"]) < rv(events[1]["object"]) < rv(events[2]["object"])

    # No finalizers: deleted at once (a Status for custom resources, as the real API server answers).
    api.create(widget("quick"))
    assert api.delete("widgets", "quick", "test")["status"] == "Success"
    with pytest.raises(ApiError) as exc:
        api.get("widgets", "quick", "test")
    assert exc.value.status == 404 and exc.value.message == 'widgets.test.reptables.io "quick" not found'


def test_owner_references_garbage_collection(api: K8sApi) -> None:
    owner = api.create(widget("owner"))
    ref = {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True, "blockOwnerDeletion": True}
    api.create({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "owned", "namespace": "test", "ownerReferences": [ref]}, "data": {"k": "v"}})
    api.create({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "owned-fin", "namespace": "test", "ownerReferences": [ref],
                             "finalizers": ["test.reptables.io/hold"]}})
    api.delete("widgets", "owner", "test")
    assert api.get_or_none("configmaps", "owned", "test") is None
    assert api.get("configmaps", "owned-fin", "test")["metadata"]["deletionTimestamp"]

    orphan_owner = api.create(widget("orphaner"))
    ref = {**ref, "name": "orphaner", "uid": orphan_owner["metadata"]["uid"]}
    api.create({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "orphan", "namespace": "test", "ownerReferences": [ref]}})
    api.delete("widgets", "orphaner", "test", propagation_policy="Orphan")
    assert api.get("configmaps", "orphan", "test")


def test_namespace_termination_deletes_content(api: K8sApi) -> None:
    api.create(widget("doomed", namespace="doomed"))  # the namespace is created on first use
    assert api.get("namespaces", "doomed")["status"]["phase"] == "Active"
    api.delete("namespaces", "doomed")
    assert api.get_or_none("widgets", "doomed", "doomed") is None
    assert api.get_or_none("namespaces", "doomed") is None


# --- validation -------------------------------------------------------------------------------------------------


def _rejected(api: K8sApi, obj: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as exc:
        api.create(obj)
    assert exc.value.status == 422 and exc.value.reason == "Invalid"
    assert api.get_or_none("widgets", obj["metadata"]["name"], "test") is None  # nothing stored
    return exc.value


def test_validation_messages_like_a_real_api_server(api: K8sApi) -> None:
    err = _rejected(api, widget("small", size=0))
    assert err.message == ('Widget.test.reptables.io "small" is invalid: spec.size: Invalid value: 0: '
                           "spec.size in body should be greater than or equal to 1")
    assert err.body["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "spec.size",
                                              "message": "Invalid value: 0: spec.size in body should be greater "
                                                         "than or equal to 1"}]
    assert "spec.size in body should be less than or equal to 10" in _rejected(api, widget("big", size=11)).message
    assert ('spec.mode: Unsupported value: "fast": supported values: "sync", "async"'
            in _rejected(api, widget("enum", mode="fast")).message)
    assert ('spec.size: Invalid value: "string": spec.size in body must be of type integer: "string"'
            in _rejected(api, widget("typed", size="3")).message)
    missing = widget("missing")
    del missing["spec"]["path"]
    assert "spec.path: Required value" in _rejected(api, missing).message
    assert "spec.path in body should match '^/[a-z0-9/]*$'" in _rejected(api, widget("pat", path="nope")).message
    assert "spec.tags: Too many: 4: must have at most 3 items" in _rejected(
        api, widget("many", tags=["a", "b", "c", "d"])).message
    assert 'spec.tags[1]: Duplicate value: "a"' in _rejected(api, widget("dups", tags=["a", "a"])).message
    assert 'metadata.name: Invalid value: "Bad_Name"' in _rejected(api, widget("Bad_Name")).message
    both = _rejected(api, widget("both", size=0, mode="fast")).message
    assert both.startswith('Widget.test.reptables.io "both" is invalid: [')
    assert "spec.mode: " in both and "spec.size: " in both

    # CEL rule on spec (with fieldPath): only evaluated when the schema validation passed.
    cel = _rejected(api, widget("celled", mode="sync", size=7))
    assert cel.message == ('Widget.test.reptables.io "celled" is invalid: spec.size: Invalid value: "object": '
                           "sync widgets are limited to size 5")


def test_pruning_and_defaulting(api: K8sApi) -> None:
    obj = widget("pruned", options={"verbose": True, "bogus": 1}, extra={"any": {"thing": [1]}}, unknown="x")
    obj["topLevel"] = "dropped"
    created = api.create(obj)
    assert "unknown" not in created["spec"] and "topLevel" not in created
    assert created["spec"]["options"] == {"verbose": True, "retries": 3}
    assert created["spec"]["extra"] == {"any": {"thing": [1]}}  # x-kubernetes-preserve-unknown-fields
    with pytest.raises(ApiError) as exc:
        api.create(widget("strict", unknown="x"), fieldValidation="Strict")
    assert exc.value.status == 400 and 'unknown field "spec.unknown"' in exc.value.message
    patched = api.patch("widgets", "pruned", {"spec": {"mode": None, "bogus": True}}, "test")
    assert patched["spec"]["mode"] == "async" and "bogus" not in patched["spec"]  # re-defaulted, pruned


def test_cel_transition_rule_with_old_self(api: K8sApi) -> None:
    created = api.create(widget("immutable"))
    with pytest.raises(ApiError) as exc:
        api.patch("widgets", "immutable", {"spec": {"path": "/elsewhere"}}, "test")
    assert exc.value.status == 422
    assert exc.value.message == ('Widget.test.reptables.io "immutable" is invalid: spec.path: Invalid value: '
                                 '"string": path is immutable')
    moved = copy.deepcopy(created)
    moved["spec"]["path"] = "/elsewhere"
    with pytest.raises(ApiError):
        api.replace(moved)
    current = api.get("widgets", "immutable", "test")
    assert current["spec"]["path"] == "/data" and rv(current) == rv(created)  # nothing stored
    assert api.patch("widgets", "immutable", {"spec": {"size": 2}}, "test")["spec"]["size"] == 2


def test_sparkapplication_crd(api: K8sApi) -> None:
    app = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
        "metadata": {"name": "bootstrap-copy", "namespace": "test"},
        "spec": {
            "type": "Python", "mode": "cluster", "sparkVersion": "4.0.0", "image": "spark:4.0.0",
            "mainApplicationFile": "local:///opt/reptables/jobs/bootstrap.py", "arguments": ["--table", "//t"],
            "sparkConf": {"spark.executor.instances": "2"}, "timeToLiveSeconds": 3600,
            "driver": {"cores": 1, "memory": "512m", "serviceAccount": "spark", "labels": {"app": "copy"}},
            "executor": {"cores": 1, "instances": 2, "memory": "512m"},
            "restartPolicy": {"type": "Never"},
        },
    }
    created = api.create(app)
    assert created["spec"]["type"] == "Python" and created["metadata"]["generation"] == 1
    assert api.patch_status("sparkapplications", "bootstrap-copy", {
        "applicationState": {"state": "RUNNING"}, "driverInfo": {"podName": "bootstrap-copy-driver"}},
        "test")["status"]["applicationState"]["state"] == "RUNNING"

    for spec_change, expected in [
        ({"type": 3}, 'spec.type: Invalid value: "integer": spec.type in body must be of type string: "integer"'),
        ({"type": "Go"}, 'spec.type: Unsupported value: "Go": supported values: "Java", "Python", "Scala", "R"'),
        ({"sparkVersion": None}, "spec.sparkVersion: Required value"),
        ({"executor": {"instances": "two"}}, "spec.executor.instances in body must be of type integer"),
    ]:
        bad = copy.deepcopy(app)
        bad["metadata"]["name"] = "bad-app"
        bad["spec"] = merge_patch(bad["spec"], spec_change)
        with pytest.raises(ApiError) as exc:
            api.create(bad)
        assert exc.value.status == 422 and expected in exc.value.message, exc.value.message


# --- dynamic CRDs, lists, watches, events -----------------------------------------------------------------------


def test_crd_created_through_the_api(api: K8sApi) -> None:
    api.create(GADGET_CRD)
    resources = api.request("GET", f"/apis/{GROUP}/v1")["resources"]
    assert "gadgets" in {r["name"] for r in resources}
    gadget = api.create({"apiVersion": f"{GROUP}/v1", "kind": "Gadget", "metadata": {"name": "g1"},
                         "spec": {"color": "red"}})
    assert "namespace" not in gadget["metadata"]
    # Without the status subresource, status is a normal field and bumps the generation.
    assert api.patch("gadgets", "g1", {"status": {"ok": True}})["metadata"]["generation"] == 2
    api.delete("customresourcedefinitions", f"gadgets.{GROUP}")
    assert "gadgets" not in {r["name"] for r in api.request("GET", f"/apis/{GROUP}/v1")["resources"]}
    with pytest.raises(ApiError) as exc:
        api.request("GET", f"/apis/{GROUP}/v1/gadgets")
    assert exc.value.status == 404
    with pytest.raises(ApiError) as exc:
        api.create({**GADGET_CRD, "metadata": {"name": "wrong.name"}})
    assert exc.value.status == 422 and 'must be spec.names.plural+"."+spec.group' in exc.value.message


def test_list_then_watch(api: K8sApi) -> None:
    for name, tier in [("lw-a", "gold"), ("lw-b", "silver")]:
        api.create({**widget(name), "metadata": {"name": name, "namespace": "test", "labels": {"lw-tier": tier}}})
    listing = api.request("GET", "/apis/test.reptables.io/v1/namespaces/test/widgets",
                          params={"labelSelector": "lw-tier in (gold,silver)"})
    assert {w["metadata"]["name"] for w in listing["items"]} == {"lw-a", "lw-b"}
    assert listing["kind"] == "WidgetList" and listing["apiVersion"] == f"{GROUP}/v1"
    since = listing["metadata"]["resourceVersion"]
    page = api.request("GET", "/apis/test.reptables.io/v1/widgets", params={"limit": "1"})
    assert len(page["items"]) == 1 and page["metadata"]["continue"]
    rest = api.request("GET", "/apis/test.reptables.io/v1/widgets", params={"continue": page["metadata"]["continue"]})
    assert page["items"][0]["metadata"]["name"] not in {w["metadata"]["name"] for w in rest["items"]}

    api.patch("widgets", "lw-a", {"spec": {"size": 8}}, "test")
    api.patch("widgets", "lw-b", {"metadata": {"labels": {"lw-tier": "gold"}}}, "test")
    api.patch("widgets", "lw-a", {"metadata": {"labels": {"lw-tier": "bronze"}}}, "test")
    events = api.watch("widgets", "test", resource_version=since, timeout_seconds=0.3, label_selector="lw-tier=gold")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "lw-a"), ("ADDED", "lw-b"), ("DELETED", "lw-a")]  # selector transitions

    initial = api.watch("widgets", "test", timeout_seconds=0.3, label_selector="lw-tier=gold",
                        send_initial_events=True, allow_bookmarks=True)
    assert [e["type"] for e in initial] == ["ADDED", "BOOKMARK"]
    assert initial[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert label_selector_matcher("a=1,b!=2,!c,d,e notin (x)")({"a": "1", "d": ""})


def test_events_and_secrets_are_served(api: K8sApi) -> None:
    event = api.create({"apiVersion": "v1", "kind": "Event",
                        "metadata": {"generateName": "kopf-event-", "namespace": "test"},
                        "involvedObject": {"kind": "Widget", "name": "w", "namespace": "test"},
                        "reason": "Tested", "message": "hello", "type": "Normal"})
    assert event["metadata"]["name"].startswith("kopf-event-")
    assert [e["message"] for e in api.events("test", involved_name="w", reason="Tested")] == ["hello"]
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "test"},
                "data": {"token": "c2VjcmV0"}})
    assert api.get("secrets", "creds", "test")["data"]["token"] == "c2VjcmV0"
    assert api.list("secrets", "test", field_selector="metadata.name=creds")[0]["type"] == "Opaque"


# --- kopf end to end --------------------------------------------------------------------------------------------


def test_kopf_operator_end_to_end(api: K8sApi, tmp_path: Path) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kopf-e2e"}})
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    operator = Path(__file__).with_name("sample_operator.py")
    with KopfProcess(["--standalone", "--namespace", "kopf-e2e", "--verbose", str(operator)],
                     kubeconfig=kubeconfig, log_path=tmp_path / "kopf.log") as kopf:
        try:
            api.wait_for_watch("widgets", "kopf-e2e", timeout=30)
            api.create(widget("w1", namespace="kopf-e2e", size=2))

            def reconciled() -> dict[str, Any] | None:
                obj = api.get("widgets", "w1", "kopf-e2e")
                return obj if obj.get("status", {}).get("conditions") else None

            obj = api.wait_for(reconciled, timeout=15, message="kopf writes the Ready condition")
            assert obj["metadata"]["finalizers"] == ["test.reptables.io/widget-cleanup"]
            assert obj["status"]["conditions"][0] == {"type": "Ready", "status": "True", "reason": "Reconciled",
                                                      "message": "size=2"}
            assert obj["status"]["observedGeneration"] == 1
            assert "kopf.zalando.org/last-handled-configuration" in obj["metadata"]["annotations"]
            api.wait_for(lambda: api.events("kopf-e2e", involved_name="w1", reason="WidgetCreated"), timeout=10)

            api.patch("widgets", "w1", {"spec": {"size": 5}}, "kopf-e2e")
            api.wait_for(lambda: api.get("widgets", "w1", "kopf-e2e")["status"]["observedGeneration"] == 2,
                         timeout=15, message="kopf handles the spec update")

            api.delete("widgets", "w1", "kopf-e2e")
            api.wait_for_deletion("widgets", "w1", "kopf-e2e", timeout=15)
            deleted = api.events("kopf-e2e", involved_name="w1", reason="WidgetDeleted")
            assert deleted and deleted[0]["message"] == "widget w1 cleaned up"
            assert kopf.alive()
        except BaseException:
            print(kopf.logs()[-20000:])
            raise
    assert "Traceback" not in kopf.logs()
