"""Other clusters: the cluster directory (``//sys/clusters``) and the cluster-to-cluster client.

Every engine knows its peers through ``//sys/clusters``, a map from cluster name to
``{proxy_url=...; token=...}`` kept by the operator (or the local runner, or a config file at
start-up). Tokens are secrets: Cypress never returns them in clear (``node/node_reads.py`` masks them
where node values leave the tree), and a token belongs to a URL: when a cluster's ``proxy_url``
changes, its stored token is dropped (:func:`keep_stored_tokens`) and calls to that cluster fail
with :class:`NoCredential` until a new token is set — an old secret is never sent to a new address.

Cluster-to-cluster calls go to ``/internal/v1/...`` on the target and authenticate with the
*target's* token. They have short, explicit timeouts: a sync replica that does not answer must
fail a commit within about a second, not hang it.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from ..client import Client
from ..credentials import cell_tag
from ..errors import ErrorCode, UnavailableError, YtError
from ..httpconn import ConnectionPool, HttpTransportError, dumps_json, loads_json

#: how long a commit waits for a sync replica's prepare
DEFAULT_SYNC_TIMEOUT = 1.0
MASKED_TOKEN = "<hidden>"


@dataclass(frozen=True)
class ClusterConnection:
    name: str
    proxy_url: str
    token: str


class ClusterUnknown(YtError):
    def __init__(self, name: str) -> None:
        super().__init__(f"Replica cluster {name} is not known", code=ErrorCode.RESOLVE_ERROR,
                         attributes={"cluster_name": name})


class NoCredential(UnavailableError):
    """The directory knows the cluster but holds no token for it (dropped when its URL changed)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"No credential for cluster {name}: //sys/clusters/{name} has no token (a stored "
                         f"token is dropped when proxy_url changes); set //sys/clusters/{name}/token",
                         attributes={"cluster_name": name})


def parse_directory(value: Any) -> dict[str, ClusterConnection]:
    """Validate a ``//sys/clusters`` value; errors name the cluster and the field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise YtError("//sys/clusters must be a map from cluster name to {proxy_url; token}",
                      code=ErrorCode.INVALID_PARAMETER)
    out: dict[str, ClusterConnection] = {}
    for name, entry in value.items():
        if not isinstance(entry, dict):
            raise YtError(f"//sys/clusters/{name} must be a map {{proxy_url; token}}", code=ErrorCode.INVALID_PARAMETER)
        url = entry.get("proxy_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise YtError(f"//sys/clusters/{name}/proxy_url must be an http(s) URL, got {url!r}",
                          code=ErrorCode.INVALID_PARAMETER)
        token = entry.get("token", "")
        if not isinstance(token, str):
            raise YtError(f"//sys/clusters/{name}/token must be a string", code=ErrorCode.INVALID_PARAMETER)
        out[str(name)] = ClusterConnection(str(name), url.rstrip("/"), token)
    tags: dict[int, str] = {}
    for name in out:
        other = tags.setdefault(cell_tag(name), name)
        if other != name:
            # a replica's id names its meta-cluster by cell tag: two clusters with one tag could
            # write each other's replicas
            raise YtError(f"//sys/clusters: clusters {other} and {name} have the same cell tag "
                          f"{cell_tag(name):#x} (derived from the name): rename one of them",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"cluster_name": name})
    return out


def _url(entry: Any) -> str | None:
    url = entry.get("proxy_url") if isinstance(entry, dict) else None
    return url.rstrip("/") if isinstance(url, str) else None


def keep_stored_tokens(stored: Any, updated: Any) -> Any:
    """``updated`` (a directory a user wrote, tokens possibly masked) with the secrets it may keep.

    A masked token (``<hidden>``, as ``get`` shows it) stands for the stored token of that cluster,
    but only while the cluster's ``proxy_url`` is unchanged: at a new URL the token is dropped (the
    entry keeps no ``token``), so the old secret is never sent to the new address. A token given in
    clear is taken as it is."""
    if not isinstance(updated, dict):
        return updated
    stored = stored if isinstance(stored, dict) else {}
    for name, entry in updated.items():
        if not isinstance(entry, dict) or entry.get("token") != MASKED_TOKEN:
            continue
        old = stored.get(name)
        old_token = old.get("token") if isinstance(old, dict) else None
        if isinstance(old_token, str) and old_token and _url(old) is not None and _url(old) == _url(entry):
            entry["token"] = old_token
        else:
            del entry["token"]
    return updated


def mask_tokens(value: Any) -> Any:
    """A value from under ``//sys/clusters`` as users may see it: every token replaced."""
    if isinstance(value, dict):
        return {k: (MASKED_TOKEN if k == "token" and v else mask_tokens(v)) for k, v in value.items()}
    return value


