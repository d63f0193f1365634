"""From a parsed query bound to a table to one SQLAlchemy ``Select``: compile_query.

Why this module exists: it is the step that needs the table. :class:`QuerySource` says what the
table path resolves to; :func:`compile_query` resolves names and aliases against it and assembles
the statement clause by clause - a plain ``SELECT`` or, with aggregates, the two nested SELECTs
of a grouped query (see the package docstring). Each expression is typed and emitted by a scope of
:mod:`.expressions`; the subclasses here decide what a name means in each clause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from ..errors import ErrorCode, QuerySyntaxError, YtError
from .ast import (
    Between,
    Binary,
    Call,
    Expr,
    In,
    Logical,
    ParsedQuery,
    Tuple,
    Unary,
    _Alias,
    _children,
    _Column,
    _Reference,
    _Span,
    _too_deep,
    _walk,
    items,
)
from .expressions import AGGREGATE_ARGUMENT_TYPES, Leaf, Scope, is_aggregate
from .yt_types import ALL_TYPES, BOOLEAN, DOUBLE, INT64, SA_TYPES, choose


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
class CompiledQuery:
    """The SQL statement and how to name and type the columns of its result rows."""

    statement: sa.Select[Any]
    output_columns: list[str]
    output_types: dict[str, str]


def compile_query(
    parsed: ParsedQuery, source: QuerySource, joined: Sequence[QuerySource] = ()
) -> CompiledQuery:
    """Bind a parsed query to its tables and translate it into one SQLAlchemy ``Select``.

    ``source`` is the FROM table; ``joined`` holds the table of each JOIN clause, in order.
    """
    if len(joined) != len(parsed.joins):
        raise ValueError(f"the query joins {len(parsed.joins)} tables but {len(joined)} sources were given")
    for each in (source, *joined):
        unknown = set(each.column_types.values()) - ALL_TYPES
        if set(each.columns) != set(each.column_types) or unknown:
            raise ValueError(f"QuerySource columns and column_types disagree (unknown types: {unknown})")
    try:
        return _QueryCompiler(parsed, source, tuple(joined)).compile()
    except RecursionError:
        raise _too_deep(parsed.text) from None


class _RowScope(Scope):
    """Expressions over the rows of the table (WHERE, GROUP BY keys, aggregate arguments, ...)."""

    def __init__(self, source: QuerySource, clause: str) -> None:
        super().__init__()
        self._source = source
        self._clause = clause

    def searched_column(self) -> sa.ColumnElement[Any] | None:
        key = [k for k in self._source.key_columns if not k.startswith("$")]  # an ordered table has none
        return self._source.columns.get(key[0]) if key else None

    def leaf(self, node: Expr) -> Leaf | None:
        if isinstance(node, _Column):
            return Leaf(self._source.columns[node.name], self._source.column_types[node.name])
        if is_aggregate(node):
            raise QuerySyntaxError(f'Misuse of aggregate function "{node.name}" in {self._clause}')
        return None


class _GroupScope(Scope):
    """Expressions over groups: only group keys and aggregates may refer to the table's columns."""

    def __init__(self, keys: dict[Expr, Leaf], aggregates: dict[Expr, Leaf]) -> None:
        super().__init__()
        self._keys = keys
        self._aggregates = aggregates

    def leaf(self, node: Expr) -> Leaf | None:
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
    def __init__(self, parsed: ParsedQuery, source: QuerySource, joined: tuple[QuerySource, ...] = ()) -> None:
        self._parsed = parsed
        self._source = source
        self._aliases = dict(parsed.aliases)
        # name resolution: a bare name -> its column key; (table alias, name) -> column key
        self._names: dict[str, str] = {name: name for name in source.columns}
        self._ambiguous: dict[str, list[str]] = {}
        self._qualified: dict[tuple[str, str], str] = {}
        self._owner: dict[str, int] = dict.fromkeys(source.columns, 0)  # column key -> table index
        table = parsed.tables[0]
        if parsed.joins or table.alias is not None:
            self._source = _JoinBinder(self, (source, *joined)).bind()

    def _reference(self, node: _Reference) -> _Column:
        """The column a (bare or qualified) name stands for."""
        if node.qualifier is not None:
            key = self._qualified.get((node.qualifier, node.name))
            if key is not None:
                return _Column(key, node.span)
            if not any(table.alias == node.qualifier for table in self._parsed.tables):
                raise YtError(
                    f'Undefined reference "{node.written}": no table of the query has alias "{node.qualifier}"',
                    code=ErrorCode.COLUMN_NOT_FOUND,
                    attributes={"name": node.written},
                )
        elif node.name in self._names:
            return _Column(self._names[node.name], node.span)
        elif node.name in self._ambiguous:
            choices = " or ".join(self._ambiguous[node.name])
            raise QuerySyntaxError(
                f'Column "{node.name}" is ambiguous: several tables of the query have it ({choices}); '
                f"qualify it with its table's alias (alias.{node.name})"
            )
        raise YtError(
            f'Undefined reference "{node.written}"',
            code=ErrorCode.COLUMN_NOT_FOUND,
            attributes={"name": node.written},
        )

    def _resolve(self, node: Expr, expanding: frozenset[str] = frozenset()) -> Expr:
        """Replace aliases by their expressions and names by columns.

        While an alias is being expanded its name refers to the column, so ``k / 2 AS k`` works.
        """
        match node:
            case _Reference(name=name, qualifier=None) if name in self._aliases and name not in expanding:
                return self._resolve(self._aliases[name], expanding | {name})
            case _Reference():
                return self._reference(node)
            case _Alias(expr=expr, name=name):
                return self._resolve(expr, expanding | {name})
            case Tuple(items=items):
                return replace(node, items=tuple(self._resolve(item, expanding) for item in items))
            case Logical(operands=operands):
                return replace(node, operands=tuple(self._resolve(item, expanding) for item in operands))
            case Unary(operand=operand) | In(operand=operand) | Between(operand=operand):
                return replace(node, operand=self._resolve(operand, expanding))
            case Binary(left=left, right=right):
                return replace(
                    node, left=self._resolve(left, expanding), right=self._resolve(right, expanding)
                )
            case Call(args=args):
                return replace(node, args=tuple(self._resolve(arg, expanding) for arg in args))
        return node

    def compile(self) -> CompiledQuery:
        parsed = self._parsed
        items: list[tuple[str, Expr]]
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
        if keys or having is not None or any(is_aggregate(n) for e in expressions for n in _walk(e)):
            statement, output_types = self._grouped(items, where, keys, having, order, expressions)
        else:
            statement, output_types = self._plain(items, where, order)
        if parsed.limit is not None:
            statement = statement.limit(parsed.limit)
        if parsed.offset is not None:
            statement = statement.offset(parsed.offset)
        return CompiledQuery(statement, names, dict(zip(names, output_types, strict=True)))

    def _plain(
        self, items: list[tuple[str, Expr]], where: Expr | None, order: list[tuple[Expr, bool]]
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
        items: list[tuple[str, Expr]],
        where: Expr | None,
        keys: list[Expr],
        having: Expr | None,
        order: list[tuple[Expr, bool]],
        expressions: list[Expr],
    ) -> tuple[sa.Select[Any], list[str]]:
        key_scope = _RowScope(self._source, "GROUP BY")
        key_types = [choose(key_scope.types(key)) for key in keys]
        inner = [
            key_scope.emit(key, t).label(f"g{i}")
            for i, (key, t) in enumerate(zip(keys, key_types, strict=True))
        ]

        calls: dict[Call, None] = {}
        for expr in expressions:
            _collect_aggregates(expr, set(keys), calls)
        argument_scope = _RowScope(self._source, "an aggregate function argument")
        aggregates: list[tuple[Call, str, str | None]] = []  # call, result type, inner column
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
                key: Leaf(subquery.c[f"g{i}"], t)
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


