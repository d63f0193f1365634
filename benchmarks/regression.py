"""Regression checks of the benchmarks' quick runs: ratios, compared with the recorded ones.

Why. The benchmarks are run by hand, and a change that makes a figure much worse can land unnoticed
until the next manual run (the change log made every replica's apply 1.7x dearer, found by a
profile, not by a test). The smoke tests in tests/benchmarks/ already run every benchmark at tiny
sizes on every test run; this module makes them notice such a change.

What is compared: *ratios*, never absolute times. A ratio is dimensionless and comes out of one run
of one benchmark, so what the machine does to the run largely cancels out. Most kept ratios are of
CPU seconds (from ``/proc``): the replica engines' CPU over the meta's for the same rows, reptables'
engines' CPU over PostgreSQL logical replication's servers' for the same rows, the engine's CPU per
row with a stream open over without, XDCR over plain. Wall-clock rate ratios were recorded too, and
at the smoke sizes (runs of a fraction of a second, a busy neighbour beside them) they spread so
wide that only a collapse would have failed; those are left out, each with its measured spread, in
the comment above :data:`BENCHMARKS`, which also defines every kept ratio.

The recorded values live in ``benchmarks/baselines.json``, one entry per (benchmark, ratio): the
median of the recorded runs, their minimum and maximum (the measured spread) and every run,
which direction is better, the commit and date of the recording, the command that made it and
the conditions it ran in. ``python -m benchmarks.regression record`` makes them: it runs the smoke
tests themselves (the same sizes, fixtures and PostgreSQL server as the suite) ``--runs`` times
with :data:`RECORD_ENV` set, so that each test hands its ratios to :func:`check`, which writes them
down instead of comparing. The suite runs under ``pytest -n 3``: other workers keep the second
core busy. The recorder mimics that by default with one CPU-bound neighbour process of its own for
the whole recording (``--no-neighbour`` to leave it out), so the spread is the spread under the
suite's load, not an idle machine's.

The margin. A run fails a ratio when it is worse than the recorded *worst* run by more than
``max(MARGIN x median, SPREADS x (max - min))`` = ``max(0.25 x median, 1.5 x spread)``: for a
higher-is-better ratio, when it is below ``min`` minus that; for a lower-is-better one, above
``max`` plus that. Why so wide: a sixth run of the same code is worse than the worst of 5 recorded
runs one time in six, so the spread alone would fail healthy runs; and 5 runs sometimes happen to
agree. Simulated with a normally distributed ratio and 5 recorded runs, one spread beyond the worst
run still fails 1.5 % of healthy runs; one and a half spreads, with the floor of 25 % of the median,
fail about 1 in 2,000 when the ratio's deviation is 10 % of its median and 1 in 400 at 15 % (the
kept ratios' spreads correspond to 2-12 %). The floor also covers a CI machine busier than the
recording (the README's figures move by ~20 % with the load of this 2-core machine). What this
catches is therefore a change of a third or more (a replica's apply 1.7x dearer, a stream or XDCR
costing half as much again per row); smaller changes are for the full benchmarks, which compare
runs of minutes. A kept ratio's limit must stay within a factor of two of its median
(:meth:`Baseline.too_noisy`; tests/benchmarks/test_regression.py holds the committed file to it).

A ratio beyond its limit is measured once more before it fails (each smoke test hands :func:`check`
a second measurement, ``again``), and fails only if the second run is beyond the limit too: a CI run
failed the engine's CPU ratio with the machine's load average at 8.8, eight times the recording's,
and a change of the code shows in both runs where a burst of load seldom does.

A ratio measured without a recorded entry, or recorded but no longer measured, is a finding too
(never a silent pass), and a malformed baselines file is refused with :class:`BaselineError`. After
an intended change of a ratio (or of a smoke test's sizes), record that benchmark again and commit
baselines.json with the change:

    python -m benchmarks.regression record --runs 5                 # every benchmark, ~15 min
    python -m benchmarks.regression record --runs 5 --only xdcr_bench
    python -m benchmarks.regression show                            # the recorded entries and their limits
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
#: the recorded ratios, committed beside the benchmarks
BASELINES = Path(__file__).resolve().with_name("baselines.json")
#: the version of baselines.json's layout this module reads and writes
FORMAT = 1
#: the least tolerated distance beyond the recorded worst run, as a share of the recorded median,
#: and the tolerated distance as a multiple of the recorded spread (the module's docstring says why)
MARGIN = 0.25
SPREADS = 1.5
#: set by the recorder: the path of a file to which :func:`check` appends the ratios, one JSON line
#: per call, instead of comparing them
RECORD_ENV = "REPTABLES_RECORD_RATIOS"

Better = Literal["higher", "lower"]


# -- what is compared ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """One ratio a benchmark's quick run yields: its name, the better direction, what it is."""

    name: str
    better: Better
    meaning: str


