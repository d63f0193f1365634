"""Who may call a cluster's ``/internal/v1``, and for which tables: one credential per ordered pair.

The attack these tests replay: a cluster that legitimately holds a credential for a replica
cluster (it has replicas there itself) uses it to write the replicas of *another* meta-cluster —
pushing forged rows, preparing or deciding transactions in that cluster's name — or uses the
replica cluster's API token, or a credential minted for someone else. Real engines over HTTP, each
with its own API token: ``primary`` and ``rogue`` are both meta-clusters with replicas on
``replica``, and every directory lists every cluster.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from reptables.engine.credentials import cell_tag, id_cell_tag, peer_credential
from reptables.engine.errors import YtError
from reptables.operator.cli import app as reptables_cli
from reptables.testing import wait_for

from .conftest import SCHEMA, ClusterSet

PRIMARY, REPLICA, ROGUE = "primary", "replica", "rogue"
_names = itertools.count()


@pytest.fixture(scope="module")
def cs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("auth")), names=(PRIMARY, REPLICA, ROGUE))
    try:
        yield clusters.start(own_tokens=True)
    finally:
        clusters.stop()


def call(cs: ClusterSet, method: str, body: dict[str, Any], caller: str | None = None,
         credential: str | None = None, target: str = REPLICA) -> httpx.Response:
    """A raw ``/internal/v1`` call to ``target`` as ``caller`` (its genuine credential) or with ``credential``."""
    engine = cs.engines[target]
    assert engine.token
    value = credential if credential is not None else peer_credential(engine.token, caller or PRIMARY)
    return httpx.post(f"{engine.url}/internal/v1/{method}", json=body, timeout=30,
                      headers={"Authorization": f"OAuth {value}"})


def refused(response: httpx.Response, status: int, code: int, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.text[:500])
    error = response.json()
    assert error["code"] == code, error
    for word in words:
        assert word in error["message"], (word, error["message"])
    return str(error["message"])


def replicated_pair(cs: ClusterSet, meta: str = PRIMARY, enable: bool = True) -> tuple[str, str, str]:
    """A replicated table on ``meta`` with an async replica on ``replica``: (table, replica id, replica path)."""
    n = next(_names)
    table, path = f"//tmp/{meta}_t{n}", f"//tmp/from_{meta}_{n}"
    client = cs.client(meta)
    client.create("replicated_table", table, attributes={"dynamic": True, "schema": SCHEMA})
    client.mount_table(table)
    replica_id = client.call("create", {"type": "table_replica", "attributes": {
        "table_path": table, "cluster_name": REPLICA, "replica_path": path, "mode": "async"}})["node_id"]
    cs.client(REPLICA).create("table", path, attributes={"dynamic": True, "schema": SCHEMA,
                                                         "upstream_replica_id": replica_id})
    cs.client(REPLICA).mount_table(path)
    if enable:
        client.call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
    return table, replica_id, path


def push(replica_id: str, path: str, ts: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"upstream_replica_id": replica_id, "replica_path": path, "tablet_index": 0, "prev_row_index": 0,
            "row_index": len(rows), "preserve_timestamps": True,
            "entries": [{"timestamp": ts, "kind": "write", "payload": {"row": r, "update": False}} for r in rows]}


def prepare(tx_id: str, replica_id: str, path: str, ts: int, coordinator: str) -> dict[str, Any]:
    return {"transaction_id": tx_id, "coordinator": coordinator, "replica_id": replica_id, "replica_path": path,
            "tablet_index": 0, "start_timestamp": ts, "prepare_timestamp": ts, "rows": [{"k": 1, "v": "forged"}],
            "kind": "write", "mask": 1, "update": False, "shared": False, "strong": False}


def test_a_replica_id_carries_its_meta_clusters_cell_tag(cs: ClusterSet) -> None:
    _, replica_id, path = replicated_pair(cs, PRIMARY, enable=False)
    assert id_cell_tag(replica_id) == cell_tag(PRIMARY) != cell_tag(ROGUE)
    assert cs.client(REPLICA).get(f"{path}/@upstream_replica_id") == replica_id


def test_another_meta_cluster_cannot_push_rows_into_a_replica_it_does_not_own(cs: ClusterSet) -> None:
    table, replica_id, path = replicated_pair(cs, PRIMARY, enable=False)
    ts = cs.meta.generate_timestamp()
    # rogue legitimately holds a credential for replica (it has replicas there) ...
    _, own_id, own_path = replicated_pair(cs, ROGUE, enable=False)
    assert call(cs, "push", push(own_id, own_path, ts, [{"k": 7, "v": "mine"}]), caller=ROGUE).status_code == 200
    assert cs.rows(REPLICA, own_path) == [{"k": 7, "v": "mine"}]
    # ... and cannot use it for primary's replica
    message = refused(call(cs, "push", push(replica_id, path, ts, [{"k": 1, "v": "forged"}]), caller=ROGUE),
                      403, 901, ROGUE, replica_id, path)
    assert "token" not in message.lower()
    assert cs.rows(REPLICA, path) == []
    # the owner's replication is untouched: its first batch is still accepted from row 0
    cs.client(PRIMARY).call("alter_table_replica", {"replica_id": replica_id, "enabled": True})
    cs.client(PRIMARY).insert_rows(table, [{"k": 1, "v": "real"}], require_sync_replica=False)
    wait_for(lambda: cs.rows(REPLICA, path) == [{"k": 1, "v": "real"}], 30, "the real row replicated")


def test_another_meta_cluster_cannot_prepare_or_decide_its_transactions(cs: ClusterSet) -> None:
    _, replica_id, path = replicated_pair(cs, PRIMARY, enable=False)
    ts = cs.meta.generate_timestamp()
    # in its own name, or in the owner's
    refused(call(cs, "prepare", prepare("1-2-3-a1", replica_id, path, ts, ROGUE), caller=ROGUE), 403, 901, ROGUE)
    refused(call(cs, "prepare", prepare("1-2-3-a2", replica_id, path, ts, PRIMARY), caller=ROGUE), 403, 901,
            ROGUE, PRIMARY)
    # the owner prepares; the rogue can neither commit nor abort it
    assert call(cs, "prepare", prepare("1-2-3-a3", replica_id, path, ts, PRIMARY)).status_code == 200
    commit_ts = cs.meta.generate_timestamp()
    refused(call(cs, "commit", {"transaction_id": "1-2-3-a3", "commit_timestamp": commit_ts}, caller=ROGUE),
            403, 901, ROGUE, PRIMARY)
    refused(call(cs, "abort", {"transaction_id": "1-2-3-a3"}, caller=ROGUE), 403, 901, ROGUE)
    assert call(cs, "commit", {"transaction_id": "1-2-3-a3", "commit_timestamp": commit_ts}).status_code == 200
    assert cs.rows(REPLICA, path) == [{"k": 1, "v": "forged"}]  # (the owner wrote it, "forged" is its text)


def test_table_info_of_a_replica_table_answers_only_its_meta_cluster(cs: ClusterSet) -> None:
    _, replica_id, path = replicated_pair(cs, PRIMARY, enable=False)
    refused(call(cs, "table_info", {"path": path}, caller=ROGUE), 403, 901, ROGUE)
    info = call(cs, "table_info", {"path": path}).json()
    assert info["upstream_replica_id"] == replica_id and info["key_columns"] == ["k"]


def test_the_api_token_is_refused_on_internal_calls_and_a_peer_credential_on_the_api(cs: ClusterSet) -> None:
    engine = cs.engines[REPLICA]
    assert engine.token
    refused(call(cs, "transaction_status", {"transaction_id": "1-2-3-4"}, credential=engine.token), 401, 900,
            "peer credential", "API token")
    credential = peer_credential(engine.token, PRIMARY)
    answer = httpx.post(f"{engine.url}/api/v4/create", params={"path": "//tmp/made_by_a_peer", "type": "map_node"},
                        timeout=30, headers={"Authorization": f"OAuth {credential}"})
    refused(answer, 401, 900, "peer credential")
    answer = httpx.get(f"{engine.url}/api/v4/get", params={"path": "//sys/clusters"}, timeout=30,
                       headers={"Authorization": f"OAuth {credential}"})
    refused(answer, 403, 901, "replica tables")


def test_a_forged_or_misdirected_credential_is_refused(cs: ClusterSet) -> None:
    engine, rogue = cs.engines[REPLICA], cs.engines[ROGUE]
    assert engine.token and rogue.token
    status = {"transaction_id": "1-2-3-4"}
    genuine = peer_credential(engine.token, PRIMARY)
    refused(call(cs, "transaction_status", status, credential=genuine[:-1] + ("0" if genuine[-1] != "0" else "1")),
            401, 900, "not valid")
    # a credential with a valid MAC for another caller's name does not stand for this caller
    refused(call(cs, "transaction_status", status, credential=f"peer:{ROGUE}:{genuine.rsplit(':', 1)[1]}"),
            401, 900, "not valid")
    # minted for the rogue cluster, presented to the replica cluster
    refused(call(cs, "transaction_status", status, credential=peer_credential(rogue.token, PRIMARY)),
            401, 900, "not valid")
    # genuine, but for a name this cluster's directory does not list
    refused(call(cs, "transaction_status", status, caller="stranger"), 403, 901, "stranger", "//sys/clusters")
    assert call(cs, "transaction_status", status).json() == {"state": "aborted"}


def test_a_cluster_removed_from_the_directory_is_cut_off(cs: ClusterSet) -> None:
    _, own_id, own_path = replicated_pair(cs, ROGUE, enable=False)
    replica = cs.client(REPLICA)
    entry = replica.get(f"//sys/clusters/{ROGUE}")
    # the credential is accepted (and remembered as verified) first: the removal cuts it off all the same
    assert call(cs, "table_info", {"path": own_path}, caller=ROGUE).status_code == 200
    replica.remove(f"//sys/clusters/{ROGUE}", recursive=True)
    try:
        ts = cs.meta.generate_timestamp()
        refused(call(cs, "push", push(own_id, own_path, ts, [{"k": 1, "v": "late"}]), caller=ROGUE), 403, 901,
                ROGUE, "//sys/clusters")
        assert cs.rows(REPLICA, own_path) == []
    finally:
        assert entry["token"] == "<hidden>"  # (what get shows; the credential itself is put back below)
        cs.publish_directory()
    assert call(cs, "push", push(own_id, own_path, cs.meta.generate_timestamp(), [{"k": 1, "v": "back"}]),
                caller=ROGUE).status_code == 200


def test_two_names_with_one_cell_tag_are_refused_in_a_directory(cs: ClusterSet) -> None:
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"c{i}"
        other = seen.setdefault(cell_tag(name), name)
        if other != name:
            break
    client = cs.client(PRIMARY)
    before = client.get("//sys/clusters")
    directory = {n: {"proxy_url": "http://127.0.0.1:1", "token": "x"} for n in (other, name)}
    with pytest.raises(YtError) as error:
        client.set("//sys/clusters", directory)
    assert other in error.value.message and name in error.value.message and "cell tag" in error.value.message
    assert client.get("//sys/clusters") == before


def test_reptables_peer_credential_prints_what_the_target_accepts(cs: ClusterSet) -> None:
    engine = cs.engines[REPLICA]
    token_file = engine.data_dir / "token"
    assert token_file.read_text().strip() == engine.token
    result = CliRunner().invoke(reptables_cli, ["peer-credential", "--caller", PRIMARY,
                                                "--token-file", str(token_file)])
    assert result.exit_code == 0, result.output
    credential = result.output.strip()
    assert engine.token not in credential
    started = time.monotonic()
    assert call(cs, "transaction_status", {"transaction_id": "1-2-3-5"}, credential=credential).status_code == 200
    assert time.monotonic() - started < 10


def test_a_peer_credential_reads_only_its_own_replica_tables(cs: ClusterSet) -> None:
    """A meta-cluster serves reads of its replicated tables from an in-sync replica with its peer
    credential, and a bootstrap reads a source replica with it: get, lookup_rows and select_rows of
    its own replica tables, nothing else."""
    _, own_id, own_path = replicated_pair(cs, PRIMARY, enable=False)
    _, other_id, other_path = replicated_pair(cs, ROGUE, enable=False)
    ts = cs.meta.generate_timestamp()
    assert call(cs, "push", push(own_id, own_path, ts, [{"k": 1, "v": "a"}])).status_code == 200
    assert call(cs, "push", push(other_id, other_path, ts, [{"k": 1, "v": "b"}]), caller=ROGUE).status_code == 200
    engine = cs.engines[REPLICA]
    assert engine.token
    headers = {"Authorization": f"OAuth {peer_credential(engine.token, PRIMARY)}", "X-YT-Header-Format": "json"}

    def api(command: str, params: dict[str, Any], body: bytes = b"") -> httpx.Response:
        return httpx.post(f"{engine.url}/api/v4/{command}", params={"output_format": "json", **params},
                          content=body, headers=headers, timeout=30)

    assert api("select_rows", {"query": f"* from [{own_path}]"}).text.strip() == '{"k":1,"v":"a"}'
    assert api("lookup_rows", {"path": own_path, "input_format": "json"}, b'{"k":1}').status_code == 200
    refused(api("select_rows", {"query": f"* from [{other_path}]"}), 403, 901, PRIMARY, other_path)
    refused(api("lookup_rows", {"path": other_path, "input_format": "json"}, b'{"k":1}'), 403, 901, other_path)
    cs.client(REPLICA).create("table", "//tmp/plain_auth", attributes={"dynamic": True, "schema": SCHEMA})
    refused(api("select_rows", {"query": "* from [//tmp/plain_auth]"}), 403, 901, "//tmp/plain_auth")
    refused(api("get", {"path": "//sys/clusters"}), 403, 901, "replica tables")
    refused(api("get", {"path": f"{other_path}/@schema"}), 403, 901, other_path)
    assert api("get", {"path": f"{own_path}/@schema"}).status_code == 200  # what a bootstrap's reader plans with
    refused(api("set", {"path": f"{own_path}/@x"}, b"1"), 401, 900, "peer credential")
    refused(api("insert_rows", {"path": own_path, "input_format": "json"}, b'{"k":2,"v":"x"}'), 401, 900)
    assert cs.rows(REPLICA, own_path) == [{"k": 1, "v": "a"}]


def test_internal_calls_of_names_not_served_are_counted_under_one_label(cs: ClusterSet) -> None:
    """Anyone may send ``/internal/v1/<any name>``, unauthenticated: each is refused (404), and
    counted in ``reptables_requests_total`` as ``internal:unknown`` - never under the name sent,
    which would let callers grow the engine's metrics (and every scrape) without bound."""
    engine = cs.engines[REPLICA]
    names = [f"probe_{next(_names)}_{i}" for i in range(5)]
    for name in names:
        answer = httpx.post(f"{engine.url}/internal/v1/{name}", json={}, timeout=30)
        refused(answer, 404, 103, name)
    metrics = httpx.get(f"{engine.url}/metrics", headers={"Authorization": f"OAuth {engine.token}"}, timeout=30)
    assert metrics.status_code == 200
    assert not any(name in metrics.text for name in names), "a name sent became a metric label"
    unknown = [line for line in metrics.text.splitlines()
               if line.startswith('reptables_requests_total{command="internal:unknown",outcome="error"}')]
    assert unknown and float(unknown[0].split()[-1]) >= len(names), unknown
