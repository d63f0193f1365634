"""A cluster joins an XDCR group that holds data: a snapshot from a donor, then the change logs.

Seed 001: a new cluster first receives a snapshot of the group's tables from one member (the
*donor*; ``preferred_source`` picks it among three or more), then every member's changes made
after it. A change log alone cannot do it once the log was trimmed (``@change_retention``), and the
rows' versions must come along, or the conflict rules would judge the joiner's rows as unversioned.

The snapshot is a cut, taken in **one SQL read transaction** on the donor: the table's rows, their
versions and tombstones (``_rt_xdcr_rows``), the donor's change-log position and what it holds of
every other member (``_rt_xdcr_sink``). Rows, versions, the log and the sink records are written in
the same SQL transaction as each change, so the cut is consistent without timestamps: after it,
the donor ships its changes after its position, and every other member its changes after what the
donor held of it. The donor writes the cut to pages under its data directory
(``xdcr_snapshots/<id>``, 0600) and serves them by number, so a copy can read them in parallel and a
retried copy reads the same cut again.

The joiner drives the copy (``dr_join_*``, the Spark job ``sparkapps/xdcr_join.py`` or
``reptables dr join``):

1. ``dr_join_begin``: the table must never have been written on this cluster; what peers already
   shipped to it is cleared; the table is marked *joining* (client writes and peers' changes to it
   are refused meanwhile, so a peer waits, ``waiting_for_snapshot``) and the donor takes the cut.
   Run again, it resumes the same cut.
2. ``dr_join_read`` / ``dr_join_write`` per page: the rows with their versions, written in one SQL
   transaction per page with the page's number, so a page is loaded exactly once.
3. ``dr_join_finish``: once every page is loaded, the sink records become the cut's positions and
   the mark is removed, in one SQL transaction. Each peer's next batch then starts where the cut
   left it (a peer ahead of that point is told to rewind, ``receiver.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from ..errors import ErrorCode, YtError
from ..schema import ColumnType
from ..storage import changes_table, on_rollback, xdcr_rows_table, xdcr_sink_table
from ..tablets import DynamicTable, RowWrite, WriteKind, xdcr
from .host import JOIN_ATTRIBUTE, REWIND_ATTRIBUTE
from .settings import schema_signature
from .state import XdcrState, log

#: rows (and tombstones) per snapshot page
PAGE_ROWS = 5000
#: the version of the joiner's own clean-up deletes: no member's cluster id, so never shipped (the
#: versions they leave are dropped in the same transaction)
HOUSEKEEPING = (0, -1)
#: a snapshot no joiner asked for in this long is removed from the donor
SNAPSHOT_TTL = 3600.0
#: snapshots one member may hold on a donor at once (a join takes one per table; a new cut of the
#: same table replaces the old one)
MAX_SNAPSHOTS_PER_PEER = 4


def _is_snapshot_id(value: Any) -> bool:
    """A snapshot id as donors make them (32 hex digits; letters and digits, 64 at most, are taken)."""
    return isinstance(value, str) and 0 < len(value) <= 64 and value.isascii() and value.isalnum()


def _page_rows(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise YtError(f"Invalid page_rows {str(value)[:40]!r} for a snapshot of {path}: expected 1 to 100000",
                      code=ErrorCode.INVALID_PARAMETER, attributes={"path": path})
    return value


def _write_private(path: Path, text: str) -> None:
    """A file only this user may read (0600, whatever the umask): snapshot pages hold whole rows."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)