@dataclass(frozen=True)
class Benchmark:
    """A smoke test's run of a benchmark and the ratios it yields."""

    name: str
    test: str
    """The pytest node id of the smoke test that makes the run (the recorder runs it)."""
    ratios: tuple[Ratio, ...]


def _positive(value: object) -> float:
    """``value`` as a float if it is a positive finite number, else NaN (which :func:`compare` reports)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        return math.nan
    return float(value)


def _div(a: object, b: object) -> float:
    x, y = _positive(a), _positive(b)
    return x / y if not (math.isnan(x) or math.isnan(y)) else math.nan


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


_SMOKE = "tests/benchmarks"

#: every benchmark run whose ratios are checked, by name.
#:
#: Left out, because at the smoke size their recorded spread (5 runs under a busy neighbour, 2026-11-27)
#: was so wide that the limit would let the ratio fall to less than half (or rise to more than twice)
#: its median, so only a collapse would fail, while the CPU ratio of the same cost is kept:
#:
#: * wall-clock rate ratios: engine_bench's Client insert over the raw SQLite ceiling (0.15-0.83 at
#:   50,000 rows; each side lasts a fraction of a second, and the neighbour takes the core of one and
#:   not the other) and PostgreSQL-backed over SQLite-backed inserts (0.50-1.35); replication_vs_pg's
#:   end to end over insert with 2 async replicas and two client threads (0.27-0.89: the inserts take
#:   0.1-0.3 s, so the ratio is mostly where the replicators' passes fall against the burst);
#:   reptables end to end over PostgreSQL logical replication, SQLite-backed at 20,000 rows (0.37-1.26)
#:   and PostgreSQL-backed at 2,000 rows (0.05-0.79); stream_bench's rows/s with a stream over without
#:   (0.84-1.21) and xdcr_bench's XDCR over plain rows/s (0.22-0.32, limit 0.11);
#: * failover_bench's window (and its detection part) over the tracker's probe period, one trial: 1.3-8.5
#:   (detection 0.97-8.0): under load the failing probe sometimes came a whole check period late, so
#:   the limit (~16 periods) would be far above the regression it is meant to catch (back to ~7 periods,
#:   the 1 s check and its grace);
#: * ha_bench's takeover (the window without the lease left) over the lease, median of 2 trials:
#:   0.15-0.33, limit 0.51;
#: * ``scale_bench.py`` (its smoke test measures idle threads, RSS and CPU at 2-4 tables: no ratio of one
#:   run) and ``bootstrap_bench.py`` (no smoke test: it needs Spark).
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("engine_bench", f"{_SMOKE}/test_engine_bench_smoke.py::test_sqlite_and_postgresql_side_by_side", (
        Ratio("engine_cpu_postgresql_over_sqlite", "lower",
              "the engine process's CPU seconds during the Client insert of the same rows, PostgreSQL-backed "
              "over SQLite-backed (the PostgreSQL server's own CPU is left out: the suite's other worker "
              "shares that server)"),
    )),
    Benchmark("replication_vs_pg.2_async",
              f"{_SMOKE}/test_replication_bench_smoke.py::test_every_replica_has_exactly_the_rows_written"
              "[2-async-2-threads]", (
                  Ratio("replica_cpu_over_meta_cpu", "lower",
                        "meta + 2 async replicas: the replica engines' mean CPU seconds from the first insert "
                        "until both are complete, over the meta engine's (applying a row against writing and "
                        "shipping it: the change log made this 1.7x dearer before 6fa5c22)"),
              )),
    Benchmark("replication_vs_pg.sync_async",
              f"{_SMOKE}/test_replication_bench_smoke.py::test_every_replica_has_exactly_the_rows_written"
              "[sync-async]", (
                  Ratio("end_to_end_over_insert", "higher",
                        "meta + 1 sync + 1 async replica: rows/s until both replicas have every row over rows/s "
                        "of the inserts on the meta (the sync replica paces the inserts; 1.0: the async one "
                        "keeps up)"),
                  Ratio("replica_cpu_over_meta_cpu", "lower",
                        "the replica engines' mean CPU seconds until complete over the meta engine's"),
              )),
    Benchmark("pg_logical", f"{_SMOKE}/test_pg_logical_smoke.py::test_logical_replication_delivers_every_row", (
        Ratio("reptables_cpu_over_pg_logical_cpu", "lower",
              "CPU seconds to replicate the same rows in the same batches to 2 replicas, from the first insert "
              "until both have every row: reptables' three SQLite-backed engines (meta + 2 async replicas) "
              "over PostgreSQL 15 logical replication's three servers (publisher + 2 subscribers); the "
              "load-proof form of issue 27's end-to-end comparison"),
    )),
    Benchmark("stream_bench",
              f"{_SMOKE}/test_stream_bench_smoke.py::test_quick_run_reports_every_figure_and_exactly_once", (
                  Ratio("engine_cpu_per_row_with_over_without_stream", "lower",
                        "the engine's CPU per row written flat out with one stream open over without (medians "
                        "of the alternated rounds): the write cost of a stream"),
              )),
    Benchmark("xdcr_bench",
              f"{_SMOKE}/test_xdcr_bench_smoke.py::test_quick_run_converges_and_accounts_for_every_conflict", (
                  Ratio("xdcr_cpu_per_row_over_plain", "lower",
                        "engine CPU per row written flat out, XDCR table over plain table (medians over the "
                        "rounds and both sides): the cost of replicating both ways"),
              )),
)}


# -- the ratios of each benchmark's output ---------------------------------------------------------


def engine_bench_ratios(data: Mapping[str, Any]) -> dict[str, float]:
    """From ``engine_bench.py --storage sqlite,postgresql --json``'s document."""
    lite, pg = data["backends"]["sqlite"], data["backends"]["postgresql"]
    return {"engine_cpu_postgresql_over_sqlite": _div(pg["details"]["cpu_insert_client"]["engine_s"],
                                                      lite["details"]["cpu_insert_client"]["engine_s"])}


