"""The syntax tree of a YT QL query: immutable node classes and the walks over them.

Why this module exists: the tree is the contract between the two halves of the package. The parser
(:mod:`.parser`) builds it from lark's parse tree and the compiler (:mod:`.compiler`) binds it to a
table; this module depends on neither lark nor SQLAlchemy, so both import it and not each other.
Names keep their leading underscore: they are private to the package, not part of its API.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import QuerySyntaxError

# ---------------------------------------------------------------------------------------------------
# AST. Nodes compare structurally (``span`` is excluded), which is how an expression of the projection
# is recognised as a GROUP BY key. ``text`` is the whitespace-normalised source, used in messages and
# as the name of an unaliased output column; it is computed on demand, because normalising the text of
# every node while parsing costs time quadratic in the length of a long ``a OR b OR ...`` chain.


@dataclass(frozen=True)
class _Span:
    query: str
    start: int
    end: int

    @property
    def text(self) -> str:
        return _normalize_whitespace(self.query[self.start : self.end])


class _Node:
    span: _Span

    @property
    def text(self) -> str:
        return self.span.text


@dataclass(frozen=True)
class Literal(_Node):
    value: int | float | str | bool | None
    kind: str  # "int", "uint", "double", "string", "boolean" or "null"
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Reference(_Node):
    """A name as written: a column or an alias; replaced by :class:`_Column` at compile time.

    ``qualifier`` is the table alias of a qualified reference (``a.k``), None for a bare name.
    """

    name: str
    span: _Span = field(compare=False)
    qualifier: str | None = None

    @property
    def written(self) -> str:
        """The reference as the user wrote it, without quoting: ``k`` or ``a.k``."""
        return self.name if self.qualifier is None else f"{self.qualifier}.{self.name}"


@dataclass(frozen=True)
class _Column(_Node):
    name: str
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Tuple(_Node):
    items: tuple[Expr, ...]
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Unary(_Node):
    op: str  # "-", "+" or "not"
    operand: Expr
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Binary(_Node):
    op: str  # a comparison, "+", "-", "*", "/", "%" or "||"
    left: Expr
    right: Expr
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Logical(_Node):
    """``a AND b AND ...`` or ``a OR b OR ...``, n-ary so that long generated chains stay shallow."""

    op: str  # "and" or "or"
    operands: tuple[Expr, ...]
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class In(_Node):
    operand: Expr
    rows: tuple[tuple[Literal, ...], ...]
    negated: bool
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Between(_Node):
    operand: Expr
    lower: tuple[Literal, ...]
    upper: tuple[Literal, ...]
    negated: bool
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class Call(_Node):
    name: str  # lower case: function names are case-insensitive
    args: tuple[Expr, ...]
    star: bool  # ``count(*)``
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Alias(_Node):
    expr: Expr
    name: str
    span: _Span = field(compare=False)


Expr = (
    Literal | _Reference | _Column | Tuple | Unary | Binary | Logical | In | Between | Call | _Alias
)


@dataclass(frozen=True)
class _SelectItem:
    expr: Expr
    name: str


@dataclass(frozen=True)
class _OrderItem:
    expr: Expr
    descending: bool


@dataclass(frozen=True)
class _TableRef:
    """A table of the FROM or a JOIN clause: its path, optional alias and where the path is written
    (``span``, so that a query can be redirected to other tables by rewriting exactly those tokens)."""

    path: str
    alias: str | None
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Join:
    """``[LEFT] JOIN table ON condition`` or ``[LEFT] JOIN table USING columns``."""

    table: _TableRef
    left: bool
    on: Expr | None  # None for USING
    using: tuple[str, ...]
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class ParsedQuery:
    """A parsed query: the table path and the AST of each clause (not yet bound to a schema)."""

    table_path: str
    text: str
    projection: tuple[_SelectItem, ...] | None  # None stands for ``*``
    where: Expr | None
    group_by: tuple[Expr, ...]
    having: Expr | None
    order_by: tuple[_OrderItem, ...]
    offset: int | None
    limit: int | None
    aliases: tuple[tuple[str, Expr], ...]  # every ``expr AS name`` of the query, by name
    table: _TableRef | None = None  # the FROM table with its alias (``table_path`` is its path)
    joins: tuple[_Join, ...] = ()

    @property
    def tables(self) -> tuple[_TableRef, ...]:
        """Every table the query reads, FROM first, then each JOIN's in order (a path may repeat)."""
        first = self.table or _TableRef(self.table_path, None, _Span(self.text, 0, 0))
        return (first, *(join.table for join in self.joins))

    @property
    def table_paths(self) -> tuple[str, ...]:
        return tuple(table.path for table in self.tables)


def _children(node: Expr) -> tuple[Expr, ...]:
    match node:
        case Tuple(items=items) | Logical(operands=items):
            return items
        case Unary(operand=operand) | In(operand=operand) | Between(operand=operand):
            return (operand,)
        case Binary(left=left, right=right):
            return (left, right)
        case Call(args=args):
            return args
        case _Alias(expr=expr):
            return (expr,)
    return ()


def _walk(node: Expr) -> Iterator[Expr]:
    """``node``, its descendants and the literals of its IN lists and BETWEEN bounds."""
    yield node
    match node:
        case In(rows=rows):
            yield from (value for row in rows for value in row)
        case Between(lower=lower, upper=upper):
            yield from lower + upper
    for child in _children(node):
        yield from _walk(child)


def items(node: Expr) -> tuple[Expr, ...]:
    """The components of a tuple, or the expression itself as a one-element tuple."""
    return node.items if isinstance(node, Tuple) else (node,)


# Whitespace is normalised by ``_Span.text``. The pattern is compiled once at import, read-only after.
# Whitespace outside quoted tokens collapses to one space: ``sum( v )`` is named ``sum( v )``, but
# ``a  +\n b`` becomes ``a + b`` while ``'x  y'`` keeps its two spaces.
_WHITESPACE_OUTSIDE_QUOTES = re.compile(
    r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\[[^\]]*\])|\s+", re.S
)


def _normalize_whitespace(text: str) -> str:
    return _WHITESPACE_OUTSIDE_QUOTES.sub(lambda m: m.group(1) or " ", text).strip()


# The parser and the tree builder are iterative, but the walks over the tree (here and in the compiler)
# are recursive: parse_query and compile_query turn a RecursionError into this error.
def _too_deep(text: str) -> QuerySyntaxError:
    return QuerySyntaxError("Query is too deeply nested", attributes={"query": text})
