"""Packaging: the Helm chart, the Dockerfile and the kind e2e script, checked without a cluster.

* Always: Chart.yaml, values.yaml against values.schema.json, the chart's CRDs against crds/, the
  templates' YAML structure (template directives stripped), the RBAC template's rules, the hardened
  security defaults, the Dockerfile, hack/e2e-kind.sh (bash -n, shellcheck when installed).
* Always: the operator's RBAC is exactly what it uses. ``reptables operator`` runs as a real
  process against the Kubernetes API emulator of tests/k8s with two real engines, goes through
  create, status, tracker and deletion of every kind, and every request it makes must be allowed
  by the chart's rules, and every rule (but the ``get`` granted with list/watch) must have been used.
* With helm (``$HELM``, ``helm`` on PATH, or ``.venv/bin/helm``; else Helm's own Go SDK through
  the ``helm-python-sdk`` package, which needs no binary): ``helm lint`` and ``helm template`` for
  the modes the chart has; the rendered RBAC must equal the expected rules, the engines'
  NetworkPolicy admits exactly the operator, the engines and the configured clients, the generated
  token Secrets carry the credentials label, the rendered TableClusters and kopf peering objects
  are created through the emulator (CRD schema and CEL validation), the CloudNativePG Clusters of
  PostgreSQL-backed engines through the emulator serving CloudNativePG's own CRD (strict: an
  unknown field is refused, not pruned), HA table clusters (a leader and standby pods: readiness =
  leadership, ``--standby`` and a per-pod ``--advertise-url``, OnDelete updates, a PodDisruptionBudget,
  anti-affinity, a CloudNativePG Cluster with a synchronous standby; refused on SQLite), and the
  rendered command lines are accepted by the ``reptables`` CLI. Every rendered built-in object of
  every documented variant validates against the Kubernetes OpenAPI schemas (``kubernetes-validate``,
  strict: unknown fields rejected) of the oldest supported and the newest Kubernetes;
  ServiceMonitors and PrometheusRules get a structural check.

Nothing here renders ``lookup`` against a cluster or runs a pod: that is hack/e2e-kind.sh's job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
import yaml

from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "reptables"
PEERING_CHART = CHART / "charts" / "kopf-peering-crds"
API = "reptables.io/v1alpha1"


def _find_helm() -> str | None:
    for candidate in (os.environ.get("HELM"), shutil.which("helm"), str(ROOT / ".venv" / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


HELM = _find_helm()
try:  # Helm's Go SDK as a Python package: renders and lints like the binary, no binary needed
    import helm_python
except ImportError:
    helm_python = None
needs_helm = pytest.mark.skipif(HELM is None and helm_python is None, reason=(
    "neither the helm binary nor helm-python-sdk (pip install helm-python-sdk) is installed: the chart "
    "was not rendered"))

# --- expected RBAC -------------------------------------------------------------------------------

READ = ("get", "list", "watch")
NAMESPACED_KINDS = ("replicatedtables", "tablereplicas", "tablecollocations")
CLUSTER_KINDS = ("tableclusters", "xdcrgroups")
Rule = tuple[str, str, str]  # (apiGroup, resource, verb)
# bootstrap.spark.enabled: the SparkApplication launcher creates, polls and deletes an app per bootstrap
# attempt in the TableReplica's namespace, and creates its "<app>-credentials" Secret (owned by the app)
SPARK_RULES: set[Rule] = {("sparkoperator.k8s.io", "sparkapplications", v) for v in ("get", "create", "delete")}
SPARK_RULES |= {("", "secrets", "create")}


def expected_rbac(all_namespaces: bool, peering: bool, spark: bool = True) -> tuple[set[Rule], set[Rule]]:
    """(ClusterRole rules, rules of the Role in each watched namespace) the operator needs.

    ``spark``: bootstrap.spark.enabled (on by default), the launcher's rules wherever the namespaced
    custom resources are granted."""
    cluster = {("reptables.io", kind, v) for kind in CLUSTER_KINDS for v in (*READ, "patch")}
    cluster |= {("reptables.io", f"{kind}/status", "patch") for kind in CLUSTER_KINDS} | {("", "events", "create")}
    cluster |= {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in READ}
    namespaced = {("reptables.io", kind, v) for kind in NAMESPACED_KINDS for v in (*READ, "patch")}
    namespaced |= {("reptables.io", f"{kind}/status", "patch") for kind in NAMESPACED_KINDS}
    namespaced |= {("", "secrets", v) for v in READ}
    if spark:
        namespaced |= SPARK_RULES
    if all_namespaces:
        if peering:
            namespaced |= {("kopf.dev", "clusterkopfpeerings", v) for v in (*READ, "patch")}
        return cluster | namespaced, set()
    if peering:
        namespaced |= {("kopf.dev", "kopfpeerings", v) for v in (*READ, "patch")}
    return cluster | {("", "namespaces", v) for v in READ}, namespaced


def flatten_rules(rules: list[dict[str, Any]]) -> set[Rule]:
    flat = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), rule
                    flat.add((group, resource, verb))
    return flat


def operator_args(namespaces: list[str], all_namespaces: bool, peering: str | None,
                  health_port: int = 8080, metrics_port: int = 8081, credentials: tuple[str, ...] = ()) -> list[str]:
    """The ``reptables operator`` arguments the chart's Deployment renders (checked in test_helm_*)."""
    args = ["operator"]
    args += ["--all-namespaces"] if all_namespaces else [f"--namespace={ns}" for ns in namespaces]
    args += [f"--credentials-namespace={ns}" for ns in credentials]
    args += [f"--peering={peering}"] if peering else ["--standalone"]
    return args + [f"--liveness=http://0.0.0.0:{health_port}/healthz", f"--metrics-port={metrics_port}"]


# --- template parsing without helm ---------------------------------------------------------------

_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.S)
_ACTION = re.compile(r"\{\{.*?\}\}")


def strip_template(text: str) -> str:
    """The literal YAML of a template: comments and directive-only lines dropped, actions -> a word."""
    lines = []
    for line in _COMMENT.sub("", text).splitlines():
        if line.strip() and not _ACTION.sub("", line).strip():
            continue
        lines.append(_ACTION.sub("TEMPLATED", line))
    return "\n".join(lines)


def template_documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(strip_template((CHART / "templates" / name).read_text())) if d]


def load_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


# --- Chart.yaml, values, schema, CRDs --------------------------------------------------------------


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2" and chart["name"] == "reptables" and chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"])
    assert chart["appVersion"] == project["version"], "the image tag defaults to appVersion = the package version"
    assert chart["kubeVersion"].startswith(">=1.25")
    assert chart["description"]
    assert [d["name"] for d in chart["dependencies"]] == ["kopf-peering-crds"]
    sub = yaml.safe_load((PEERING_CHART / "Chart.yaml").read_text())
    assert sub["name"] == "kopf-peering-crds" and sub["version"] == chart["dependencies"][0]["version"]
    assert not (PEERING_CHART / "templates").exists(), "the peering subchart only ships CRDs"


def test_values_yaml_validates_against_the_schema() -> None:
    errors = list(schema_validator().iter_errors(load_values()))
    assert not errors, [e.message for e in errors]


