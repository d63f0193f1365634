#!/usr/bin/env bash
# The fuzzers' long mode (tests/engine/test_fuzz.py, test_fuzz_xdcr.py): the suite sends 200 derandomized
# examples a test (60 a test of the XDCR fuzzer), the same ones every run; this sends EXAMPLES a test
# (default 2,000; the XDCR fuzzer three tenths of it), fresh ones from a seed it prints, on both storage
# backends. A failure names its example; the seed sends the same examples again.
#
#   bash hack/fuzz.sh [--examples N] [--seed N] [--backends sqlite,postgresql] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/bootstrap.sh
examples=2000
seed=$(( $(date +%s) % 1000000 ))
backends=sqlite,postgresql
while [ $# -gt 0 ]; do
  case "$1" in
    --examples) examples="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    *) break ;;
  esac
done
echo "hack/fuzz.sh: $examples examples a test, seed $seed (bash hack/fuzz.sh --seed $seed sends them again)"
REPTABLES_FUZZ_EXAMPLES="$examples" REPTABLES_FUZZ_SEED="$seed" REPTABLES_TEST_BACKENDS="$backends" \
  exec .venv/bin/python -m pytest -p no:cacheprovider -n 2 --hypothesis-seed="$seed" \
  tests/engine/test_fuzz.py tests/engine/test_fuzz_xdcr.py "$@"
