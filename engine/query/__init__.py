"""The query language of select_rows: grammar, syntax tree and the compiler to SQL.

YT QL (the language of ``select_rows``) is parsed with lark and compiled into SQLAlchemy Core. The
package is cut along that pipeline, each module importing only the ones above it in this list:

* :mod:`.yt_types` - the YT type names and the SQL types that carry them (shared by both halves);
* :mod:`.ast` - the immutable syntax tree and the walks over it (no lark, no SQLAlchemy);
* :mod:`.grammar` - the lark grammar, the parser built from it and the syntax-error messages;
* :mod:`.parser` - :func:`parse_query`: lark's parse tree -> AST, plus the checks that need no schema;
* :mod:`.expressions` - the typing and SQL of one expression (built-in functions, NULL semantics);
* :mod:`.compiler` - :func:`compile_query`: the whole query bound to its tables, as one ``SELECT``.

Why this package exists: clients of a YTsaurus dynamic table filter, group and sort on the server by
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
* **Joins are SQL joins over the tables' own relations.** ``[LEFT] JOIN [//t] [AS b] ON ...`` or
  ``USING ...`` becomes an SQL ``JOIN`` (``LEFT OUTER`` for ``LEFT``) of each table's relation, the
  same one a single-table query reads (so a snapshot timestamp applies to every table), each under
  an SQL alias of its own so that a table can be joined with itself. As in YT, the join must equate
  a prefix of the joined table's key; qualified names (``b.k``) name the columns of aliased tables.
* The SQL is dialect-neutral (it runs on SQLite and PostgreSQL): row values are used only for
  ``(a, b) IN (...)``, and where the tuple holds the first key column a short list is written as
  ``(a = ? AND b = ?) OR ...`` instead (SQLite scans the table for a row-value list); tuple
  comparisons are expanded lexicographically; ``int64(double)`` rounds
  towards zero on both, although ``CAST`` alone truncates on SQLite but rounds on PostgreSQL.

As in YT, ``IN`` and ``BETWEEN`` take constants only, ``OFFSET`` comes before ``LIMIT`` and needs
it, and keywords are reserved. Deviations from YT QL, by choice: aggregates without ``GROUP BY``
aggregate the whole table into one row, even an empty table (YT requires ``GROUP BY``); ``NOT IN``,
``NOT BETWEEN``, ``count``, ``upper`` and ``string(x)`` of a number (formatted by the database) are
accepted; ``HAVING`` needs no ``GROUP BY`` and may be used with ``LIMIT``. Division by zero gives
NULL on SQLite and an error on PostgreSQL (an error in YT); ``length`` counts characters where the
database stores text; uint64 values beyond 2**63 - 1 are not representable in SQLite. Not supported:
``WITH TOTALS``, ``LIKE``, ``CASE``, ``transform``, bitwise operators and other YT functions.
"""

from .ast import ParsedQuery
from .compiler import CompiledQuery, QuerySource, compile_query
from .parser import parse_query

__all__ = ["CompiledQuery", "ParsedQuery", "QuerySource", "compile_query", "parse_query"]
