"""The lark grammar of YT QL, the LALR parser built from it, and the syntax-error messages.

Why this module exists: the grammar (keywords, precedence, tokens) changes for other reasons than
the syntax tree or the compiler. The error messages live with it because they are phrased in its
terms: they point at a line:column of the text and name the grammar's terminals that were expected.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, cast

import lark
from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ..errors import QuerySyntaxError

# ---------------------------------------------------------------------------------------------------
# Grammar. Keywords are reserved (the basic lexer tries them before identifiers), as in YT, and are
# matched as whole words so that ``index`` or ``order_id`` stay identifiers. Precedence, loosest
# first: OR, AND, NOT, IS [NOT] NULL, = != <>, < <= > >= [NOT] IN [NOT] BETWEEN, + - ||, * / %, unary.

_GRAMMAR = r"""
start: _SELECT? projection _FROM table_ref join* where? group_by? having? order_by? offset? limit?

projection: STAR                                       -> star_projection
          | expression (_COMMA expression)*            -> item_projection

table_ref: table_path (_AS NAME)?
table_path: BRACKETED | BACKQUOTED
join: LEFT? _JOIN table_ref _ON or_expr                            -> join_on
    | LEFT? _JOIN table_ref _USING column_name (_COMMA column_name)* -> join_using
column_name: NAME | DOLLAR_NAME | BRACKETED | BACKQUOTED
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
         | NAME _DOT (NAME | DOLLAR_NAME | BRACKETED | BACKQUOTED)  -> qualified_reference

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
LEFT.4: /left\b/i
_JOIN.4: /join\b/i
_ON.4: /on\b/i
_USING.4: /using\b/i
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
_DOT: "."

_WS: /\s+/
%ignore _WS
"""

_OPTIONS: dict[str, Any] = {"parser": "lalr", "lexer": "basic", "propagate_positions": True,
                            "maybe_placeholders": False}


def _cache_dir() -> Path | None:
    """This user's cache directory for the parser tables, if it is private (the file is unpickled)."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reptables"
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = base.stat()
    except (OSError, RuntimeError):  # no home directory, a read-only file system
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return base


def _build_parser() -> Lark:
    """The LALR parser. Building its tables takes ~0.4 s, paid by every engine start; they are kept in
    a file of this user's cache directory, named by a hash of the grammar, options and lark version
    (so a changed grammar never reads old tables), written whole or not at all (``os.replace``)."""
    key = hashlib.sha256(repr((_GRAMMAR, sorted(_OPTIONS.items()), lark.__version__)).encode()).hexdigest()[:32]
    directory = _cache_dir()
    path = directory / f"yql-parser-{key}.lark" if directory is not None else None
    if path is not None and path.is_file():
        try:
            with path.open("rb") as f:
                return Lark.load(f)
        except Exception:  # noqa: BLE001  # an unreadable cache is rebuilt below, never an error
            pass
    parser = Lark(_GRAMMAR, **_OPTIONS)
    if path is not None:
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".yql-parser-")
            try:
                with os.fdopen(fd, "wb") as f:
                    parser.save(f)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    return parser


# Built once at import, read-only after: Lark.parse keeps its lexer and parser state per call (the basic
# lexer builds its scanner lazily on first use, idempotently), so concurrent parses may share it.
PARSER = _build_parser()

_TERMINAL_NAMES = {  # read-only
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
    "_DOT": '"."',
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


def error_at(text: str, position: int, problem: str, expected: list[str] | None = None) -> QuerySyntaxError:
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


def parse_error(text: str, exc: UnexpectedInput) -> QuerySyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        # lark declares ``pos_in_stream = None`` on UnexpectedInput; UnexpectedCharacters always sets an int
        position = cast(int, exc.pos_in_stream)
        return error_at(text, position, f'unexpected character "{text[position]}"')
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        position, found = exc.token.start_pos or 0, f'"{exc.token.value}"'
    else:
        position, found = len(text), "end of query"
    # ``accepts`` replays the parser, so it drops the tokens that LALR's merged states only seem to allow.
    names = (
        (exc.accepts or exc.expected) if isinstance(exc, UnexpectedToken) else getattr(exc, "expected", ())
    )
    return error_at(text, position, f"unexpected {found}", sorted({_terminal_name(n) for n in names}))
