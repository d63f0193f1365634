"""The local mode with the face of the kubectl plugin: ``reptables up --keep-running`` and the commands beside it.

One real ``reptables up --keep-running`` (a subprocess in its own process group, the examples on
free loopback ports) serves the whole module; the tests then use it as a user would, through the
``reptables`` command and the official ``yt`` CLI: ``status`` reads its state directory, ``env``
gives the yt CLI its proxy and token, ``cluster stop`` makes the tracker fail over, manifest edits
are applied while it runs, SIGTERM stops every engine, and a second ``up`` on the same directory
finds its rows and objects again. The tests run in file order and build on one another.

The data directory is private: what the running ``up`` wrote is checked once, and the function that
prepares the directory (a new one, or one left open to other users) is tested directly at the end,
without an ``up``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reptables.engine.process import free_port
from reptables.operator.local.state import make_private_dir
from reptables.testing import WaitTimeout, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIN = Path(sys.executable).parent
ROW_KEY = 7_000_000  # a row of our own, beside the demo's 0..999


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Up:
    """The ``reptables up --keep-running`` under test, on a manifests and a data directory of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifests = root / "manifests"
        self.data = root / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "up-0.log"
        self.runs = 0
        self.engine_pids: set[int] = set()

    def start(self) -> None:
        self.log = self.root / f"up-{self.runs}.log"
        self.runs += 1
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reptables.operator.cli", "up", str(self.manifests), "--data-dir",
                 str(self.data), "--keep-running", "--no-live"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_on_up(lambda: "reconciling every second" in self.output(), 150, "reptables up to converge", self)
        self.engine_pids |= {e["pid"] for e in self.state()["engines"].values()}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.data / "state.json").read_text()))

    def terminate(self) -> int:
        """SIGTERM the up (as a service manager would); its exit code."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.terminate()
        for pid in self.engine_pids:  # only if the up failed to stop them: the engines it started, by pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def wait_on_up(check: Callable[[], Any], timeout: float, what: str, up: Up) -> Any:
    """:func:`wait_for` ``check()``; fails at once, with up's output, if ``reptables up`` exits first."""
    def seen() -> Any:
        result = check()
        if not result and up.proc is not None and up.proc.poll() is not None:
            pytest.fail(f"reptables up exited with {up.proc.returncode} waiting for {what}:\n{up.output()[-4000:]}")
        return result

    try:
        return wait_for(seen, timeout, what, interval=0.5)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}:\n{up.output()[-4000:]}")


def reptables(up: Up, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "reptables"), *args, "--data-dir", str(up.data)], capture_output=True,
                          text=True, timeout=60, env=env)


def status_json(up: Up) -> dict[str, Any]:
    result = reptables(up, "status", "-o", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def table_view(up: Up, name: str = "orders") -> dict[str, Any] | None:
    return next((t for t in status_json(up)["tables"] if t["name"] == name), None)


def yt_env(up: Up, cluster: str) -> dict[str, str]:
    result = reptables(up, "env", cluster)
    assert result.returncode == 0, result.stderr
    env = dict(os.environ)
    for line in result.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = value
    return env


def yt(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "yt"), *args], input=stdin, capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("local-mode")
    runner = Up(root)
    runner.manifests.mkdir()
    for source in sorted(EXAMPLES.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(source.read_text()) if d]
        for doc in docs:
            if doc.get("kind") == "TableCluster":
                doc["spec"]["endpoint"] = f"http://127.0.0.1:{free_port()}"  # not the examples' 9012-9014
        (runner.manifests / source.name).write_text(yaml.safe_dump_all(docs))
    try:
        runner.start()
        yield runner
    finally:
        runner.cleanup()


def test_state_file_holds_objects_status_and_engines_but_no_secret(up: Up) -> None:
    path = up.data / "state.json"
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    for token in ("change-me-primary", "change-me-remote-0", "change-me-remote-1"):
        assert token not in text
    state = up.state()
    assert up.proc is not None and state["pid"] == up.proc.pid
    assert state["manifests"] == [str(up.manifests.resolve())]
    kinds = sorted({o["kind"] for o in state["objects"]})
    assert kinds == ["ReplicatedTable", "TableCluster", "TableCollocation", "TableReplica"]  # never a Secret
    orders = next(o for o in state["objects"] if o["metadata"]["name"] == "orders")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in orders["status"]["conditions"])
    assert sorted(state["engines"]) == ["primary", "remote-0", "remote-1"]
    assert all(e["running"] and _alive(e["pid"]) for e in state["engines"].values())
    assert any(e["reason"] == "ReplicaModeChanged" and e["involvedObject"]["name"] == "orders"
               for e in state["events"])


