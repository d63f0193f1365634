"""Queries over several tables (YT QL ``JOIN``) against a real engine process.

Why: seed 002 lets one ``select-rows`` read several tables; users write YT QL joins
(``[left] join [//t] as b on a.k = b.k`` / ``using k``) and expect YT's results. Every expected
answer here is computed in Python from the rows the test inserted, never hard-coded.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from reptables.engine.client import Client
from reptables.engine.errors import ErrorCode, YtError
from reptables.testing import EngineProcess

Row = dict[str, Any]

USERS_SCHEMA = [{"name": "uid", "type": "int64", "sort_order": "ascending"},
                {"name": "name", "type": "string"}, {"name": "city", "type": "string"}]
ORDERS_SCHEMA = [{"name": "uid", "type": "int64", "sort_order": "ascending"},
                 {"name": "oid", "type": "int64", "sort_order": "ascending"},
                 {"name": "amount", "type": "double"}, {"name": "status", "type": "string"}]
CITIES_SCHEMA = [{"name": "city", "type": "string", "sort_order": "ascending"},
                 {"name": "country", "type": "string"}]
LOG_SCHEMA = [{"name": "uid", "type": "int64"}, {"name": "message", "type": "string"}]

CITIES = ["Amsterdam", "Berlin", "Lisbon", "Oslo"]
_rng = random.Random(10)
USERS: list[Row] = [{"uid": uid, "name": f"user{uid}",
                     "city": None if uid % 5 == 0 else _rng.choice(CITIES + ["Nowhere"])} for uid in range(0, 30)]
ORDERS: list[Row] = [{"uid": uid, "oid": oid, "amount": round(_rng.uniform(1, 100), 2),
                      "status": _rng.choice(["new", "paid", None])}
                     for uid in range(0, 40, 2) for oid in range(_rng.randrange(0, 4))]  # uid 30.. have no user
COUNTRIES = {"Amsterdam": "NL", "Berlin": "DE", "Lisbon": "PT", "Oslo": "NO"}
CITY_ROWS: list[Row] = [{"city": c, "country": n} for c, n in COUNTRIES.items()]


@pytest.fixture(scope="module")
def client(shared_engine: EngineProcess) -> Iterator[Client]:
    with Client(shared_engine.url, shared_engine.token) as c:
        for path, schema, rows in (("//tmp/j/users", USERS_SCHEMA, USERS), ("//tmp/j/orders", ORDERS_SCHEMA, ORDERS),
                                   ("//tmp/j/cities", CITIES_SCHEMA, CITY_ROWS), ("//tmp/j/log", LOG_SCHEMA, [])):
            c.create("table", path, attributes={"dynamic": True, "schema": schema}, recursive=True)
            c.mount_table(path)
            if rows:
                c.insert_rows(path, rows)
        yield c


def _key(row: Row, *columns: str) -> tuple[Any, ...]:
    return tuple((row[c] is not None, row[c]) for c in columns)


def test_inner_join_with_aliases_returns_matching_pairs(client: Client) -> None:
    got = client.select_rows("u.uid, u.name, o.oid, o.amount from [//tmp/j/users] as u "
                             "join [//tmp/j/orders] as o on u.uid = o.uid")
    expected = [{"u.uid": u["uid"], "u.name": u["name"], "o.oid": o["oid"], "o.amount": o["amount"]}
                for u in USERS for o in ORDERS if o["uid"] == u["uid"]]
    # without ORDER BY the rows come in key order, as in YT
    assert got == sorted(expected, key=lambda r: (r["u.uid"], r["o.oid"]))


def test_left_join_yields_nulls_for_missing_right_rows(client: Client) -> None:
    got = client.select_rows("u.uid, o.oid, o.status from [//tmp/j/users] as u "
                             "left join [//tmp/j/orders] as o on u.uid = o.uid")
    expected: list[Row] = []
    for u in USERS:
        matches = [o for o in ORDERS if o["uid"] == u["uid"]]
        expected += [{"u.uid": u["uid"], "o.oid": o["oid"], "o.status": o["status"]} for o in matches] or [
            {"u.uid": u["uid"], "o.oid": None, "o.status": None}]
    assert got == sorted(expected, key=lambda r: _key(r, "u.uid", "o.oid"))
    assert any(r["o.oid"] is None for r in got)  # users without orders are kept


def test_join_using_shows_the_column_once(client: Client) -> None:
    got = client.select_rows("* from [//tmp/j/users] join [//tmp/j/orders] using uid where status = 'paid'")
    expected = [{**u, "oid": o["oid"], "amount": o["amount"], "status": o["status"]}
                for u in USERS for o in ORDERS if o["uid"] == u["uid"] and o["status"] == "paid"]
    assert got == sorted(expected, key=lambda r: (r["uid"], r["oid"]))
    assert all(list(r) == ["uid", "name", "city", "oid", "amount", "status"] for r in got)


def test_left_join_using_on_a_string_key(client: Client) -> None:
    got = client.select_rows("uid, city, country from [//tmp/j/users] left join [//tmp/j/cities] using city")
    expected = [{"uid": u["uid"], "city": u["city"], "country": COUNTRIES.get(u["city"])} for u in USERS]
    assert got == expected


def test_join_on_the_whole_composite_key_and_on_a_tuple(client: Client) -> None:
    target = {(o["uid"], o["oid"]): o for o in ORDERS}
    wanted = [(uid, 1) for uid in range(0, 40, 2)]
    # the left side is the users table: uid = o.uid and the constant 1 = o.oid cover the key (uid, oid)
    for condition in ("u.uid = o.uid and o.oid = 1", "(u.uid, 1) = (o.uid, o.oid)", "1 = o.oid and o.uid = u.uid"):
        got = client.select_rows(f"u.uid, o.amount from [//tmp/j/users] as u join [//tmp/j/orders] as o on {condition}")
        expected = [{"u.uid": uid, "o.amount": target[(uid, oid)]["amount"]} for uid, oid in wanted
                    if (uid, oid) in target and any(u["uid"] == uid for u in USERS)]
        assert got == expected, condition


def test_where_group_by_order_by_limit_over_joined_rows(client: Client) -> None:
    got = client.select_rows(
        "c.country as country, sum(o.amount) as total, count(*) as n "
        "from [//tmp/j/orders] as o join [//tmp/j/users] as u on o.uid = u.uid "
        "join [//tmp/j/cities] as c on u.city = c.city "
        "where o.status != 'new' group by c.country order by total desc limit 3")
    totals: dict[str, list[float]] = {}
    for o in ORDERS:
        user = next((u for u in USERS if u["uid"] == o["uid"]), None)
        if o["status"] == "new" or user is None or user["city"] not in COUNTRIES:
            continue
        totals.setdefault(COUNTRIES[user["city"]], []).append(o["amount"])
    expected = sorted(({"country": k, "total": sum(v), "n": len(v)} for k, v in totals.items()),
                      key=lambda r: -r["total"])[:3]
    assert [r["country"] for r in got] == [r["country"] for r in expected]
    for g, e in zip(got, expected, strict=True):
        assert g["n"] == e["n"] and g["total"] == pytest.approx(e["total"])


def test_self_join_and_bare_names_of_one_table(client: Client) -> None:
    by_uid = {u["uid"]: u for u in USERS}
    expected = [{"a.uid": u["uid"], "next": u["uid"] + 1, "name": u["name"]} for u in USERS
                if COUNTRIES.get(u["city"]) == "NL" and u["uid"] + 1 in by_uid]
    # "name" is in both users tables, both aliased: it must be qualified
    assert expected
    with pytest.raises(YtError, match='Column "name" is ambiguous'):
        client.select_rows("a.uid from [//tmp/j/users] as a join [//tmp/j/users] as b on a.uid = b.uid "
                           "where name = 'x'")
    got = client.select_rows("a.uid, b.uid as next, a.name as name from [//tmp/j/users] as a "
                             "join [//tmp/j/cities] as c on a.city = c.city "
                             "join [//tmp/j/users] as b on a.uid + 1 = b.uid where country = 'NL'")
    assert got == expected


def test_join_reads_every_table_at_the_snapshot_timestamp(client: Client) -> None:
    client.create("table", "//tmp/j/snap_a", attributes={"dynamic": True, "schema": USERS_SCHEMA})
    client.create("table", "//tmp/j/snap_b", attributes={"dynamic": True, "schema": CITIES_SCHEMA})
    for path in ("//tmp/j/snap_a", "//tmp/j/snap_b"):
        client.mount_table(path)
    client.insert_rows("//tmp/j/snap_a", [{"uid": 1, "name": "old", "city": "Oslo"}])
    client.insert_rows("//tmp/j/snap_b", [{"city": "Oslo", "country": "NO"}])
    ts = client.generate_timestamp()
    client.insert_rows("//tmp/j/snap_a", [{"uid": 1, "name": "new", "city": "Oslo"},
                                          {"uid": 2, "name": "x", "city": "Rome"}])
    client.insert_rows("//tmp/j/snap_b", [{"city": "Oslo", "country": "Norway"}, {"city": "Rome", "country": "IT"}])
    query = "uid, name, country from [//tmp/j/snap_a] join [//tmp/j/snap_b] using city"
    assert client.select_rows(query, timestamp=ts) == [{"uid": 1, "name": "old", "country": "NO"}]
    assert client.select_rows(query) == [{"uid": 1, "name": "new", "country": "Norway"},
                                         {"uid": 2, "name": "x", "country": "IT"}]


@pytest.mark.parametrize("query, fragment", [
    ("* from [//tmp/j/users] as u join [//tmp/j/orders] as o on o.oid = u.uid", "prefix of its key columns (uid, oid)"),
    ("* from [//tmp/j/users] as u join [//tmp/j/orders] as o on u.uid < o.uid", "it equates none of its columns"),
    ("* from [//tmp/j/orders] as o join [//tmp/j/users] as u on o.oid = u.name", "Type mismatch"),
    ("* from [//tmp/j/users] join [//tmp/j/orders] using oid", 'USING column "oid"'),
    ("* from [//tmp/j/users] join [//tmp/j/orders] on uid = uid", 'Column "uid" occurs both in main and joined tables'),
    ("* from [//tmp/j/users] as u join [//tmp/j/log] as l on u.uid = l.uid", "is not sorted"),
    ("* from [//tmp/j/users] as u join [//tmp/j/cities] as c on c.city = d.city", 'no table of the query has alias'),
    ("* from [//tmp/j/users] as u join [//tmp/j/users] as u on u.uid = u.uid", 'Table alias "u" has been already used'),
])
def test_bad_joins_are_refused_with_a_clear_error(client: Client, query: str, fragment: str) -> None:
    with pytest.raises(YtError) as err:
        client.select_rows(query)
    assert fragment in err.value.message
    assert err.value.code in (ErrorCode.QUERY_SYNTAX_ERROR, ErrorCode.COLUMN_NOT_FOUND)


def test_non_key_prefix_join_names_the_table_and_its_key(client: Client) -> None:
    with pytest.raises(YtError) as err:
        client.select_rows("* from [//tmp/j/users] as u join [//tmp/j/orders] as o on u.uid = o.oid")
    assert err.value.code == ErrorCode.QUERY_SYNTAX_ERROR
    assert err.value.message == ("Join of table //tmp/j/orders must equate a prefix of its key columns (uid, oid) "
                                 "with expressions over the tables before it; it equates oid")


@pytest.mark.parametrize("query, position", [
    ("* from [//tmp/j/users] join", "1:28"),
    ("* from [//tmp/j/users] as u join [//tmp/j/orders] as o", "1:55"),
    ("* from [//tmp/j/users] as u join [//tmp/j/orders] as o on", "1:58"),
    ("* from [//tmp/j/users] left [//tmp/j/orders] using uid", "1:29"),
    ("* from [//tmp/j/users] join [//tmp/j/orders] using", "1:51"),
])
def test_join_syntax_errors_point_at_the_problem(client: Client, query: str, position: str) -> None:
    with pytest.raises(YtError) as err:
        client.select_rows(query)
    assert err.value.code == ErrorCode.QUERY_SYNTAX_ERROR
    assert err.value.message.startswith("Error while parsing query: unexpected")
    assert f" at {position}" in err.value.message


def test_join_through_the_official_yt_cli(shared_engine: EngineProcess, client: Client) -> None:
    out = shared_engine.yt("select-rows", "u.name, o.amount from [//tmp/j/users] as u join [//tmp/j/orders] as o "
                           "on u.uid = o.uid where o.oid = 0", "--format", "json").stdout
    got = [json.loads(line) for line in out.splitlines() if line.strip()]
    expected = [{"u.name": u["name"], "o.amount": o["amount"]} for u in USERS for o in ORDERS
                if o["uid"] == u["uid"] and o["oid"] == 0]
    assert got == expected
