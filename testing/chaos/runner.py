"""One fault run of one scenario: build, load, break, heal, converge, read, check, summarise.

Why one function for every scenario: the order of the phases is what makes a check sound, and it is
the same everywhere. Faults run only while the workloads do; then every fault is healed, every
process that was killed runs again, the workloads stop, the clusters get a bounded time to converge
(replicas catch up, XDCR members drain), and only then are the final reads taken. A cluster that does
not converge in that time is an anomaly of its own ("liveness"), not a reason to skip the checks.

The run writes into its directory: ``history.jsonl`` (every operation, fault and final read, as it
happens), ``summary.json`` (what :func:`summarise` says), and ``data/`` (engine data directories and
logs, the tracker's log, the Spark jobs' logs).
"""

from __future__ import annotations

import json
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkers import CheckResult, check_history
from .cluster import ChaosEngines, ChaosRun, TrackerProcess
from .history import History, OpType
from .nemesis import Fault, FaultGenerator, Kill, Nemesis, Partition
from .net import HOST
from .workloads import Session, StreamWorkload, Tables, Workload

__all__ = ["RunContext", "Scenario", "run_scenario", "summarise"]


@dataclass
class RunContext:
    """What a scenario's ``build`` fills in, and what the phases of the run use."""

    run: ChaosRun
    history: History
    seed: int
    duration: float
    rng: random.Random
    engines: ChaosEngines | None = None
    tables: Tables | None = None
    workloads: list[Workload] = field(default_factory=list)
    generator: FaultGenerator | None = None
    #: seconds between two random faults (uniform between the two)
    gap: tuple[float, float] = (2.0, 6.0)
    #: threads that drive the scenario's risky moments (mode switches, reshards...) until the event is set
    activities: list[Callable[[RunContext, threading.Event], None]] = field(default_factory=list)
    #: waits until the clusters have converged (raises TimeoutError if not in time)
    converge: Callable[[RunContext, float], None] | None = None
    #: more processes the scenario restarts before converging (killed trackers...)
    tracker: TrackerProcess | None = None
    nemesis: Nemesis | None = None
    #: problems the scenario met outside the checkers (a bootstrap that never finished...)
    anomalies: list[str] = field(default_factory=list)

    def workload(self, workload: Workload) -> Workload:
        self.workloads.append(workload)
        return workload


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    build: Callable[[RunContext], None]
    #: faults in the short mode (tests/chaos) are started this much sooner
    converge_timeout: float = 120.0


def _work(workload: Workload, session: Session, stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            workload.step(session)
            if workload.pause:
                stop.wait(workload.pause)
    finally:
        session.close()


def run_scenario(scenario: Scenario, out: Path, duration: float, seed: int,
                 log: Callable[[str], None] = print, storage: str = "sqlite") -> dict[str, Any]:
    """Run ``scenario`` for ``duration`` seconds of faults into directory ``out``; its summary.
    ``storage``: ``sqlite`` (each engine's data directory) or ``postgresql`` (a database per engine on
    the run's server; the scenario's faults then also cut engines from it and crash it)."""
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    started = time.monotonic()
    results: list[CheckResult] = []
    errors: list[str] = []
    ctx: RunContext | None = None
    try:
        with ChaosRun(out / "data", storage) as run:
            ctx = RunContext(run, history, seed, duration, random.Random(seed))
            log(f"[{scenario.name}] building (slot {run.network.slot}, seed {seed}, {storage})")
            scenario.build(ctx)
            assert ctx.tables is not None
            if run.database is not None and ctx.generator is not None:
                ctx.generator = _with_database_faults(ctx, ctx.generator)
            history.info("run", "start", {"scenario": scenario.name, "seed": seed, "duration": duration,
                                          "storage": storage, "workloads": {w.name: w.spec() for w in ctx.workloads}})
            stop_load, stop_streams, stop_activities = threading.Event(), threading.Event(), threading.Event()
            threads = [threading.Thread(target=_work, daemon=True, name=f"{w.name}-{i}",
                                        args=(w, Session(history, w.name, i, ctx.tables, seed * 1000 + j * 10 + i),
                                              stop_streams if isinstance(w, StreamWorkload) else stop_load))
                       for j, w in enumerate(ctx.workloads) for i in range(w.sessions)]
            streaming = {f"{w.name}-0" for w in ctx.workloads if isinstance(w, StreamWorkload)}
            for thread in threads:
                thread.start()
            ctx.nemesis = Nemesis(history, ctx.generator, seed, ctx.gap).start()
            activity_threads = [threading.Thread(target=_activity, args=(a, ctx, stop_activities, errors),
                                                 daemon=True, name="activity") for a in ctx.activities]
            for thread in activity_threads:
                thread.start()
            log(f"[{scenario.name}] running {duration:g} s with faults")
            stop_load.wait(duration)
            stop_activities.set()
            for thread in activity_threads:
                thread.join(timeout=300)
            ctx.nemesis.stop()
            history.info("run", "healed", {})
            _restart_dead(ctx)
            stop_load.set()
            for thread in threads:
                if thread.name not in streaming:
                    thread.join(timeout=60)
            log(f"[{scenario.name}] healed; converging")
            _converge(ctx, scenario.converge_timeout)
            for workload in ctx.workloads:
                if not isinstance(workload, StreamWorkload):
                    _final(workload, ctx, errors)
            _streams_end(ctx)
            stop_streams.set()
            for thread in threads:
                thread.join(timeout=60)
            errors += ctx.nemesis.errors
            history.info("run", "end", {"seconds": round(time.monotonic() - started, 1)})
            results = check_history(history, {w.name: w.spec() for w in ctx.workloads})
    except BaseException as exc:
        errors.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}")
        if not isinstance(exc, Exception):
            raise
    finally:
        anomalies = ctx.anomalies if ctx else []
        for problem in anomalies + errors:  # in the history too: `check` of the file alone counts them
            history.info("run", "anomaly", problem[:2000])
        history.close()
        summary = summarise(scenario.name, seed, duration, history, results, errors, anomalies,
                            time.monotonic() - started)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _activity(activity: Callable[[RunContext, threading.Event], None], ctx: RunContext, stop: threading.Event,
              errors: list[str]) -> None:
    try:
        activity(ctx, stop)
    except Exception as exc:  # noqa: BLE001 - reported in the summary; the run goes on
        errors.append(f"activity {getattr(activity, '__name__', activity)}: {type(exc).__name__}: {exc}\n"
                      + traceback.format_exc()[-2000:])


