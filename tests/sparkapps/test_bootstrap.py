"""The bootstrap job with real local Spark: a replica added to a table with trimmed history joins complete.

Three real engines: ``primary`` (the meta-cluster), ``source`` (an existing replica, in sync) and
``target`` (the new replica's cluster). The history is trimmed before the new replica exists, and
a writer keeps writing through the copy. After the copy the replica is enabled and must equal the
source row for row, and ``get_in_sync_replicas`` lists it only then. The job killed mid-copy (the
whole process group: the Python driver and its Spark JVM) and run again completes the copy. Every
test runs twice: copying from a SQLite-backed replica into a PostgreSQL-backed one, and back.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from reptables.engine.credentials import peer_credential
from reptables.sparkapps.bootstrap import copy, resolve
from reptables.testing import backends, wait_for
from tests.replication.conftest import ClusterSet

META, SOURCE, TARGET = "primary", "source", "target"
SCHEMA = [{"name": "k", "type": "int64", "sort_order": "ascending"}, {"name": "v", "type": "string"},
          {"name": "a", "type": "any"}]
_names = itertools.count()


#: the copy between the two storage backends, both ways: the source replica on SQLite and the new
#: one on PostgreSQL (bootstrap writes into PostgreSQL), and the reverse (a snapshot read at a
#: timestamp from PostgreSQL); the meta-cluster on the other backend of its source
LAYOUTS = {
    "sqlite-to-postgresql": {META: backends.POSTGRESQL, SOURCE: backends.SQLITE, TARGET: backends.POSTGRESQL},
    "postgresql-to-sqlite": {META: backends.SQLITE, SOURCE: backends.POSTGRESQL, TARGET: backends.SQLITE},
}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def cs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    clusters = ClusterSet(Path(tmp_path_factory.mktemp("boot")), names=(META, SOURCE, TARGET),
                          storage=LAYOUTS[request.param])
    try:
        yield clusters.start(own_tokens=True)
    finally:
        clusters.stop()


def credential(cs: ClusterSet, cluster: str) -> str:
    token = cs.engines[cluster].token
    assert token
    return peer_credential(token, META)


class Writer(threading.Thread):
    """Upserts old keys and adds new ones until stopped."""

    def __init__(self, cs: ClusterSet, path: str) -> None:
        super().__init__(daemon=True)
        self.client, self.path = cs.client(META), path
        self.stop_event = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                n = self.writes
                self.client.insert_rows(self.path, [{"k": n % 500, "v": f"w{n}", "a": {"n": n}},
                                                    {"k": 100_000 + n, "v": f"new{n}", "a": [n]}],
                                        require_sync_replica=False)
                self.writes = n + 1
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        assert self.error is None, self.error


def trimmed_table(cs: ClusterSet, rows: int) -> tuple[str, str, str]:
    """A replicated table with ``rows`` rows whose queue is trimmed: (path, source replica id, its path)."""
    n = next(_names)
    path = cs.replicated_table(f"//tmp/boot_{n}", SCHEMA, attributes={"min_replication_log_ttl": 0})
    source_path = f"//tmp/boot_source_{n}"
    source = cs.replica(path, SOURCE, source_path, schema=SCHEMA)
    for start in range(0, rows, 5000):
        cs.meta.insert_rows(path, [{"k": i, "v": f"old{i}", "a": {"i": i, "s": [1, "x"]} if i % 3 else None}
                                   for i in range(start, min(rows, start + 5000))], require_sync_replica=False)
    wait_for(lambda: cs.meta.get(f"{path}/@tablets")[0]["trimmed_row_count"] >= rows, 60, "the history trimmed")
    return path, source, source_path


def new_replica(cs: ClusterSet, path: str) -> tuple[str, str, int]:
    ts = cs.meta.generate_timestamp()
    replica_path = f"//tmp/boot_target_{next(_names)}"
    replica_id = cs.replica(path, TARGET, replica_path, schema=SCHEMA, enable=False, start_replication_timestamp=ts)
    return replica_id, replica_path, ts


def in_sync(cs: ClusterSet, path: str) -> list[str]:
    return cs.in_sync(path, cs.meta.generate_timestamp())


def rows_of(cs: ClusterSet, cluster: str, path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = cs.client(cluster).select_rows(f"* from [{path}] order by k limit 1000000")
    return rows


def test_a_bootstrapped_replica_joins_equal_to_its_source_while_a_writer_writes(
        spark: SparkSession, cs: ClusterSet) -> None:
    path, source, source_path = trimmed_table(cs, 3000)
    writer = Writer(cs, path)
    writer.start()
    try:
        wait_for(lambda: writer.writes > 10, 30, "the writer running")
        replica_id, replica_path, ts = new_replica(cs, path)
        plan = resolve(cs.meta, replica_id, source, wait=30)
        assert plan.timestamp == ts and plan.target_path == replica_path and plan.yson_columns == {"a"}
        totals = copy(spark, plan, credential(cs, SOURCE), credential(cs, TARGET), partitions=3, chunk_rows=400)
        assert totals["rows"] >= 3000 and totals["chunks_applied"] >= 8 and totals["chunks_skipped"] == 0
        # run again (a retried job): every chunk is already there, nothing changes
        again = copy(spark, plan, credential(cs, SOURCE), credential(cs, TARGET), partitions=3, chunk_rows=400)
        assert again["chunks_applied"] == 0 and again["chunks_skipped"] == totals["chunks_applied"]
        assert replica_id not in in_sync(cs, path)
        cs.alter(replica_id, enabled=True)
    finally:
        writer.finish()
    # (both: the source is an async replica too, and may trail the writer's last commits)
    wait_for(lambda: {replica_id, source} <= set(in_sync(cs, path)), 60, "the new replica and its source in sync")
    assert rows_of(cs, TARGET, replica_path) == rows_of(cs, SOURCE, source_path)
    assert len(rows_of(cs, TARGET, replica_path)) == 3000 + writer.writes


def test_a_source_that_cannot_be_read_fails_with_a_clear_message(spark: SparkSession, cs: ClusterSet) -> None:
    path, source, _ = trimmed_table(cs, 10)
    replica_id, replica_path, _ = new_replica(cs, path)
    plan = resolve(cs.meta, replica_id, source, wait=30)
    with pytest.raises(Exception) as failed:  # noqa: B017, PT011 - Spark wraps the job's error
        copy(spark, plan, "peer:primary:" + "0" * 64, credential(cs, TARGET))
    message = str(failed.value)
    # (the first thing the copy asks of the source is a snapshot lease: refused for this credential)
    assert ("cannot read table" in message or "cannot hold the snapshot" in message)
    assert plan.source_path in message and "0" * 64 not in message
    assert rows_of(cs, TARGET, replica_path) == []
    # a replica already enabled is not bootstrapped
    cs.alter(source, enabled=True)
    with pytest.raises(Exception, match="a bootstrap fills a replica before it is enabled"):
        resolve(cs.meta, source, source, wait=1)


def test_the_job_killed_mid_copy_completes_on_a_second_run(cs: ClusterSet, tmp_path: Path) -> None:
    path, source, source_path = trimmed_table(cs, 20_000)
    replica_id, replica_path, _ = new_replica(cs, path)
    secrets = {"meta": cs.engines[META].token or "", "source": credential(cs, SOURCE),
               "target": credential(cs, TARGET)}
    for name, value in secrets.items():
        (tmp_path / name).write_text(value)
        (tmp_path / name).chmod(0o600)
    command = [sys.executable, "-m", "reptables.sparkapps.bootstrap", "--meta-proxy", cs.engines[META].url,
               "--meta-token-file", str(tmp_path / "meta"), "--replica-id", replica_id,
               "--source-replica-id", source, "--source-credential-file", str(tmp_path / "source"),
               "--target-credential-file", str(tmp_path / "target"), "--partitions", "2", "--chunk-rows", "100",
               "--master", "local[2]"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    first = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / "first.log", "w"))  # noqa: SIM115 - closed with the process
    try:
        wait_for(lambda: len(rows_of(cs, TARGET, replica_path)) >= 500, 120, "the copy under way")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM: exactly what this test started
        first.wait(30)
    copied = len(rows_of(cs, TARGET, replica_path))
    assert 0 < copied < 20_000
    second = subprocess.run([*command, "--enable"], env=env, start_new_session=True, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "bootstrap copied 20000 rows" in second.stderr and "already there" in second.stderr
    assert "token-" not in second.stderr and secrets["target"] not in second.stderr
    wait_for(lambda: replica_id in in_sync(cs, path), 60, "the new replica in sync")
    assert rows_of(cs, TARGET, replica_path) == rows_of(cs, SOURCE, source_path)
    assert len(rows_of(cs, TARGET, replica_path)) == 20_000
