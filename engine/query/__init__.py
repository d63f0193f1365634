"""The query language of select_rows: grammar, syntax tree and the compiler to SQL."""

from .compiler import CompiledQuery, QuerySource, compile_query, parse_query

__all__ = ["CompiledQuery", "QuerySource", "compile_query", "parse_query"]
