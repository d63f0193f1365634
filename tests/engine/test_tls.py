"""Transport (issue 14, item 7): the API over HTTPS, peer calls that verify their peer, /metrics
that needs the token except on its own listener, and the Helm chart with TLS on and off.

A throwaway PKI per module is made with the ``openssl`` CLI into a temporary directory: a CA, a
server certificate for ``127.0.0.1``/``localhost`` signed by it, a certificate for another name
signed by it (hostname checks), and a second, unrelated CA (a client or peer that trusts the wrong
CA). Engines are real processes (their own process groups, stopped by pid) started with
``--tls-cert-file``/``--tls-key-file``; ``LocalEngine.start`` polls ``/readyz`` over plain HTTP,
so :class:`TlsEngine` polls it over HTTPS with the CA instead. The replication test writes
``//sys/clusters`` through ``ClusterSet.publish_directory`` (tests/replication/conftest.py), so it
follows whatever credential format that helper writes.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from reptables.engine.client import Client
from reptables.engine.client.protocol import TransportError
from reptables.engine.errors import ErrorCode, YtError
from reptables.engine.httpconn import ConnectionPool, HttpTransportError, client_ssl_context
from reptables.engine.peers import Peers
from reptables.engine.peers.directory import ClusterConnection
from reptables.testing import EngineProcess, WaitTimeout, free_port, wait_for
from tests.replication.conftest import SCHEMA, ClusterSet
from tests.test_chart import E2E_VALUES, by_kind, lint, load_values, merged, needs_helm, one, render, schema_validator

HEADER_TIMEOUT = 1.0
TLS_DIR = "/etc/reptables/tls"


# -- a throwaway PKI ----------------------------------------------------------------------------------


def _openssl(cwd: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"openssl {' '.join(args)}:\n{result.stderr}"


def _make_ca(directory: Path, name: str) -> Path:
    _openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=reptables test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return directory / f"{name}.crt"


def _make_leaf(directory: Path, ca: str, name: str, sans: str) -> tuple[Path, Path]:
    (directory / f"{name}.ext").write_text(
        f"subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl(directory, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    return directory / f"{name}.crt", directory / f"{name}.key"


@dataclass(frozen=True)
class Pki:
    ca: Path  # signs everything below
    cert: Path  # 127.0.0.1 and localhost
    key: Path
    elsewhere_cert: Path  # signed by ca, for elsewhere.invalid only
    elsewhere_key: Path
    other_ca: Path  # an unrelated CA

    def context(self) -> ssl.SSLContext:
        return client_ssl_context(str(self.ca))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = _make_ca(directory, "ca")
    cert, key = _make_leaf(directory, "ca", "engine", "DNS:localhost,IP:127.0.0.1")
    elsewhere_cert, elsewhere_key = _make_leaf(directory, "ca", "elsewhere", "DNS:elsewhere.invalid")
    return Pki(ca, cert, key, elsewhere_cert, elsewhere_key, _make_ca(directory, "other-ca"))


# -- engines over TLS -----------------------------------------------------------------------------------


@dataclass
class TlsEngine(EngineProcess):
    """An engine serving HTTPS; ``ca`` is what the test trusts to reach it."""

    ca: Path | None = None
    metrics_port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self, timeout: float = 30.0) -> TlsEngine:
        """LocalEngine.start, with ``/readyz`` polled over HTTPS (verified with ``ca``)."""
        assert self.ca is not None
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        if self.token is not None:
            env["REPTABLES_TOKEN"] = self.token
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "reptables.engine.cli", "serve", "--cluster-name", self.cluster_name,
                 "--data-dir", str(self.data_dir), "--port", str(self.port), "--log-level", self.log_level,
                 *self.extra_args], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        proc = self.proc
        with httpx.Client(timeout=1.0, verify=client_ssl_context(str(self.ca))) as http:
            def ready() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"engine {self.cluster_name} exited with {proc.returncode}:\n"
                                       + self.log_path.read_text(errors="replace")[-4000:])
                return http.get(f"{self.url}/readyz").status_code == 200

            try:
                wait_for(ready, timeout, f"engine {self.cluster_name} to be ready", retry_on=(httpx.HTTPError,))
            except WaitTimeout:
                self.stop()
                raise RuntimeError(f"engine {self.cluster_name} did not become ready in {timeout} s; "
                                   f"see {self.log_path}") from None
        return self


def tls_engine(name: str, data_dir: Path, pki: Pki, peer_ca: Path | None = None, *extra: str,
               files_from_env: bool = False) -> TlsEngine:
    """An engine with the PKI's server certificate (as flags, or through the environment
    fallbacks), trusting ``peer_ca`` (default: the PKI's CA) for its peers, with a metrics listener."""
    engine = TlsEngine(name, data_dir, ca=pki.ca)
    files = ["--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key)]
    if files_from_env:
        engine.env = {"REPTABLES_TLS_CERT_FILE": str(pki.cert), "REPTABLES_TLS_KEY_FILE": str(pki.key)}
        files = []
    engine.extra_args = [*files, "--tls-ca-file", str(peer_ca or pki.ca), "--metrics-port", str(engine.metrics_port),
                         *extra]
    return engine


@pytest.fixture(scope="module")
def engine(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsEngine]:
    # certificate and key through the environment fallbacks, the CA and the rest as flags
    proc = tls_engine("secure", tmp_path_factory.mktemp("secure"), pki, None, "--header-timeout", str(HEADER_TIMEOUT),
                      files_from_env=True).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def no_env_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system trust store only: no CA handed in through the environment."""
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def _yt_error(resp: httpx.Response, status: int, code: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text[:500]
    body = resp.json()
    assert json.loads(resp.headers["X-YT-Error"])["code"] == body["code"] == code
    return body


# -- the API over HTTPS -----------------------------------------------------------------------------------


def test_our_client_works_over_https_with_the_ca_from_ssl_cert_file(engine, monkeypatch):
    """The Client's own connection pool (also the operator's) verifies with SSL_CERT_FILE, as the chart sets it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(engine.ca))
    with Client(engine.url, engine.token) as client:
        client.create("table", "//tmp/tls/plain", recursive=True, attributes={"dynamic": True, "schema": SCHEMA})
        client.mount_table("//tmp/tls/plain")
        client.insert_rows("//tmp/tls/plain", [{"k": 1, "v": "secret"}])
        assert client.lookup_rows("//tmp/tls/plain", [{"k": 1}]) == [{"k": 1, "v": "secret"}]


