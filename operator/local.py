"""The local runner behind ``reptables up``: the product on one machine, no Kubernetes.

For now it starts one engine (a child process in its own process group, on a free loopback port)
and replays a short walkthrough with the official YTsaurus client: create and mount a sorted
dynamic table, write, look up, query, run a tablet transaction and read at a timestamp. Later
issues make it read manifests and run several clusters with replication.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(name: str, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "engine.log", "ab")  # noqa: SIM115 - the child keeps writing to it
    proc = subprocess.Popen(
        [sys.executable, "-m", "reptables.operator.cli", "engine", "serve", "--cluster-name", name,
         "--data-dir", str(data_dir), "--port", str(port)],
        stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine {name} exited early; see {data_dir / 'engine.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    raise RuntimeError(f"engine {name} did not become ready; see {data_dir / 'engine.log'}")


def stop_engine(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)


def walkthrough(proxy: str, token: str) -> None:
    import yt.wrapper as yt

    client = yt.YtClient(proxy=proxy, token=token)
    path = "//home/demo/users"
    schema = [{"name": "id", "type": "int64", "sort_order": "ascending"},
              {"name": "name", "type": "string"}, {"name": "score", "type": "double"}]
    if client.exists(path):
        client.unmount_table(path, sync=True)
        client.remove(path)
    client.create("table", path, recursive=True, attributes={"dynamic": True, "schema": schema})
    client.mount_table(path, sync=True)
    print(f"created and mounted {path}: tablet_state={client.get(path + '/@tablet_state')}")

    client.insert_rows(path, [{"id": i, "name": f"user{i}", "score": i * 1.5} for i in range(10)])
    before = client.generate_timestamp()
    print(f"inserted 10 rows; timestamp now {before}")
    print("lookup id=3:", list(client.lookup_rows(path, [{"id": 3}])))
    rows = list(client.select_rows(f"id % 2 as parity, sum(score) as total from [{path}] group by id % 2 as parity"))
    print("select by parity:", sorted(rows, key=lambda r: r["parity"]))

    with client.Transaction(type="tablet"):
        client.insert_rows(path, [{"id": 3, "name": "renamed", "score": 100.0}])
        client.delete_rows(path, [{"id": 4}])
    print("after a tablet transaction, id=3:", list(client.lookup_rows(path, [{"id": 3}])))
    print("id=3 read at the earlier timestamp:", list(client.lookup_rows(path, [{"id": 3}], timestamp=before)))
    print("rows now:", len(list(client.select_rows(f"* from [{path}]"))))


def run_walkthrough(data_dir: Path, port: int, keep_running: bool) -> int:
    port = port or _free_port()
    token_file = data_dir / "token"
    proc = start_engine("local", data_dir, port)
    proxy = f"http://127.0.0.1:{port}"
    try:
        token = token_file.read_text().strip()
        print(f"engine 'local' serving {proxy} (data in {data_dir}, token in {token_file})")
        walkthrough(proxy, token)
        if keep_running:
            print(f"engine keeps running; try: YT_PROXY={proxy} YT_TOKEN=$(cat {token_file}) yt list //home")
            proc.wait()
        return 0
    finally:
        stop_engine(proc)
