"""Repository layout rules of DESIGN.md that a change could silently break."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_operator_folder_never_shadows_the_standard_library() -> None:
    result = subprocess.run([sys.executable, "-c", "import operator, reptables.operator.cli as c; "
                             "print(operator.__file__); print(c.__file__)"],
                            capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT, check=True)
    stdlib, cli = result.stdout.split()
    assert not stdlib.startswith(str(ROOT))
    # (a strict editable install links each file from build/: compare the files themselves)
    assert Path(cli).resolve() == ROOT / "operator" / "cli.py"


def test_engine_does_not_import_operator_or_sparkapps() -> None:
    for path in (ROOT / "engine").rglob("*.py"):
        text = path.read_text()
        assert "reptables.operator" not in text and "reptables.sparkapps" not in text, path


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A package folder missing from pyproject's list is left out of the wheel and the editable install."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for dist_name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((dist_name, *relative)) in listed, f"{init.parent} is not listed in pyproject.toml"


def test_the_operator_has_no_import_cycles() -> None:
    """Every import of the operator points one way, type-checking imports included (grimp reads them all)."""
    import grimp

    graph = grimp.build_graph("reptables.operator")
    cycles = sorted({tuple(sorted((module, imported))) for module in graph.modules
                     for imported in graph.find_modules_directly_imported_by(module)
                     if graph.chain_exists(importer=imported, imported=module)})
    assert not cycles, f"import cycles in the operator: {cycles}"


def test_the_no_kopf_contract_covers_every_module_of_the_operator_but_its_kopf_adapter_and_cli() -> None:
    """The contract names packages, not a hand-kept list of modules; a new top-level module must join it."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in config if c["type"] == "forbidden" and c["forbidden_modules"] == ["kopf"]]
    sources = set(contract["source_modules"])
    top = {f"reptables.operator.{p.stem}" for p in (ROOT / "operator").glob("*.py")}
    packages = {f"reptables.operator.{p.parent.name}" for p in (ROOT / "operator").glob("*/__init__.py")}
    assert sources == (top | packages) - {"reptables.operator.handlers", "reptables.operator.cli"}