def test_httpx_and_the_yt_cli_work_over_https_with_the_ca(engine, monkeypatch):
    with httpx.Client(base_url=engine.url, verify=engine_context(engine), timeout=30) as http:
        resp = http.get("/api/v4/get", params={"path": "//sys/@type"},
                        headers={"Authorization": f"OAuth {engine.token}", "X-YT-Header-Format": "json",
                                 "X-YT-Output-Format": "json"})
        assert resp.status_code == 200, resp.text
        assert resp.url.scheme == "https"
    # the official yt client (requests) with the CA bundle
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(engine.ca))
    engine.yt("create", "map_node", "//tmp/tls_cli", "--ignore-existing")
    assert "tls_cli" in engine.yt("list", "//tmp").stdout.split()


def engine_context(engine: TlsEngine) -> ssl.SSLContext:
    return client_ssl_context(str(engine.ca))


def test_a_client_without_the_ca_is_refused(engine, pki, no_env_trust):
    """The system trust store does not know the test CA; nor does another CA: certificate verify failed."""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{engine.url}/healthz", timeout=10)
    with Client(engine.url, engine.token) as client, pytest.raises(TransportError) as err:
        client.get("//sys/@type")
    assert isinstance(err.value.cause, ssl.SSLCertVerificationError), err.value.cause
    assert "certificate verify failed" in str(err.value.cause)
    pool = ConnectionPool(engine.url, ssl_context=client_ssl_context(str(pki.other_ca)))
    with pytest.raises(HttpTransportError) as transport_err:
        pool.request("GET", "/healthz")
    assert isinstance(transport_err.value.cause, ssl.SSLCertVerificationError)


def test_tls_1_2_clients_get_an_aead_cipher(engine):
    """Python's default ciphers, not uvicorn's ("TLSv1": CBC-SHA1 only for TLS 1.2)."""
    context = engine_context(engine)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", engine.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        name, version, _ = sock.cipher()
    assert version == "TLSv1.2" and ("GCM" in name or "CHACHA20" in name), name


