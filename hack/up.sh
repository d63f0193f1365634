#!/usr/bin/env bash
# The README's first command: installs reptables into .venv and runs the product on this machine.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/reptables up "$@"
