#!/usr/bin/env bash
# Sourced by hack/up.sh and hack/test.sh: make .venv and install reptables (with test extras) into it.
# Needs only python3 >= 3.11 with venv; everything else comes from PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
