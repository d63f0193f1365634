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

A cluster served by a leader engine and standbys (docs/ha.md) is reached without a Service in front
of it: its ``proxy_url`` names every engine, as a list or separated by commas, and a call goes to
the leader the way the typed client finds it (``client/route.py``): sent on to the leader a standby
names, or to the next URL when a connection is refused, and never sent again once an engine may
have acted on it (a timeout, a reset: the caller's error, as from a single engine; the next call
goes to the next URL). The token belongs to the whole set of URLs: a leader named outside it is not
followed (the set leads there too), and a change of the set drops the stored token.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..client import Client
from ..client.route import LeaderRoute, split_urls
from ..credentials import cell_tag
from ..errors import ErrorCode, UnavailableError, YtError
from ..httpconn import ConnectionPool, HttpTransportError, dumps_json, loads_json

#: how long a commit waits for a sync replica's prepare
DEFAULT_SYNC_TIMEOUT = 1.0
MASKED_TOKEN = "<hidden>"
#: the engines one ``proxy_url`` may name (a leader and its standbys)
MAX_PROXY_URLS = 16
#: seconds an engine of a peer that gave no answer (a timeout, a reset, a refusal) is not followed back
#: to, even if a standby names it (a paused leader, replaced within its lease); at least the timeout
SUSPECT_SECONDS = 5.0


@dataclass(frozen=True)
class ClusterConnection:
    name: str
    #: the cluster's engines, separated by commas (one URL for a single engine or a Service)
    proxy_url: str
    token: str

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self.proxy_url.split(","))


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
        urls = parse_proxy_urls(name, entry.get("proxy_url"))
        token = entry.get("token", "")
        if not isinstance(token, str):
            raise YtError(f"//sys/clusters/{name}/token must be a string", code=ErrorCode.INVALID_PARAMETER)
        out[str(name)] = ClusterConnection(str(name), ",".join(urls), token)
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


def parse_proxy_urls(name: Any, value: Any) -> tuple[str, ...]:
    """The engines of ``//sys/clusters/<name>/proxy_url``: an http(s) URL, or several (a leader and its
    standbys) as a list or separated by commas; in order, without trailing slashes or repeats."""
    where = f"//sys/clusters/{name}/proxy_url"
    shape = (f"{where} must be an http(s) URL, or the URLs of a cluster's engines as a list or separated by "
             "commas")
    if isinstance(value, list):
        if not value:
            raise YtError(f"{shape}; the list is empty", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"cluster_name": str(name)})
        if not all(isinstance(item, str) for item in value):
            bad = next(item for item in value if not isinstance(item, str))
            raise YtError(f"{shape}; the list holds {repr(bad)[:100]}, not a string", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"cluster_name": str(name)})
    elif not isinstance(value, str):
        raise YtError(f"{shape}, got {repr(value)[:100]}", code=ErrorCode.INVALID_PARAMETER,
                      attributes={"cluster_name": str(name)})
    urls: list[str] = []
    given = split_urls(value)
    for url in given:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
            what = f", got {url[:200]!r}" if len(given) == 1 else f"; {url[:200]!r} is not an http(s) URL"
            raise YtError(shape + what, code=ErrorCode.INVALID_PARAMETER, attributes={"cluster_name": str(name)})
        url = url.rstrip("/")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise YtError(f"{shape}, got {repr(value)[:100]}", code=ErrorCode.INVALID_PARAMETER,
                      attributes={"cluster_name": str(name)})
    if len(urls) > MAX_PROXY_URLS:
        raise YtError(f"{where} names {len(urls)} URLs, more than the {MAX_PROXY_URLS} engines a cluster may "
                      "list", code=ErrorCode.INVALID_PARAMETER, attributes={"cluster_name": str(name)})
    return tuple(urls)


def _urls(entry: Any) -> frozenset[str] | None:
    """The set of URLs of a directory entry (None: none that is valid): what its token belongs to."""
    if not isinstance(entry, dict):
        return None
    try:
        return frozenset(parse_proxy_urls("", entry.get("proxy_url")))
    except YtError:
        return None