def test_plain_http_to_the_tls_port_gets_no_answer(engine):
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{engine.port}/healthz", timeout=10)
    # and the engine is none the worse for it
    assert httpx.get(f"{engine.url}/healthz", verify=engine_context(engine), timeout=10).status_code == 200


def test_header_timeout_holds_over_tls(engine):
    """The guarded protocol runs under TLS: headers that never complete get 408 and a close."""
    with socket.create_connection(("127.0.0.1", engine.port), timeout=10) as raw, \
            engine_context(engine).wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        started = time.monotonic()
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ssl.SSLError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
        elapsed = time.monotonic() - started
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"header_timeout" in data
    assert HEADER_TIMEOUT - 0.1 <= elapsed < HEADER_TIMEOUT + 3.0, elapsed


# -- the client side of peer calls ------------------------------------------------------------------------


def test_https_pool_keeps_connections_alive(engine):
    pool = ConnectionPool(engine.url, ssl_context=engine_context(engine))
    try:
        assert pool.request("GET", "/healthz").status_code == 200
        ((first, _),) = pool._idle
        assert isinstance(first.sock, ssl.SSLSocket)
        for _ in range(3):
            assert pool.request("GET", "/readyz").status_code == 200
        assert [conn for conn, _ in pool._idle] == [first]  # one TLS connection served every request
    finally:
        pool.close()


def test_tls_handshake_is_bounded_by_the_connect_timeout(pki):
    """A peer that accepts TCP but never answers the handshake fails the call within the connect timeout."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        pool = ConnectionPool(f"https://127.0.0.1:{silent.getsockname()[1]}", timeout=30.0, connect_timeout=0.5,
                              ssl_context=pki.context())
        started = time.monotonic()
        with pytest.raises(HttpTransportError) as err:
            pool.request("POST", "/internal/v1/push", body=b"{}")
        assert time.monotonic() - started < 3.0
    assert isinstance(err.value.cause, TimeoutError), err.value.cause


@pytest.fixture
def elsewhere_peer(pki: Pki) -> Iterator[str]:
    """A fake peer on 127.0.0.1 whose certificate (from the trusted CA) names another host."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.elsewhere_cert, pki.elsewhere_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_peer_certificate_for_another_name_is_refused(pki, elsewhere_peer):
    """A certificate from the trusted CA is not enough: it must name the host the URL names."""
    pool = ConnectionPool(elsewhere_peer, ssl_context=pki.context())
    with pytest.raises(HttpTransportError) as err:
        pool.request("POST", "/internal/v1/push", body=b"{}")
    assert isinstance(err.value.cause, ssl.SSLCertVerificationError)
    assert "mismatch" in str(err.value.cause), err.value.cause


def test_peers_verify_https_peers_with_their_ca(engine, pki):
    """Both clients of Peers (/internal/v1 and the public API) verify with the CA they were given."""
    directory = {"secure": ClusterConnection("secure", engine.url, engine.token)}
    trusting = Peers(timeout=5.0, ssl_context=pki.context())
    strangers = Peers(timeout=5.0, ssl_context=client_ssl_context(str(pki.other_ca)))
    try:
        for peers in (trusting, strangers):
            peers.update(directory)
        assert trusting.public_client("secure").get("//sys/@type") == "map_node"
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            strangers.public_client("secure").get("//sys/@type")
        with pytest.raises(YtError, match="certificate verify failed") as err:
            strangers.client("secure").call("transaction_status", {"transaction_id": "0-0-0-0"})
        assert err.value.code == ErrorCode.UNAVAILABLE
    finally:
        trusting.close()
        strangers.close()


# -- /metrics ------------------------------------------------------------------------------------------------


