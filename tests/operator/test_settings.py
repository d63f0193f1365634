"""The operator's wiring: settings resolved once, nothing built at import, one reconciler table.

What these pin down: ``OperatorSettings.resolve`` gives the option, else the environment variable,
else the default (the chart sets the variables, people running by hand use the options); a bad value
is refused naming where it came from; importing the kopf handlers builds nothing and reads no
environment; the startup handler builds the runtime and the timers from the settings; the core and
the local runner never load kopf; and the operator's packaging habits (relative imports, modules of
a readable size, the engine's column types) hold.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reptables.engine.schema import ColumnType
from reptables.operator import models
from reptables.operator.controllers import dispatch as reconcile
from reptables.operator.controllers.world import Resource
from reptables.operator.models import crdgen
from reptables.operator.runtime import ModeSwitch, Runtime
from reptables.operator.settings import OperatorSettings
from reptables.operator.tracker import loop as tracking

OPERATOR_DIR = Path(__file__).resolve().parents[2] / "operator"


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (imports and kopf's registry start empty)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REPTABLES_") and k != "POD_NAMESPACE"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)


# --- settings -----------------------------------------------------------------------------------


def test_defaults_without_options_or_environment() -> None:
    resolved = OperatorSettings.resolve({})
    assert resolved.operator_namespace == "reptables-system"
    assert resolved.namespaces == ("default", "reptables-system")
    assert resolved.status_refresh == 5.0 and resolved.tracker_period == tracking.CHECK_PERIOD
    assert resolved == OperatorSettings()  # the dataclass defaults are what resolving nothing gives


def test_environment_as_the_chart_sets_it() -> None:
    resolved = OperatorSettings.resolve({"REPTABLES_NAMESPACE": "ops", "POD_NAMESPACE": "ops",
                                         "REPTABLES_STATUS_REFRESH": "2", "REPTABLES_TRACKER_PERIOD": "0.5"})
    assert resolved.operator_namespace == "ops" and resolved.namespaces == ("ops",)
    assert resolved.status_refresh == 2.0 and resolved.tracker_period == 0.5


def test_pod_namespace_is_the_fallback_operator_namespace() -> None:
    resolved = OperatorSettings.resolve({"POD_NAMESPACE": "team"})
    assert resolved.operator_namespace == "team" and resolved.namespaces == ("team",)


def test_options_win_over_the_environment() -> None:
    resolved = OperatorSettings.resolve(
        {"REPTABLES_NAMESPACE": "ops", "POD_NAMESPACE": "pods", "REPTABLES_STATUS_REFRESH": "2"},
        namespaces=["b", "a"], operator_namespace="mine", status_refresh=7)
    assert resolved.operator_namespace == "mine"
    assert resolved.namespaces == ("a", "b", "mine")  # sorted, the operator namespace always added
    assert resolved.status_refresh == 7


def test_all_namespaces_watches_everything() -> None:
    resolved = OperatorSettings.resolve({}, all_namespaces=True, namespaces=["a"])
    assert resolved.all_namespaces and resolved.namespaces == ()


def test_peering_without_a_priority_gets_a_random_one() -> None:
    assert (OperatorSettings.resolve({}, peering="p").priority or 0) >= 1
    assert OperatorSettings.resolve({}, peering="p", priority=3).priority == 3
    assert OperatorSettings.resolve({}).priority is None


def test_credentials_come_from_the_operator_namespace_and_the_ones_given_which_are_watched() -> None:
    assert OperatorSettings.resolve({}).secret_namespaces == {"reptables-system"}
    from_env = OperatorSettings.resolve({"REPTABLES_NAMESPACE": "ops", "POD_NAMESPACE": "ops",
                                         "REPTABLES_CREDENTIALS_NAMESPACES": "vault, keys,ops"})
    assert from_env.credentials_namespaces == ("keys", "vault")
    assert from_env.secret_namespaces == {"ops", "keys", "vault"}
    assert from_env.namespaces == ("keys", "ops", "vault")  # kopf must see their Secrets
    given = OperatorSettings.resolve({"REPTABLES_CREDENTIALS_NAMESPACES": "vault"}, credentials_namespaces=["keys"])
    assert given.credentials_namespaces == ("keys",)  # the option wins over the environment


@pytest.mark.parametrize(("environ", "options", "message"), [
    ({"REPTABLES_CREDENTIALS_NAMESPACES": "ops,Bad_NS"}, {},
     "REPTABLES_CREDENTIALS_NAMESPACES gives 'Bad_NS', which is not a namespace name"),
    ({}, {"credentials_namespaces": ["a/b"]}, "--credentials-namespace gives 'a/b', which is not a namespace name"),
    ({"REPTABLES_STATUS_REFRESH": "soon"}, {}, "REPTABLES_STATUS_REFRESH='soon' is not a number of seconds"),
    ({"REPTABLES_TRACKER_PERIOD": "0"}, {}, "REPTABLES_TRACKER_PERIOD gives 0.0"),
    ({}, {"status_refresh": -1.0}, "the command line gives -1.0"),
    ({}, {"metrics_port": 70000}, "metrics_port must be a port number"),
])
def test_unusable_values_are_refused_naming_their_source(environ: dict[str, str], options: dict[str, float],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorSettings.resolve(environ, **options)  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OperatorSettings().status_refresh = 1.0  # type: ignore[misc]


def test_the_cli_refuses_a_bad_period_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from reptables.operator.cli import app

    monkeypatch.setenv("REPTABLES_TRACKER_PERIOD", "often")
    result = CliRunner().invoke(app, ["operator", "--standalone"])
    assert result.exit_code == 2
    assert "REPTABLES_TRACKER_PERIOD='often' is not a number of seconds" in " ".join(result.output.split())


# --- what importing builds, what startup builds -------------------------------------------------


def test_importing_the_handlers_builds_nothing_and_reads_no_environment() -> None:
    result = _python("""
        import kopf
        import reptables.operator.handlers as handlers
        from reptables.operator.runtime import Runtime
        from reptables.operator.controllers.world import Engines
        from reptables.operator.registry import Registry
        from reptables.operator.tracker.loop import TrackerLoop
        built = [n for n, v in vars(handlers).items() if isinstance(v, (Runtime, Engines, Registry, TrackerLoop))]
        assert not built, built
        assert not kopf.get_default_registry()._spawning.get_all_handlers(), "timers are registered at startup"
        print("ok")
    """, REPTABLES_STATUS_REFRESH="soon", REPTABLES_TRACKER_PERIOD="never", REPTABLES_NAMESPACE="")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_startup_builds_the_runtime_and_timers_from_the_settings() -> None:
    result = _python("""
        import kopf
        from reptables.operator import handlers
        from reptables.operator.settings import OperatorSettings

        ours = OperatorSettings(operator_namespace="ops", namespaces=("ops",), status_refresh=3.0,
                                tracker_period=0.5)
        memo = kopf.Memo({handlers.SETTINGS_KEY: ours})
        kopf_settings = kopf.OperatorSettings()
        handlers.configure(settings=kopf_settings, memo=memo)
        runtime = memo[handlers.RUNTIME_KEY]
        assert runtime.registry.default_namespace == "ops" and runtime.tracker.period == 0.5
        # credentials only from the operator's namespace, only labelled Secrets, which alone are watched
        assert runtime.registry.policy.namespaces == {"ops"} and runtime.registry.policy.require_label
        assert kopf_settings.watching.label_selectors["v1", "secrets"] == "reptables.io/credentials=true"
        timers = list(kopf.get_default_registry()._spawning.get_all_handlers())
        # the tracker, and the status refresh of each of the five kinds
        assert sorted(t.interval for t in timers) == [0.5, 3.0, 3.0, 3.0, 3.0, 3.0], timers
        handlers.configure(settings=kopf.OperatorSettings(), memo=memo)  # a retried startup adds nothing
        assert memo[handlers.RUNTIME_KEY] is runtime
        assert len(kopf.get_default_registry()._spawning.get_all_handlers()) == len(timers)
        handlers.cleanup(memo=memo)
        print("ok")
    """, REPTABLES_STATUS_REFRESH="soon")  # ignored: the CLI's settings are in the memo
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_plain_kopf_run_resolves_the_settings_from_the_environment_at_startup() -> None:
    result = _python("""
        import kopf
        from reptables.operator import handlers

        memo = kopf.Memo()
        handlers.configure(settings=kopf.OperatorSettings(), memo=memo)
        assert memo[handlers.SETTINGS_KEY].status_refresh == 2.0
        assert memo[handlers.RUNTIME_KEY].registry.default_namespace == "ops"
        handlers.cleanup(memo=memo)
        print("ok")
    """, REPTABLES_NAMESPACE="ops", REPTABLES_STATUS_REFRESH="2")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_the_core_and_the_local_runner_never_load_kopf() -> None:
    result = _python("""
        import sys
        import reptables.operator.cli, reptables.operator.models.crdgen, reptables.operator.local.runner
        import reptables.operator.controllers.dispatch, reptables.operator.runtime, reptables.operator.settings
        import reptables.operator.local.tour, reptables.operator.kubectl.statusview
        loaded = [m for m in ("kopf", "reptables.operator.handlers") if m in sys.modules]
        assert not loaded, loaded
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_tracker_switches_queue_until_announced() -> None:
    runtime = Runtime.start("ops", tracker_period=0.5)
    try:
        table = Resource("ReplicatedTable", "shop", "orders", "uid-1", 1, "", None, {})
        for n in range(3):
            runtime.switches.append(ModeSwitch(table, f"r{n}", "sync", "test"))
        assert [s.replica_id for s in runtime.pending_switches()] == ["r0", "r1", "r2"]
        assert runtime.pending_switches() == []
    finally:
        runtime.close()


