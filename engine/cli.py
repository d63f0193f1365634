"""``reptables engine serve``: run one engine process serving one table cluster.

The token is taken from ``--token``, else ``REPTABLES_TOKEN``, else generated and written to
``DATA_DIR/token`` (mode 0600) *before* the port opens, so ``YT_TOKEN=$(cat DATA_DIR/token)``
works for the official client as soon as the engine answers. It is written once the data directory
is open, and so locked (``storage.datadir``): a second engine started on a directory that a running
engine serves is refused with one line, and never rewrites the running engine's token file.

Everything the process creates is private: ``serve`` sets the umask to 0o077 before anything else,
so no file or directory it (or a library) creates is readable by other users, whatever mode the
code that creates it asks for.

Transport (docs/security.md): ``--tls-cert-file``/``--tls-key-file`` make the API listener HTTPS
only; ``--tls-ca-file`` is the CA bundle that verifies peers with an ``https://`` proxy_url;
``--metrics-port`` opens a second, plain-HTTP listener that serves ``/metrics`` alone, without a
token, for Prometheus (the API listener's ``/metrics`` always takes the token). Each has an
environment fallback (``REPTABLES_TLS_CERT_FILE``, ``REPTABLES_TLS_KEY_FILE``,
``REPTABLES_TLS_CA_FILE``, ``REPTABLES_METRICS_PORT``), read here as ``REPTABLES_TOKEN`` is. The
files are checked before the data directory is opened: a wrong path or a key that does not match
its certificate stops the engine with one line, not at its first connection.

Leadership (docs/storage.md, "Leadership and fencing"; ``storage/leadership.py``): an engine on
PostgreSQL holds its database, and its commits are fenced. Without ``--standby`` it claims the
database at start (refused while a leader/standby group's leader holds it). With ``--standby`` it
listens at once as a standby (``api.standby_app``: ``/readyz`` 503, commands answered 105 naming the
leader), stands by for the lease in a thread, and when it wins builds the node from the database as a
restart does and serves it through the same listener (``api.LeaderGate``). Either kind that another
engine replaced stops as SIGTERM stops it and exits with status 75 (``EXIT_STEPPED_DOWN``), for its
supervisor to start it again as a standby.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .config import DEFAULT_CONFIG, DEFAULT_LEASE, EngineConfig

if TYPE_CHECKING:
    from .node import Cluster
    from .storage.leadership import Leadership

# The engine itself (the API, the node, storage) is imported by the functions that serve it, not
# here: ``reptables`` mounts this app under ``reptables engine``, and its other commands (status,
# env, dr, stream...) and ``--help`` should not pay the engine's import

app = typer.Typer(help="The table engine: one process serves one table cluster.", no_args_is_help=True)
log = logging.getLogger("reptables.engine")


@app.callback()
def engine() -> None:
    """The table engine: one process serves one table cluster."""


def resolve_token(data_dir: Path, token: str | None) -> str:
    token = token or os.environ.get("REPTABLES_TOKEN")
    token_file = data_dir / "token"
    if not token:
        if token_file.exists():
            token = token_file.read_text().strip()
        else:
            token = secrets.token_urlsafe(32)
    # private (0700): it holds the token, and the database whose WAL holds the peers' tokens
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)
    return token


@app.command()
def serve(
    cluster_name: Annotated[str, typer.Option("--cluster-name", help="Name of this table cluster")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Directory for the SQLite database and token (with "
                                                              "--storage: the token and the engine's own files)")],
    storage: Annotated[str | None, typer.Option(
        "--storage", help="The cluster's database instead of SQLite in DATA_DIR: postgresql://USER@HOST:PORT/DB "
        "(one database per table cluster, docs/storage.md). No password here: $PGPASSWORD, a ~/.pgpass or "
        "$PGPASSFILE, or the whole URL in $REPTABLES_STORAGE (a mounted Secret)")] = None,
    port: Annotated[int, typer.Option("--port", help="HTTP port")] = 9012,
    host: Annotated[str, typer.Option("--host", help="Address to listen on")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option("--token", help="API token (default: $REPTABLES_TOKEN, or "
                                                              "generated into DATA_DIR/token)")] = None,
    clusters_config: Annotated[Path | None, typer.Option(
        "--clusters-config", help="JSON or YSON map {name: {proxy_url; token}} merged into //sys/clusters")] = None,
    sync_replica_timeout: Annotated[float, typer.Option(
        "--sync-replica-timeout", help="Seconds a commit waits for a sync replica")] = DEFAULT_CONFIG.sync_timeout,
    in_doubt_timeout: Annotated[float, typer.Option(
        "--in-doubt-timeout", help="Seconds a write prepared here by another cluster may stay undecided before "
        "reads stop waiting for it (docs/replication.md)")] = DEFAULT_CONFIG.in_doubt_timeout,
    bootstrap_pin_ttl: Annotated[float, typer.Option(
        "--bootstrap-pin-ttl", help="Seconds a replica never enabled holds the replication queue back "
        "(docs/replication.md)")] = DEFAULT_CONFIG.bootstrap_pin_ttl,
    replicator_threads: Annotated[int, typer.Option(
        "--replicator-threads", min=1, help="Worker threads that feed every async replica of this meta-cluster "
        "and send their heartbeats (docs/replication.md)")] = DEFAULT_CONFIG.replicator_threads,
    max_body_bytes: Annotated[int, typer.Option(
        "--max-body-bytes", help="Largest request body, after decompression")] = DEFAULT_CONFIG.max_body_bytes,
    max_lookup_keys: Annotated[int, typer.Option(
        "--max-lookup-keys", help="Keys one lookup_rows request may carry")] = DEFAULT_CONFIG.max_lookup_keys,
    max_output_bytes: Annotated[int, typer.Option(
        "--max-output-bytes", help="Largest select_rows/lookup_rows answer")] = DEFAULT_CONFIG.max_output_bytes,
    query_timeout: Annotated[float, typer.Option(
        "--query-timeout", help="Seconds a select_rows query may run")] = DEFAULT_CONFIG.query_timeout,
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", help="Seconds a client has to send a request's headers")] = DEFAULT_CONFIG.header_timeout,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", help="Open client connections served at once")] = DEFAULT_CONFIG.max_connections,
    tls_cert_file: Annotated[Path | None, typer.Option(
        "--tls-cert-file", envvar="REPTABLES_TLS_CERT_FILE",
        help="PEM certificate (chain) of the API listener: it then serves HTTPS only")] = None,
    tls_key_file: Annotated[Path | None, typer.Option(
        "--tls-key-file", envvar="REPTABLES_TLS_KEY_FILE", help="PEM private key of --tls-cert-file")] = None,
    tls_ca_file: Annotated[Path | None, typer.Option(
        "--tls-ca-file", envvar="REPTABLES_TLS_CA_FILE",
        help="PEM CA bundle that verifies peers with an https:// proxy_url (default: the system trust store)")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", envvar="REPTABLES_METRICS_PORT", min=0, max=65535,
        help="Also serve /metrics, and only /metrics, without a token over plain HTTP on this port "
        "(0 or unset: no such listener; /metrics on --port always needs the token)")] = None,
    cluster_id: Annotated[int | None, typer.Option(
        "--cluster-id", min=0, max=127, help="This cluster's XDCR id, 0-127 (docs/xdcr.md): kept in the data "
        "directory at the first start; a restart with another id is refused")] = None,
    paused: Annotated[bool, typer.Option(
        "--paused", help="Start paused: client writes are refused, changes replicated by XDCR peers are "
        "applied (a read-only standby; `reptables dr resume` ends it)")] = False,
    standby: Annotated[bool, typer.Option(
        "--standby", help="Join the cluster's leader/standby group (docs/storage.md, \"Leadership and fencing\"): "
        "serve only while this engine holds the database's leader lease; until then stand by (/readyz 503, "
        "every command answered 105 naming the leader). Give it to every engine of the group; needs "
        "--storage postgresql://...")] = False,
    leader_lease: Annotated[float, typer.Option(
        "--leader-lease", min=0.3, help="With --standby: seconds the leader's lease lasts (by the database's "
        "clock; renewed every third of it). A standby takes over this long after the leader stopped renewing")]
        = DEFAULT_LEASE,
    advertise_url: Annotated[str | None, typer.Option(
        "--advertise-url", envvar="REPTABLES_ADVERTISE_URL",
        help="The URL clients and peers reach this engine at, which a standby names as the leader's "
        "(default: http(s)://HOST:PORT, the host name if HOST is a wildcard)")] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Serve the YTsaurus HTTP API for one table cluster."""
    from . import logs
    from .api import create_app
    from .api.server import metrics_app
    from .errors import DataDirError, DataDirInUseError
    from .node import Cluster
    from .storage.leadership import Leadership

    # first: every file and directory this process creates is its user's alone (0600 files, 0700
    # directories). The data directory holds tokens (the token file, the peer directory in the
    # database and its WAL) and table rows (XDCR conflict logs, snapshot pages), and files are
    # created in many places - some with an explicit mode, some (Path.write_text, open(..., "a"),
    # mkdir without a mode, SQLite's and libraries' own files) with the default 0644/0755; the umask
    # makes "nothing readable by others" hold for all of them, including the ones added later. The
    # explicit modes stay: they also hold for a cluster opened in another process (tests, tools)
    os.umask(0o077)
    logs.configure(log_level)
    # a 10,000-row batch allocates ~100k objects: with the default thresholds the cyclic collector
    # runs several full passes per batch (tens of ms); the engine creates few reference cycles
    gc.set_threshold(100_000, 50, 100)
    # the one place that reads the environment: the process' settings, handed down as one object
    try:
        config = EngineConfig.from_env(sync_timeout=sync_replica_timeout, in_doubt_timeout=in_doubt_timeout,
                                       bootstrap_pin_ttl=bootstrap_pin_ttl, replicator_threads=replicator_threads,
                                       max_body_bytes=max_body_bytes, max_lookup_keys=max_lookup_keys,
                                       max_output_bytes=max_output_bytes,
                                       query_timeout=query_timeout, header_timeout=header_timeout,
                                       max_connections=max_connections,
                                       tls_cert_file=str(tls_cert_file) if tls_cert_file else None,
                                       tls_key_file=str(tls_key_file) if tls_key_file else None,
                                       peer_ca_file=str(tls_ca_file) if tls_ca_file else None,
                                       cluster_id=cluster_id, start_paused=paused)
    except ValueError as exc:  # a malformed REPTABLES_* setting: named, no traceback
        print(exc, file=sys.stderr)
        raise typer.Exit(2) from None
    # (the process' own setting: an engine run in a test's or benchmark's process leaves it alone)
    sys.setswitchinterval(config.gil_switch_interval)
    problem = _transport_problem(config, port, metrics_port)
    if problem is not None:
        print(problem, file=sys.stderr)
        raise typer.Exit(2)
    try:
        url = _storage_url(storage)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        raise typer.Exit(2) from None
    if standby and url is None:
        print("--standby needs --storage postgresql://...: the engines of a leader/standby group share one PostgreSQL "
              "database (SQLite is one engine's file: no leadership)", file=sys.stderr)
        raise typer.Exit(2)
    address = advertise_url or _default_address(host, port, config)
    if standby:
        assert url is not None
        _serve_candidate(cluster_name, url, data_dir, config, token, clusters_config, host, port, metrics_port,
                         Leadership(url, cluster_name, address=address, lease=leader_lease))
        return
    # PostgreSQL: a single engine holds the database (no expiry), its writes fenced all the same
    leadership = Leadership(url, cluster_name, address=address) if url is not None else None
    try:
        cluster = Cluster.open(cluster_name, data_dir, config) if url is None else \
            Cluster.open_database(cluster_name, url, data_dir, config, leadership)
    except DataDirInUseError as exc:
        # another engine serves the directory (its pid in the message); nothing was touched
        if leadership is not None:
            leadership.close()
        print(exc.message, file=sys.stderr)
        raise typer.Exit(1) from None
    except DataDirError as exc:
        # logged once by Cluster.open; the reason, without a traceback, and a failed exit
        print(exc.message, file=sys.stderr)
        raise typer.Exit(1) from None
    # after the directory's lock: a refused second engine must not rewrite the serving one's token
    secret = _start(cluster, data_dir, token, clusters_config)
    log.info("engine starting", extra={"cluster": cluster_name, "host": host, "port": port,
                                       "tls": bool(config.tls_cert_file), "metrics_port": metrics_port or None,
                                       "data_dir": str(data_dir)})
    if leadership is not None:
        leadership.on_lost = _stop_this_process
    # uvicorn stops serving on SIGTERM and then raises the signal again: with this handler that ends
    # in SystemExit, so the cluster below is closed (checkpoint, WAL removed, data dir marked stopped)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run_until_stopped(leadership, create_app(cluster, secret), host, port, config,
                           metrics=(metrics_app(cluster.metrics.registry), metrics_port) if metrics_port else None,
                           on_exit=cluster.begin_stop)
    finally:
        cluster.close()
        log.info("engine stopped", extra={"cluster": cluster_name})
    _exit_if_stepped_down(leadership)


