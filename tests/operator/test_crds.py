"""The CRDs: generated from the models and up to date, structural, and their CEL rules behave.

No API server runs here, so the CEL rules are evaluated with cel-python the way the API server
does: defaults applied first, each rule with ``self`` bound to the value at its schema position,
and transition rules (those using ``oldSelf``) only on updates where the old value exists.
"""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from reptables.operator.models import (
    API_VERSION,
    GROUP,
    KINDS,
    PLURALS,
    VERSION,
    Atomicity,
    ConditionType,
    DeletionPolicy,
    InvalidResourceError,
    ReplicaMode,
    ReplicatedTable,
    TableCluster,
    TableCollocation,
    TableReplica,
    crdgen,
    format_duration,
    parse_duration,
    parse_resource,
)

ROOT = Path(__file__).resolve().parent.parent.parent
CRDS = {manifest["spec"]["names"]["kind"]: manifest for manifest in map(crdgen.crd_manifest, KINDS.values())}

# --- minimal manifests --------------------------------------------------------------------------


def cluster(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "TableCluster", "metadata": {"name": "primary"},
            "spec": {"endpoint": "http://127.0.0.1:9012", "credentialsSecret": {"name": "primary-token"},
                     "clusterId": 0, **spec}}


KEY = {"name": "k", "type": "int64", "sortOrder": "ascending"}
VALUE = {"name": "v", "type": "string"}


def table(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ReplicatedTable", "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"cluster": "primary", "path": "//tmp/orders", "schema": [KEY, VALUE], **spec}}


def replica(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "TableReplica", "metadata": {"name": "orders-remote-0"},
            "spec": {"table": "orders", "cluster": "remote-0", "replicaPath": "//tmp/orders", **spec}}


def collocation(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "TableCollocation", "metadata": {"name": "shop"},
            "spec": {"tables": ["orders"], **spec}}


def changed(manifest: dict[str, Any], **spec: Any) -> dict[str, Any]:
    new = copy.deepcopy(manifest)
    new["spec"].update(spec)
    return new


# --- what the API server would do ---------------------------------------------------------------


def root_schema(kind: str) -> dict[str, Any]:
    return CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: a missing field with a default gets it, then defaults apply inside it."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def cel_rules(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, str]]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for name, sub in schema.get("properties", {}).items():
        yield from cel_rules(sub, (*path, name))
    if "items" in schema:
        yield from cel_rules(schema["items"], (*path, "[]"))


def values_at(obj: Any, path: tuple[str, ...]) -> list[Any]:
    values = [obj]
    for part in path:
        if part == "[]":
            values = [item for v in values if isinstance(v, list) for item in v]
        else:
            values = [v[part] for v in values if isinstance(v, dict) and part in v]
    return values


CEL = celpy.Environment()