def keep_stored_tokens(stored: Any, updated: Any) -> Any:
    """``updated`` (a directory a user wrote, tokens possibly masked) with the secrets it may keep.

    A masked token (``<hidden>``, as ``get`` shows it) stands for the stored token of that cluster,
    but only while the cluster's ``proxy_url`` names the same URLs (in any order, list or commas): at a
    new URL, or one more, the token is dropped (the entry keeps no ``token``), so the old secret is
    never sent to a new address. A token given in clear is taken as it is."""
    if not isinstance(updated, dict):
        return updated
    stored = stored if isinstance(stored, dict) else {}
    for name, entry in updated.items():
        if not isinstance(entry, dict) or entry.get("token") != MASKED_TOKEN:
            continue
        old = stored.get(name)
        old_token = old.get("token") if isinstance(old, dict) else None
        if isinstance(old_token, str) and old_token and _urls(old) is not None and _urls(old) == _urls(entry):
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
    """Calls ``/internal/v1`` of one peer cluster: at its one URL, or at the leader of its engines."""

    def __init__(self, conn: ClusterConnection, timeout: float, ssl_context: ssl.SSLContext | None = None) -> None:
        self.conn = conn
        self._connect_timeout = timeout
        #: which engine calls go to (the leader, as far as this engine knows); only the entry's URLs
        self._route = LeaderRoute(conn.urls, suspect_seconds=max(timeout, SUSPECT_SECONDS), follow_unlisted=False)
        # keep-alive connections on http.client, one pool per engine: a sync replica's prepare and
        # commit are on the latency path of every write (engine/httpconn.py); an https:// peer is
        # verified with ssl_context (None: the system trust store)
        self._pools = {url: ConnectionPool(url, {"Authorization": f"OAuth {conn.token}"}, timeout=timeout,
                                           connect_timeout=timeout, ssl_context=ssl_context)
                       for url in self._route.urls}

    @property
    def url(self) -> str:
        """The engine calls go to now."""
        return self._route.proxy_url

    def call(self, method: str, body: dict[str, Any] | None = None, timeout: float | None = None,
             raw_body: bytes | None = None) -> Any:
        """POST a JSON body (or ``raw_body``, already encoded) and return the decoded answer.

        ``timeout`` bounds the wait for the answer; connecting never waits longer than the
        peer timeout, so an unreachable cluster fails fast whatever the request size. With several
        engines the call goes on to the leader only while no engine acted on it (``client/route.py``).
        """
        content = raw_body if raw_body is not None else dumps_json(body or {})
        name = self.conn.name
        attempt = 0
        while True:
            url = self._route.proxy_url
            try:
                response = self._pools[url].request(
                    "POST", f"/internal/v1/{method}", body=content, headers={"Content-Type": "application/json"},
                    timeout=timeout, connect_timeout=min(timeout, self._connect_timeout) if timeout else None)
            except HttpTransportError as exc:
                attempt += 1
                if self._route.after_no_answer(url, attempt, isinstance(exc.cause, ConnectionRefusedError)):
                    continue  # refused: nothing was sent
                raise UnavailableError(f"Cluster {name} is unreachable at {url}: {exc}",
                                       attributes={"cluster_name": name}) from None
            self._route.answered(url)
            if response.status_code < 400:
                return loads_json(response.content) if response.content else None
            try:
                error = YtError.from_dict(response.json())
            except ValueError:
                error = YtError(f"Cluster {name} answered HTTP {response.status_code}")
            if error.attributes.get("not_leader"):
                attempt += 1  # a standby, or a replaced leader: it did nothing with the request
                if self._route.after_not_leader(url, attempt, error.attributes.get("leader_url")):
                    continue
            raise YtError(f"Request {method} to cluster {name} failed: {error.message}",
                          code=error.code, attributes={"cluster_name": name}, inner_errors=[error])

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


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
                client = self._public[name] = Client(list(conn.urls), conn.token, timeout=30.0, transport=transport,
                                                     follow_unlisted=False)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            for public in self._public.values():
                public.close()
            self._clients.clear()
            self._public.clear()