def _start(cluster: Cluster, data_dir: Path, token: str | None, clusters_config: Path | None) -> str:
    """What a built node needs before it serves: its token (written once the data directory is locked),
    the peers of ``--clusters-config``, its background work. The API token."""
    import yt.yson as yson

    secret = resolve_token(data_dir, token)
    if clusters_config is not None:
        raw = clusters_config.read_bytes()
        as_json = raw.lstrip().startswith(b"{\"") or clusters_config.suffix == ".json"
        cluster.nodes.load_directory(json.loads(raw) if as_json else yson.loads(raw))
    cluster.start_background()
    gc.freeze()
    return secret


def _serve_candidate(cluster_name: str, url: str, data_dir: Path, config: EngineConfig, token: str | None,
                     clusters_config: Path | None, host: str, port: int, metrics_port: int | None,
                     leadership: Leadership) -> None:
    """``serve --standby``: listen at once as a standby (``api.standby_app``), stand by for the lease in
    a thread, and once it is won build the node from the database as a restart does and serve it
    (``api.LeaderGate``). A leader that steps down stops the process (exit status 75)."""
    from .api import LeaderGate, create_app, standby_app
    from .api.server import metrics_app
    from .errors import DataDirError, DataDirInUseError, YtError
    from .node import Cluster
    from .node.tables import STORAGE_FORMAT
    from .storage import DataDir
    from .storage.database import probe_database

    try:
        # refused at once what would be refused once the lease is won: another cluster's database, a
        # newer format's, an incomplete one, a data directory another engine serves
        probe_database(url, cluster_name, STORAGE_FORMAT)
        directory = DataDir(data_dir)
        directory.prepare_local()
        directory.release()
    except (DataDirError, DataDirInUseError) as exc:
        leadership.close()
        print(exc.message, file=sys.stderr)
        raise typer.Exit(1) from None
    gate = LeaderGate(standby_app(cluster_name, leadership))
    metrics_gate = LeaderGate(standby_app(cluster_name, leadership)) if metrics_port else None
    built: list[Cluster] = []
    failed: list[str] = []

    def lead() -> None:
        try:
            if not leadership.campaign():
                return  # stopping while standing by
            won = time.monotonic()
            cluster = Cluster.open_database(cluster_name, url, data_dir, config, leadership)
            built.append(cluster)
            secret = _start(cluster, data_dir, token, clusters_config)
            gate.serve(create_app(cluster, secret))
            if metrics_gate is not None:
                metrics_gate.serve(metrics_app(cluster.metrics.registry))
            log.info("engine serving as the leader", extra={
                "cluster": cluster_name, "epoch": leadership.epoch, "load_seconds": round(time.monotonic() - won, 3)})
        except BaseException as exc:  # noqa: BLE001 - a leader that cannot serve stops, its lease ended
            failed.append(exc.message if isinstance(exc, YtError) else f"{type(exc).__name__}: {exc}")
            log.error("the engine won the leadership but cannot serve; it stops",
                      extra={"cluster": cluster_name, "error": failed[-1]})
            leadership.close()
            _stop_this_process()

    leadership.on_lost = _stop_this_process
    log.info("engine starting as a standby", extra={"cluster": cluster_name, "host": host, "port": port,
                                                    "advertise_url": leadership.address, "data_dir": str(data_dir)})
    thread = threading.Thread(target=lead, name="leadership", daemon=True)
    thread.start()

    def on_exit() -> None:
        leadership.stop()
        if built:
            built[0].begin_stop()

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _run_until_stopped(leadership, gate, host, port, config,
                           metrics=(metrics_gate, metrics_port) if metrics_gate is not None and metrics_port else None,
                           on_exit=on_exit)
    finally:
        leadership.stop()
        thread.join(timeout=60)  # a node being built is closed once built
        if built:
            built[0].close()
        else:
            leadership.close()
        log.info("engine stopped", extra={"cluster": cluster_name})
    if failed:
        print(failed[0], file=sys.stderr)
        raise typer.Exit(1)
    _exit_if_stepped_down(leadership)


