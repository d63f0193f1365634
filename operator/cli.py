"""The ``reptables`` command: ``engine serve``, ``up`` (run the product on this machine), ``operator``,
``peer-credential`` (what one cluster's ``//sys/clusters`` entry for another holds).

The operator depends on the engine (never the reverse), so the top-level command lives here and
mounts the engine's own sub-command. ``operator`` resolves its options and the environment into one
:class:`~.settings.OperatorSettings` here, once, and hands it to the kopf front end; kopf and the
handlers are imported only then, so ``reptables up`` and ``engine serve`` never load them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from reptables.engine.cli import app as engine_app

from . import settings

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
    from .local import run

    raise typer.Exit(run(manifests or [Path("examples")], data_dir, keep_running))


@app.command("peer-credential")
def peer_credential_command(
    caller: Annotated[str, typer.Option("--caller", help="Name of the calling cluster (as its engine's "
                                                         "--cluster-name and the target's //sys/clusters call it)")],
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="The TARGET cluster's API token file (e.g. its DATA_DIR/token); default: "
                             "$REPTABLES_TOKEN")] = None,
) -> None:
    """Print the credential with which cluster CALLER calls the target cluster (its //sys/clusters entry's token).

    It is good only for cluster-to-cluster calls from CALLER to the target, and only for the target's
    replica tables whose replicas CALLER made; the operator writes these itself."""
    from reptables.engine.credentials import peer_credential

    token = token_file.read_text().strip() if token_file is not None else os.environ.get("REPTABLES_TOKEN", "")
    if not token:
        raise typer.BadParameter("no target token: give --token-file or set REPTABLES_TOKEN")
    if not caller or ":" in caller:
        raise typer.BadParameter(f"invalid cluster name {caller!r}")
    typer.echo(peer_credential(token, caller))


@app.command()
def operator(
    namespace: Annotated[list[str] | None, typer.Option(
        "--namespace", "-n", help="Namespaces to watch (default: $POD_NAMESPACE, else default); the operator "
                                  "namespace is always added")] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A")] = False,
    operator_namespace: Annotated[str | None, typer.Option(
        "--operator-namespace", help="Where credential Secrets live (default: $REPTABLES_NAMESPACE, else "
                                     f"$POD_NAMESPACE, else {settings.DEFAULT_OPERATOR_NAMESPACE})",
        show_default=False)] = None,
    credentials_namespace: Annotated[list[str] | None, typer.Option(
        "--credentials-namespace", help="Another namespace whose Secrets (labelled reptables.io/credentials=true) "
                                        "TableClusters may take their token from (repeatable; default: "
                                        f"${settings.ENV_CREDENTIALS_NAMESPACES}, comma-separated); the operator "
                                        "namespace always is one", show_default=False)] = None,
    status_refresh: Annotated[float | None, typer.Option(
        "--status-refresh", help="Seconds between status refreshes (default: $REPTABLES_STATUS_REFRESH, else "
                                 f"{settings.DEFAULT_STATUS_REFRESH:g})", show_default=False)] = None,
    tracker_period: Annotated[float | None, typer.Option(
        "--tracker-period", help="Seconds between tracker checks (default: $REPTABLES_TRACKER_PERIOD, else "
                                 f"{settings.DEFAULT_TRACKER_PERIOD:g})", show_default=False)] = None,
    standalone: Annotated[bool, typer.Option("--standalone", help="No peering: this is the only operator")] = False,
    peering: Annotated[str | None, typer.Option("--peering", help="Peering object name for HA")] = None,
    priority: Annotated[int | None, typer.Option(
        "--priority", help="Peering priority (default with --peering: random, so peers never tie)")] = None,
    liveness: Annotated[str, typer.Option("--liveness", help="Liveness endpoint")] = settings.DEFAULT_LIVENESS,
    metrics_port: Annotated[int, typer.Option(
        "--metrics-port", help="Prometheus /metrics port (0: off)")] = settings.DEFAULT_METRICS_PORT,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Run the kopf operator (the container image's command)."""
    try:
        resolved = settings.OperatorSettings.resolve(
            os.environ, namespaces=namespace, all_namespaces=all_namespaces, operator_namespace=operator_namespace,
            credentials_namespaces=credentials_namespace, status_refresh=status_refresh,
            tracker_period=tracker_period, standalone=standalone, peering=peering, priority=priority,
            liveness=liveness, metrics_port=metrics_port, verbose=verbose)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    from . import handlers  # imports kopf and registers the handlers

    handlers.run(resolved)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