def test_metrics_on_the_api_port_need_the_token(engine):
    with httpx.Client(base_url=engine.url, verify=engine_context(engine), timeout=10) as http:
        body = _yt_error(http.get("/metrics"), 401, ErrorCode.AUTHENTICATION_ERROR)
        assert "requires a token" in body["message"]
        _yt_error(http.get("/metrics", headers={"Authorization": "OAuth wrong-token-0123"}), 401,
                  ErrorCode.AUTHENTICATION_ERROR)
        resp = http.get("/metrics", headers={"Authorization": f"OAuth {engine.token}"})
        assert resp.status_code == 200 and "reptables_requests_total" in resp.text
        # the kubelet's probes need no token
        assert http.get("/healthz").status_code == http.get("/readyz").status_code == 200


def test_metrics_listener_serves_metrics_only_and_without_a_token(engine):
    """Plain HTTP, no token, /metrics and nothing else: no API, no internal calls, no probes."""
    with Client(engine.url, engine.token, transport=httpx.HTTPTransport(verify=engine_context(engine))) as client:
        client.exists("//sys")  # counted below
    with httpx.Client(base_url=engine.metrics_url, timeout=10) as http:
        resp = http.get("/metrics")
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/plain")
        assert 'reptables_requests_total{command="exists",outcome="ok"}' in resp.text
        token = {"Authorization": f"OAuth {engine.token}"}
        assert http.get("/api/v4/get", params={"path": "//sys"}, headers=token).status_code == 404
        assert http.post("/internal/v1/push", content=b"{}", headers=token).status_code == 404
        for path in ("/api/v4", "/healthz", "/readyz", "/hosts"):
            assert http.get(path).status_code == 404, path


# -- replication between two engines over HTTPS ------------------------------------------------------------


@dataclass
class TlsClusterSet(ClusterSet):
    """ClusterSet of TLS engines: ``https://`` proxy_urls in //sys/clusters (publish_directory),
    and clients that verify with the CA. ``peer_cas`` overrides the CA an engine trusts for its peers."""

    pki: Pki | None = None
    peer_cas: dict[str, Path] = field(default_factory=dict)

    def start(self, env: dict[str, str] | None = None) -> TlsClusterSet:
        assert self.pki is not None
        for name in self.names:
            self.engines[name] = tls_engine(name, self.base / name, self.pki, self.peer_cas.get(name)).start()
        self.publish_directory()
        return self

    def client(self, name: str, timeout: float = 30.0) -> Client:
        assert self.pki is not None
        client = self.clients.get(name)
        if client is None:
            engine = self.engines[name]
            client = self.clients[name] = Client(engine.url, engine.token, timeout=timeout,
                                                 transport=httpx.HTTPTransport(verify=self.pki.context()))
        return client


@pytest.fixture(scope="module")
def tls_clusters(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsClusterSet]:
    clusters = TlsClusterSet(tmp_path_factory.mktemp("tls_clusters"), names=("primary", "remote_0", "stranger"),
                             pki=pki, peer_cas={"stranger": pki.other_ca})
    try:
        yield clusters.start()
    finally:
        clusters.stop()


def test_directory_holds_https_urls(tls_clusters):
    directory = tls_clusters.meta.get("//sys/clusters")
    assert {name: entry["proxy_url"] for name, entry in directory.items()} == {
        name: f"https://127.0.0.1:{engine.port}" for name, engine in tls_clusters.engines.items()}


def test_async_replica_receives_rows_over_https(tls_clusters):
    path = tls_clusters.replicated_table("//tmp/async_rt")
    tls_clusters.replica(path, "remote_0", "//tmp/async_r")
    tls_clusters.meta.insert_rows(path, [{"k": 1, "v": "over tls"}], require_sync_replica=False)
    wait_for(lambda: tls_clusters.rows("remote_0", "//tmp/async_r") == [{"k": 1, "v": "over tls"}],
             what="the row on remote_0")


def test_sync_replica_commits_over_https(tls_clusters):
    """Two-phase commit (prepare, commit) between the engines over HTTPS."""
    path = tls_clusters.replicated_table("//tmp/sync_rt")
    sync = tls_clusters.replica(path, "remote_0", "//tmp/sync_r", mode="sync")
    tls_clusters.wait_in_sync(sync)
    tls_clusters.meta.insert_rows(path, [{"k": 7, "v": "2pc"}])
    assert tls_clusters.rows("remote_0", "//tmp/sync_r") == [{"k": 7, "v": "2pc"}]


