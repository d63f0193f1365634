"""The XDCR join job on real local Spark: a third cluster joins a group whose logs are trimmed.

Three real engines (tests/xdcr/conftest.py): ``a`` and ``b`` have written, with conflicts and deletes,
until their change logs were trimmed; ``c`` joins from a snapshot of the member its
``//sys/@xdcr_preferred_source`` names (by cluster id, as seed 001's ``preferred-source``), through
the job's Spark tasks, while ``a`` and ``b`` keep writing. A job killed half way and run again
loads only the pages still missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from reptables.engine.errors import YtError
from reptables.operator.cli import app as reptables_cli
from reptables.sparkapps.xdcr_join import join
from reptables.testing import wait_for
from tests.xdcr.conftest import ALL, SCHEMA, Writers, XdcrGroup, trimmed_group


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdcrGroup]:
    group = XdcrGroup(tmp_path_factory.mktemp("spark_xdcr_join"), names=ALL).start()
    try:
        yield group
    finally:
        group.stop()


def test_the_join_job_loads_the_preferred_sources_snapshot_while_the_group_writes(
        spark: SparkSession, trio: XdcrGroup) -> None:
    path = "//tmp/users_spark"
    trimmed_group(trio, path)
    trio.connect(ALL)
    c = trio.client("c")
    c.set("//sys/@xdcr_preferred_source", 2)  # b's cluster id
    engine = trio.engines["c"]
    assert engine.token
    with Writers(trio, path, ("a", "b")) as writers:
        wait_for(lambda: min(writers.writes.values()) > 10, 30, "both writers running")
        # a first job that died after two pages: begun, two pages loaded
        begun = c.call("dr_join_begin", {"path": path, "page_rows": 40})
        assert begun["source"] == "b" and begun["pages"] >= 10
        for page in begun["missing_pages"][:2]:
            entries = c.call("dr_join_read", {"path": path, "page": page})["entries"]
            c.call("dr_join_write", {"path": path, "page": page}, entries)
        # run again: it resumes the same snapshot and loads the rest in Spark tasks
        totals = join(spark, engine.url, engine.token, path, partitions=3)
        assert totals["source"] == "b" and totals["pages"] == begun["pages"]
        assert totals["pages_already_there"] == 2 and totals["pages_loaded"] == begun["pages"] - 2
        assert totals["rows"] == begun["rows"] and totals["tombstones"] == begun["tombstones"]
        wait_for(lambda: len(trio.rows("c", path)) > begun["rows"], 30, "changes after the snapshot reaching c")
    wait_for(lambda: trio.converged(path), 60, "a, b and c converged")
    assert len(trio.rows("c", path)) == 420 + sum(writers.writes.values())
    status = trio.client("a").call("dr_status", {})["peers"]["c"]
    assert status["state"] == "connected" and status["last_error"] is None


def test_a_join_that_cannot_start_says_why(spark: SparkSession, trio: XdcrGroup) -> None:
    engine = trio.engines["c"]
    assert engine.token
    with pytest.raises(Exception, match="//tmp/nothing_here"):  # noqa: PT011 - ReptablesSparkError
        join(spark, engine.url, engine.token, "//tmp/nothing_here")
    result = CliRunner().invoke(reptables_cli, ["dr", "join", "--path", "//tmp/t"], env={"YT_PROXY": ""})
    assert result.exit_code == 1 and "--proxy" in result.output
    c = trio.client("c")
    c.create("table", "//tmp/never_joined", attributes={"dynamic": True, "schema": SCHEMA, "xdcr": True})
    with pytest.raises(YtError, match="not joining"):
        c.call("dr_join_finish", {"path": "//tmp/never_joined"})


def test_the_sparkapplication_main_file_runs_the_join_job() -> None:
    """On Kubernetes the job is ``sparkapp.py xdcr_join <options>`` (the file spark-submit runs)."""
    done = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "sparkapps" / "sparkapp.py"), "xdcr_join",
                           "--proxy", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "YT_TOKEN": ""})
    assert done.returncode == 2 and "--path" in done.stderr  # the join job's own usage, not sparkapp.py's
