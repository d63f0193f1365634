"""From query text to a validated :class:`~.ast.ParsedQuery`: parse_query.

Why this module exists: it is the step that needs only the text. It runs the parser of
:mod:`.grammar`, turns lark's parse tree into the AST of :mod:`.ast` (decoding literals and quoted
names on the way) and makes the checks that hold whatever the table: ``ORDER BY``/``OFFSET`` need
``LIMIT``, aliases are unique, integer literals fit their type. Binding to a table is
:mod:`.compiler`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from lark import Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.tree import Meta

from ..errors import QuerySyntaxError, YtError
from .ast import (
    Between,
    Binary,
    Call,
    Expr,
    In,
    Literal,
    Logical,
    ParsedQuery,
    Tuple,
    Unary,
    _Alias,
    _Join,
    _OrderItem,
    _Reference,
    _SelectItem,
    _Span,
    _TableRef,
    _too_deep,
    _walk,
)
from .grammar import PARSER, error_at, parse_error
from .yt_types import INT64, INT64_MAX, INT64_MIN, UINT64, UINT64_MAX


def parse_query(text: str) -> ParsedQuery:
    """Parse a YT QL query; raise :class:`QuerySyntaxError` for anything malformed."""
    if not text.strip():
        raise QuerySyntaxError("Error while parsing query: the query is empty", attributes={"query": text})
    try:
        tree = PARSER.parse(text)
        parsed: ParsedQuery = _AstBuilder(text).transform(tree)
        return replace(parsed, aliases=_validate(parsed))
    except UnexpectedInput as exc:
        raise parse_error(text, exc) from None
    except VisitError as exc:  # lark wraps what the tree builder raises
        if isinstance(exc.orig_exc, YtError):
            raise exc.orig_exc from None
        raise
    except RecursionError:  # the parser and tree builder are iterative, the AST walks are not
        raise _too_deep(text) from None


# Built once at import, read-only after.
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
        table = next(child for child in children if isinstance(child, _TableRef))
        joins = tuple(child for child in children if isinstance(child, _Join))
        clauses: dict[str, Any] = dict(child for child in children if isinstance(child, tuple))
        return ParsedQuery(
            table_path=table.path,
            text=self._text,
            projection=clauses["projection"],
            where=clauses.get("where"),
            group_by=clauses.get("group_by", ()),
            having=clauses.get("having"),
            order_by=clauses.get("order_by", ()),
            offset=clauses.get("offset"),
            limit=clauses.get("limit"),
            aliases=(),
            table=table,
            joins=joins,
        )

    def star_projection(self, meta: Meta, children: list[Token]) -> tuple[str, None]:
        return "projection", None

    def item_projection(self, meta: Meta, children: list[Expr]) -> tuple[str, tuple[_SelectItem, ...]]:
        return "projection", tuple(_SelectItem(expr, _output_name(expr)) for expr in children)

    def table_path(self, meta: Meta, children: list[Token]) -> _TableRef:
        return _TableRef(_identifier(children[0]), None, self._span(meta))

    def table_ref(self, meta: Meta, children: list[Any]) -> _TableRef:
        table: _TableRef = children[0]
        return replace(table, alias=children[1].value) if len(children) > 1 else table

    def join_on(self, meta: Meta, children: list[Any]) -> _Join:
        left = isinstance(children[0], Token) and children[0].type == "LEFT"
        table, on = children[-2:]
        return _Join(table, left, on, (), self._span(meta))

    def join_using(self, meta: Meta, children: list[Any]) -> _Join:
        left = isinstance(children[0], Token) and children[0].type == "LEFT"
        rest = children[1:] if left else children
        return _Join(rest[0], left, None, tuple(rest[1:]), self._span(meta))

    def column_name(self, meta: Meta, children: list[Token]) -> str:
        return _identifier(children[0])

    def where(self, meta: Meta, children: list[Expr]) -> tuple[str, Expr]:
        return "where", children[0]

    def group_by(self, meta: Meta, children: list[Expr]) -> tuple[str, tuple[Expr, ...]]:
        return "group_by", tuple(children)

    def having(self, meta: Meta, children: list[Expr]) -> tuple[str, Expr]:
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
        if value > INT64_MAX:
            raise error_at(self._text, token.start_pos or 0, f"{token.value} is out of int64 range")
        return value

    # expressions ------------------------------------------------------------------------------

    def alias(self, meta: Meta, children: list[Any]) -> _Alias:
        return _Alias(children[0], children[1], self._span(meta))

    def alias_name(self, meta: Meta, children: list[Token]) -> str:
        return _identifier(children[0])

    def or_op(self, meta: Meta, children: list[Expr]) -> Logical:
        return self._logical("or", meta, *children)

    def and_op(self, meta: Meta, children: list[Expr]) -> Logical:
        return self._logical("and", meta, *children)

    def _logical(self, op: str, meta: Meta, left: Expr, right: Expr) -> Logical:
        operands = left.operands if isinstance(left, Logical) and left.op == op else (left,)
        return Logical(op, (*operands, right), self._span(meta))

    def not_op(self, meta: Meta, children: list[Expr]) -> Unary:
        return Unary("not", children[0], self._span(meta))

    def is_null(self, meta: Meta, children: list[Expr]) -> Call:
        return Call("is_null", (children[0],), False, self._span(meta))

    def is_not_null(self, meta: Meta, children: list[Expr]) -> Unary:
        span = self._span(meta)
        return Unary("not", Call("is_null", (children[0],), False, span), span)

    def binary(self, meta: Meta, children: list[Any]) -> Binary:
        left, op, right = children
        return Binary("!=" if op.value == "<>" else op.value, left, right, self._span(meta))

    def between(self, meta: Meta, children: list[Any]) -> Between:
        return Between(children[0], children[1], children[2], False, self._span(meta))

    def not_between(self, meta: Meta, children: list[Any]) -> Between:
        return Between(children[0], children[1], children[2], True, self._span(meta))

    def in_list(self, meta: Meta, children: list[Any]) -> In:
        return In(children[0], tuple(children[1:]), False, self._span(meta))

    def not_in_list(self, meta: Meta, children: list[Any]) -> In:
        return In(children[0], tuple(children[1:]), True, self._span(meta))

    def unary(self, meta: Meta, children: list[Any]) -> Expr:
        sign, operand = children
        span = self._span(meta)
        if isinstance(operand, Literal) and operand.kind in ("int", "uint", "double"):
            return _signed(sign.value, operand, span)
        return Unary(sign.value, operand, span)

    def star_call(self, meta: Meta, children: list[Token]) -> Call:
        return Call(children[0].value.lower(), (), True, self._span(meta))

    def call(self, meta: Meta, children: list[Any]) -> Call:
        return Call(children[0].value.lower(), tuple(children[1:]), False, self._span(meta))

    def parens(self, meta: Meta, children: list[Expr]) -> Expr:
        return children[0] if len(children) == 1 else Tuple(tuple(children), self._span(meta))

    def reference(self, meta: Meta, children: list[Token]) -> _Reference:
        return _Reference(_identifier(children[0]), self._span(meta))

    def qualified_reference(self, meta: Meta, children: list[Token]) -> _Reference:
        return _Reference(_identifier(children[1]), self._span(meta), qualifier=children[0].value)

    def const_tuple(self, meta: Meta, children: list[Literal]) -> tuple[Literal, ...]:
        return tuple(children)

    def const_value(self, meta: Meta, children: list[Any]) -> Literal:
        *signs, value = children
        if signs and value.kind not in ("int", "uint", "double"):
            raise error_at(self._text, meta.start_pos, f"a sign cannot be applied to {value.text}")
        for sign in reversed(signs):
            value = _signed(sign.value, value, self._span(meta))
        return value

    # literals ---------------------------------------------------------------------------------

    def int_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(int(children[0].value), "int", self._span(meta))

    def uint_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(int(children[0].value[:-1]), "uint", self._span(meta))

    def float_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(float(children[0].value), "double", self._span(meta))

    def string_literal(self, meta: Meta, children: list[Token]) -> Literal:
        token = children[0]
        try:
            value = _unescape(token.value[1:-1])
        except UnicodeDecodeError:
            raise error_at(self._text, token.start_pos or 0, "string literal is not valid UTF-8") from None
        return Literal(value, "string", self._span(meta))

    def true_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(True, "boolean", self._span(meta))

    def false_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(False, "boolean", self._span(meta))

    def null_literal(self, meta: Meta, children: list[Token]) -> Literal:
        return Literal(None, "null", self._span(meta))


def _signed(sign: str, literal: Literal, span: _Span) -> Literal:
    """Fold a unary sign into a numeric literal; a negated uint64 wraps around, as in C (and YT)."""
    value = literal.value
    assert isinstance(value, int | float)
    if sign == "-":
        value = (-value) % (UINT64_MAX + 1) if literal.kind == "uint" else -value
    return Literal(value, literal.kind, span)


def _output_name(expr: Expr) -> str:
    if isinstance(expr, _Reference):
        return expr.written
    if isinstance(expr, _Alias):
        return expr.name
    return expr.text


def _clause_expressions(parsed: ParsedQuery) -> Iterator[Expr]:
    yield from (item.expr for item in parsed.projection or ())
    yield from (e for e in (parsed.where, parsed.having) if e is not None)
    yield from parsed.group_by
    yield from (item.expr for item in parsed.order_by)
    yield from (join.on for join in parsed.joins if join.on is not None)


def _validate(parsed: ParsedQuery) -> tuple[tuple[str, Expr], ...]:
    """The checks that need no schema; returns the aliases of the query."""
    if parsed.order_by and parsed.limit is None:
        raise QuerySyntaxError("ORDER BY used without LIMIT", attributes={"query": parsed.text})
    if parsed.offset is not None and parsed.limit is None:
        raise QuerySyntaxError("OFFSET used without LIMIT", attributes={"query": parsed.text})
    table_aliases: set[str] = set()
    for table in parsed.tables:
        if table.alias is not None:
            if table.alias in table_aliases:
                raise QuerySyntaxError(f'Table alias "{table.alias}" has been already used',
                                       attributes={"query": parsed.text})
            table_aliases.add(table.alias)
    for join in parsed.joins:
        if len(set(join.using)) != len(join.using):
            raise QuerySyntaxError(f'Column repeated in USING of the join of table {join.table.path}',
                                   attributes={"query": parsed.text})
    aliases: dict[str, Expr] = {}
    for node in (n for expr in _clause_expressions(parsed) for n in _walk(expr)):
        if isinstance(node, _Alias):
            if node.name in aliases:
                raise QuerySyntaxError(f'Alias "{node.name}" has been already used')
            aliases[node.name] = node.expr
        elif isinstance(node, Literal) and isinstance(node.value, int) and node.kind in ("int", "uint"):
            low, high = (INT64_MIN, INT64_MAX) if node.kind == "int" else (0, UINT64_MAX)
            if not low <= node.value <= high:
                raise QuerySyntaxError(
                    f"Integer literal {node.text} is out of {INT64 if node.kind == 'int' else UINT64} range"
                )
    return tuple(aliases.items())