def test_engine_trusting_another_ca_cannot_reach_its_peers(tls_clusters):
    """The stranger verifies peers with an unrelated CA: enabling its replica (which inspects the
    replica table on remote_0) fails with certificate verify failed, and nothing is sent."""
    stranger = tls_clusters.client("stranger")
    stranger.create("replicated_table", "//tmp/strange_rt", attributes={"dynamic": True, "schema": SCHEMA})
    stranger.mount_table("//tmp/strange_rt")
    replica_id = stranger.call("create", {"type": "table_replica", "attributes": {
        "table_path": "//tmp/strange_rt", "cluster_name": "remote_0", "replica_path": "//tmp/strange_r"}})["node_id"]
    tls_clusters.client("remote_0").create("table", "//tmp/strange_r", attributes={
        "dynamic": True, "schema": SCHEMA, "upstream_replica_id": replica_id})
    tls_clusters.client("remote_0").mount_table("//tmp/strange_r")
    with pytest.raises(YtError, match="certificate verify failed") as err:
        stranger.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
    assert err.value.code == ErrorCode.UNAVAILABLE
    assert tls_clusters.rows("remote_0", "//tmp/strange_r") == []


# -- the command line ------------------------------------------------------------------------------------------


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reptables.engine.cli", "serve", "--cluster-name", "bad",
                           "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "message"), [
    (lambda p: ["--tls-cert-file", str(p.cert)], "--tls-cert-file and --tls-key-file go together"),
    (lambda p: ["--tls-cert-file", str(p.cert), "--tls-key-file", str(p.elsewhere_key)], "KEY_VALUES_MISMATCH"),
    (lambda p: ["--tls-cert-file", str(p.cert) + ".missing", "--tls-key-file", str(p.key)], "No such file"),
    (lambda p: ["--tls-ca-file", str(p.key)], "cannot load the peer CA bundle"),
], ids=["cert-without-key", "key-of-another-cert", "missing-cert", "ca-file-without-certificates"])
def test_bad_tls_settings_stop_the_engine_before_it_opens_its_data(tmp_path, pki, args, message):
    result = _serve(tmp_path, *args(pki))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "data").exists()


# -- the chart ---------------------------------------------------------------------------------------------------

TLS_VALUES = merged(E2E_VALUES, {"tls": {"secretName": "engines-tls"}})


