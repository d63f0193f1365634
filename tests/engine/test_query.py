"""Tests of the YT QL parser and compiler, run against a real table of the run's backend (SQLite, PostgreSQL).

Expected results are computed in Python from ROWS with YT's semantics (NULL equals NULL and is
smaller than every other value; integer division truncates), not hard-coded.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from reptables.engine.errors import ErrorCode, QuerySyntaxError, YtError
from reptables.engine.query import CompiledQuery, QuerySource, compile_query, parse_query
from reptables.engine.schema import ColumnType
from reptables.engine.storage.shapes import sql_type
from reptables.engine.storage.sql import postgresql_driver_url
from reptables.testing import backends

_STRINGS = ["alpha", "Beta", "GAMMA", "delta", "Epsilon"]
ROWS: list[dict[str, Any]] = [
    {
        "k": k,
        "s": None if k % 7 == 0 else _STRINGS[k % 5],
        "v": None if k % 4 == 0 else k * 1.5,
        "b": None if k % 5 == 0 else k % 2 == 0,
        "$row_index": (k + 6) * 10,
    }
    for k in range(-6, 24)
]
COLUMNS = ["k", "s", "v", "b", "$row_index"]

Row = dict[str, Any]


def yt_key(value: Any) -> tuple[bool, Any]:
    """Sort key that puts NULL before everything, as YT compares values."""
    return (value is not None, value)


def yt_compare(op: Callable[[Any, Any], bool], left: Any, right: Any) -> bool:
    return op(yt_key(left), yt_key(right))


def rows_where(predicate: Callable[[Row], bool], *columns: str) -> list[Row]:
    return [{c: row[c] for c in columns or COLUMNS} for row in ROWS if predicate(row)]


@pytest.fixture(scope="module")
def table() -> sa.Table:
    return sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("k", sa.BigInteger, primary_key=True),
        sa.Column("s", sql_type(ColumnType.STRING)),  # the engine's string column: byte order
        sa.Column("v", sa.Float),
        sa.Column("b", sa.Boolean),
        sa.Column("_rt_row_index", sa.BigInteger),
    )


@pytest.fixture(scope="module")
def engine(table: sa.Table) -> Iterator[sa.Engine]:
    # the run's backend: an in-memory SQLite, or a new database of the run's PostgreSQL server
    if backends.current() == backends.POSTGRESQL:
        engine = sa.create_engine(postgresql_driver_url(backends.new_database_url("query")))
    else:
        engine = sa.create_engine("sqlite://")
    table.metadata.create_all(engine)
    shuffled = ROWS[:]
    random.Random(7).shuffle(shuffled)  # so that key order has to come from the query
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [{**{c: row[c] for c in "ksvb"}, "_rt_row_index": row["$row_index"]} for row in shuffled],
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def source(table: sa.Table) -> QuerySource:
    return QuerySource(
        from_clause=table,
        columns={
            "k": table.c.k,
            "s": table.c.s,
            "v": table.c.v,
            "b": table.c.b,
            "$row_index": table.c._rt_row_index,
        },
        column_types={"k": "int64", "s": "string", "v": "double", "b": "boolean", "$row_index": "int64"},
        key_columns=("k",),
    )


@pytest.fixture
def run(engine: sa.Engine, source: QuerySource) -> Callable[[str], list[Row]]:
    def run(text: str) -> list[Row]:
        compiled = compile_query(parse_query(text), source)
        with engine.connect() as conn:
            return [
                dict(zip(compiled.output_columns, row, strict=True))
                for row in conn.execute(compiled.statement)
            ]

    return run


@pytest.fixture
def compiled(source: QuerySource) -> Callable[[str], CompiledQuery]:
    return lambda text: compile_query(parse_query(text), source)


# --- parsing --------------------------------------------------------------------------------------


def test_parse_query_returns_table_path():
    assert parse_query("select k from [//tmp/some table-1]").table_path == "//tmp/some table-1"


def test_parse_query_accepts_backquoted_path():
    assert parse_query("select k from `//tmp/t`").table_path == "//tmp/t"


def test_select_keyword_is_optional(run):
    assert run("* from [//t]") == run("select * from [//t]")


def test_keywords_are_case_insensitive(run):
    assert run("SeLeCt k FrOm [//t] WhErE k > 20 OrDeR By k DeSc LiMiT 2") == [{"k": 23}, {"k": 22}]


# --- projection -----------------------------------------------------------------------------------


def test_star_selects_all_columns_in_schema_order(run, compiled):
    assert compiled("select * from [//t]").output_columns == COLUMNS
    assert run("select * from [//t]") == rows_where(lambda r: True)


def test_rows_come_in_key_order_without_order_by(run):
    assert [row["k"] for row in run("select k from [//t]")] == sorted(row["k"] for row in ROWS)


def test_projection_alias_names_output_column(run):
    assert run("select k as key, s as [the string] from [//t] where k = 1") == [
        {"key": 1, "the string": "Beta"}
    ]


def test_unaliased_expression_is_named_after_whitespace_normalized_text(compiled):
    query = compiled("select k  +\n  1, lower( s ), 'a  b', k from [//t]")
    assert query.output_columns == ["k + 1", "lower( s )", "'a  b'", "k"]


def test_duplicate_output_column_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match='Duplicate column "k"'):
        compiled("select k, k from [//t]")


def test_bracketed_and_dollar_column_references(run):
    assert run("select [k], $row_index, [$row_index] as r from [//t] where k = 2") == [
        {"k": 2, "$row_index": 80, "r": 80}
    ]


def test_output_types_follow_yt_typing(compiled):
    query = compiled(
        "select k, v, k / 2 as q, v * 2 as w, k > 1 as gt, length(s) as n, 5u as u, double(k) as d from [//t]"
    )
    assert query.output_types == {
        "k": "int64",
        "v": "double",
        "q": "int64",
        "w": "double",
        "gt": "boolean",
        "n": "int64",
        "u": "uint64",
        "d": "double",
    }


def test_aliases_are_visible_in_where(run):
    assert run("select k % 3 as m from [//t] where m = 2") == [
        {"m": 2} for row in ROWS if math.fmod(row["k"], 3) == 2
    ]


def test_alias_shadows_column_except_in_its_own_definition(run):
    assert run("select k * 10 as k from [//t] where k = 30") == [{"k": 30}]


def test_duplicate_alias_is_rejected():
    with pytest.raises(QuerySyntaxError, match='Alias "x" has been already used'):
        parse_query("select k as x, s as x from [//t]")


# --- comparisons and logic ------------------------------------------------------------------------

_OPERATORS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@pytest.mark.parametrize("op", list(_OPERATORS))
def test_comparison_of_integer_column_with_literal(run, op):
    expected = rows_where(lambda r: _OPERATORS[op](r["k"], 5), "k")
    assert run(f"select k from [//t] where k {op} 5") == expected


@pytest.mark.parametrize("op", list(_OPERATORS))
def test_comparison_treats_null_as_smallest_value(run, op):
    expected = rows_where(lambda r: yt_compare(_OPERATORS[op], r["v"], 3.0), "k", "v")
    assert run(f"select k, v from [//t] where v {op} 3") == expected


@pytest.mark.parametrize("op", list(_OPERATORS))
def test_comparison_of_two_nullable_columns(run, op):
    expected = rows_where(lambda r: yt_compare(_OPERATORS[op], r["v"], r["$row_index"] / 10 - 6), "k")
    assert run(f"select k from [//t] where v {op} double($row_index) / 10.0 - 6.0") == expected


@pytest.mark.parametrize("op", list(_OPERATORS))
def test_comparison_in_projection_is_never_null(run, op):
    result = run(f"select k, v {op} 3 as c from [//t]")
    assert result == [{"k": r["k"], "c": yt_compare(_OPERATORS[op], r["v"], 3.0)} for r in ROWS]


def test_null_literal_equals_null(run):
    assert run("select k from [//t] where v = #") == rows_where(lambda r: r["v"] is None, "k")
    assert run("select k from [//t] where v = null") == rows_where(lambda r: r["v"] is None, "k")


def test_not_of_a_false_comparison_with_null_is_true(run):
    assert run("select k from [//t] where not (v > 3)") == rows_where(
        lambda r: not yt_compare(operator.gt, r["v"], 3), "k"
    )


def test_and_binds_tighter_than_or(run):
    expected = rows_where(lambda r: r["k"] < 0 or (r["k"] > 15 and r["s"] == "alpha"), "k")
    assert run("select k from [//t] where k < 0 or k > 15 and s = 'alpha'") == expected


def test_not_binds_looser_than_comparison_and_tighter_than_and(run):
    expected = rows_where(lambda r: (not r["k"] > 5) and r["k"] > 0, "k")
    assert run("select k from [//t] where not k > 5 and k > 0") == expected


def test_parentheses_override_precedence(run):
    expected = rows_where(lambda r: (r["k"] < 0 or r["k"] > 15) and r["s"] == "alpha", "k")
    assert run("select k from [//t] where (k < 0 or k > 15) and s = 'alpha'") == expected


def test_boolean_column_as_predicate(run):
    assert run("select k from [//t] where b") == rows_where(lambda r: r["b"] is True, "k")


def test_where_must_be_boolean(compiled):
    with pytest.raises(QuerySyntaxError, match="must be boolean"):
        compiled("select k from [//t] where k")


def test_type_mismatch_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match="Type mismatch in expression \"k = 'a'\""):
        compiled("select k from [//t] where k = 'a'")


def test_integer_and_unsigned_literals_do_not_mix(compiled):
    with pytest.raises(QuerySyntaxError, match="Type mismatch"):
        compiled("select k from [//t] where k = 5u")


# --- IN, BETWEEN, IS NULL -------------------------------------------------------------------------


def test_in_scalar(run):
    assert run("select k from [//t] where k in (1, 3, -5, 100)") == rows_where(
        lambda r: r["k"] in (1, 3, -5), "k"
    )


def test_not_in_scalar(run):
    assert run("select k from [//t] where k not in (1, 3)") == rows_where(lambda r: r["k"] not in (1, 3), "k")


def test_in_list_with_null_matches_null(run):
    expected = rows_where(lambda r: r["s"] in ("alpha", None), "k")
    assert run("select k from [//t] where s in ('alpha', #)") == expected


def test_not_in_keeps_null_rows_unless_null_is_listed(run):
    assert run("select k from [//t] where s not in ('alpha')") == rows_where(lambda r: r["s"] != "alpha", "k")
    expected = rows_where(lambda r: r["s"] not in ("alpha", None), "k")
    assert run("select k from [//t] where s not in ('alpha', null)") == expected


def test_in_tuple(run):
    expected = rows_where(lambda r: (r["k"], r["s"]) in ((1, "Beta"), (2, "Beta"), (7, None)), "k")
    assert run("select k from [//t] where (k, s) in ((1, 'Beta'), (2, 'Beta'), (7, #))") == expected


def test_in_tuple_without_null(run):
    expected = rows_where(lambda r: (r["k"], r["s"]) in ((1, "Beta"), (3, "delta")), "k")
    assert run("select k from [//t] where (k, s) in ((1, 'Beta'), (3, 'delta'), (4, 'x'))") == expected


def test_not_in_tuple(run):
    expected = rows_where(lambda r: (r["k"], r["s"]) not in ((1, "Beta"), (3, "delta")), "k")
    assert run("select k from [//t] where (k, s) not in ((1, 'Beta'), (3, 'delta'))") == expected


def test_in_result_in_projection_is_never_null(run):
    assert run("select v in (1.5, 3.0) as x from [//t]") == [{"x": r["v"] in (1.5, 3.0)} for r in ROWS]


def test_between_scalar(run):
    expected = rows_where(
        lambda r: yt_compare(operator.ge, r["v"], -3) and yt_compare(operator.le, r["v"], 6), "k"
    )
    assert run("select k from [//t] where v between -3 and 6") == expected


def test_not_between_keeps_null_below_range(run):
    expected = rows_where(
        lambda r: not (yt_compare(operator.ge, r["v"], 0) and yt_compare(operator.le, r["v"], 6)), "k"
    )
    assert run("select k from [//t] where v not between 0 and 6") == expected


def test_between_tuple_with_prefix_bound(run):
    def between(r: Row) -> bool:
        key = (yt_key(r["k"]), yt_key(r["v"]))
        return key[:1] >= (yt_key(2),) and key <= (yt_key(5), yt_key(6.0))

    assert run("select k from [//t] where (k, v) between (2) and (5, 6.0)") == rows_where(between, "k")


def test_tuple_comparison_is_lexicographic(run):
    def greater(r: Row) -> bool:
        return (yt_key(r["s"]), yt_key(r["k"])) > (yt_key("delta"), yt_key(3))

    assert run("select k from [//t] where (s, k) > ('delta', 3)") == rows_where(greater, "k")


def test_tuple_size_mismatch_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match="Tuple size mismatch"):
        compiled("select k from [//t] where (k, s) = (1, 'a', 2)")


def test_is_null_and_is_not_null(run):
    assert run("select k from [//t] where s is null") == rows_where(lambda r: r["s"] is None, "k")
    assert run("select k from [//t] where s is not null") == rows_where(lambda r: r["s"] is not None, "k")


def test_is_null_function(run):
    assert run("select k, is_null(v) as n from [//t]") == [{"k": r["k"], "n": r["v"] is None} for r in ROWS]


# --- arithmetic and literals ----------------------------------------------------------------------


def test_arithmetic_precedence(run):
    result = run("select k + 2 * 3 - 8 / 4 as a, (k + 2) * 3 as b, -k * 2 as c, k - -1 as d from [//t]")
    assert result == [
        {"a": r["k"] + 6 - 2, "b": (r["k"] + 2) * 3, "c": -r["k"] * 2, "d": r["k"] + 1} for r in ROWS
    ]


def test_integer_division_truncates_toward_zero(run):
    assert run("select k / 4 as q from [//t]") == [{"q": math.trunc(r["k"] / 4)} for r in ROWS]


def test_modulo_takes_the_sign_of_the_dividend(run):
    assert run("select k % 4 as m from [//t]") == [{"m": int(math.fmod(r["k"], 4))} for r in ROWS]


def test_double_division_is_exact(run):
    expected = [{"x": None if r["v"] is None else r["v"] / 4, "y": r["k"] / 4} for r in ROWS]
    assert run("select v / 4 as x, double(k) / 4 as y from [//t]") == expected


def test_modulo_of_double_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match="Type mismatch"):
        compiled("select v % 2 from [//t]")


def test_string_literals_with_escapes_and_both_quote_styles(run):
    result = run(
        r"""select 'it\'s' as a, "say \"hi\"\t!" as b, '\x41\u00e9\n' as c, "\\" as d from [//t] limit 1"""
    )
    assert result == [{"a": "it's", "b": 'say "hi"\t!', "c": "A\u00e9\n", "d": "\\"}]


