"""A peer cluster served by a leader engine and standbys, reached without a Service in front of it.

``//sys/clusters/<name>/proxy_url`` may name every engine of the cluster, as a list or separated by
commas (docs/ha.md, "Peers reach the leader"). What a user relies on, checked here against
stand-ins for the peer's engines (HTTP servers that answer as a leader, as a standby naming the
leader, or too late) and, for the directory itself, a real engine:

* a call reaches the leader: past a refused connection and past a standby's ``not_leader`` answer,
  each engine asked at most once, and the next call goes straight to the leader;
* a call an engine may have acted on (no answer within the timeout) is never sent again: the caller
  gets the error, and the next call goes to the next engine;
* the token goes only to the URLs of the entry: a leader a standby names elsewhere is never called;
* the directory takes a list or a comma-separated string, shows it as written, refuses a bad one
  with an error naming the entry, and keeps a stored token only while the entry names the same URLs.

tests/ha/test_ha_xdcr.py does the same with real engines: a leader killed and paused under pushes,
two-phase commits and XDCR shipping.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from reptables.engine.errors import ErrorCode, UnavailableError, YtError
from reptables.engine.peers import Peers, parse_directory
from reptables.testing import EngineProcess, free_port

TOKEN = "peer:a:credential-of-a-for-b"


class FakeEngine:
    """One engine of peer cluster b: answers every ``/internal/v1`` call as a ``leader`` (200), a
    ``standby`` (105 ``not_leader``, naming ``leader_url``) or a ``slow`` leader (after ``delay`` s);
    records each call's path and Authorization."""

    def __init__(self, role: str, leader_url: str | None = None, delay: float = 0.0) -> None:
        self.role, self.leader_url, self.delay = role, leader_url, delay
        self.calls: list[tuple[str, str]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                engine.calls.append((self.path, self.headers.get("Authorization", "")))
                if engine.role == "slow":
                    time.sleep(engine.delay)
                if engine.role == "standby":
                    attributes: dict[str, Any] = {"not_leader": True, "cluster_name": "b"}
                    if engine.leader_url:
                        attributes["leader_url"] = engine.leader_url
                    status, answer = 503, {"code": 105, "message": "Cluster b: this engine is a standby",
                                           "attributes": attributes, "inner_errors": []}
                else:
                    status, answer = 200, {"answered_by": engine.url}
                body = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller gave up (a slow engine)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fakes() -> Iterator[list[FakeEngine]]:
    made: list[FakeEngine] = []
    try:
        yield made
    finally:
        for fake in made:
            fake.close()


def fake(fakes: list[FakeEngine], role: str, leader_url: str | None = None, delay: float = 0.0) -> FakeEngine:
    engine = FakeEngine(role, leader_url, delay)
    fakes.append(engine)
    return engine


def peers_of(proxy_url: Any, timeout: float = 1.0) -> Peers:
    peers = Peers(timeout=timeout)
    peers.update(parse_directory({"b": {"proxy_url": proxy_url, "token": TOKEN}}))
    return peers


def refused_url() -> str:
    """The URL of a port nothing listens on (a killed engine)."""
    return f"http://127.0.0.1:{free_port()}"


def test_a_call_goes_past_a_refused_engine_and_a_standby_to_the_leader(fakes: list[FakeEngine]) -> None:
    leader = fake(fakes, "leader")
    standby = fake(fakes, "standby", leader_url=leader.url)
    dead = refused_url()
    peers = peers_of([dead, standby.url, leader.url])
    try:
        # the list's order: the dead one (refused: nothing sent), the standby (not the leader: nothing
        # done), then the leader it names
        peers_b = peers.client("b")
        assert peers_b.call("push", {"rows": []}) == {"answered_by": leader.url}
        assert standby.calls == [("/internal/v1/push", f"OAuth {TOKEN}")]
        assert leader.calls == [("/internal/v1/push", f"OAuth {TOKEN}")]
        # the next call goes to the leader at once
        assert peers_b.call("prepare", {}) == {"answered_by": leader.url}
        assert len(standby.calls) == 1 and [p for p, _ in leader.calls] == ["/internal/v1/push", "/internal/v1/prepare"]
        assert peers_b.url == leader.url
    finally:
        peers.close()


def test_a_comma_separated_proxy_url_is_the_same_set_of_engines(fakes: list[FakeEngine]) -> None:
    leader = fake(fakes, "leader")
    standby = fake(fakes, "standby", leader_url=leader.url + "/")
    peers = peers_of(f"{standby.url}, {leader.url}/")
    try:
        assert peers.connection("b").urls == (standby.url, leader.url)
        assert peers.client("b").call("xdcr_apply", {}) == {"answered_by": leader.url}
        # the public API (reads served by replicas) follows the leader the same way
        assert peers.public_client("b").proxy_url == standby.url
    finally:
        peers.close()


def test_a_call_an_engine_may_have_acted_on_is_not_sent_again(fakes: list[FakeEngine]) -> None:
    slow = fake(fakes, "slow", delay=3.0)
    other = fake(fakes, "leader")
    peers = peers_of([slow.url, other.url], timeout=0.5)
    try:
        client = peers.client("b")
        with pytest.raises(UnavailableError, match=f"Cluster b is unreachable at {slow.url}"):
            client.call("prepare", {"transaction_id": "t1"})
        assert len(slow.calls) == 1 and other.calls == []  # the prepare went nowhere else
        # the next call goes to the next engine
        assert client.call("prepare", {"transaction_id": "t2"}) == {"answered_by": other.url}
    finally:
        peers.close()


def test_the_token_never_goes_to_a_leader_outside_the_entry(fakes: list[FakeEngine]) -> None:
    outsider = fake(fakes, "leader")  # an address the entry does not list
    leader = fake(fakes, "leader")
    standby = fake(fakes, "standby", leader_url=outsider.url)
    peers = peers_of([standby.url, leader.url])
    try:
        # the standby names an address outside the entry: the call goes to the entry's next URL instead
        assert peers.client("b").call("push", {}) == {"answered_by": leader.url}
        assert outsider.calls == []
    finally:
        peers.close()
    # an entry of the standby alone: the standby's answer, never the outsider
    peers = peers_of(standby.url)
    try:
        with pytest.raises(YtError) as raised:
            peers.client("b").call("push", {})
        assert raised.value.code == ErrorCode.UNAVAILABLE
        assert raised.value.inner_errors[0].attributes["not_leader"] is True
        with pytest.raises(YtError):
            peers.public_client("b").get("//sys/@")
        assert outsider.calls == []
    finally:
        peers.close()


def test_standbys_that_know_no_leader_answer_105_after_two_rounds(fakes: list[FakeEngine]) -> None:
    standbys = [fake(fakes, "standby"), fake(fakes, "standby")]
    peers = peers_of([s.url for s in standbys])
    try:
        with pytest.raises(YtError) as raised:
            peers.client("b").call("push", {})
        assert raised.value.code == ErrorCode.UNAVAILABLE and "not_leader" in raised.value.inner_errors[0].attributes
        assert all(1 <= len(s.calls) <= 3 for s in standbys), [len(s.calls) for s in standbys]
    finally:
        peers.close()


# -- the directory: a list or commas, shown as written, bad values refused by name, tokens per set -------


class Api:
    def __init__(self, engine: EngineProcess) -> None:
        self.http = httpx.Client(base_url=engine.url, timeout=60)
        self.token = engine.token

    def send(self, command: str, params: dict[str, Any], body: Any = None) -> httpx.Response:
        headers = {"X-YT-Header-Format": "json", "Authorization": f"OAuth {self.token}",
                   "X-YT-Parameters": json.dumps({**params, **({"input_format": "json"} if body is not None else {})})}
        return self.http.post(f"/api/v4/{command}", headers=headers,
                              content=json.dumps(body).encode() if body is not None else None)

    def get(self, path: str) -> Any:
        answer = self.send("get", {"path": path})
        assert answer.status_code == 200, answer.text
        return answer.json()["value"]

    def set(self, path: str, value: Any) -> httpx.Response:
        return self.send("set", {"path": path}, value)


@pytest.fixture
def api(shared_engine: EngineProcess) -> Iterator[Api]:
    client = Api(shared_engine)
    try:
        yield client
    finally:
        client.set("//sys/clusters", {})
        client.http.close()


def test_the_directory_takes_the_engines_of_a_cluster_as_a_list_or_commas(api: Api) -> None:
    urls = ["http://10.0.0.5:9012", "http://10.0.0.6:9012"]
    assert api.set("//sys/clusters/b", {"proxy_url": urls, "token": TOKEN}).status_code == 200
    assert api.get("//sys/clusters/b") == {"proxy_url": urls, "token": "<hidden>"}
    assert api.set("//sys/clusters/c", {"proxy_url": ",".join(urls), "token": TOKEN}).status_code == 200
    assert api.get("//sys/clusters/c/proxy_url") == ",".join(urls)
    # the same engines in another order or form: the token stays
    assert api.set("//sys/clusters/b/proxy_url", [urls[1] + "/", urls[0]]).status_code == 200
    assert api.get("//sys/clusters/b/token") == "<hidden>"
    assert api.set("//sys/clusters/c", {"proxy_url": list(reversed(urls)), "token": "<hidden>"}).status_code == 200
    assert api.get("//sys/clusters/c/token") == "<hidden>"
    # one engine more: a new address, so the stored token is dropped (never sent to it)
    assert api.set("//sys/clusters/b/proxy_url", [*urls, "http://10.0.0.7:9012"]).status_code == 200
    assert api.get("//sys/clusters/b") == {"proxy_url": [*urls, "http://10.0.0.7:9012"]}


@pytest.mark.parametrize(("value", "says"), [
    ([], "the list is empty"),
    (["http://10.0.0.5:9012", 7], "the list holds 7, not a string"),
    ("http://10.0.0.5:9012,ftp://10.0.0.6", "'ftp://10.0.0.6' is not an http(s) URL"),
    (["http://10.0.0.5:9012", "10.0.0.6:9012"], "'10.0.0.6:9012' is not an http(s) URL"),
    (",", "got ','"),
    ([f"http://10.0.0.{i}:1" for i in range(17)], "names 17 urls, more than the 16 engines"),
])
def test_a_bad_proxy_url_is_refused_naming_the_entry(api: Api, value: Any, says: str) -> None:
    api.set("//sys/clusters/b", {"proxy_url": "http://10.0.0.5:9012", "token": TOKEN})
    before = api.get("//sys/clusters")
    answer = api.set("//sys/clusters/b/proxy_url", value)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["code"] == ErrorCode.INVALID_PARAMETER
    assert "//sys/clusters/b/proxy_url" in error["message"] and says.lower() in error["message"].lower(), error
    assert api.get("//sys/clusters") == before
