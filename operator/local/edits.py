"""``reptables promote|enable|disable REPLICA``: the local mode's ``kubectl reptables promote|enable|disable``.

On Kubernetes those commands merge-patch one field of a TableReplica's ``spec`` and the operator
applies it. Locally the manifests are the API server: ``reptables up`` watches its manifest files
and applies an edited file like ``kubectl apply`` (``runner.py``). So these commands edit the one
file that holds the TableReplica - one field, in place (:func:`~.manifests.set_spec_field`: the
value where it is written, or one new line; comments and layout stay) - and wait until the running
``up`` has taken the new spec (its ``state.json`` shows it). Nothing else is written and no engine
is called; ``up`` reconciles the change and reports it like any other edit.

They find the files in ``state.json`` (the paths ``up`` watches), so they need an ``up`` that ran on
the data directory; when none runs now, the file is edited anyway and the next ``up`` applies it.
The file is replaced atomically (a temporary file renamed over it, its mode kept), so ``up`` never
reads half of it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from ..terminal import display
from .state import CONTROL_TIMEOUT, LocalStateError, pid_alive, read_state

GROUP = "reptables.io"
#: the spec fields these commands set, and their defaults (an absent field has the default)
DEFAULTS: dict[str, Any] = {"mode": "async", "enabled": True}
DATA_DIR_HELP = "The data directory of `reptables up` (its state.json names the manifests it watches)"


@dataclass
class EditResult:
    """What an edit did: the lines for stdout, and the notes for stderr."""

    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _objects(state: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [o for o in state.get("objects") or [] if isinstance(o, dict) and o.get("kind") == kind]


def _find_replica(state: dict[str, Any], ref: str, data_dir: Path) -> dict[str, Any]:
    """The TableReplica named NAME or NAMESPACE/NAME in the state."""
    namespace, _, name = ref.rpartition("/")
    replicas = _objects(state, "TableReplica")
    found = [o for o in replicas if o["metadata"].get("name") == name
             and (not namespace or o["metadata"].get("namespace") == namespace)]
    if not found:
        known = ", ".join(sorted(f"{o['metadata'].get('namespace')}/{o['metadata'].get('name')}" for o in replicas))
        raise LocalStateError(f"TableReplica {ref} not found in the local state of {data_dir} "
                              f"(TableReplicas: {known or 'none'})")
    if len(found) > 1:
        raise LocalStateError(f"TableReplica {name} is in several namespaces "
                              f"({', '.join(sorted(str(o['metadata'].get('namespace')) for o in found))}): "
                              "give NAMESPACE/NAME")
    return found[0]


def _shown(file: Path) -> str:
    """A manifest's path as the user wrote it, roughly: relative to the working directory when under it."""
    try:
        return str(file.relative_to(Path.cwd()))
    except ValueError:
        return str(file)


def _write_atomically(file: Path, text: str) -> None:
    """Replace ``file`` with ``text`` (a temporary file in the same directory renamed over it, the
    file's mode kept): a reader - the watching ``up`` - sees the old file or the new one, never half."""
    mode = file.stat().st_mode & 0o7777
    # not *.yaml: the watcher never takes the temporary file for a manifest
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _applied(data_dir: Path, kind: str, namespace: str, name: str, field_name: str, value: Any) -> int | None:
    """The generation of the object once the running ``up`` shows the new value in state.json."""
    try:
        state = read_state(data_dir, require_running=False)
    except LocalStateError:
        return None
    for obj in _objects(state, kind):
        meta = obj.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) == (namespace, name):
            if (obj.get("spec") or {}).get(field_name, DEFAULTS[field_name]) == value:
                return int(meta.get("generation") or 1)
    return None


