"""The ``reptables`` command: ``engine serve``, and ``up`` (run the product on this machine).

The operator depends on the engine (never the reverse), so the top-level command lives here and
mounts the engine's own sub-command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reptables.engine.cli import app as engine_app

app = typer.Typer(help="reptables: replicated tables on Kubernetes", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


@app.command()
def up(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the local engine keeps its data")] = Path(
        ".data/local"),
    port: Annotated[int, typer.Option("--port")] = 0,
    keep_running: Annotated[bool, typer.Option("--keep-running/--no-keep-running")] = False,
) -> None:
    """Start a local engine and run the walkthrough against it with the official YT client."""
    from reptables.operator.local import run_walkthrough

    raise typer.Exit(run_walkthrough(data_dir, port, keep_running))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
