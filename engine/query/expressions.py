"""The typing and SQL of one expression: built-in functions, YT's comparison semantics, scopes.

Why this module exists: it is the part of the compiler that looks at a single expression and not at
the query around it. :class:`Scope` infers the set of YT types an expression may take (rejecting
type errors as YT does) and emits its SQL, rewriting comparisons so that NULL equals NULL and sorts
first; the tables of built-in functions, aggregates and comparisons are here too. What a name
stands for in a given clause (a column, a group key, an aggregate) is decided by the subclasses of
:class:`Scope` in :mod:`.compiler`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import sqlalchemy as sa
from sqlalchemy.types import NullType, TypeEngine

from ..errors import QuerySyntaxError
from .ast import Between, Binary, Call, Expr, In, Literal, Logical, Tuple, Unary, items
from .yt_types import (
    _ANY,
    _BOOLEAN_ONLY,
    _INTEGRAL,
    _NUMERIC,
    _STRING,
    _STRING_ONLY,
    ALL_TYPES,
    BOOLEAN,
    DOUBLE,
    INT64,
    SA_TYPES,
    UINT64,
    choose,
)

# The tables below are built once at import and read-only after.

AGGREGATE_ARGUMENT_TYPES = {
    "count": ALL_TYPES,
    "sum": _NUMERIC,
    "min": ALL_TYPES - {_ANY},
    "max": ALL_TYPES - {_ANY},
    "avg": _NUMERIC,
}


@dataclass(frozen=True)
class _Function:
    """A scalar function: the YT types each argument accepts and its result type.

    ``result=None`` means the result has the type of the (unified) arguments.
    """

    arguments: tuple[frozenset[str], ...]
    result: str | None


_FUNCTIONS = {
    "is_null": _Function((ALL_TYPES,), BOOLEAN),
    "if": _Function((_BOOLEAN_ONLY, ALL_TYPES, ALL_TYPES), None),
    "lower": _Function((_STRING_ONLY,), _STRING),
    "upper": _Function((_STRING_ONLY,), _STRING),
    "length": _Function((_STRING_ONLY,), INT64),
    "abs": _Function((_NUMERIC,), None),
    "concat": _Function((_STRING_ONLY, _STRING_ONLY), _STRING),
    "int64": _Function((_NUMERIC,), INT64),
    "uint64": _Function((_NUMERIC,), UINT64),
    "double": _Function((_NUMERIC,), DOUBLE),
    "string": _Function((_STRING_ONLY | _NUMERIC,), _STRING),
}

_COMPARISONS: dict[str, Callable[[Any, Any], sa.ColumnElement[bool]]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
# ``x <op> NULL`` for a non-literal x, NULL being the smallest value; a bool is a constant result.
_AGAINST_NULL: dict[str, Callable[[sa.ColumnElement[Any]], sa.ColumnElement[bool]] | bool] = {
    "=": lambda x: x.is_(None),
    "!=": lambda x: x.is_not(None),
    "<": False,
    "<=": lambda x: x.is_(None),
    ">": lambda x: x.is_not(None),
    ">=": True,
}


def is_aggregate(node: Expr) -> TypeGuard[Call]:
    return isinstance(node, Call) and node.name in AGGREGATE_ARGUMENT_TYPES


def _non_null_literal(node: Expr) -> bool:
    return isinstance(node, Literal) and node.value is not None


def _literal_types(literal: Literal) -> frozenset[str]:
    match literal.kind:
        case "int":
            assert isinstance(literal.value, int)
            return _NUMERIC if literal.value >= 0 else frozenset({INT64, DOUBLE})
        case "uint":
            return frozenset({UINT64})
        case "double":
            return frozenset({DOUBLE})
        case "string":
            return _STRING_ONLY
        case "boolean":
            return _BOOLEAN_ONLY
    return ALL_TYPES  # null fits every type


def _type_mismatch(parent: Expr, *found: frozenset[str]) -> QuerySyntaxError:
    described = " and ".join(choose(types) for types in found)
    return QuerySyntaxError(f'Type mismatch in expression "{parent.text}": {described}')


#: tuples of an ``IN`` list written as an ``OR`` of equalities (``Scope._tuple_in``); SQLite refuses an
#: expression nested deeper than 1,000
OR_TERMS = 256


@dataclass(frozen=True)
class Leaf:
    """An expression the scope already holds as SQL: a column, a group key or an aggregate."""

    sql: sa.ColumnElement[Any]
    yt_type: str


class Scope(ABC):
    """Types and emits resolved expressions; a subclass decides which nodes are leaves.

    ``emit(node, t, predicate)`` produces SQL for ``node`` typed as the YT type ``t`` (one of the
    types the node may take). With ``predicate=True`` the caller only tests the result for truth, so
    an SQL NULL may stand for false; otherwise the SQL must be NULL exactly where YT's value is.
    """

    def __init__(self) -> None:
        self._types: dict[Expr, frozenset[str]] = {}

    @abstractmethod
    def leaf(self, node: Expr) -> Leaf | None: ...

    # typing -----------------------------------------------------------------------------------

    def types(self, node: Expr) -> frozenset[str]:
        if node not in self._types:
            leaf = self.leaf(node)
            self._types[node] = frozenset({leaf.yt_type}) if leaf is not None else self._infer(node)
        return self._types[node]

    def expect(self, node: Expr, allowed: frozenset[str], parent: Expr) -> frozenset[str]:
        types = self.types(node) & allowed
        if not types:
            raise QuerySyntaxError(
                f'Type mismatch in expression "{parent.text}": expected {"|".join(sorted(allowed))}, '
                f'got {choose(self.types(node))} in "{node.text}"'
            )
        return types

    def _unify(self, parent: Expr, allowed: frozenset[str], *nodes: Expr) -> frozenset[str]:
        types = allowed
        for node in nodes:
            types &= self.types(node)
        if not types:
            raise _type_mismatch(parent, *(self.types(node) for node in nodes))
        return types

    def _infer(self, node: Expr) -> frozenset[str]:
        match node:
            case Literal():
                return _literal_types(node)
            case Tuple():
                raise QuerySyntaxError(
                    f'Tuple "{node.text}" can only be compared or used with IN and BETWEEN'
                )
            case Unary(op="not"):
                self.expect(node.operand, _BOOLEAN_ONLY, node)
                return _BOOLEAN_ONLY
            case Unary():
                return self.expect(node.operand, _NUMERIC, node)
            case Logical(operands=operands):
                for operand in operands:
                    self.expect(operand, _BOOLEAN_ONLY, node)
                return _BOOLEAN_ONLY
            case Binary(op=op) if op in _COMPARISONS:
                self._comparison_types(node, items(node.left), items(node.right))
                return _BOOLEAN_ONLY
            case Binary(op="%"):
                return self._unify(node, _INTEGRAL, node.left, node.right)
            case Binary(op="||"):
                return self._unify(node, _STRING_ONLY, node.left, node.right)
            case Binary():
                return self._unify(node, _NUMERIC, node.left, node.right)
            case In():
                self._in_types(node)
                return _BOOLEAN_ONLY
            case Between():
                self._between_types(node)
                return _BOOLEAN_ONLY
            case Call():
                return self._call_types(node)
        raise AssertionError(f"unresolved node {node!r}")

    def _comparison_types(
        self, parent: Expr, lefts: tuple[Expr, ...], rights: tuple[Expr, ...]
    ) -> list[str]:
        if len(lefts) != len(rights):
            raise QuerySyntaxError(f'Tuple size mismatch in expression "{parent.text}"')
        return [
            choose(self._unify(parent, ALL_TYPES, left, right))
            for left, right in zip(lefts, rights, strict=True)
        ]

    def _in_types(self, node: In) -> list[str]:
        lefts = items(node.operand)
        chosen = []
        for position, left in enumerate(lefts):
            types = self.types(left)
            for row in node.rows:
                if len(row) != len(lefts):
                    raise QuerySyntaxError(f'Tuple size mismatch in expression "{node.text}"')
                types &= _literal_types(row[position])
                if not types:
                    raise _type_mismatch(node, self.types(left), _literal_types(row[position]))
            chosen.append(choose(types))
        return chosen

    def _between_types(self, node: Between) -> None:
        lefts = items(node.operand)
        for bound in (node.lower, node.upper):
            if len(bound) > len(lefts):
                raise QuerySyntaxError(f'Tuple size mismatch in expression "{node.text}"')
            self._comparison_types(node, lefts[: len(bound)], bound)

    def _call_types(self, node: Call) -> frozenset[str]:
        function = _FUNCTIONS.get(node.name)
        if function is None:
            raise QuerySyntaxError(f'Unknown function "{node.name}"')
        if node.star or len(node.args) != len(function.arguments):
            raise QuerySyntaxError(
                f'Wrong number of arguments to function "{node.name}": expected {len(function.arguments)}'
                f", got {'*' if node.star else len(node.args)}"
            )
        for argument, allowed in zip(node.args, function.arguments, strict=True):
            self.expect(argument, allowed, node)
        if function.result is not None:
            return frozenset({function.result})
        if node.name == "if":
            return self._unify(node, ALL_TYPES, node.args[1], node.args[2])
        return self.expect(node.args[0], function.arguments[0], node)

    # SQL --------------------------------------------------------------------------------------

    def emit(self, node: Expr, t: str, predicate: bool = False) -> sa.ColumnElement[Any]:
        leaf = self.leaf(node)
        if leaf is not None:
            return leaf.sql
        match node:
            case Literal():
                return _bind(node, t, None)
            case Unary(op="not"):
                return sa.not_(self.emit(node.operand, BOOLEAN))
            case Unary(op="-"):
                return -self.emit(node.operand, t)
            case Unary():
                return self.emit(node.operand, t)
            case Logical(op=op, operands=operands):
                combine = sa.and_ if op == "and" else sa.or_
                return combine(*(self.emit(operand, BOOLEAN, predicate) for operand in operands))
            case Binary(op=op) if op in _COMPARISONS:
                return self._compare(op, items(node.left), items(node.right), node, predicate)
            case Binary(op=op):
                left, right = self.emit(node.left, t), self.emit(node.right, t)
                return left.op(op, return_type=SA_TYPES[t])(right)
            case In():
                return self._emit_in(node, predicate and not node.negated)
            case Between():
                return self._emit_between(node, predicate and not node.negated)
            case Call():
                return self._emit_call(node, t)
        raise AssertionError(f"unresolved node {node!r}")

    def _compare(
        self, op: str, lefts: tuple[Expr, ...], rights: tuple[Expr, ...], parent: Expr, predicate: bool
    ) -> sa.ColumnElement[bool]:
        """Compare tuples lexicographically (a scalar is a one-element tuple)."""
        types = self._comparison_types(parent, lefts, rights)
        pairs = list(zip(lefts, rights, types, strict=True))
        if op == "=":
            return sa.and_(*(self._compare_scalar("=", *pair, predicate) for pair in pairs))
        if op == "!=":
            return sa.or_(*(self._compare_scalar("!=", *pair, predicate) for pair in pairs))
        strict = "<" if op in ("<", "<=") else ">"
        result = self._compare_scalar(op, *pairs[-1], predicate)
        for pair in reversed(pairs[:-1]):
            result = sa.or_(
                self._compare_scalar(strict, *pair, predicate),
                sa.and_(self._compare_scalar("=", *pair, predicate), result),
            )
        return result

    def _compare_scalar(
        self, op: str, left: Expr, right: Expr, t: str, predicate: bool
    ) -> sa.ColumnElement[bool]:
        """One comparison with YT's NULL semantics (NULL equals NULL and is less than anything)."""
        if isinstance(left, Literal) and (not isinstance(right, Literal) or left.value is None):
            left, right, op = right, left, _FLIPPED[op]  # literal (and above all NULL) to the right
        if isinstance(right, Literal) and right.value is None:
            if isinstance(left, Literal):
                both_null = left.value is None
                return _constant(op in ("=", "<=", ">=") if both_null else op in ("!=", ">", ">="))
            against_null = _AGAINST_NULL[op]
            if isinstance(against_null, bool):
                return _constant(against_null)
            return against_null(self.emit(left, t))
        left_sql = self.emit(left, t)
        if isinstance(right, Literal):
            bind_type = None if isinstance(left_sql.type, NullType) else left_sql.type
            right_sql: sa.ColumnElement[Any] = _bind(right, t, bind_type)
        else:
            right_sql = self.emit(right, t)
        plain = _COMPARISONS[op](left_sql, right_sql)
        if _non_null_literal(left) and _non_null_literal(right):
            return plain
        if _non_null_literal(right):  # only the left side may be NULL
            if op in ("=", ">", ">="):  # false when it is
                return plain if predicate else sa.and_(plain, left_sql.is_not(None))
            return sa.or_(plain, left_sql.is_(None))  # true when it is
        match op:
            case "=":
                return left_sql.is_not_distinct_from(right_sql)
            case "!=":
                return left_sql.is_distinct_from(right_sql)
            case "<":
                fallback = sa.and_(left_sql.is_(None), right_sql.is_not(None))
            case "<=":
                fallback = left_sql.is_(None)
            case ">":
                fallback = sa.and_(right_sql.is_(None), left_sql.is_not(None))
            case _:
                fallback = right_sql.is_(None)
        return sa.func.coalesce(plain, fallback)

    def _emit_in(self, node: In, predicate: bool) -> sa.ColumnElement[bool]:
        lefts = items(node.operand)
        types = self._in_types(node)
        if any(value.value is None for row in node.rows for value in row):
            result = sa.or_(
                *(
                    sa.and_(
                        *(
                            self._compare_scalar("=", *item, predicate)
                            for item in zip(lefts, row, types, strict=True)
                        )
                    )
                    for row in node.rows
                )
            )
        else:
            sqls = [self.emit(left, t) for left, t in zip(lefts, types, strict=True)]
            rows = [
                tuple(_python_value(value, t) for value, t in zip(row, types, strict=True))
                for row in node.rows
            ]
            if len(sqls) == 1:
                result = sqls[0].in_([row[0] for row in rows])
            else:
                result = self._tuple_in(sqls, rows)
            guards = [
                sql.is_not(None) for sql, left in zip(sqls, lefts, strict=True) if not _non_null_literal(left)
            ]
            if guards and not predicate:
                result = sa.and_(result, *guards)
        return sa.not_(result) if node.negated else result

    def _tuple_in(self, sqls: list[sa.ColumnElement[Any]], rows: list[tuple[Any, ...]]) -> sa.ColumnElement[bool]:
        """``(a, b) IN ((?, ?), ...)`` (no NULL listed), in a form the database can search an index for.

        SQLite (3.40) answers a row-value IN list by reading the whole table, even where the tuple is
        the table's key. Where the tuple holds the column an index search starts from
        (:meth:`searched_column`), a short list becomes ``(a = ? AND b = ?) OR ...``, one index search
        a term (SQLite nests an OR's terms one level deeper each, up to a depth of 1,000); a longer
        one is preceded by ``a IN (...)`` over the distinct values of that column (an ``IN`` on every
        column would search their cross product, a million searches for 1,000 tuples of distinct
        values). Both mean what the row-value list means (a tuple's equality is its members' ``AND``,
        ``IN`` an ``OR`` of equalities), NULLs included. Any other tuple keeps the row-value list:
        over a scan, SQLite looks each row up in the list instead of testing every term."""
        lead = self.searched_column()
        at = next((i for i, sql in enumerate(sqls) if sql is lead), None) if lead is not None else None
        if at is None:
            return sa.tuple_(*sqls).in_(rows)
        if len(rows) <= OR_TERMS:
            return sa.or_(*(sa.and_(*(sql == value for sql, value in zip(sqls, row, strict=True))) for row in rows))
        firsts = list(dict.fromkeys(row[at] for row in rows))
        return sa.and_(sqls[at].in_(firsts), sa.tuple_(*sqls).in_(rows))

    def searched_column(self) -> sa.ColumnElement[Any] | None:
        """The SQL column an index search of the rows starts from (the first key column), if any."""
        return None

    def _emit_between(self, node: Between, predicate: bool) -> sa.ColumnElement[bool]:
        lefts = items(node.operand)
        result = sa.and_(
            self._compare(">=", lefts[: len(node.lower)], node.lower, node, predicate),
            self._compare("<=", lefts[: len(node.upper)], node.upper, node, predicate),
        )
        return sa.not_(result) if node.negated else result

    def _emit_call(self, node: Call, t: str) -> sa.ColumnElement[Any]:
        args = node.args
        match node.name:
            case "is_null":
                return self.emit(args[0], choose(self.types(args[0]))).is_(None)
            case "if":
                condition = self.emit(args[0], BOOLEAN, predicate=True)
                return sa.case((condition, self.emit(args[1], t)), else_=self.emit(args[2], t))
            case "lower" | "upper":
                return sa.type_coerce(getattr(sa.func, node.name)(self.emit(args[0], _STRING)), sa.String())
            case "length":
                return sa.type_coerce(sa.func.length(self.emit(args[0], _STRING)), sa.BigInteger())
            case "abs":
                return sa.func.abs(self.emit(args[0], t))
            case "concat":
                return self.emit(args[0], _STRING).op("||", return_type=sa.String())(
                    self.emit(args[1], _STRING)
                )
        source_type = choose(self.types(args[0]) & _FUNCTIONS[node.name].arguments[0])
        sql = self.emit(args[0], source_type)
        if source_type == t or (t in _INTEGRAL and source_type in _INTEGRAL):
            return sql
        if t == DOUBLE:
            return sa.cast(sql, sa.Float())
        if t == _STRING:
            return sa.cast(sql, sa.String())
        return _truncate(sql)


def _constant(value: bool) -> sa.ColumnElement[bool]:
    return sa.true() if value else sa.false()


def _python_value(literal: Literal, t: str) -> Any:
    """The literal's value as the database should get it: an integer literal typed double is a float."""
    if t == DOUBLE and isinstance(literal.value, int):
        return float(literal.value)
    return literal.value


def _bind(literal: Literal, t: str, bind_type: TypeEngine[Any] | None) -> sa.ColumnElement[Any]:
    """A literal as a bound parameter, typed like the column it is compared with when there is one."""
    if literal.value is None:
        return sa.type_coerce(sa.null(), SA_TYPES[t])
    return sa.literal(_python_value(literal, t), bind_type if bind_type is not None else SA_TYPES[t])


def _truncate(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """double -> int64 rounding towards zero: CAST truncates on SQLite but rounds on PostgreSQL."""
    rounded = sa.cast(value, sa.BigInteger())
    correction = sa.case(
        (sa.and_(value > 0, rounded > value), 1),
        (sa.and_(value < 0, rounded < value), -1),
        else_=0,
    )
    return rounded.op("-", return_type=sa.BigInteger())(correction)
