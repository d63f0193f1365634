"""What the human-readable commands print when names hold terminal escape sequences.

A table path may hold any character but whitespace, so ``//tmp/a<ESC>[31mred<ESC>]0;title<BEL>`` is
a path a manifest can ask for and an engine will create. Written raw, it recolours the terminal and
retitles its window; every text view shows it escaped instead (``\\x1b``), while ``-o json`` keeps
it exact. Here: the escaping itself, ``reptables status`` (the command, on a state directory as
``reptables up`` writes it) and the lines ``reptables up`` prints while it reconciles (the runner,
with a real engine creating the table). The kubectl plugin's views are in test_kubectl_plugin.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.process import free_port
from reptables.operator.local.runner import LocalRunner
from reptables.operator.local.state import STATE_FILE, write_private
from reptables.operator.terminal import display
from reptables.testing import WaitTimeout, wait_for

BIN = Path(sys.executable).parent
HOSTILE_PATH = "//tmp/a\x1b[31mred\x1b]0;title\x07"
HOSTILE_SHOWN = "//tmp/a\\x1b[31mred\\x1b]0;title\\x07"
API = "reptables.io/v1alpha1"


# --- the escaping -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[2J\x07", "\\x1b[2J\\x07"),  # C0 controls
    ("a\x7fb", "a\\x7fb"),  # DEL
    ("\x9b31m", "\\x9b31m"),  # a C1 control (CSI on terminals that take 8-bit controls)
    ("tab\tline\nfeed\rreturn", "tab\\x09line\\x0afeed\\x0dreturn"),  # a name cannot start a line of its own
    ("users\u202etxt.exe", "users\\u202etxt.exe"),  # a bidi override
    ("a\u2066b\u2069", "a\\u2066b\\u2069"),  # bidi isolates
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),  # invisible format characters
    ("tag\U000e0041", "tag\\U000e0041"),  # a format character beyond the BMP
    ("lone\ud800", "lone\\ud800"),  # a lone surrogate
    ("line\u2028sep", "line\\u2028sep"),  # a line separator
])
def test_display_escapes_what_could_drive_a_terminal(raw: str, shown: str) -> None:
    assert display(raw) == shown
    assert display(shown) == shown  # idempotent: escaping twice shows the same


def test_display_leaves_printable_text_alone() -> None:
    for text in ("//home/shop/orders", "café, привет, 表, 🙂", "back\\slash", "[bold]not markup[/]", ""):
        assert display(text) == text


def test_display_keeps_line_feeds_of_multiline_text_only() -> None:
    assert display("engine exited:\nlog\x1b[2J", multiline=True) == "engine exited:\nlog\\x1b[2J"
    assert display("a\nb") == "a\\x0ab"


# --- reptables status -------------------------------------------------------------------------------


def _condition(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-20T10:00:00Z", "observedGeneration": 1}


def _state(data_dir: Path) -> dict[str, Any]:
    """A state.json as ``reptables up`` writes it (for a running process: this one), of a table on the path."""
    orders = {"apiVersion": API, "kind": "ReplicatedTable",
              "metadata": {"name": "orders", "namespace": "default"},
              "spec": {"cluster": "primary", "path": HOSTILE_PATH,
                       "schema": [{"name": "id", "type": "int64", "sortOrder": "ascending"}]},
              "status": {"syncReplicas": [], "conditions": [
                  _condition("Ready", "False", "NoReplicas", f"{HOSTILE_PATH}: no enabled replica")]}}
    replica = {"apiVersion": API, "kind": "TableReplica",
               "metadata": {"name": "orders-remote-0", "namespace": "default"},
               "spec": {"table": "orders", "cluster": "remote-0", "replicaPath": HOSTILE_PATH},
               "status": {"replicaId": "1-2-3-a", "mode": "async", "state": "enabled"}}
    return {"pid": os.getpid(), "dataDir": str(data_dir), "updated": "2026-11-20T10:00:00Z", "manifests": [],
            "objects": [orders, replica], "events": [], "engines": {}}


def test_status_text_shows_escape_sequences_in_names_as_text(tmp_path: Path) -> None:
    write_private(tmp_path / STATE_FILE, json.dumps(_state(tmp_path)))
    text = subprocess.run([str(BIN / "reptables"), "status", "--data-dir", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    assert f"ReplicatedTable default/orders  {HOSTILE_SHOWN} on primary" in text.stdout
    assert f"NoReplicas: {HOSTILE_SHOWN}: no enabled replica" in text.stdout
    assert f"orders-remote-0  remote-0  {HOSTILE_SHOWN}  async" in text.stdout  # the replica's row

    as_json = subprocess.run([str(BIN / "reptables"), "status", "--data-dir", str(tmp_path), "-o", "json"],
                             capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["tables"][0]["path"] == HOSTILE_PATH  # exact


# --- reptables up's lines ---------------------------------------------------------------------------


def test_up_prints_the_events_and_status_of_a_table_on_such_a_path_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = "up-output-token-0123456789"
    manifests = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "primary-token", "namespace": "default"},
         "stringData": {"token": token}},
        {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": "primary"},
         "spec": {"endpoint": f"http://127.0.0.1:{free_port()}", "clusterId": 1,
                  "credentialsSecret": {"name": "primary-token", "namespace": "default"}}},
        {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "orders"},
         "spec": {"cluster": "primary", "path": HOSTILE_PATH,
                  "schema": [{"name": "id", "type": "int64", "sortOrder": "ascending"}]}}]
    runner = LocalRunner(manifests, tmp_path / "data")
    try:
        runner.start_engines()
        out = ""

        def mounted() -> bool:
            nonlocal out
            runner.reconcile_all()
            out += capsys.readouterr().out
            return "Mounted" in out

        try:
            wait_for(mounted, 20, "the table to be mounted", interval=0)
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}:\n{out}") from None
        runner.print_status()
        out += capsys.readouterr().out
    finally:
        runner.stop()
    assert "\x1b" not in out and "\x07" not in out
    assert f"ReplicatedTable default/orders: Created: replicated table {HOSTILE_SHOWN} created on primary" in out
    assert f"ReplicatedTable default/orders: Mounted: {HOSTILE_SHOWN} mounted" in out
    # what status -o json reads keeps the exact path; only what is printed is escaped
    assert json.loads((tmp_path / "data" / STATE_FILE).read_text())["objects"][-1]["spec"]["path"] == HOSTILE_PATH