def replication_ratios(run: Mapping[str, Any]) -> dict[str, float]:
    """From one ``replication_vs_pg.ReplicationRun.to_json()``; ``end_to_end_over_insert`` only with a sync
    replica (see :data:`BENCHMARKS`)."""
    cpu = run["cpu_seconds"]
    out = {"replica_cpu_over_meta_cpu": _div(statistics.fmean([cpu["replica_0"], cpu["replica_1"]]), cpu["meta"])}
    if run["scenario"] == "1 sync + 1 async":
        out["end_to_end_over_insert"] = _div(run["end_to_end_rows_per_s"], run["insert_rows_per_s"])
    return out


def pg_logical_ratios(reptables_run: Mapping[str, Any], pg_run: Mapping[str, Any]) -> dict[str, float]:
    """From ``replication_vs_pg.ReplicationRun.to_json()`` and ``asdict(pg_logical.PgThroughputResult)`` of
    the same rows: the engines' CPU over the PostgreSQL servers'."""
    engines = [reptables_run["cpu_seconds"][name] for name in ("meta", "replica_0", "replica_1")]
    return {"reptables_cpu_over_pg_logical_cpu": _div(sum(engines), sum(pg_run["cpu_seconds"].values()))}


def stream_bench_ratios(data: Mapping[str, Any]) -> dict[str, float]:
    """From ``stream_bench.py --json``'s document (its alternated cost rounds)."""
    runs = data["cost"]["runs"]
    cpu = {mode: _median([e["engine_cpu_ms_per_1000_rows"] for e in runs[mode]]) for mode in ("with", "without")}
    return {"engine_cpu_per_row_with_over_without_stream": _div(cpu["with"], cpu["without"])}


