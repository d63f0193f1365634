"""The engine's and the operator's JSON log lines: one object per line, filterable by what they are about."""

from __future__ import annotations

import json
import logging

from reptables.engine.logs import JsonFormatter


def _line(**extra: object) -> dict[str, object]:
    record = logging.makeLogRecord({"name": "kopf.objects", "levelname": "INFO", "levelno": logging.INFO,
                                    "msg": "Handler 'delete' succeeded.", **extra})
    parsed: dict[str, object] = json.loads(JsonFormatter().format(record))
    return parsed


def test_a_kopf_record_names_the_object_it_is_about() -> None:
    line = _line(k8s_skip=False, k8s_ref={"apiVersion": "reptables.io/v1alpha1", "kind": "TableReplica",
                                          "name": "gone-r", "uid": "u-1", "namespace": "test"})
    assert line["object"] == "TableReplica test/gone-r"
    assert line["message"] == "Handler 'delete' succeeded." and line["level"] == "info"
    assert "k8s_ref" not in line  # the reference itself (a dict) stays out of the line


def test_a_cluster_scoped_object_is_named_without_a_namespace() -> None:
    line = _line(k8s_ref={"kind": "TableCluster", "name": "remote-0", "namespace": None})
    assert line["object"] == "TableCluster remote-0"


def test_a_record_about_no_object_has_no_object_field() -> None:
    line = _line(path="//home/t")
    assert "object" not in line and line["path"] == "//home/t"