def test_boolean_literals(run):
    assert run("select true as t, %false as f from [//t] limit 1") == [{"t": True, "f": False}]
    assert run("select k from [//t] where b = %true") == rows_where(lambda r: r["b"] is True, "k")
    assert run("select k from [//t] where b = false") == rows_where(lambda r: r["b"] is False, "k")


def test_null_literals(run):
    assert run("select null as a, # as b from [//t] limit 1") == [{"a": None, "b": None}]


def test_numeric_literals(run):
    result = run("select 42 as i, -5 as n, 42u as u, 1.5 as f, 1e3 as e, .25 as d from [//t] limit 1")
    assert result == [{"i": 42, "n": -5, "u": 42, "f": 1.5, "e": 1000.0, "d": 0.25}]


def test_integer_literal_adapts_to_double_column(run):
    assert run("select k from [//t] where v > 10") == rows_where(
        lambda r: yt_compare(operator.gt, r["v"], 10), "k"
    )


def test_out_of_range_integer_literal_is_rejected():
    with pytest.raises(QuerySyntaxError, match="out of int64 range"):
        parse_query("select k from [//t] where k = 9223372036854775808")


# --- functions ------------------------------------------------------------------------------------


def _or_none(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else function(value)


@pytest.mark.parametrize(
    ("expression", "column", "expected"),
    [
        ("lower(s)", "s", _or_none(str.lower)),
        ("upper(s)", "s", _or_none(str.upper)),
        ("length(s)", "s", _or_none(len)),
        ("abs(k)", "k", abs),
        ("abs(v)", "v", _or_none(abs)),
        ("concat(s, '!')", "s", _or_none(lambda s: s + "!")),
        ("s || '?'", "s", _or_none(lambda s: s + "?")),
        ("if(k > 3, k, 0)", "k", lambda k: k if k > 3 else 0),
        ("int64(v)", "v", _or_none(math.trunc)),
        ("uint64(k * k)", "k", lambda k: k * k),
        ("double(k)", "k", float),
        ("string(k)", "k", str),
        ("string(s)", "s", lambda s: s),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_scalar_function(run, expression, column, expected):
    assert run(f"select {expression} as x from [//t]") == [{"x": expected(r[column])} for r in ROWS]


def test_function_names_are_case_insensitive(run):
    assert run("select LOWER(s) as x from [//t] where k = 2") == [{"x": "gamma"}]


def test_unknown_function_is_rejected_by_name(compiled):
    with pytest.raises(QuerySyntaxError, match='Unknown function "frobnicate"'):
        compiled("select frobnicate(k) from [//t]")


def test_wrong_argument_count_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match='Wrong number of arguments to function "lower"'):
        compiled("select lower(s, s) from [//t]")


# --- grouping -------------------------------------------------------------------------------------


def test_group_by_with_each_aggregate(run):
    result = run(
        "select b, count(*) as n, count(v) as nv, sum(k) as sk, sum(v) as sv, min(s) as mn, max(v) as mx,"
        " avg(k) as ak from [//t] group by b"
    )
    expected = []
    for b in (None, False, True):
        group = [r for r in ROWS if r["b"] is b]
        vs = [r["v"] for r in group if r["v"] is not None]
        expected.append(
            {
                "b": b,
                "n": len(group),
                "nv": len(vs),
                "sk": sum(r["k"] for r in group),
                "sv": sum(vs),
                "mn": min(r["s"] for r in group if r["s"] is not None),
                "mx": max(vs),
                "ak": sum(r["k"] for r in group) / len(group),
            }
        )
    assert (
        sorted(result, key=lambda row: yt_key(row["b"])) == expected
    )  # exact: every value is a multiple of 0.5


def test_min_and_max_of_booleans(run):
    assert run("select min(b) as lo, max(b) as hi, max(b = true) as any_true from [//t] where k < 3") == [
        {"lo": False, "hi": True, "any_true": True}
    ]


def test_group_by_alias_is_referenced_by_projection(run):
    result = run("select p, sum(k) as total from [//t] group by k % 3 as p")
    expected = {p: sum(r["k"] for r in ROWS if math.fmod(r["k"], 3) == p) for p in (-2, -1, 0, 1, 2)}
    assert {row["p"]: row["total"] for row in result} == expected


def test_group_by_expression_is_matched_in_projection(run):
    result = run("select k % 2 as parity, count(*) as n from [//t] group by k % 2")
    assert {row["parity"]: row["n"] for row in result} == {-1: 3, 0: 15, 1: 12}


def test_aggregate_of_expression(run):
    assert run("select sum(k * 2) + 1 as x from [//t] group by 1") == [
        {"x": 2 * sum(r["k"] for r in ROWS) + 1}
    ]


def test_having_filters_groups(run):
    result = run("select s, count(*) as n from [//t] group by s having n > 5 and s is not null")
    counts = {s: sum(1 for r in ROWS if r["s"] == s) for s in _STRINGS}
    assert sorted((row["s"], row["n"]) for row in result) == sorted(
        (s, n) for s, n in counts.items() if n > 5
    )


def test_aggregate_without_group_by_is_one_row_even_when_empty(run):
    assert run("select count(*) as n, sum(k) as s from [//t]") == [
        {"n": len(ROWS), "s": sum(r["k"] for r in ROWS)}
    ]
    assert run("select count(*) as n, sum(k) as s from [//t] where k > 1000") == [{"n": 0, "s": None}]


def test_group_by_constant_has_no_group_when_no_rows(run):
    assert run("select sum(1) as n from [//t] group by 1") == [{"n": len(ROWS)}]
    assert run("select sum(1) as n from [//t] where k > 1000 group by 1") == []


def test_non_key_column_in_grouped_projection_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match='Column "v" must be a GROUP BY key'):
        compiled("select s, v from [//t] group by s")


def test_aggregate_in_where_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match='Misuse of aggregate function "sum" in WHERE'):
        compiled("select k from [//t] where sum(k) > 1")