def test_everything_up_wrote_in_its_data_directory_is_private(up: Up) -> None:
    assert up.data.stat().st_mode & 0o777 == 0o700
    checked = 0
    for root, dirs, files in os.walk(up.data):
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink():
                continue
            assert path.stat().st_mode & 0o077 == 0, f"{path} is open to other users: {path.stat().st_mode:o}"
            checked += 1
    assert checked > 10  # the state file, each engine's directory, log, token and database


def test_status_shows_the_table_its_replicas_and_modes(up: Up) -> None:
    orders = table_view(up)
    assert orders is not None and orders["ready"] == "True"
    modes = {r["name"]: (r["cluster"], r["mode"], r["state"]) for r in orders["replicas"]}
    assert modes == {"orders-remote-0": ("remote-0", "sync", "enabled"),
                     "orders-remote-1": ("remote-1", "async", "enabled")}
    assert orders["syncReplicas"] == ["orders-remote-0"]
    text = reptables(up, "status", "orders")
    assert text.returncode == 0 and "orders-remote-0" in text.stdout and "remote-1" in text.stdout
    assert "change-me" not in text.stdout
    unknown = reptables(up, "status", "no-such-table")
    assert unknown.returncode == 1 and "no-such-table" in unknown.stderr


def test_env_exports_drive_the_official_yt_cli(up: Up) -> None:
    primary = yt_env(up, "primary")
    assert primary["YT_PROXY"] == up.state()["engines"]["primary"]["endpoint"]
    row = json.dumps({"order_id": ROW_KEY, "customer": "yt-cli", "amount": 7.5, "status": "new"})
    inserted = yt(primary, "insert-rows", "//home/shop/orders", "--format", "json", stdin=row + "\n")
    assert inserted.returncode == 0, inserted.stderr
    remote = yt_env(up, "remote-1")  # the async replica: the row arrives there too
    query = f"* from [//home/shop/orders] where order_id = {ROW_KEY}"

    def replicated() -> bool:
        found = yt(remote, "select-rows", query, "--format", "json")
        assert found.returncode == 0, found.stderr
        return '"yt-cli"' in found.stdout

    wait_on_up(replicated, 30, "the row on remote-1", up)
    missing = reptables(up, "env", "no-such-cluster")
    assert missing.returncode == 1 and "TableCluster no-such-cluster not found" in missing.stderr


def test_stopping_the_sync_cluster_moves_the_sync_replica_and_start_brings_it_back(up: Up) -> None:
    stopped = reptables(up, "cluster", "stop", "remote-0")
    assert stopped.returncode == 0 and "engine remote-0" in stopped.stdout and "stopped" in stopped.stdout
    assert not up.state()["engines"]["remote-0"]["running"]

    def moved() -> dict[str, Any] | None:
        view = status_json(up)
        orders = next(t for t in view["tables"] if t["name"] == "orders")
        return view if orders["syncReplicas"] == ["orders-remote-1"] else None

    view = wait_on_up(moved, 40, "the tracker to move the sync replica to remote-1", up)
    switch = view["trackerSwitches"][0]  # newest first
    assert (switch["replica"], switch["mode"]) == ("orders-remote-1", "sync")
    started = reptables(up, "cluster", "start", "remote-0")
    assert started.returncode == 0 and "started again" in started.stdout, started.stderr

    def healthy() -> bool:
        view = status_json(up)
        remote0 = next(c for c in view["clusters"] if c["name"] == "remote-0")
        running = view["local"]["engines"]["remote-0"]["running"]
        return bool(remote0["healthy"] and remote0["ready"] == "True" and running)

    wait_on_up(healthy, 40, "remote-0 healthy again", up)
    unknown = reptables(up, "cluster", "stop", "orders")
    assert unknown.returncode == 1 and "TableCluster orders not found" in unknown.stderr


NEW_TABLE = {
    "apiVersion": "reptables.io/v1alpha1", "kind": "ReplicatedTable", "metadata": {"name": "events"},
    "spec": {"cluster": "primary", "path": "//home/shop/events",
             "schema": [{"name": "id", "type": "int64", "sortOrder": "ascending"}, {"name": "body", "type": "string"}]}}
