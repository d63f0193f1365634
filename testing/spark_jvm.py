"""The JVM options of every local Spark a test run starts, with a class-data-sharing archive made once.

Why: the suite starts local Spark many times (its own session, and every bootstrap, verify, mirror
and join job that the launchers, ``reptables up`` and the spark-operator stand-in run as processes),
and a short-lived Spark JVM spends much of its CPU loading and verifying Spark's classes. A
dynamic class-data-sharing (CDS) archive holds them already parsed and verified: a JVM mapping it
skips that work (``bash hack/spark-jvm-cost.sh`` measures a start with and without it).

The archive is made by one Spark start with ``-XX:ArchiveClassesAtExit`` that runs what the jobs
run (a Python data source, DataFrames, Python code on the executors), once per JDK build and
pyspark version: it is kept in the virtual environment (``.venv/share/reptables/``) and made again
when either changes.
A JVM whose classpath or JDK does not match the archive ignores it (``-Xshare:auto``, its warning
silenced) and starts as it would without it, so the archive can only save time, never fail a start.
The client compiler only and the serial collector: a job's JVM lives seconds on small data, where
C2's compilations and G1's threads cost more than they return.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the JIT and collector options of every local Spark JVM of a test run
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: a JVM that cannot use the archive says so on stderr; the jobs' logs and outputs need not
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

_PROBE = """
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader


class Probe(DataSource):
    @classmethod
    def name(cls):
        return "reptables_cds_probe"

    def schema(self):
        return "k long, v string"

    def reader(self, schema):
        return ProbeReader()


class ProbeReader(DataSourceReader):
    def read(self, partition):
        yield from ((i, str(i)) for i in range(10))


spark = SparkSession.builder.master("local[2]").appName("reptables-cds-archive").getOrCreate()
spark.dataSource.register(Probe)
frame = spark.read.format("reptables_cds_probe").load()
assert frame.count() == 10
assert spark.sparkContext.parallelize(range(10), 2).map(lambda v: v + v).sum() == 90
assert spark.createDataFrame([(1, "a"), (2, "b")], "k long, v string").groupBy("v").count().count() == 2
spark.range(100).repartition(2).count()
spark.stop()
"""


def archive_path() -> Path | None:
    """Where this environment keeps the archive of its JDK build and pyspark version (None: no pyspark
    or no java here, so no Spark to start)."""
    try:
        import pyspark

        version = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    except (ImportError, OSError):
        return None
    build = re.search(r"build ([^\s)]+)", version)
    name = f"spark-{pyspark.__version__}-jdk-{build.group(1) if build else 'unknown'}.jsa"
    return Path(sys.prefix) / "share" / "reptables" / re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def make_archive(path: Path, timeout: float = 600.0) -> bool:
    """Start local Spark once with ``-XX:ArchiveClassesAtExit``, running what the jobs run, and move the
    archive to ``path`` once the JVM has exited (it writes the archive as it exits). False, and no
    file at ``path``, when no archive came out (the caller then starts its JVMs without one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        partial = Path(work) / "archive.jsa"
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_SUBMIT_ARGS":
               f"--driver-java-options '{JVM_OPTIONS} -XX:ArchiveClassesAtExit={partial}' pyspark-shell"}
        probe = subprocess.Popen([sys.executable, "-c", _PROBE], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            probe.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(probe.pid, signal.SIGKILL)
            probe.wait()
            return False
        # the JVM outlives the Python driver while it writes the archive: wait for the whole group
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                os.killpg(probe.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(probe.pid, signal.SIGKILL)
            return False
        if probe.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            return False
        os.replace(partial, path)  # atomic: a JVM starting now maps a whole archive or none
    return True


def jvm_options(make: bool = True) -> str:
    """The driver JVM options of a test run's Spark: with the archive (made first when ``make`` and
    missing), or without it when none could be made."""
    path = archive_path()
    if path is None or not path.is_file() and not (make and make_archive(path)):
        return JVM_OPTIONS
    return f"{JVM_OPTIONS} -XX:SharedArchiveFile={path} -Xshare:auto {_QUIET}"