def _run_until_stopped(leadership: Leadership | None, app: Any, host: str, port: int, config: EngineConfig,
                       metrics: tuple[Any, int] | None, on_exit: Any) -> None:
    """``run_servers`` until SIGTERM; the SystemExit of a stop this engine asked for itself (it stepped
    down) is not the caller's to see (it exits with ``EXIT_STEPPED_DOWN``)."""
    from .api.server import run_servers

    try:
        run_servers(app, host, port, config, metrics=metrics, on_exit=on_exit)
    except SystemExit:
        if leadership is None or leadership.lost is None:
            raise


def _exit_if_stepped_down(leadership: Leadership | None) -> None:
    from .storage.leadership import EXIT_STEPPED_DOWN

    if leadership is not None and leadership.lost is not None:
        print(f"this engine stepped down: {leadership.lost}", file=sys.stderr)
        raise typer.Exit(EXIT_STEPPED_DOWN)


def _stop_this_process() -> None:
    """Stop serving as SIGTERM does (uvicorn's graceful stop, then the node closed)."""
    os.kill(os.getpid(), signal.SIGTERM)


def _default_address(host: str, port: int, config: EngineConfig) -> str:
    """Where this engine is reached when ``--advertise-url`` is not given."""
    scheme = "https" if config.tls_cert_file else "http"
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _transport_problem(config: EngineConfig, port: int, metrics_port: int | None) -> str | None:
    """Why the listeners or the peer CA cannot work as configured (None if they can)."""
    from .api.server import check_tls_files
    from .httpconn import client_ssl_context

    problem = check_tls_files(config)
    if problem is not None:
        return problem
    if config.peer_ca_file:
        try:
            client_ssl_context(config.peer_ca_file)
        except (OSError, ssl.SSLError) as exc:
            return f"cannot load the peer CA bundle {config.peer_ca_file} (--tls-ca-file): {exc}"
    if metrics_port and metrics_port == port:
        return f"--metrics-port must differ from --port ({port})"
    return None