class _JoinBinder:
    """Binds the tables of a query with JOINs (or an aliased FROM table) into one :class:`QuerySource`.

    Each table is read through an SQL alias of its own (``t0``, ``t1``...), so a table may be joined
    with itself and the snapshot relations of a timestamped read (subqueries named alike) do not
    clash. A column is known by its bare name when the table has no alias, else as ``alias.name``
    (also its output name under ``*``). Two tables without aliases sharing a column name are
    refused as in YT, except the columns of ``USING``, which appear once (the left table's). A bare
    name that several tables have (under their aliases) is ambiguous when used.

    As in YT, a joined table is looked up by its key: the join must equate a prefix of the joined
    table's key columns (each with an expression over the tables before it); further conditions of
    ``ON`` are allowed and, under ``LEFT JOIN``, only decide which rows match. The equalities are
    plain SQL ``=``: a key column is never NULL, so YT's ``NULL = NULL`` cannot arise there.
    """

    def __init__(self, compiler: _QueryCompiler, sources: tuple[QuerySource, ...]) -> None:
        self._compiler = compiler
        self._sources = sources
        self._tables = compiler._parsed.tables

    def bind(self) -> QuerySource:
        compiler = self._compiler
        compiler._names, compiler._ambiguous, compiler._qualified, compiler._owner = {}, {}, {}, {}
        columns: dict[str, sa.ColumnElement[Any]] = {}
        types: dict[str, str] = {}
        key_columns: list[str] = []
        froms: list[sa.FromClause] = []
        own: list[dict[str, sa.ColumnElement[Any]]] = []  # each table's columns by their own names
        using: list[list[tuple[sa.ColumnElement[Any], sa.ColumnElement[Any], str]]] = []
        bare: dict[str, list[str]] = {}  # bare name -> the keys of the tables that have it
        for index, (table, source) in enumerate(zip(self._tables, self._sources, strict=True)):
            aliased = source.from_clause.alias(f"t{index}")
            froms.append(aliased)
            mine = {name: _aliased_column(aliased, sql) for name, sql in source.columns.items()}
            own.append(mine)
            merged = self._compiler._parsed.joins[index - 1].using if index else ()
            using.append([self._using_pair(index, name, bare, columns, types, mine) for name in merged])
            for name in source.columns:
                key = name if table.alias is None else f"{table.alias}.{name}"
                if table.alias is None and name in merged:
                    continue  # the left table's column stands for both
                if key in columns:
                    raise QuerySyntaxError(
                        f'Column "{name}" occurs both in main and joined tables ({table.path}); '
                        f"give the tables aliases (AS a) and qualify the column (a.{name}), or join USING it"
                    )
                columns[key], types[key] = mine[name], source.column_types[name]
                compiler._owner[key] = index
                if table.alias is not None:
                    compiler._qualified[(table.alias, name)] = key
                if not (table.alias is not None and name in merged):
                    bare.setdefault(name, []).append(key)
            key_columns += [
                k if table.alias is None else f"{table.alias}.{k}"
                for k in source.key_columns
                if table.alias is not None or k not in merged
            ]
        compiler._names = {name: keys[0] for name, keys in bare.items() if len(keys) == 1}
        compiler._ambiguous = {name: keys for name, keys in bare.items() if len(keys) > 1}

        scope = _RowScope(QuerySource(froms[0], columns, types), "a JOIN condition")
        joined: sa.FromClause = froms[0]
        for index, join in enumerate(compiler._parsed.joins, start=1):
            pairs = using[index]
            conditions = [left == right for left, right, _ in pairs]
            equated = [name for _, _, name in pairs]
            if join.on is not None:
                equated, conditions = self._on(index, compiler._resolve(join.on), scope, own[index])
            self._check_key_prefix(index, equated)
            joined = joined.join(froms[index], sa.and_(*conditions), isouter=join.left)
        return QuerySource(joined, columns, types, tuple(key_columns))

    def _using_pair(
        self,
        index: int,
        name: str,
        bare: dict[str, list[str]],
        columns: dict[str, sa.ColumnElement[Any]],
        types: dict[str, str],
        mine: dict[str, sa.ColumnElement[Any]],
    ) -> tuple[sa.ColumnElement[Any], sa.ColumnElement[Any], str]:
        """The left and right columns of a USING column (validated) and its name."""
        path = self._tables[index].path
        left = bare.get(name, [])
        if len(left) != 1:
            where = "is in no table" if not left else "is in several tables"
            raise QuerySyntaxError(f'USING column "{name}" of the join of table {path} {where} before it')
        if name not in mine:
            raise YtError(
                f'USING column "{name}" is not a column of joined table {path}',
                code=ErrorCode.COLUMN_NOT_FOUND,
                attributes={"name": name, "path": path},
            )
        right_type = self._sources[index].column_types[name]
        if types[left[0]] != right_type:
            raise QuerySyntaxError(
                f'Type mismatch in USING column "{name}" of the join of table {path}: '
                f"{types[left[0]]} and {right_type}"
            )
        return columns[left[0]], mine[name], name

    def _owners(self, node: Expr) -> set[int]:
        return {self._compiler._owner[n.name] for n in _walk(node) if isinstance(n, _Column)}

    def _on(
        self, index: int, condition: Expr, scope: _RowScope, mine: dict[str, sa.ColumnElement[Any]]
    ) -> tuple[list[str], list[sa.ColumnElement[bool]]]:
        """The key columns an ON condition equates and its SQL, one term per conjunct."""
        path = self._tables[index].path
        if any(owner > index for owner in self._owners(condition)):
            raise QuerySyntaxError(
                f'The JOIN condition of table {path} refers to a table joined after it: "{condition.text}"'
            )
        if BOOLEAN not in scope.types(condition):
            raise QuerySyntaxError(
                f'JOIN condition "{condition.text}" must be boolean, got {choose(scope.types(condition))}'
            )
        conjuncts = condition.operands if isinstance(condition, Logical) and condition.op == "and" else (condition,)
        table = self._tables[index]
        key_by_column = {name if table.alias is None else f"{table.alias}.{name}": name for name in mine}
        equated: list[str] = []
        terms: list[sa.ColumnElement[bool]] = []
        for conjunct in conjuncts:
            pairs = self._key_pairs(index, conjunct)
            if pairs is None:
                terms.append(scope.emit(conjunct, BOOLEAN, predicate=True))
                continue
            assert isinstance(conjunct, Binary)
            for outer, column in pairs:
                (t,) = scope._comparison_types(conjunct, (outer,), (column,))
                terms.append(scope.emit(outer, t) == scope.emit(column, t))
                equated.append(key_by_column[column.name])
        return equated, terms

    def _key_pairs(self, index: int, conjunct: Expr) -> list[tuple[Expr, _Column]] | None:
        """``outer = column`` pairs if the conjunct equates columns of table ``index`` with expressions
        over the tables before it (tuples pairwise), else None."""
        if not (isinstance(conjunct, Binary) and conjunct.op == "="):
            return None
        lefts, rights = items(conjunct.left), items(conjunct.right)
        if len(lefts) != len(rights):
            return None
        pairs: list[tuple[Expr, _Column]] = []
        for left, right in zip(lefts, rights, strict=True):
            for outer, column in ((left, right), (right, left)):
                if isinstance(column, _Column) and self._owners(column) == {index} and index not in self._owners(outer):
                    pairs.append((outer, column))
                    break
            else:
                return None
        return pairs

    def _check_key_prefix(self, index: int, equated: list[str]) -> None:
        table, source = self._tables[index], self._sources[index]
        key = [k for k in source.key_columns if not k.startswith("$")]  # an ordered table has no key
        used = set(equated)
        described = ", ".join(sorted(used)) or "none of its columns"
        if not key:
            raise QuerySyntaxError(
                f"Cannot join table {table.path}: it is not sorted, and a joined table is looked up by its key"
            )
        if not used or used != set(key[: len(used)]):
            raise QuerySyntaxError(
                f"Join of table {table.path} must equate a prefix of its key columns ({', '.join(key)}) "
                f"with expressions over the tables before it; it equates {described}"
            )


