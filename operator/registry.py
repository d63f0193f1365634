"""An in-memory view of the custom resources and Secrets, shared by handlers and the local runner.

Reconcilers need to see other resources (a TableReplica needs its ReplicatedTable; two resources
claiming one table must find each other; the tracker needs every tracked table). The handlers feed this
registry from watch events; the local runner feeds it from manifest files. Both then hand
:meth:`Registry.world` to the reconcile core, which never talks to Kubernetes itself.

Secrets are credentials, and who may create a TableCluster is not who owns a Secret: a TableCluster
names any Secret, and the operator sends that Secret's token to the TableCluster's endpoint. So the
registry keeps only what the :class:`CredentialPolicy` lets a TableCluster use — Secrets in the
allowed namespaces, labelled ``reptables.io/credentials: "true"`` (the operator watches only those),
and, when the Secret says so (annotation ``reptables.io/table-clusters``), only for the TableClusters
it names. A TableCluster referring to anything else gets a problem with a reason and a message
naming the Secret, and is dropped from :class:`~.controllers.world.Engines`: nothing is sent to its endpoint and
no engine's directory lists it. Secret values are bytes: a value that is not a usable token (binary,
not ASCII, whitespace such as the newline ``echo`` adds, empty) is a problem too, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson

from .controllers.world import ClusterRef, DatabaseClusters, Engines, Resource, TrackerJournal, World
from .jobs.launcher import Launcher
from .models import InvalidResourceError, parse_resource

DEFAULT_SECRET_KEY = "token"
#: the label that marks a Secret as reptables credentials; the operator watches no other Secret
CREDENTIALS_LABEL = "reptables.io/credentials"
CREDENTIALS_LABEL_VALUE = "true"
#: the label selector of the operator's Secret watch
CREDENTIALS_SELECTOR = f"{CREDENTIALS_LABEL}={CREDENTIALS_LABEL_VALUE}"
#: optional annotation: the comma-separated TableClusters that may use the Secret (absent: any)
TABLE_CLUSTERS_ANNOTATION = "reptables.io/table-clusters"
#: a token goes into an HTTP header; longer values are certainly not tokens
MAX_TOKEN_BYTES = 4096

T = TypeVar("T")

# reasons of the TableCluster's Ready=False when its credentials cannot be used
SECRET_NOT_FOUND = "SecretNotFound"
SECRET_NOT_ALLOWED = "SecretNotAllowed"
SECRET_INVALID = "SecretInvalid"


@dataclass(frozen=True)
class CredentialPolicy:
    """Which Secrets a TableCluster may take its token from."""

    namespaces: frozenset[str] | None
    """Namespaces credential Secrets may be in; None: any (the local runner reads only your files)."""
    require_label: bool = True
    """Only Secrets labelled ``reptables.io/credentials: "true"`` count."""

    def allows_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


@dataclass(frozen=True)
class ClusterProblem:
    """Why a TableCluster cannot be connected: the reason of its Ready=False and a message."""

    reason: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class _Secret:
    labelled: bool
    clusters: frozenset[str] | None  # from TABLE_CLUSTERS_ANNOTATION; None: any TableCluster
    data: Mapping[str, bytes] = field(default_factory=dict)
    undecodable: Mapping[str, str] = field(default_factory=dict)  # key -> why its value is unreadable


def parse_token(raw: bytes) -> str:
    """The token in a Secret value; raises ValueError saying why the bytes are not a usable token."""
    if not raw:
        raise ValueError("is empty")
    if len(raw) > MAX_TOKEN_BYTES:
        raise ValueError(f"is {len(raw)} bytes long; a token has at most {MAX_TOKEN_BYTES}")
    for offset, byte in enumerate(raw):
        if byte > 0x7E:
            raise ValueError(f"is not a text token: byte 0x{byte:02x} at offset {offset} is not ASCII")
        if byte <= 0x20:
            hint = " (a trailing newline, as `echo` adds, is a common cause)" if byte == 0x0A else ""
            raise ValueError(f"contains a whitespace or control character (0x{byte:02x}) at offset {offset}{hint}")
    return raw.decode("ascii")


def _decode(body: Mapping[str, Any]) -> tuple[dict[str, bytes], dict[str, str]]:
    """(values as bytes, keys whose value cannot be read -> why); never decodes bytes as text."""
    data: dict[str, bytes] = {}
    undecodable: dict[str, str] = {}
    for key, value in (body.get("data") or {}).items():
        try:
            if not isinstance(value, str):
                raise ValueError(f"a {type(value).__name__}, not base64 text")
            data[str(key)] = base64.b64decode(value, validate=True)
        except (ValueError, binascii.Error) as exc:
            undecodable[str(key)] = f"is not valid base64 ({exc})"
    for key, value in (body.get("stringData") or {}).items():  # manifests only; the API server folds it
        if isinstance(value, str):
            data[str(key)] = value.encode("utf-8", "surrogateescape")
        else:
            undecodable[str(key)] = f"is a {type(value).__name__} in stringData, not a string"
    return data, undecodable


def _signature(body: Mapping[str, Any]) -> bytes | None:
    """The content of ``body`` as bytes (None: it holds something JSON cannot say; never cached)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return None


