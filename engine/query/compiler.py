"""YT QL (the language of ``select_rows``) parsed with lark and compiled into SQLAlchemy Core.

Why this module exists: clients of a YTsaurus dynamic table filter, group and sort on the server by
sending a query string such as ``k, sum(v) AS s FROM [//t] WHERE k > 3 GROUP BY k``. reptables
keeps rows in an SQL database, so the query is translated into one ``SELECT`` that the database
runs; nothing is evaluated in Python. The translation is split in two steps:

* :func:`parse_query` needs only the text. It builds a small AST and rejects what is wrong whatever
  the table (syntax, ``ORDER BY`` without ``LIMIT``, a reused alias) with :class:`QuerySyntaxError`,
  whose message gives the line:column, what was found and what was expected.
* :func:`compile_query` binds the AST to a :class:`QuerySource` (the table's columns, their YT
  types and the SQL expressions that hold them) and returns a ``Select``.

The tricky parts, and how they are handled:

* **Aliases are global, as in YT (and ClickHouse).** ``expr AS name`` anywhere in the query defines
  ``name`` for every clause: ``k % 2 AS p ... WHERE p = 1 GROUP BY p`` is valid, and an alias hides
  a column of the same name everywhere except inside its own definition (``k / 2 AS k``).
* **Strict typing.** YT QL is statically typed: arithmetic needs numbers of one type, comparisons
  need operands of one type, ``WHERE`` needs a boolean. Every expression gets the set of YT types it
  may take; an untyped integer literal fits ``int64``, ``uint64`` or ``double`` (so ``v > 1`` works
  on a double column), and the sets of operands are intersected. An empty intersection is a type
  error, as in YT, instead of whatever the database would have done.
* **NULL is an ordinary value in comparisons.** In YT a comparison is never NULL: ``NULL = NULL``
  is true and NULL sorts before every other value, so ``v < 10`` matches rows where ``v`` is NULL.
  SQL's three-valued logic differs, so comparisons are rewritten. Where the result only decides
  whether a row passes (``WHERE``/``HAVING``, under ``AND``/``OR``) an SQL NULL may stand for
  false, which keeps ``k = 5`` a plain, index-friendly ``k = 5``; anywhere else (under ``NOT``, in
  the projection) the compiled form is two-valued. ``ORDER BY`` says ``NULLS FIRST``/``NULLS LAST``
  explicitly because SQLite and PostgreSQL disagree on the default.
* **Integer division truncates** (C semantics, as in YT): ``int / int`` is emitted as a plain SQL
  ``/`` on integer operands, which truncates towards zero on SQLite and PostgreSQL alike; SQL
  ``%`` also takes the sign of the dividend, as C's does. ``double(x)`` makes a division exact.
* **Grouping is compiled as two nested SELECTs.** The inner one reads the table, applies ``WHERE``
  and computes every group key and every aggregate argument as a named column; the outer one groups
  by those columns. The outer query then only refers to plain columns, so no expression (and no
  bound parameter) has to be repeated verbatim in ``GROUP BY``, and a constant key such as YT's
  ``GROUP BY 1`` cannot be mistaken for a column position.
* The SQL is dialect-neutral (it runs on SQLite and PostgreSQL): row values are used only for
  ``(a, b) IN (...)``; tuple comparisons are expanded lexicographically; ``int64(double)`` rounds
  towards zero on both, although ``CAST`` alone truncates on SQLite but rounds on PostgreSQL.

As in YT, ``IN`` and ``BETWEEN`` take constants only, ``OFFSET`` comes before ``LIMIT`` and needs
it, and keywords are reserved. Deviations from YT QL, by choice: aggregates without ``GROUP BY``
aggregate the whole table into one row, even an empty table (YT requires ``GROUP BY``); ``NOT IN``,
``NOT BETWEEN``, ``count``, ``upper`` and ``string(x)`` of a number (formatted by the database) are
accepted; ``HAVING`` needs no ``GROUP BY`` and may be used with ``LIMIT``. Division by zero gives
NULL on SQLite and an error on PostgreSQL (an error in YT); ``length`` counts characters where the
database stores text; uint64 values beyond 2**63 - 1 are not representable in SQLite. Not supported:
joins, ``WITH TOTALS``, ``LIKE``, ``CASE``, ``transform``, bitwise operators and other YT functions.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import sqlalchemy as sa
from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta
from sqlalchemy.types import NullType, TypeEngine

from ..errors import ErrorCode, QuerySyntaxError, YtError

# ---------------------------------------------------------------------------------------------------
# Public API


@dataclass(frozen=True)
class QuerySource:
    """What a table path resolves to for the compiler.

    ``key_columns`` (optional) are the QL names of the sort key: a query without ``ORDER BY`` and
    without grouping returns its rows in key order, as YT does when it scans a sorted table.
    """

    from_clause: sa.FromClause
    columns: dict[str, sa.ColumnElement[Any]]
    column_types: dict[str, str]
    key_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParsedQuery:
    """A parsed query: the table path and the AST of each clause (not yet bound to a schema)."""

    table_path: str
    text: str
    projection: tuple[_SelectItem, ...] | None  # None stands for ``*``
    where: _Expr | None
    group_by: tuple[_Expr, ...]
    having: _Expr | None
    order_by: tuple[_OrderItem, ...]
    offset: int | None
    limit: int | None
    aliases: tuple[tuple[str, _Expr], ...]  # every ``expr AS name`` of the query, by name


@dataclass(frozen=True)
class CompiledQuery:
    """The SQL statement and how to name and type the columns of its result rows."""

    statement: sa.Select[Any]
    output_columns: list[str]
    output_types: dict[str, str]


def parse_query(text: str) -> ParsedQuery:
    """Parse a YT QL query; raise :class:`QuerySyntaxError` for anything malformed."""
    if not text.strip():
        raise QuerySyntaxError("Error while parsing query: the query is empty", attributes={"query": text})
    try:
        tree = _PARSER.parse(text)
        parsed: ParsedQuery = _AstBuilder(text).transform(tree)
        return replace(parsed, aliases=_validate(parsed))
    except UnexpectedInput as exc:
        raise _parse_error(text, exc) from None
    except VisitError as exc:  # lark wraps what the tree builder raises
        if isinstance(exc.orig_exc, YtError):
            raise exc.orig_exc from None
        raise
    except RecursionError:  # the parser and tree builder are iterative, the AST walks are not
        raise _too_deep(text) from None


def compile_query(parsed: ParsedQuery, source: QuerySource) -> CompiledQuery:
    """Bind a parsed query to a table and translate it into one SQLAlchemy ``Select``."""
    unknown = set(source.column_types.values()) - _ALL_TYPES
    if set(source.columns) != set(source.column_types) or unknown:
        raise ValueError(f"QuerySource columns and column_types disagree (unknown types: {unknown})")
    try:
        return _QueryCompiler(parsed, source).compile()
    except RecursionError:
        raise _too_deep(parsed.text) from None


# ---------------------------------------------------------------------------------------------------
# Types

_INT64, _UINT64, _DOUBLE, _BOOLEAN, _STRING, _ANY = "int64", "uint64", "double", "boolean", "string", "any"
_TYPE_PREFERENCE = (_INT64, _UINT64, _DOUBLE, _BOOLEAN, _STRING, _ANY)  # picked first when several fit
_ALL_TYPES = frozenset(_TYPE_PREFERENCE)
_NUMERIC = frozenset({_INT64, _UINT64, _DOUBLE})
_INTEGRAL = frozenset({_INT64, _UINT64})
_STRING_ONLY = frozenset({_STRING})
_BOOLEAN_ONLY = frozenset({_BOOLEAN})
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

_SA_TYPES: dict[str, TypeEngine[Any]] = {
    _INT64: sa.BigInteger(),
    _UINT64: sa.BigInteger(),
    _DOUBLE: sa.Float(),
    _BOOLEAN: sa.Boolean(),
    _STRING: sa.String(),
    _ANY: NullType(),
}


def _choose(types: frozenset[str]) -> str:
    return next(t for t in _TYPE_PREFERENCE if t in types)


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
class _Literal(_Node):
    value: int | float | str | bool | None
    kind: str  # "int", "uint", "double", "string", "boolean" or "null"
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Reference(_Node):
    """A name as written: a column or an alias; replaced by :class:`_Column` at compile time."""

    name: str
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Column(_Node):
    name: str
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Tuple(_Node):
    items: tuple[_Expr, ...]
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Unary(_Node):
    op: str  # "-", "+" or "not"
    operand: _Expr
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Binary(_Node):
    op: str  # a comparison, "+", "-", "*", "/", "%" or "||"
    left: _Expr
    right: _Expr
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Logical(_Node):
    """``a AND b AND ...`` or ``a OR b OR ...``, n-ary so that long generated chains stay shallow."""

    op: str  # "and" or "or"
    operands: tuple[_Expr, ...]
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _In(_Node):
    operand: _Expr
    rows: tuple[tuple[_Literal, ...], ...]
    negated: bool
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Between(_Node):
    operand: _Expr
    lower: tuple[_Literal, ...]
    upper: tuple[_Literal, ...]
    negated: bool
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Call(_Node):
    name: str  # lower case: function names are case-insensitive
    args: tuple[_Expr, ...]
    star: bool  # ``count(*)``
    span: _Span = field(compare=False)


@dataclass(frozen=True)
class _Alias(_Node):
    expr: _Expr
    name: str
    span: _Span = field(compare=False)


_Expr = (
    _Literal | _Reference | _Column | _Tuple | _Unary | _Binary | _Logical | _In | _Between | _Call | _Alias
)


@dataclass(frozen=True)
class _SelectItem:
    expr: _Expr
    name: str


@dataclass(frozen=True)
class _OrderItem:
    expr: _Expr
    descending: bool


def _children(node: _Expr) -> tuple[_Expr, ...]:
    match node:
        case _Tuple(items=items) | _Logical(operands=items):
            return items
        case _Unary(operand=operand) | _In(operand=operand) | _Between(operand=operand):
            return (operand,)
        case _Binary(left=left, right=right):
            return (left, right)
        case _Call(args=args):
            return args
        case _Alias(expr=expr):
            return (expr,)
    return ()


def _walk(node: _Expr) -> Iterator[_Expr]:
    """``node``, its descendants and the literals of its IN lists and BETWEEN bounds."""
    yield node
    match node:
        case _In(rows=rows):
            yield from (value for row in rows for value in row)
        case _Between(lower=lower, upper=upper):
            yield from lower + upper
    for child in _children(node):
        yield from _walk(child)


def _items(node: _Expr) -> tuple[_Expr, ...]:
    """The components of a tuple, or the expression itself as a one-element tuple."""
    return node.items if isinstance(node, _Tuple) else (node,)


# ---------------------------------------------------------------------------------------------------
# Grammar. Keywords are reserved (the basic lexer tries them before identifiers), as in YT, and are
# matched as whole words so that ``index`` or ``order_id`` stay identifiers. Precedence, loosest
# first: OR, AND, NOT, IS [NOT] NULL, = != <>, < <= > >= [NOT] IN [NOT] BETWEEN, + - ||, * / %, unary.

_GRAMMAR = r"""
start: _SELECT? projection _FROM table_path where? group_by? having? order_by? offset? limit?