def _storage_url(option: str | None) -> str | None:
    """The database URL: ``--storage`` (never with a password: a command line is visible to every
    user of the machine and lands in shell histories), else ``$REPTABLES_STORAGE`` (which may carry
    one: an environment variable from a Secret); None for SQLite in the data directory."""
    import sqlalchemy as sa

    url = option if option is not None else os.environ.get("REPTABLES_STORAGE") or None
    if url is None:
        return None
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as exc:
        # (the URL is not echoed: it may hold a password)
        several = "," in url.split("?", 1)[0]
        raise ValueError("--storage: the value is not a database URL (expected postgresql://USER@HOST:PORT/DB"
                         + ("; several hosts go in its query string, postgresql://USER@/DB?host=HOST1:PORT&"
                            "host=HOST2:PORT&target_session_attrs=read-write (docs/ha-postgres.md), not as "
                            "HOST1,HOST2" if several else "")
                         + f"): {type(exc).__name__}") from None
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"--storage: {parsed.get_backend_name()!r} is not a supported database (postgresql://...; "
                         "SQLite is the default, in --data-dir)")
    if option is not None and parsed.password is not None:
        raise ValueError("--storage: the URL carries a password; give it in $PGPASSWORD, a ~/.pgpass or $PGPASSFILE, "
                         "or the whole URL in $REPTABLES_STORAGE, never on the command line")
    return url


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    app()