NEW_REPLICA = {
    "apiVersion": "reptables.io/v1alpha1", "kind": "TableReplica", "metadata": {"name": "events-remote-1"},
    "spec": {"table": "events", "cluster": "remote-1", "replicaPath": "//home/shop/events", "mode": "async"}}


def test_manifests_added_edited_and_removed_while_up_runs(up: Up) -> None:
    new_file = up.manifests / "zz-events.yaml"
    new_file.write_text(yaml.safe_dump_all([NEW_TABLE, NEW_REPLICA]))

    def created() -> bool:
        events = table_view(up, "events")
        return bool(events and events["ready"] == "True" and [(r["name"], r["state"]) for r in events["replicas"]]
                    == [("events-remote-1", "enabled")])

    wait_on_up(created, 40, "the new table and replica to be Ready", up)
    # an invalid edit is reported and changes nothing: the previous version stays
    broken = {**NEW_REPLICA, "spec": {**NEW_REPLICA["spec"], "mode": "fast"}}  # type: ignore[dict-item]
    new_file.write_text(yaml.safe_dump_all([NEW_TABLE, broken]))
    wait_on_up(lambda: "zz-events.yaml: TableReplica \"events-remote-1\" is invalid: spec.mode" in up.output(),
               15, "the invalid manifest to be reported", up)
    events = table_view(up, "events")
    assert events is not None and [(r["name"], r["mode"]) for r in events["replicas"]] == [("events-remote-1",
                                                                                            "async")]
    # the file is gone: the replica and then its table are deleted (deletionPolicy Retain keeps engine data)
    new_file.unlink()
    wait_on_up(lambda: table_view(up, "events") is None, 30, "the table of the removed manifest to be deleted", up)
    assert "TableReplica default/events-remote-1 deleted" in up.output()
    assert "ReplicatedTable default/events deleted" in up.output()


MANUAL = """\
# a table without the tracker: its replicas' modes are the manifests' to say
apiVersion: reptables.io/v1alpha1
kind: ReplicatedTable
metadata:
  name: manual
spec:
  cluster: primary
  path: //home/shop/manual
  schema: [{name: id, type: int64, sortOrder: ascending}, {name: body, type: string}]
---
apiVersion: reptables.io/v1alpha1
kind: TableReplica
metadata:
  name: manual-remote-1
spec:
  table: manual
  cluster: remote-1
  replicaPath: //home/shop/manual   # the same path on remote-1
  mode: async                       # until promoted
"""


def edit(up: Up, *args: str) -> subprocess.CompletedProcess[str]:
    """``reptables promote|disable|enable`` (the commands of reptables.operator.local.edits, which the
    ``reptables`` command mounts)."""
    return subprocess.run([sys.executable, "-m", "reptables.operator.local.edits", *args, "--data-dir", str(up.data)],
                          capture_output=True, text=True, timeout=60)


def replica_view(up: Up, table: str, name: str) -> dict[str, Any]:
    view = table_view(up, table)
    assert view is not None, f"no table {table}"
    return dict(next(r for r in view["replicas"] if r["name"] == name))