def _engine_containers(docs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    out = {}
    for sts in by_kind(docs, "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        out[sts["metadata"]["name"]] = (pod, container)
    return out


@needs_helm
@pytest.mark.parametrize("values", [TLS_VALUES, merged(TLS_VALUES, {"engineDefaults": {"metricsPort": 0},
                                                                    "serviceMonitor": {"enabled": False}})],
                         ids=["tls", "tls-without-metrics-listener"])
def test_helm_lint_with_tls(tmp_path, values):
    passed, output = lint(tmp_path, values)
    assert passed, output


@needs_helm
def test_helm_tls_on(tmp_path):
    from reptables.operator.cli import app

    docs = render(tmp_path, TLS_VALUES)
    assert isinstance(docs, list)
    command = typer.main.get_command(app).commands["engine"].commands["serve"]
    for name, (pod, container) in _engine_containers(docs).items():
        args = container["args"]
        cluster = name.removeprefix('rt-reptables-')
        cluster_id = next(e["clusterId"] for e in TLS_VALUES["engines"] if e["name"] == cluster)
        assert args == ["engine", "serve", f"--cluster-name={cluster}", f"--cluster-id={cluster_id}",
                        "--data-dir=/data", "--port=9012", "--host=0.0.0.0", "--metrics-port=9013",
                        f"--tls-cert-file={TLS_DIR}/tls.crt", f"--tls-key-file={TLS_DIR}/tls.key",
                        f"--tls-ca-file={TLS_DIR}/ca.crt"]
        params = command.make_context("serve", list(args[2:])).params  # the CLI accepts them
        assert params["tls_cert_file"] == Path(f"{TLS_DIR}/tls.crt")
        assert params["tls_key_file"] == Path(f"{TLS_DIR}/tls.key")
        assert params["tls_ca_file"] == Path(f"{TLS_DIR}/ca.crt") and params["metrics_port"] == 9013
        assert {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} in container["volumeMounts"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"] == {"secretName": "engines-tls", "defaultMode": 0o440}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", (name, probe)
            assert container[probe]["httpGet"]["path"] in ("/healthz", "/readyz")  # open paths: no token
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 9012, "metrics": 9013}
    for cluster in by_kind(docs, "TableCluster"):
        name = cluster["metadata"]["name"]
        assert cluster["spec"]["endpoint"] == f"https://rt-reptables-{name}.reptables-system.svc.cluster.local:9012"
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]
    (operator,) = deployment["containers"]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["SSL_CERT_FILE"] == f"{TLS_DIR}/ca.crt"
    assert {"name": "tls-ca", "mountPath": TLS_DIR, "readOnly": True} in operator["volumeMounts"]
    (ca_volume,) = [v for v in deployment["volumes"] if v["name"] == "tls-ca"]
    # the operator gets the CA certificate, never the engines' key
    assert ca_volume["secret"]["secretName"] == "engines-tls"
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    monitor = one(docs, "ServiceMonitor", "rt-reptables-engines")["spec"]["endpoints"]
    assert monitor == [{"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "30s",
                        "scrapeTimeout": "10s"}]
    for service in by_kind(docs, "Service"):
        if service["metadata"]["labels"].get("reptables.io/service") == "api":
            http, metrics = service["spec"]["ports"]
            assert http["name"] == "http" and http["appProtocol"] == "https"
            assert metrics == {"name": "metrics", "port": 9013, "targetPort": "metrics", "protocol": "TCP"}
    policy = one(docs, "NetworkPolicy")
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [9012, 9013]


@needs_helm
def test_helm_tls_on_custom_resources_pass_the_api_servers_validation(tmp_path):
    from tests.k8s.emulator import K8sApi

    docs = render(tmp_path, TLS_VALUES)
    assert isinstance(docs, list)
    with K8sApi(namespaces=["reptables-system"]) as api:
        for doc in by_kind(docs, "TableCluster"):
            assert api.create(doc)["spec"]["endpoint"].startswith("https://")


@needs_helm
def test_helm_tls_off_is_plain_http(tmp_path):
    docs = render(tmp_path, E2E_VALUES)
    assert isinstance(docs, list)
    for name, (pod, container) in _engine_containers(docs).items():
        assert not [a for a in container["args"] if a.startswith("--tls-")], name
        assert all(v["name"] != "tls" for v in pod["volumes"])
        assert all("scheme" not in container[p]["httpGet"] for p in ("startupProbe", "readinessProbe",
                                                                       "livenessProbe"))
    assert all(c["spec"]["endpoint"].startswith("http://") for c in by_kind(docs, "TableCluster"))
    (operator,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "SSL_CERT_FILE" not in {e["name"] for e in operator["env"]}
    assert [m["name"] for m in operator["volumeMounts"]] == ["tmp"]


@needs_helm
def test_helm_refuses_a_service_monitor_without_the_metrics_listener(tmp_path):
    values = merged(E2E_VALUES, {"engineDefaults": {"metricsPort": 0}})
    error = render(tmp_path, values, check=False)
    assert isinstance(error, str) and "serviceMonitor.enabled scrapes the engines' metrics listener" in error, error
    docs = render(tmp_path, merged(values, {"serviceMonitor": {"enabled": False}}))
    assert isinstance(docs, list)
    for name, (_, container) in _engine_containers(docs).items():
        assert not [a for a in container["args"] if a.startswith("--metrics-port")], name


@pytest.mark.parametrize(("overlay", "message"), [
    ({"tls": {"secretName": "Not_A_Secret"}}, "does not match"),
    ({"tls": {"secret": "x"}}, "Additional properties are not allowed"),
    ({"engineDefaults": {"metricsPort": 70000}}, "70000 is greater than the maximum of 65535"),
])
def test_schema_checks_the_transport_values(overlay, message):
    errors = [e.message for e in schema_validator().iter_errors(merged(load_values(), overlay))]
    assert any(message in e for e in errors), errors
    assert not list(schema_validator().iter_errors(merged(load_values(), {"tls": {"secretName": "engines-tls"}})))
