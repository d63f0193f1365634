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
"""

from __future__ import annotations

import gc
import json
import logging
import os
import secrets
import signal
import ssl
import sys
from pathlib import Path
from typing import Annotated

import typer
import yt.yson as yson

from . import logs
from .api import create_app
from .api.server import check_tls_files, metrics_app, run_servers
from .config import DEFAULT_CONFIG, EngineConfig
from .errors import DataDirError, DataDirInUseError
from .httpconn import client_ssl_context
from .node import Cluster

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
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Serve the YTsaurus HTTP API for one table cluster."""
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
                                       bootstrap_pin_ttl=bootstrap_pin_ttl,
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
    try:
        cluster = Cluster.open(cluster_name, data_dir, config) if url is None else \
            Cluster.open_database(cluster_name, url, data_dir, config)
    except DataDirInUseError as exc:
        # another engine serves the directory (its pid in the message); nothing was touched
        print(exc.message, file=sys.stderr)
        raise typer.Exit(1) from None
    except DataDirError as exc:
        # logged once by Cluster.open; the reason, without a traceback, and a failed exit
        print(exc.message, file=sys.stderr)
        raise typer.Exit(1) from None
    # after the directory's lock: a refused second engine must not rewrite the serving one's token
    secret = resolve_token(data_dir, token)
    if clusters_config is not None:
        raw = clusters_config.read_bytes()
        as_json = raw.lstrip().startswith(b"{\"") or clusters_config.suffix == ".json"
        cluster.nodes.load_directory(json.loads(raw) if as_json else yson.loads(raw))
    cluster.start_background()
    gc.freeze()
    log.info("engine starting", extra={"cluster": cluster_name, "host": host, "port": port,
                                       "tls": bool(config.tls_cert_file), "metrics_port": metrics_port or None,
                                       "data_dir": str(data_dir)})
    # uvicorn stops serving on SIGTERM and then raises the signal again: with this handler that ends
    # in SystemExit, so the cluster below is closed (checkpoint, WAL removed, data dir marked stopped)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        run_servers(create_app(cluster, secret), host, port, config,
                    metrics=(metrics_app(cluster.metrics.registry), metrics_port) if metrics_port else None,
                    on_exit=cluster.begin_stop)
    finally:
        cluster.close()
        log.info("engine stopped", extra={"cluster": cluster_name})


def _transport_problem(config: EngineConfig, port: int, metrics_port: int | None) -> str | None:
    """Why the listeners or the peer CA cannot work as configured (None if they can)."""
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
    except sa.exc.ArgumentError:
        raise ValueError(f"--storage: {url[:60]!r} is not a database URL (expected postgresql://USER@HOST:PORT/DB)")\
            from None
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