def _with_database_faults(ctx: RunContext, generator: FaultGenerator) -> FaultGenerator:
    """One fault in four on the run's PostgreSQL server instead: an engine cut from its database, or a
    crash of the server (immediate shutdown, started again on heal)."""
    database, net = ctx.run.database, ctx.run.network
    assert database is not None and ctx.engines is not None
    engines = ctx.engines

    def generate(rng: random.Random) -> tuple[Fault, float] | None:
        if rng.random() >= 0.25:
            return generator(rng)
        if rng.random() < 0.6:
            node = rng.choice(sorted(engines.engines))
            return (Partition(net, "port", [node, HOST], port=database.port, note="engine cut from its database"),
                    rng.uniform(3.0, 10.0))
        return Kill("postgresql", database, database.restart), rng.uniform(2.0, 6.0)

    return generate


def _restart_dead(ctx: RunContext) -> None:
    if ctx.run.database is not None and not ctx.run.database.alive():
        ctx.history.info("run", "restart", {"node": "postgresql"})
        ctx.run.database.restart()
    if ctx.engines is not None:
        for name, engine in ctx.engines.engines.items():
            if not engine.alive():
                ctx.history.info("run", "restart", {"node": name})
                engine.start()
    if ctx.tracker is not None and not ctx.tracker.alive():
        ctx.tracker.start()


def _converge(ctx: RunContext, timeout: float) -> None:
    if ctx.converge is None:
        return
    started = time.monotonic()
    try:
        ctx.converge(ctx, timeout)
        ctx.history.info("run", "converged", {"seconds": round(time.monotonic() - started, 1)})
    except TimeoutError as exc:
        ctx.anomalies.append(f"did not converge within {timeout:g} s after the faults were healed: {exc}")
        ctx.history.info("run", "not-converged", {"error": str(exc)[:2000]})


def _final(workload: Workload, ctx: RunContext, errors: list[str]) -> None:
    assert ctx.tables is not None
    for attempt in range(5):
        try:
            workload.final(ctx.tables)
            return
        except Exception as exc:  # noqa: BLE001 - retried; the last error is reported
            if attempt == 4:
                errors.append(f"final read of {workload.name}: {exc}")
            time.sleep(2)


def _streams_end(ctx: RunContext) -> None:
    """Each consumer reads up to a timestamp taken now on its clock's cluster, then stops."""
    assert ctx.tables is not None
    streams = [w for w in ctx.workloads if isinstance(w, StreamWorkload)]
    for stream in streams:
        try:
            with ctx.tables.client(stream.clock_cluster) as client:
                until = client.generate_timestamp()
        except Exception:  # noqa: BLE001
            stream.record_end(False, 0)
            continue
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stream.caught_up(until):
            time.sleep(0.2)
        stream.record_end(stream.caught_up(until), until)


def summarise(scenario: str, seed: int, duration: float, history: History, results: list[CheckResult],
              errors: list[str], anomalies: list[str], seconds: float) -> dict[str, Any]:
    """Operations, faults, lost, duplicated and anomalies of one run; ``valid`` only if all are nil."""
    ops = history.ops
    counts = {t.value: sum(1 for op in ops if op.type is t and op.process not in ("final", "run", "nemesis"))
              for t in (OpType.OK, OpType.FAIL, OpType.UNKNOWN)}
    faults: dict[str, int] = {}
    for op in ops:
        if op.process == "nemesis" and op.f == "start":
            name = op.value.get("fault", "?")
            faults[name] = faults.get(name, 0) + 1
    lost = sum(r.lost_count for r in results)
    duplicated = sum(r.duplicated_count for r in results)
    anomaly_count = sum(r.anomaly_count for r in results) + len(anomalies) + len(errors) + (0 if results else 1)
    return {
        "scenario": scenario, "seed": seed, "duration": duration, "seconds": round(seconds, 1),
        "operations": counts, "faults": faults, "lost": lost, "duplicated": duplicated, "anomalies": anomaly_count,
        "valid": lost == 0 and duplicated == 0 and anomaly_count == 0,
        "checks": [r.to_dict() for r in results], "scenario_anomalies": anomalies, "errors": errors,
    }