CLIENTS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}},
           {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
E2E_VALUES = {"operator": {"replicas": 2, "watch": {"namespaces": ["shop"]}, "credentials": {"namespaces": ["vault"]}},
              "networkPolicy": {"clients": CLIENTS},
              "engines": [{"name": "primary", "clusterId": 0},
                          {"name": "remote-0", "clusterId": 1, "storage": {"size": "1Gi", "storageClass": "fast"}},
                          {"name": "remote-1", "clusterId": 2, "readOnly": True,
                           "existingSecret": {"name": "remote-1-token", "key": "token"}}],
              "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}}


# PostgreSQL-backed engines (docs/install.md, "PostgreSQL-backed engines"): a database of your own
# through a Secret holding its whole URL, and a CloudNativePG Cluster the chart declares
POSTGRESQL_ENGINES = [
    {"name": "primary", "clusterId": 0,
     "storage": {"size": "1Gi", "postgresql": {"existingSecret": {"name": "primary-db"}}}},
    {"name": "remote-0", "clusterId": 1,
     "storage": {"size": "1Gi", "postgresql": {"existingSecret": {"name": "dbs", "key": "remote-0-url"}}}},
    {"name": "remote-1", "clusterId": 2,
     "storage": {"size": "1Gi", "storageClass": "fast",
                 "postgresql": {"cloudnativepg": {"instances": 3, "storage": {"size": "50Gi", "storageClass": "ssd"},
                                                  "imageName": "ghcr.io/cloudnative-pg/postgresql:16.4"}}}},
]

# HA table clusters (docs/install.md, "HA table clusters"): a leader and standby pods over one database
HA_ENGINES: list[dict[str, Any]] = [
    {"name": "meta", "clusterId": 0, "ha": {"replicas": 2},
     "storage": {"size": "1Gi", "postgresql": {"cloudnativepg": {"instances": 3, "storage": {"size": "50Gi"}}}}},
    {"name": "remote-0", "clusterId": 1,
     "ha": {"replicas": 3, "leaderLease": 1.5, "antiAffinity": "preferred",
            "topologyKey": "topology.kubernetes.io/zone"},
     "storage": {"size": "1Gi", "postgresql": {"existingSecret": {"name": "remote-0-db"}}}},
    {"name": "remote-1", "clusterId": 2},  # a single engine on SQLite beside them
]
#: what the schema says to HA on SQLite (a const no value can equal: the message names what is missing)
HA_NEEDS_POSTGRESQL = ("needs storage.postgresql: the engine pods of an HA table cluster share one PostgreSQL "
                       "database (SQLite is a file of one pod: no leader, no standby)")


def merged(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    result = dict(base)
    for key, value in overlay.items():
        result[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return result


def test_schema_accepts_a_full_configuration() -> None:
    errors = list(schema_validator().iter_errors(merged(load_values(), E2E_VALUES)))
    assert not errors, [e.message for e in errors]


def test_schema_accepts_postgresql_backed_engines() -> None:
    errors = list(schema_validator().iter_errors(merged(load_values(), {"engines": POSTGRESQL_ENGINES})))
    assert not errors, [e.message for e in errors]


def test_schema_accepts_ha_engines() -> None:
    errors = list(schema_validator().iter_errors(merged(load_values(), {"engines": HA_ENGINES})))
    assert not errors, [e.message for e in errors]


BAD_VALUES = [
    ({"engines": [{"name": "primary", "clusterId": 128}]}, "128 is greater than the maximum of 127"),
    ({"engines": [{"name": "primary", "clusterId": "1"}]}, "'1' is not of type 'integer'"),
    ({"engines": [{"clusterId": 1}]}, "'name' is a required property"),
    ({"engines": [{"name": "Primary", "clusterId": 1}]}, "does not match"),
    ({"engines": [{"name": "primary", "clusterId": 1, "size": "1Gi"}]}, "Additional properties are not allowed"),
    ({"image": {"pullPolicy": "Sometimes"}}, "'Sometimes' is not one of"),
    ({"operator": {"replicas": "2"}}, "'2' is not of type 'integer'"),
    ({"operator": {"watch": {"allNamespaces": "yes"}}}, "'yes' is not of type 'boolean'"),
    ({"operator": {"watch": {"namespaces": ["a", "a"]}}}, "has non-unique elements"),
    ({"serviceMonitor": {"enabled": True, "interval": "30 seconds"}}, "does not match"),
    ({"engineDefaults": {"storage": {"size": "ten gigs"}}}, "does not match"),
    ({"replicaCount": 2}, "Additional properties are not allowed"),
    ({"operator": {"credentials": {"namespaces": ["Not A Namespace"]}}}, "does not match"),
    ({"networkPolicy": {"enabled": "yes"}}, "'yes' is not of type 'boolean'"),
    ({"networkPolicy": {"clients": [{}]}}, "should be non-empty"),
    ({"networkPolicy": {"clients": [{"namespaceSelector": {"app": "shop"}}]}}, "Additional properties are not allowed"),
    ({"networkPolicy": {"clients": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}]}},
     "'Is' is not one of"),
    ({"bootstrap": {"spark": {"executor": {"memory": "lots"}}}}, "'lots' does not match"),
    ({"bootstrap": {"spark": {"driver": {"memory": "1.5g"}}}}, "'1.5g' does not match"),
    ({"bootstrap": {"spark": {"submitTimeoutSeconds": 0}}}, "0 is less than the minimum of 1"),
    ({"bootstrap": {"spark": {"timeToLiveSeconds": "1h"}}}, "'1h' is not of type 'integer'"),
    ({"bootstrap": {"spark": {"executor": {"instances": 0}}}}, "0 is less than the minimum of 1"),
    ({"bootstrap": {"spark": {"driver": {"cores": 0}}}}, "0 is less than the minimum of 1"),
    ({"bootstrap": {"spark": {"imagePullPolicy": "Sometimes"}}}, "'Sometimes' is not one of"),
    ({"bootstrap": {"spark": {"sparkConf": {"spark.executor.memoryOverhead": 512}}}}, "512 is not of type 'string'"),
    ({"bootstrap": {"spark": {"executors": 4}}}, "Additional properties are not allowed"),
    ({"bootstrap": {"spark": {"driver": {"memoryOverhead": "1g"}}}}, "Additional properties are not allowed"),
    ({"bootstrap": {"spark": {"enabled": "yes"}}}, "'yes' is not of type 'boolean'"),
    ({"bootstrap": {"flink": {}}}, "Additional properties are not allowed"),
    # storage.postgresql: exactly one of existingSecret and cloudnativepg
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {
        "existingSecret": {"name": "db"}, "cloudnativepg": {"storage": {"size": "1Gi"}}}}}]},
     "has too many properties"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {}}}]}, "should be non-empty"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"url": "postgresql://x/y"}}}]},
     "Additional properties are not allowed ('url' was unexpected)"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"existingSecret": {"key": "uri"}}}}]},
     "'name' is a required property"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"cloudnativepg": {"instances": 3}}}}]},
     "'storage' is a required property"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"cloudnativepg": {
        "instances": 0, "storage": {"size": "1Gi"}}}}}]}, "0 is less than the minimum of 1"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"cloudnativepg": {
        "storage": {"size": "1Gi"}, "database": "Tables-1"}}}}]}, "'Tables-1' does not match"),
    ({"engines": [{"name": "primary", "clusterId": 0, "storage": {"postgresql": {"cloudnativepg": {
        "storage": {"size": "lots"}}}}}]}, "'lots' does not match"),
    ({"engineDefaults": {"storage": {"postgresql": {"existingSecret": {"name": "db"}}}}},
     "Additional properties are not allowed ('postgresql' was unexpected)"),  # one database per engine
    # ha: PostgreSQL only, two pods or more, a CloudNativePG Cluster with a standby
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2}}]}, HA_NEEDS_POSTGRESQL),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2}, "storage": {"size": "1Gi"}}]},
     HA_NEEDS_POSTGRESQL),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 1},
                   "storage": {"postgresql": {"existingSecret": {"name": "db"}}}}]}, "1 is less than the minimum of 2"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {},
                   "storage": {"postgresql": {"existingSecret": {"name": "db"}}}}]},
     "'replicas' is a required property"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2, "antiAffinity": "strict"},
                   "storage": {"postgresql": {"existingSecret": {"name": "db"}}}}]}, "'strict' is not one of"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2, "lease": 5},
                   "storage": {"postgresql": {"existingSecret": {"name": "db"}}}}]},
     "Additional properties are not allowed ('lease' was unexpected)"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2, "leaderLease": 0.1},
                   "storage": {"postgresql": {"existingSecret": {"name": "db"}}}}]}, "0.1 is less than the minimum"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2},
                   "storage": {"postgresql": {"cloudnativepg": {"storage": {"size": "1Gi"}}}}}]},
     "'instances' is a required property"),
    ({"engines": [{"name": "meta", "clusterId": 0, "ha": {"replicas": 2},
                   "storage": {"postgresql": {"cloudnativepg": {"instances": 1, "storage": {"size": "1Gi"}}}}}]},
     "1 is less than the minimum of 2"),
    ({"engineDefaults": {"ha": {"replicas": 2}}}, "Additional properties are not allowed ('ha' was unexpected)"),
]


@pytest.mark.parametrize(("overlay", "message"), BAD_VALUES, ids=[str(i) for i in range(len(BAD_VALUES))])
def test_schema_rejects_bad_values(overlay: dict[str, Any], message: str) -> None:
    errors = [e.message for e in schema_validator().iter_errors(merged(load_values(), overlay))]
    assert any(message in e for e in errors), errors


SPARK_DEFAULTS = {"enabled": True, "image": "", "imagePullPolicy": "IfNotPresent",
                  "serviceAccount": "spark-operator-spark", "sparkVersion": "4.0.1", "mainApplicationFile": "local:///opt/reptables/sparkapp.py",
                  "timeToLiveSeconds": 3600, "submitTimeoutSeconds": 600, "driver": {"cores": 1, "memory": "1g"},
                  "executor": {"instances": 2, "cores": 1, "memory": "2g"}, "sparkConf": {}, "nodeSelector": {}}


def test_bootstrap_spark_defaults() -> None:
    """bootstrap.spark: the SparkApplication launcher's settings (REPTABLES_SPARK_JOBS), on by default."""
    assert load_values()["bootstrap"] == {"spark": SPARK_DEFAULTS}


@pytest.mark.parametrize("memory", ["512m", "2g", "2G", "1024", "1t", "64K"])
def test_schema_accepts_spark_memory_strings(memory: str) -> None:
    overlay = {"bootstrap": {"spark": {"driver": {"memory": memory}, "executor": {"memory": memory},
                                       "sparkConf": {"spark.sql.shuffle.partitions": "64"},
                                       "nodeSelector": {"pool": "spark"}, "image": "registry.example.com/jobs:1"}}}
    errors = list(schema_validator().iter_errors(merged(load_values(), overlay)))
    assert not errors, [e.message for e in errors]


def test_chart_crds_are_the_generated_crds() -> None:
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    crds = {p.name: p.read_bytes() for p in (ROOT / "crds").iterdir()}
    assert chart_crds == crds
    kinds = {yaml.safe_load(text)["spec"]["names"]["kind"] for text in crds.values()}
    assert kinds == {"TableCluster", "ReplicatedTable", "TableReplica", "TableCollocation", "XdcrGroup"}


def test_kopf_peering_crds_match_what_kopf_expects() -> None:
    from tests.k8s.emulator import KOPF_PEERING_CRDS

    ours = list(yaml.safe_load_all((PEERING_CHART / "crds" / "kopf-peering.yaml").read_text()))
    key = [(c["metadata"]["name"], c["spec"]["group"], c["spec"]["scope"], c["spec"]["names"]["kind"],
            c["spec"]["names"]["plural"], [v["name"] for v in c["spec"]["versions"] if v["served"] and v["storage"]])
           for c in ours]
    assert key == [(c["metadata"]["name"], c["spec"]["group"], c["spec"]["scope"], c["spec"]["names"]["kind"],
                    c["spec"]["names"]["plural"], ["v1"]) for c in KOPF_PEERING_CRDS]
    for crd in ours:
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True  # kopf's keep-alives are free-form


# --- templates without helm ------------------------------------------------------------------------


def test_every_template_has_a_plausible_yaml_structure() -> None:
    templates = sorted(p.name for p in (CHART / "templates").glob("*.yaml"))
    assert templates == ["dashboard-configmap.yaml", "deployment.yaml", "engines.yaml", "networkpolicy.yaml",
                         "peering.yaml", "postgresql.yaml", "prometheusrule.yaml", "rbac.yaml", "serviceaccount.yaml",
                         "servicemonitor.yaml", "tableclusters.yaml"]
    kinds = set()
    for name in templates:
        docs = template_documents(name)
        assert docs, name
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), (name, doc)
            assert doc["metadata"].get("name"), (name, doc)
            kinds.add(doc["kind"])
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment",
                     "Service", "Secret", "StatefulSet", "KopfPeering", "ClusterKopfPeering", "TableCluster",
                     "ServiceMonitor", "NetworkPolicy", "ConfigMap", "PrometheusRule", "Cluster",
                     "PodDisruptionBudget"}


def test_rbac_template_rules_without_helm() -> None:
    """Every literal rule of the template (all branches at once) is one the operator needs."""
    docs = template_documents("rbac.yaml")
    union: set[Rule] = set()
    for all_namespaces in (False, True):
        for peering in (False, True):
            cluster, role = expected_rbac(all_namespaces, peering)
            union |= cluster | role
    union |= CNPG_RULES  # (an HA engine on a CloudNativePG Cluster: a Role of its own)
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            assert flatten_rules(doc["rules"]) <= union, doc["kind"]
    assert "*" not in (CHART / "templates" / "rbac.yaml").read_text().replace("/*", "").replace("*/", "")