def test_promote_disable_and_enable_edit_the_manifest_and_up_applies_them(up: Up) -> None:
    """The local ``kubectl reptables promote|disable|enable``: one field of the replica's manifest, in
    place (the file's comments stay), taken by the running ``up`` and carried out on the engines."""
    # the tracker gave the sync replica back to remote-0 (stopped and started before): orders-remote-1
    # is async, so disabling it leaves writes their sync replica
    wait_on_up(lambda: (table_view(up) or {}).get("syncReplicas") == ["orders-remote-0"], 60,
               "orders-remote-0 to be sync again", up)
    manual = up.manifests / "zz-manual.yaml"
    manual.write_text(MANUAL)
    wait_on_up(lambda: (table_view(up, "manual") or {}).get("ready") == "True", 40, "the manual table Ready", up)

    promoted = edit(up, "promote", "manual-remote-1")
    assert promoted.returncode == 0, promoted.stderr
    assert f'tablereplica.reptables.io/manual-remote-1 edited: spec.mode: "sync" in {manual}' in promoted.stdout
    assert "applied it: TableReplica default/manual-remote-1 is at generation 2" in promoted.stdout
    assert "owns this replica's mode" not in promoted.stderr  # no tracker on this table
    text = manual.read_text()
    assert text == MANUAL.replace("mode: async                       # until promoted",
                                  "mode: sync                       # until promoted")
    wait_on_up(lambda: replica_view(up, "manual", "manual-remote-1")["mode"] == "sync", 30,
               "manual-remote-1 to be sync", up)
    again = edit(up, "promote", "default/manual-remote-1")
    assert again.returncode == 0 and 'unchanged: spec.mode is already "sync"' in again.stdout
    assert manual.read_text() == text

    # the tracker owns the modes of orders: promote says so
    noted = edit(up, "promote", "orders-remote-1")
    assert noted.returncode == 0 and "the tracker of ReplicatedTable default/orders owns this replica's mode" \
        in noted.stderr

    primary = yt_env(up, "primary")
    remote = yt_env(up, "remote-1")
    disabled = edit(up, "disable", "orders-remote-1")
    assert disabled.returncode == 0 and "edited: spec.enabled: false" in disabled.stdout, disabled.stderr
    wait_on_up(lambda: replica_view(up, "orders", "orders-remote-1")["state"] == "disabled", 30,
               "orders-remote-1 disabled", up)
    row = {"order_id": ROW_KEY + 1, "customer": "while-disabled", "amount": 1.0, "status": "new"}
    assert yt(primary, "insert-rows", "//home/shop/orders", "--format", "json",
              stdin=json.dumps(row) + "\n").returncode == 0
    query = f"* from [//home/shop/orders] where order_id = {ROW_KEY + 1}"
    assert '"while-disabled"' not in yt(remote, "select-rows", query, "--format", "json").stdout
    enabled = edit(up, "enable", "orders-remote-1")
    assert enabled.returncode == 0 and "edited: spec.enabled: true" in enabled.stdout, enabled.stderr
    wait_on_up(lambda: '"while-disabled"' in yt(remote, "select-rows", query, "--format", "json").stdout, 30,
               "the row written while disabled on remote-1", up)
    # the status follows the meta-cluster (enabling until its first pass over every tablet is done)
    wait_on_up(lambda: replica_view(up, "orders", "orders-remote-1")["state"] == "enabled", 30,
               "orders-remote-1 enabled", up)

    unknown = edit(up, "disable", "no-such-replica")
    assert unknown.returncode == 1 and "TableReplica no-such-replica not found" in unknown.stderr
    manual.unlink()
    wait_on_up(lambda: table_view(up, "manual") is None, 30, "the manual table deleted", up)


def orders_rows(env: dict[str, str]) -> dict[int, dict[str, Any]]:
    found = yt(env, "select-rows", "* from [//home/shop/orders]", "--format", "json")
    assert found.returncode == 0, found.stderr
    return {row["order_id"]: row for row in map(json.loads, found.stdout.splitlines())}


def test_sigterm_stops_every_engine_and_a_second_up_resumes(up: Up) -> None:
    """A second ``up`` on the directory resumes and never writes the demo rows again: what the user
    deleted stays deleted, what they changed stays changed, and no row is added."""
    before = up.state()
    replica_ids = {o["metadata"]["name"]: o["status"]["replicaId"] for o in before["objects"]
                   if o["kind"] == "TableReplica"}
    pids = [e["pid"] for e in before["engines"].values()]
    assert "wrote 1000 rows to primary://home/shop/orders" in up.output()  # the first up on the directory
    assert json.loads((up.data / "demo.json").read_text())["tables"] == ["primary://home/shop/orders"]
    primary = yt_env(up, "primary")
    count = len(orders_rows(primary))
    assert yt(primary, "delete-rows", "//home/shop/orders", "--format", "json",
              stdin='{"order_id": 3}\n').returncode == 0
    changed = {"order_id": 4, "customer": "mine", "amount": 0.5, "status": "changed by hand"}
    assert yt(primary, "insert-rows", "//home/shop/orders", "--format", "json",
              stdin=json.dumps(changed) + "\n").returncode == 0
    mine = orders_rows(primary)
    assert 3 not in mine and mine[4] == changed and len(mine) == count - 1
    assert up.terminate() == 0
    for pid in pids:
        assert not _alive(pid), f"engine pid {pid} still runs after SIGTERM"
    gone = reptables(up, "status")
    assert gone.returncode == 1 and "no `reptables up` runs for" in gone.stderr
    assert not any(e["running"] for e in up.state()["engines"].values())

    up.start()  # the same data directory: the engines reopen their data, the objects are adopted
    after = up.state()
    assert {o["metadata"]["name"]: o["status"].get("replicaId") for o in after["objects"]
            if o["kind"] == "TableReplica"} == replica_ids
    found = yt(yt_env(up, "remote-1"), "select-rows", f"* from [//home/shop/orders] where order_id = {ROW_KEY}",
               "--format", "json")
    assert found.returncode == 0 and '"yt-cli"' in found.stdout, found.stderr
    # no demo rows this time: the user's delete and update hold, and nothing was added
    assert "wrote 1000 rows" not in up.output()
    assert f"demo: not written again: {up.data} was used before" in up.output()
    assert orders_rows(yt_env(up, "primary")) == mine
    again = reptables(up, "cluster", "stop", "remote-1")  # the new up carries requests out too
    assert again.returncode == 0, again.stderr


