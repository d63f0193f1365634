"""The replicated table tracker of a fault run: the operator's own tracker loop, in a process of its own.

Why a process and not the operator: the operator runs on Kubernetes (kopf) or as ``reptables up``,
which starts its own engines on loopback; neither can be pointed at engines that live in network
namespaces. What a fault run needs is the product's tracker - its probes, its decision, its
``alter_table_replica`` calls - running against those engines, in a namespace of its own so that it
can be partitioned from them. So this module builds the operator's :class:`Runtime` (engine clients,
registry, tracker loop) exactly as the operator's front ends do, hands it the TableClusters (with
their credentials as Secrets) and ReplicatedTables of a JSON config, and runs the loop's check every
period. Each mode switch is printed as one JSON line on stdout (the runner records it in the history).

This is the only module of the fault runs that imports the operator, and only its runtime and
credential policy (the names its front ends use): the operator's internals move, these stay.

Config (written by :class:`reptables.testing.chaos.cluster.TrackerProcess`, mode 0600)::

    {"period": 1.0,
     "clusters": {"meta": {"endpoint": "http://10.241.0.10:8000", "token": "...", "cluster_id": 0}, ...},
     "tables": [{"name": "set", "cluster": "meta", "path": "//chaos/set", "table_id": "...",
                 "schema": [...], "options": {"enableReplicatedTableTracker": true, ...}}]}
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

NAMESPACE = "chaos"


def _schema(columns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Engine schema columns as the CRD spells them (camelCase)."""
    out = []
    for column in columns:
        item = {"name": column["name"], "type": column["type"]}
        if column.get("sort_order"):
            item["sortOrder"] = column["sort_order"]
        out.append(item)
    return out


def manifests(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The Secrets, TableClusters and ReplicatedTables (with the status the tracker reads) of ``config``."""
    docs: list[dict[str, Any]] = []
    for name, cluster in config["clusters"].items():
        secret = f"{name}-token"
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": NAMESPACE},
                     "stringData": {"token": cluster["token"]}})
        docs.append({"apiVersion": "reptables.io/v1alpha1", "kind": "TableCluster", "metadata": {"name": name},
                     "spec": {"endpoint": cluster["endpoint"], "clusterId": cluster.get("cluster_id", 0),
                              "credentialsSecret": {"name": secret, "namespace": NAMESPACE}}})
    for table in config["tables"]:
        docs.append({"apiVersion": "reptables.io/v1alpha1", "kind": "ReplicatedTable",
                     "metadata": {"name": table["name"], "namespace": NAMESPACE, "generation": 1},
                     "spec": {"cluster": table["cluster"], "path": table["path"], "schema": _schema(table["schema"]),
                              "replicatedTableOptions": table["options"]},
                     "status": {"tableId": table["table_id"]}})
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reptables.testing.chaos.tracker")
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    from reptables.operator.registry import CredentialPolicy
    from reptables.operator.runtime import Runtime

    runtime = Runtime.start(NAMESPACE, tracker_period=float(config.get("period", 1.0)),
                            policy=CredentialPolicy(None, require_label=False))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for doc in manifests(config):
            if doc["kind"] == "Secret":
                runtime.registry.upsert_secret(doc)
            else:
                runtime.registry.upsert(doc)
        print(json.dumps({"event": "started", "time": time.time()}), flush=True)
        healthy: frozenset[str] | None = None
        verdicts: dict[str, str] = {}
        while not stop.is_set():
            try:
                checked = runtime.tracker.maybe_check()
            except Exception as exc:  # noqa: BLE001 - a check that fails is reported and the loop goes on
                print(json.dumps({"event": "check_failed", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
                checked = False
            # what the checks saw, when it changes: a run whose tracker did not act says why
            now_healthy = runtime.tracker.healthy_clusters
            if now_healthy != healthy:
                healthy = now_healthy
                print(json.dumps({"event": "health", "healthy": sorted(healthy), "time": time.time()}), flush=True)
            if checked:
                for (_, name), verdict in runtime.tracker.verdicts.items():
                    text = f"{verdict.decision}: {verdict.reason}"
                    if verdicts.get(name) != text:
                        verdicts[name] = text
                        print(json.dumps({"event": "verdict", "table": name, "verdict": text,
                                          "time": time.time()}), flush=True)
            for switch in runtime.pending_switches():
                print(json.dumps({"event": "switch", "table": switch.table.name, "replica_id": switch.replica_id,
                                  "mode": switch.mode, "reason": switch.reason, "time": time.time()}), flush=True)
            stop.wait(0.1)
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