def xdcr_bench_ratios(data: Mapping[str, Any]) -> dict[str, float]:
    """From ``xdcr_bench.py --json``'s document (its alternated cost rounds)."""
    runs = data["cost"]["runs"]
    cpu = {mode: _median([s["engine_cpu_ms_per_1000_rows"] for e in runs[mode] for s in e["sides"].values()])
           for mode in ("plain", "xdcr")}
    return {"xdcr_cpu_per_row_over_plain": _div(cpu["xdcr"], cpu["plain"])}


# -- the recorded values ---------------------------------------------------------------------------


class BaselineError(ValueError):
    """baselines.json is missing, unreadable or malformed: the check cannot be made."""


@dataclass(frozen=True)
class Baseline:
    """One recorded ratio."""

    benchmark: str
    ratio: str
    value: float
    """The median of the recorded runs."""
    low: float
    high: float
    """The measured spread: the least and the greatest recorded run."""
    runs: tuple[float, ...]
    better: Better
    commit: str
    date: str
    command: str
    conditions: str
    """What ran beside the recording (neighbour, load averages): the spread holds for that."""

    def tolerance(self, margin: float = MARGIN) -> float:
        """How far beyond the recorded worst run a run may be: :data:`SPREADS` x the recorded spread, at
        least ``margin`` x the median."""
        return max(margin * self.value, SPREADS * (self.high - self.low))

    def limit(self, margin: float = MARGIN) -> float:
        """The worst value that still passes."""
        if self.better == "higher":
            return self.low - self.tolerance(margin)
        return self.high + self.tolerance(margin)

    def too_noisy(self, margin: float = MARGIN) -> bool:
        """True when the limit lets the ratio fall below half its median (or rise above twice it): a check
        that only a collapse fails (such ratios are left out: :data:`BENCHMARKS`)."""
        return self.limit(margin) < self.value / 2 if self.better == "higher" else self.limit(margin) > self.value * 2

    def passes(self, value: float, margin: float = MARGIN) -> bool:
        return value >= self.limit(margin) if self.better == "higher" else value <= self.limit(margin)

    def describe(self) -> str:
        return (f"recorded {self.value:.4g} (median of {len(self.runs)} runs, spread {self.low:.4g}-{self.high:.4g}) "
                f"at commit {self.commit} on {self.date}")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["runs"] = list(self.runs)
        return out


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "benchmark": str, "ratio": str, "value": (int, float), "low": (int, float), "high": (int, float),
    "runs": list, "better": str, "commit": str, "date": str, "command": str, "conditions": str}


def _entry(raw: object, where: str) -> Baseline:
    if not isinstance(raw, dict):
        raise BaselineError(f"{where}: an entry must be an object, not {type(raw).__name__}")
    missing = [k for k in _FIELDS if k not in raw]
    if missing:
        raise BaselineError(f"{where}: missing {', '.join(missing)}")
    for key, kind in _FIELDS.items():
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BaselineError(f"{where}: {key} must be {getattr(kind, '__name__', 'a number')}, not {value!r}")
    if raw["better"] not in ("higher", "lower"):
        raise BaselineError(f"{where}: better must be \"higher\" or \"lower\", not {raw['better']!r}")
    runs = raw["runs"]
    if not runs or not all(isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r) and r > 0
                           for r in runs):
        raise BaselineError(f"{where}: runs must be a non-empty list of positive numbers, not {runs!r}")
    value, low, high = float(raw["value"]), float(raw["low"]), float(raw["high"])
    if not all(math.isfinite(x) and x > 0 for x in (value, low, high)) or not low <= value <= high:
        raise BaselineError(f"{where}: value, low and high must be positive with low <= value <= high, not "
                            f"{value!r}, {low!r}, {high!r}")
    median = statistics.median(runs)
    if low != min(runs) or high != max(runs) or not math.isclose(value, median, rel_tol=1e-6, abs_tol=1e-6):
        raise BaselineError(f"{where}: value, low and high must be the median, least and greatest of runs {runs}")
    if not raw["commit"] or not raw["date"]:
        raise BaselineError(f"{where}: commit and date must not be empty")
    return Baseline(raw["benchmark"], raw["ratio"], value, low, high, tuple(float(r) for r in runs), raw["better"],
                    raw["commit"], raw["date"], raw["command"], raw["conditions"])


