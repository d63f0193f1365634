"""The conflict log (seed 001): every conflict, in the transaction that resolves it, in two places.

``//sys/xdcr_conflicts`` is an ordered table a user queries (``yt select-rows``), and
``xdcr_conflicts/LOG_<yyyymmdd>.csv`` under the data directory holds the same rows (0600: they hold
whole rows). The rows are the seed's (EXT/EXP/NEW/DEL with its columns), plus ``LOSING_WRITE`` and
``KEY``; ``TUPLE`` is cut at 1 MB as the seed says, which bounds what a peer's change can make this
cluster store. ``//sys/@xdcr_conflict_retention`` bounds the log's age.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..storage import on_commit
from ..tablets import DynamicTable, RowWrite, WriteKind, xdcr
from ..timestamps import COUNTER_BITS
from .state import PeerState, XdcrState

CONFLICTS_PATH = "//sys/xdcr_conflicts"
#: the seed's conflict log columns, in its order, then whether the losing write was local or replicated
CONFLICT_COLUMNS = ["ROW_TYPE", "ACTION_TYPE", "CONFLICT_TYPE", "CONFLICTS_ON_PRIMARY_KEY", "DECISION", "CLUSTER_ID",
                    "TIMESTAMP", "DIVERGENCE", "TABLE_NAME", "CURRENT_CLUSTER_ID", "CURRENT_TIMESTAMP", "TUPLE",
                    "LOSING_WRITE", "KEY"]
CONFLICT_SCHEMA = [
    {"name": "ROW_TYPE", "type": "string"}, {"name": "ACTION_TYPE", "type": "string"},
    {"name": "CONFLICT_TYPE", "type": "string"}, {"name": "CONFLICTS_ON_PRIMARY_KEY", "type": "int64"},
    {"name": "DECISION", "type": "string"}, {"name": "CLUSTER_ID", "type": "int64"},
    {"name": "TIMESTAMP", "type": "uint64"}, {"name": "DIVERGENCE", "type": "string"},
    {"name": "TABLE_NAME", "type": "string"}, {"name": "CURRENT_CLUSTER_ID", "type": "int64"},
    {"name": "CURRENT_TIMESTAMP", "type": "uint64"}, {"name": "TUPLE", "type": "string"},
    {"name": "LOSING_WRITE", "type": "string"}, {"name": "KEY", "type": "string"},
]
#: seed 001: the TUPLE column is limited to 1 MB; a longer row is truncated (bounds what a peer's
#: change can make this cluster store, whatever its rows weigh)
MAX_TUPLE_BYTES = 1_000_000


def _bounded_json(value: Any) -> str:
    """``value`` as JSON (keys sorted), cut to ``MAX_TUPLE_BYTES`` of UTF-8 (seed 001's TUPLE)."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= MAX_TUPLE_BYTES // 4:
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_TUPLE_BYTES:
        return text
    return data[:MAX_TUPLE_BYTES].decode("utf-8", "ignore")


class ConflictLog:
    """The conflict log of this cluster: its rows, its table, its CSV files, its retention."""

    def __init__(self, state: XdcrState) -> None:
        self.state = state

    def migrate(self) -> None:
        """At start: the log exists (queryable, empty until a conflict), with the KEY column (a log made
        before it had one is widened in place, its rows kept)."""
        with self.state.storage.write() as conn:
            conflicts = self.table(conn)
        if "KEY" not in conflicts.schema.by_name:
            self.state.host.alter_schema(CONFLICTS_PATH, CONFLICT_SCHEMA)

    def conflict_rows(self, table: DynamicTable, path: str, action: xdcr.Action, write: RowWrite,
                       key: tuple[Any, ...], resolution: xdcr.Resolution, expected: xdcr.RowVersion | None,
                       current: xdcr.RowVersion | None, current_row: dict[str, Any] | None, own: int,
                       resolved_at: int) -> list[dict[str, Any]]:
        """The seed's rows of one conflict, in its order: EXT and EXP on a timestamp mismatch (or a
        missing row), EXT on a constraint violation, NEW for an insert or update, DEL for a delete."""
        kind = action.kind
        decision = "A" if resolution.accept else "R"
        # the write that lost: the incoming one (replicated) if rejected, else the row's last change
        if not resolution.accept:
            losing = "replicated"
        else:
            losing = "local" if current is not None and current.version[1] == own else "replicated"
        assert write.origin is not None

        key_text = _bounded_json(dict(zip(table.schema.key_names, key, strict=False)))

        def row(row_type: str, conflict: str, cluster: int, ts: int, tuple_: Any) -> dict[str, Any]:
            return {"ROW_TYPE": row_type, "ACTION_TYPE": xdcr.ACTION_TYPES[kind], "CONFLICT_TYPE": conflict,
                    "CONFLICTS_ON_PRIMARY_KEY": int(resolution.on_primary_key), "DECISION": decision,
                    "CLUSTER_ID": cluster, "TIMESTAMP": ts, "DIVERGENCE": "C", "TABLE_NAME": path,
                    "CURRENT_CLUSTER_ID": own, "CURRENT_TIMESTAMP": resolved_at,
                    "TUPLE": _bounded_json(tuple_), "LOSING_WRITE": losing, "KEY": key_text}

        out = []
        cur_version = current.version if current is not None else (0, 0)
        existing = current_row if current_row is not None else dict(zip(table.schema.key_names, key, strict=False))
        if resolution.conflict in ("MSMT", "MISS"):
            out.append(row("EXT", resolution.conflict, cur_version[1], cur_version[0],
                           None if current_row is None else current_row))
            if expected is not None:
                out.append(row("EXP", resolution.conflict, expected.version[1], expected.version[0], action.before))
        if resolution.conflict == "CNST":
            out.append(row("EXT", "CNST", cur_version[1], cur_version[0], existing))
        if kind == "delete":
            out.append(row("DEL", "NONE", write.origin[1], write.origin[0],
                           dict(zip(table.schema.key_names, action.key or [], strict=False))))
        else:
            out.append(row("NEW", "NONE", write.origin[1], write.origin[0], action.row))
        return out

    def table(self, conn: sa.Connection) -> DynamicTable:
        node = self.state.cypress.root.children.get("sys")
        child = node.children.get("xdcr_conflicts") if node is not None else None
        if child is None or child.table is None:
            child = self.state.host.create_system_table(conn, "xdcr_conflicts", CONFLICT_SCHEMA)
        assert child.table is not None
        return child.table

    def log(self, conn: sa.Connection, rows: list[dict[str, Any]], commit_ts: int, origin: str) -> None:
        table = self.table(conn)
        table.apply(conn, [RowWrite(WriteKind.WRITE, r, 1) for r in rows], commit_ts, 0)
        state = self.state.peer_states.setdefault(origin, PeerState())
        conflicts = sum(1 for r in rows if r["ROW_TYPE"] in ("NEW", "DEL"))

        def publish() -> None:
            state.conflicts += conflicts
            self._write_csv(rows)

        on_commit(conn, publish)

    def _directory(self) -> Path | None:
        return None if self.state.host.data_dir is None else self.state.host.data_dir / "xdcr_conflicts"

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        directory = self._directory()
        if directory is None:
            return
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / f"LOG_{datetime.now(UTC):%Y%m%d}.csv"
        columns = CONFLICT_COLUMNS
        new = not path.exists()
        if not new:
            # a file begun by an older engine keeps its own columns (rows written under its header)
            with path.open(encoding="utf-8", newline="") as f:
                columns = next(csv.reader(f), []) or CONFLICT_COLUMNS
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
        # 0600 whatever the umask: the file holds whole rows
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8", newline="") as f:
            f.write(buffer.getvalue())

    def trim(self) -> None:
        """Keep the conflict log within ``//sys/@xdcr_conflict_retention`` (ms): older rows of
        ``//sys/xdcr_conflicts`` are trimmed and older CSV files removed."""
        retention = self.state.conflict_retention_ms()
        horizon = self.state.timestamps.last - ((retention << COUNTER_BITS) // 1000)
        node = self.state.cypress.root.children.get("sys")
        child = node.children.get("xdcr_conflicts") if node is not None else None
        if child is not None and child.table is not None:
            table = child.table
            data = table.sql.data
            with self.state.storage.read() as conn:
                last = conn.execute(sa.select(sa.func.max(data.c["_rt_row_index"])).where(
                    data.c["_rt_tablet_index"] == 0, data.c["_rt_ts"] <= horizon)).scalar()
            if last is not None:
                with self.state.storage.write() as conn:
                    table.trim_rows(conn, 0, int(last) + 1, CONFLICTS_PATH)
        directory = self._directory()
        if directory is not None and directory.exists():
            cutoff = time.time() - retention / 1000.0
            for file in directory.glob("LOG_*.csv"):
                if file.stat().st_mtime < cutoff:
                    file.unlink(missing_ok=True)