def edit_replica(data_dir: Path, ref: str, field_name: str, value: Any, what: str,
                 timeout: float = CONTROL_TIMEOUT) -> EditResult:
    """Set ``spec.<field_name>`` of a TableReplica in the manifest ``up`` watches; wait for ``up`` to take it."""
    # here, not at the top: ``reptables`` mounts these commands, and every one of its commands (an
    # engine's ``serve`` too) would otherwise load the operator's models to start
    from .manifests import ManifestError, find_object, set_spec_field

    state = read_state(data_dir, require_running=False)
    replica = _find_replica(state, ref, data_dir)
    namespace, name = str(replica["metadata"].get("namespace")), str(replica["metadata"]["name"])
    label = f"tablereplica.{GROUP}/{name}"
    result = EditResult()
    manifests = [Path(p) for p in state.get("manifests") or []]
    files = find_object(manifests, "TableReplica", namespace, name)
    if not files:
        raise LocalStateError(f"TableReplica {namespace}/{name}: no manifest of {', '.join(map(str, manifests))} "
                              "holds it any more")
    if len(files) > 1:
        raise LocalStateError(f"TableReplica {namespace}/{name} is written in {len(files)} manifests "
                              f"({', '.join(map(str, files))}); edit the one you mean by hand")
    file = files[0]
    text = file.read_text()
    try:
        edited = set_spec_field(file, text, "TableReplica", namespace, name, field_name, value)
    except ManifestError as exc:
        raise LocalStateError(str(exc)) from None
    if edited == text:
        result.lines.append(f"{label} unchanged: spec.{field_name} is already {json.dumps(value)} ({_shown(file)})")
        return result
    _write_atomically(file, edited)
    result.lines.append(f"{label} edited: spec.{field_name}: {json.dumps(value)} in {_shown(file)} ({what})")
    pid = state.get("pid")
    if not pid_alive(pid):
        result.notes.append(f"note: no `reptables up` runs for {data_dir}: the next one applies the change")
    else:
        deadline = time.monotonic() + timeout
        generation = None
        while generation is None and time.monotonic() < deadline and pid_alive(pid):
            generation = _applied(data_dir, "TableReplica", namespace, name, field_name, value)
            if generation is None:
                time.sleep(0.2)
        if generation is None:
            raise LocalStateError(f"`reptables up` (pid {pid}) did not take the edit of {file} within "
                                  f"{timeout:g} s (is the file among the manifests it watches?)")
        result.lines.append(f"reptables up (pid {pid}) applied it: TableReplica {namespace}/{name} is at generation "
                            f"{generation}; `reptables status` shows the replica when it is reconciled")
    if field_name == "mode" and (replica.get("spec") or {}).get("enableReplicatedTableTracker", True):
        table_name = str((replica.get("spec") or {}).get("table"))
        table = next((t for t in _objects(state, "ReplicatedTable") if t["metadata"].get("name") == table_name
                      and t["metadata"].get("namespace") == namespace), None)
        options = ((table or {}).get("spec") or {}).get("replicatedTableOptions") or {}
        if options.get("enableReplicatedTableTracker"):
            result.notes.append(f"note: the tracker of ReplicatedTable {namespace}/{table_name} owns this replica's "
                                "mode and may switch it back; set spec.enableReplicatedTableTracker: false on the "
                                "replica to keep it")
    return result


# -- the commands --------------------------------------------------------------------------------------

ReplicaArgument = Annotated[str, typer.Argument(help="The TableReplica: NAME or NAMESPACE/NAME.")]
DataDirOption = Annotated[Path, typer.Option("--data-dir", help=DATA_DIR_HELP)]


def _run(data_dir: Path, ref: str, field_name: str, value: Any, what: str) -> None:
    try:
        result = edit_replica(data_dir, ref, field_name, value, what)
    except (LocalStateError, OSError) as exc:
        typer.echo(display(f"error: {exc}", multiline=True), err=True)
        raise typer.Exit(1) from None
    for line in result.lines:
        typer.echo(display(line))
    for note in result.notes:
        typer.echo(display(note), err=True)


def promote(replica: ReplicaArgument, data_dir: DataDirOption = Path(".data/local")) -> None:
    """Make a replica synchronous: sets spec.mode to sync in its manifest (the running `reptables up` applies it)."""
    _run(data_dir, replica, "mode", "sync", "promote to sync")


def disable(replica: ReplicaArgument, data_dir: DataDirOption = Path(".data/local")) -> None:
    """Stop replicating to a replica: sets spec.enabled to false in its manifest (it keeps its position)."""
    _run(data_dir, replica, "enabled", False, "disable")


def enable(replica: ReplicaArgument, data_dir: DataDirOption = Path(".data/local")) -> None:
    """Resume replicating to a replica: sets spec.enabled to true in its manifest (it catches up from its position)."""
    _run(data_dir, replica, "enabled", True, "enable")


def register(app: typer.Typer) -> None:
    """Mount ``promote``, ``disable`` and ``enable`` as commands of ``app`` (the ``reptables`` command)."""
    for command in (promote, disable, enable):
        app.command()(command)


#: the three commands on their own (``python -m reptables.operator.local.edits promote NAME``)
app = typer.Typer(help="Spec edits of a TableReplica in the manifests `reptables up` watches (the local "
                       "`kubectl reptables promote|disable|enable`).", no_args_is_help=True,
                  pretty_exceptions_enable=False)
register(app)


if __name__ == "__main__":
    app(prog_name="reptables")
