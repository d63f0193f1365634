"""The Spark session of a job (bootstrap, verify, XDCR join): local Spark, or the submitted one.

Each job runs two ways. Under ``spark-submit`` (a SparkApplication of the spark-operator) the
session, its master and its configuration come from the submission: the job takes it as it is and
leaves stopping it to spark-submit. Run directly (``python -m reptables.sparkapps.<job>``, the
local launcher of the operator, ``reptables up``), the job starts local Spark itself: master
``local[*]`` unless ``--master`` says otherwise, Python workers that are this interpreter (it has
reptables and pyarrow), and stops it when the job ends. The one test of which case applies is the
gateway port that spark-submit hands to the Python driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark is imported only when a job runs (a slow import, and the extra's)
    from pyspark.sql import SparkSession


def submitted() -> bool:
    """Whether this process is the driver of an application that spark-submit started."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextmanager
def job_session(app_name: str, master: str | None) -> Iterator[SparkSession]:
    """The session of one job run, with the reptables data source registered.

    ``master`` given: that master, also under spark-submit. Stopped at the end only when this job
    started it (a submitted application's session belongs to spark-submit)."""
    from pyspark.sql import SparkSession

    from .datasource import register

    builder = SparkSession.builder.appName(app_name)
    under_submit = submitted()
    if master or not under_submit:
        builder = builder.master(master or "local[*]")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    register(spark)
    try:
        yield spark
    finally:
        if not under_submit:
            spark.stop()


__all__ = ["job_session", "submitted"]
