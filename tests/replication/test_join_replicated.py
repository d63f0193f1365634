"""A query over several replicated tables, through the meta-cluster (seed 002, "Reading data").

Why: seed 002 says several meta-cluster tables may take part in one ``select-rows``, provided one
cluster holds synchronous replicas of all of them ("inter-cluster queries are not supported"). The
query is then served there, with each table retargeted to its replica table; otherwise it is
refused with YT's error. Three real engines; the queries go through the official ``yt`` CLI,
``yt.wrapper`` and our client. Replica tables live at other paths than the replicated tables, so
a query that was not retargeted could not succeed on the replica cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reptables.engine.credentials import peer_credential
from reptables.engine.errors import ErrorCode, YtError
from tests.replication.conftest import ClusterSet

USERS_SCHEMA = [{"name": "uid", "type": "int64", "sort_order": "ascending"}, {"name": "name", "type": "string"}]
ORDERS_SCHEMA = [{"name": "uid", "type": "int64", "sort_order": "ascending"},
                 {"name": "oid", "type": "int64", "sort_order": "ascending"}, {"name": "amount", "type": "int64"}]
USERS = [{"uid": uid, "name": f"user{uid}"} for uid in range(8)]
ORDERS = [{"uid": uid, "oid": oid, "amount": uid * 10 + oid} for uid in range(0, 12, 3) for oid in range(2)]
QUERY = "u.uid, u.name, o.oid, o.amount from [{users}] as u left join [{orders}] as o on u.uid = o.uid"


def expected() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for u in USERS:
        matches = [o for o in ORDERS if o["uid"] == u["uid"]]
        out += [{"u.uid": u["uid"], "u.name": u["name"], "o.oid": o["oid"], "o.amount": o["amount"]}
                for o in matches] or [{"u.uid": u["uid"], "u.name": u["name"], "o.oid": None, "o.amount": None}]
    return out


@pytest.fixture(scope="module")
def cs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("join"))).start()
    try:
        yield clusters
    finally:
        clusters.stop()


def _tables(cs: ClusterSet, name: str, users_sync: str, orders_sync: str) -> tuple[str, str]:
    """Two replicated tables, each with a sync replica on the given cluster and an async one on the
    other replica cluster, filled through the meta-cluster."""
    cs.meta.create("map_node", f"//tmp/{name}", recursive=True)
    users = cs.replicated_table(f"//tmp/{name}/users", USERS_SCHEMA)
    orders = cs.replicated_table(f"//tmp/{name}/orders", ORDERS_SCHEMA)
    for path, schema, sync_cluster in ((users, USERS_SCHEMA, users_sync), (orders, ORDERS_SCHEMA, orders_sync)):
        other = "remote_1" if sync_cluster == "remote_0" else "remote_0"
        replica_path = path.replace("//tmp/", "//replicas/")
        cs.wait_in_sync(cs.replica(path, sync_cluster, replica_path, mode="sync", schema=schema))
        cs.replica(path, other, replica_path, mode="async", schema=schema)
    cs.meta.insert_rows(users, USERS)
    cs.meta.insert_rows(orders, ORDERS)
    return users, orders


def test_join_of_replicated_tables_is_served_by_the_cluster_of_their_sync_replicas(cs: ClusterSet) -> None:
    users, orders = _tables(cs, "same", users_sync="remote_0", orders_sync="remote_0")
    query = QUERY.format(users=users, orders=orders)
    # the official CLI, yt.wrapper and our client, all against the meta-cluster
    out = cs.engines["primary"].yt("select-rows", query, "--format", "json").stdout
    assert [json.loads(line) for line in out.splitlines() if line.strip()] == expected()
    assert list(cs.engines["primary"].wrapper_client().select_rows(query)) == expected()
    assert cs.meta.select_rows(query) == expected()
    # USING, a filter and grouping are served the same way
    grouped = cs.meta.select_rows(f"uid, sum(amount) as total from [{users}] join [{orders}] using uid "
                                  "where oid >= 0 group by uid order by uid limit 100")
    totals: dict[int, int] = {}
    for o in ORDERS:
        if any(u["uid"] == o["uid"] for u in USERS):
            totals[o["uid"]] = totals.get(o["uid"], 0) + o["amount"]
    assert grouped == [{"uid": uid, "total": total} for uid, total in sorted(totals.items())]
    # a write through the meta-cluster is seen by the next join at once (sync replicas)
    cs.meta.insert_rows(orders, [{"uid": 1, "oid": 7, "amount": 5}])
    assert {"u.uid": 1, "u.name": "user1", "o.oid": 7, "o.amount": 5} in cs.meta.select_rows(query)


def test_join_is_refused_when_no_single_cluster_has_sync_replicas_of_all_tables(cs: ClusterSet) -> None:
    # each table has a sync replica and an async one on both replica clusters, but the sync ones differ
    users, orders = _tables(cs, "split", users_sync="remote_0", orders_sync="remote_1")
    query = QUERY.format(users=users, orders=orders)
    message = f"No single cluster contains in-sync replicas for all involved tables [{users}, {orders}]"
    with pytest.raises(YtError) as err:
        cs.meta.select_rows(query)
    assert err.value.code == ErrorCode.NO_IN_SYNC_REPLICAS == 1736
    assert err.value.message == message
    # the CLI would retry 1736 (a sync replica may come back in sync): the seed's user sees it with retries off
    result = cs.engines["primary"].yt("select-rows", query, "--format", "json", check=False,
                                      config_patch="{dynamic_table_retries={enable=%false}}")
    assert result.returncode != 0 and message in result.stderr
    # each table alone is still readable through its own sync replica
    assert cs.meta.select_rows(f"uid, name from [{users}]") == USERS


def test_join_of_a_replicated_table_with_a_plain_table_is_refused(cs: ClusterSet) -> None:
    users, _ = _tables(cs, "mixed", users_sync="remote_0", orders_sync="remote_0")
    plain = "//tmp/mixed/plain_orders"
    cs.meta.create("table", plain, attributes={"dynamic": True, "schema": ORDERS_SCHEMA})
    cs.meta.mount_table(plain)
    with pytest.raises(YtError) as err:
        cs.meta.select_rows(f"* from [{users}] as u join [{plain}] as o on u.uid = o.uid")
    assert err.value.code == ErrorCode.INVALID_PARAMETER
    assert err.value.message == (f"Query mixes replicated tables ({users}) with tables that are not replicated "
                                 f"({plain}): if one table of a query is replicated, all must be")


def test_a_peer_credential_joins_only_its_own_replica_tables(cs: ClusterSet) -> None:
    """The replica cluster runs the retargeted join with the meta-cluster's peer credential: every
    table of the join, not only the first, must be a replica table of that meta-cluster."""
    users, orders = _tables(cs, "peer", users_sync="remote_0", orders_sync="remote_0")
    replica_users, replica_orders = (p.replace("//tmp/", "//replicas/") for p in (users, orders))
    engine = cs.engines["remote_0"]
    assert engine.token
    cs.client("remote_0").create("table", "//tmp/peer_plain", attributes={"dynamic": True, "schema": ORDERS_SCHEMA})
    cs.client("remote_0").mount_table("//tmp/peer_plain")
    headers = {"Authorization": f"OAuth {peer_credential(engine.token, 'primary')}", "X-YT-Header-Format": "json"}

    def select(query: str) -> httpx.Response:
        return httpx.post(f"{engine.url}/api/v4/select_rows", params={"output_format": "json", "query": query},
                          headers=headers, timeout=30)

    own = select(QUERY.format(users=replica_users, orders=replica_orders))
    assert own.status_code == 200
    assert [json.loads(line) for line in own.text.splitlines() if line.strip()] == expected()
    refused = select(QUERY.format(users=replica_users, orders="//tmp/peer_plain"))
    assert refused.status_code == 403
    error = json.loads(refused.headers["X-YT-Error"])
    assert error["code"] == ErrorCode.AUTHORIZATION_ERROR and "//tmp/peer_plain" in error["message"]