def test_hardened_security_defaults() -> None:
    values = load_values()
    pod, container = values["podSecurityContext"], values["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001 and pod["fsGroup"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["allowPrivilegeEscalation"] is False and container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]} and container["runAsNonRoot"] is True
    for name, container_name in (("deployment.yaml", "operator"), ("engines.yaml", "engine")):
        workload = next(d for d in template_documents(name) if d["kind"] in ("Deployment", "StatefulSet"))
        spec = workload["spec"]["template"]["spec"]
        (container_spec,) = [c for c in spec["containers"] if c["name"] == container_name]
        assert {"name": "tmp", "mountPath": "/tmp"} in container_spec["volumeMounts"]
        assert any(v["name"] == "tmp" and "emptyDir" in v for v in spec["volumes"])
        text = (CHART / "templates" / name).read_text()
        assert "toYaml .Values.podSecurityContext" in text or "toYaml $.Values.podSecurityContext" in text
        assert "toYaml .Values.securityContext" in text or "toYaml $.Values.securityContext" in text


# --- the operator's real requests against the chart's RBAC ------------------------------------------


def _rbac_attributes(method: str, path: str, params: dict[str, str]) -> tuple[str, str, str, str | None] | None:
    """(group, resource[/subresource], verb, namespace) of a resource request; None for discovery."""
    match = re.fullmatch(r"/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?"
                         r"/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?", path)
    if match is None:
        return None
    res = match["res"] + (f"/{match['sub']}" if match["sub"] else "")
    verb = {"GET": "watch" if params.get("watch") in ("true", "1") else ("get" if match["name"] else "list"),
            "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return match["group"] or "", res, verb, match["ns"]


def _run_operator_scenario(tmp_path: Path, args: list[str], peering: str | None, all_namespaces: bool,
                           operator_ns: str, app_ns: str) -> list[tuple[str, str, str, str | None]]:
    from tests.k8s.emulator import K8sApi

    schema = [{"name": "k", "type": "int64", "sortOrder": "ascending"}, {"name": "v", "type": "string"}]
    engines = {name: EngineProcess(name, tmp_path / name, token=f"token-{name}-0123456789").start()
               for name in ("primary", "remote-0")}
    proc = None
    try:
        with K8sApi(namespaces=[operator_ns, app_ns, "default"]) as api:
            if peering and all_namespaces:
                api.create({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": peering}})
            elif peering:
                for ns in (operator_ns, app_ns):
                    api.create({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                "metadata": {"name": peering, "namespace": ns}})
            env = {**os.environ, "KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
                   "REPTABLES_NAMESPACE": operator_ns, "POD_NAMESPACE": operator_ns, "POD_ID": "operator-0",
                   "REPTABLES_STATUS_REFRESH": "1", "REPTABLES_TRACKER_PERIOD": "1", "PYTHONUNBUFFERED": "1"}
            argv = [a for a in args if not a.startswith(("--liveness=", "--metrics-port="))]
            argv += [f"--liveness=http://127.0.0.1:{free_port()}/healthz", f"--metrics-port={free_port()}"]
            with (tmp_path / "operator.log").open("wb") as log:
                proc = subprocess.Popen([sys.executable, "-m", "reptables.operator.cli", *argv], stdout=log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
            for index, (name, engine) in enumerate(engines.items()):
                api.create({"apiVersion": "v1", "kind": "Secret",
                            "metadata": {"name": f"{name}-token", "namespace": operator_ns,
                                         "labels": {"reptables.io/credentials": "true"}},
                            "stringData": {"token": engine.token}})
                api.create({"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name},
                            "spec": {"endpoint": engine.url, "clusterId": index,
                                     "credentialsSecret": {"name": f"{name}-token"}}})
            api.create({"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "t", "namespace": app_ns},
                        "spec": {"cluster": "primary", "path": "//home/t", "schema": schema, "deletionPolicy": "Delete",
                                 "replicatedTableOptions": {"enableReplicatedTableTracker": True}}})
            api.create({"apiVersion": API, "kind": "TableReplica", "metadata": {"name": "t-r0", "namespace": app_ns},
                        "spec": {"table": "t", "cluster": "remote-0", "replicaPath": "//home/t", "mode": "sync",
                                 "deletionPolicy": "Delete"}})
            api.create({"apiVersion": API, "kind": "TableCollocation", "metadata": {"name": "c", "namespace": app_ns},
                        "spec": {"tables": ["t"]}})
            # the scenario's engines run without --cluster-id: the group is refused (ClusterIdMissing), which
            # still takes the finalizer and a status patch, like any group
            api.create({"apiVersion": API, "kind": "XdcrGroup", "metadata": {"name": "g"},
                        "spec": {"clusters": ["primary", "remote-0"]}})
            objects = [("tableclusters", "primary", None), ("tableclusters", "remote-0", None),
                       ("replicatedtables", "t", app_ns), ("tablereplicas", "t-r0", app_ns),
                       ("tablecollocations", "c", app_ns)]

            def ready(kind: str, name: str, ns: str | None) -> bool:
                status = api.get(kind, name, ns).get("status") or {}
                return any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in status.get("conditions", []))

            try:
                wait_for(lambda: all(ready(*o) for o in objects), 90, "every object Ready", interval=0.25)
            except WaitTimeout as exc:
                raise AssertionError(f"{exc}\n{(tmp_path / 'operator.log').read_text()[-4000:]}") from None
            api.wait_for(lambda: (api.get("replicatedtables", "t", app_ns).get("status") or {}).get("tracker"),
                         timeout=30, message="the tracker's verdict in status")
            api.wait_for(lambda: (api.get("xdcrgroups", "g").get("status") or {}).get("conditions"),
                         timeout=30, message="the XdcrGroup's conditions")
            group = ("xdcrgroups", "g", None)
            for kind, name, ns in [group, objects[4], objects[3], objects[2], objects[0], objects[1]]:
                api.delete(kind, name, ns)
                # generous: a failed refresh timer of the object (kopf's 60 s backoff) delays its deletion
                api.wait_for_deletion(kind, name, ns, timeout=150)
            requests = [r for r in list(api.emulator.history) if "kopf" in r.headers.get("User-Agent", "")]
            return [a for a in (_rbac_attributes(str(getattr(r.method, "value", r.method)).upper(), r.url.path,
                                                 dict(r.params)) for r in requests) if a is not None]
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for engine in engines.values():
            engine.stop()


@pytest.mark.parametrize("all_namespaces", [False, True], ids=["namespaced", "all-namespaces"])
def test_operator_needs_exactly_the_chart_rbac(tmp_path: Path, all_namespaces: bool) -> None:
    operator_ns, app_ns = "reptables-system", "shop"
    namespaces = sorted({operator_ns, app_ns})
    args = operator_args(namespaces, all_namespaces, "reptables")
    used = _run_operator_scenario(tmp_path, args, "reptables", all_namespaces, operator_ns, app_ns)
    cluster, role = expected_rbac(all_namespaces, peering=True)
    denied = sorted({(g, r, v, ns) for g, r, v, ns in used
                     if (g, r, v) not in cluster and not (ns in namespaces and (g, r, v) in role)}, key=str)
    assert not denied, f"requests the chart's RBAC would forbid: {denied}"
    # the scenario runs no bootstrap: the SparkApplication launcher's rules are exercised by
    # tests/operator/test_sparkapplication.py
    unused = {(g, r, v) for g, r, v in (cluster | role) - SPARK_RULES if v != "get"}
    unused -= {(g, r, v) for g, r, v, _ in used}
    assert not unused, f"rules the operator never used (not least privilege): {sorted(unused)}"
    assert ("", "events", "create", "default") in used  # TableCluster events: why events are cluster-wide


# --- helm --------------------------------------------------------------------------------------------


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    result = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def lint(tmp_path: Path, values: dict[str, Any] | None) -> tuple[bool, str]:
    """``helm lint --strict`` in the release namespace: (passed, what it said)."""
    if HELM is None:
        assert helm_python is not None
        report = helm_python.lint(str(CHART), values, strict=True, namespace="reptables-system")
        # --strict: a warning fails the chart like an error
        failed = report["errors"] or [m for m in report["messages"] if m["severity"] >= 2]
        return not failed and report["total_charts_linted"] == 1, json.dumps(report, indent=1)
    args = ["lint", str(CHART), "--strict", "--namespace", "reptables-system"]
    if values is not None:
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        args += ["--values", str(tmp_path / "values.yaml")]
    result = helm(*args, check=False)
    return result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr


def _render_with_sdk(values: dict[str, Any] | None, namespace: str, release: str,
                     check: bool) -> list[dict[str, Any]] | str:
    """``helm template --include-crds`` through helm-python-sdk (``lookup`` finds nothing, as with helm)."""
    assert helm_python is not None
    try:
        with helm_python.Chart.load(str(CHART)) as chart:
            manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
            texts = [crd["data"] for crd in chart.crds]
    except helm_python.HelmError as exc:
        assert not check, str(exc)
        return str(exc)
    texts += [text for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")]
    return [d for text in texts for d in yaml.safe_load_all(text) if d]


def render(tmp_path: Path, values: dict[str, Any] | None = None, namespace: str = "reptables-system",
           release: str = "rt", check: bool = True) -> list[dict[str, Any]] | str:
    if HELM is None:
        return _render_with_sdk(values, namespace, release, check)
    args = ["template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    if values is not None:
        values_file = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args += ["--values", str(values_file)]
    result = helm(*args, check=check)
    if result.returncode != 0:
        return result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    return doc


@needs_helm
@pytest.mark.parametrize("values", [None, E2E_VALUES, {"operator": {"watch": {"allNamespaces": True}}},
                                    {"bootstrap": {"spark": {"enabled": False}}}, {"engines": POSTGRESQL_ENGINES},
                                    {"engines": HA_ENGINES}],
                         ids=["defaults", "engines-ha", "all-namespaces", "no-spark", "postgresql", "ha-engines"])
def test_helm_lint(tmp_path: Path, values: dict[str, Any] | None) -> None:
    passed, output = lint(tmp_path, values)
    assert passed, output


@needs_helm
def test_helm_template_defaults(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert isinstance(docs, list)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment",
                     "Role", "RoleBinding", "Service", "ServiceAccount"]
    crds = {d["metadata"]["name"] for d in by_kind(docs, "CustomResourceDefinition")}
    assert crds == {"tableclusters.reptables.io", "replicatedtables.reptables.io", "tablereplicas.reptables.io",
                    "tablecollocations.reptables.io", "xdcrgroups.reptables.io", "clusterkopfpeerings.kopf.dev",
                    "kopfpeerings.kopf.dev"}
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "reptables:0.1.0"
    assert container["command"] == ["reptables"]
    assert container["args"] == operator_args(["reptables-system"], False, None)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["REPTABLES_NAMESPACE"] == "reptables-system" and env["HOME"] == "/tmp"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080, "metrics": 8081}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    _assert_hardened(pod, container)
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == "rt-reptables-operator"
    assert one(docs, "Service")["spec"]["ports"][0]["targetPort"] == "metrics"


def _assert_hardened(pod: dict[str, Any], container: dict[str, Any]) -> None:
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001 and sc["fsGroup"] == 10001
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    csc = container["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False and csc["readOnlyRootFilesystem"] is True
    assert csc["capabilities"] == {"drop": ["ALL"]}
    tmp = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/tmp"]
    assert any(v["name"] == tmp and "emptyDir" in v for v in pod["volumes"])


@needs_helm
@pytest.mark.parametrize(("all_namespaces", "replicas"), [(False, 1), (False, 2), (True, 1), (True, 3)])
def test_helm_rbac_is_exactly_the_expected_rules(tmp_path: Path, all_namespaces: bool, replicas: int) -> None:
    values = {"operator": {"replicas": replicas, "watch": {"allNamespaces": all_namespaces,
                                                         "namespaces": ["shop", "billing"]}}}
    docs = render(tmp_path, values, namespace="ops")
    assert isinstance(docs, list)
    cluster, role = expected_rbac(all_namespaces, replicas > 1)
    assert flatten_rules(one(docs, "ClusterRole")["rules"]) == cluster
    roles = by_kind(docs, "Role")
    bindings = by_kind(docs, "RoleBinding")
    if all_namespaces:
        assert roles == [] and bindings == []
    else:
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["billing", "ops", "shop"]
        for doc in roles:
            assert flatten_rules(doc["rules"]) == role
        assert sorted(b["metadata"]["namespace"] for b in bindings) == ["billing", "ops", "shop"]
    for binding in [one(docs, "ClusterRoleBinding"), *bindings]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rt-reptables-operator", "namespace": "ops"}]
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    peering = "rt-reptables" if replicas > 1 else None
    assert container["args"] == operator_args(["billing", "ops", "shop"], all_namespaces, peering)
    if replicas > 1 and all_namespaces:
        assert [d["metadata"]["name"] for d in by_kind(docs, "ClusterKopfPeering")] == ["rt-reptables"]
        assert by_kind(docs, "KopfPeering") == []
    elif replicas > 1:
        assert sorted(d["metadata"]["namespace"] for d in by_kind(docs, "KopfPeering")) == ["billing", "ops", "shop"]
    else:
        assert by_kind(docs, "KopfPeering") == by_kind(docs, "ClusterKopfPeering") == []
    strategy = one(docs, "Deployment")["spec"]["strategy"]["type"]
    assert strategy == ("RollingUpdate" if replicas > 1 else "Recreate")


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


@needs_helm
def test_helm_spark_jobs_env(tmp_path: Path) -> None:
    """REPTABLES_SPARK_JOBS is bootstrap.spark as JSON, without `enabled`, with the job image resolved."""
    docs = render(tmp_path)
    assert isinstance(docs, list)
    jobs = json.loads(_operator_env(docs)["REPTABLES_SPARK_JOBS"]["value"])
    expected = {k: v for k, v in SPARK_DEFAULTS.items() if k != "enabled"}
    assert jobs == {**expected, "image": "reptables-spark:0.1.0"}  # <image.repository>-spark:<appVersion>
    # the default image follows the operator's repository and tag; values that need quoting survive
    conf = {"spark.driver.extraJavaOptions": "-Dx=\"a b\" -Dy='c' \\ {{ not a template }} é: #"}
    values = {"image": {"repository": "registry.example.com/team/reptables", "tag": "1.2.3"},
              "bootstrap": {"spark": {"sparkConf": conf, "nodeSelector": {"pool": "spark"},
                                      "executor": {"instances": 8, "memory": "4G"}}}}
    docs = render(tmp_path, values)
    assert isinstance(docs, list)
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/team/reptables:1.2.3"
    jobs = json.loads(_operator_env(docs)["REPTABLES_SPARK_JOBS"]["value"])
    assert jobs["image"] == "registry.example.com/team/reptables-spark:1.2.3"
    assert jobs["sparkConf"] == conf and jobs["nodeSelector"] == {"pool": "spark"}
    assert jobs["executor"] == {"instances": 8, "cores": 1, "memory": "4G"}  # merged with the defaults
    assert "enabled" not in jobs
    # an explicit image is taken as it is
    docs = render(tmp_path, {"bootstrap": {"spark": {"image": "registry.example.com/jobs:7"}}})
    assert isinstance(docs, list)
    assert json.loads(_operator_env(docs)["REPTABLES_SPARK_JOBS"]["value"])["image"] == "registry.example.com/jobs:7"


@needs_helm
@pytest.mark.parametrize("all_namespaces", [False, True], ids=["namespaced", "all-namespaces"])
def test_helm_without_spark_no_launcher_no_rules(tmp_path: Path, all_namespaces: bool) -> None:
    values = {"operator": {"watch": {"allNamespaces": all_namespaces, "namespaces": ["shop"]}},
              "bootstrap": {"spark": {"enabled": False}}}
    docs = render(tmp_path, values)
    assert isinstance(docs, list)
    assert "REPTABLES_SPARK_JOBS" not in _operator_env(docs)
    cluster, role = expected_rbac(all_namespaces, peering=False, spark=False)
    assert flatten_rules(one(docs, "ClusterRole")["rules"]) == cluster
    assert all(flatten_rules(doc["rules"]) == role for doc in by_kind(docs, "Role"))
    assert len(by_kind(docs, "Role")) == (0 if all_namespaces else 2)
    # with the launcher (the default) the rules are where the namespaced custom resources are granted
    docs = render(tmp_path, merged(values, {"bootstrap": {"spark": {"enabled": True}}}))
    assert isinstance(docs, list)
    granted = flatten_rules(one(docs, "ClusterRole")["rules"]) if all_namespaces else \
        set.intersection(*(flatten_rules(doc["rules"]) for doc in by_kind(docs, "Role")))
    assert SPARK_RULES <= granted
    if not all_namespaces:
        assert not SPARK_RULES & flatten_rules(one(docs, "ClusterRole")["rules"])


@needs_helm
def test_helm_engines(tmp_path: Path) -> None:
    docs = render(tmp_path, E2E_VALUES)
    assert isinstance(docs, list)
    statefulsets = {d["metadata"]["name"]: d for d in by_kind(docs, "StatefulSet")}
    assert set(statefulsets) == {"rt-reptables-primary", "rt-reptables-remote-0", "rt-reptables-remote-1"}
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    secrets = {d["metadata"]["name"]: d for d in by_kind(docs, "Secret")}
    assert set(secrets) == {"rt-reptables-primary-token", "rt-reptables-remote-0-token"}  # remote-1: existing
    for name, secret in secrets.items():
        assert len(secret["data"]["token"]) > 40  # base64 of randAlphaNum 40
        # the operator reads only labelled Secrets, and lets only the engine's own TableCluster use it
        assert secret["metadata"]["labels"]["reptables.io/credentials"] == "true"
        assert secret["metadata"]["annotations"]["reptables.io/table-clusters"] == \
            secret["metadata"]["labels"]["reptables.io/cluster"] == name.removeprefix("rt-reptables-").removesuffix(
                "-token")
    clusters = {d["metadata"]["name"]: d for d in by_kind(docs, "TableCluster")}
    assert set(clusters) == {"primary", "remote-0", "remote-1"}
    for engine in E2E_VALUES["engines"]:
        name = f"rt-reptables-{engine['name']}"
        sts = statefulsets[name]
        assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == f"{name}-headless"
        assert services[f"{name}-headless"]["spec"]["clusterIP"] == "None"
        service = services[name]
        assert service["spec"]["ports"] == [{"name": "http", "port": 9012, "targetPort": "http", "protocol": "TCP"},
                                            {"name": "metrics", "port": 9013, "targetPort": "metrics",
                                             "protocol": "TCP"}]
        assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        assert sts["spec"]["template"]["metadata"]["labels"].items() >= service["spec"]["selector"].items()
        pod = sts["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        # the engine's XDCR id is its TableCluster's clusterId (docs/xdcr.md)
        assert container["args"] == ["engine", "serve", f"--cluster-name={engine['name']}",
                                     f"--cluster-id={engine['clusterId']}", "--data-dir=/data",
                                     "--port=9012", "--host=0.0.0.0", "--metrics-port=9013"]
        assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert pod["automountServiceAccountToken"] is False
        _assert_hardened(pod, container)
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["metadata"]["name"] == "data"
        assert claim["spec"]["resources"]["requests"]["storage"] == engine.get("storage", {}).get("size", "10Gi")
        assert claim["spec"].get("storageClassName") == engine.get("storage", {}).get("storageClass")
        token = {e["name"]: e for e in container["env"]}["REPTABLES_TOKEN"]["valueFrom"]["secretKeyRef"]
        cluster = clusters[engine["name"]]["spec"]
        assert cluster["endpoint"] == f"http://{name}.reptables-system.svc.cluster.local:9012"
        assert cluster["credentialsSecret"] == {"name": token["name"], "namespace": "reptables-system",
                                                "key": token["key"]}
        assert cluster["clusterId"] == engine["clusterId"]
        assert cluster.get("readOnly", False) == engine.get("readOnly", False)
        assert clusters[engine["name"]]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    monitors = {d["metadata"]["name"]: d for d in by_kind(docs, "ServiceMonitor")}
    assert set(monitors) == {"rt-reptables-engines", "rt-reptables-operator"}
    engines_monitor = monitors["rt-reptables-engines"]
    assert engines_monitor["metadata"]["labels"]["release"] == "prometheus"
    # the metrics listener: /metrics without a token (the API port's /metrics takes the token)
    assert engines_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert engines_monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    selector = engines_monitor["spec"]["selector"]["matchLabels"]
    scraped = [s for s in by_kind(docs, "Service") if s["metadata"]["labels"].items() >= selector.items()]
    assert sorted(s["metadata"]["name"] for s in scraped) == sorted(statefulsets)  # not the headless ones too
    operator_monitor = monitors["rt-reptables-operator"]["spec"]
    scraped = [s for s in by_kind(docs, "Service")
               if s["metadata"]["labels"].items() >= operator_monitor["selector"]["matchLabels"].items()]
    assert [s["metadata"]["name"] for s in scraped] == ["rt-reptables-operator-metrics"]


# --- PostgreSQL-backed engines --------------------------------------------------------------------------

def _engine(docs: list[dict[str, Any]], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(StatefulSet, its container) of engine ``name`` of release rt."""
    sts = one(docs, "StatefulSet", f"rt-reptables-{name}")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return sts, container


@needs_helm
def test_helm_postgresql_engine_reads_its_database_url_from_a_secret_never_from_its_arguments(tmp_path: Path) -> None:
    docs = render(tmp_path, {"engines": POSTGRESQL_ENGINES})
    assert isinstance(docs, list)
    # existingSecret: its key (uri by default); cloudnativepg: the Secret CloudNativePG makes for the owner
    expected = {"primary": ("primary-db", "uri"), "remote-0": ("dbs", "remote-0-url"),
                "remote-1": ("rt-reptables-remote-1-pg-app", "uri")}
    for engine in POSTGRESQL_ENGINES:
        sts, container = _engine(docs, engine["name"])
        env = {e["name"]: e for e in container["env"]}
        secret, key = expected[engine["name"]]
        assert env["REPTABLES_STORAGE"] == {"name": "REPTABLES_STORAGE",
                                            "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        # the URL, password included, is no argument (a command line is visible to every process of the node)
        assert container["args"] == ["engine", "serve", f"--cluster-name={engine['name']}",
                                     f"--cluster-id={engine['clusterId']}", "--data-dir=/data", "--port=9012",
                                     "--host=0.0.0.0", "--metrics-port=9013"]
        assert not [a for a in container["args"] if "storage" in a or "://" in a or "@" in a]
        # the PVC stays, small: the engine's token and its own files
        assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
        assert claim["spec"].get("storageClassName") == engine["storage"].get("storageClass")
    # the chart makes no Secret holding a database URL: the token Secrets only
    assert {(d["metadata"]["name"], tuple(d["data"])) for d in by_kind(docs, "Secret")} == {
        (f"rt-reptables-{e['name']}-token", ("token",)) for e in POSTGRESQL_ENGINES}
    # without storage.postgresql: SQLite in /data, and no REPTABLES_STORAGE
    docs = render(tmp_path, {"engines": ENGINES_DOC})
    assert isinstance(docs, list)
    for engine in ENGINES_DOC:
        _, container = _engine(docs, engine["name"])
        assert "REPTABLES_STORAGE" not in {e["name"] for e in container["env"]}


CNPG_API = "postgresql.cnpg.io/v1"
# CloudNativePG's admission webhook (not its CRD): a Cluster's name is a DNS-1035 label of at most 50 characters
CNPG_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CNPG_SPEC_EXTRA = {  # what a user adds through cloudnativepg.spec: restore from a backup, placement, monitoring
    "bootstrap": {"recovery": {"backup": {"name": "remote-2-before"}, "database": "reptables", "owner": "reptables"}},
    "postgresql": {"parameters": {"max_connections": "200", "synchronous_commit": "on"}},
    "affinity": {"enablePodAntiAffinity": True, "topologyKey": "topology.kubernetes.io/zone"},
    "monitoring": {"enablePodMonitor": True},
    "storage": {"resizeInUseVolumes": False},
}


def _cnpg_crd() -> Path:
    from tests.k8s.emulator import THIRDPARTY_DIR

    path = THIRDPARTY_DIR / "postgresql.cnpg.io_clusters.yaml"
    assert path.is_file(), f"CloudNativePG's Cluster CRD is missing at {path} (see ../shared/thirdparty/README.md)"
    return path


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _leaves(sub, f"{path}.{key}").items()}
    return {path: value}


@needs_helm
def test_helm_cloudnativepg_cluster_per_engine_passes_cloudnativepgs_crd(tmp_path: Path) -> None:
    """The Cluster the chart declares is what CloudNativePG's API takes: created through the emulator
    serving CloudNativePG's own CRD with strict field validation (an unknown field is refused, not pruned)."""
    from tests.k8s.emulator import ApiError, K8sApi

    engines = [*POSTGRESQL_ENGINES, {"name": "remote-2", "clusterId": 3, "storage": {"postgresql": {"cloudnativepg": {
        "storage": {"size": "20Gi"}, "database": "tables", "owner": "engine", "spec": CNPG_SPEC_EXTRA}}}}]
    docs = render(tmp_path, {"engines": engines})
    assert isinstance(docs, list)
    clusters = {d["metadata"]["name"]: d for d in by_kind(docs, "Cluster")}
    assert sorted(clusters) == ["rt-reptables-remote-1-pg", "rt-reptables-remote-2-pg"]  # one per cloudnativepg engine
    remote1 = clusters["rt-reptables-remote-1-pg"]
    assert remote1["apiVersion"] == CNPG_API and remote1["metadata"]["namespace"] == "reptables-system"
    assert remote1["metadata"]["labels"]["reptables.io/cluster"] == "remote-1"
    assert remote1["metadata"]["labels"]["app.kubernetes.io/component"] == "database"
    # helm uninstall keeps it, as Kubernetes keeps the engines' PVCs: deleting it deletes the data
    assert remote1["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert remote1["spec"] == {"instances": 3, "imageName": "ghcr.io/cloudnative-pg/postgresql:16.4",
                               "storage": {"size": "50Gi", "storageClass": "ssd"},
                               "bootstrap": {"initdb": {"database": "reptables", "owner": "reptables"}}}
    # spec is merged over the chart's; its bootstrap replaces initdb (CloudNativePG takes one method)
    remote2 = clusters["rt-reptables-remote-2-pg"]["spec"]
    assert remote2 == {**CNPG_SPEC_EXTRA, "instances": 1, "storage": {"size": "20Gi", "resizeInUseVolumes": False}}
    for name in clusters:
        assert CNPG_NAME.match(name) and len(name) <= 50, name
    with K8sApi(namespaces=["reptables-system"], crd_dirs=[], crd_files=[_cnpg_crd()]) as api:
        for name, cluster in clusters.items():
            created = api.create(cluster, fieldValidation="Strict")
            kept = _leaves(created["spec"])
            assert {k: kept.get(k) for k in _leaves(cluster["spec"])} == _leaves(cluster["spec"]), name
        # the check is not vacuous: what CloudNativePG's API refuses is refused here
        for mutate, error in ((lambda c: c["spec"].update(instance=3), 'unknown field "spec.instance"'),
                              (lambda c: c["spec"].update(instances=0), "spec.instances"),
                              (lambda c: c["spec"]["storage"].update(size=20), "spec.storage.size"),
                              (lambda c: c["spec"]["bootstrap"]["initdb"].update(dbname="x"),
                               'unknown field "spec.bootstrap.initdb.dbname"')):
            broken = json.loads(json.dumps(remote1))
            broken["metadata"]["name"] = "broken"
            mutate(broken)
            with pytest.raises(ApiError) as refused:
                api.create(broken, fieldValidation="Strict")
            assert error in str(refused.value), refused.value


# --- HA table clusters: a leader and standby pods ----------------------------------------------------


def _pod_dns_name(sts: dict[str, Any], ordinal: int, namespace: str = "reptables-system") -> str:
    """The DNS name Kubernetes gives pod ``ordinal`` of a StatefulSet: <pod>.<serviceName>.<ns>.svc.<domain>."""
    return f"{sts['metadata']['name']}-{ordinal}.{sts['spec']['serviceName']}.{namespace}.svc.cluster.local"


@needs_helm
def test_helm_ha_engines_run_a_leader_and_standbys(tmp_path: Path) -> None:
    """``ha``: N engine pods of one table cluster, ``--standby`` over its one database, readiness = leadership
    (the ClusterIP Service, the TableCluster's endpoint, reaches the leader only), each pod advertising
    its own address, updates a person (or the operator) makes pod by pod, a PodDisruptionBudget and
    anti-affinity. An engine without ``ha`` is what it was."""
    from reptables.operator.cli import app

    docs = render(tmp_path, {"engines": HA_ENGINES})
    assert isinstance(docs, list)
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    pdbs = {d["metadata"]["name"]: d for d in by_kind(docs, "PodDisruptionBudget")}
    assert sorted(pdbs) == ["rt-reptables-meta", "rt-reptables-remote-0"]  # the HA engines only
    serve = typer.main.get_command(app).commands["engine"].commands["serve"]  # type: ignore[attr-defined]
    for engine in HA_ENGINES[:2]:
        name, replicas = f"rt-reptables-{engine['name']}", engine["ha"]["replicas"]
        sts, container = _engine(docs, engine["name"])
        spec = sts["spec"]
        assert spec["replicas"] == replicas
        # a standby is never Ready: OrderedReady would not start (or restart) pod 1 while pod 0 stands
        # by, and a RollingUpdate would wait for the first standby it replaced forever
        assert spec["podManagementPolicy"] == "Parallel" and spec["updateStrategy"] == {"type": "OnDelete"}
        pod_labels = spec["template"]["metadata"]["labels"]
        # the command line: --standby, the lease, this pod's own address (expanded by the kubelet)
        lease = [f"--leader-lease={engine['ha']['leaderLease']}"] if "leaderLease" in engine["ha"] else []
        advertise = f"--advertise-url=http://$(POD_NAME).{name}-headless.reptables-system.svc.cluster.local:9012"
        assert container["args"] == ["engine", "serve", f"--cluster-name={engine['name']}",
                                     f"--cluster-id={engine['clusterId']}", "--data-dir=/data", "--port=9012",
                                     "--host=0.0.0.0", "--metrics-port=9013", "--standby", *lease, advertise]
        ctx = serve.make_context("serve", container["args"][2:])  # parsed and validated, nothing invoked
        assert ctx.params["standby"] is True and ctx.params["advertise_url"].startswith("http://$(POD_NAME).")
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_NAME"] == {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        names = [e["name"] for e in container["env"]]
        assert names.index("POD_NAME") >= 0 and "REPTABLES_STORAGE" in env  # (the URL from its Secret, as before)
        # the advertised address is each pod's DNS name: the headless Service governs the StatefulSet and
        # publishes its pods also while they are not ready (a standby is named by its peers while standing by)
        headless = services[f"{name}-headless"]
        assert spec["serviceName"] == headless["metadata"]["name"]
        assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
        assert pod_labels.items() >= headless["spec"]["selector"].items()
        for ordinal in range(replicas):
            pod = f"{name}-{ordinal}"
            assert advertise.removeprefix("--advertise-url=").replace("$(POD_NAME)", pod) == \
                f"http://{_pod_dns_name(sts, ordinal)}:9012"
        # readiness is leadership (a standby answers /readyz 503): the Service selecting the pods reaches
        # the leader only, looked at every second; liveness stays /healthz (a standby is alive)
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["readinessProbe"]["periodSeconds"] == 1
        assert container["livenessProbe"]["httpGet"]["path"] == container["startupProbe"]["httpGet"]["path"] == \
            "/healthz"
        service = services[name]
        assert service["spec"]["selector"] == spec["selector"]["matchLabels"] and "publishNotReadyAddresses" not in \
            service["spec"]
        table_cluster = one(docs, "TableCluster", engine["name"])["spec"]
        assert table_cluster["endpoint"] == f"http://{name}.reptables-system.svc.cluster.local:9012"
        # every pod's advertised address, for status.leadership (who leads, who stands by)
        assert table_cluster["members"] == [f"http://{_pod_dns_name(sts, i)}:9012" for i in range(replicas)]
        # the CloudNativePG Cluster whose currentPrimary the status shows (none with a database of your own)
        if "cloudnativepg" in engine["storage"]["postgresql"]:
            assert table_cluster["databaseCluster"] == {"name": f"{name}-pg", "namespace": "reptables-system"}
            assert one(docs, "Cluster", f"{name}-pg")["metadata"]["namespace"] == "reptables-system"
        else:
            assert "databaseCluster" not in table_cluster
        # voluntary disruptions never take the leader, the one Ready pod
        pdb = pdbs[name]
        assert pdb["metadata"]["namespace"] == "reptables-system"
        assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}
        others = [d for d in by_kind(docs, "StatefulSet") if d is not sts]
        assert not [o for o in others if o["spec"]["template"]["metadata"]["labels"].items()
                    >= pdb["spec"]["selector"]["matchLabels"].items()], "the budget covers this engine's pods only"
        # anti-affinity: the pods of one table cluster on different nodes (or zones)
        anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
        if engine["ha"].get("antiAffinity", "required") == "required":
            (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        else:
            (weighted,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
            assert weighted["weight"] == 100
            term = weighted["podAffinityTerm"]
        assert term["topologyKey"] == engine["ha"].get("topologyKey", "kubernetes.io/hostname")
        assert term["labelSelector"] == {"matchLabels": spec["selector"]["matchLabels"]}
        # one PVC per pod (the token and the engine's own files), from the template
        (claim,) = spec["volumeClaimTemplates"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
        _assert_hardened(spec["template"]["spec"], container)
    # an engine without ha: one pod, a rolling update, no standby, no budget, no anti-affinity
    assert not {"members", "databaseCluster"} & set(one(docs, "TableCluster", "remote-1")["spec"])
    sts, container = _engine(docs, "remote-1")
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert "podManagementPolicy" not in sts["spec"] and "affinity" not in sts["spec"]["template"]["spec"]
    assert not [a for a in container["args"] if a.startswith(("--standby", "--advertise-url", "--leader-lease"))]
    assert "POD_NAME" not in {e["name"] for e in container["env"]}
    assert container["readinessProbe"]["periodSeconds"] == 5
    # an affinity of the engine's own is kept, and the anti-affinity added unless it has one
    node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}
    own_anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "rack", "labelSelector": {"matchLabels": {"a": "b"}}}}]}}
    engines = [{**HA_ENGINES[0], "affinity": node}, {**HA_ENGINES[1], "affinity": own_anti}]
    docs = render(tmp_path, {"engines": engines, "tls": {"secretName": "reptables-tls"}})
    assert isinstance(docs, list)
    meta, container = _engine(docs, "meta")
    affinity = meta["spec"]["template"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node["nodeAffinity"] and "requiredDuringSchedulingIgnoredDuringExecution" in \
        affinity["podAntiAffinity"]
    assert _engine(docs, "remote-0")[0]["spec"]["template"]["spec"]["affinity"] == own_anti
    # with TLS the advertised address is https (the certificate must name the pods: docs/install.md)
    assert container["args"][-1] == \
        "--advertise-url=https://$(POD_NAME).rt-reptables-meta-headless.reptables-system.svc.cluster.local:9012"


#: status.leadership of an HA engine on a CloudNativePG Cluster: its currentPrimary (operator/cnpg.py)
CNPG_RULES: set[Rule] = {("postgresql.cnpg.io", "clusters", "get")}


@needs_helm
@pytest.mark.parametrize("all_namespaces", [False, True], ids=["namespaced", "all-namespaces"])
def test_helm_rbac_grants_get_on_cloudnativepg_clusters_only_for_ha_engines_on_one(
        tmp_path: Path, all_namespaces: bool) -> None:
    """The operator reads the currentPrimary of an HA engine's CloudNativePG Cluster: get, on clusters of
    postgresql.cnpg.io, in the release namespace (where the chart makes them), by a Role of its own - and
    nothing of the kind without such an engine."""
    watch = {"operator": {"watch": {"allNamespaces": all_namespaces, "namespaces": ["shop"]}}}
    docs = render(tmp_path, {**watch, "engines": HA_ENGINES}, namespace="ops")
    assert isinstance(docs, list)
    role = one(docs, "Role", "rt-reptables-operator-databases")
    assert role["metadata"]["namespace"] == "ops" and flatten_rules(role["rules"]) == CNPG_RULES
    binding = one(docs, "RoleBinding", "rt-reptables-operator-databases")
    assert binding["metadata"]["namespace"] == "ops"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "rt-reptables-operator-databases"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rt-reptables-operator", "namespace": "ops"}]
    # the other rules are unchanged, and CloudNativePG is granted nowhere else
    cluster, roles = expected_rbac(all_namespaces, peering=False)
    assert flatten_rules(one(docs, "ClusterRole")["rules"]) == cluster
    for other in by_kind(docs, "Role"):
        if other is not role:
            assert flatten_rules(other["rules"]) == roles
    # PostgreSQL without ha, a database of your own with ha, or no TableClusters made: no such Role
    own_database = [HA_ENGINES[1], HA_ENGINES[2]]
    for values in ({"engines": POSTGRESQL_ENGINES}, {"engines": own_database},
                   {"engines": HA_ENGINES, "tableClusters": {"create": False}}):
        docs = render(tmp_path, {**watch, **values}, namespace="ops")
        assert isinstance(docs, list)
        assert not [d for d in by_kind(docs, "Role") + by_kind(docs, "ClusterRole")
                    if CNPG_RULES & flatten_rules(d["rules"])], values


@needs_helm
def test_helm_ha_engine_cloudnativepg_cluster_has_a_synchronous_standby(tmp_path: Path) -> None:
    """An HA engine's CloudNativePG Cluster: at least two instances and synchronous replication (a COMMIT
    answered once a standby has it, a failover only to such a standby), accepted by CloudNativePG's CRD."""
    from tests.k8s.emulator import K8sApi

    extra = {"postgresql": {"parameters": {"max_connections": "200"}}}
    engines = [HA_ENGINES[0], {"name": "meta-2", "clusterId": 3, "ha": {"replicas": 2}, "storage": {"postgresql": {
        "cloudnativepg": {"instances": 2, "storage": {"size": "20Gi"}, "spec": extra}}}}, POSTGRESQL_ENGINES[2]]
    docs = render(tmp_path, {"engines": engines})
    assert isinstance(docs, list)
    clusters = {d["metadata"]["name"]: d for d in by_kind(docs, "Cluster")}
    synchronous = {"method": "any", "number": 1, "dataDurability": "required"}
    assert clusters["rt-reptables-meta-pg"]["spec"] == {
        "instances": 3, "storage": {"size": "50Gi"}, "postgresql": {"synchronous": synchronous},
        "bootstrap": {"initdb": {"database": "reptables", "owner": "reptables"}}}
    # the values' spec is merged over it, map by map
    assert clusters["rt-reptables-meta-2-pg"]["spec"]["postgresql"] == {
        "synchronous": synchronous, "parameters": {"max_connections": "200"}}
    # an engine without ha: the Cluster as before (its spec may ask for synchronous replication itself)
    assert "postgresql" not in clusters["rt-reptables-remote-1-pg"]["spec"]
    with K8sApi(namespaces=["reptables-system"], crd_dirs=[], crd_files=[_cnpg_crd()]) as api:
        for name, cluster in clusters.items():
            created = api.create(cluster, fieldValidation="Strict")
            kept = _leaves(created["spec"])
            assert {k: kept.get(k) for k in _leaves(cluster["spec"])} == _leaves(cluster["spec"]), name


@needs_helm
@pytest.mark.parametrize(("engine", "schema_message", "template_message"), [
    ({"name": "meta", "clusterId": 0, "ha": {"replicas": 2}},
     f"at '/engines/0/ha': value must be '{HA_NEEDS_POSTGRESQL}'", f'engines: "meta": ha {HA_NEEDS_POSTGRESQL}'),
    ({"name": "meta", "clusterId": 0, "ha": {"replicas": 2}, "storage": {"postgresql": {"cloudnativepg": {
        "instances": 1, "storage": {"size": "1Gi"}}}}},
     "at '/engines/0/storage/postgresql/cloudnativepg/instances': minimum: got 1, want 2",
     'engines: "meta": ha needs storage.postgresql.cloudnativepg.instances of 2 or more'),
], ids=["sqlite", "one-instance"])
def test_helm_refuses_ha_without_a_postgresql_that_survives_its_primary(
        tmp_path: Path, engine: dict[str, Any], schema_message: str, template_message: str) -> None:
    """HA on SQLite, or on a CloudNativePG Cluster of one instance: refused by the schema with a message
    naming what is missing, and by the chart's own check when the schema is skipped."""
    error = render(tmp_path, {"engines": [engine]}, check=False)
    assert isinstance(error, str) and schema_message in error, error
    # the chart without its schema (as `helm template --skip-schema-validation` renders it; `helm lint`
    # only logs a template's `fail`)
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    if HELM is None:
        assert helm_python is not None
        with pytest.raises(helm_python.HelmError) as refused, helm_python.Chart.load(str(chart)) as unchecked:
            unchecked.render({"engines": [engine]}, name="rt", namespace="reptables-system", is_install=True)
        text = str(refused.value)
    else:
        (tmp_path / "ha.yaml").write_text(yaml.safe_dump({"engines": [engine]}))
        text = helm("template", "rt", str(chart), "--values", str(tmp_path / "ha.yaml"), check=False).stderr
    assert template_message in text, text


def _admits(policy: dict[str, Any], pod_labels: dict[str, str], namespace_labels: dict[str, str],
            same_namespace: bool, port: int) -> bool:
    """Whether a NetworkPolicy's ingress rules let a pod with these labels, in a namespace with these labels, in."""
    def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
        assert set(selector) <= {"matchLabels"}, selector  # all this test's selectors use
        return labels.items() >= (selector.get("matchLabels") or {}).items()

    for rule in policy["spec"]["ingress"]:
        if not any(p.get("port") == port for p in rule.get("ports", [{"port": port}])):
            continue
        for peer in rule.get("from", []):
            in_namespace = (matches(peer["namespaceSelector"], namespace_labels) if "namespaceSelector" in peer
                            else same_namespace)
            if in_namespace and matches(peer.get("podSelector", {}), pod_labels):
                return True
    return False


@needs_helm
def test_helm_network_policy_admits_only_the_operator_the_engines_and_the_clients(tmp_path: Path) -> None:
    docs = render(tmp_path, E2E_VALUES)
    assert isinstance(docs, list)
    policy = one(docs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "reptables-system"
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    engines = by_kind(docs, "StatefulSet")
    selected = [e for e in engines if e["spec"]["template"]["metadata"]["labels"].items()
                >= policy["spec"]["podSelector"]["matchLabels"].items()]
    assert len(selected) == len(engines) == 3  # every engine pod is covered
    operator_pod = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    engine_pod = engines[0]["spec"]["template"]["metadata"]["labels"]
    release_ns = {"kubernetes.io/metadata.name": "reptables-system"}
    shop = {"kubernetes.io/metadata.name": "shop"}
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert _admits(policy, operator_pod, release_ns, True, 9012)
    assert _admits(policy, engine_pod, release_ns, True, 9012)
    assert _admits(policy, {"app": "web"}, shop, False, 9012)  # a client namespace
    assert _admits(policy, {"app.kubernetes.io/name": "prometheus"}, monitoring, False, 9012)
    assert not _admits(policy, {"app": "grafana"}, monitoring, False, 9012)  # only the pods selected there
    assert not _admits(policy, {"app": "web"}, {"kubernetes.io/metadata.name": "other"}, False, 9012)
    assert not _admits(policy, {"app": "debug"}, release_ns, True, 9012)  # not even in the release namespace
    assert not _admits(policy, operator_pod, release_ns, True, 8080)  # only the engines' port
    # another release's operator (same namespace, other instance label) is not ours
    assert not _admits(policy, {**operator_pod, "app.kubernetes.io/instance": "other"}, release_ns, True, 9012)


@needs_helm
def test_helm_network_policy_is_on_by_default_and_can_be_switched_off(tmp_path: Path) -> None:
    engines = {"engines": [{"name": "primary", "clusterId": 0}]}
    docs = render(tmp_path, engines)
    assert isinstance(docs, list)
    policy = one(docs, "NetworkPolicy")
    assert [len(rule["from"]) for rule in policy["spec"]["ingress"]] == [2]  # the operator and the engines only
    off = render(tmp_path, {**engines, "networkPolicy": {"enabled": False}})
    assert isinstance(off, list) and by_kind(off, "NetworkPolicy") == []


@needs_helm
def test_helm_credentials_namespaces_are_watched_and_passed_to_the_operator(tmp_path: Path) -> None:
    docs = render(tmp_path, {"operator": {"credentials": {"namespaces": ["vault", "reptables-system"]}}})
    assert isinstance(docs, list)
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == operator_args(["reptables-system", "vault"], False, None, credentials=("vault",))
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["reptables-system", "vault"]


@needs_helm
def test_rendered_custom_resources_pass_the_api_servers_validation(tmp_path: Path) -> None:
    """TableClusters and kopf peering objects go through the emulator: CRD schema and CEL rules."""
    from tests.k8s.emulator import K8sApi

    docs = render(tmp_path, E2E_VALUES)
    assert isinstance(docs, list)
    custom = [d for d in docs if d["apiVersion"] in (API, "kopf.dev/v1")]
    assert sorted(d["kind"] for d in custom) == ["KopfPeering"] * 3 + ["TableCluster"] * 3  # 3 watched namespaces
    with K8sApi(namespaces=["reptables-system", "shop", "vault"]) as api:
        for doc in custom:
            created = api.create(doc)
            assert created.get("spec", {}).items() >= doc.get("spec", {}).items()


@needs_helm
def test_rendered_command_lines_are_accepted_by_the_cli(tmp_path: Path) -> None:
    from reptables.operator.cli import app

    command = typer.main.get_command(app)
    docs = render(tmp_path, merged(E2E_VALUES, {"operator": {"verbose": True}}))
    assert isinstance(docs, list)
    containers = [c for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                  for c in d["spec"]["template"]["spec"]["containers"]]
    assert len(containers) == 4
    for container in containers:
        assert container["command"] == ["reptables"]
        args = container["args"]
        sub, words = command.commands[args[0]], args[1:]
        if hasattr(sub, "commands"):  # engine serve
            sub, words = sub.commands[words[0]], words[1:]
        ctx = sub.make_context(args[0], list(words))  # parses and validates, invokes nothing
        assert ctx.params, args
        assert set(ctx.params) >= {"standalone", "peering", "liveness", "metrics_port", "verbose"} or \
            set(ctx.params) >= {"cluster_name", "data_dir", "port", "host"}, ctx.params


@needs_helm
@pytest.mark.parametrize(("values", "message"), [
    ({"engines": [{"name": "a", "clusterId": 1}, {"name": "a", "clusterId": 2}]}, 'the name "a" is used twice'),
    ({"engines": [{"name": "a", "clusterId": 1}, {"name": "b", "clusterId": 1}]}, "clusterId 1 is used by"),
    ({"engines": [{"name": "a", "clusterId": 300}]}, "values don't meet the specifications of the schema"),
    ({"operator": {"replicas": "two"}}, "values don't meet the specifications of the schema"),
    ({"engines": [{"name": "a", "clusterId": 1, "storage": {"postgresql": {
        "existingSecret": {"name": "db"}, "cloudnativepg": {"storage": {"size": "1Gi"}}}}}]},
     "values don't meet the specifications of the schema"),
    # CloudNativePG's webhook takes Cluster names of at most 50 characters that start with a letter
    ({"fullnameOverride": "a-rather-long-name-for-the-release", "engines": [{
        "name": "remote-primary", "clusterId": 1, "storage": {"postgresql": {"cloudnativepg": {
            "storage": {"size": "1Gi"}}}}}]},
     'engines: "remote-primary": its CloudNativePG Cluster would be named '
     '"a-rather-long-name-for-the-release-remote-primary-pg", but CloudNativePG takes only names of at most 50 '
     'characters that start with a letter'),
    ({"fullnameOverride": "0reptables", "engines": [{"name": "a", "clusterId": 1, "storage": {"postgresql": {
        "cloudnativepg": {"storage": {"size": "1Gi"}}}}}]},
     'its CloudNativePG Cluster would be named "0reptables-a-pg"'),
])
def test_helm_refuses_bad_values(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    error = render(tmp_path, values, check=False)
    assert isinstance(error, str) and message in error, error


# --- Dockerfile and the kind e2e script ------------------------------------------------------------


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM ${PYTHON_IMAGE} AS build",
                                                                   "FROM ${PYTHON_IMAGE}"]
    final = text[text.rindex("FROM ${PYTHON_IMAGE}"):]
    assert "ARG UID=10001" in final and 'USER ${UID}:${GID}' in final
    assert 'ENTRYPOINT ["reptables"]' in final and 'CMD ["operator", "--all-namespaces"]' in final
    assert "HOME=/tmp" in final
    assert not re.search(r"apt-get|gcc|build-essential", text), "no compilers: every dependency has wheels"
    assert "pip install /src" in text
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = set(re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M))
    sources = {word.rstrip("/") for line in copied for word in line.split()}
    needed = {*pyproject["tool"]["setuptools"]["package-dir"].values(), "pyproject.toml",
              pyproject["project"]["readme"]}
    assert sources == needed
    ignored = [p.strip().rstrip("/") for p in (ROOT / ".dockerignore").read_text().splitlines()
               if p.strip() and not p.startswith("#")]
    assert not needed & set(ignored)
    assert {".venv", ".git", "tests"} <= set(ignored)


def test_dockerfile_spark() -> None:
    """The SparkApplications' job image: Spark's image, PySpark from it (no pip pyspark), non-root."""
    text = (ROOT / "Dockerfile.spark").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "ARG SPARK_IMAGE=apache/spark:4.0.1-java17" in lines
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM ${SPARK_IMAGE}"]
    assert SPARK_DEFAULTS["sparkVersion"] == "4.0.1"  # bootstrap.spark.sparkVersion is the image's Spark
    users = [line for line in lines if line.startswith("USER ")]
    assert users[0] == "USER root" and users[-1] == "USER 185", users  # back to Spark's user
    assert "docker build -f Dockerfile.spark -t reptables-spark:0.1.0 ." in text
    main = SPARK_DEFAULTS["mainApplicationFile"].removeprefix("local://")
    assert f"COPY sparkapps/sparkapp.py {main}" in lines
    runs = text.replace("\\\n", " ")  # continuation lines joined
    installs = [line for line in runs.splitlines() if "pip install" in line]
    assert installs and not any(re.search(r"pyspark|\[spark\]", line) for line in installs), installs
    assert any("pip install /src" in line and "pyarrow" in line for line in installs)
    assert "python3.11 -m venv /opt/reptables" in runs and re.search(r"apt-get install .*python3\.11-venv", runs)
    assert "PYTHONPATH=/opt/spark/python:/opt/spark/python/lib/py4j.zip" in text and "*" not in re.search(
        r"PYTHONPATH=\S+", text)[0]
    assert re.search(r"ln -s \S+ /opt/spark/python/lib/py4j\.zip", runs)
    assert "PYSPARK_PYTHON=/opt/reptables/bin/python" in text
    assert "PYSPARK_DRIVER_PYTHON=/opt/reptables/bin/python" in text
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {word.rstrip("/") for line in re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M)
              for word in line.split()}
    needed = {*pyproject["tool"]["setuptools"]["package-dir"].values(), "pyproject.toml",
              pyproject["project"]["readme"]}
    assert copied == needed | {"sparkapps/sparkapp.py"}


def test_e2e_kind_script() -> None:
    script = ROOT / "hack" / "e2e-kind.sh"
    text = script.read_text()
    assert os.access(script, os.X_OK)
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text and "trap " in text
    for tool in ("docker", "kind", "kubectl", "helm"):
        assert f"need {tool}" in text or re.search(rf"for tool in [^\n]*\b{tool}\b", text), tool
    for word in ("kind create cluster", "kind load docker-image", "helm upgrade --install",
                 "kubectl wait --for=condition=Ready", "kind delete cluster"):
        assert word in text, word
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


# --- metrics: the Grafana dashboard ConfigMap, the PrometheusRule, the generated README -------------

ALERTS = {"ReptablesReplicationLagHigh", "ReptablesNoSyncReplica", "ReptablesReplicatorErrors",
          "ReptablesBootstrapFailed"}


@needs_helm
def test_helm_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert isinstance(docs, list)
    cm = one(docs, "ConfigMap", "rt-reptables-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["reptables.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "reptables.json").read_text())
    assert dashboard["uid"] == "reptables" and dashboard["title"] == "reptables"
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in ("Replication lag per replica", "Rows behind", "Pushes and push errors",
                   "Queue depth and trimmed rows", "Two-phase commit latency (p50 / p99)", "Tracker switches",
                   "Bootstrap progress"):
        assert wanted in titles
    assert not by_kind(docs, "PrometheusRule")  # off by default, like the ServiceMonitors
    # helm merges maps: another sidecar label is added, and null removes the default one
    labels = {"dashboards": "reptables", "grafana_dashboard": None}
    custom = render(tmp_path, {"metrics": {"dashboard": {"labels": labels, "namespace": "monitoring"}}})
    assert isinstance(custom, list)
    cm = one(custom, "ConfigMap", "rt-reptables-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["dashboards"] == "reptables" and "grafana_dashboard" not in cm["metadata"]["labels"]
    off = render(tmp_path, {"metrics": {"dashboard": {"enabled": False}}})
    assert isinstance(off, list) and not [d for d in by_kind(off, "ConfigMap") if "dashboard" in d["metadata"]["name"]]


@needs_helm
def test_helm_prometheus_rule_has_the_alerts_with_the_configured_thresholds(tmp_path: Path) -> None:
    docs = render(tmp_path, {"metrics": {"prometheusRule": {
        "enabled": True, "labels": {"release": "kps"}, "replicationLagSeconds": 120, "replicationLagFor": "3m",
        "severity": {"noSyncReplica": "warning"}}}})
    assert isinstance(docs, list)
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    rules = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(rules) == ALERTS
    for alert in rules.values():
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        assert alert["labels"]["severity"] in ("critical", "warning")
        assert alert["expr"].count("(") == alert["expr"].count(")")
        assert "{{ $labels." in alert["annotations"]["summary"]  # Prometheus' templating survives helm's
    lag = rules["ReptablesReplicationLagHigh"]
    assert lag["expr"].endswith("> 120") and lag["for"] == "3m"
    assert rules["ReptablesNoSyncReplica"]["labels"]["severity"] == "warning"
    passed, output = lint(tmp_path, {"metrics": {"prometheusRule": {"enabled": True}}})
    assert passed, output


@pytest.mark.parametrize("values, message", [
    ({"metrics": {"prometheusRule": {"enabled": True, "replicationLagFor": "five minutes"}}}, "replicationLagFor"),
    ({"metrics": {"prometheusRule": {"enabled": True, "replicationLagSeconds": 0}}}, "replicationLagSeconds"),
    ({"metrics": {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
])
def test_schema_rejects_bad_metrics_values(values: dict[str, Any], message: str) -> None:
    errors = list(schema_validator().iter_errors(merged(load_values(), values)))
    assert errors and any(message in (str(list(e.absolute_path)) + e.message) for e in errors), errors


def test_chart_readme_values_table_is_generated_from_values_yaml() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "gen-chart-readme"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + "\nrun hack/gen-chart-readme"
    readme = (CHART / "README.md").read_text()
    for key in ("metrics.prometheusRule.replicationLagSeconds", "metrics.dashboard.labels", "serviceMonitor.enabled"):
        assert f"| `{key}` |" in readme


# --- built-in objects against the Kubernetes OpenAPI schemas -----------------------------------------
# `helm lint` checks only YAML and apiVersion/kind; a misspelt or misplaced field (`volumeMount`,
# `securityContext` one level too high) renders fine and is dropped or refused by the API server at
# install time. kubernetes-validate ships the OpenAPI schemas of each Kubernetes version as JSON
# schemas; its strict variant rejects unknown fields, as `kubectl apply --validate=strict` does.

# the oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the package knows
OLDEST_KUBERNETES = "1.25"
# API groups of custom resources: no OpenAPI schema in Kubernetes itself. reptables.io and kopf.dev
# objects go through the emulator's CRD validation (test_rendered_custom_resources_...), the
# Prometheus Operator's through _check_prometheus_operator_object, SparkApplications through
# tests/operator/test_sparkapplication.py (the operator creates them, the chart does not), CloudNativePG
# Clusters through the emulator serving CloudNativePG's CRD (test_helm_cloudnativepg_cluster_...).
CUSTOM_RESOURCE_GROUPS = {"reptables.io", "kopf.dev", "monitoring.coreos.com", "sparkoperator.k8s.io",
                          "postgresql.cnpg.io"}


def _api_group(doc: dict[str, Any]) -> str:
    api_version = str(doc.get("apiVersion", ""))
    return api_version.split("/")[0] if "/" in api_version else ""


def kubernetes_schema_errors(doc: dict[str, Any], version: str) -> list[str]:
    """Why Kubernetes ``version`` would refuse this built-in object (strict: unknown fields too); [] if valid.

    A kind/apiVersion the version does not serve (e.g. policy/v1beta1 after 1.25) is an error, not a skip."""
    import kubernetes_validate  # the test extra; imported here so that the rest of the module runs without

    name = f"{doc.get('kind')} {doc.get('metadata', {}).get('namespace', '')}/{doc.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.absolute_path) or "<root>"
        return [f"{name} (Kubernetes {exc.version}): {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{name}: {exc.message}"]
    return []


def _kubernetes_versions() -> list[str]:
    import kubernetes_validate

    newest = kubernetes_validate.latest_version()
    assert newest.split(".")[:2] >= ["1", "31"], newest  # kubernetes-validate>=1.31 (pyproject.toml)
    return [OLDEST_KUBERNETES, newest]


# Prometheus Operator (monitoring.coreos.com/v1) fields of what the chart renders: a subset of the
# ServiceMonitor and PrometheusRule CRDs' schemas, closed so that a misspelt key is caught.
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                           r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_SELECTOR = {"type": "object", "additionalProperties": False,
                   "properties": {"matchLabels": _STRING_MAP, "matchExpressions": {"type": "array"}}}
SERVICE_MONITOR_SPEC = {
    "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
    "properties": {
        "jobLabel": {"type": "string"}, "targetLabels": {"type": "array"}, "podTargetLabels": {"type": "array"},
        "sampleLimit": {"type": "integer"}, "targetLimit": {"type": "integer"}, "attachMetadata": {"type": "object"},
        "scrapeClass": {"type": "string"},
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "additionalProperties": False,
                              "properties": {"any": {"type": "boolean"},
                                             "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "anyOf": [{"required": ["port"]},
                                                                       {"required": ["targetPort"]}],
            "properties": {
                "port": {"type": "string"}, "targetPort": {"type": ["string", "integer"]}, "path": {"type": "string"},
                "scheme": {"enum": ["http", "https"]}, "interval": _DURATION, "scrapeTimeout": _DURATION,
                "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
                "params": {"type": "object"}, "tlsConfig": {"type": "object"}, "authorization": {"type": "object"},
                "bearerTokenSecret": {"type": "object"}, "basicAuth": {"type": "object"},
                "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"},
                "followRedirects": {"type": "boolean"}, "enableHttp2": {"type": "boolean"},
                "filterRunning": {"type": "boolean"}}}}}}
PROMETHEUS_RULE_SPEC = {
    "type": "object", "additionalProperties": False, "required": ["groups"],
    "properties": {"groups": {"type": "array", "minItems": 1, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "rules"],
        "properties": {
            "name": {"type": "string", "minLength": 1}, "interval": _DURATION, "labels": _STRING_MAP,
            "limit": {"type": "integer"}, "query_offset": _DURATION, "partial_response_strategy": {"type": "string"},
            "rules": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["expr"],
                "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                "properties": {"alert": {"type": "string", "minLength": 1}, "record": {"type": "string"},
                               "expr": {"type": "string", "minLength": 1}, "for": _DURATION,
                               "keep_firing_for": _DURATION, "labels": _STRING_MAP,
                               "annotations": _STRING_MAP}}}}}}}}


