"""The comparison of benchmarks/regression.py, on real values: what fails, what passes, what is refused.

The smoke tests in this directory fail when a ratio of their run falls beyond the recorded spread
plus the margin; this checks that logic itself, without running a benchmark: a drop beyond the
spread fails with a message naming the benchmark, the ratio, the recorded value and spread, the
commit and the value now; a value inside the spread (or an improvement) passes; lower-is-better
ratios are held from above; a ratio with no recorded entry, or an entry no run measures, is a
finding, never a silent pass; a malformed baselines file is refused with a message that says
what is wrong. It also checks that the committed benchmarks/baselines.json holds exactly the
ratios the smoke tests yield.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import regression


def entry(runs: list[float], better: str = "higher", benchmark: str = "xdcr_bench",
          ratio: str = "xdcr_over_plain_rows_per_s", **extra: Any) -> dict[str, Any]:
    ordered = sorted(runs)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"benchmark": benchmark, "ratio": ratio, "value": median, "low": ordered[0], "high": ordered[-1],
            "runs": runs, "better": better, "commit": "abc1234", "date": "2026-11-27",
            "command": "python -m benchmarks.regression record --runs 5", "conditions": "one CPU-bound neighbour",
            **extra}


def baselines(*entries: dict[str, Any]) -> dict[tuple[str, str], regression.Baseline]:
    return regression.parse({"format": regression.FORMAT, "entries": list(entries)})


HIGHER = baselines(entry([0.9, 1.0, 1.1, 0.95, 1.05]))  # median 1.0, spread 0.9-1.1: limit 0.9 - 1.5 x 0.2 = 0.6


def test_a_drop_beyond_the_spread_fails_naming_what_fell_from_what_to_what() -> None:
    (found,) = regression.compare("xdcr_bench", {"xdcr_over_plain_rows_per_s": 0.55}, HIGHER)
    assert found.kind == "dropped" and found.value == 0.55
    msg = found.message
    for part in ("xdcr_bench", "xdcr_over_plain_rows_per_s", "fell to 0.55", "limit 0.6",
                 "recorded 1 (median of 5 runs, spread 0.9-1.1)", "at commit abc1234", "on 2026-11-27",
                 "python -m benchmarks.regression record --runs 5", "load average now"):
        assert part in msg, (part, msg)
    assert regression.explain([found]) == msg


def test_inside_the_spread_and_margin_passes_and_the_limit_is_where_the_docstring_puts_it() -> None:
    for value in (1.0, 0.9, 1.1, 0.61, 5.0):  # the median, the spread's ends, just above the limit, an improvement
        assert regression.compare("xdcr_bench", {"xdcr_over_plain_rows_per_s": value}, HIGHER) == [], value
    assert [f.kind for f in regression.compare("xdcr_bench", {"xdcr_over_plain_rows_per_s": 0.59}, HIGHER)] == [
        "dropped"]
    base = HIGHER[("xdcr_bench", "xdcr_over_plain_rows_per_s")]
    assert base.limit() == pytest.approx(0.6) and not base.too_noisy()


def test_the_tolerance_is_the_wider_of_the_spread_and_the_margin() -> None:
    # runs that agree: the margin's share of the median, never nothing
    agreeing = baselines(entry([2.0, 2.0, 2.0]))[("xdcr_bench", "xdcr_over_plain_rows_per_s")]
    assert agreeing.limit() == pytest.approx(2.0 * (1 - regression.MARGIN))
    assert not agreeing.passes(1.4) and agreeing.passes(1.6) and agreeing.passes(1.4, margin=0.4)
    # runs that spread wide: the spread's multiple, so wide that only a collapse would fail (too noisy)
    wide = baselines(entry([1.0, 2.0, 3.0]))[("xdcr_bench", "xdcr_over_plain_rows_per_s")]
    assert wide.tolerance() == pytest.approx(2.0 * regression.SPREADS) and wide.limit() == pytest.approx(-2.0)
    assert wide.too_noisy()


def test_lower_is_better_ratios_are_held_from_above() -> None:
    lower = baselines(entry([2.0, 2.5, 3.0], better="lower", ratio="xdcr_cpu_per_row_over_plain"))
    # limit: 3.0 + max(0.25 x 2.5, 1.5 x (3.0 - 2.0)) = 4.5
    for value in (0.5, 2.0, 3.0, 4.4):
        assert regression.compare("xdcr_bench", {"xdcr_cpu_per_row_over_plain": value}, lower) == [], value
    (found,) = regression.compare("xdcr_bench", {"xdcr_cpu_per_row_over_plain": 4.6}, lower)
    assert found.kind == "dropped"
    assert "(lower is better) rose to 4.6" in found.message and "limit 4.5" in found.message
    assert "recorded 2.5 (median of 3 runs, spread 2-3) at commit abc1234" in found.message


def test_a_ratio_without_a_recorded_entry_is_reported_not_passed() -> None:
    found = regression.compare("xdcr_bench", {"xdcr_over_plain_rows_per_s": 1.0, "xdcr_cpu_per_row_over_plain": 3.0},
                               HIGHER)
    assert [(f.ratio, f.kind) for f in found] == [("xdcr_cpu_per_row_over_plain", "not recorded")]
    assert "no recorded baseline" in found[0].message
    assert "python -m benchmarks.regression record --only xdcr_bench" in found[0].message
    # a benchmark with nothing recorded at all: every ratio it measured is reported
    found = regression.compare("stream_bench", {"with_over_without_stream_rows_per_s": 1.0}, HIGHER)
    assert [(f.benchmark, f.kind) for f in found] == [("stream_bench", "not recorded")]


def test_a_recorded_ratio_the_run_did_not_measure_is_reported() -> None:
    (found,) = regression.compare("xdcr_bench", {}, HIGHER)
    assert found.kind == "not measured" and found.ratio == "xdcr_over_plain_rows_per_s"
    assert "recorded 1 (median of 5 runs" in found.message and "did not measure it" in found.message


def test_a_value_that_is_not_a_positive_number_is_reported() -> None:
    for value in (math.nan, math.inf, 0.0, -1.0):
        (found,) = regression.compare("xdcr_bench", {"xdcr_over_plain_rows_per_s": value}, HIGHER)
        assert found.kind == "not a ratio" and "not a positive number" in found.message, value


@pytest.mark.parametrize("doc, says", [
    ("{", "is not JSON"),
    ([], "must be an object"),
    ({"format": 99, "entries": []}, "format 99 is not 1"),
    ({"format": 1}, "\"entries\" must be a list"),
    ({"format": 1, "entries": ["x"]}, "entry 0: an entry must be an object"),
    ({"format": 1, "entries": [{k: v for k, v in entry([1.0]).items() if k != "commit"}]}, "entry 0: missing commit"),
    ({"format": 1, "entries": [entry([1.0], better="faster")]}, "better must be \"higher\" or \"lower\""),
    ({"format": 1, "entries": [{**entry([1.0]), "value": "1.0"}]}, "value must be a number"),
    ({"format": 1, "entries": [{**entry([1.0, 2.0, 3.0]), "value": 2.5}]}, "must be the median, least and greatest"),
    ({"format": 1, "entries": [{**entry([1.0, 2.0]), "runs": []}]}, "runs must be a non-empty list"),
    ({"format": 1, "entries": [entry([-1.0])]}, "runs must be a non-empty list of positive numbers"),
    ({"format": 1, "entries": [entry([1.0]), entry([2.0])]}, "xdcr_bench xdcr_over_plain_rows_per_s is recorded twice"),
    ({"format": 1, "entries": [{**entry([1.0]), "commit": ""}]}, "commit and date must not be empty"),
])
def test_a_malformed_baselines_file_is_refused_with_what_is_wrong(tmp_path: Path, doc: object, says: str) -> None:
    path = tmp_path / "baselines.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(regression.BaselineError) as caught:
        regression.load(path)
    assert says in str(caught.value) and str(path) in str(caught.value)


def test_a_missing_baselines_file_says_how_to_record_it(tmp_path: Path) -> None:
    with pytest.raises(regression.BaselineError, match="does not exist: record it with `python -m benchmarks"):
        regression.load(tmp_path / "nowhere.json")


def test_the_recorder_summarises_runs_and_writes_what_load_reads(tmp_path: Path) -> None:
    bench = regression.BENCHMARKS["xdcr_bench"]
    runs = [{"xdcr_cpu_per_row_over_plain": c} for c in (2.9, 3.4, 3.1, 3.0, 3.3)]
    entries = regression.summarise(bench, runs, "abc1234", "2026-11-27", "python -m benchmarks.regression record",
                                   "no neighbour")
    (cpu,) = entries
    assert (cpu.ratio, cpu.value, cpu.low, cpu.high, cpu.better) == ("xdcr_cpu_per_row_over_plain", 3.1, 2.9, 3.4,
                                                                     "lower")
    assert cpu.runs == (2.9, 3.4, 3.1, 3.0, 3.3) and cpu.commit == "abc1234"
    with pytest.raises(SystemExit, match="not a positive number in every run"):
        regression.summarise(bench, [*runs, {"xdcr_cpu_per_row_over_plain": math.nan}], "abc1234", "2026-11-27",
                             "record", "no neighbour")
    path = tmp_path / "baselines.json"
    regression.write({(e.benchmark, e.ratio): e for e in entries}, path)
    assert regression.load(path) == {(e.benchmark, e.ratio): e for e in entries}


def test_under_the_recorder_check_writes_the_ratios_down_instead_of_comparing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ratios.jsonl"
    monkeypatch.setenv(regression.RECORD_ENV, str(out))
    ratios = {"engine_cpu_per_row_with_over_without_stream": 1.2}
    assert regression.check("stream_bench", ratios, path=tmp_path / "absent.json") == []
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["benchmark"] == "stream_bench" and line["ratios"] == ratios


def _write_stream_baseline(path: Path) -> None:
    doc = {"format": regression.FORMAT, "entries": [
        entry([1.1, 1.2, 1.15, 1.12, 1.18], better="lower", benchmark="stream_bench",
              ratio="engine_cpu_per_row_with_over_without_stream")]}
    path.write_text(json.dumps(doc))


def test_a_ratio_beyond_its_limit_is_measured_again_and_reported_only_if_it_stays_there(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    _write_stream_baseline(path)  # lower is better, spread 1.1-1.2: limit 1.2 + max(0.29, 0.15) = 1.49
    name = "engine_cpu_per_row_with_over_without_stream"
    calls: list[float] = []

    def again(value: float) -> Any:
        def measure() -> dict[str, float]:
            calls.append(value)
            return {name: value}
        return measure

    # a burst of load in one run: the second run is inside the limit, nothing is reported
    assert regression.check("stream_bench", {name: 2.0}, path=path, again=again(1.15)) == []
    assert calls == [1.15]
    # a change that costs a third shows twice: reported, with both values
    (found,) = regression.check("stream_bench", {name: 2.0}, path=path, again=again(1.9))
    assert found.kind == "dropped" and found.value == 1.9
    assert "rose to 2" in found.message and "again in a second run: 1.9" in found.message
    # a run inside the limit is not measured again
    calls.clear()
    assert regression.check("stream_bench", {name: 1.15}, path=path, again=again(9.0)) == [] and calls == []
    # without a second measurement the first run decides
    (alone,) = regression.check("stream_bench", {name: 2.0}, path=path)
    assert alone.kind == "dropped" and "second run" not in alone.message
    # a value that is not a ratio is reported at once: a second run cannot mend a missing figure
    (bad,) = regression.check("stream_bench", {name: 0.0}, path=path, again=again(1.15))
    assert bad.kind == "not a ratio" and calls == []


def test_check_refuses_ratios_the_benchmark_does_not_define() -> None:
    with pytest.raises(KeyError, match="yields the ratios"):
        regression.check("stream_bench", {"with_over_without_stream_rows_per_s": 1.0})
    with pytest.raises(KeyError, match="not a benchmark"):
        regression.check("no_such_bench", {})


def test_the_committed_baselines_hold_every_ratio_the_smoke_tests_yield() -> None:
    recorded = regression.load()
    defined = {(b.name, r.name): r.better for b in regression.BENCHMARKS.values() for r in b.ratios}
    assert set(recorded) == set(defined)
    for key, base in recorded.items():
        assert base.better == defined[key], key
        assert len(base.runs) >= 3, f"{key}: a spread needs at least 3 recorded runs, not {len(base.runs)}"
        assert not base.too_noisy(), f"{key}: {base.describe()}: its limit {base.limit():.4g} catches only a " \
                                     "collapse; leave the ratio out (benchmarks/regression.py, BENCHMARKS)"


def test_the_ratio_functions_take_medians_and_divide_the_right_way() -> None:
    def sides(east: float, west: float) -> dict[str, Any]:
        return {"sides": {"east": {"engine_cpu_ms_per_1000_rows": east}, "west": {"engine_cpu_ms_per_1000_rows": west}}}

    # the median over rounds and sides: one slow side of one round moves it little
    xdcr = {"cost": {"runs": {"plain": [sides(30.0, 34.0), sides(90.0, 31.0)], "xdcr": [sides(120.0, 140.0)]}}}
    assert regression.xdcr_bench_ratios(xdcr) == {"xdcr_cpu_per_row_over_plain": 130.0 / 32.5}
    stream = {"cost": {"runs": {"with": [{"engine_cpu_ms_per_1000_rows": 36.0}, {"engine_cpu_ms_per_1000_rows": 34.0}],
                                "without": [{"engine_cpu_ms_per_1000_rows": 30.0}]}}}
    assert regression.stream_bench_ratios(stream) == {"engine_cpu_per_row_with_over_without_stream": 35.0 / 30.0}
    run = {"scenario": "2 async", "end_to_end_rows_per_s": 40_000.0, "insert_rows_per_s": 80_000.0,
           "cpu_seconds": {"meta": 0.5, "replica_0": 0.6, "replica_1": 0.7}}
    assert regression.replication_ratios(run) == pytest.approx({"replica_cpu_over_meta_cpu": 1.3})
    assert regression.replication_ratios({**run, "scenario": "1 sync + 1 async"}) == pytest.approx(
        {"replica_cpu_over_meta_cpu": 1.3, "end_to_end_over_insert": 0.5})
    pg = {"cpu_seconds": {"publisher": 0.3, "subscriber1": 0.1, "subscriber2": 0.1}}
    assert regression.pg_logical_ratios(run, pg) == pytest.approx({"reptables_cpu_over_pg_logical_cpu": 1.8 / 0.5})
    # a zero figure is no ratio: compare() reports it rather than dividing by it
    idle = {"cpu_seconds": {"publisher": 0.0, "subscriber1": 0.0, "subscriber2": 0.0}}
    assert math.isnan(regression.pg_logical_ratios(run, idle)["reptables_cpu_over_pg_logical_cpu"])
