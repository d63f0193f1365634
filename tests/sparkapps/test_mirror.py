"""The change-stream source and the mirror job, against a real engine, real Spark and a real PostgreSQL 15.

What users rely on: ``readStream.format("reptables-changes")`` delivers a table's changes in change
order with their tokens, and a query restarted from its checkpoint continues exactly after the last
batch it completed; the mirror job, killed with SIGKILL while writes go on and started again from
its checkpoint, never copies the snapshot twice and ends with a PostgreSQL table equal to the table,
row for row and value for value; a table it cannot mirror is refused with the reason.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadMaxRows

from reptables.engine.client import Client
from reptables.engine.errors import YtError
from reptables.sparkapps.changes_source import ChangeRange, ChangesOptions, ChangesStreamReader, PulledChanges
from reptables.testing import WaitTimeout, wait_for
from tests.harness import EngineProcess

from .conftest import client_of, create_table, table_name

SCHEMA = [
    {"name": "k", "type": "int64", "sort_order": "ascending"},
    {"name": "name", "type": "string"},
    {"name": "score", "type": "double"},
    {"name": "ratio", "type": "float"},
    {"name": "small", "type": "int16"},
    {"name": "flag", "type": "boolean"},
    {"name": "tags", "type": "any"},
]
COLUMNS = [c["name"] for c in SCHEMA]
KEYS = 400


@pytest.fixture
def engine(shared_engine: EngineProcess) -> EngineProcess:
    return shared_engine


def make_row(k: int, version: int) -> dict[str, Any]:
    return {"k": k, "name": f"n{k}-v{version} ü\"\\", "score": k * 1.5 + version / 3, "ratio": (k % 8) / 4,
            "small": (k * 37 + version) % 30000 - 15000, "flag": (k + version) % 2 == 0,
            "tags": None if version % 5 == 0 else {"v": version, "list": [k, "x", None, 2.5]}}


def collect_stream(spark: SparkSession, engine: EngineProcess, path: str, checkpoint: Path,
                   **options: str) -> list[dict[str, Any]]:
    """Run a ``reptables-changes`` query to the changes committed so far (Trigger.AvailableNow); its rows."""
    got: list[dict[str, Any]] = []

    def keep(batch: DataFrame, batch_id: int) -> None:
        got.extend(r.asDict() for r in batch.collect())

    reader = (spark.readStream.format("reptables-changes").option("proxy", engine.url)
              .option("token", engine.read_token()).option("path", path))
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.foreachBatch(keep).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the query did not finish"
    return got


def test_change_stream_source_delivers_changes_in_order_and_resumes_after_its_checkpoint(
        spark: SparkSession, engine: EngineProcess, tmp_path: Path) -> None:
    path = table_name("changes")
    create_table(engine, path, SCHEMA[:3], change_log=True)
    with client_of(engine) as client:
        client.insert_rows(path, [{"k": 1, "name": "before", "score": 0.0}])  # before the start: not streamed
        start = client.generate_timestamp()
        client.insert_rows(path, [{"k": 1, "name": "a", "score": 1.5}, {"k": 2, "name": "b", "score": float("inf")}])
        client.insert_rows(path, [{"k": 2, "name": "b2"}], update=True)
        client.delete_rows(path, [{"k": 1}])

    first = collect_stream(spark, engine, path, tmp_path / "ckpt", from_timestamp=str(start),
                           max_rows_per_batch="2")
    assert [(c["kind"], json.loads(c["key"])) for c in first] == [
        ("update", {"k": 1}), ("insert", {"k": 2}), ("update", {"k": 2}), ("delete", {"k": 1})]
    assert json.loads(first[0]["row"]) == {"k": 1, "name": "a", "score": 1.5}
    assert json.loads(first[1]["row"]) == {"k": 2, "name": "b", "score": float("inf")}
    assert json.loads(first[2]["row"]) == {"k": 2, "name": "b2", "score": float("inf")}  # the full new row
    assert first[3]["row"] is None
    tokens = [c["event_token"] for c in first]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    assert all(c["timestamp"] > start and c["timestamp"] == int(c["event_token"][:16], 16) for c in first)

    with client_of(engine) as client:
        client.insert_rows(path, [{"k": 3, "name": "c", "score": 3.0}])
    again = collect_stream(spark, engine, path, tmp_path / "ckpt", from_timestamp=str(start))
    assert [(c["kind"], json.loads(c["key"])) for c in again] == [("insert", {"k": 3})]
    assert again[0]["event_token"] > tokens[-1]


def test_a_replayed_micro_batch_reads_the_same_changes_again(engine: EngineProcess) -> None:
    """After a restart Spark replays a logged batch whose changes are no longer in memory: the task pulls
    the range (start, end] again and gets exactly the changes the first pull had."""
    path = table_name("replayed")
    create_table(engine, path, SCHEMA[:3], change_log=True)
    with client_of(engine) as client:
        start = client.generate_timestamp()
        for i in range(5):
            client.insert_rows(path, [{"k": i, "name": f"r{i}"}, {"k": 100 + i, "name": "x"}])
        client.delete_rows(path, [{"k": 0}])
    options = ChangesOptions.parse({"proxy": engine.url, "token": engine.read_token(), "path": path,
                                    "from_timestamp": str(start), "max_rows_per_batch": "4"})
    first = ChangesStreamReader(options)
    begin = first.initialOffset()
    end = first.latestOffset(begin, ReadMaxRows(4))
    (pulled,) = first.partitions(begin, end)
    assert isinstance(pulled, PulledChanges) and len(pulled.rows) == 4  # two commits of two rows

    after_restart = ChangesStreamReader(options)
    (replayed,) = after_restart.partitions(begin, end)
    assert isinstance(replayed, ChangeRange)
    assert list(after_restart.read(replayed)) == list(pulled.rows)
    rest = after_restart.latestOffset(end, ReadMaxRows(100))
    kinds = [row[2] for row in after_restart.read(ChangeRange(end["event_token"], rest["event_token"]))]
    assert kinds == ["insert"] * 6 + ["delete"]


class Writes(threading.Thread):
    """Inserts, partial updates, deletes and multi-row transactions on random keys, until stopped."""

    def __init__(self, engine: EngineProcess, path: str) -> None:
        super().__init__(name="writes", daemon=True)
        self.engine, self.path = engine, path
        self.halt = threading.Event()
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(20261124)
        try:
            with Client(self.engine.url, self.engine.read_token()) as client:
                while not self.halt.is_set():
                    self.count += 1
                    keys = rng.sample(range(KEYS), rng.randint(1, 5))
                    op = rng.random()
                    if op < 0.5:
                        client.insert_rows(self.path, [make_row(k, self.count) for k in keys])
                    elif op < 0.65:
                        client.insert_rows(self.path, [{"k": k, "name": f"partial-{self.count}"} for k in keys],
                                           update=True)
                    elif op < 0.85:
                        client.delete_rows(self.path, [{"k": k} for k in keys])
                    else:
                        with client.transaction() as tx:
                            client.insert_rows(self.path, [make_row(keys[0], self.count)], transaction_id=tx)
                            client.delete_rows(self.path, [{"k": k} for k in keys[1:]], transaction_id=tx)
                    time.sleep(0.02)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def start_mirror(engine: EngineProcess, dsn: str, path: str, pg_table: str, checkpoint: Path, token_file: Path,
                 log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The mirror as its own process group (its Spark JVM and Python workers included), so it can be killed whole."""
    argv = [sys.executable, "-m", "reptables.sparkapps.mirror", "--proxy", engine.url, "--path", path,
            "--token-file", str(token_file), "--pg-dsn", dsn, "--pg-table", pg_table, "--checkpoint", str(checkpoint),
            "--max-rows-per-batch", "300", *extra]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: exactly the mirror, its JVM and workers
    proc.wait(30)


