#!/usr/bin/env bash
# The README's first command: installs reptables into .venv and runs the tour — three local engines,
# the quickstart manifests reconciled by the operator's core and tracker, a failover, a Spark
# bootstrap and the queue check, step by step (operator/local/tour.py, docs/getting-started.md).
# Options go to the tour: --data-dir DIR, --manifests DIR, --free-ports.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/python -m reptables.operator.local.tour "$@"
