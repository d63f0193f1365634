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
    manifests: Annotated[list[Path] | None, typer.Argument(
        help="Manifest files or directories (default: examples/)")] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the local engines keep their data")] = Path(
        ".data/local"),
    keep_running: Annotated[bool, typer.Option("--keep-running/--no-keep-running")] = False,
) -> None:
    """Run the manifests on this machine: local engines, the reconcile core, the tracker, a demo."""
    from reptables.operator.local import run

    raise typer.Exit(run(manifests or [Path("examples")], data_dir, keep_running))


@app.command()
def operator(
    namespace: Annotated[list[str] | None, typer.Option("--namespace", "-n", help="Namespaces to watch")] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A")] = False,
    standalone: Annotated[bool, typer.Option("--standalone", help="No peering: this is the only operator")] = False,
    peering: Annotated[str | None, typer.Option("--peering", help="Peering object name for HA")] = None,
    priority: Annotated[int | None, typer.Option(
        "--priority", help="Peering priority (default with --peering: random, so peers never tie)")] = None,
    liveness: Annotated[str, typer.Option("--liveness", help="Liveness endpoint")] = "http://0.0.0.0:8080/healthz",
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Prometheus /metrics port (0: off)")] = 8081,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Run the kopf operator (the container image's command)."""
    import asyncio
    import logging
    import os

    import kopf

    from reptables.engine import logs

    logs.configure("debug" if verbose else "info")
    kopf_logger = logging.getLogger("kopf")
    kopf_logger.handlers[:] = logging.getLogger("reptables").handlers
    kopf_logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    kopf_logger.propagate = False
    from reptables.operator import handlers

    if metrics_port:
        import prometheus_client

        prometheus_client.start_http_server(metrics_port)

    namespaces = None
    if not all_namespaces:
        namespaces = sorted({*(namespace or [os.environ.get("POD_NAMESPACE", "default")]),
                             handlers.OPERATOR_NAMESPACE})
    if peering and priority is None:
        # kopf pauses every operator when the highest priority is shared: break ties at random
        import secrets

        priority = 1 + secrets.randbelow(1_000_000)
    asyncio.run(kopf.operator(
        standalone=standalone, peering_name=peering, priority=priority,
        clusterwide=all_namespaces, namespaces=namespaces or (),
        liveness_endpoint=liveness))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