def test_nested_aggregate_is_rejected(compiled):
    with pytest.raises(QuerySyntaxError, match='Misuse of aggregate function "sum"'):
        compiled("select max(sum(k)) from [//t] group by s")


# --- ORDER BY, OFFSET, LIMIT ----------------------------------------------------------------------


def test_order_by_multiple_keys_ascending_and_descending(run):
    expected = sorted(sorted(ROWS, key=lambda r: r["k"]), key=lambda r: yt_key(r["s"]), reverse=True)
    result = run("select s, k from [//t] order by s desc, k asc limit 100")
    assert result == [{"s": r["s"], "k": r["k"]} for r in expected]


def test_order_by_puts_nulls_first_ascending(run):
    expected = sorted(ROWS, key=lambda r: (yt_key(r["v"]), r["k"]))[:8]
    assert run("select k, v from [//t] order by v, k limit 8") == [
        {"k": r["k"], "v": r["v"]} for r in expected
    ]


def test_order_by_projection_alias(run):
    expected = sorted(ROWS, key=lambda r: -abs(r["k"] - 10))[:3]
    assert run("select k, abs(k - 10) as d from [//t] order by d desc limit 3") == [
        {"k": r["k"], "d": abs(r["k"] - 10)} for r in expected
    ]


def test_order_by_aggregate(run):
    result = run("select s, count(*) as n from [//t] group by s order by count(*) desc, s limit 2")
    counts = sorted(
        ((sum(1 for r in ROWS if r["s"] == s), s) for s in {r["s"] for r in ROWS}),
        key=lambda x: (-x[0], yt_key(x[1])),
    )
    assert result == [{"s": s, "n": n} for n, s in counts[:2]]


