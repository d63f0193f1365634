"""The primary of a CloudNativePG Cluster, for the ``status.leadership`` of an HA TableCluster.

A TableCluster whose database is a CloudNativePG ``Cluster`` (``spec.databaseCluster``; the chart sets
it for an ``ha`` engine on ``storage.postgresql.cloudnativepg``) shows that Cluster's
``status.currentPrimary`` - the instance (pod) CloudNativePG made the primary - as the database's
primary: the name its users know, which the engines cannot tell (they reach the primary through the
``-rw`` Service, and see only its address).

The kopf front end hands this reader to the reconcile core (``World.database_clusters``). It reads with
the official ``kubernetes`` client, through an ``ApiClient`` of its own made at the first read (so an
operator with no such TableCluster never builds one; in-cluster configuration, else the kubeconfig),
and one verb: ``get`` on ``clusters.postgresql.cnpg.io``, which the chart grants in the release
namespace only when an engine has ``ha`` on a CloudNativePG Cluster. A refusal (403), a missing Cluster
(404) or an API that does not answer is a :class:`~.controllers.world.DatabaseClusterError` naming the
Cluster, which the status shows; nothing is cached, so a status never holds a stale primary.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from .controllers.world import DatabaseClusterError
from .jobs.spark_applications import USER_AGENT, SparkApplicationLauncher

GROUP, VERSION, PLURAL = "postgresql.cnpg.io", "v1", "clusters"
_REQUEST_TIMEOUT = (3.0, 5.0)


class CloudNativePGClusters:
    """:class:`~.controllers.world.DatabaseClusters` over the Kubernetes API."""

    def __init__(self, default_namespace: str, api_client: k8s.ApiClient | None = None) -> None:
        self.default_namespace = default_namespace
        #: guards ``_api`` (made once, at the first read); a leaf
        self._lock = threading.Lock()
        self._api_client = api_client
        self._api: k8s.CustomObjectsApi | None = None

    def _custom(self) -> k8s.CustomObjectsApi:
        with self._lock:
            if self._api is None:
                if self._api_client is None:
                    self._api_client = SparkApplicationLauncher.connect()
                self._api_client.user_agent = USER_AGENT
                self._api = k8s.CustomObjectsApi(self._api_client)
            return self._api

    def current_primary(self, namespace: str | None, name: str) -> str | None:
        namespace = namespace or self.default_namespace
        where = f"CloudNativePG Cluster {namespace}/{name}"
        try:
            found = cast(dict[str, Any], self._custom().get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=_REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                raise DatabaseClusterError(f"{where} not found (is CloudNativePG installed, and the Cluster "
                                           "created?)") from None
            if exc.status == 403:
                raise DatabaseClusterError(f"{where}: the operator may not get it (grant get on "
                                           "clusters.postgresql.cnpg.io in its namespace)") from None
            raise DatabaseClusterError(f"{where}: the Kubernetes API answered {exc.status} {exc.reason}") from None
        except (Urllib3Error, OSError) as exc:
            raise DatabaseClusterError(f"{where}: the Kubernetes API did not answer ({type(exc).__name__})") from None
        primary = (found.get("status") or {}).get("currentPrimary")
        return primary if isinstance(primary, str) and primary else None

    def close(self) -> None:
        with self._lock:
            if self._api_client is not None:
                self._api_client.close()