def _aliased_column(aliased: sa.FromClause, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    found = aliased.corresponding_column(column)  # type: ignore[arg-type]
    if found is None:
        raise ValueError(f"QuerySource column {column} is not a column of its from_clause")
    return found


def _collect_aggregates(node: Expr, keys: set[Expr], found: dict[Call, None]) -> None:
    """Find the aggregates a grouped expression uses; a column outside keys and aggregates is an error."""
    if node in keys:
        return
    if is_aggregate(node):
        found.setdefault(node)
    elif isinstance(node, _Column):
        raise _not_a_group_key(node)
    else:
        for child in _children(node):
            _collect_aggregates(child, keys, found)


def _aggregate_argument(call: Call, scope: _RowScope) -> tuple[str, sa.ColumnElement[Any] | None]:
    """The result type of an aggregate and the SQL of its argument (None for ``count(*)``)."""
    if call.star:
        if call.name != "count":
            raise QuerySyntaxError(f'Aggregate function "{call.name}" does not accept "*"')
        return INT64, None
    if len(call.args) != 1:
        raise QuerySyntaxError(
            f'Wrong number of arguments to aggregate function "{call.name}": expected 1, got {len(call.args)}'
        )
    argument_type = choose(scope.expect(call.args[0], AGGREGATE_ARGUMENT_TYPES[call.name], call))
    result_type = {"count": INT64, "avg": DOUBLE}.get(call.name, argument_type)
    argument = scope.emit(call.args[0], argument_type)
    if argument_type == BOOLEAN and call.name in ("min", "max"):  # PostgreSQL has no min(boolean)
        argument = sa.cast(argument, sa.Integer())
    return result_type, argument


def _aggregate_sql(call: Call, t: str, subquery: sa.Subquery, label: str | None) -> Leaf:
    if label is None:
        return Leaf(sa.func.count(), t)
    sql = getattr(sa.func, call.name)(subquery.c[label])
    if call.name in ("sum", "avg") or t == BOOLEAN:  # PostgreSQL's sum and avg of integers are NUMERIC
        sql = sa.cast(sql, SA_TYPES[t])
    return Leaf(sql, t)


def _project(scope: Scope, items: list[tuple[str, Expr]]) -> tuple[list[sa.ColumnElement[Any]], list[str]]:
    """The labelled SELECT list and the YT type of each output column.

    Leaves keep the column's own SQL type, so the source's result processing applies; computed
    values get the standard type of their YT type (e.g. so that SQLite's 0/1 become booleans).
    """
    columns: list[sa.ColumnElement[Any]] = []
    types: list[str] = []
    for i, (_, node) in enumerate(items):
        t = choose(scope.types(node))
        sql = scope.emit(node, t)
        if scope.leaf(node) is None:
            sql = sa.type_coerce(sql, SA_TYPES[t])
        columns.append(sql.label(f"c{i}"))
        types.append(t)
    return columns, types


def _predicate(scope: Scope, node: Expr, clause: str) -> sa.ColumnElement[bool]:
    if BOOLEAN not in scope.types(node):
        raise QuerySyntaxError(
            f'{clause} predicate "{node.text}" must be boolean, got {choose(scope.types(node))}'
        )
    return scope.emit(node, BOOLEAN, predicate=True)


def _order_by(scope: Scope, order: list[tuple[Expr, bool]]) -> list[sa.ColumnElement[Any]]:
    """ORDER BY terms; NULL is the smallest value as in YT. Constant terms order nothing and are
    skipped (an integer constant would be a column position in SQL)."""
    terms: list[sa.ColumnElement[Any]] = []
    for node, descending in order:
        if not any(isinstance(n, _Column) or is_aggregate(n) for n in _walk(node)):
            continue
        sql = scope.emit(node, choose(scope.types(node)))
        terms.append(sql.desc().nulls_last() if descending else sql.asc().nulls_first())
    return terms
