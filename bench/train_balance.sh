#!/usr/bin/env bash
# The balancer's policies measured on one long-tail step: `ulysses train` at 2 ranks x 1 thread,
# the width-512 model (2 layers), --lengths 1x16384,32x512, one run per policy; prints each
# step's time, the balancer's prediction (calibrated on this machine at start) and every rank's
# idle time from the --log lines. 3 steps: the summary's median then drops one outlier step of
# a shared machine. 1x8192,32x256 keeps the long tail's shape at a quarter of the time.
# usage: bench/train_balance.sh [BUILD_DIR] [LENGTHS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} lengths=${2:-1x16384,32x512}
source scripts/mpi_env
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
model="--width 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 2 --hidden 1376 --steps 3 --threads 1 --eval-batches 0"
for run in "--dp 1" "--dp 2" "--balance pow2" "--balance dynamic"; do
  echo "== $run"
  "${MPIRUN[@]}" -n 2 "$build/ulysses" train $model --lengths "$lengths" $run --log "$scratch/log.jsonl" |
    grep -E "calibrated|step time"
  python3 -c 'import json, sys
for r in map(json.loads, open(sys.argv[1])):
    step, s, p, idle = r["step"], r["step_s"], r["predicted_step_s"], r["idle_ms"]
    print(f"step {step}: {s:.2f} s (predicted {p:.2f} s, measured/predicted {s / p:.2f}), idle ms {idle}")' \
    "$scratch/log.jsonl"
done
