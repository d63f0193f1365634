#!/usr/bin/env bash
# Long fault runs (docs/reliability.md): every scenario of reptables.testing.chaos - replicated tables
# with the tracker, bootstrap copies, reshards, XDCR groups with joins and drains - under partitions,
# clock skew and jumps, SIGKILL, SIGSTOP and lossy links, for DURATION seconds of faults each; then
# the checkers read each run's history. Needs root (network namespaces, nftables, tc).
#
#   bash hack/chaos.sh [--duration SECONDS] [--seed N] [--scenarios a,b,...|all] [--out DIR]
#                      [--storage sqlite|postgresql]   # postgresql: a database per engine, cut off and crashed too
#   bash hack/chaos.sh list                  # the scenarios
#   bash hack/chaos.sh check DIR/x/history.jsonl   # check a history again, from the file alone
#   bash hack/chaos.sh cleanup [--kill]      # namespaces left by runs that died (and their processes)
#
# Defaults: every scenario, 600 s each, a random seed (printed; give it again to replay the same
# fault schedule), output in .data/chaos/<date>/: per scenario history.jsonl (every operation, fault
# and final read), summary.json and data/ (engine logs); DIR/summary.json sums them up. The exit
# status is 1 when any run lost, duplicated or found anything (2: this machine cannot run faults).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/bootstrap.sh
if [ "$(id -u)" != 0 ]; then
  echo "hack/chaos.sh: fault runs need root (network namespaces, nftables, tc)" >&2
  exit 2
fi
case "${1:-}" in
  list|check|cleanup) exec .venv/bin/python -m reptables.testing.chaos "$@" ;;
esac
out=".data/chaos/$(date +%Y%m%d-%H%M%S)"
seed=$(( $(date +%s) % 100000 ))
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
echo "hack/chaos.sh: seed $seed, output in $out"
exec .venv/bin/python -m reptables.testing.chaos run --out "$out" --seed "$seed" "${args[@]}"
