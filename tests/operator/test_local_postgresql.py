"""``reptables up`` with PostgreSQL-backed engines: a TableCluster's ``spec.local``, against a real server.

The run's PostgreSQL server (the ``postgres`` fixture: trust authentication on loopback) gives each
cluster a database of its own. The runner runs in-process
(:class:`~reptables.operator.local.runner.LocalRunner`: the manifests, engines and reconcile core of
``up`` without its command-line loop), which is the cheapest way to start its engines and reconcile
a replicated table and a replica on them. What a user relies on is checked where it lands: the
tables are in the databases the manifests name (``psql``), a password reaches the engine through its
environment only (its command line, ``state.json`` and ``up``'s output never hold it), and a URL in
``up``'s own environment sends no engine anywhere.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from reptables.engine.process import LAUNCH_ENV, free_port
from reptables.operator.local.runner import LocalRunner
from reptables.testing.backends import DB_USER, RunServer

API = "reptables.io/v1alpha1"
#: trust authentication ignores it; the engine still gets a URL that carries it
PASSWORD = "s3cret-in-the-url"


def secret(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default",
                                                               "labels": {"reptables.io/credentials": "true"}},
            "stringData": data}


def cluster(name: str, cluster_id: int, local: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"endpoint": f"http://127.0.0.1:{free_port()}", "clusterId": cluster_id,
                            "credentialsSecret": {"name": f"{name}-token", "namespace": "default"}}
    if local is not None:
        spec["local"] = local
    return {"apiVersion": API, "kind": "TableCluster", "metadata": {"name": name}, "spec": spec}


def psql(url: str, sql: str) -> str:
    result = subprocess.run(["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", url, "-c", sql], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def proc_file(pid: int, name: str) -> list[str]:
    """``/proc/PID/cmdline`` or ``environ`` as its NUL-separated strings."""
    return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0")


def test_up_runs_each_engine_on_the_database_its_manifest_names(
        postgres: RunServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    primary_url = postgres.create_database("primary")
    remote_url = postgres.create_database("remote")
    remote_with_password = remote_url.replace(f"//{DB_USER}@", f"//{DB_USER}:{PASSWORD}@")
    # a URL in up's own environment: no engine may take it (every engine would go to one database)
    monkeypatch.setenv("REPTABLES_STORAGE", "postgresql://nobody@127.0.0.1:1/nowhere")
    # spawned engines, as up's default: their command lines and environments are read from /proc below
    # (a forked engine's are the zygote's)
    monkeypatch.setenv(LAUNCH_ENV, "exec")
    manifests = [
        secret("primary-token", token="token-primary"), secret("remote-token", token="token-remote"),
        secret("plain-token", token="token-plain"), secret("remote-db", uri=remote_with_password),
        cluster("primary", 0, {"storage": primary_url}),  # --storage, the password from $PGPASSWORD/~/.pgpass
        cluster("remote", 1, {"storageSecret": {"name": "remote-db"}}),  # the whole URL from a Secret
        cluster("plain", 2),  # SQLite in its data directory, as before
        {"apiVersion": API, "kind": "ReplicatedTable", "metadata": {"name": "orders"},
         "spec": {"cluster": "primary", "path": "//home/shop/orders",
                  "schema": [{"name": "id", "type": "int64", "sortOrder": "ascending"},
                             {"name": "note", "type": "string"}]}},
        {"apiVersion": API, "kind": "TableReplica", "metadata": {"name": "orders-remote"},
         "spec": {"table": "orders", "cluster": "remote", "replicaPath": "//home/shop/orders", "mode": "sync"}},
    ]
    data = tmp_path / "data"
    runner = LocalRunner(manifests, data)
    engines = runner.processes
    try:
        runner.start_engines()
        assert runner.converge(timeout=60), [(r.kind, r.name, r.status) for kind in ("TableCluster", "TableReplica")
                                             for r in runner.registry.of_kind(kind)]
        # each cluster's engine serves from its own database: the table on primary's, the replica on remote's
        for url, name in ((primary_url, "primary"), (remote_url, "remote")):
            assert psql(url, "SELECT value FROM _rt_meta WHERE name = 'cluster_name'") == name
            assert psql(url, "SELECT type FROM _rt_nodes WHERE name = 'orders'") == (
                "replicated_table" if name == "primary" else "table")
        assert not (data / "primary" / "engine.sqlite").exists() and not (data / "remote" / "engine.sqlite").exists()
        assert (data / "plain" / "engine.sqlite").is_file()
        # the password reaches the engine through its environment only
        primary_argv = proc_file(engines["primary"].pid, "cmdline")
        assert primary_argv[primary_argv.index("--storage") + 1] == primary_url
        for name in ("remote", "plain"):
            assert not [a for a in proc_file(engines[name].pid, "cmdline") if "postgresql" in a or "storage" in a]
        environ = {name: dict(v.partition("=")[::2] for v in proc_file(e.pid, "environ") if "=" in v)
                   for name, e in engines.items()}
        assert environ["remote"]["REPTABLES_STORAGE"] == remote_with_password
        assert environ["primary"]["REPTABLES_STORAGE"] == environ["plain"]["REPTABLES_STORAGE"] == ""
        runner.write_state()
        assert PASSWORD not in (data / "state.json").read_text()
        assert primary_url in (data / "state.json").read_text()  # spec.local, as written
    finally:
        runner.stop()
    printed = capsys.readouterr()
    assert PASSWORD not in printed.out + printed.err
    assert f"engine primary serving {engines['primary'].url} (data in {primary_url})" in printed.out
    assert "engine remote serving" in printed.out and "(data in the database of its storageSecret)" in printed.out


def test_up_refuses_a_password_in_storage_without_repeating_it(tmp_path: Path) -> None:
    manifests = [secret("primary-token", token="token-primary"),
                 cluster("primary", 0, {"storage": f"postgresql://{DB_USER}:{PASSWORD}@127.0.0.1:5432/primary"})]
    with pytest.raises(ValueError) as refused:
        LocalRunner(manifests, tmp_path / "data")
    message = str(refused.value)
    assert message.startswith('TableCluster "primary" is invalid: spec.local.storage: storage must not carry a '
                              "password")
    assert "storageSecret" in message and PASSWORD not in message


def test_up_names_the_secret_when_the_storage_secret_is_missing(tmp_path: Path) -> None:
    runner = LocalRunner([secret("primary-token", token="token-primary"),
                          cluster("primary", 0, {"storageSecret": {"name": "primary-db", "key": "url"}})],
                         tmp_path / "data")
    try:
        with pytest.raises(RuntimeError) as refused:
            runner.start_engines()
    finally:
        runner.stop()
    assert str(refused.value) == ("TableCluster primary: spec.local.storageSecret: Secret default/primary-db "
                                  "(key 'url') not found; the operator reads only Secrets labelled "
                                  "reptables.io/credentials=true")
    assert not runner.processes
