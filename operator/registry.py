"""An in-memory view of the custom resources and Secrets, shared by handlers and the local runner.

Reconcilers need to see other resources (a TableReplica needs its ReplicatedTable; two resources
claiming one table must find each other; the tracker needs every tracked table). The handlers feed this
registry from watch events; the local runner feeds it from manifest files. Both then hand
:meth:`Registry.world` to the reconcile core, which never talks to Kubernetes itself.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from typing import Any

from .models import InvalidResourceError, parse_resource
from .world import ClusterRef, Engines, Resource, World

DEFAULT_SECRET_KEY = "token"


class Registry:
    def __init__(self, engines: Engines, default_namespace: str) -> None:
        self.engines = engines
        self.default_namespace = default_namespace
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self._secrets: dict[tuple[str, str], dict[str, str]] = {}

    # -- feeding ---------------------------------------------------------------------------------

    def upsert(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        key = (str(body.get("kind")), meta.get("namespace"), str(meta.get("name")))
        with self._lock:
            self._objects[key] = dict(body)
        if key[0] == "TableCluster":
            self.refresh_cluster(key[2])

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        with self._lock:
            self._objects.pop((kind, namespace, name), None)

    def upsert_secret(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        data = {k: base64.b64decode(v).decode() for k, v in (body.get("data") or {}).items()}
        data.update(body.get("stringData") or {})
        with self._lock:
            self._secrets[(str(meta.get("namespace")), str(meta.get("name")))] = data
        for cluster in self.of_kind("TableCluster"):
            self.refresh_cluster(cluster.name)

    def remove_secret(self, namespace: str, name: str) -> None:
        with self._lock:
            self._secrets.pop((namespace, name), None)

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

    def of_kind(self, kind: str) -> list[Resource]:
        with self._lock:
            bodies = [b for (k, _, _), b in self._objects.items() if k == kind]
        out = []
        for body in bodies:
            try:
                out.append(self.resource(body))
            except InvalidResourceError:
                continue
        return out

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        with self._lock:
            return (self._secrets.get((namespace, name)) or {}).get(key)

    def refresh_cluster(self, name: str) -> str | None:
        """Register the engine connection of a TableCluster; returns why it cannot be, if so."""
        with self._lock:
            body = self._objects.get(("TableCluster", None, name))
        if body is None:
            self.engines.forget(name)
            return "no such TableCluster"
        try:
            res = self.resource(body)
        except InvalidResourceError as exc:
            return str(exc)
        secret = res.spec.credentials_secret
        namespace = secret.namespace or self.default_namespace
        token = self.secret_value(namespace, secret.name, secret.key or DEFAULT_SECRET_KEY)
        if token is None:
            self.engines.forget(name)
            return f"Secret {namespace}/{secret.name} (key {secret.key!r}) not found"
        self.engines.set(ClusterRef(name=name, endpoint=res.spec.endpoint, token=token,
                                    cluster_id=res.spec.cluster_id, read_only=res.spec.read_only))
        return None

    def world(self) -> World:
        return World(engines=self.engines, resources=self.of_kind)