# --- the data directory, prepared without an up ------------------------------------------------------


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_data_directory_is_created_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "local"
    assert make_private_dir(data) is None
    assert _mode(data) == 0o700


def test_a_data_directory_open_to_others_is_made_private_with_a_notice(tmp_path: Path) -> None:
    data = tmp_path / "local"
    (data / "primary").mkdir(parents=True)
    (data / "state.json").write_text("{}")
    (data / "primary" / "engine.log").write_text("log")
    outside = tmp_path / "shared.txt"  # reached through a link: not the data directory's to change
    outside.write_text("x")
    (data / "link").symlink_to(outside)
    for path, mode in ((data, 0o755), (data / "primary", 0o755), (data / "state.json", 0o644),
                       (data / "primary" / "engine.log", 0o664), (outside, 0o644)):
        path.chmod(mode)

    notice = make_private_dir(data)

    assert notice is not None and "\n" not in notice
    assert notice == (f"notice: the data directory was open to other users: {data} (mode 0755) is now 0700, "
                      "3 files and directories in it are now 0600/0700")
    assert [_mode(p) for p in (data, data / "primary", data / "state.json", data / "primary" / "engine.log")] == [
        0o700, 0o700, 0o600, 0o600]
    assert _mode(outside) == 0o644
    assert make_private_dir(data) is None  # private now: nothing to say


def test_reptables_up_tightens_its_data_directory_and_says_so(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from reptables.operator.local.runner import LocalRunner

    data = tmp_path / "local"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "state.json").write_text("{}")
    (data / "state.json").chmod(0o644)
    LocalRunner([], data).stop()
    err = capsys.readouterr().err
    assert err.count("notice: the data directory was open to other users") == 1
    assert _mode(data) == 0o700 and _mode(data / "state.json") == 0o600


# --- the edit of `reptables promote|disable|enable`, on a file of its own ---------------------------------------

REPLICAS = """\
# two replicas
apiVersion: reptables.io/v1alpha1
kind: TableReplica
metadata: {name: a, namespace: shop}
spec:
  table: t
  cluster: c
  replicaPath: //home/t   # where
  mode: async             # the start
---
apiVersion: reptables.io/v1alpha1
kind: TableReplica
metadata: {name: b}
spec: {table: t, cluster: c, replicaPath: //home/t, preserveTimestamps: false, enableReplicatedTableTracker: false}
"""


def test_a_spec_edit_changes_one_field_in_place_and_refuses_an_invalid_result(tmp_path: Path) -> None:
    from reptables.operator.local.manifests import ManifestError, set_spec_field

    file = tmp_path / "replicas.yaml"
    promoted = set_spec_field(file, REPLICAS, "TableReplica", "shop", "a", "mode", "sync")
    assert promoted == REPLICAS.replace("mode: async             # the start", "mode: sync             # the start")
    disabled = set_spec_field(file, REPLICAS, "TableReplica", "shop", "a", "enabled", False)
    assert disabled == REPLICAS.replace("spec:\n  table: t", "spec:\n  enabled: false\n  table: t")
    flow = set_spec_field(file, REPLICAS, "TableReplica", "default", "b", "enabled", False)
    assert flow == REPLICAS.replace("spec: {table: t,", "spec: {enabled: false, table: t,")
    assert set_spec_field(file, flow, "TableReplica", "default", "b", "enabled", True) == \
        REPLICAS.replace("spec: {table: t,", "spec: {enabled: true, table: t,")
    with pytest.raises(ManifestError, match="preserveTimestamps: false can only be asynchronous"):
        set_spec_field(file, REPLICAS, "TableReplica", "default", "b", "mode", "sync")
    with pytest.raises(ManifestError, match="TableReplica default/a: not found"):
        set_spec_field(file, REPLICAS, "TableReplica", "default", "a", "mode", "sync")  # a is in shop