def _check_prometheus_operator_object(doc: dict[str, Any]) -> None:
    """Structural check of a ServiceMonitor or PrometheusRule (no Prometheus Operator CRDs here)."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1", doc["apiVersion"]
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}, sorted(doc)
    errors = kubernetes_schema_errors({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                      OLDEST_KUBERNETES)  # ObjectMeta: the one Kubernetes part of them
    assert not errors, errors
    schema = {"ServiceMonitor": SERVICE_MONITOR_SPEC, "PrometheusRule": PROMETHEUS_RULE_SPEC}[doc["kind"]]
    problems = [f"{doc['kind']} {doc['metadata']['name']}: spec.{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(doc["spec"])]
    assert not problems, problems


ENGINES_DOC = [{"name": "primary", "clusterId": 0},  # docs/install.md, values-engines.yaml
               {"name": "remote-0", "clusterId": 1, "storage": {"size": "50Gi", "storageClass": "fast-ssd"}},
               {"name": "remote-1", "clusterId": 2, "existingSecret": {"name": "remote-1-token", "key": "token"}}]
_BASE_KINDS = {"ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment", "Role",
               "RoleBinding", "Service", "ServiceAccount"}
_ENGINE_KINDS = {"StatefulSet", "Secret", "NetworkPolicy"}
# (values, the built-in kinds the variant renders): every documented mode of the chart
SCHEMA_VARIANTS: dict[str, tuple[dict[str, Any] | None, set[str]]] = {
    "defaults": (None, _BASE_KINDS),
    "engines": ({"engines": ENGINES_DOC}, _BASE_KINDS | _ENGINE_KINDS),
    "engines-ha": (E2E_VALUES, _BASE_KINDS | _ENGINE_KINDS),
    "watched-namespaces": ({"operator": {"watch": {"namespaces": ["shop", "billing"]},
                                         "credentials": {"namespaces": ["vault"]}}}, _BASE_KINDS),
    "all-namespaces": ({"operator": {"watch": {"allNamespaces": True}}},
                       _BASE_KINDS - {"Role", "RoleBinding"}),
    "all-namespaces-ha": ({"operator": {"replicas": 3, "watch": {"allNamespaces": True}}},
                          _BASE_KINDS - {"Role", "RoleBinding"}),
    "tls": ({"engines": ENGINES_DOC, "tls": {"secretName": "reptables-tls"}}, _BASE_KINDS | _ENGINE_KINDS),
    "no-spark": ({"bootstrap": {"spark": {"enabled": False}}}, _BASE_KINDS),
    "postgresql": ({"engines": POSTGRESQL_ENGINES}, _BASE_KINDS | _ENGINE_KINDS),
    "ha-engines": ({"engines": HA_ENGINES, "tls": {"secretName": "reptables-tls"}},
                   _BASE_KINDS | _ENGINE_KINDS | {"PodDisruptionBudget"}),
    "monitoring": ({"engines": ENGINES_DOC[:1], "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                    "metrics": {"prometheusRule": {"enabled": True},
                                "dashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "DB"}}}},
                   _BASE_KINDS | _ENGINE_KINDS),
    # every optional knob of values.yaml that lands in a built-in object
    "customized": ({"imagePullSecrets": [{"name": "regcred"}], "image": {"pullPolicy": "Always", "tag": "1.2.3"},
                    "fullnameOverride": "tables",
                    "operator": {"verbose": True, "extraArgs": ["--verbose"],
                                 "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                                              {"name": "NODE",
                                               "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                                 "nodeSelector": {"pool": "ops"}, "priorityClassName": "high",
                                 "tolerations": [{"key": "ops", "operator": "Exists", "effect": "NoSchedule"}],
                                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                     "nodeSelectorTerms": [{"matchExpressions": [
                                         {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
                                 "podAnnotations": {"team": "data"}, "podLabels": {"team": "data"},
                                 "metrics": {"enabled": False}},
                    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}},
                    "engines": [{"name": "primary", "clusterId": 0, "readOnly": True, "storage": {"storageClass": "-"},
                                 "extraArgs": ["--verbose"], "nodeSelector": {"disk": "ssd"},
                                 "tolerations": [{"key": "db", "operator": "Equal", "value": "x"}],
                                 "podAnnotations": {"backup": "yes"}, "resources": {"requests": {"cpu": "1"}}}],
                    "engineDefaults": {"metricsPort": 0, "priorityClassName": "high",
                                       "podLabels": {"team": "data"}},
                    "networkPolicy": {"clients": [*CLIENTS, {"ipBlock": {"cidr": "10.0.0.0/8",
                                                                         "except": ["10.1.0.0/16"]}}]}},
                   _BASE_KINDS | _ENGINE_KINDS),
    # values.yaml: engineDefaults.listenHost "::" for IPv6-only clusters
    "ipv6": ({"engines": ENGINES_DOC[:1], "engineDefaults": {"listenHost": "::"}}, _BASE_KINDS | _ENGINE_KINDS),
    "bring-your-own": ({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"},
                        "networkPolicy": {"enabled": False}, "tableClusters": {"create": False},
                        "metrics": {"dashboard": {"enabled": False}}, "engines": ENGINES_DOC[:1]},
                       {"CustomResourceDefinition", "Deployment", "Service", "StatefulSet", "Secret"}),
}


def test_kubernetes_schema_variants_cover_every_built_in_kind_of_the_templates() -> None:
    """The variants below render each built-in kind some template can make (CRDs come from crds/)."""
    built_in = {d["kind"] for name in (CHART / "templates").glob("*.yaml") for d in template_documents(name.name)
                if _api_group(d) not in CUSTOM_RESOURCE_GROUPS}
    assert set().union(*(kinds for _, kinds in SCHEMA_VARIANTS.values())) == built_in | {"CustomResourceDefinition"}


@needs_helm
@pytest.mark.parametrize("variant", list(SCHEMA_VARIANTS))
def test_kubernetes_schema_of_every_rendered_built_in_object(tmp_path: Path, variant: str) -> None:
    """Every built-in object the chart renders is valid for the oldest supported and the newest Kubernetes."""
    values, kinds = SCHEMA_VARIANTS[variant]
    docs = render(tmp_path, values)
    assert isinstance(docs, list), docs
    built_in = [d for d in docs if _api_group(d) not in CUSTOM_RESOURCE_GROUPS]
    assert {d["kind"] for d in built_in} == kinds
    errors = [error for version in _kubernetes_versions() for doc in built_in
              for error in kubernetes_schema_errors(doc, version)]
    assert not errors, "\n".join(errors)
    for doc in docs:
        if _api_group(doc) == "monitoring.coreos.com":
            assert doc["kind"] in ("ServiceMonitor", "PrometheusRule"), doc["kind"]
            _check_prometheus_operator_object(doc)
    if variant == "monitoring":
        assert sorted(d["kind"] for d in docs if _api_group(d) == "monitoring.coreos.com") == \
            ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]


@needs_helm
def test_kubernetes_schema_check_rejects_broken_objects(tmp_path: Path) -> None:
    """The same helper refuses what the API server would: the check above is not vacuous."""
    docs = render(tmp_path)
    assert isinstance(docs, list)
    deployment = one(docs, "Deployment")
    for version in _kubernetes_versions():
        assert kubernetes_schema_errors(deployment, version) == []
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["volumeMount"] = [{"name": "tmp", "mountPath": "/tmp"}]  # misplaced
    (error,) = kubernetes_schema_errors(broken, OLDEST_KUBERNETES)
    assert "Deployment reptables-system/rt-reptables-operator" in error and "spec.template.spec" in error
    assert "'volumeMount' was unexpected" in error, error
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["replicas"] = "one"
    (error,) = kubernetes_schema_errors(wrong_type, OLDEST_KUBERNETES)
    assert "spec.replicas" in error and "'one' is not of type 'integer'" in error, error
    service = one(docs, "Service")
    container_port = json.loads(json.dumps(service))
    container_port["spec"]["ports"][0]["containerPort"] = 8081  # a container's field on a Service port
    assert kubernetes_schema_errors(container_port, OLDEST_KUBERNETES)
    # a built-in kind at an apiVersion the cluster no longer serves is refused, not skipped
    pdb = {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "rt"},
           "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "rt"}}}}
    (error,) = kubernetes_schema_errors(pdb, OLDEST_KUBERNETES)
    assert "Couldn't find schema for kind PodDisruptionBudget with api version policy/v1beta1" in error
    assert kubernetes_schema_errors({**pdb, "apiVersion": "policy/v1"}, OLDEST_KUBERNETES) == []


@needs_helm
def test_kubernetes_schema_prometheus_operator_objects_are_checked(tmp_path: Path) -> None:
    docs = render(tmp_path, SCHEMA_VARIANTS["monitoring"][0])
    assert isinstance(docs, list)
    monitor, rule = one(docs, "ServiceMonitor", "rt-reptables-engines"), one(docs, "PrometheusRule")
    _check_prometheus_operator_object(monitor)
    _check_prometheus_operator_object(rule)
    for doc, mutate in ((monitor, lambda d: d["spec"]["endpoints"][0].update(targetport="metrics")),
                        (monitor, lambda d: d["spec"]["endpoints"][0].update(interval="30 seconds")),
                        (monitor, lambda d: d["spec"].update(selectors=d["spec"]["selector"])),
                        (rule, lambda d: d["spec"]["groups"][0]["rules"][0].update(four="5m")),
                        (rule, lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr")),
                        (rule, lambda d: d.update(apiVersion="monitoring.coreos.com/v1alpha1"))):
        broken = json.loads(json.dumps(doc))
        mutate(broken)
        with pytest.raises(AssertionError):
            _check_prometheus_operator_object(broken)