projection: STAR                                       -> star_projection
          | expression (_COMMA expression)*            -> item_projection

table_path: BRACKETED | BACKQUOTED
where: _WHERE or_expr
group_by: _GROUP_BY expression (_COMMA expression)*
having: _HAVING or_expr
order_by: _ORDER_BY order_item (_COMMA order_item)*
order_item: expression (ASC | DESC)?
offset: _OFFSET INT
limit: _LIMIT INT

?expression: or_expr
           | or_expr _AS alias_name                    -> alias
alias_name: NAME | BRACKETED | BACKQUOTED

?or_expr: and_expr
        | or_expr _OR and_expr                         -> or_op
?and_expr: not_expr
         | and_expr _AND not_expr                      -> and_op
?not_expr: is_null_expr
         | _NOT not_expr                               -> not_op
?is_null_expr: eq_expr
             | eq_expr _IS _NULL                       -> is_null
             | eq_expr _IS _NOT _NULL                  -> is_not_null
?eq_expr: rel_expr
        | eq_expr (EQ | NE) rel_expr                   -> binary
?rel_expr: add_expr
         | rel_expr (LT | LE | GT | GE) add_expr       -> binary
         | add_expr _BETWEEN const_tuple _AND const_tuple          -> between
         | add_expr _NOT _BETWEEN const_tuple _AND const_tuple     -> not_between
         | add_expr _IN _LPAR const_tuple (_COMMA const_tuple)* _RPAR       -> in_list
         | add_expr _NOT _IN _LPAR const_tuple (_COMMA const_tuple)* _RPAR  -> not_in_list