def test_limit(run):
    assert run("select k from [//t] limit 4") == [{"k": r["k"]} for r in ROWS[:4]]


def test_offset_and_limit(run):
    assert run("select k from [//t] order by k desc offset 3 limit 4") == [
        {"k": r["k"]} for r in ROWS[::-1][3:7]
    ]


def test_order_by_without_limit_is_rejected():
    with pytest.raises(QuerySyntaxError, match="ORDER BY used without LIMIT") as error:
        parse_query("select k from [//t] order by k")
    assert error.value.code == ErrorCode.QUERY_SYNTAX_ERROR


def test_offset_without_limit_is_rejected():
    with pytest.raises(QuerySyntaxError, match="OFFSET used without LIMIT"):
        parse_query("select k from [//t] offset 3")


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_column_is_column_not_found(compiled):
    with pytest.raises(YtError, match='Undefined reference "nope"') as error:
        compiled("select k from [//t] where nope = 1")
    assert error.value.code == ErrorCode.COLUMN_NOT_FOUND


def test_syntax_error_reports_position_and_expected_tokens():
    with pytest.raises(QuerySyntaxError) as error:
        parse_query("select k frm [//t]")
    message = str(error.value)
    assert message.startswith('Error while parsing query: unexpected "frm" at 1:10, expected one of: ')
    assert "FROM" in message and "select k frm [//t]" in message
    assert error.value.attributes["line"] == 1 and error.value.attributes["column"] == 10


