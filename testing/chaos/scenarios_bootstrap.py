"""The bootstrap scenario: new replicas filled by the Spark bootstrap copy while things break.

Why: a bootstrap is the one moment a replica's contents come from somewhere other than the
replication queue - a snapshot at ``start_replication_timestamp`` T copied by a Spark job, and then
the queue from T on. A row in both, or in neither, is a row duplicated or lost, and faults during
the copy (the job killed and run again, the target engine killed, the source paused, the target cut
off from the job) are what the engine's idempotent chunks and snapshot lease are for.

Each cycle adds an async replica of ``//chaos/set`` or ``//chaos/reg`` (alternately; both sorted
here, the copy takes sorted tables only) on engine ``r3``, runs ``python -m
reptables.sparkapps.bootstrap ... --enable`` in the runner's namespace (local Spark), strikes once
while it runs, runs the job again until it succeeds, and adds the replica to the ones the final reads
cover: the set and register checkers then hold it to the same standard as the others. At most
:data:`KEEP` bootstrapped replicas of a table stay; older ones are removed (their final state is
not checked).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from functools import partial
from pathlib import Path

from reptables.engine.client import Client
from reptables.engine.credentials import peer_credential
from reptables.engine.errors import YtError
from reptables.testing.waits import wait_for

from ..spark_jvm import jvm_options
from .cluster import ChaosProcess
from .nemesis import Fault, Kill, Partition, Pause
from .runner import RunContext, Scenario
from .scenarios import META, REG, SET, crashes, done, mixed, partitions, replicated_cluster, respawn, sync_cluster
from .workloads import REGISTER_SCHEMA, SORTED_SCHEMA

__all__ = ["BOOTSTRAP_SCENARIOS"]

TARGET = "r3"
#: bootstrapped replicas kept per table
KEEP = 3
#: attempts of one copy before the cycle counts as failed
ATTEMPTS = 6


def _secret_file(path: Path, value: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return path


def bootstrap_loop(ctx: RunContext, stop: threading.Event) -> None:
    assert ctx.engines is not None and ctx.tables is not None
    rng = random.Random(ctx.seed + 23)
    kept: dict[str, list[str]] = {SET: [], REG: []}
    with ctx.tables.client(META, timeout=10.0) as meta:
        for cycle in range(1, 10_000):
            if stop.wait(rng.uniform(2.0, 6.0)):
                return
            path = SET if cycle % 2 else REG
            try:
                _cycle(ctx, meta, path, cycle, rng, kept[path])
            except YtError as exc:  # the meta-cluster did not answer the set-up: the next cycle tries again
                ctx.history.info("bootstrap", "setup-failed", {"cycle": cycle, "error": str(exc)[:300]})


def _cycle(ctx: RunContext, meta: Client, path: str, cycle: int, rng: random.Random, kept: list[str]) -> None:
    assert ctx.engines is not None and ctx.tables is not None and ctx.nemesis is not None
    engines, base = ctx.engines, ctx.run.base
    source_cluster = sync_cluster(ctx, path)
    sources = {rid: c for rid, (c, _) in ctx.tables.replicas[path].items() if c == source_cluster}
    if not sources:
        return
    source_id = next(iter(sources))
    replica_path = f"{path}_b{cycle}"
    timestamp = meta.generate_timestamp()
    replica_id = meta.create("table_replica", attributes={
        "table_path": path, "cluster_name": TARGET, "replica_path": replica_path, "start_replication_timestamp":
        timestamp})
    schema = SORTED_SCHEMA if path == SET else REGISTER_SCHEMA
    target = engines.client(TARGET)
    target.create("table", replica_path, recursive=True, attributes={"dynamic": True, "schema": schema,
                                                                      "upstream_replica_id": replica_id})
    target.mount_table(replica_path)
    meta_token = _secret_file(base / f"bootstrap-{cycle}.meta", ctx.tables.tokens[META])
    source_cred = _secret_file(base / f"bootstrap-{cycle}.source",
                               peer_credential(ctx.tables.tokens[str(source_cluster)], META))
    target_cred = _secret_file(base / f"bootstrap-{cycle}.target", peer_credential(ctx.tables.tokens[TARGET], META))
    argv = [sys.executable, "-m", "reptables.sparkapps.bootstrap", "--meta-proxy", ctx.tables.urls[META],
            "--meta-token-file", str(meta_token), "--replica-id", replica_id, "--source-replica-id", source_id,
            "--source-credential-file", str(source_cred), "--target-credential-file", str(target_cred),
            "--partitions", "2", "--chunk-rows", "200", "--wait", "60", "--enable"]
    ctx.history.info("bootstrap", "begin", {"cycle": cycle, "path": path, "replica_id": replica_id,
                                            "source": source_cluster, "timestamp": timestamp})
    started = time.monotonic()
    # the JVM options of the test suite's Spark (testing/spark_jvm.py), the class archive if one was made
    spark_submit_args = f"--driver-java-options '{jvm_options(make=False)}' pyspark-shell"
    for attempt in range(1, ATTEMPTS + 1):
        job = ChaosProcess(f"bootstrap-{cycle}-{attempt}", argv, base / f"bootstrap-{cycle}.log",
                           env={"PYSPARK_SUBMIT_ARGS": spark_submit_args, "SPARK_LOCAL_IP": "127.0.0.1"})
        ctx.run.process(job)
        if attempt == 1:
            _strike(ctx, rng, job, str(source_cluster))
        try:
            code = job.wait(timeout=240)
        except Exception:  # noqa: BLE001 - a job that hangs is stopped and run again
            job.stop()
            code = -1
        ctx.history.info("bootstrap", "attempt", {"cycle": cycle, "attempt": attempt, "exit": code})
        if code == 0:
            break
        time.sleep(2.0)
    else:
        ctx.anomalies.append(f"bootstrap cycle {cycle} of {path}: the copy did not succeed in {ATTEMPTS} attempts "
                             f"(see {base / f'bootstrap-{cycle}.log'})")
        meta.remove(f"#{replica_id}")
        return
    try:
        wait_for(lambda: meta.get(f"#{replica_id}/@state") == "enabled", 60, f"replica {replica_id} enabled")
    except TimeoutError as exc:
        ctx.anomalies.append(f"bootstrap cycle {cycle} of {path}: the copy succeeded but {exc}")
        return
    ctx.tables.replicas[path][replica_id] = (TARGET, replica_path)
    ctx.history.info("bootstrap", "end", {"cycle": cycle, "replica_id": replica_id,
                                          "seconds": round(time.monotonic() - started, 1)})
    kept.append(replica_id)
    if len(kept) > KEEP:
        old = kept.pop(0)
        del ctx.tables.replicas[path][old]
        wait_for(done(partial(meta.remove, f"#{old}")), 30, f"replica {old} removed")


def _strike(ctx: RunContext, rng: random.Random, job: ChaosProcess, source: str) -> None:
    """One fault a few seconds into the copy: the job, the target, the source or the link to the target."""
    assert ctx.engines is not None and ctx.nemesis is not None
    engines, nemesis = ctx.engines, ctx.nemesis
    choice = rng.randrange(4)
    fault: Fault
    if choice == 0:
        fault = Kill("bootstrap-job", job, lambda: None)  # the loop runs the job again
    elif choice == 1:
        fault = Kill(TARGET, engines.engine(TARGET), respawn(engines.engine(TARGET)))
    elif choice == 2:
        fault = Pause(source, engines.engine(source))
    else:
        fault = Partition(ctx.run.network, "isolate", [TARGET], from_host=True, note="bootstrap target")
    threading.Timer(rng.uniform(3.0, 12.0), nemesis.inject, (fault, rng.uniform(3.0, 8.0))).start()


def _build(ctx: RunContext) -> None:
    replicated_cluster(ctx, extra=(TARGET,), set_schema=SORTED_SCHEMA)
    ctx.generator = mixed(partitions(ctx), crashes(ctx))
    ctx.gap = (8.0, 16.0)
    ctx.activities.append(bootstrap_loop)


BOOTSTRAP_SCENARIOS = [
    Scenario("bootstrap", "new replicas filled by the Spark bootstrap copy while the job, the target or the source "
             "is killed, paused or cut off", _build, converge_timeout=180.0),
]