?add_expr: mul_expr
         | add_expr (PLUS | MINUS | CONCAT) mul_expr   -> binary
?mul_expr: unary_expr
         | mul_expr (STAR | SLASH | PERCENT) unary_expr -> binary
?unary_expr: atom
           | (PLUS | MINUS) unary_expr                 -> unary
?atom: literal
     | reference
     | NAME _LPAR STAR _RPAR                           -> star_call
     | NAME _LPAR _RPAR                                -> call
     | NAME _LPAR expression (_COMMA expression)* _RPAR -> call
     | _LPAR expression (_COMMA expression)* _RPAR     -> parens

reference: NAME | DOLLAR_NAME | BRACKETED | BACKQUOTED

const_tuple: const_value
           | _LPAR const_value (_COMMA const_value)* _RPAR
const_value: (PLUS | MINUS)* literal

literal: INT      -> int_literal
       | UINT     -> uint_literal
       | FLOAT    -> float_literal
       | STRING   -> string_literal
       | TRUE     -> true_literal
       | FALSE    -> false_literal
       | _NULL    -> null_literal
       | HASH     -> null_literal

_SELECT.4: /select\b/i
_FROM.4: /from\b/i
_WHERE.4: /where\b/i
_GROUP_BY.4: /group\s+by\b/i
_HAVING.4: /having\b/i
_ORDER_BY.4: /order\s+by\b/i
_OFFSET.4: /offset\b/i
_LIMIT.4: /limit\b/i
ASC.4: /asc\b/i
DESC.4: /desc\b/i
_AS.4: /as\b/i
_AND.4: /and\b/i
_OR.4: /or\b/i
_NOT.4: /not\b/i
_IS.4: /is\b/i
_NULL.4: /null\b/i
_BETWEEN.4: /between\b/i
_IN.4: /in\b/i
TRUE.4: /%?true\b/i
FALSE.4: /%?false\b/i

