"""The state directory of ``reptables up``, as the other local commands see it.

``reptables up`` keeps ``state.json`` (objects with status, recent events, engines, its pid) and a
``control/`` directory in its data directory; ``reptables status``, ``cluster stop|start|kill`` and ``env``
are separate processes that read the one and write requests into the other (docs/local.md). This
module is that shared ground: the file names, the private data directory, atomic private writes,
whether the ``up`` process still runs, and the readers' side. It imports nothing of the runner, so
the commands stay light.

The data directory is its user's alone (0700, every file in it 0600): it holds the engines' tokens,
the Spark jobs' credentials, table rows and the logs that may quote them. A directory made by an
older ``up``, by hand or by ``mkdir -p`` is 0755; :func:`make_private_dir` tightens it and what is in
it, and says so, rather than serve from it as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: the state file ``reptables up`` keeps in its data directory (read by ``reptables status``/``env``)
STATE_FILE = "state.json"
#: where ``reptables cluster stop|start|kill`` leave their requests for the running ``up``
CONTROL_DIR = "control"
#: the record of the demo rows ``up`` wrote, in the first run on the data directory (never again)
DEMO_FILE = "demo.json"
#: how long ``reptables cluster stop|start|kill`` waits for the running ``up`` to carry a request out
CONTROL_TIMEOUT = 30.0


def write_private(path: Path, text: str) -> None:
    """Write a file atomically (temp file + rename) with mode 0600: readers never see half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def make_private_dir(data_dir: Path) -> str | None:
    """Create ``data_dir`` (and missing parents) with mode 0700, or make an existing one private: the
    directory and the directories in it 0700, the files in it without the group's and others' bits
    (0600; symbolic links are left alone, and not followed). Returns a one-line notice of what was
    tightened, or None when everything was private already."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    failed: list[str] = []

    def tighten(path: Path, is_dir: bool) -> int | None:
        """The mode ``path`` had if it was open to others (and is now private), else None."""
        try:
            info = path.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode) or not mode & 0o077:
                return None
            os.chmod(path, 0o700 if is_dir else mode & 0o700)
            return mode
        except FileNotFoundError:
            return None  # removed meanwhile (a temporary file)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
            return None

    top = tighten(data_dir, True)
    inside = 0
    for root, dirs, files in os.walk(data_dir):  # never into a link to a directory
        inside += sum(tighten(Path(root) / name, True) is not None for name in dirs)
        inside += sum(tighten(Path(root) / name, False) is not None for name in files)
    if top is None and not inside and not failed:
        return None
    what = [f"{data_dir} (mode {top:04o}) is now 0700"] if top is not None else []
    if inside:
        what.append(f"{inside} files and directories in it are now 0600/0700")
    if failed:
        what.append(f"{len(failed)} could not be changed ({'; '.join(failed[:3])})")
    return f"notice: the data directory was open to other users: {', '.join(what)}"


def demo_due(data_dir: Path) -> bool:
    """Whether ``up`` may write its demo rows into ``data_dir``: only the first ``up`` on a directory,
    one with neither a state file (an ``up`` ran there: its tables hold the user's rows now) nor a
    demo record. Asked before the runner creates anything in it."""
    return not (data_dir / STATE_FILE).exists() and not (data_dir / DEMO_FILE).exists()


def demo_skipped(data_dir: Path) -> str:
    """The line ``up`` prints instead of writing demo rows into a directory used before."""
    try:
        record = json.loads((data_dir / DEMO_FILE).read_text())
        when = f"demo rows were written on {record['written']}" if isinstance(record, dict) else ""
    except (OSError, ValueError, KeyError):
        when = ""
    return (f"demo: not written again: {data_dir} was used before ({when + ', ' if when else ''}the tables keep "
            "their rows as they are)")


def record_demo(data_dir: Path, rows: int, tables: list[str]) -> None:
    """Record in the data directory that the demo wrote its rows (``D/demo.json``, mode 0600)."""
    write_private(data_dir / DEMO_FILE, json.dumps({
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "tables": tables}, indent=1))


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (a zombie or a process of another user counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True



class LocalStateError(Exception):
    """No usable state: no ``reptables up`` runs for the directory, the state is missing, or a bad name."""


def read_state(data_dir: Path, require_running: bool = True) -> dict[str, Any]:
    """The state.json of ``reptables up --data-dir DATA_DIR``; LocalStateError saying why not."""
    path = data_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalStateError(f"no local state in {data_dir} ({path} is missing): start "
                              f"`reptables up --keep-running --data-dir {data_dir}` first") from None
    except (OSError, ValueError) as exc:
        raise LocalStateError(f"the local state {path} cannot be read: {exc}") from None
    if not isinstance(state, dict):
        raise LocalStateError(f"the local state {path} is not an object")
    if require_running and not pid_alive(state.get("pid")):
        raise LocalStateError(f"no `reptables up` runs for {data_dir}: its process (pid {state.get('pid')}) is "
                              f"gone; its last state is from {state.get('updated')}")
    return state


def running_up(data_dir: Path) -> int | None:
    """The pid of another ``reptables up`` running on this data directory, if any."""
    try:
        pid = read_state(data_dir).get("pid")
    except LocalStateError:
        return None
    return pid if isinstance(pid, int) and pid != os.getpid() else None


def _table_cluster(state: dict[str, Any], name: str, data_dir: Path) -> None:
    clusters = sorted(o["metadata"]["name"] for o in state.get("objects", []) if o.get("kind") == "TableCluster")
    if name not in clusters:
        raise LocalStateError(f"TableCluster {name} not found in the local state of {data_dir} "
                              f"(TableClusters: {', '.join(clusters) or 'none'})")


def request_control(data_dir: Path, action: str, cluster: str,
                    timeout: float = CONTROL_TIMEOUT) -> tuple[bool, str]:
    """Ask the running ``up`` to stop, start or kill a cluster's engine; wait for its answer (ok, message)."""
    if action not in ("stop", "start", "kill"):
        raise LocalStateError(f"unknown action {action!r} (stop, start or kill)")
    state = read_state(data_dir)
    _table_cluster(state, cluster, data_dir)
    control = data_dir / CONTROL_DIR
    control.mkdir(mode=0o700, exist_ok=True)
    ident = uuid.uuid4().hex
    request = control / f"{ident}.request.json"
    result = control / f"{ident}.result.json"
    write_private(request, json.dumps({"action": action, "cluster": cluster}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.exists():
            answer = json.loads(result.read_text())
            result.unlink()
            return bool(answer.get("ok")), str(answer.get("message"))
        if not pid_alive(state.get("pid")):
            break
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        request.unlink()
    raise LocalStateError(f"`reptables up` (pid {state.get('pid')}) did not {action} TableCluster {cluster} "
                          f"within {timeout:g} s")


def env_lines(data_dir: Path, cluster: str) -> list[str]:
    """``export YT_PROXY=...`` and ``export YT_TOKEN=...`` for a local engine (the official yt CLI reads them)."""
    import shlex

    state = read_state(data_dir, require_running=False)
    _table_cluster(state, cluster, data_dir)
    engine = (state.get("engines") or {}).get(cluster)
    if not isinstance(engine, dict):
        raise LocalStateError(f"TableCluster {cluster}: `reptables up` started no engine for it")
    endpoint = str(engine.get("endpoint"))
    if urlparse(endpoint).hostname not in LOOPBACK:
        raise LocalStateError(f"TableCluster {cluster}: {endpoint} is not a loopback endpoint of the local runner")
    token_file = data_dir / cluster / "token"
    if engine.get("members"):  # an HA table cluster: each of its engines has the token (group.py)
        token_file = next(iter(sorted((data_dir / cluster).glob("member-*/token"))), token_file)
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise LocalStateError(f"TableCluster {cluster}: its token file {token_file} cannot be read: "
                              f"{exc.strerror}") from None
    return [f"export YT_PROXY={shlex.quote(endpoint)}", f"export YT_TOKEN={shlex.quote(token)}"]
