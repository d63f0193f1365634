"""``kubectl reptables``: the kubectl plugin — status, tracker history, bootstrap progress, and spec edits.

kubectl runs any ``kubectl-<name>`` executable on PATH as ``kubectl <name>``; this one ships with the
package (the ``kubectl-reptables`` console script). Like CloudNativePG's ``kubectl cnpg status`` it
answers "is my replication healthy?" in one screen, from what the operator already wrote into the
objects' status and Events: it reads through the Kubernetes API only (the official client, the
user's kubeconfig and RBAC) and never talks to an engine. The view itself is
:mod:`reptables.operator.kubectl.statusview`, shared with the local runner. ``promote``/``disable``/``enable``
are merge patches of a TableReplica's spec — the operator applies them, exactly as it applies a
``kubectl edit``. Every failure is one line on stderr and exit code 1, never a traceback.

Names, paths and messages in the text output come from the objects and the API server; every line
the plugin prints passes them through :func:`~reptables.operator.terminal.display` (the status views do
it in ``statusview``), so escape sequences in them are shown, not obeyed. ``-o json``/``-o yaml`` print
the objects' values exactly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from rich.console import Console

from .. import models
from ..models import GROUP, VERSION
from ..terminal import display
from . import statusview

__all__ = ["USER_AGENT", "app", "main"]

USER_AGENT = "kubectl-reptables"
SWITCH_REASON = "ReplicaModeChanged"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
REQUEST_TIMEOUT = (5.0, 30.0)
#: kind -> plural, and the kinds without a namespace: from the API models, as the CRDs are
PLURALS = models.PLURALS
CLUSTER_SCOPED = frozenset(kind for kind, model in models.KINDS.items() if model.info.scope is models.Scope.CLUSTER)
#: kinds the view can do without: a warning (not a failure) when RBAC hides them or their CRD is not installed
OPTIONAL_KINDS = frozenset({"XdcrGroup"})

app = typer.Typer(name="kubectl-reptables", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False,
                  help="Status of reptables replicated tables, tracker switches and bootstraps; promote, disable "
                       "or enable a TableReplica (spec edits the operator applies).")


class PluginError(Exception):
    """A failure to report as one line on stderr (exit code 1)."""


class Output(StrEnum):
    TEXT = "text"
    JSON = "json"
    YAML = "yaml"


KubeconfigOption = Annotated[str | None, typer.Option(
    "--kubeconfig", help="Path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).")]
ContextOption = Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")]
NamespaceOption = Annotated[str | None, typer.Option(
    "--namespace", "-n", help="Namespace of the tables and replicas (default: the context's namespace).")]
AllNamespacesOption = Annotated[bool | None, typer.Option(
    "--all-namespaces", "-A", help="Read tables and replicas in every namespace.")]
OutputOption = Annotated[Output, typer.Option("--output", "-o", help="text, json or yaml.")]


@dataclass
class Target:
    """Where to connect: the global flags, overridden by the same flags given after the command."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False

    def merged(self, kubeconfig: str | None, context: str | None, namespace: str | None,
               all_namespaces: bool | None) -> Target:
        return Target(kubeconfig or self.kubeconfig, context or self.context, namespace or self.namespace,
                      self.all_namespaces if all_namespaces is None else all_namespaces)


# --- the Kubernetes API ---------------------------------------------------------------------------


def _message(exc: ApiException) -> str:
    """The API server's own message (a Status object's ``message``), else the HTTP reason."""
    body: Any = exc.body
    try:
        parsed = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])
    return f"{exc.status} {exc.reason}"


def _as_dict(answer: object) -> dict[str, Any]:
    """CustomObjectsApi answers are decoded JSON objects."""
    if not isinstance(answer, dict):
        raise PluginError(f"unexpected answer from the Kubernetes API: {type(answer).__name__}")
    return answer


def _unreachable(exc: BaseException) -> str:
    reason = str(getattr(exc, "reason", None) or exc)
    marker = "Failed to establish a new connection: "
    return reason.split(marker, 1)[1] if marker in reason else reason