class Join:
    """Both sides of a join: the donor's snapshot pages and the joiner's ``dr_join_*`` commands."""

    def __init__(self, state: XdcrState) -> None:
        self.state = state
        #: where snapshot pages are written (made on first use: the data directory's, or a temp dir)
        self._snapshot_dir_root: Path | None = None

    def _snapshot_root(self) -> Path:
        root = self._snapshot_dir_root
        if root is None:
            if self.state.host.data_dir is not None:
                root = self.state.host.data_dir / "xdcr_snapshots"
            else:
                root = Path(tempfile.mkdtemp(prefix="reptables-xdcr-snapshots-"))
            root.mkdir(mode=0o700, exist_ok=True)
            self._snapshot_dir_root = root
        return root

    def snapshot(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        """Take a cut of an XDCR table for a joining member (``caller``, which must be connected)."""
        own = self.state.own_id()
        if caller is not None and caller not in self.state.connections():
            raise YtError(f"Cluster {caller} is not connected to {self.state.name} for XDCR: add it to "
                          f"//sys/@xdcr_connections of {self.state.name} before it joins",
                          code=ErrorCode.XDCR_NOT_CONNECTED)
        table, path, _ = self.state.host.resolve_table(body.get("path"))
        if table.xdcr_cluster_id is None:
            raise YtError(f"Table {path} of cluster {self.state.name} is not an XDCR table",
                          code=ErrorCode.XDCR_NOT_CONNECTED, attributes={"path": path})
        self.state.check_same_schema(table, path, body.get("schema"), caller, "a join")
        page_rows = _page_rows(body.get("page_rows", PAGE_ROWS), path)
        holder = caller or ""
        held = self._snapshots_of(holder)
        for snapshot_id, meta in held.items():
            if meta.get("path") == path:
                # a new cut of the same table for the same member (a restarted join): the old one goes
                shutil.rmtree(self._snapshot_root() / snapshot_id, ignore_errors=True)
        if sum(1 for m in held.values() if m.get("path") != path) >= MAX_SNAPSHOTS_PER_PEER:
            raise YtError(f"Cluster {holder or self.state.name} already holds {MAX_SNAPSHOTS_PER_PEER} XDCR "
                          "snapshots on "
                          f"cluster {self.state.name}: finish or release a join first (unused snapshots expire after "
                          f"{SNAPSHOT_TTL:g} s)", code=ErrorCode.INVALID_PARAMETER,
                          attributes={"path": path, "cluster_name": holder})
        snapshot_id = uuid.uuid4().hex
        directory = self._snapshot_root() / snapshot_id
        directory.mkdir(mode=0o700)
        try:
            summary = self._write_cut(table, directory, own, page_rows)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        meta = {"snapshot_id": snapshot_id, "path": path, "donor": self.state.name, "donor_cluster_id": own, **summary}
        # who it is for: only that member reads or releases it (``_owned``)
        _write_private(directory / "meta.json", json.dumps({**meta, "for": holder}))
        log.info("xdcr snapshot taken", extra={"path": path, "for": caller, "rows": summary["rows"],
                                               "pages": summary["pages"]})
        return meta

    def _write_cut(self, table: DynamicTable, directory: Path, own: int, page_rows: int) -> dict[str, Any]:
        """Rows, versions and positions of ``table`` in one SQL read transaction, as numbered pages."""
        booleans = [c.name for c in table.schema.columns if c.type is ColumnType.BOOLEAN]
        v = xdcr_rows_table.c
        pages = rows = tombstones = 0
        with self.state.storage.read() as conn:
            c = changes_table.c
            # the read transaction's snapshot starts with its first statement; under the storage
            # writer, so that no trim of the log falls between it and the trimmed position read
            # with it (a log trimmed to nothing still has a position: where it was trimmed)
            with self.state.storage.write_lock:
                newest = conn.execute(sa.select(c.timestamp, c.seq).where(c.table_id == table.table_id)
                                      .order_by(c.timestamp.desc(), c.seq.desc()).limit(1)).first()
                trimmed = table.changes_trimmed
            s = xdcr_sink_table.c
            positions = {str(r[0]): [int(r[1]), int(r[2])] for r in conn.execute(
                sa.select(s.origin_cluster_id, s.timestamp, s.seq).where(s.table_id == table.table_id))}
            logged = (0, 0) if newest is None else (int(newest[0]), int(newest[1]))
            positions[str(own)] = list(max(logged, trimmed))
            result = conn.execute(sa.select(v.row_key, v.timestamp, v.cluster_id, v.deleted, v.horizon_timestamp,
                                            v.horizon_cluster_id).where(v.table_id == table.table_id)
                                  .order_by(v.row_key))
            while True:
                chunk = result.fetchmany(page_rows)
                if not chunk:
                    break
                keys = [tuple(orjson.loads(r[0])) for r in chunk]
                live = [k for k, r in zip(keys, chunk, strict=True) if not r[3]]
                images = dict(zip(live, table.lookup(conn, live, None), strict=True)) if live else {}
                entries = []
                for key, r in zip(keys, chunk, strict=True):
                    image = None if r[3] else images.get(key)
                    if image is not None:
                        for name in booleans:
                            if image.get(name) is not None:
                                image[name] = bool(image[name])
                    entries.append({"key": list(key), "row": image, "v": [int(r[1]), int(r[2])], "d": bool(r[3]),
                                    "h": None if r[4] is None else [int(r[4]), int(r[5])]})
                    rows += image is not None
                    tombstones += image is None
                _write_private(directory / f"{pages}.json", json.dumps(entries))
                pages += 1
        return {"pages": pages, "rows": rows, "tombstones": tombstones, "positions": positions}

    def _snapshot_dir(self, snapshot_id: Any) -> Path:
        if not _is_snapshot_id(snapshot_id):
            raise YtError("Malformed snapshot_id", code=ErrorCode.PROTOCOL_ERROR)
        directory = self._snapshot_root() / snapshot_id
        if not (directory / "meta.json").exists():
            raise YtError(f"XDCR snapshot {snapshot_id} is not on cluster {self.state.name} (expired after "
                          f"{SNAPSHOT_TTL:g} s unused, or released): begin the join again with restart",
                          code=ErrorCode.RESOLVE_ERROR, attributes={"snapshot_id": snapshot_id})
        return directory

    def _snapshots_of(self, holder: str) -> dict[str, dict[str, Any]]:
        """The snapshots on this donor that member ``holder`` holds, by id, with their meta."""
        root = self._snapshot_root()
        out = {}
        for directory in root.iterdir():
            try:
                meta = json.loads((directory / "meta.json").read_text())
            except (OSError, ValueError):
                continue  # being written, or being removed
            if isinstance(meta, dict) and meta.get("for") == holder:
                out[directory.name] = meta
        return out

    def _owned(self, snapshot_id: Any, caller: str | None) -> tuple[Path, dict[str, Any]]:
        """The directory and meta of a snapshot the calling member holds (None: in process)."""
        directory = self._snapshot_dir(snapshot_id)
        meta = json.loads((directory / "meta.json").read_text())
        if caller is not None and meta.get("for") != caller:
            raise YtError(f"XDCR snapshot {snapshot_id} on cluster {self.state.name} was taken for another cluster: "
                          f"cluster {caller} may not read or release it", code=ErrorCode.AUTHORIZATION_ERROR,
                          http_status=403, attributes={"snapshot_id": snapshot_id, "cluster_name": caller})
        return directory, meta

    def snapshot_read(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        directory, meta = self._owned(body.get("snapshot_id"), caller)
        page = body.get("page")
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < int(meta["pages"]):
            raise YtError(f"XDCR snapshot {meta['snapshot_id']} has pages 0 to {int(meta['pages']) - 1}, not "
                          f"{str(page)[:40]!r}", code=ErrorCode.INVALID_PARAMETER)
        (directory / "meta.json").touch()  # in use: not expired
        return {"page": page, "entries": json.loads((directory / f"{page}.json").read_text())}

    def snapshot_release(self, body: dict[str, Any], caller: str | None) -> dict[str, Any]:
        snapshot_id = body.get("snapshot_id")
        if not isinstance(snapshot_id, str) or not _is_snapshot_id(snapshot_id):
            raise YtError("Malformed xdcr_snapshot_release: snapshot_id required", code=ErrorCode.PROTOCOL_ERROR)
        if (self._snapshot_root() / snapshot_id / "meta.json").exists():
            directory, _ = self._owned(snapshot_id, caller)
            shutil.rmtree(directory, ignore_errors=True)
        return {}

    def expire_snapshots(self) -> None:
        """Remove the snapshots nobody read for ``SNAPSHOT_TTL`` (a joiner that gave up)."""
        root = self._snapshot_dir_root
        if root is None and self.state.host.data_dir is not None:
            root = self.state.host.data_dir / "xdcr_snapshots"
        if root is None or not root.exists():
            return
        cutoff = time.time() - SNAPSHOT_TTL
        for directory in root.iterdir():
            meta = directory / "meta.json"
            # (one still being written has no meta.json yet: its directory is new)
            used = meta.stat().st_mtime if meta.exists() else directory.stat().st_mtime
            if used < cutoff:
                shutil.rmtree(directory, ignore_errors=True)

    def _join_state(self, path: Any) -> tuple[DynamicTable, str, Any, dict[str, Any] | None]:
        table, table_path, node = self.state.host.resolve_table(path)
        if table.xdcr_cluster_id is None:
            raise YtError(f"Table {table_path} of cluster {self.state.name} is not an XDCR table (create it with "
                          "xdcr=%true, while empty)", code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        state = node.attributes.get(JOIN_ATTRIBUTE)
        return table, table_path, node, state if isinstance(state, dict) else None

    def _donor(self, source: Any) -> str:
        """The donor: ``source``, else ``//sys/@xdcr_preferred_source`` (a cluster name or id), else
        the first connection."""
        connections = self.state.connections()
        preferred = source if source is not None else self.state.sys_attr("xdcr_preferred_source")
        if preferred is None:
            if not connections:
                raise YtError(f"Cluster {self.state.name} has no XDCR connections: set //sys/@xdcr_connections before "
                              "joining", code=ErrorCode.XDCR_NOT_CONNECTED)
            return connections[0]
        if isinstance(preferred, int) and not isinstance(preferred, bool):
            # the seed names the preferred source by its cluster id: ask each connection its id
            for peer in connections:
                try:
                    if self.state.peer_cluster_id(peer) == preferred:
                        return peer
                except YtError:
                    continue
            raise YtError(f"No XDCR connection of cluster {self.state.name} has cluster id {preferred} "
                          f"(xdcr_preferred_source); connections: {connections}", code=ErrorCode.RESOLVE_ERROR)
        if preferred not in connections:
            raise YtError(f"Cluster {preferred} is not an XDCR connection of cluster {self.state.name} (connections: "
                          f"{connections}): it cannot be the join's source", code=ErrorCode.RESOLVE_ERROR,
                          attributes={"cluster_name": str(preferred)})
        return str(preferred)

    def dr_join_begin(self, path: Any, source: str | None = None, page_rows: int = PAGE_ROWS,
                      restart: bool = False) -> dict[str, Any]:
        """Mark the table joining and have the donor take a cut; resumes a join already begun
        (``restart``: a new cut, e.g. after the donor's expired)."""
        own = self.state.own_id()
        table, table_path, node, state = self._join_state(path)
        page_rows = _page_rows(page_rows, table_path)  # (checked here: a refusal must change nothing)
        if state is not None and state.get("snapshot") and not restart and source in (None, state["source"]):
            return self._join_summary(table_path, state)
        donor = self._donor(source)
        with self.state.storage.read() as conn:
            written_here = conn.execute(sa.select(sa.func.count()).select_from(xdcr_rows_table).where(
                xdcr_rows_table.c.table_id == table.table_id, xdcr_rows_table.c.cluster_id == own)).scalar()
        if written_here:
            raise YtError(f"Table {table_path} of cluster {self.state.name} holds {written_here} rows written on this "
                          "cluster: only a table never written here can join from a snapshot (its own changes would "
                          "be lost)", code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        # mark first (peers' changes to it are refused from now on), then clear what peers shipped
        with self.state.storage.write() as conn:
            node.attributes[JOIN_ATTRIBUTE] = {"source": donor, "snapshot": None, "loaded": []}
            self.state.cypress.save(conn, node)
        with self.state.storage.write() as conn:
            keys = [tuple(orjson.loads(r[0])) for r in conn.execute(sa.select(xdcr_rows_table.c.row_key).where(
                xdcr_rows_table.c.table_id == table.table_id, xdcr_rows_table.c.deleted.is_(False)))]
            if keys:
                deletes = []
                for k in keys:
                    write = RowWrite(WriteKind.DELETE, dict(zip(table.schema.key_names, k, strict=True)), 1)
                    write.origin = HOUSEKEEPING  # no member's change: never shipped
                    deletes.append(write)
                table.apply(conn, deletes, self.state.timestamps.generate(), 0)
            xdcr.drop_versions(conn, table.table_id)
            conn.execute(xdcr_sink_table.delete().where(xdcr_sink_table.c.table_id == table.table_id))
        try:
            snapshot = self.state.peers.client(donor).call("xdcr_snapshot", {
                "path": table_path, "schema": schema_signature(table.schema), "page_rows": page_rows},
                timeout=max(self.state.config.push_timeout, 600.0))
        except YtError as exc:
            raise YtError(f"Cluster {donor} could not take a snapshot of {table_path} for {self.state.name} to join: "
                          f"{exc.message}", code=exc.code if exc.code else ErrorCode.GENERIC,
                          attributes={"path": table_path, "source": donor}) from None
        snapshot = self._checked_snapshot(snapshot, donor, table_path)
        state = {"source": donor, "snapshot": snapshot, "loaded": []}
        with self.state.storage.write() as conn:
            node.attributes[JOIN_ATTRIBUTE] = state
            self.state.cypress.save(conn, node)
        log.info("xdcr join begun", extra={"path": table_path, "source": donor, "pages": snapshot["pages"]})
        return self._join_summary(table_path, state)

    def _checked_snapshot(self, snapshot: Any, donor: str, path: str) -> dict[str, Any]:
        """The donor's answer to ``xdcr_snapshot``, checked as any peer input: its positions become
        this cluster's sink records at the end of the join, so each must be a member's id and a
        position not past this cluster's clock bound."""
        bounds = xdcr.Bounds.ahead_of_now(self.state.config.max_peer_clock_skew)
        try:
            if not isinstance(snapshot, dict):
                raise ValueError("the answer is not a map")
            snapshot_id = snapshot.get("snapshot_id")
            if not _is_snapshot_id(snapshot_id):
                raise ValueError("snapshot_id must be up to 64 letters and digits")
            for name in ("pages", "rows", "tombstones"):
                value = snapshot.get(name)
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 40:
                    raise ValueError(f"{name} must be a count")
            positions = snapshot.get("positions")
            if not isinstance(positions, dict):
                raise ValueError("positions must be a map")
            checked = {}
            for origin, position in positions.items():
                if not isinstance(origin, str) or not origin.isdigit() or not 0 <= int(origin) <= xdcr.MAX_CLUSTER_ID:
                    raise ValueError(f"positions names {str(origin)[:20]!r}, not a cluster id")
                checked[origin] = list(xdcr.parse_position(position, f"positions[{origin}]", bounds))
        except (ValueError, YtError) as exc:
            message = exc.message if isinstance(exc, YtError) else str(exc)
            raise YtError(f"Cluster {donor} answered the snapshot of {path} for {self.state.name} with a malformed "
                          "cut: "
                          f"{message}", code=ErrorCode.PROTOCOL_ERROR, attributes={"path": path, "source": donor}) \
                from None
        return {**snapshot, "positions": checked}

    @staticmethod
    def _join_summary(path: str, state: dict[str, Any]) -> dict[str, Any]:
        snapshot = state.get("snapshot") or {}
        pages = int(snapshot.get("pages", 0))
        loaded = sorted(int(p) for p in state.get("loaded", []))
        done = set(loaded)
        return {"path": path, "source": state["source"], "snapshot_id": snapshot.get("snapshot_id"), "pages": pages,
                "rows": int(snapshot.get("rows", 0)), "tombstones": int(snapshot.get("tombstones", 0)),
                "loaded_pages": loaded, "missing_pages": [p for p in range(pages) if p not in done]}

    def _begun(self, path: Any) -> tuple[DynamicTable, str, Any, dict[str, Any]]:
        table, table_path, node, state = self._join_state(path)
        if state is None or not state.get("snapshot"):
            raise YtError(f"Table {table_path} of cluster {self.state.name} is not joining: run dr_join_begin first",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        return table, table_path, node, state

    def dr_join_read(self, path: Any, page: int) -> dict[str, Any]:
        """One page of the donor's cut (read through this cluster: it holds the credential)."""
        _, table_path, _, state = self._begun(path)
        snapshot = state["snapshot"]
        try:
            answer: dict[str, Any] = self.state.peers.client(state["source"]).call(
                "xdcr_snapshot_read", {"snapshot_id": snapshot["snapshot_id"], "page": page}, timeout=120.0)
        except YtError as exc:
            raise YtError(f"Cluster {state['source']} could not give page {page} of the snapshot of {table_path}: "
                          f"{exc.message}", code=exc.code, attributes={"path": table_path}) from None
        return answer

    def dr_join_write(self, path: Any, page: int, entries: list[Any]) -> dict[str, Any]:
        """Load one page of the cut exactly once (rows with their versions; tombstones)."""
        table, table_path, node, state = self._begun(path)
        pages = int(state["snapshot"]["pages"])
        if isinstance(page, bool) or not isinstance(page, int) or not 0 <= page < pages:
            raise YtError(f"The snapshot of {table_path} has pages 0 to {pages - 1}, not {page!r}",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        writes, tombstones = self._page_writes(table, table_path, entries, page,
                                               xdcr.Bounds.ahead_of_now(self.state.config.max_peer_clock_skew))
        newest = max([w.origin[0] for w in writes if w.origin] + [v.version[0] for v in tombstones.values()],
                     default=0)
        self.state.host.check_peer_writes(table, table_path, writes, f"page {page} of the snapshot of {table_path}")
        if newest:
            self.state.clock.observe(newest)  # this cluster's next changes are later than all it holds

        def check(conn: sa.Connection) -> tuple[Any, Any] | None:
            return (page, 0) if page in node.attributes[JOIN_ATTRIBUTE]["loaded"] else None

        def record(conn: sa.Connection, _newest: int) -> None:
            xdcr.write_versions(conn, table.table_id, tombstones)
            state = dict(node.attributes[JOIN_ATTRIBUTE])
            before = list(state["loaded"])
            state["loaded"] = sorted({*before, page})
            node.attributes[JOIN_ATTRIBUTE] = state
            self.state.cypress.save(conn, node)
            self._on_rollback_restore(conn, node, before)

        answer = self.state.transactions.apply_replicated(table, [(0, writes)] if writes else [], False, 0, check=check,
                                                    expected=None, record=record, end=page)
        return {"page": page, "applied": bool(answer.get("applied")), "rows": len(writes),
                "tombstones": len(tombstones)}

    @staticmethod
    def _on_rollback_restore(conn: sa.Connection, node: Any, before: list[int]) -> None:
        def undo() -> None:
            state = node.attributes.get(JOIN_ATTRIBUTE)
            if isinstance(state, dict):
                node.attributes[JOIN_ATTRIBUTE] = {**state, "loaded": before}

        on_rollback(conn, undo)

    @staticmethod
    def _page_writes(table: DynamicTable, path: str, entries: Any, page: int, bounds: xdcr.Bounds,
                     ) -> tuple[list[RowWrite], dict[tuple[Any, ...], xdcr.RowVersion]]:
        """A page's rows and tombstones, each with its version; every version range-checked
        (``bounds``: they move this cluster's version clock)."""
        if not isinstance(entries, list):
            raise YtError(f"Malformed page {page} of the snapshot of {path}: expected a list of entries",
                          code=ErrorCode.PROTOCOL_ERROR)
        writes: list[RowWrite] = []
        tombstones: dict[tuple[Any, ...], xdcr.RowVersion] = {}
        key_names = table.schema.key_names
        for i, entry in enumerate(entries):
            try:
                if not isinstance(entry, dict):
                    raise ValueError("an entry is a map")
                version = xdcr.parse_version(entry["v"], "v", bounds)
                horizon = None if entry.get("h") is None else xdcr.parse_version(entry["h"], "h", bounds)
                if horizon is not None and horizon > version:
                    raise ValueError("h (the delete horizon) is after the version")
                if not isinstance(entry["d"], bool):
                    raise ValueError("d (deleted) is a boolean")
                if entry["d"]:
                    key = tuple(entry["key"])
                    if len(key) != len(key_names):
                        raise ValueError("the key has the wrong number of columns")
                    tombstones[key] = xdcr.RowVersion(version, True, version)
                    continue
                row = entry["row"]
                if not isinstance(row, dict):
                    raise ValueError("a live row is a map")
            except (KeyError, TypeError, ValueError, IndexError, YtError) as exc:
                message = exc.message if isinstance(exc, YtError) else str(exc)
                raise YtError(f"Malformed entry {i} of page {page} of the snapshot of {path}: {message}",
                              code=ErrorCode.PROTOCOL_ERROR) from None
            write = RowWrite(WriteKind.WRITE, dict(row), table.schema.full_lock_mask)
            write.origin, write.origin_horizon = version, horizon
            writes.append(write)
        return writes, tombstones

    def dr_join_finish(self, path: Any) -> dict[str, Any]:
        """Every page loaded: the sink records become the cut's positions and the table is a member."""
        table, table_path, node, state = self._begun(path)
        summary = self._join_summary(table_path, state)
        if summary["missing_pages"]:
            raise YtError(f"The join of {table_path} misses {len(summary['missing_pages'])} of {summary['pages']} "
                          f"pages of the snapshot (first: {summary['missing_pages'][:10]}): load them first",
                          code=ErrorCode.INVALID_PARAMETER, attributes={"path": table_path})
        snapshot = state["snapshot"]
        positions = {int(k): (int(p[0]), int(p[1])) for k, p in snapshot["positions"].items()}
        own = self.state.own_id()
        with self.state.storage.write() as conn:
            conn.execute(xdcr_sink_table.delete().where(xdcr_sink_table.c.table_id == table.table_id))
            for origin, position in positions.items():
                if origin != own:
                    conn.execute(xdcr_sink_table.insert().values(table_id=table.table_id, origin_cluster_id=origin,
                                                                 timestamp=position[0], seq=position[1]))
            node.attributes.pop(JOIN_ATTRIBUTE, None)
            node.attributes[REWIND_ATTRIBUTE] = sorted(o for o in positions if o != own)
            self.state.cypress.save(conn, node)
        try:
            self.state.peers.client(state["source"]).call("xdcr_snapshot_release",
                                                    {"snapshot_id": snapshot["snapshot_id"]}, timeout=10.0)
        except YtError:
            pass  # it expires on the donor
        log.info("xdcr join finished", extra={"path": table_path, "source": state["source"]})
        return {**summary, "joined": True}

    def joining_tables(self) -> dict[str, dict[str, Any]]:
        """The tables being joined, with their progress (``dr_status``)."""
        out = {}
        for node in list(self.state.cypress.by_id.values()):
            state = node.attributes.get(JOIN_ATTRIBUTE)
            if node.table is not None and isinstance(state, dict):
                out[node.path] = self._join_summary(node.path, state)
        return out
