"""The YT types of the query language and the SQL types that carry them.

Why this module exists: the parser and the compiler share this small vocabulary. The parser checks
integer literals against the int64/uint64 ranges; the compiler types every expression as a set of
these names and gives computed values the matching SQLAlchemy type. Keeping it apart lets both use
it without importing each other.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import NullType, TypeEngine

# Every constant here is built once at import and read-only after; the TypeEngine instances of
# SA_TYPES are shared by all compiled statements and never mutated.

INT64, UINT64, DOUBLE, BOOLEAN, _STRING, _ANY = "int64", "uint64", "double", "boolean", "string", "any"
_TYPE_PREFERENCE = (INT64, UINT64, DOUBLE, BOOLEAN, _STRING, _ANY)  # picked first when several fit
ALL_TYPES = frozenset(_TYPE_PREFERENCE)
_NUMERIC = frozenset({INT64, UINT64, DOUBLE})
_INTEGRAL = frozenset({INT64, UINT64})
_STRING_ONLY = frozenset({_STRING})
_BOOLEAN_ONLY = frozenset({BOOLEAN})
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

SA_TYPES: dict[str, TypeEngine[Any]] = {
    INT64: sa.BigInteger(),
    UINT64: sa.BigInteger(),
    DOUBLE: sa.Float(),
    BOOLEAN: sa.Boolean(),
    _STRING: sa.String(),
    _ANY: NullType(),
}


def choose(types: frozenset[str]) -> str:
    return next(t for t in _TYPE_PREFERENCE if t in types)