class Kube:
    """The reads and patches the plugin makes, through the official client."""

    def __init__(self, target: Target) -> None:
        configuration = client.Configuration()
        namespace = target.namespace
        try:
            if target.kubeconfig or os.environ.get("KUBECONFIG") or Path("~/.kube/config").expanduser().exists() \
                    or not os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_kube_config(config_file=target.kubeconfig, context=target.context,
                                        client_configuration=configuration, persist_config=False)
                namespace = namespace or self._context_namespace(target)
            else:
                config.load_incluster_config(client_configuration=configuration)
                if namespace is None and SERVICE_ACCOUNT_NAMESPACE.exists():
                    namespace = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            where = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise PluginError(f"cannot load the Kubernetes configuration ({where}): {exc}") from None
        configuration.retries = 1
        self.host = str(configuration.host)
        self.api_client = client.ApiClient(configuration)
        self.api_client.user_agent = USER_AGENT
        self.custom = client.CustomObjectsApi(self.api_client)
        self.namespace = namespace or "default"
        self.all_namespaces = target.all_namespaces

    @staticmethod
    def _context_namespace(target: Target) -> str | None:
        contexts, active = config.list_kube_config_contexts(config_file=target.kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == target.context), None) if target.context else active
        return ((chosen or {}).get("context") or {}).get("namespace")

    def close(self) -> None:
        self.api_client.close()

    def list_objects(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every reptables object the view needs: the cluster-scoped kinds, and the namespaced kinds in scope."""
        namespace = namespace or self.namespace
        objects: list[dict[str, Any]] = []
        for kind, plural in PLURALS.items():
            try:
                if kind in CLUSTER_SCOPED or self.all_namespaces:
                    answer = self.custom.list_cluster_custom_object(GROUP, VERSION, plural,
                                                                    _request_timeout=REQUEST_TIMEOUT)
                else:
                    answer = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                                       _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if kind in OPTIONAL_KINDS and exc.status in (403, 404):  # RBAC, or an install older than the kind
                    typer.echo(display(f"warning: cannot list {plural}.{GROUP} ({_message(exc)}): {kind}s are not "
                                       "shown"), err=True)
                    continue
                raise
            for item in _as_dict(answer).get("items") or []:
                item.setdefault("kind", kind)  # list items may omit it
                objects.append(item)
        return objects

    def switch_events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The tracker's ReplicaModeChanged Events; a warning (not a failure) when RBAC hides Events."""
        try:
            items = self._list_events(namespace or self.namespace, f"reason={SWITCH_REASON}")
        except ApiException as exc:
            if exc.status in (401, 403, 404):
                typer.echo(display(f"warning: cannot read Events ({_message(exc)}): tracker switches are not shown"),
                           err=True)
                return []
            raise
        return [e for e in items if e.get("reason") == SWITCH_REASON]

    def _list_events(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Events as JSON, through the client's ApiClient (its configuration, authentication, retries and
        TLS) without ``CoreV1Api``: that class's module builds the typed models of the whole core API
        when imported, which cost more CPU than everything else a ``status`` does (it read raw JSON anyway)."""
        path = "/api/v1/events" if self.all_namespaces else "/api/v1/namespaces/{namespace}/events"
        request = self.api_client.param_serialize(
            method="GET", resource_path=path, path_params={} if self.all_namespaces else {"namespace": namespace},
            query_params=[("fieldSelector", selector)], header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        response = self.api_client.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
        body = response.read() or b""
        if not 200 <= int(response.status) < 300:
            raise ApiException(status=response.status, reason=response.reason, body=body.decode(errors="replace"))
        return list(json.loads(body).get("items") or [])

    def get_replica(self, name: str) -> dict[str, Any]:
        try:
            return _as_dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "tablereplicas",
                                                                 name, _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                raise PluginError(f"TableReplica {self.namespace}/{name} not found") from None
            raise

    def get_table(self, name: str) -> dict[str, Any] | None:
        try:
            return _as_dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                 "replicatedtables", name,
                                                                 _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_replica_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return _as_dict(self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "tablereplicas", name, {"spec": spec},
            _content_type="application/merge-patch+json", _request_timeout=REQUEST_TIMEOUT))


@contextmanager
def _connected(ctx: typer.Context, kubeconfig: str | None, context: str | None, namespace: str | None,
               all_namespaces: bool | None) -> Iterator[Kube]:
    """A client for the merged flags; every failure inside becomes one stderr line and exit code 1."""
    base = ctx.obj if isinstance(ctx.obj, Target) else Target()
    target = base.merged(kubeconfig, context, namespace, all_namespaces)
    kube: Kube | None = None
    try:
        kube = Kube(target)
        yield kube
    except PluginError as exc:
        _fail(str(exc))
    except ValueError as exc:  # statusview: unknown table or replica
        _fail(str(exc))
    except ApiException as exc:
        host = kube.host if kube else "the API server"
        if exc.status == 403:
            _fail(f"forbidden by the Kubernetes API at {host}: {_message(exc)}")
        if exc.status == 401:
            _fail(f"unauthorized by the Kubernetes API at {host}: check the kubeconfig credentials")
        if exc.status == 404:
            _fail(f"not found: {_message(exc)} (are the reptables CRDs installed? see docs/install.md)")
        _fail(f"the Kubernetes API at {host} refused the request: {_message(exc)}")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        host = kube.host if kube else "the API server"
        _fail(f"cannot reach the Kubernetes API at {host}: {_unreachable(exc)}")
    finally:
        if kube is not None:
            kube.close()


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {display(message)}", err=True)
    raise typer.Exit(1)


def _console() -> Console:
    """Piped output (no terminal, no $COLUMNS) gets wide lines, so grep sees whole rows."""
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=200 if wide else None, highlight=False)


def _emit(data: Any, output: Output) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)


def _split_table(table: str | None) -> tuple[str | None, str | None]:
    """``ns/name`` -> (ns, "ns/name"): the namespace to list in, and the filter."""
    if table and "/" in table:
        return table.split("/", 1)[0], table
    return None, table


# --- commands -------------------------------------------------------------------------------------


@app.callback()
def _root(ctx: typer.Context, kubeconfig: KubeconfigOption = None, context: ContextOption = None,
          namespace: NamespaceOption = None, all_namespaces: AllNamespacesOption = None) -> None:
    ctx.obj = Target(kubeconfig, context, namespace, bool(all_namespaces))


def _table_view(kube: Kube, table: str | None) -> dict[str, Any]:
    """The status view of every table (or of ``table``: NAME or NAMESPACE/NAME) and the tracker's switches."""
    in_namespace, wanted = _split_table(table)
    return statusview.build_view(kube.list_objects(in_namespace), kube.switch_events(in_namespace), wanted)


@app.command()
def status(ctx: typer.Context, table: Annotated[str | None, typer.Argument(
               help="One ReplicatedTable: NAME or NAMESPACE/NAME.")] = None,
           output: OutputOption = Output.TEXT, kubeconfig: KubeconfigOption = None, context: ContextOption = None,
           namespace: NamespaceOption = None, all_namespaces: AllNamespacesOption = None) -> None:
    """Each replicated table: Ready, sync replicas, tracker decision, and per replica mode, state, lag, bootstrap."""
    with _connected(ctx, kubeconfig, context, namespace, all_namespaces) as kube:
        view = _table_view(kube, table)
        if output is Output.TEXT:
            statusview.render(view, _console())
        else:
            _emit(view, output)


@app.command()
def tracker(ctx: typer.Context, table: Annotated[str | None, typer.Argument(
                help="One ReplicatedTable: NAME or NAMESPACE/NAME.")] = None,
            output: OutputOption = Output.TEXT, kubeconfig: KubeconfigOption = None, context: ContextOption = None,
            namespace: NamespaceOption = None, all_namespaces: AllNamespacesOption = None) -> None:
    """The tracker's recent switches and why (ReplicaModeChanged Events) and each table's last decision."""
    with _connected(ctx, kubeconfig, context, namespace, all_namespaces) as kube:
        view = _table_view(kube, table)
        if output is Output.TEXT:
            statusview.render_tracker(view, _console())
        else:
            _emit({"tables": [{"namespace": t["namespace"], "name": t["name"], "syncReplicas": t["syncReplicas"],
                               "tracker": t["tracker"]} for t in view["tables"]],
                   "trackerSwitches": view["trackerSwitches"]}, output)


@app.command()
def bootstrap(ctx: typer.Context, replica: Annotated[str, typer.Argument(
                  metavar="TABLE/REPLICA", help="The TableReplica (TABLE/REPLICA, or just REPLICA).")],
              output: OutputOption = Output.TEXT, kubeconfig: KubeconfigOption = None,
              context: ContextOption = None, namespace: NamespaceOption = None) -> None:
    """A replica's bootstrap copy: phase, snapshot, attempts, rows copied, job, last error, next attempt."""
    with _connected(ctx, kubeconfig, context, namespace, False) as kube:
        table = replica.rsplit("/", 1)[0] if "/" in replica else None
        view = statusview.build_view(kube.list_objects(), [], table)
        if output is Output.TEXT:
            statusview.render_bootstrap(view, _console(), replica)
        else:
            found_table, found = statusview.find_replica(view, replica)
            _emit({"namespace": found_table["namespace"], "table": found_table["name"], "replica": found["name"],
                   "state": found["state"], "mode": found["mode"], "bootstrap": found["bootstrap"]}, output)


def _edit(ctx: typer.Context, name: str, field: str, value: Any, what: str, kubeconfig: str | None,
          context: str | None, namespace: str | None) -> None:
    """Merge-patch one field of a TableReplica's spec (unless it already holds the value)."""
    with _connected(ctx, kubeconfig, context, namespace, False) as kube:
        current = kube.get_replica(name)
        spec = current.get("spec") or {}
        default = {"mode": "async", "enabled": True}[field]
        ref = f"tablereplica.{GROUP}/{name}"
        if spec.get(field, default) == value:
            typer.echo(display(f"{ref} unchanged: spec.{field} is already {json.dumps(value)}"))
            return
        kube.patch_replica_spec(name, {field: value})
        typer.echo(display(f"{ref} patched: spec.{field}: {json.dumps(value)} ({what}; the operator applies it)"))
        if field == "mode" and spec.get("enableReplicatedTableTracker", True):
            table = kube.get_table(str(spec.get("table")))
            options = ((table or {}).get("spec") or {}).get("replicatedTableOptions") or {}
            if options.get("enableReplicatedTableTracker"):
                typer.echo(display(f"note: the tracker of ReplicatedTable {kube.namespace}/{spec.get('table')} owns "
                                   "this replica's mode and may switch it back; set "
                                   "spec.enableReplicatedTableTracker: false on the replica to keep it"), err=True)


@app.command()
def promote(ctx: typer.Context, replica: Annotated[str, typer.Argument(help="Name of the TableReplica.")],
            kubeconfig: KubeconfigOption = None, context: ContextOption = None,
            namespace: NamespaceOption = None) -> None:
    """Make a replica synchronous: sets spec.mode to sync (a spec edit; no engine is called)."""
    _edit(ctx, replica, "mode", "sync", "promote to sync", kubeconfig, context, namespace)


@app.command()
def disable(ctx: typer.Context, replica: Annotated[str, typer.Argument(help="Name of the TableReplica.")],
            kubeconfig: KubeconfigOption = None, context: ContextOption = None,
            namespace: NamespaceOption = None) -> None:
    """Stop replicating to a replica: sets spec.enabled to false (it keeps its position)."""
    _edit(ctx, replica, "enabled", False, "disable", kubeconfig, context, namespace)


@app.command()
def enable(ctx: typer.Context, replica: Annotated[str, typer.Argument(help="Name of the TableReplica.")],
           kubeconfig: KubeconfigOption = None, context: ContextOption = None,
           namespace: NamespaceOption = None) -> None:
    """Resume replicating to a replica: sets spec.enabled to true (it catches up from its position)."""
    _edit(ctx, replica, "enabled", True, "enable", kubeconfig, context, namespace)


def main() -> None:
    """Console-script entry point (``kubectl-reptables``, run by kubectl as ``kubectl reptables``)."""
    app(prog_name="kubectl reptables")
