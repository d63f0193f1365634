"""Nothing under a data directory is readable by another user: every file 0600, every directory 0700.

The database, its WAL and the token file hold tokens; the XDCR conflict logs
(``xdcr_conflicts/LOG_<date>.csv``) and the snapshot pages a donor writes for a joining member
(``xdcr_snapshots/<id>/<page>.json``) hold table rows. They were once created 0644 (written with the
default mode); the engine now runs with the umask 0o077, so every file it creates is private,
whichever code creates it. Two real engines of an XDCR pair make a conflict and a snapshot; then
both data directories are walked.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reptables.engine.credentials import peer_credential
from reptables.testing import wait_for
from tests.xdcr.conftest import SCHEMA, XdcrGroup

PATH = "//tmp/users"
#: the signature of SCHEMA as an XDCR peer sends it (engine/xdcr/settings.py, schema_signature)
SIGNATURE = [{"name": c["name"], "type": c["type"], "sort_order": c.get("sort_order"), "required": False}
             for c in SCHEMA]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    """a and b with a conflict logged on both, and a snapshot of ``PATH`` taken on a for b."""
    group = XdcrGroup(tmp_path_factory.mktemp("modes")).start()
    try:
        group.connect()
        group.table(PATH)
        group.client("a").insert_rows(PATH, [{"id": 1, "name": "Joe Smith", "password": "abalone"}])
        wait_for(lambda: len(group.rows("b", PATH)) == 1, 20, "the row on b")
        for name in group.names:
            group.client(name).set("//sys/@xdcr_connections", [])
        time.sleep(0.7)  # the shippers notice and stop
        group.client("b").insert_rows(PATH, [{"id": 1, "name": "Joe Smith", "password": "flounder"}])
        time.sleep(0.01)
        group.client("a").insert_rows(PATH, [{"id": 1, "name": "Joseph Smith", "password": "abalone"}])
        group.connect()
        wait_for(lambda: all(list((e.data_dir / "xdcr_conflicts").glob("LOG_*.csv"))
                             for e in group.engines.values()), 20, "a conflict log CSV on both clusters")
        donor = group.engines["a"]
        answer = httpx.post(f"{donor.url}/internal/v1/xdcr_snapshot", json={"path": PATH, "schema": SIGNATURE},
                            headers={"Authorization": f"OAuth {peer_credential(donor.read_token(), 'b')}"},
                            timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["pages"] >= 1
        yield group
    finally:
        group.stop()


def modes(root: Path) -> dict[str, str]:
    """The mode of every file and directory under ``root`` (itself included), by relative path."""
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def test_every_file_under_a_data_directory_is_0600_and_every_directory_0700(pair: XdcrGroup) -> None:
    for engine in pair.engines.values():
        found = modes(engine.data_dir)
        assert any(p.startswith("xdcr_conflicts/LOG_") for p in found), found
        loose = {p: mode for p, mode in found.items()
                 if mode != ("0o700" if (engine.data_dir / p).is_dir() else "0o600")}
        assert not loose, f"{engine.cluster_name}: {loose}"
    pages = [p for p in modes(pair.engines["a"].data_dir) if p.startswith("xdcr_snapshots/") and p.endswith(".json")]
    assert any(p.endswith("/0.json") for p in pages) and any(p.endswith("/meta.json") for p in pages), pages
