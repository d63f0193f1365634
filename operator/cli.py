"""The ``reptables`` command: ``engine serve``, ``up`` (run the product on this machine), ``tour`` (the
guided tour, operator/local/tour.py), ``operator``,
``peer-credential`` (what one cluster's ``//sys/clusters`` entry for another holds), ``stream`` (a
table's change stream as JSON lines, docs/streams.md), and the local
mode's ``status``, ``cluster stop|start|kill`` and ``env``, which talk to a running ``up`` through its
data directory (docs/local.md) the way ``kubectl reptables`` talks to the API server.

The operator depends on the engine (never the reverse), so the top-level command lives here and
mounts the engine's own sub-command. ``operator`` resolves its options and the environment into one
:class:`~.settings.OperatorSettings` here, once, and hands it to the kopf front end; kopf and the
handlers are imported only then, so ``reptables up`` and ``engine serve`` never load them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
import yaml

from reptables.engine.cli import app as engine_app

from . import settings
from .terminal import display

if TYPE_CHECKING:
    from reptables.engine.client import Client, XdcrStatus
    from reptables.engine.errors import YtError

app = typer.Typer(help="reptables: replicated tables on Kubernetes", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


DATA_DIR_HELP = "The data directory of `reptables up` (its engines' data and state.json)"


@app.command()
def up(
    manifests: Annotated[list[Path] | None, typer.Argument(
        help="Manifest files or directories (default: examples/)")] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the local engines keep their data")] = Path(
        ".data/local"),
    keep_running: Annotated[bool, typer.Option(
        "--keep-running/--no-keep-running", help="After the demo, keep reconciling and watching the manifests "
                                                 "until Ctrl-C or SIGTERM")] = False,
    live: Annotated[bool | None, typer.Option(
        "--live/--no-live", help="A live status view, redrawn every second (implies --keep-running; default: "
                                 "on when stdout is a terminal)", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="Seconds to wait for every object to become Ready, counted again after each "
                                 "Spark job (a bootstrap copy or verify) that up runs; 600 s at most in all")] = 90.0,
) -> None:
    """Run the manifests on this machine: local engines, the reconcile core, the tracker, a demo."""
    from .local.up import run

    live_view = sys.stdout.isatty() if live is None else live
    raise typer.Exit(run(manifests or [Path("examples")], data_dir, keep_running, timeout=timeout, live=live_view))


@app.command()
def tour(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the tour's engines keep their data (wiped at "
                                                              "the start of each tour)")] = Path(".data/tour"),
    manifests: Annotated[Path | None, typer.Option("--manifests", help="The quickstart manifests")] = None,
    free_ports: Annotated[bool, typer.Option("--free-ports", help="Free loopback ports instead of 9012-9014")] = False,
) -> None:
    """Show what reptables does, step by step (the README's first command): replication, failover, a Spark
    bootstrap, the queue check."""
    from .local import tour as tour_module

    argv = ["--data-dir", str(data_dir)] + (["--manifests", str(manifests)] if manifests else []) + (
        ["--free-ports"] if free_ports else [])
    raise typer.Exit(tour_module.main(argv))


@app.command()
def status(
    table: Annotated[str | None, typer.Argument(help="One ReplicatedTable (NAME or NAMESPACE/NAME)")] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)] = Path(".data/local"),
    output: Annotated[str, typer.Option("--output", "-o", help="text, json or yaml")] = "text",
) -> None:
    """The status of the running `reptables up`: the same view as `kubectl reptables status`."""
    from rich.console import Console
    from rich.text import Text

    from .kubectl import statusview
    from .local.state import LocalStateError, read_state

    if output not in ("text", "json", "yaml"):
        _fail(f"unknown output format {output!r} (text, json or yaml)")
    try:
        state = read_state(data_dir)
        view = statusview.build_view(state.get("objects") or [], state.get("events") or [], table)
    except (LocalStateError, ValueError) as exc:
        _fail(str(exc))
    local = {"pid": state.get("pid"), "dataDir": state.get("dataDir"), "updated": state.get("updated"),
             "manifests": state.get("manifests"), "engines": state.get("engines")}
    if output == "json":
        typer.echo(json.dumps({**view, "local": local}, indent=2, sort_keys=True))
        return
    if output == "yaml":
        typer.echo(yaml.safe_dump({**view, "local": local}, sort_keys=True), nl=False)
        return
    console = Console(width=None if sys.stdout.isatty() else 160)  # a pipe or file gets whole lines
    # (names and paths from manifests and engines: escaped, and never read as rich markup)
    console.print(Text(display(f"reptables up (pid {local['pid']}) on {local['dataDir']}, "
                               f"state of {local['updated']}")))
    statusview.render(view, console)
    engines = local["engines"] or {}
    for name, engine in sorted(engines.items()):
        if engine.get("members"):  # an HA table cluster: its endpoint forwards to the leader
            console.print(Text(display(f"engine {name}: {engine.get('endpoint')} forwards to the leader, "
                                       f"{engine.get('leader') or 'none right now'}")))
            for member in engine["members"]:
                line = Text(display(f"  {member.get('url')} pid {member.get('pid')} "))
                line.append(*(("running", "green") if member.get("running") else ("stopped", "red")))
                if member.get("leads"):
                    line.append(" leads", style="bold")
                console.print(line)
            continue
        line = Text(display(f"engine {name}: {engine.get('endpoint')} pid {engine.get('pid')} "))
        line.append(*(("running", "green") if engine.get("running") else ("stopped", "red")))
        console.print(line)


cluster_app = typer.Typer(help="Stop, start or kill an engine of the running `reptables up` (watch the tracker or "
                               "a standby take over)", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")


def _control(action: str, name: str, data_dir: Path) -> None:
    from .local.state import LocalStateError, request_control

    try:
        ok, message = request_control(data_dir, action, name)
    except LocalStateError as exc:
        _fail(str(exc))
    if not ok:
        _fail(message)
    typer.echo(display(message))


@cluster_app.command("stop")
def cluster_stop(
    name: Annotated[str, typer.Argument(help="The TableCluster whose engine to stop")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)] = Path(".data/local"),
) -> None:
    """Stop the engine of TableCluster NAME (its data stays); the running `up` does it, by pid."""
    _control("stop", name, data_dir)


@cluster_app.command("start")
def cluster_start(
    name: Annotated[str, typer.Argument(help="The TableCluster whose engine to start again")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)] = Path(".data/local"),
) -> None:
    """Start the engine of TableCluster NAME again: the same port, data and token."""
    _control("start", name, data_dir)


@cluster_app.command("kill")
def cluster_kill(
    name: Annotated[str, typer.Argument(help="The TableCluster whose serving engine to kill")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)] = Path(".data/local"),
) -> None:
    """SIGKILL the engine that serves TableCluster NAME (a crash): of an HA cluster (spec.members) its leader,
    which a standby replaces and `up` starts again as a standby; a single engine stays down until `start`."""
    _control("kill", name, data_dir)


@app.command()
def env(
    name: Annotated[str, typer.Argument(help="A TableCluster of the running `reptables up`")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)] = Path(".data/local"),
) -> None:
    """Print `export YT_PROXY=...` and `export YT_TOKEN=...` for the official yt CLI: eval "$(reptables env NAME)"."""
    from .local.state import LocalStateError, env_lines, pid_alive, read_state

    try:
        lines = env_lines(data_dir, name)
        state = read_state(data_dir, require_running=False)
    except LocalStateError as exc:
        _fail(str(exc))
    if not pid_alive(state.get("pid")) or not (state.get("engines") or {}).get(name, {}).get("running"):
        typer.echo(f"warning: the engine of {display(name)} is not running (start `reptables up --keep-running "
                   f"--data-dir {data_dir}`)", err=True)
    for line in lines:
        typer.echo(line)


#: seconds to connect to the engine; a pull may take its wait (--heartbeat-interval) plus the client's margin
STREAM_TIMEOUT = 10.0
#: the first pause between tries of an unavailable engine (doubling each try), and the longest
STREAM_RETRY_DELAY = 0.2
STREAM_RETRY_MAX_DELAY = 2.0


@app.command()
def stream(
    path: Annotated[str, typer.Argument(help="The table whose changes to print, e.g. //tmp/orders")],
    proxy: Annotated[str | None, typer.Option("--proxy", envvar="YT_PROXY",
                                              help="The engine's URL (default $YT_PROXY)")] = None,
    from_timestamp: Annotated[int | None, typer.Option("--from-timestamp",
                                                       help="Start after this commit timestamp")] = None,
    from_token: Annotated[str | None, typer.Option("--from-token",
                                                   help="Start after this event token (resume)")] = None,
    heartbeats: Annotated[bool, typer.Option("--heartbeats", help="Print idle heartbeats too")] = False,
    heartbeat_interval: Annotated[float, typer.Option(
        "--heartbeat-interval", min=0.1, max=60.0,
        help="Seconds a pull waits for a change before the engine answers with a heartbeat: while the table "
             "is idle, --heartbeats prints one about this often (60 at most)")] = 5.0,
    retry_for: Annotated[float, typer.Option(
        "--retry-for", min=0.0,
        help="Seconds to keep retrying an engine that restarts or cannot be reached, resuming where the "
             "output stopped; then exit 1 (0: exit at the first failure)")] = 60.0,
) -> None:
    """Print the table's change stream, one JSON event per line, as changes commit (docs/streams.md).

    The token is read from $YT_TOKEN. Each line carries its event_token: restart with
    --from-token LAST_TOKEN to go on exactly after the last line written. An engine that restarts or
    cannot be reached is retried for --retry-for seconds, from the position of the last answer
    printed, so no change is printed twice or skipped; stderr says when it went away and came back."""
    from reptables.engine.client import Client
    from reptables.engine.errors import YtError

    from .terminal import display

    if not proxy:
        _fail("no engine to stream from: give --proxy URL or set YT_PROXY")
    if from_timestamp is not None and from_token is not None:
        _fail("give --from-timestamp or --from-token, not both")
    try:
        with Client(proxy, timeout=STREAM_TIMEOUT) as client:
            _follow(client, path, from_token, from_timestamp, heartbeats, round(heartbeat_interval * 1000),
                    retry_for)
    except YtError as exc:
        _fail(display(exc.message))
    except (KeyboardInterrupt, BrokenPipeError):
        pass


@dataclass
class _Outage:
    """An engine that stopped answering ``reptables stream``: since when, and the pause before the next try."""

    since: float
    delay: float = STREAM_RETRY_DELAY


def _follow(client: Client, path: str, token: str | None, timestamp: int | None, heartbeats: bool,
            wait_ms: int, retry_for: float) -> NoReturn:
    """Print the stream of ``path`` until interrupted. A pull that fails because the engine is unavailable
    is retried from the same position - the last answer's token, after every line printed - until
    ``retry_for`` seconds have passed since the first failure of the outage (then exit 1)."""
    from reptables.engine.errors import YtError

    outage: _Outage | None = None
    while True:
        try:
            answer = client.pull_changes(path, from_event_token=token, from_timestamp=None if token else timestamp,
                                         wait_timeout=wait_ms)
        except YtError as exc:
            if not _retriable(exc):
                raise
            outage = _wait_out(outage, client.proxy_url, exc, retry_for, token)
            continue
        if outage is not None:
            where = f"after event token {token}" if token else "from the start"
            typer.echo(f"reptables stream: the engine at {client.proxy_url} answers again after "
                       f"{time.monotonic() - outage.since:.1f} s; resuming {where}", err=True)
            outage = None
        for event in answer["events"]:
            if heartbeats or event["kind"] != "heartbeat":
                sys.stdout.write(json.dumps(event, separators=(",", ":"), default=str) + "\n")
                sys.stdout.flush()
        token = answer["event_token"]


def _retriable(exc: YtError) -> bool:
    """Whether asking again may succeed: the engine is unreachable (``TransportError``), restarting or
    overloaded (HTTP 503: ``UnavailableError``, code 105, also as an inner error), or it says so."""
    from reptables.engine.errors import ErrorCode

    return exc.find(ErrorCode.UNAVAILABLE) is not None or exc.attributes.get("retriable") is True


def _wait_out(outage: _Outage | None, url: str, exc: YtError, retry_for: float, token: str | None) -> _Outage:
    """One failed pull of an outage: say that it began (on its first failure), give up once it has lasted
    ``retry_for`` seconds, else sleep before the next try (never past the bound)."""
    from .terminal import display

    now = time.monotonic()
    reason = display(str(exc.message).splitlines()[0] if exc.message else type(exc).__name__)
    if outage is None:
        outage = _Outage(now)
        if retry_for > 0:
            typer.echo(f"reptables stream: the engine at {url} is unavailable ({reason}); retrying for up to "
                       f"{retry_for:g} s", err=True)
    left = outage.since + retry_for - now
    if left <= 0:
        resume = f"; resume with --from-token {token}" if token else ""
        _fail(f"the engine at {url} is still unavailable after {now - outage.since:.1f} s of retries "
              f"(--retry-for {retry_for:g}): {reason}{resume}")
    time.sleep(min(outage.delay, left))
    outage.delay = min(outage.delay * 2, STREAM_RETRY_MAX_DELAY)
    return outage


dr_app = typer.Typer(help="Active-active replication (XDCR, docs/xdcr.md): pause, resume, reset, drop, status",
                      no_args_is_help=True)
app.add_typer(dr_app, name="dr")
PROXY_OPTION = typer.Option("--proxy", envvar="YT_PROXY", help="The engine's URL (default $YT_PROXY; token: $YT_TOKEN)")


def _dr(proxy: str | None, command: Callable[[Client], XdcrStatus], timeout: float = 90.0) -> None:
    """Run one XDCR command on the engine at ``proxy`` and print its answer (the cluster's dr_status)."""
    from reptables.engine.client import Client
    from reptables.engine.errors import YtError

    if not proxy:
        _fail("no engine: give --proxy URL or set YT_PROXY")
    try:
        with Client(proxy, timeout=timeout) as client:
            answer = command(client)
    except YtError as exc:
        _fail(exc.message)
    typer.echo(json.dumps(answer, indent=2, sort_keys=True))


@dr_app.command("status")
def dr_status(proxy: Annotated[str | None, PROXY_OPTION] = None) -> None:
    """Per peer: state, lag, queued rows and bytes, conflicts."""
    _dr(proxy, lambda client: client.dr_status())


@dr_app.command("pause")
def dr_pause(proxy: Annotated[str | None, PROXY_OPTION] = None,
             wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Return once every change is delivered "
                                                                         "to every peer (drained)")] = True,
             timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the drain")] = 60.0) -> None:
    """Refuse client writes on this cluster (replicated changes are still applied)."""
    _dr(proxy, lambda client: client.dr_pause(wait, int(timeout * 1000)), timeout + 30)


@dr_app.command("resume")
def dr_resume(proxy: Annotated[str | None, PROXY_OPTION] = None) -> None:
    """Take client writes again."""
    _dr(proxy, lambda client: client.dr_resume())


@dr_app.command("reset")
def dr_reset(proxy: Annotated[str | None, PROXY_OPTION] = None,
             cluster: Annotated[str | None, typer.Option("--cluster", help="Break replication with this cluster only "
                                                                           "(needs --force)")] = None,
             all_: Annotated[bool, typer.Option("--all", help="Break replication with every cluster")] = False,
             force: Annotated[bool, typer.Option("--force", help="Confirm a single-cluster reset: its undelivered "
                                                                 "changes are dropped")] = False) -> None:
    """Stop replicating to one peer or to all (seed 001's `dr reset`)."""
    if (cluster is None) == (not all_):
        _fail("give --cluster NAME (with --force) or --all")
    _dr(proxy, lambda client: client.dr_reset(cluster, force) if cluster else client.dr_reset())


@dr_app.command("drop")
def dr_drop(proxy: Annotated[str | None, PROXY_OPTION] = None,
            timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the drain")] = 60.0) -> None:
    """Leave the group: deliver every change, make every peer forget this cluster."""
    _dr(proxy, lambda client: client.dr_drop(int(timeout * 1000)), timeout + 30)


@dr_app.command("join")
def dr_join(path: Annotated[str, typer.Option("--path", help="The XDCR table to join (empty on this cluster)")],
            proxy: Annotated[str | None, PROXY_OPTION] = None,
            source: Annotated[str | None, typer.Option("--source", help="The donor, by its //sys/clusters name "
                                                       "(default: //sys/@xdcr_preferred_source, else the first "
                                                       "connection)")] = None,
            partitions: Annotated[int | None, typer.Option("--partitions", help="Spark tasks")] = None,
            restart: Annotated[bool, typer.Option("--restart", help="Take a new snapshot instead of resuming "
                                                                    "the join begun")] = False) -> None:
    """Join this cluster to a group holding data: a member's snapshot through local Spark, then its changes."""
    import os

    if not proxy:
        _fail("no engine: give --proxy URL (the joining cluster) or set YT_PROXY")
    if not os.environ.get("YT_TOKEN"):
        _fail("no API token for the joining cluster: set YT_TOKEN")
    from reptables.sparkapps.xdcr_join import main as join_main

    args = ["--proxy", proxy, "--path", path, *(["--source", source] if source else []),
            *(["--partitions", str(partitions)] if partitions else []), *(["--restart"] if restart else [])]
    code = join_main(args)
    if code:
        raise typer.Exit(code)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {display(message)}", err=True)
    raise typer.Exit(1)


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


# the local `kubectl reptables promote|disable|enable`: edits of the manifests `up` watches (docs/local.md)
from .local.edits import register as _register_replica_edits  # noqa: E402 - mounted after the commands above

_register_replica_edits(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