# --- the reconciler table and the package's habits ----------------------------------------------


def test_every_kind_has_one_reconciler_and_one_finalizer_in_dependency_order() -> None:
    assert reconcile.ORDER == tuple(models.KINDS)
    assert set(reconcile.RECONCILERS) == set(reconcile.FINALIZERS) == set(models.KINDS)


def test_column_types_are_the_engines() -> None:
    assert models.ColumnType is ColumnType
    crd = crdgen.crd_manifest(models.ReplicatedTable)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["schema"]["items"]["properties"]["type"]["enum"] == [t.value for t in ColumnType]


def test_imports_inside_the_operator_are_relative() -> None:
    absolute = []
    for path in sorted(OPERATOR_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and \
                    (node.module or "").startswith("reptables.operator"):
                absolute.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name.startswith("reptables.operator") for a in node.names):
                absolute.append(f"{path.name}:{node.lineno}")
    assert not absolute, f"use relative imports inside reptables.operator: {absolute}"


def test_operator_modules_stay_readable() -> None:
    modules = {str(path.relative_to(OPERATOR_DIR)): path for path in OPERATOR_DIR.rglob("*.py")}
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules.items()}
    assert not {name: n for name, n in sizes.items() if n > 600}, sizes
    undocumented = [name for name, path in modules.items() if ast.get_docstring(ast.parse(path.read_text())) is None]
    assert not undocumented, f"modules without a docstring: {undocumented}"