FLOAT.3: /(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+/
UINT.2: /\d+u/
INT.1: /\d+/
STRING: /"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/s
NAME: /[A-Za-z_][A-Za-z0-9_]*/
DOLLAR_NAME: /\$[A-Za-z_][A-Za-z0-9_]*/
BRACKETED: /\[[^\]]*\]/
BACKQUOTED: /`(?:[^`\\]|\\.)*`/s

HASH: "#"
STAR: "*"
SLASH: "/"
PERCENT: "%"
PLUS: "+"
MINUS: "-"
CONCAT: "||"
EQ: "="
NE: "!=" | "<>"
LT: "<"
LE: "<="
GT: ">"
GE: ">="
_LPAR: "("
_RPAR: ")"
_COMMA: ","

_WS: /\s+/
%ignore _WS
"""

_PARSER = Lark(_GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True, maybe_placeholders=False)

_TERMINAL_NAMES = {
    "NAME": "identifier",
    "DOLLAR_NAME": "$-column",
    "BRACKETED": "[name]",
    "BACKQUOTED": "`name`",
    "INT": "integer",
    "UINT": "uint64 literal",
    "FLOAT": "double literal",
    "STRING": "string literal",
    "HASH": '"#"',
    "STAR": '"*"',
    "SLASH": '"/"',
    "PERCENT": '"%"',
    "PLUS": '"+"',
    "MINUS": '"-"',
    "CONCAT": '"||"',
    "EQ": '"="',
    "NE": '"!="',
    "LT": '"<"',
    "LE": '"<="',
    "GT": '">"',
    "GE": '">="',
    "_LPAR": '"("',
    "_RPAR": '")"',
    "_COMMA": '","',
    "$END": "end of query",
}


def _terminal_name(name: str) -> str:
    """``_GROUP_BY`` -> ``GROUP BY``; punctuation and value tokens get a readable name."""
    return _TERMINAL_NAMES.get(name, name.strip("_").replace("_", " "))


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


def _excerpt(text: str, position: int, radius: int = 40) -> str:
    start, end = max(0, position - radius), min(len(text), position + radius)
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")


def _error_at(text: str, position: int, problem: str, expected: list[str] | None = None) -> QuerySyntaxError:
    """``Error while parsing query: <problem> at <line>:<column>[, expected ...]; query: <excerpt>``."""
    line, column = _line_column(text, position)
    message = f"Error while parsing query: {problem} at {line}:{column}"
    if expected:
        message += ", expected " + (expected[0] if len(expected) == 1 else "one of: " + ", ".join(expected))
    attributes = {
        "query": text,
        "position": position,
        "line": line,
        "column": column,
        "expected": expected or [],
    }
    return QuerySyntaxError(f"{message}; query: {_excerpt(text, position)}", attributes=attributes)


def _parse_error(text: str, exc: UnexpectedInput) -> QuerySyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        return _error_at(text, exc.pos_in_stream, f'unexpected character "{text[exc.pos_in_stream]}"')
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        position, found = exc.token.start_pos or 0, f'"{exc.token.value}"'
    else:
        position, found = len(text), "end of query"
    # ``accepts`` replays the parser, so it drops the tokens that LALR's merged states only seem to allow.
    names = (
        (exc.accepts or exc.expected) if isinstance(exc, UnexpectedToken) else getattr(exc, "expected", ())
    )
    return _error_at(text, position, f"unexpected {found}", sorted({_terminal_name(n) for n in names}))


def _too_deep(text: str) -> QuerySyntaxError:
    return QuerySyntaxError("Query is too deeply nested", attributes={"query": text})


# Whitespace outside quoted tokens collapses to one space: ``sum( v )`` is named ``sum( v )``, but
# ``a  +\n b`` becomes ``a + b`` while ``'x  y'`` keeps its two spaces.
_WHITESPACE_OUTSIDE_QUOTES = re.compile(
    r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\[[^\]]*\])|\s+", re.S
)


def _normalize_whitespace(text: str) -> str:
    return _WHITESPACE_OUTSIDE_QUOTES.sub(lambda m: m.group(1) or " ", text).strip()


_SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{1,2})|([0-7]{1,3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.S)


def _unescape(body: str) -> str:
    """Undo C escapes (as YT's UnescapeC does); ``\\xHH`` and octal escapes give raw bytes, UTF-8."""

    def byte_of(match: re.Match[str]) -> bytes:
        hex_byte, octal, short, long_, other = match.groups()
        if hex_byte is not None:
            return bytes([int(hex_byte, 16)])
        if octal is not None:
            return bytes([int(octal, 8) & 0xFF])
        if short is not None or long_ is not None:
            return chr(int(short or long_, 16)).encode("utf-8", "surrogatepass")
        return bytes([_SIMPLE_ESCAPES[other]]) if other in _SIMPLE_ESCAPES else other.encode()

    raw, last = bytearray(), 0
    for match in _ESCAPE.finditer(body):
        raw += body[last : match.start()].encode() + byte_of(match)
        last = match.end()
    raw += body[last:].encode()
    return raw.decode("utf-8")


def _identifier(token: Token) -> str:
    """The name in a NAME, ``$name``, ``[name]`` or `` `name` `` token."""
    if token.type == "BRACKETED":
        return token.value[1:-1]
    if token.type == "BACKQUOTED":
        return _unescape(token.value[1:-1])
    return token.value


@v_args(meta=True)
class _AstBuilder(Transformer_NonRecursive[Token, Any]):
    """Turns lark's parse tree into the AST; raises QuerySyntaxError for malformed literals."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text

    def _span(self, meta: Meta) -> _Span:
        return _Span(self._text, meta.start_pos, meta.end_pos)

    # clauses ----------------------------------------------------------------------------------

    def start(self, meta: Meta, children: list[Any]) -> ParsedQuery:
        clauses: dict[str, Any] = dict(children)
        return ParsedQuery(
            table_path=clauses["path"],
            text=self._text,
            projection=clauses["projection"],
            where=clauses.get("where"),
            group_by=clauses.get("group_by", ()),
            having=clauses.get("having"),
            order_by=clauses.get("order_by", ()),
            offset=clauses.get("offset"),
            limit=clauses.get("limit"),
            aliases=(),
        )

    def star_projection(self, meta: Meta, children: list[Token]) -> tuple[str, None]:
        return "projection", None

    def item_projection(self, meta: Meta, children: list[_Expr]) -> tuple[str, tuple[_SelectItem, ...]]:
        return "projection", tuple(_SelectItem(expr, _output_name(expr)) for expr in children)

    def table_path(self, meta: Meta, children: list[Token]) -> tuple[str, str]:
        return "path", _identifier(children[0])

    def where(self, meta: Meta, children: list[_Expr]) -> tuple[str, _Expr]:
        return "where", children[0]

    def group_by(self, meta: Meta, children: list[_Expr]) -> tuple[str, tuple[_Expr, ...]]:
        return "group_by", tuple(children)

    def having(self, meta: Meta, children: list[_Expr]) -> tuple[str, _Expr]:
        return "having", children[0]

    def order_by(self, meta: Meta, children: list[_OrderItem]) -> tuple[str, tuple[_OrderItem, ...]]:
        return "order_by", tuple(children)

    def order_item(self, meta: Meta, children: list[Any]) -> _OrderItem:
        descending = len(children) == 2 and children[1].type == "DESC"
        return _OrderItem(children[0], descending)

    def offset(self, meta: Meta, children: list[Token]) -> tuple[str, int]:
        return "offset", self._count(children[0])

    def limit(self, meta: Meta, children: list[Token]) -> tuple[str, int]:
        return "limit", self._count(children[0])

    def _count(self, token: Token) -> int:
        value = int(token.value)
        if value > _INT64_MAX:
            raise _error_at(self._text, token.start_pos or 0, f"{token.value} is out of int64 range")
        return value

    # expressions ------------------------------------------------------------------------------

    def alias(self, meta: Meta, children: list[Any]) -> _Alias:
        return _Alias(children[0], children[1], self._span(meta))

    def alias_name(self, meta: Meta, children: list[Token]) -> str:
        return _identifier(children[0])

    def or_op(self, meta: Meta, children: list[_Expr]) -> _Logical:
        return self._logical("or", meta, *children)

    def and_op(self, meta: Meta, children: list[_Expr]) -> _Logical:
        return self._logical("and", meta, *children)

    def _logical(self, op: str, meta: Meta, left: _Expr, right: _Expr) -> _Logical:
        operands = left.operands if isinstance(left, _Logical) and left.op == op else (left,)
        return _Logical(op, (*operands, right), self._span(meta))

    def not_op(self, meta: Meta, children: list[_Expr]) -> _Unary:
        return _Unary("not", children[0], self._span(meta))

    def is_null(self, meta: Meta, children: list[_Expr]) -> _Call:
        return _Call("is_null", (children[0],), False, self._span(meta))

    def is_not_null(self, meta: Meta, children: list[_Expr]) -> _Unary:
        span = self._span(meta)
        return _Unary("not", _Call("is_null", (children[0],), False, span), span)

    def binary(self, meta: Meta, children: list[Any]) -> _Binary:
        left, op, right = children
        return _Binary("!=" if op.value == "<>" else op.value, left, right, self._span(meta))

    def between(self, meta: Meta, children: list[Any]) -> _Between:
        return _Between(children[0], children[1], children[2], False, self._span(meta))

    def not_between(self, meta: Meta, children: list[Any]) -> _Between:
        return _Between(children[0], children[1], children[2], True, self._span(meta))

    def in_list(self, meta: Meta, children: list[Any]) -> _In:
        return _In(children[0], tuple(children[1:]), False, self._span(meta))

    def not_in_list(self, meta: Meta, children: list[Any]) -> _In:
        return _In(children[0], tuple(children[1:]), True, self._span(meta))

    def unary(self, meta: Meta, children: list[Any]) -> _Expr:
        sign, operand = children
        span = self._span(meta)
        if isinstance(operand, _Literal) and operand.kind in ("int", "uint", "double"):
            return _signed(sign.value, operand, span)
        return _Unary(sign.value, operand, span)

    def star_call(self, meta: Meta, children: list[Token]) -> _Call:
        return _Call(children[0].value.lower(), (), True, self._span(meta))

    def call(self, meta: Meta, children: list[Any]) -> _Call:
        return _Call(children[0].value.lower(), tuple(children[1:]), False, self._span(meta))

    def parens(self, meta: Meta, children: list[_Expr]) -> _Expr:
        return children[0] if len(children) == 1 else _Tuple(tuple(children), self._span(meta))

    def reference(self, meta: Meta, children: list[Token]) -> _Reference:
        return _Reference(_identifier(children[0]), self._span(meta))

    def const_tuple(self, meta: Meta, children: list[_Literal]) -> tuple[_Literal, ...]:
        return tuple(children)

    def const_value(self, meta: Meta, children: list[Any]) -> _Literal:
        *signs, value = children
        if signs and value.kind not in ("int", "uint", "double"):
            raise _error_at(self._text, meta.start_pos, f"a sign cannot be applied to {value.text}")
        for sign in reversed(signs):
            value = _signed(sign.value, value, self._span(meta))
        return value

    # literals ---------------------------------------------------------------------------------

    def int_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(int(children[0].value), "int", self._span(meta))

    def uint_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(int(children[0].value[:-1]), "uint", self._span(meta))

    def float_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(float(children[0].value), "double", self._span(meta))

    def string_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        token = children[0]
        try:
            value = _unescape(token.value[1:-1])
        except UnicodeDecodeError:
            raise _error_at(self._text, token.start_pos or 0, "string literal is not valid UTF-8") from None
        return _Literal(value, "string", self._span(meta))

    def true_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(True, "boolean", self._span(meta))

    def false_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(False, "boolean", self._span(meta))

    def null_literal(self, meta: Meta, children: list[Token]) -> _Literal:
        return _Literal(None, "null", self._span(meta))


def _signed(sign: str, literal: _Literal, span: _Span) -> _Literal:
    """Fold a unary sign into a numeric literal; a negated uint64 wraps around, as in C (and YT)."""
    value = literal.value
    assert isinstance(value, int | float)
    if sign == "-":
        value = (-value) % (_UINT64_MAX + 1) if literal.kind == "uint" else -value
    return _Literal(value, literal.kind, span)


def _output_name(expr: _Expr) -> str:
    if isinstance(expr, _Alias | _Reference):
        return expr.name
    return expr.text


def _clause_expressions(parsed: ParsedQuery) -> Iterator[_Expr]:
    yield from (item.expr for item in parsed.projection or ())
    yield from (e for e in (parsed.where, parsed.having) if e is not None)
    yield from parsed.group_by
    yield from (item.expr for item in parsed.order_by)


def _validate(parsed: ParsedQuery) -> tuple[tuple[str, _Expr], ...]:
    """The checks that need no schema; returns the aliases of the query."""
    if parsed.order_by and parsed.limit is None:
        raise QuerySyntaxError("ORDER BY used without LIMIT", attributes={"query": parsed.text})
    if parsed.offset is not None and parsed.limit is None:
        raise QuerySyntaxError("OFFSET used without LIMIT", attributes={"query": parsed.text})
    aliases: dict[str, _Expr] = {}
    for node in (n for expr in _clause_expressions(parsed) for n in _walk(expr)):
        if isinstance(node, _Alias):
            if node.name in aliases:
                raise QuerySyntaxError(f'Alias "{node.name}" has been already used')
            aliases[node.name] = node.expr
        elif isinstance(node, _Literal) and isinstance(node.value, int) and node.kind in ("int", "uint"):
            low, high = (_INT64_MIN, _INT64_MAX) if node.kind == "int" else (0, _UINT64_MAX)
            if not low <= node.value <= high:
                raise QuerySyntaxError(
                    f"Integer literal {node.text} is out of {_INT64 if node.kind == 'int' else _UINT64} range"
                )
    return tuple(aliases.items())


# ---------------------------------------------------------------------------------------------------
# Compilation

_AGGREGATE_ARGUMENT_TYPES = {
    "count": _ALL_TYPES,
    "sum": _NUMERIC,
    "min": _ALL_TYPES - {_ANY},
    "max": _ALL_TYPES - {_ANY},
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
    "is_null": _Function((_ALL_TYPES,), _BOOLEAN),
    "if": _Function((_BOOLEAN_ONLY, _ALL_TYPES, _ALL_TYPES), None),
    "lower": _Function((_STRING_ONLY,), _STRING),
    "upper": _Function((_STRING_ONLY,), _STRING),
    "length": _Function((_STRING_ONLY,), _INT64),
    "abs": _Function((_NUMERIC,), None),
    "concat": _Function((_STRING_ONLY, _STRING_ONLY), _STRING),
    "int64": _Function((_NUMERIC,), _INT64),
    "uint64": _Function((_NUMERIC,), _UINT64),
    "double": _Function((_NUMERIC,), _DOUBLE),
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


def _is_aggregate(node: _Expr) -> TypeGuard[_Call]:
    return isinstance(node, _Call) and node.name in _AGGREGATE_ARGUMENT_TYPES


def _non_null_literal(node: _Expr) -> bool:
    return isinstance(node, _Literal) and node.value is not None


def _literal_types(literal: _Literal) -> frozenset[str]:
    match literal.kind:
        case "int":
            assert isinstance(literal.value, int)
            return _NUMERIC if literal.value >= 0 else frozenset({_INT64, _DOUBLE})
        case "uint":
            return frozenset({_UINT64})
        case "double":
            return frozenset({_DOUBLE})
        case "string":
            return _STRING_ONLY
        case "boolean":
            return _BOOLEAN_ONLY
    return _ALL_TYPES  # null fits every type


def _type_mismatch(parent: _Expr, *found: frozenset[str]) -> QuerySyntaxError:
    described = " and ".join(_choose(types) for types in found)
    return QuerySyntaxError(f'Type mismatch in expression "{parent.text}": {described}')


@dataclass(frozen=True)
class _Leaf:
    """An expression the scope already holds as SQL: a column, a group key or an aggregate."""

    sql: sa.ColumnElement[Any]
    yt_type: str


class _Scope(ABC):
    """Types and emits resolved expressions; a subclass decides which nodes are leaves.

    ``emit(node, t, predicate)`` produces SQL for ``node`` typed as the YT type ``t`` (one of the
    types the node may take). With ``predicate=True`` the caller only tests the result for truth, so
    an SQL NULL may stand for false; otherwise the SQL must be NULL exactly where YT's value is.
    """

    def __init__(self) -> None:
        self._types: dict[_Expr, frozenset[str]] = {}

    @abstractmethod
    def leaf(self, node: _Expr) -> _Leaf | None: ...

    # typing -----------------------------------------------------------------------------------

    def types(self, node: _Expr) -> frozenset[str]:
        if node not in self._types:
            leaf = self.leaf(node)
            self._types[node] = frozenset({leaf.yt_type}) if leaf is not None else self._infer(node)
        return self._types[node]

    def expect(self, node: _Expr, allowed: frozenset[str], parent: _Expr) -> frozenset[str]:
        types = self.types(node) & allowed
        if not types:
            raise QuerySyntaxError(
                f'Type mismatch in expression "{parent.text}": expected {"|".join(sorted(allowed))}, '
                f'got {_choose(self.types(node))} in "{node.text}"'
            )
        return types

    def _unify(self, parent: _Expr, allowed: frozenset[str], *nodes: _Expr) -> frozenset[str]:
        types = allowed
        for node in nodes:
            types &= self.types(node)
        if not types:
            raise _type_mismatch(parent, *(self.types(node) for node in nodes))
        return types

    def _infer(self, node: _Expr) -> frozenset[str]:
        match node:
            case _Literal():
                return _literal_types(node)
            case _Tuple():
                raise QuerySyntaxError(
                    f'Tuple "{node.text}" can only be compared or used with IN and BETWEEN'
                )
            case _Unary(op="not"):
                self.expect(node.operand, _BOOLEAN_ONLY, node)
                return _BOOLEAN_ONLY
            case _Unary():
                return self.expect(node.operand, _NUMERIC, node)
            case _Logical(operands=operands):
                for operand in operands:
                    self.expect(operand, _BOOLEAN_ONLY, node)
                return _BOOLEAN_ONLY
            case _Binary(op=op) if op in _COMPARISONS:
                self._comparison_types(node, _items(node.left), _items(node.right))
                return _BOOLEAN_ONLY
            case _Binary(op="%"):
                return self._unify(node, _INTEGRAL, node.left, node.right)
            case _Binary(op="||"):
                return self._unify(node, _STRING_ONLY, node.left, node.right)
            case _Binary():
                return self._unify(node, _NUMERIC, node.left, node.right)
            case _In():
                self._in_types(node)
                return _BOOLEAN_ONLY
            case _Between():
                self._between_types(node)
                return _BOOLEAN_ONLY
            case _Call():
                return self._call_types(node)
        raise AssertionError(f"unresolved node {node!r}")

    def _comparison_types(
        self, parent: _Expr, lefts: tuple[_Expr, ...], rights: tuple[_Expr, ...]
    ) -> list[str]:
        if len(lefts) != len(rights):
            raise QuerySyntaxError(f'Tuple size mismatch in expression "{parent.text}"')
        return [
            _choose(self._unify(parent, _ALL_TYPES, left, right))
            for left, right in zip(lefts, rights, strict=True)
        ]

    def _in_types(self, node: _In) -> list[str]:
        lefts = _items(node.operand)
        chosen = []
        for position, left in enumerate(lefts):
            types = self.types(left)
            for row in node.rows:
                if len(row) != len(lefts):
                    raise QuerySyntaxError(f'Tuple size mismatch in expression "{node.text}"')
                types &= _literal_types(row[position])
                if not types:
                    raise _type_mismatch(node, self.types(left), _literal_types(row[position]))
            chosen.append(_choose(types))
        return chosen

    def _between_types(self, node: _Between) -> None:
        lefts = _items(node.operand)
        for bound in (node.lower, node.upper):
            if len(bound) > len(lefts):
                raise QuerySyntaxError(f'Tuple size mismatch in expression "{node.text}"')
            self._comparison_types(node, lefts[: len(bound)], bound)

    def _call_types(self, node: _Call) -> frozenset[str]:
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
            return self._unify(node, _ALL_TYPES, node.args[1], node.args[2])
        return self.expect(node.args[0], function.arguments[0], node)

    # SQL --------------------------------------------------------------------------------------

    def emit(self, node: _Expr, t: str, predicate: bool = False) -> sa.ColumnElement[Any]:
        leaf = self.leaf(node)
        if leaf is not None:
            return leaf.sql
        match node:
            case _Literal():
                return _bind(node, t, None)
            case _Unary(op="not"):
                return sa.not_(self.emit(node.operand, _BOOLEAN))
            case _Unary(op="-"):
                return -self.emit(node.operand, t)
            case _Unary():
                return self.emit(node.operand, t)
            case _Logical(op=op, operands=operands):
                combine = sa.and_ if op == "and" else sa.or_
                return combine(*(self.emit(operand, _BOOLEAN, predicate) for operand in operands))
            case _Binary(op=op) if op in _COMPARISONS:
                return self._compare(op, _items(node.left), _items(node.right), node, predicate)
            case _Binary(op=op):
                left, right = self.emit(node.left, t), self.emit(node.right, t)
                return left.op(op, return_type=_SA_TYPES[t])(right)
            case _In():
                return self._emit_in(node, predicate and not node.negated)
            case _Between():
                return self._emit_between(node, predicate and not node.negated)
            case _Call():
                return self._emit_call(node, t)
        raise AssertionError(f"unresolved node {node!r}")

    def _compare(
        self, op: str, lefts: tuple[_Expr, ...], rights: tuple[_Expr, ...], parent: _Expr, predicate: bool
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
        self, op: str, left: _Expr, right: _Expr, t: str, predicate: bool
    ) -> sa.ColumnElement[bool]:
        """One comparison with YT's NULL semantics (NULL equals NULL and is less than anything)."""
        if isinstance(left, _Literal) and (not isinstance(right, _Literal) or left.value is None):
            left, right, op = right, left, _FLIPPED[op]  # literal (and above all NULL) to the right
        if isinstance(right, _Literal) and right.value is None:
            if isinstance(left, _Literal):
                both_null = left.value is None
                return _constant(op in ("=", "<=", ">=") if both_null else op in ("!=", ">", ">="))
            against_null = _AGAINST_NULL[op]
            if isinstance(against_null, bool):
                return _constant(against_null)
            return against_null(self.emit(left, t))
        left_sql = self.emit(left, t)
        if isinstance(right, _Literal):
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

    def _emit_in(self, node: _In, predicate: bool) -> sa.ColumnElement[bool]:
        lefts = _items(node.operand)
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
                result = sa.tuple_(*sqls).in_(rows)
            guards = [
                sql.is_not(None) for sql, left in zip(sqls, lefts, strict=True) if not _non_null_literal(left)
            ]
            if guards and not predicate:
                result = sa.and_(result, *guards)
        return sa.not_(result) if node.negated else result

    def _emit_between(self, node: _Between, predicate: bool) -> sa.ColumnElement[bool]:
        lefts = _items(node.operand)
        result = sa.and_(
            self._compare(">=", lefts[: len(node.lower)], node.lower, node, predicate),
            self._compare("<=", lefts[: len(node.upper)], node.upper, node, predicate),
        )
        return sa.not_(result) if node.negated else result

    def _emit_call(self, node: _Call, t: str) -> sa.ColumnElement[Any]:
        args = node.args
        match node.name:
            case "is_null":
                return self.emit(args[0], _choose(self.types(args[0]))).is_(None)
            case "if":
                condition = self.emit(args[0], _BOOLEAN, predicate=True)
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
        source_type = _choose(self.types(args[0]) & _FUNCTIONS[node.name].arguments[0])
        sql = self.emit(args[0], source_type)
        if source_type == t or (t in _INTEGRAL and source_type in _INTEGRAL):
            return sql
        if t == _DOUBLE:
            return sa.cast(sql, sa.Float())
        if t == _STRING:
            return sa.cast(sql, sa.String())
        return _truncate(sql)


def _constant(value: bool) -> sa.ColumnElement[bool]:
    return sa.true() if value else sa.false()


def _python_value(literal: _Literal, t: str) -> Any:
    """The literal's value as the database should get it: an integer literal typed double is a float."""
    if t == _DOUBLE and isinstance(literal.value, int):
        return float(literal.value)
    return literal.value


def _bind(literal: _Literal, t: str, bind_type: TypeEngine[Any] | None) -> sa.ColumnElement[Any]:
    """A literal as a bound parameter, typed like the column it is compared with when there is one."""
    if literal.value is None:
        return sa.type_coerce(sa.null(), _SA_TYPES[t])
    return sa.literal(_python_value(literal, t), bind_type if bind_type is not None else _SA_TYPES[t])


def _truncate(value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """double -> int64 rounding towards zero: CAST truncates on SQLite but rounds on PostgreSQL."""
    rounded = sa.cast(value, sa.BigInteger())
    correction = sa.case(
        (sa.and_(value > 0, rounded > value), 1),
        (sa.and_(value < 0, rounded < value), -1),
        else_=0,
    )
    return rounded.op("-", return_type=sa.BigInteger())(correction)


class _RowScope(_Scope):
    """Expressions over the rows of the table (WHERE, GROUP BY keys, aggregate arguments, ...)."""

    def __init__(self, source: QuerySource, clause: str) -> None:
        super().__init__()
        self._source = source
        self._clause = clause

    def leaf(self, node: _Expr) -> _Leaf | None:
        if isinstance(node, _Column):
            return _Leaf(self._source.columns[node.name], self._source.column_types[node.name])
        if _is_aggregate(node):
            raise QuerySyntaxError(f'Misuse of aggregate function "{node.name}" in {self._clause}')
        return None


class _GroupScope(_Scope):
    """Expressions over groups: only group keys and aggregates may refer to the table's columns."""

    def __init__(self, keys: dict[_Expr, _Leaf], aggregates: dict[_Expr, _Leaf]) -> None:
        super().__init__()
        self._keys = keys
        self._aggregates = aggregates

    def leaf(self, node: _Expr) -> _Leaf | None:
        if node in self._keys:
            return self._keys[node]
        if node in self._aggregates:
            return self._aggregates[node]
        if isinstance(node, _Column):
            raise _not_a_group_key(node)
        return None


def _not_a_group_key(column: _Column) -> QuerySyntaxError:
    return QuerySyntaxError(
        f'Column "{column.name}" must be a GROUP BY key or be used inside an aggregate function'
    )


class _QueryCompiler:
    def __init__(self, parsed: ParsedQuery, source: QuerySource) -> None:
        self._parsed = parsed
        self._source = source
        self._aliases = dict(parsed.aliases)

    def _resolve(self, node: _Expr, expanding: frozenset[str] = frozenset()) -> _Expr:
        """Replace aliases by their expressions and names by columns.

        While an alias is being expanded its name refers to the column, so ``k / 2 AS k`` works.
        """
        match node:
            case _Reference(name=name) if name in self._aliases and name not in expanding:
                return self._resolve(self._aliases[name], expanding | {name})
            case _Reference(name=name) if name in self._source.columns:
                return _Column(name, node.span)
            case _Reference(name=name):
                raise YtError(
                    f'Undefined reference "{name}"',
                    code=ErrorCode.COLUMN_NOT_FOUND,
                    attributes={"name": name},
                )
            case _Alias(expr=expr, name=name):
                return self._resolve(expr, expanding | {name})
            case _Tuple(items=items):
                return replace(node, items=tuple(self._resolve(item, expanding) for item in items))
            case _Logical(operands=operands):
                return replace(node, operands=tuple(self._resolve(item, expanding) for item in operands))
            case _Unary(operand=operand) | _In(operand=operand) | _Between(operand=operand):
                return replace(node, operand=self._resolve(operand, expanding))
            case _Binary(left=left, right=right):
                return replace(
                    node, left=self._resolve(left, expanding), right=self._resolve(right, expanding)
                )
            case _Call(args=args):
                return replace(node, args=tuple(self._resolve(arg, expanding) for arg in args))
        return node

    def compile(self) -> CompiledQuery:
        parsed = self._parsed
        if parsed.projection is None:
            items = [(name, _Column(name, _Span(name, 0, len(name)))) for name in self._source.columns]
        else:
            items = [(item.name, self._resolve(item.expr)) for item in parsed.projection]
        names = [name for name, _ in items]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise QuerySyntaxError(f'Duplicate column "{duplicates[0]}" in query output')
        where = None if parsed.where is None else self._resolve(parsed.where)
        keys = [self._resolve(key) for key in parsed.group_by]
        having = None if parsed.having is None else self._resolve(parsed.having)
        order = [(self._resolve(item.expr), item.descending) for item in parsed.order_by]
        expressions = [e for _, e in items] + [e for e, _ in order] + ([having] if having is not None else [])
        if keys or having is not None or any(_is_aggregate(n) for e in expressions for n in _walk(e)):
            statement, output_types = self._grouped(items, where, keys, having, order, expressions)
        else:
            statement, output_types = self._plain(items, where, order)
        if parsed.limit is not None:
            statement = statement.limit(parsed.limit)
        if parsed.offset is not None:
            statement = statement.offset(parsed.offset)
        return CompiledQuery(statement, names, dict(zip(names, output_types, strict=True)))

    def _plain(
        self, items: list[tuple[str, _Expr]], where: _Expr | None, order: list[tuple[_Expr, bool]]
    ) -> tuple[sa.Select[Any], list[str]]:
        scope = _RowScope(self._source, "SELECT")
        columns, types = _project(scope, items)
        statement = sa.select(*columns).select_from(self._source.from_clause)
        if where is not None:
            statement = statement.where(_predicate(_RowScope(self._source, "WHERE"), where, "WHERE"))
        if order:
            statement = statement.order_by(*_order_by(scope, order))
        elif self._source.key_columns:
            statement = statement.order_by(
                *(self._source.columns[k].asc().nulls_first() for k in self._source.key_columns)
            )
        return statement, types

    def _grouped(
        self,
        items: list[tuple[str, _Expr]],
        where: _Expr | None,
        keys: list[_Expr],
        having: _Expr | None,
        order: list[tuple[_Expr, bool]],
        expressions: list[_Expr],
    ) -> tuple[sa.Select[Any], list[str]]:
        key_scope = _RowScope(self._source, "GROUP BY")
        key_types = [_choose(key_scope.types(key)) for key in keys]
        inner = [
            key_scope.emit(key, t).label(f"g{i}")
            for i, (key, t) in enumerate(zip(keys, key_types, strict=True))
        ]

        calls: dict[_Call, None] = {}
        for expr in expressions:
            _collect_aggregates(expr, set(keys), calls)
        argument_scope = _RowScope(self._source, "an aggregate function argument")
        aggregates: list[tuple[_Call, str, str | None]] = []  # call, result type, inner column
        for call in calls:
            result_type, argument = _aggregate_argument(call, argument_scope)
            label = None
            if argument is not None:
                label = f"a{len(inner)}"
                inner.append(argument.label(label))
            aggregates.append((call, result_type, label))

        rows = sa.select(*(inner or [sa.literal_column("1").label("one")])).select_from(
            self._source.from_clause
        )
        if where is not None:
            rows = rows.where(_predicate(_RowScope(self._source, "WHERE"), where, "WHERE"))
        subquery = rows.subquery()
        scope = _GroupScope(
            {
                key: _Leaf(subquery.c[f"g{i}"], t)
                for i, (key, t) in enumerate(zip(keys, key_types, strict=True))
            },
            {call: _aggregate_sql(call, t, subquery, label) for call, t, label in aggregates},
        )
        columns, types = _project(scope, items)
        statement = sa.select(*columns).select_from(subquery)
        if keys:
            statement = statement.group_by(*(subquery.c[f"g{i}"] for i in range(len(keys))))
        if having is not None:
            statement = statement.having(_predicate(scope, having, "HAVING"))
        if order:
            statement = statement.order_by(*_order_by(scope, order))
        return statement, types


def _collect_aggregates(node: _Expr, keys: set[_Expr], found: dict[_Call, None]) -> None:
    """Find the aggregates a grouped expression uses; a column outside keys and aggregates is an error."""
    if node in keys:
        return
    if _is_aggregate(node):
        found.setdefault(node)
    elif isinstance(node, _Column):
        raise _not_a_group_key(node)
    else:
        for child in _children(node):
            _collect_aggregates(child, keys, found)


def _aggregate_argument(call: _Call, scope: _RowScope) -> tuple[str, sa.ColumnElement[Any] | None]:
    """The result type of an aggregate and the SQL of its argument (None for ``count(*)``)."""
    if call.star:
        if call.name != "count":
            raise QuerySyntaxError(f'Aggregate function "{call.name}" does not accept "*"')
        return _INT64, None
    if len(call.args) != 1:
        raise QuerySyntaxError(
            f'Wrong number of arguments to aggregate function "{call.name}": expected 1, got {len(call.args)}'
        )
    argument_type = _choose(scope.expect(call.args[0], _AGGREGATE_ARGUMENT_TYPES[call.name], call))
    result_type = {"count": _INT64, "avg": _DOUBLE}.get(call.name, argument_type)
    argument = scope.emit(call.args[0], argument_type)
    if argument_type == _BOOLEAN and call.name in ("min", "max"):  # PostgreSQL has no min(boolean)
        argument = sa.cast(argument, sa.Integer())
    return result_type, argument


def _aggregate_sql(call: _Call, t: str, subquery: sa.Subquery, label: str | None) -> _Leaf:
    if label is None:
        return _Leaf(sa.func.count(), t)
    sql = getattr(sa.func, call.name)(subquery.c[label])
    if call.name in ("sum", "avg") or t == _BOOLEAN:  # PostgreSQL's sum and avg of integers are NUMERIC
        sql = sa.cast(sql, _SA_TYPES[t])
    return _Leaf(sql, t)


def _project(scope: _Scope, items: list[tuple[str, _Expr]]) -> tuple[list[sa.ColumnElement[Any]], list[str]]:
    """The labelled SELECT list and the YT type of each output column.

    Leaves keep the column's own SQL type, so the source's result processing applies; computed
    values get the standard type of their YT type (e.g. so that SQLite's 0/1 become booleans).
    """
    columns, types = [], []
    for i, (_, node) in enumerate(items):
        t = _choose(scope.types(node))
        sql = scope.emit(node, t)
        if scope.leaf(node) is None:
            sql = sa.type_coerce(sql, _SA_TYPES[t])
        columns.append(sql.label(f"c{i}"))
        types.append(t)
    return columns, types


def _predicate(scope: _Scope, node: _Expr, clause: str) -> sa.ColumnElement[bool]:
    if _BOOLEAN not in scope.types(node):
        raise QuerySyntaxError(
            f'{clause} predicate "{node.text}" must be boolean, got {_choose(scope.types(node))}'
        )
    return scope.emit(node, _BOOLEAN, predicate=True)


def _order_by(scope: _Scope, order: list[tuple[_Expr, bool]]) -> list[sa.ColumnElement[Any]]:
    """ORDER BY terms; NULL is the smallest value as in YT. Constant terms order nothing and are
    skipped (an integer constant would be a column position in SQL)."""
    terms = []
    for node, descending in order:
        if not any(isinstance(n, _Column) or _is_aggregate(n) for n in _walk(node)):
            continue
        sql = scope.emit(node, _choose(scope.types(node)))
        terms.append(sql.desc().nulls_last() if descending else sql.asc().nulls_first())
    return terms
