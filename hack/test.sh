#!/usr/bin/env bash
# The README's test command: installs everything into .venv, checks ruff, import contracts and mypy,
# runs the pytest suite.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
# the architecture (pyproject.toml [tool.importlinter]; docs/architecture.md) and the types, the
# benchmark scripts' too
.venv/bin/lint-imports
.venv/bin/mypy -p reptables.engine -p reptables.operator -p reptables.sparkapps -p reptables.cache -p reptables.testing \
    -p benchmarks
# pytest exits 5 when it collects nothing: that is a failure here, never a pass
# three workers (pytest-xdist) on the 2 cores: many tests wait on engine processes, timers or faults
# (two workers left the machine idle a quarter of the time: 25:24 then, 22:11 with three on
# 2026-11-28, CPU 94 % busy; 35:16 on a slower machine on 2026-11-30, bash .ci/run on a clean clone);
# tests/conftest.py keeps each module
# on one worker, in order, and all Spark tests on one (one Spark session per run), and starts the
# minutes-long modules first (tests/conftest.py HEAVY_FIRST) so that the workers finish together
exec .venv/bin/python -m pytest -n 3 --durations=25 "$@"
