"""The PostgreSQL side of a mirror: the table a sorted table is mirrored into, and its statements.

The mirror job (``mirror.py``) keeps a PostgreSQL table equal to a sorted table; this module is
what that table looks like and how a change lands in it. The table is made from the table's
schema: the key columns are its primary key, plus a column ``_event_token`` holding the event token
of the change that wrote each row; ``<table>_tombstones`` keeps the key and token of each deleted
row.

What is tricky: every statement here is safe to run again, because the newest token wins. A write
lands only if the row's token is older and no tombstone of its key is as new (``write_statement``),
and ends an older tombstone (``clear_tombstone_statement``); a delete removes only an older row and
leaves (or renews) a tombstone (``delete_statements``). So a micro-batch replayed after a restart
changes nothing. For that the tokens must compare as the engine's tokens do, as plain strings: the
token columns are ``COLLATE "C"`` (bytewise), never the database's collation. And every placeholder
is cast to its column's type: a NULL or a string would otherwise be taken as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from .options import ReptablesSparkError
from .schema_mapping import JSON_TYPES, YtColumn

#: the column that holds each row's event token
TOKEN_COLUMN = "_event_token"
#: the tombstone table of ``T`` is ``T`` + this
TOMBSTONE_SUFFIX = "_tombstones"

#: YT column type -> PostgreSQL column type. Floats become double precision: a float column's
#: values travel as JSON doubles, and "real" would round them.
PG_TYPES: dict[str, str] = {
    **{t: "bigint" for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
    "double": "double precision", "float": "double precision", "boolean": "boolean",
    "string": "text", "utf8": "text", "any": "jsonb", "yson": "jsonb",
}


def table_ident(name: str, suffix: str = "") -> sql.Identifier:
    """``name`` or ``schema.name`` as an identifier, ``suffix`` appended to the table's name."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ReptablesSparkError(f"mirror: --pg-table must be NAME or SCHEMA.NAME, got {name!r}")
    parts[-1] += suffix
    return sql.Identifier(*parts)


@dataclass(frozen=True)
class PgLayout:
    """The PostgreSQL side of a mirrored table: its columns, key and the statements that change it."""

    pg_table: str
    columns: tuple[YtColumn, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def json_columns(self) -> frozenset[str]:
        return frozenset(c.name for c in self.columns if c.type in JSON_TYPES)

    def table(self) -> sql.Identifier:
        return table_ident(self.pg_table)

    def tombstones(self) -> sql.Identifier:
        return table_ident(self.pg_table, TOMBSTONE_SUFFIX)

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """The table and its tombstone table, if they do not exist yet (tokens compare bytewise: COLLATE "C")."""
        def column(c: YtColumn) -> sql.Composed:
            not_null = sql.SQL(" NOT NULL") if not c.nullable else sql.SQL("")
            return sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql.SQL(PG_TYPES[c.type]), not_null)

        token = sql.SQL('{} text COLLATE "C" NOT NULL').format(sql.Identifier(TOKEN_COLUMN))
        key = sql.SQL("PRIMARY KEY ({})").format(self._list(self.keys))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.table(), sql.SQL(", ").join([*(column(c) for c in self.columns), token, key])))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self.tombstones(),
            sql.SQL(", ").join([*(column(c) for c in self.columns if c.key), token, key])))

    def holds_rows(self, conn: psycopg.Connection[Any]) -> bool:
        exists = conn.execute("SELECT to_regclass(%s)", [self.table().as_string(conn)]).fetchone()
        if exists is None or exists[0] is None:
            return False
        return conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(self.table())).fetchone() is not None

    @staticmethod
    def _list(names: Iterable[str]) -> sql.Composed:
        return sql.SQL(", ").join(sql.Identifier(n) for n in names)

    def _param(self, param: str, column: str | None) -> sql.Composed:
        """A placeholder cast to its column's type (a NULL or a string would otherwise be text)."""
        pg_type = "text" if column is None else PG_TYPES[self._types[column]]
        return sql.SQL("%({})s::{}").format(sql.SQL(param), sql.SQL(pg_type))

    @property
    def _types(self) -> dict[str, str]:
        return {c.name: c.type for c in self.columns}

    def _key_values(self) -> list[sql.Composed]:
        return [self._param(f"k{i}", k) for i, k in enumerate(self.keys)]

    def _key_match(self, table: sql.Identifier) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("{}.{} = {}").format(table, sql.Identifier(k), p)
                                     for k, p in zip(self.keys, self._key_values(), strict=True))

    def value(self, name: str, value: Any) -> Any:
        """A row value as psycopg should send it (a column of type any: its structure as jsonb)."""
        if name in self.json_columns and value is not None:
            return Jsonb(value)
        return value

    def write_statement(self, names: tuple[str, ...]) -> sql.Composed:
        """Upsert of the columns ``names`` at token %(t)s, unless the row or its tombstone is as new or newer.

        Parameters: ``k0..`` the key, ``c0..`` the values of ``names``, ``t`` the token."""
        table, tomb = self.table(), self.tombstones()
        columns = [*self.keys, *names, TOKEN_COLUMN]
        values = [*self._key_values(), *(self._param(f"c{i}", n) for i, n in enumerate(names)), self._param("t", None)]
        updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in (*names, TOKEN_COLUMN)]
        return sql.SQL(
            "INSERT INTO {table} AS m ({columns}) SELECT {values} "
            "WHERE NOT EXISTS (SELECT 1 FROM {tomb} WHERE {tomb_key} AND {tomb}.{token} >= %(t)s) "
            "ON CONFLICT ({keys}) DO UPDATE SET {updates} WHERE m.{token} < EXCLUDED.{token}").format(
            table=table, columns=self._list(columns), values=sql.SQL(", ").join(values), tomb=tomb,
            tomb_key=self._key_match(tomb), token=sql.Identifier(TOKEN_COLUMN), keys=self._list(self.keys),
            updates=sql.SQL(", ").join(updates))

    def clear_tombstone_statement(self) -> sql.Composed:
        """A write at token %(t)s ends an older tombstone of its key."""
        tomb = self.tombstones()
        return sql.SQL("DELETE FROM {tomb} WHERE {key} AND {tomb}.{token} < %(t)s").format(
            tomb=tomb, key=self._key_match(tomb), token=sql.Identifier(TOKEN_COLUMN))

    def delete_statements(self) -> tuple[sql.Composed, sql.Composed]:
        """A delete at token %(t)s: remove an older row, then leave (or renew) the key's tombstone."""
        table, tomb = self.table(), self.tombstones()
        token = sql.Identifier(TOKEN_COLUMN)
        delete = sql.SQL("DELETE FROM {table} WHERE {key} AND {table}.{token} < %(t)s").format(
            table=table, key=self._key_match(table), token=token)
        values = [*self._key_values(), self._param("t", None)]
        tombstone = sql.SQL(
            "INSERT INTO {tomb} AS d ({columns}) SELECT {values} "
            "WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE {key} AND {table}.{token} >= %(t)s) "
            "ON CONFLICT ({keys}) DO UPDATE SET {token} = EXCLUDED.{token} WHERE d.{token} < EXCLUDED.{token}").format(
            tomb=tomb, columns=self._list([*self.keys, TOKEN_COLUMN]), values=sql.SQL(", ").join(values),
            table=table, key=self._key_match(table), token=token, keys=self._list(self.keys))
        return delete, tombstone
