#!/usr/bin/env bash
# The README's test command: installs everything into .venv, checks ruff, runs the pytest suite.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
# pytest exits 5 when it collects nothing: that is a failure here, never a pass
exec .venv/bin/python -m pytest "$@"