def test_syntax_error_position_counts_lines():
    with pytest.raises(QuerySyntaxError, match="at 3:7"):
        parse_query("select k\nfrom [//t]\nwhere ) k")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        "select",
        "select k",
        "select k from",
        "select k from //t",
        "select k frm [//t]",
        "select k, from [//t]",
        "select * , k from [//t]",
        "select k from [//t] where",
        "select k from [//t] where k =",
        "select k from [//t] where (k > 1",
        "select k from [//t] where k @ 1",
        "select k from [//t] where s = 'unterminated",
        "select k from [//t] where k in ()",
        "select k from [//t] where k in (k)",
        "select k from [//t] where k between 1",
        "select k from [//t] group k",
        "select k from [//t] limit",
        "select k from [//t] limit 1.5",
        "select k from [//t] limit -1",
        "select k from [//t] limit 1 offset 1",
        "select k from [//t] extra",
        "select k as from [//t]",
        "select count(* from [//t]",
        "select k from [//t] where k = 1 = = 2",
        "select k from [//t] where s = '\\xff'",
    ],
)
def test_malformed_query_raises_query_syntax_error(text):
    with pytest.raises(QuerySyntaxError) as error:
        parse_query(text)
    assert error.value.code == ErrorCode.QUERY_SYNTAX_ERROR