def cel_true(rule: str, **activation: Any) -> bool:
    result = CEL.program(CEL.compile(rule)).evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def violations(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the CEL rules that refuse ``new`` (an update of ``old`` when given)."""
    schema = root_schema(new["kind"])
    new = apply_defaults(schema, new)
    old = apply_defaults(schema, old) if old is not None else None
    failed = []
    for path, rule in cel_rules(schema):
        if "oldSelf" in rule["rule"]:
            assert "[]" not in path, "transition rules inside lists need list-type map correlation"
            if old is None:
                continue
            news, olds = values_at(new, path), values_at(old, path)
            if news and olds and not cel_true(rule["rule"], self=news[0], oldSelf=olds[0]):
                failed.append(rule["message"])
        else:
            failed += [rule["message"] for value in values_at(new, path) if not cel_true(rule["rule"], self=value)]
    return failed


# --- generated files ----------------------------------------------------------------------------


def test_generated_crds_are_up_to_date() -> None:
    assert crdgen.stale_files(ROOT) == [], "run hack/gen-crds"


def test_gen_crds_check_passes_on_the_repository() -> None:
    result = subprocess.run([str(ROOT / "hack" / "gen-crds"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_check_mode_fails_on_a_changed_missing_or_leftover_file(tmp_path: Path) -> None:
    crdgen.write_files(tmp_path)
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 0
    edited = tmp_path / "crds" / f"{GROUP}_tableclusters.yaml"
    edited.write_text(edited.read_text().replace("clusterId", "clusterID"))
    (tmp_path / "charts/reptables/crds" / f"{GROUP}_tablereplicas.yaml").unlink()
    (tmp_path / "crds" / f"{GROUP}_oldkinds.yaml").write_text("{}\n")
    assert crdgen.stale_files(tmp_path) == sorted([
        Path("crds") / f"{GROUP}_tableclusters.yaml", Path("charts/reptables/crds") / f"{GROUP}_tablereplicas.yaml",
        Path("crds") / f"{GROUP}_oldkinds.yaml"])
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1
    crdgen.main(["--root", str(tmp_path)])
    assert crdgen.stale_files(tmp_path) == []


def test_one_file_per_kind_in_crds_and_in_the_chart() -> None:
    for directory in ("crds", "charts/reptables/crds"):
        names = sorted(p.name for p in (ROOT / directory).glob("*.yaml"))
        assert names == sorted(f"{GROUP}_{plural}.yaml" for plural in PLURALS.values())
        for name in names:
            assert (ROOT / directory / name).read_text() == (ROOT / "crds" / name).read_text()


def test_generation_is_deterministic() -> None:
    assert crdgen.generated_files() == crdgen.generated_files()


# --- shape of the CRDs --------------------------------------------------------------------------

NAMES = {"TableCluster": ("Cluster", "tcl"), "ReplicatedTable": ("Namespaced", "rt"),
         "TableReplica": ("Namespaced", "trep"), "TableCollocation": ("Namespaced", "tcol")}


@pytest.mark.parametrize("kind", NAMES)
def test_crd_names_scope_and_category(kind: str) -> None:
    crd = CRDS[kind]
    scope, short = NAMES[kind]
    assert crd["metadata"]["name"] == f"{PLURALS[kind]}.{GROUP}"
    assert crd["spec"]["scope"] == scope
    assert crd["spec"]["names"]["shortNames"] == [short]
    assert crd["spec"]["names"]["categories"] == ["reptables"]
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert version["subresources"] == {"status": {}}


def structural_problems(node: dict[str, Any], where: str) -> list[str]:
    problems = [f"{where}: {key}" for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "nullable",
                                              "uniqueItems", "const") if key in node]
    if "type" not in node and not node.get("x-kubernetes-int-or-string") and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{where}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{where}: properties beside additionalProperties")
    for name, sub in node.get("properties", {}).items():
        problems += structural_problems(sub, f"{where}.{name}")
    if node.get("type") == "array":
        if "items" not in node:
            problems.append(f"{where}: array without items")
        else:
            problems += structural_problems(node["items"], f"{where}[]")
    if node.get("x-kubernetes-list-type") == "map":
        required = node["items"].get("required", [])
        problems += [f"{where}: map key {key} not required" for key in node["x-kubernetes-list-map-keys"]
                     if key not in required]
    return problems


@pytest.mark.parametrize("kind", NAMES)
def test_schema_is_structural(kind: str) -> None:
    schema = root_schema(kind)
    assert structural_problems(schema, kind) == []
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["required"] == ["spec"]
    assert {"spec", "status"} <= set(schema["properties"])


def schema_at(root: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = root
    for part in re.sub(r"\[\?[^\]]*\]", "", json_path).strip(".").split("."):
        if node.get("type") == "array":
            node = node["items"]
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("kind", NAMES)
def test_printer_columns_point_at_schema_fields(kind: str) -> None:
    columns = {c["name"]: c for c in CRDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
                              "description": "Time since creation"}
    for column in columns.values():
        if column["jsonPath"].startswith(".metadata."):
            continue
        field = schema_at(root_schema(kind), column["jsonPath"])
        assert field["type"] == column["type"] or column["type"] == "string" and field["type"] == "array", column


def test_printer_columns_show_sync_replicas_lag_mode_state_and_endpoint() -> None:
    def paths(kind: str) -> dict[str, str]:
        return {c["name"]: c["jsonPath"] for c in CRDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]}

    assert paths("ReplicatedTable")["Sync"] == ".status.syncReplicas"
    assert paths("ReplicatedTable")["Lag"] == ".status.maxLagSeconds"
    assert {k: paths("TableReplica")[k] for k in ("Mode", "State", "Lag")} == {
        "Mode": ".status.mode", "State": ".status.state", "Lag": ".status.lagSeconds"}
    assert paths("TableCluster")["Endpoint"] == ".spec.endpoint"


def test_field_docstrings_become_descriptions_on_one_line() -> None:
    options = root_schema("ReplicatedTable")["properties"]["spec"]["properties"]["replicatedTableOptions"]
    description = options["properties"]["maxSyncReplicaCount"]["description"]
    assert description.startswith("Maximum and desired number of sync replicas") and "\n" not in description


def test_optional_fields_are_plain_not_nullable_and_enums_are_inlined() -> None:
    spec = root_schema("TableReplica")["properties"]["spec"]["properties"]
    assert spec["startReplicationTimestamp"] == {
        "type": "integer", "format": "int64", "minimum": 0, "maximum": 2**63 - 1,
        "description": spec["startReplicationTimestamp"]["description"]}
    assert spec["mode"]["enum"] == ["sync", "async"] and spec["mode"]["default"] == "async"


# --- CEL rules ----------------------------------------------------------------------------------


def test_every_cel_rule_compiles_and_has_a_message() -> None:
    rules = [rule for kind in NAMES for _, rule in cel_rules(root_schema(kind))]
    assert len(rules) == 17
    for rule in rules:
        CEL.compile(rule["rule"])
        assert rule["message"]


LOCAL_DB = "postgresql://reptables@127.0.0.1:5432/primary"
LOCAL_STORAGE = [{"storage": LOCAL_DB}, {"storage": "postgresql+psycopg://reptables@/primary?host=/run/postgresql"},
                 {"storage": "postgresql://db.example.com/primary?sslmode=verify-full"},
                 {"storageSecret": {"name": "primary-db"}}, {}]


@pytest.mark.parametrize("manifest", [cluster(), table(), replica(), collocation(),
                                      *(cluster(local=local) for local in LOCAL_STORAGE)],
                         ids=lambda m: f"{m['kind']}{m['spec'].get('local', '')}")
def test_valid_objects_pass_every_rule_on_create_and_on_a_no_op_update(manifest: dict[str, Any]) -> None:
    assert violations(manifest) == []
    assert violations(manifest, manifest) == []


KEYS_IMMUTABLE = "key columns (the columns with sortOrder) are immutable"


@pytest.mark.parametrize(("old", "new", "message"), [
    (table(), table(path="//tmp/other"), "path is immutable"),
    (table(), table(cluster="remote-0"), "cluster is immutable"),
    (table(), table(schema=[{**KEY, "type": "string"}, VALUE]), KEYS_IMMUTABLE),
    (table(), table(schema=[KEY, {**VALUE, "sortOrder": "ascending"}]), KEYS_IMMUTABLE),
    (table(), table(schema=[{**KEY, "required": True}, VALUE]), KEYS_IMMUTABLE),
    (table(), table(schema=[VALUE]), KEYS_IMMUTABLE),
    (cluster(), cluster(clusterId=5), "clusterId is immutable"),
    (replica(), replica(table="payments"), "table is immutable"),
    (replica(), replica(cluster="remote-1"), "cluster is immutable"),
    (replica(), replica(replicaPath="//tmp/elsewhere"), "replicaPath is immutable"),
    (replica(), replica(preserveTimestamps=False, mode="async", enableReplicatedTableTracker=False),
     "preserveTimestamps is immutable"),
    (replica(startReplicationTimestamp=100), replica(startReplicationTimestamp=200),
     "startReplicationTimestamp is immutable"),
    (replica(), replica(startReplicationTimestamp=200), "startReplicationTimestamp is immutable"),
    (replica(startReplicationTimestamp=100), replica(), "startReplicationTimestamp is immutable"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_changing_an_identity_field_is_refused(old: dict[str, Any], new: dict[str, Any], message: str) -> None:
    assert violations(new, old) == [message]


@pytest.mark.parametrize(("old", "new"), [
    (table(), table(schema=[KEY, {**VALUE, "type": "any"}])),
    (table(), table(schema=[KEY, VALUE, {"name": "w", "type": "double", "lock": "w"}])),
    (table(), table(schema=[KEY])),
    (table(), table(frozen=True, deletionPolicy="Delete", minReplicationLogTtl="1h")),
    (table(), table(replicatedTableOptions={"enableReplicatedTableTracker": True, "maxSyncReplicaCount": 2})),
    (replica(), replica(enabled=False)),
    (replica(), replica(mode="sync", enableReplicatedTableTracker=False)),
    (replica(), replica(mode="async", enableReplicatedTableTracker=False, atomicity="none")),
    (cluster(), cluster(endpoint="https://primary.example.com", readOnly=True)),
    (collocation(), collocation(tables=["orders", "payments"], preferredSyncReplicaClusters=["remote-0"])),
], ids=lambda v: "")
def test_changing_a_value_column_or_an_option_is_allowed(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert violations(new, old) == []
    parse_resource(new)


@pytest.mark.parametrize(("manifest", "message"), [
    (table(replicatedTableOptions={"minSyncReplicaCount": 3, "maxSyncReplicaCount": 1}),
     "minSyncReplicaCount must not exceed maxSyncReplicaCount"),
    (table(schema=[VALUE], pivotKeys=[[]]), "pivotKeys apply to sorted tables (with key columns); "
                                            "use tabletCount for ordered tables"),
    (table(tabletCount=4), "tabletCount applies to ordered tables (without key columns); "
                           "use pivotKeys for sorted tables"),
    (table(pivotKeys=[[1], [2]]), "the first pivot key must be []"),
    (replica(preserveTimestamps=False), "a replica with preserveTimestamps: false can only be asynchronous: "
                                        "set mode: async and enableReplicatedTableTracker: false"),
    (replica(atomicity="none"), "a replica with atomicity: none can only be asynchronous: "
                                "set mode: async and enableReplicatedTableTracker: false"),
    (cluster(local={"storage": LOCAL_DB, "storageSecret": {"name": "primary-db"}}),
     "set storage or storageSecret, not both"),
    *((cluster(local={"storage": url}), "storage must not carry a password (the engine gets it on its command line, "
                                        "which every user of the machine can read): give the password in $PGPASSWORD "
                                        "or a ~/.pgpass, or the whole URL in a Secret named by storageSecret")
      for url in ("postgresql://reptables:secret@127.0.0.1:5432/primary", "postgresql://reptables:@host/primary",
                  "postgresql://reptables@host/primary?sslmode=require&password=secret")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_api_server_and_the_models_refuse_the_same_manifest(manifest: dict[str, Any], message: str) -> None:
    assert violations(manifest) == [message]
    with pytest.raises(InvalidResourceError):
        parse_resource(manifest)


@pytest.mark.parametrize("options", [{"minSyncReplicaCount": 2, "maxSyncReplicaCount": 2},
                                     {"minSyncReplicaCount": 3}, {"maxSyncReplicaCount": 0}, {}])
def test_min_sync_replica_count_up_to_max_is_accepted(options: dict[str, int]) -> None:
    manifest = table(replicatedTableOptions=options)
    assert violations(manifest) == []
    parse_resource(manifest)


# --- models: defaults and errors ----------------------------------------------------------------


def test_minimal_table_cluster_gets_the_documented_defaults() -> None:
    spec = parse_resource(cluster(), TableCluster).spec
    assert spec.credentials_secret.key == "token"
    assert spec.credentials_secret.namespace is None
    assert spec.read_only is False
    assert spec.local is None  # the local runner's engine keeps SQLite in its data directory
    local = parse_resource(cluster(local={"storageSecret": {"name": "primary-db"}}), TableCluster).spec.local
    assert local is not None and local.storage_secret is not None and local.storage_secret.key == "uri"


def test_minimal_replicated_table_gets_the_documented_defaults() -> None:
    spec = parse_resource(table(), ReplicatedTable).spec
    options = spec.replicated_table_options
    assert options.enable_replicated_table_tracker is False
    assert options.min_sync_replica_count is None and options.max_sync_replica_count is None
    assert options.preferred_sync_replica_clusters is None
    assert options.sync_replica_lag_threshold == timedelta(minutes=10)
    assert spec.min_replication_log_ttl == timedelta(minutes=5)
    assert spec.frozen is False and spec.deletion_policy is DeletionPolicy.RETAIN
    assert spec.replication_throttler is None and spec.pivot_keys is None and spec.tablet_count is None
    assert [c.name for c in spec.key_columns] == ["k"] and spec.is_sorted
    assert spec.table_schema[1].required is False and spec.table_schema[1].sort_order is None


def test_minimal_table_replica_gets_the_documented_defaults() -> None:
    spec = parse_resource(replica(), TableReplica).spec
    assert (spec.enabled, spec.mode, spec.enable_replicated_table_tracker, spec.preserve_timestamps) == (
        True, ReplicaMode.ASYNC, True, True)
    assert spec.atomicity is Atomicity.FULL and spec.start_replication_timestamp is None
    assert (spec.bootstrap.enabled, spec.bootstrap.parallelism) == (True, 2)
    assert spec.deletion_policy is DeletionPolicy.RETAIN


def test_minimal_table_collocation_has_no_preferred_clusters() -> None:
    assert parse_resource(collocation(), TableCollocation).spec.preferred_sync_replica_clusters is None


def test_throttler_period_defaults_to_one_second() -> None:
    spec = parse_resource(table(replicationThrottler={"limit": 1000}), ReplicatedTable).spec
    assert spec.replication_throttler is not None and spec.replication_throttler.period == 1000


@pytest.mark.parametrize("manifest", [cluster(), table(), replica(), collocation(),
                                      cluster(local={"storageSecret": {"name": "primary-db"}})],
                         ids=lambda m: f"{m['kind']}{m['spec'].get('local', '')}")
def test_crd_defaults_are_the_model_defaults(manifest: dict[str, Any]) -> None:
    model = parse_resource(manifest)
    defaulted = apply_defaults(root_schema(manifest["kind"])["properties"]["spec"], manifest["spec"])
    assert defaulted == model.spec.model_dump(by_alias=True, mode="json", exclude_none=True)


@pytest.mark.parametrize(("manifest", "expected"), [
    (replica(mode="semi-sync"), "TableReplica \"orders-remote-0\" is invalid: spec.mode: Input should be 'sync' "
                                "or 'async' (got 'semi-sync')"),
    (cluster(clusterId=200), "TableCluster \"primary\" is invalid: spec.clusterId: Input should be less than or "
                             "equal to 127 (got 200)"),
    (table(path="tmp/orders"), "spec.path: String should match pattern"),
    (table(schema=[]), "spec.schema: List should have at least 1 item"),
    (table(schema=[KEY, {"name": "v", "type": "text"}]), "spec.schema[1].type: Input should be 'int64'"),
    (table(replicatedTableOptions={"minSyncReplicaCount": 3, "maxSyncReplicaCount": 1}),
     "spec.replicatedTableOptions: minSyncReplicaCount (3) must not exceed maxSyncReplicaCount (1)"),
    (table(schema=[VALUE, KEY]), "spec.schema: key column 'k' follows value column 'v'"),
    (table(schema=[KEY, KEY]), "spec.schema: duplicate column names: k"),
    (table(pivotKeys=[[], [1, 2]]), "pivotKeys: [1, 2] must be a non-empty prefix of the key columns ['k']"),
    (table(replicatedTableOptions={"syncReplicaLagThreshold": "10 minutes"}),
     "spec.replicatedTableOptions.syncReplicaLagThreshold: '10 minutes' is not a duration"),
    (cluster(endpoint="ftp://primary"), "spec.endpoint: String should match pattern"),
    (cluster(credentialsSecret={}), "spec.credentialsSecret.name: Field required"),
    (cluster(local={"storage": "mysql://reptables@127.0.0.1/primary"}), "spec.local.storage: String should match "
                                                                         "pattern"),
    (cluster(local={"storage": "postgresql://reptables@127.0.0.1:5432"}), "spec.local.storage: String should match "
                                                                          "pattern"),  # no database named
    (replica(enabled="yes"), "spec.enabled: Input should be a valid boolean (got 'yes')"),
    (replica(replicaPth="//tmp/x"), "spec.replicaPth: Extra inputs are not permitted"),
    (collocation(tables=[]), "spec.tables: List should have at least 1 item"),
    (collocation(tables=["orders", "orders"]), "spec.tables: duplicate entries: orders"),
    (collocation(preferredSyncReplicaClusters=["Remote_0"]), "spec.preferredSyncReplicaClusters[0]: String should"),
    ({**cluster(), "kind": "TableClusters"}, "kind: must be one of TableCluster, ReplicatedTable, TableReplica, "
                                             "TableCollocation, XdcrGroup (got 'TableClusters')"),
    ({**cluster(), "apiVersion": "reptables.io/v1"},
     "apiVersion: must be reptables.io/v1alpha1 (got 'reptables.io/v1')"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_invalid_manifest_error_names_the_resource_and_the_field(manifest: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidResourceError) as caught:
        parse_resource(manifest)
    assert expected in str(caught.value)
    assert str(caught.value).startswith(f'{manifest["kind"]} "{manifest["metadata"]["name"]}" is invalid: ')


@pytest.mark.parametrize("url", ["postgresql://reptables:hunter2@127.0.0.1/primary",
                                 "mysql://reptables:hunter2@127.0.0.1/primary",
                                 "postgresql://reptables@127.0.0.1/primary?password=hunter2"])
def test_a_password_in_a_storage_url_is_refused_and_never_repeated(url: str) -> None:
    with pytest.raises(InvalidResourceError) as caught:
        parse_resource(cluster(local={"storage": url}))
    assert caught.value.problems == [
        "spec.local.storage: storage must not carry a password (the engine gets it on its command line, which every "
        "user of the machine can read): give the password in $PGPASSWORD or a ~/.pgpass, or the whole URL in a "
        "Secret named by storageSecret"]
    assert "hunter2" not in str(caught.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidResourceError) as caught:
        parse_resource(cluster(clusterId=-1, endpoint="primary"))
    assert [p.split(":")[0] for p in caught.value.problems] == ["spec.endpoint", "spec.clusterId"]


def test_parse_resource_can_require_a_kind() -> None:
    with pytest.raises(InvalidResourceError, match="kind: expected TableReplica"):
        parse_resource(cluster(), TableReplica)


def test_status_written_by_the_operator_parses() -> None:
    manifest = replica()
    manifest["status"] = {
        "observedGeneration": 3, "replicaId": "1-2-3-4", "state": "enabled", "mode": "sync", "lagSeconds": 0,
        "tablets": {"count": 2, "maxLagSeconds": 0, "errors": 0}, "errors": [],
        "bootstrap": {"phase": "Done", "jobRef": "local:orders-remote-0-copy-1", "snapshotTimestamp": 2**62,
                      "attempts": 1, "rowsCopied": 10},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Replicating", "message": "ok",
                        "observedGeneration": 3, "lastTransitionTime": "2025-01-01T00:00:00Z"}],
        "fieldFromANewerOperator": 1,
    }
    status = parse_resource(manifest, TableReplica).status
    assert status.mode is ReplicaMode.SYNC and status.conditions[0].type == ConditionType.READY
    assert status.bootstrap is not None and status.bootstrap.snapshot_timestamp == 2**62


@pytest.mark.parametrize(("text", "value", "canonical"), [
    ("10m", timedelta(minutes=10), "10m"), ("90s", timedelta(seconds=90), "1m30s"),
    ("1h30m", timedelta(hours=1, minutes=30), "1h30m"), ("500ms", timedelta(milliseconds=500), "500ms"),
    ("0s", timedelta(0), "0s"), ("2m3s4ms", timedelta(minutes=2, seconds=3, milliseconds=4), "2m3s4ms"),
])
def test_durations_parse_and_render_canonically(text: str, value: timedelta, canonical: str) -> None:
    assert parse_duration(text) == value
    assert format_duration(value) == canonical


@pytest.mark.parametrize("text", ["", "10", "1d", "1.5h", "-1s", "10 m"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


# --- examples and docs --------------------------------------------------------------------------


def example_documents() -> list[dict[str, Any]]:
    return [doc for path in sorted((ROOT / "examples").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def doc_manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "crds.md").read_text(), re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def test_every_example_parses_and_every_kind_has_one() -> None:
    # the XdcrGroup example is a set of its own (examples/xdcr/, `reptables up examples/xdcr`)
    documents = example_documents() + [doc for path in sorted((ROOT / "examples").glob("*/*.yaml"))
                                       for doc in yaml.safe_load_all(path.read_text()) if doc]
    resources = [parse_resource(doc) for doc in documents if doc["apiVersion"] == API_VERSION]
    assert {type(r).__name__ for r in resources} == set(KINDS)


def test_examples_form_a_coherent_set() -> None:
    docs = example_documents()
    secrets = {(d["metadata"]["name"], d["metadata"]["namespace"]): d["stringData"]
               for d in docs if d["kind"] == "Secret"}
    resources = [parse_resource(d) for d in docs if d["apiVersion"] == API_VERSION]
    clusters = {r.metadata.name: r for r in resources if isinstance(r, TableCluster)}
    tables = {r.metadata.name: r for r in resources if isinstance(r, ReplicatedTable)}
    replicas = [r for r in resources if isinstance(r, TableReplica)]
    assert sorted(clusters) == ["primary", "remote-0", "remote-1"]
    assert len({c.spec.cluster_id for c in clusters.values()}) == 3
    for c in clusters.values():
        ref = c.spec.credentials_secret
        assert ref.key in secrets[(ref.name, ref.namespace)]
    for t in tables.values():
        assert t.spec.cluster in clusters
        assert set(t.spec.replicated_table_options.preferred_sync_replica_clusters or []) <= set(clusters)
    assert sorted(r.spec.mode for r in replicas) == [ReplicaMode.ASYNC, ReplicaMode.SYNC]
    for r in replicas:
        assert r.spec.table in tables and r.spec.cluster in clusters
    for col in (r for r in resources if isinstance(r, TableCollocation)):
        assert set(col.spec.tables) <= set(tables)


def test_docs_have_one_example_per_kind_and_each_parses() -> None:
    kinds = [parse_resource(doc).kind for doc in doc_manifests()]
    assert sorted(kinds) == sorted(KINDS)


def spec_field_paths(schema: dict[str, Any], prefix: str) -> Iterator[str]:
    if schema.get("type") == "object" and "properties" in schema:
        for name, sub in schema["properties"].items():
            yield from spec_field_paths(sub, f"{prefix}.{name}")
    elif schema.get("type") == "array" and schema["items"].get("type") == "object":
        yield from spec_field_paths(schema["items"], f"{prefix}[]")
    else:
        yield prefix


@pytest.mark.parametrize("kind", NAMES)
def test_docs_describe_every_spec_field(kind: str) -> None:
    docs = (ROOT / "docs" / "crds.md").read_text()
    missing = [p for p in spec_field_paths(root_schema(kind)["properties"]["spec"], "spec") if f"`{p}`" not in docs]
    assert missing == []


def test_docs_describe_every_condition_type() -> None:
    docs = (ROOT / "docs" / "crds.md").read_text()
    assert [t for t in ConditionType if f"`{t.value}`" not in docs] == []
