"""Corruption is never silent, and the data files are private.

A data directory that held a cluster refuses to start without its data (database missing,
truncated, garbage, damaged, lacking its metadata or a table, a write-ahead log deleted after a
kill) instead of starting as an empty, ready cluster; damage met at run time answers a 5xx and
fails ``/readyz`` until a restart; the directory is 0700 and its files 0600 (the database and its
WAL hold peer tokens). Each test runs real engine processes on its own directory: a refused start
is a process that exits non-zero and logs one line naming the directory and the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from reptables.engine.client import Client
from reptables.engine.node import Cluster
from reptables.testing import EngineProcess

SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"}]
TABLE = "//tmp/t"


def _fill(engine: EngineProcess, first: int, count: int, width: int = 10) -> None:
    with Client(engine.url, engine.token) as client:
        if not client.exists(TABLE):
            client.create("table", TABLE, attributes={"dynamic": True, "schema": SCHEMA})
            client.mount_table(TABLE)
        client.insert_rows(TABLE, [{"k": k, "v": f"{k:0{width}d}"} for k in range(first, first + count)])


def _keys(engine: EngineProcess) -> set[int]:
    with Client(engine.url, engine.token) as client:
        return {r["k"] for r in client.select_rows(f"k from [{TABLE}]")}


def _log_lines(engine: EngineProcess, message: str) -> list[dict]:
    lines = []
    for line in engine.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and message in line:
            record = json.loads(line)
            if record.get("message") == message:
                lines.append(record)
    return lines


def _assert_refused(engine: EngineProcess, reason: str) -> None:
    """The engine exits non-zero at start-up with one log line naming its directory and ``reason``."""
    try:
        engine.start()
    except RuntimeError as exc:
        assert "exited with" in str(exc), str(exc)
    else:
        engine.stop()
        pytest.fail(f"the engine started on {engine.data_dir}")
    assert engine.proc is not None and engine.proc.returncode != 0
    refused = _log_lines(engine, "data directory refused")
    assert len(refused) == 1, engine.log_path.read_text()[-3000:]
    assert str(engine.data_dir) in refused[0]["reason"]
    assert reason in refused[0]["reason"]


def _user_table(database: Path) -> tuple[str, int]:
    """The SQL name and root page of the (only) user table."""
    with closing(sqlite3.connect(database)) as db:
        name, root = db.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table' "
                                "AND name LIKE 'rt_t%' AND name NOT LIKE '%_versions'").fetchone()
    return str(name), int(root)


def _checkpoint(database: Path) -> None:
    """Move every page of the write-ahead log into the database file (the log stays while the
    engine has the database open)."""
    with closing(sqlite3.connect(database)) as db:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0


def _damage_page(database: Path, page: int) -> None:
    with closing(sqlite3.connect(database)) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    with open(database, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"\xff" * page_size)


@pytest.fixture(scope="module")
def held_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory that held a cluster (a table with 300 rows), closed cleanly: the log
    checkpointed into the database file and removed, the marker saying "stopped"."""
    path = tmp_path_factory.mktemp("held") / "data"
    engine = EngineProcess("held", path).start()
    try:
        _fill(engine, 0, 300, width=200)
    finally:
        engine.stop()
    # the engine process does not close its database on SIGTERM (uvicorn re-raises the signal once
    # it has stopped serving), so the clean close happens here
    Cluster.open("held", path).close()
    assert not (path / "engine.sqlite-wal").exists()
    return path


def _missing(path: Path) -> None:
    (path / "engine.sqlite").unlink()


def _truncated(path: Path) -> None:
    os.truncate(path / "engine.sqlite", 0)


def _garbage(path: Path) -> None:
    database = path / "engine.sqlite"
    database.write_bytes(os.urandom(database.stat().st_size))


def _damaged_page(path: Path) -> None:
    _damage_page(path / "engine.sqlite", _user_table(path / "engine.sqlite")[1])


def _lost_table(path: Path) -> None:
    name, _ = _user_table(path / "engine.sqlite")
    with closing(sqlite3.connect(path / "engine.sqlite")) as db:
        db.execute(f"DROP TABLE {name}")
        db.commit()