def test_redundant_parentheses_are_harmless(run):
    assert run("select " + "(" * 2000 + "k" + ")" * 2000 + " as k from [//t] where k = 3") == [{"k": 3}]


def test_long_generated_or_chain_is_accepted(run):
    condition = " or ".join(f"k = {k}" for k in range(1000, 1900)) + " or k = 5"  # SQLite caps depth at 1000
    assert run(f"select k from [//t] where {condition}") == [{"k": 5}]


def test_too_deeply_nested_expression_is_a_syntax_error(compiled):
    with pytest.raises(QuerySyntaxError, match="too deeply nested"):
        compiled("select " + "-(" * 5000 + "k" + ")" * 5000 + " as x from [//t]")


def test_empty_query_is_a_syntax_error():
    with pytest.raises(QuerySyntaxError, match="the query is empty"):
        parse_query("")


# --- dialect neutrality ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "select * from [//t] where k > 3 and (v < 10 or not b) and s != 'x' limit 5",
        "select k from [//t] where (k, s) in ((1, 'a'), (2, 'b')) and v not between 1 and 2",
        "select k % 2 as p, sum(v) as s, avg(k) from [//t] group by p having s > 1 order by s desc limit 3",
        "select int64(v), string(k), if(b, k, 0), v = double(k) from [//t]",
        "select s, min(b), max(b), count(v) from [//t] group by s",
    ],
)
def test_statement_compiles_for_postgresql(compiled, text):
    sql = str(compiled(text).statement.compile(dialect=postgresql.dialect()))
    assert sql.startswith("SELECT")