def _shape(body: Mapping[str, Any]) -> bytes | None:
    """What :meth:`Registry.derived` values may depend on, as bytes: the spec, identity and deletion of a
    resource, not its status (None: not serializable, so never taken as unchanged)."""
    meta = body.get("metadata") or {}
    return _signature({"spec": body.get("spec"), "uid": meta.get("uid"),
                       "deletionTimestamp": meta.get("deletionTimestamp"),
                       "creationTimestamp": meta.get("creationTimestamp"), "generation": meta.get("generation")})


class Registry:
    def __init__(self, engines: Engines, default_namespace: str, policy: CredentialPolicy | None = None) -> None:
        self.engines = engines
        self.default_namespace = default_namespace
        self.policy = policy if policy is not None else CredentialPolicy(frozenset({default_namespace}))
        #: runs bootstrap jobs; handed to the reconcile core in every World (None: none can run)
        self.launcher: Launcher | None = None
        #: reads CloudNativePG Clusters for ``status.leadership`` (set by the kopf front end; None locally)
        self.database_clusters: DatabaseClusters | None = None
        #: what the tracker decided per ReplicatedTable; its loop writes it, the tables' status shows it
        self.tracker_journal = TrackerJournal()
        #: guards the maps below (a leaf: nothing else is taken while holding it)
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}  # guarded by _lock
        #: kind -> the keys of _objects of that kind (a reconcile reads one kind, never all). Guarded by _lock
        self._keys: dict[str, dict[tuple[str, str | None, str], None]] = {}  # (a dict: in the order stored)
        #: each stored body parsed once (or why it is invalid), dropped when the body is replaced by a
        #: different one: every reconcile reads whole kinds (``of_kind``), and validating every object
        #: on every call made a refresh round cost N^2 validations (1,000 TableReplicas: 16 minutes to
        #: Ready, a core busy after; benchmarks/scale_bench.py --dimensions operator). Guarded by _lock
        self._parsed: dict[tuple[str, str | None, str], Resource | InvalidResourceError] = {}
        #: the serialized body each parse was made from (a body's nested maps may be the caller's,
        #: changed in place: only a copy of its content tells a new version). Guarded by _lock
        self._signatures: dict[tuple[str, str | None, str], bytes] = {}
        self._secrets: dict[tuple[str, str], _Secret] = {}  # guarded by _lock
        #: each stored body's :func:`_shape`, and per kind a counter moved whenever one of that kind's
        #: shapes changes, one is stored or one is removed (status refreshes do not move it). Guarded by _lock
        self._shapes: dict[tuple[str, str | None, str], bytes | None] = {}
        self._shape_generation: dict[str, int] = {}
        #: key -> (the shape generations of its kinds when computed, value): :meth:`derived`. Guarded by _lock
        self._derived: dict[Hashable, tuple[tuple[int, ...], Any]] = {}

    # -- feeding ---------------------------------------------------------------------------------

    def upsert(self, body: Mapping[str, Any]) -> None:
        self._store(body)

    def upserted(self, body: Mapping[str, Any]) -> Resource:
        """:meth:`upsert` ``body``, and return the resource as :meth:`resource` parses it: the parse kept
        while its content is unchanged (a refresh of an unchanged resource parses nothing), with its
        own copy of the status map; raises InvalidResourceError as :meth:`resource` does."""
        key, stored = self._store(body)
        with self._lock:
            parsed = self._parsed.get(key) if self._objects.get(key) is stored else None
        if parsed is None:
            parsed = self._parse_body(key, stored)  # (kept only if no other version came meanwhile)
        if isinstance(parsed, InvalidResourceError):
            raise parsed
        return replace(parsed, status=dict(parsed.status))

    def _store(self, body: Mapping[str, Any]) -> tuple[tuple[str, str | None, str], dict[str, Any]]:
        """Store ``body`` (a shallow copy): its key and the copy stored."""
        meta = body.get("metadata", {})
        key = (str(body.get("kind")), meta.get("namespace"), str(meta.get("name")))
        stored = dict(body)
        signature = _signature(stored)
        shape = _shape(stored)
        with self._lock:
            if signature is None or self._signatures.get(key) != signature:
                self._parsed.pop(key, None)  # (a refresh hands the same body again: its parse stays)
            if shape is None or key not in self._shapes or self._shapes[key] != shape:
                self._shape_generation[key[0]] = self._shape_generation.get(key[0], 0) + 1
            self._shapes[key] = shape
            self._objects[key] = stored
            if signature is None:
                self._signatures.pop(key, None)
            else:
                self._signatures[key] = signature
            self._keys.setdefault(key[0], {})[key] = None
        if key[0] == "TableCluster":
            self.refresh_cluster(key[2])
        return key, stored

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        with self._lock:
            self._objects.pop((kind, namespace, name), None)
            self._parsed.pop((kind, namespace, name), None)
            self._signatures.pop((kind, namespace, name), None)
            self._keys.get(kind, {}).pop((kind, namespace, name), None)
            if self._shapes.pop((kind, namespace, name), b"") != b"":
                self._shape_generation[kind] = self._shape_generation.get(kind, 0) + 1

    def upsert_secret(self, body: Mapping[str, Any]) -> None:
        """Take a Secret in: its values only if the policy lets TableClusters use it."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        labelled = (meta.get("labels") or {}).get(CREDENTIALS_LABEL) == CREDENTIALS_LABEL_VALUE
        secret: _Secret | None = None
        if self.policy.allows_namespace(key[0]):
            annotation = (meta.get("annotations") or {}).get(TABLE_CLUSTERS_ANNOTATION)
            clusters = None if annotation is None else frozenset(
                n.strip() for n in str(annotation).split(",") if n.strip())
            if labelled or not self.policy.require_label:
                data, undecodable = _decode(body)
                secret = _Secret(labelled, clusters, data, undecodable)
            else:  # remembered only to say why it cannot be used; its values are not even decoded
                secret = _Secret(False, clusters)
        with self._lock:
            if secret is None:
                self._secrets.pop(key, None)
            else:
                self._secrets[key] = secret
        self._refresh_all()

    def remove_secret(self, namespace: str, name: str) -> None:
        with self._lock:
            self._secrets.pop((namespace, name), None)
        self._refresh_all()

    def _refresh_all(self) -> None:
        for cluster in self.of_kind("TableCluster"):
            self.refresh_cluster(cluster.name)

    # -- reading ----------------------------------------------------------------------------------

    def resource(self, body: Mapping[str, Any]) -> Resource:
        """A parsed resource; raises InvalidResourceError naming the resource and field."""
        model = parse_resource(body)
        meta = body.get("metadata", {})
        return Resource(
            kind=model.kind, namespace=meta.get("namespace"), name=meta["name"], uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 1), created=str(meta.get("creationTimestamp", "")),
            spec=model.spec, status=dict(body.get("status") or {}),
            deleting=bool(meta.get("deletionTimestamp")))

    def of_kind(self, kind: str, namespace: str | None = None,
                where: Callable[[Resource], bool] | None = None) -> list[Resource]:
        """The valid stored resources of ``kind`` (in ``namespace``, if given; those ``where`` accepts,
        if given: it is handed the shared parse and must only read it), each parsed once per version
        of its body. A caller gets its own copy of each status map, as from a fresh parse: only of the
        resources returned (copying them all made every reconcile cost O(N) copies)."""
        return [replace(parsed, status=dict(parsed.status)) for parsed in self._valid(kind, namespace)
                if where is None or where(parsed)]

    def _valid(self, kind: str, namespace: str | None = None) -> list[Resource]:
        """The parses of the valid stored resources of ``kind`` (in ``namespace``), shared."""
        with self._lock:  # (once per call, not per resource)
            found = [(key, self._objects[key], self._parsed.get(key)) for key in self._keys.get(kind, ())
                     if namespace is None or key[1] == namespace]
        out = []
        for key, body, parsed in found:
            if parsed is None:
                parsed = self._parse_body(key, body)
            if isinstance(parsed, Resource):
                out.append(parsed)
        return out

    def shared(self, kind: str) -> list[Resource]:
        """The valid stored resources of ``kind`` as parsed, shared, not copied: for a caller that only
        reads them (every TableReplica's reconcile derives the engines' directories from all of them)."""
        return self._valid(kind)

    def derived(self, kinds: tuple[str, ...], key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, made again only when the spec, identity or deletion of a resource of ``kinds``
        has changed (or one came or went) since it was made; a status change keeps it. For what every
        reconcile derives from whole kinds (who claims what, which clusters an engine calls): made
        once per change, not once per reconcile of each of N resources, which is N^2 per refresh round
        (1,000 TableReplicas kept a core busy at idle; benchmarks/scale_bench.py --dimensions operator).
        ``compute`` must read only those kinds, and only their specs and metadata; its value is shared:
        callers must only read it. Two callers may compute it at once; the value stays only if no
        resource of ``kinds`` changed meanwhile."""
        with self._lock:
            generations = tuple(self._shape_generation.get(kind, 0) for kind in kinds)
            cached = self._derived.get(key)
        if cached is not None and cached[0] == generations:
            value: T = cached[1]
            return value
        value = compute()
        with self._lock:
            if generations == tuple(self._shape_generation.get(kind, 0) for kind in kinds):
                self._derived[key] = (generations, value)
        return value

    def find(self, kind: str, namespace: str | None, name: str) -> Resource | None:
        """The valid stored resource ``kind`` ``namespace/name`` (``namespace`` None: in any namespace,
        the first stored), with its own copy of its status map as :meth:`of_kind` gives."""
        with self._lock:
            if namespace is not None or (kind, None, name) in self._objects:
                keys = [(kind, namespace, name)]
            else:
                keys = [k for k in self._keys.get(kind, ()) if k[2] == name]
        for key in keys:
            parsed = self._parse(key)
            if isinstance(parsed, Resource):
                return replace(parsed, status=dict(parsed.status))
        return None

    def _parse(self, key: tuple[str, str | None, str]) -> Resource | InvalidResourceError | None:
        """The parse of the stored body at ``key`` (made once per version of it; None: not stored)."""
        with self._lock:
            body = self._objects.get(key)
            parsed = self._parsed.get(key)
        if body is None or parsed is not None:
            return parsed if body is not None else None
        return self._parse_body(key, body)

    def _parse_body(self, key: tuple[str, str | None, str], body: dict[str, Any]) -> Resource | InvalidResourceError:
        """Parse ``body``, stored at ``key``, and keep the parse unless the body was replaced meanwhile."""
        parsed: Resource | InvalidResourceError
        try:
            parsed = self.resource(body)
        except InvalidResourceError as exc:
            parsed = exc
        with self._lock:
            if self._objects.get(key) is body:  # (not replaced meanwhile)
                self._parsed[key] = parsed
        return parsed

    def unlabelled_secrets(self) -> list[str]:
        """``namespace/name`` of the Secrets taken in without the credentials label (local runner)."""
        with self._lock:
            return sorted(f"{ns}/{name}" for (ns, name), s in self._secrets.items() if not s.labelled)

    def credentials(self, cluster: str, namespace: str, name: str, key: str) -> str | ClusterProblem:
        """The token TableCluster ``cluster`` may use from Secret ``namespace/name``, or why not."""
        secret_name = f"Secret {namespace}/{name}"
        if not self.policy.allows_namespace(namespace):
            allowed = ", ".join(sorted(self.policy.namespaces or ()))
            return ClusterProblem(SECRET_NOT_ALLOWED, f"{secret_name}: the operator takes credentials only from "
                                                      f"Secrets in {allowed}; nothing is sent to any engine")
        with self._lock:
            secret = self._secrets.get((namespace, name))
        if secret is None:
            return ClusterProblem(SECRET_NOT_FOUND, f"{secret_name} (key {key!r}) not found; the operator reads "
                                                    f"only Secrets labelled {CREDENTIALS_SELECTOR}")
        if self.policy.require_label and not secret.labelled:
            return ClusterProblem(SECRET_NOT_ALLOWED, f"{secret_name} lacks the label {CREDENTIALS_SELECTOR}; "
                                                      "the operator uses no other Secret")
        if secret.clusters is not None and cluster not in secret.clusters:
            names = ", ".join(sorted(secret.clusters)) or "none"
            return ClusterProblem(SECRET_NOT_ALLOWED, f"{secret_name} may be used only by the TableClusters in its "
                                                      f"annotation {TABLE_CLUSTERS_ANNOTATION} ({names})")
        if key in secret.undecodable:
            return ClusterProblem(SECRET_INVALID, f"{secret_name} key {key!r} {secret.undecodable[key]}")
        raw = secret.data.get(key)
        if raw is None:
            return ClusterProblem(SECRET_NOT_FOUND, f"{secret_name} has no key {key!r}")
        try:
            return parse_token(raw)
        except ValueError as exc:
            return ClusterProblem(SECRET_INVALID, f"{secret_name} key {key!r} {exc}")

    def refresh_cluster(self, name: str) -> ClusterProblem | None:
        """Register the engine connection of a TableCluster; returns why it cannot be, if so.

        On any problem the TableCluster is dropped from the engines: the operator then sends nothing
        to its endpoint and lists it in no engine's directory.
        """
        with self._lock:
            body = self._objects.get(("TableCluster", None, name))
        if body is None:
            self.engines.forget(name)
            return ClusterProblem("NotRegistered", "no such TableCluster")
        try:
            res = self.resource(body)
        except InvalidResourceError as exc:
            self.engines.forget(name)
            return ClusterProblem("InvalidSpec", str(exc))
        secret = res.spec.credentials_secret
        token = self.credentials(name, secret.namespace or self.default_namespace, secret.name,
                                 secret.key or DEFAULT_SECRET_KEY)
        if isinstance(token, ClusterProblem):
            self.engines.forget(name)
            return token
        self.engines.set(ClusterRef(name=name, endpoint=res.spec.endpoint, token=token,
                                    cluster_id=res.spec.cluster_id, read_only=res.spec.read_only))
        return None

    def world(self) -> World:
        return World(engines=self.engines, resources=self, launcher=self.launcher,
                     tracker_journal=self.tracker_journal, database_clusters=self.database_clusters)