class InternalClient:
    """Calls ``/internal/v1`` of one peer cluster."""

    def __init__(self, conn: ClusterConnection, timeout: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.conn = conn
        self._connect_timeout = timeout
        # keep-alive connections on http.client: a sync replica's prepare and commit are on the
        # latency path of every write (engine/httpconn.py); an https:// peer is verified with
        # ssl_context (None: the system trust store)
        self._pool = ConnectionPool(conn.proxy_url, {"Authorization": f"OAuth {conn.token}"},
                                    timeout=timeout, connect_timeout=timeout, ssl_context=ssl_context)

    def call(self, method: str, body: dict[str, Any] | None = None, timeout: float | None = None,
             raw_body: bytes | None = None) -> Any:
        """POST a JSON body (or ``raw_body``, already encoded) and return the decoded answer.

        ``timeout`` bounds the wait for the answer; connecting never waits longer than the
        peer timeout, so an unreachable cluster fails fast whatever the request size.
        """
        try:
            content = raw_body if raw_body is not None else dumps_json(body or {})
            response = self._pool.request(
                "POST", f"/internal/v1/{method}", body=content, headers={"Content-Type": "application/json"},
                timeout=timeout, connect_timeout=min(timeout, self._connect_timeout) if timeout else None)
        except HttpTransportError as exc:
            raise UnavailableError(f"Cluster {self.conn.name} is unreachable at {self.conn.proxy_url}: "
                                   f"{exc}", attributes={"cluster_name": self.conn.name}) from None
        if response.status_code >= 400:
            try:
                error = YtError.from_dict(response.json())
            except ValueError:
                error = YtError(f"Cluster {self.conn.name} answered HTTP {response.status_code}")
            raise YtError(f"Request {method} to cluster {self.conn.name} failed: {error.message}",
                          code=error.code, attributes={"cluster_name": self.conn.name}, inner_errors=[error])
        return loads_json(response.content) if response.content else None

    def close(self) -> None:
        self._pool.close()


class Peers:
    """Connections to the clusters of the directory, rebuilt when the directory changes."""

    def __init__(self, timeout: float = DEFAULT_SYNC_TIMEOUT, ssl_context: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        #: verifies peers with an https:// proxy_url (EngineConfig.peer_ca_file); None: system trust store
        self.ssl_context = ssl_context
        #: guards the three maps below; a leaf lock (nothing is taken while holding it, no network I/O:
        #: closing a connection only closes its sockets)
        self._lock = threading.Lock()
        self._directory: dict[str, ClusterConnection] = {}  # guarded by _lock
        self._clients: dict[str, InternalClient] = {}  # guarded by _lock
        self._public: dict[str, Client] = {}  # guarded by _lock

    def update(self, directory: dict[str, ClusterConnection]) -> None:
        with self._lock:
            for name, client in list(self._clients.items()):
                if directory.get(name) != client.conn:
                    client.close()
                    del self._clients[name]
            for name in list(self._public):
                if directory.get(name) != self._directory.get(name):
                    self._public.pop(name).close()
            self._directory = dict(directory)

    def known(self, name: str) -> bool:
        with self._lock:
            return name in self._directory

    def connection(self, name: str) -> ClusterConnection:
        with self._lock:
            conn = self._directory.get(name)
        if conn is None:
            raise ClusterUnknown(name)
        return conn

    def _credentialed(self, name: str) -> ClusterConnection:
        """The directory entry of a peer that has a token (called under ``_lock``)."""
        conn = self._directory.get(name)
        if conn is None:
            raise ClusterUnknown(name)
        if not conn.token:
            raise NoCredential(name)
        return conn

    def client(self, name: str) -> InternalClient:
        """The ``/internal/v1`` client of a peer; :class:`NoCredential` if the directory holds no token."""
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = InternalClient(self._credentialed(name), self.timeout,
                                                              self.ssl_context)
            return client

    def public_client(self, name: str) -> Client:
        """The public API of a peer (reads of replicated tables are served by their replicas)."""
        with self._lock:
            client = self._public.get(name)
            if client is None:
                conn = self._credentialed(name)
                # with a CA of our own, httpx verifies with it (Client's own pool takes no context)
                transport = httpx.HTTPTransport(verify=self.ssl_context) if self.ssl_context else None
                client = self._public[name] = Client(conn.proxy_url, conn.token, timeout=30.0, transport=transport)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            for public in self._public.values():
                public.close()
            self._clients.clear()
            self._public.clear()