def _sql(statement: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with closing(sqlite3.connect(path / "engine.sqlite")) as db:
            db.execute(statement)
            db.commit()
    return damage


def _damaged_marker(path: Path) -> None:
    (path / "engine.marker").write_text("{not json")


def _damaged_reservation(path: Path) -> None:
    (path / "timestamp.reservation").write_text("9223372036854775807\n")


@pytest.mark.parametrize(("damage", "reason"), [
    pytest.param(_missing, "its database engine.sqlite is missing", id="database-deleted"),
    pytest.param(_truncated, "its database engine.sqlite is empty (0 bytes)", id="truncated-to-0-bytes"),
    pytest.param(_garbage, "is not a SQLite database", id="garbage-file"),
    pytest.param(_damaged_page, "failed SQLite's integrity check", id="damaged-page"),
    pytest.param(_sql("DELETE FROM _rt_meta WHERE name = 'cluster_name'"), "lacks its metadata (cluster_name)",
                 id="metadata-row-deleted"),
    pytest.param(_sql("DROP TABLE _rt_tablets"), "lacks the system tables _rt_tablets", id="system-table-dropped"),
    pytest.param(_sql("DELETE FROM _rt_nodes"), "has no Cypress nodes", id="cypress-nodes-deleted"),
    pytest.param(_sql("UPDATE _rt_meta SET value = 'another' WHERE name = 'database_id'"),
                 "belongs to another data directory", id="database-of-another-directory"),
    pytest.param(_damaged_marker, "its marker engine.marker is damaged", id="marker-damaged"),
    pytest.param(_lost_table, f"lacks the SQL tables of {TABLE}", id="table-dropped"),
    pytest.param(_damaged_reservation, "timestamp reservation", id="reservation-out-of-range"),
])
def test_a_data_dir_that_held_a_cluster_refuses_to_start_without_its_data(
        held_dir: Path, tmp_path: Path, damage: Callable[[Path], None], reason: str) -> None:
    path = tmp_path / "data"
    shutil.copytree(held_dir, path)
    damage(path)
    before = sorted(p.name for p in path.iterdir() if p.name != "engine.log")
    database = path / "engine.sqlite"
    size = database.stat().st_size if database.exists() else None

    _assert_refused(EngineProcess("held", path), reason)

    # nothing created: no new database in place of the lost one, no empty one filled
    assert sorted(p.name for p in path.iterdir() if p.name != "engine.log") == before
    assert (database.stat().st_size if database.exists() else None) == size


def test_the_untouched_copy_of_a_data_dir_starts_with_its_rows(held_dir: Path, tmp_path: Path) -> None:
    """The control for the refusals above: the same directory, undamaged, serves its rows (and
    a clean close, which removed the write-ahead log, is no lost log)."""
    path = tmp_path / "data"
    shutil.copytree(held_dir, path)
    assert not (path / "engine.sqlite-wal").exists()
    engine = EngineProcess("held", path).start()
    try:
        assert _keys(engine) == set(range(300))
    finally:
        engine.stop()


def test_a_wal_deleted_after_a_kill_is_refused(tmp_path: Path) -> None:
    engine = EngineProcess("wal", tmp_path / "wal")
    wal = engine.data_dir / "engine.sqlite-wal"
    engine.start()
    try:
        _fill(engine, 0, 100)
        _checkpoint(engine.data_dir / "engine.sqlite")  # rows 0-99 are in the database file
        _fill(engine, 100, 100)  # acknowledged: durable in the log, not yet in the database
    finally:
        engine.kill()
    assert wal.exists()
    wal.unlink()
    (engine.data_dir / "engine.sqlite-shm").unlink(missing_ok=True)

    _assert_refused(engine, "did not stop cleanly, but the write-ahead log engine.sqlite-wal is missing")

    # what the refusal kept from being silent: removing the marker accepts the database as it is,
    # and the acknowledged rows of the last run are gone
    (engine.data_dir / "engine.marker").unlink()
    engine.start()
    try:
        assert _keys(engine) == set(range(100))
    finally:
        engine.stop()


def test_damage_met_at_run_time_answers_5xx_and_fails_readyz_until_a_restart(tmp_path: Path) -> None:
    engine = EngineProcess("damaged", tmp_path / "damaged").start()
    try:
        _fill(engine, 0, 2000, width=100)
        database = engine.data_dir / "engine.sqlite"
        _checkpoint(database)
        _damage_page(database, _user_table(database)[1])
        with Client(engine.url, engine.token) as client:
            client.create("map_node", "//tmp/after")  # a write: every reader drops its cached pages

        headers = {"Authorization": f"OAuth {engine.token}", "X-YT-Header-Format": "json",
                   "X-YT-Parameters": json.dumps({"query": f"k, v from [{TABLE}]", "output_format": "json"})}
        with httpx.Client(base_url=engine.url, timeout=10) as http:
            answer = http.get("/api/v4/select_rows", headers=headers)
            assert answer.status_code == 500, answer.text
            error = answer.json()
            assert error["code"] == 711
            assert "damaged" in error["message"] and "malformed" in error["message"]
            for _ in range(2):  # and it stays so: the intact pages do not make it look healthy
                ready = http.get("/readyz")
                assert ready.status_code == 503
                assert "damaged" in ready.json()["reason"]
            assert http.get("/healthz").status_code == 200  # alive: a restart is the operator's call
        assert len(_log_lines(engine, "the database file is damaged: this engine reports itself unready "
                                      "until it is restarted")) == 1
    finally:
        engine.stop()
    # the restart checks the file again, and refuses it
    _assert_refused(engine, "failed SQLite's integrity check")


def test_the_data_dir_and_its_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "private"
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)  # an existing directory open to others is made private
    names = ["engine.sqlite", "engine.sqlite-wal", "engine.sqlite-shm", "token", "timestamp.reservation",
             "engine.marker", "engine.log"]

    def modes() -> dict[str, str]:
        return {name: oct(stat.S_IMODE((path / name).stat().st_mode)) for name in names}

    engine = EngineProcess("private", path).start()
    try:
        _fill(engine, 0, 10)  # writes the timestamp reservation and the WAL
        assert modes() == dict.fromkeys(names, "0o600")
        assert oct(stat.S_IMODE(path.stat().st_mode)) == "0o700"
    finally:
        engine.stop()
    # files left readable by an older engine (or by hand) are made private at the next start; a
    # clean stop checkpointed and removed the WAL and SHM, so they are checked again once recreated
    for name in names:
        if (path / name).exists():
            os.chmod(path / name, 0o644)
    engine.start()
    try:
        _fill(engine, 10, 20)
        assert modes() == dict.fromkeys(names, "0o600")
    finally:
        engine.stop()