# --- the parser's cached tables -------------------------------------------------------------------


def test_the_parser_tables_are_cached_per_user_and_a_bad_cache_file_is_rebuilt(tmp_path, monkeypatch):
    """An engine start loads the parser tables from this user's cache; a damaged file is built anew and
    replaced, and a cache directory others may write to is not used at all (the file is unpickled)."""
    from reptables.engine.query import grammar

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    text = "select k, v from [//t] where k in (1, 2) order by k limit 3"
    expected = grammar.PARSER.parse(text)
    grammar._build_parser()
    (cached,) = (tmp_path / "reptables").iterdir()
    assert cached.stat().st_mode & 0o077 == 0
    assert grammar._build_parser().parse(text) == expected  # loaded from the file
    cached.write_bytes(b"not a parser")
    assert grammar._build_parser().parse(text) == expected
    assert cached.read_bytes() != b"not a parser"  # replaced by good tables
    cached.unlink()
    (tmp_path / "reptables").chmod(0o777)
    assert grammar._build_parser().parse(text) == expected
    assert not any((tmp_path / "reptables").iterdir())  # nothing written where others could write


# --- a tuple of key columns in IN is searched, not scanned ------------------------------------------


@pytest.fixture(scope="module")
def pairs(engine: sa.Engine) -> tuple[sa.Table, QuerySource]:
    """A table keyed by two columns, 20,000 rows."""
    table = sa.Table("pairs", sa.MetaData(), sa.Column("a", sa.BigInteger, primary_key=True),
                     sa.Column("b", sa.BigInteger, primary_key=True), sa.Column("v", sa.BigInteger))
    table.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"a": i % 4, "b": i, "v": i * 3} for i in range(20_000)])
    source = QuerySource(from_clause=table, columns={c: table.c[c] for c in ("a", "b", "v")},
                         column_types={"a": "int64", "b": "int64", "v": "int64"}, key_columns=("a", "b"))
    return table, source


@pytest.mark.parametrize("listed", [3, 256, 257, 600])
def test_a_tuple_of_key_columns_in_a_list_finds_its_rows_by_the_index(engine, pairs, listed):
    table, source = pairs
    wanted = [(b % 4, b) for b in range(5, 5 + 7 * listed, 7)]
    listed_text = ", ".join(f"({a}, {b})" for a, b in wanted + [(9, 9)])  # (9, 9): no such row
    for text, expected in [
        (f"a, b, v from [//pairs] where (a, b) in ({listed_text})", sorted((a, b, b * 3) for a, b in wanted)),
        (f"a, b, v from [//pairs] where (b, a) in ({listed_text.replace('(9, 9)', '(9, 0)')})", []),
        (f"a, b from [//pairs] where (a, b) not in ({listed_text}) and b < 40",
         sorted((b % 4, b) for b in range(40) if (b % 4, b) not in wanted)),
    ]:
        statement = compile_query(parse_query(text), source).statement
        with engine.connect() as conn:
            assert [tuple(row) for row in conn.execute(statement)] == expected, text
            if engine.dialect.name == "sqlite" and " not in (" not in text:
                compiled = statement.compile(conn, compile_kwargs={"render_postcompile": True})
                plan = [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled),
                                                               tuple(compiled.params.values()))]
                # SQLite 3.40 scans the whole table for a row-value IN list
                assert not [step for step in plan if step.startswith("SCAN pairs")], (text, plan)
