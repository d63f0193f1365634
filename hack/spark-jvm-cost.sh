#!/usr/bin/env bash
# What one local Spark start costs: wall time and CPU (perf stat's task-clock, every thread and child
# process counted) of a session start, one small job and a stop, with the JVM's default options, with
# the JIT and collector options the test suite gives every Spark JVM, and with those and the suite's
# class-data-sharing archive (testing/spark_jvm.py; made first if this environment has none).
# Usage: bash hack/spark-jvm-cost.sh [ROUNDS]   (needs .venv with the spark extra, and perf)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 2; }
options="$(.venv/bin/python -c 'from reptables.testing.spark_jvm import JVM_OPTIONS; print(JVM_OPTIONS)')"
archived="$(.venv/bin/python -c 'from reptables.testing.spark_jvm import jvm_options; print(jvm_options())')"
probe='import time
t = time.monotonic()
from pyspark.sql import SparkSession
s = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
s.range(100).count()
s.stop()
print(f"wall {time.monotonic() - t:.1f} s")'
for round in $(seq 1 "$rounds"); do
  for jvm in "" "$options" "$archived"; do
    out="$(SPARK_LOCAL_IP=127.0.0.1 PYSPARK_SUBMIT_ARGS="--driver-java-options '$jvm' pyspark-shell" \
      perf stat -x, -e task-clock .venv/bin/python -c "$probe" 2>&1)"
    wall="$(grep -o 'wall [0-9.]* s' <<<"$out")"
    cpu="$(grep task-clock <<<"$out" | cut -d, -f1)"
    label="${jvm:-JVM defaults}"
    [ "$jvm" = "$archived" ] && [ "$archived" != "$options" ] && label="$options + class archive"
    printf 'round %s  %-60s %s  cpu %.1f s\n' "$round" "[$label]" "$wall" "$(awk -v ms="$cpu" 'BEGIN { print ms / 1000 }')"
  done
done