def parse(doc: object, source: str = "baselines") -> dict[tuple[str, str], Baseline]:
    """The entries of a baselines document, by (benchmark, ratio); :class:`BaselineError` if malformed."""
    if not isinstance(doc, dict):
        raise BaselineError(f"{source}: the document must be an object with \"format\" and \"entries\"")
    if doc.get("format") != FORMAT:
        raise BaselineError(f"{source}: format {doc.get('format')!r} is not {FORMAT}, the one this module reads")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise BaselineError(f"{source}: \"entries\" must be a list")
    out: dict[tuple[str, str], Baseline] = {}
    for i, raw in enumerate(entries):
        entry = _entry(raw, f"{source}, entry {i}")
        key = (entry.benchmark, entry.ratio)
        if key in out:
            raise BaselineError(f"{source}, entry {i}: {entry.benchmark} {entry.ratio} is recorded twice")
        out[key] = entry
    return out


def load(path: Path = BASELINES) -> dict[tuple[str, str], Baseline]:
    """The recorded entries of ``path``; :class:`BaselineError` if it is missing or malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BaselineError(f"{path} does not exist: record it with `python -m benchmarks.regression record`") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BaselineError(f"{path} is not JSON: {exc}") from None
    return parse(doc, str(path))


# -- the comparison --------------------------------------------------------------------------------


Kind = Literal["dropped", "not recorded", "not measured", "not a ratio"]


@dataclass(frozen=True)
class Finding:
    """A ratio that failed the check, and why."""

    benchmark: str
    ratio: str
    kind: Kind
    value: float | None
    message: str


def _record_hint(benchmark: str) -> str:
    return f"`python -m benchmarks.regression record --only {benchmark}`"


def compare(benchmark: str, ratios: Mapping[str, float], baselines: Mapping[tuple[str, str], Baseline],
            margin: float = MARGIN) -> list[Finding]:
    """The ratios of one run of ``benchmark`` that fail against ``baselines``: dropped beyond the spread and
    the margin, not recorded, recorded but not measured, or not a positive finite number."""
    found: list[Finding] = []
    for name, value in sorted(ratios.items()):
        base = baselines.get((benchmark, name))
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            found.append(Finding(benchmark, name, "not a ratio", None,
                                 f"{benchmark}: ratio {name} came out as {value!r}, not a positive number "
                                 "(a figure of the run is zero or missing)"))
        elif base is None:
            found.append(Finding(benchmark, name, "not recorded", value,
                                 f"{benchmark}: ratio {name} = {value:.4g} has no recorded baseline in "
                                 f"{BASELINES.name}: record one with {_record_hint(benchmark)}"))
        elif not base.passes(value, margin):
            worse = "fell" if base.better == "higher" else "rose"
            found.append(Finding(benchmark, name, "dropped", value,
                                 f"{benchmark}: ratio {name} ({base.better} is better) {worse} to {value:.4g}, beyond "
                                 f"the limit {base.limit(margin):.4g}; {base.describe()} by `{base.command}` "
                                 f"({base.conditions}); load average now {_load_average()}"))
    for bench, name in sorted(baselines):
        if bench == benchmark and name not in ratios:
            found.append(Finding(benchmark, name, "not measured", None,
                                 f"{benchmark}: ratio {name} is recorded ({baselines[(bench, name)].describe()}) "
                                 f"but this run did not measure it: measure it, or drop it with "
                                 f"{_record_hint(benchmark)}"))
    return found


def explain(findings: Sequence[Finding]) -> str:
    return "\n".join(f.message for f in findings)


def check(benchmark: str, ratios: Mapping[str, float], path: Path = BASELINES,
          again: Callable[[], Mapping[str, float]] | None = None) -> list[Finding]:
    """What a smoke test calls with the ratios of its run: the findings of :func:`compare` against ``path``.

    ``again`` measures the ratios once more (a second run of the same smoke measurement). When the
    first run's only findings are ratios that went beyond their limits, it is called once, and a ratio
    is reported only if it went beyond its limit in both runs. Why: a run of a fraction of a second
    is at the mercy of what else the machine does (a CI run failed one with the 1-minute load average at
    8.8 on 2 CPUs, eight times the recording's); a change of the code that costs a third shows in
    every run, a burst of load seldom in two runs in a row. Findings that are not about a value (not
    recorded, not measured, not a ratio) are reported at once: a second run cannot change them.

    Under the recorder (:data:`RECORD_ENV` set), the ratios are appended to the recorder's file and
    nothing is compared (the recording is what the comparison will need)."""
    if benchmark not in BENCHMARKS:
        raise KeyError(f"{benchmark} is not a benchmark of benchmarks/regression.py: {sorted(BENCHMARKS)}")
    expected = {r.name for r in BENCHMARKS[benchmark].ratios}
    if set(ratios) != expected:
        raise KeyError(f"{benchmark} yields the ratios {sorted(expected)}, not {sorted(ratios)}")
    out = os.environ.get(RECORD_ENV)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"benchmark": benchmark, "ratios": dict(ratios), "load": _load_average()}) + "\n")
        return []
    baselines = load(path)
    found = compare(benchmark, ratios, baselines)
    if not found or again is None or any(f.kind != "dropped" for f in found):
        return found
    second = compare(benchmark, again(), baselines)
    firsts = {f.ratio: f for f in found}
    return [replace(f, message=f"{firsts[f.ratio].message}; and again in a second run: {f.value:.4g}")
            for f in second if f.ratio in firsts or f.kind != "dropped"]


def _load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


# -- the recorder ----------------------------------------------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def _select(only: Sequence[str]) -> list[Benchmark]:
    if not only:
        return list(BENCHMARKS.values())
    chosen = [b for b in BENCHMARKS.values() if any(b.name == o or b.name.startswith(o + ".") for o in only)]
    unknown = [o for o in only if not any(b.name == o or b.name.startswith(o + ".") for b in BENCHMARKS.values())]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return chosen


def _spin(seconds: float) -> None:  # the neighbour's loop: one core busy, as the suite's other worker keeps it
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


def summarise(benchmark: Benchmark, runs: Sequence[Mapping[str, float]], commit: str, date: str, command: str,
              conditions: str) -> list[Baseline]:
    """The entries of ``benchmark`` from the ratios of its recorded runs: median, least and greatest."""
    out = []
    for ratio in benchmark.ratios:
        values = tuple(round(float(r[ratio.name]), 6) for r in runs)
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise SystemExit(f"{benchmark.name}: ratio {ratio.name} was not a positive number in every run: {values}")
        out.append(Baseline(benchmark.name, ratio.name, statistics.median(values), min(values), max(values), values,
                            ratio.better, commit, date, command, conditions))
    return out


def write(entries: Mapping[tuple[str, str], Baseline], path: Path = BASELINES) -> None:
    doc = {"format": FORMAT,
           "about": "Recorded ratios of the benchmarks' quick runs (the smoke tests in tests/benchmarks/): "
                    "benchmarks/regression.py explains them; re-record with `python -m benchmarks.regression record`.",
           "entries": [entries[k].to_json() for k in sorted(entries)]}
    parse(json.loads(json.dumps(doc)), str(path))  # never write what load() would refuse
    path.write_text(json.dumps(doc, indent=2) + "\n")


def record(runs: int, only: Sequence[str], neighbour: bool, path: Path, argv: Sequence[str]) -> int:
    chosen = _select(only)
    commit = _git("rev-parse", "--short", "HEAD")
    changed = [name for name in _git("diff", "--name-only", "HEAD").splitlines() if (ROOT / name) != path]
    # the code measured beyond HEAD (the benchmarks' and tests' own changes are the recorder's business)
    product = [name for name in changed if not name.startswith(("tests/", "benchmarks/", "docs/"))]
    if changed:
        print(f"note: the working tree differs from {commit} in {len(changed)} file(s) "
              f"({', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}): the recording measures that tree",
              file=sys.stderr)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    command = "python -m benchmarks.regression " + " ".join(shlex.quote(a) for a in argv)
    spinner = None
    if neighbour:
        spinner = subprocess.Popen([sys.executable, "-c", f"from benchmarks.regression import _spin; _spin({86400})"],
                                   cwd=ROOT)
    collected: dict[str, list[dict[str, float]]] = {b.name: [] for b in chosen}
    loads: list[str] = [_load_average()]
    tests = list(dict.fromkeys(b.test for b in chosen))
    try:
        with tempfile.TemporaryDirectory(prefix="reptables-regression-") as tmp:
            for i in range(runs):
                out = Path(tmp) / f"run-{i}.jsonl"
                started = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly",
                                       "-p", "no:cacheprovider", *tests],
                                      cwd=ROOT, env={**os.environ, RECORD_ENV: str(out)})
                if proc.returncode != 0:
                    print(f"run {i + 1}: the smoke tests failed (exit {proc.returncode}): nothing recorded",
                          file=sys.stderr)
                    return 1
                lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
                for line in lines:
                    if line["benchmark"] in collected:
                        collected[line["benchmark"]].append(line["ratios"])
                    loads.append(line["load"])
                print(f"run {i + 1}/{runs}: {time.monotonic() - started:.0f} s, load average {_load_average()}; "
                      + "; ".join(f"{x['benchmark']} " + ", ".join(f"{k} {v:.3g}" for k, v in x["ratios"].items())
                                  for x in lines), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    missing = [name for name, got in collected.items() if len(got) != runs]
    if missing:
        print(f"{', '.join(missing)}: not one set of ratios per run (did the smoke test call regression.check?)",
              file=sys.stderr)
        return 1
    one_minute = [float(x.split()[0]) for x in loads if x != "unknown"]
    conditions = (f"{'one CPU-bound neighbour process beside the tests' if neighbour else 'no neighbour of its own'}"
                  + (f"; 1-minute load average {min(one_minute):.1f}-{max(one_minute):.1f}" if one_minute else "")
                  + f"; {os.cpu_count()} CPUs"
                  + (f"; measured with uncommitted changes to {', '.join(product)}" if product else ""))
    try:
        entries = load(path)
    except BaselineError as exc:
        if path.exists():
            print(f"{exc}: rewriting the file from this recording", file=sys.stderr)
        entries = {}
    recorded = {b.name for b in chosen}
    entries = {k: v for k, v in entries.items() if k[0] not in recorded}
    for bench in chosen:
        for entry in summarise(bench, collected[bench.name], commit, date, command, conditions):
            entries[(entry.benchmark, entry.ratio)] = entry
    write(entries, path)
    show({k: v for k, v in entries.items() if k[0] in recorded})
    print(f"written to {path}")
    return 0


def show(entries: Mapping[tuple[str, str], Baseline]) -> None:
    for key in sorted(entries):
        e = entries[key]
        wide = e.too_noisy()
        print(f"{e.benchmark:30} {e.ratio:45} {e.better:6} median {e.value:8.4g}  spread {e.low:.4g}-{e.high:.4g} "
              f"({len(e.runs)} runs)  limit {e.limit():.4g}{'  (TOO NOISY: only a halving fails)' if wide else ''}  "
              f"{e.commit} {e.date}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.regression", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the smoke tests --runs times and write their ratios to baselines.json")
    rec.add_argument("--runs", type=int, default=5, help="recorded runs of each smoke test (default 5)")
    rec.add_argument("--only", action="append", default=[], metavar="NAME",
                     help="only this benchmark (a prefix before '.' selects its runs); repeatable: "
                          + ", ".join(BENCHMARKS))
    rec.add_argument("--no-neighbour", dest="neighbour", action="store_false",
                     help="no CPU-bound neighbour process (by default one runs beside the tests, as the suite's "
                          "second pytest-xdist worker does)")
    rec.add_argument("--baselines", type=Path, default=BASELINES, help=f"the file to write (default {BASELINES})")
    sh = sub.add_parser("show", help="the recorded entries and the limit each run is held to")
    sh.add_argument("--baselines", type=Path, default=BASELINES)
    args = p.parse_args(argv)
    if args.command == "show":
        try:
            show(load(args.baselines))
        except BaselineError as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return record(args.runs, args.only, args.neighbour, args.baselines.resolve(), argv)


if __name__ == "__main__":
    sys.exit(main())
