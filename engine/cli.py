"""``reptables engine serve``: run one engine process serving one table cluster.

The token is taken from ``--token``, else ``REPTABLES_TOKEN``, else generated and written to
``DATA_DIR/token`` (mode 0600) *before* the port opens, so ``YT_TOKEN=$(cat DATA_DIR/token)``
works for the official client as soon as the engine answers.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
import yt.yson as yson

from . import logs
from .api import create_app
from .config import DEFAULT_CONFIG, EngineConfig
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
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)
    return token


@app.command()
def serve(
    cluster_name: Annotated[str, typer.Option("--cluster-name", help="Name of this table cluster")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Directory for the SQLite database and token")],
    port: Annotated[int, typer.Option("--port", help="HTTP port")] = 9012,
    host: Annotated[str, typer.Option("--host", help="Address to listen on")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option("--token", help="API token (default: $REPTABLES_TOKEN, or "
                                                              "generated into DATA_DIR/token)")] = None,
    clusters_config: Annotated[Path | None, typer.Option(
        "--clusters-config", help="JSON or YSON map {name: {proxy_url; token}} merged into //sys/clusters")] = None,
    sync_replica_timeout: Annotated[float, typer.Option(
        "--sync-replica-timeout", help="Seconds a commit waits for a sync replica")] = DEFAULT_CONFIG.sync_timeout,
    log_level: Annotated[str, typer.Option("--log-level")] = "info",
) -> None:
    """Serve the YTsaurus HTTP API for one table cluster."""
    logs.configure(log_level)
    # a 10,000-row batch allocates ~100k objects: with the default thresholds the cyclic collector
    # runs several full passes per batch (tens of ms); the engine creates few reference cycles
    gc.set_threshold(100_000, 50, 100)
    secret = resolve_token(data_dir, token)
    # the one place that reads the environment: the process' settings, handed down as one object
    config = EngineConfig.from_env(sync_timeout=sync_replica_timeout)
    cluster = Cluster.open(cluster_name, data_dir, config)
    if clusters_config is not None:
        raw = clusters_config.read_bytes()
        cluster.load_directory(json.loads(raw) if raw.lstrip().startswith(b"{\"") or clusters_config.suffix == ".json"
                               else yson.loads(raw))
    cluster.start_background()
    gc.freeze()
    log.info("engine starting", extra={"cluster": cluster_name, "host": host, "port": port,
                                       "data_dir": str(data_dir)})
    try:
        uvicorn.run(create_app(cluster, secret), host=host, port=port, log_level="warning",
                    access_log=False, timeout_graceful_shutdown=10)
    finally:
        cluster.close()
        log.info("engine stopped", extra={"cluster": cluster_name})


if __name__ == "__main__":
    app()