def wait_on_mirror(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """:func:`wait_for` ``check()``; fails at once, with the mirror's log, if the mirror exits first."""
    def seen() -> Any:
        value = check()
        if not value and proc.poll() is not None:
            pytest.fail(f"the mirror exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()[-4000:]}")
        return value

    try:
        return wait_for(seen, timeout, what, interval=0.3)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}:\n{log.read_text()[-4000:]}")


def test_mirror_killed_and_restarted_while_writes_go_on_converges_exactly(
        engine: EngineProcess, postgres: Any, tmp_path: Path) -> None:
    path = table_name("mirrored")
    create_table(engine, path, SCHEMA, pivot_keys=[[], [KEYS // 2]])  # two tablets
    with client_of(engine) as client:
        client.insert_rows(path, [make_row(k, 0) for k in range(0, KEYS, 2)])
    token_file = tmp_path / "token"
    token_file.write_text(engine.read_token())
    checkpoint, log, pg_table = tmp_path / "checkpoint", tmp_path / "mirror.log", "mirrored"
    state_file = checkpoint / "mirror.json"

    def streamed_token() -> str | None:
        """The newest token in PostgreSQL once the stream has applied a change (newer than the snapshot's)."""
        if not state_file.exists():
            return None
        state = json.loads(state_file.read_text())
        snapshot = f"{state['start_timestamp']:016x}{'f' * 16}{state['table_id']}"
        with postgres.connect() as conn:
            newest = conn.execute(f'SELECT max(_event_token COLLATE "C") FROM {pg_table}').fetchone()
        return newest[0] if state["snapshot_copied"] and newest[0] and newest[0] > snapshot else None

    writes = Writes(engine, path)
    writes.start()
    first = second = None
    try:
        first = start_mirror(engine, postgres.conninfo, path, pg_table, checkpoint, token_file, log)
        wait_on_mirror("the first streamed change", streamed_token, 120, first, log)
        time.sleep(random.uniform(0.5, 2.0))  # somewhere in the middle of the stream's micro-batches
        kill_group(first)
        at_kill = streamed_token()
        state = json.loads(state_file.read_text())
        assert state["snapshot_copied"] is True

        second = start_mirror(engine, postgres.conninfo, path, pg_table, checkpoint, token_file, log,
                              "--until-idle", "5")
        assert at_kill is not None
        wait_on_mirror("a change applied after the restart", lambda: (streamed_token() or "") > at_kill, 120,
                       second, log)
        time.sleep(1.0)
        writes.halt.set()
        writes.join(30)
        assert writes.error is None, f"the writes failed: {writes.error!r}"
        assert writes.count > 100
        second.wait(120)
        assert second.returncode == 0, log.read_text()[-4000:]
    finally:
        writes.halt.set()
        for proc in (first, second):
            if proc is not None:
                kill_group(proc)

    text = log.read_text()
    assert "resuming the mirror" in text and text.count("copied the snapshot") == 1, text[-4000:]
    assert json.loads(state_file.read_text())["start_timestamp"] == state["start_timestamp"]  # StartTime kept
    with client_of(engine) as client:
        expected = sorted(client.select_rows(f"* FROM [{path}]"), key=lambda r: r["k"])
    with postgres.connect() as conn:
        cur = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM {pg_table} ORDER BY k")
        got = [dict(zip(COLUMNS, row, strict=True)) for row in cur.fetchall()]
    assert len(got) == len(expected)
    assert got == expected


def test_mirror_refuses_an_ordered_table_naming_it(engine: EngineProcess, postgres: Any, tmp_path: Path) -> None:
    path = table_name("ordered_log")
    create_table(engine, path, [{"name": "v", "type": "string"}])
    token_file = tmp_path / "token"
    token_file.write_text(engine.read_token())
    result = subprocess.run([sys.executable, "-m", "reptables.sparkapps.mirror", "--proxy", engine.url, "--path", path,
                             "--token-file", str(token_file), "--pg-dsn", postgres.conninfo, "--pg-table", "never",
                             "--checkpoint", str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"{path} is an ordered table; only sorted tables can be mirrored" in result.stderr
    assert engine.read_token() not in result.stderr + result.stdout
    assert not (tmp_path / "c" / "mirror.json").exists()


def _trimmed(client: Client, path: str, from_timestamp: int) -> bool:
    """Whether ``path`` no longer keeps its changes after ``from_timestamp`` (a pull from there is refused)."""
    try:
        client.pull_changes(path, from_timestamp=from_timestamp, wait_timeout=0)
    except YtError as exc:
        assert exc.code == 1760, exc
        return True
    return False


def test_a_stopped_mirror_holds_its_position_past_change_retention_until_released(
        engine: EngineProcess, postgres: Any, tmp_path: Path) -> None:
    """The mirror registers a vital consumer at StartTime and advances it as Spark records batches: stopped
    while the table changes, long past its ``@change_retention``, it resumes without a gap. ``--release``
    unregisters the consumer, and a released checkpoint never resumes."""
    path, clock = table_name("held"), table_name("retention_clock")
    create_table(engine, path, SCHEMA[:3])
    create_table(engine, clock, SCHEMA[:2], change_log=True)
    with client_of(engine) as client:
        for table in (path, clock):
            client.set(f"{table}/@change_retention", 1)  # 1 ms: every background pass trims what nothing holds
        client.insert_rows(path, [{"k": k, "name": f"first-{k}", "score": float(k)} for k in range(20)])
    token_file = tmp_path / "token"
    token_file.write_text(engine.read_token())
    checkpoint, pg_table = tmp_path / "checkpoint", "held"
    argv = [sys.executable, "-m", "reptables.sparkapps.mirror", "--proxy", engine.url, "--path", path,
            "--token-file", str(token_file), "--pg-dsn", postgres.conninfo, "--pg-table", pg_table,
            "--checkpoint", str(checkpoint)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def mirror(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=240, env=env)

    first = mirror("--once")
    assert first.returncode == 0, first.stderr[-4000:]
    state = json.loads((checkpoint / "mirror.json").read_text())
    assert state["consumer"].startswith("//consumers/reptables-mirror/held-")
    with client_of(engine) as client:
        [held] = client.list_queue_consumer_registrations(path)
        assert (held["consumer_path"], held["vital"]) == (state["consumer"], True)
        # stopped, while the table changes
        client.insert_rows(path, [{"k": k, "name": f"later-{k}", "score": -1.0} for k in range(100, 110)])
        client.insert_rows(path, [{"k": 1, "name": "partial"}], update=True)
        client.delete_rows(path, [{"k": k} for k in range(2, 5)])
        after_writes = client.generate_timestamp()
        client.insert_rows(clock, [{"k": 1, "name": "tick"}])
        # a background pass trimmed the clock's change, written after those: it would have trimmed them too
        wait_for(lambda: _trimmed(client, clock, after_writes - 1), 30,
                 "a retention pass after the writes", interval=0.3)

    second = mirror("--once")
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resuming the mirror" in second.stderr
    with client_of(engine) as client:
        expected = sorted(client.select_rows(f"k, name, score FROM [{path}]"), key=lambda r: r["k"])
    with postgres.connect() as conn:
        got = [dict(zip(("k", "name", "score"), row, strict=True))
               for row in conn.execute(f"SELECT k, name, score FROM {pg_table} ORDER BY k").fetchall()]
    assert got == expected and len(got) == 27

    released = mirror("--release")
    assert released.returncode == 0, released.stderr[-4000:]
    assert f"unregistered consumer {state['consumer']} of {path}" in released.stderr
    with client_of(engine) as client:
        assert client.list_queue_consumer_registrations(path) == []
    again = mirror("--once")
    assert again.returncode == 1 and "belongs to a mirror that was released" in again.stderr, again.stderr[-2000:]
