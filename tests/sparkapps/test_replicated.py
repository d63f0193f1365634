"""A replicated table read with Spark through its meta-cluster: served by its sync replica, at the
read's timestamp. A meta-cluster and one replica cluster, real engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.replication.conftest import ClusterSet

from .conftest import read, write


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    cs = ClusterSet(Path(tmp_path_factory.mktemp("replicated")), names=("primary", "remote_0")).start()
    try:
        yield cs
    finally:
        cs.stop()


def test_a_replicated_table_is_read_through_its_sync_replica(spark: SparkSession, clusters: ClusterSet) -> None:
    path = clusters.replicated_table("//tmp/replicated", attributes={"pivot_keys": [[], [50]]})
    replica_id = clusters.replica(path, "remote_0", "//tmp/replica", mode="sync")
    clusters.wait_in_sync(replica_id)
    meta = clusters.engines["primary"]
    before = clusters.meta.generate_timestamp()

    rows = [(k, f"v{k}") for k in range(100)]
    write(spark.createDataFrame(rows, "k long, v string"), meta, path, batch_rows=30)
    assert sorted((r["k"], r["v"]) for r in clusters.rows("remote_0", "//tmp/replica")) == rows

    df = read(spark, meta, path, partitions=4)
    assert df.rdd.getNumPartitions() == 4
    assert sorted(tuple(r) for r in df.collect()) == rows
    assert read(spark, meta, path, timestamp=before).count() == 0  # the timestamp travels to the replica
