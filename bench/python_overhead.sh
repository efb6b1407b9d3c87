#!/usr/bin/env bash
# The Python binding's overhead: the same Ulysses (a2a) forward + backward on 2 ranks x 1
# thread, from C++ (`ulysses attention`) and from Python (ContextParallelAttention through
# autograd), alternating ROUNDS times; prints each pair and the median ratio.
# usage: bench/python_overhead.sh [SEQ=16384] [ROUNDS=3] [PYTHON=/usr/bin/python3]
set -euo pipefail
cd "$(dirname "$0")/.."
seq=${1:-16384} rounds=${2:-3} python=${3:-/usr/bin/python3}
source scripts/mpi_env
json=$(mktemp)
trap 'rm -f "$json"' EXIT
ratios=()
for ((r = 1; r <= rounds; r++)); do
  "${MPIRUN[@]}" -n 2 build/ulysses attention --seq "$seq" --heads 8 --head-dim 64 --causal --backward \
    --repeat 1 --threads 1 --json "$json" > /dev/null
  cpp=$("$python" -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['forward_s'] + j['backward_s'])" "$json")
  py=$(PYTHONPATH=build/python "${MPIRUN[@]}" -n 2 "$python" bench/python_anchor.py --seq "$seq" --causal --reps 1 \
         --only-cp | awk '/ContextParallelAttention/ {print $(NF-4) / 1000}')
  ratio=$("$python" -c "print(f'{$py / $cpp:.3f}')")
  ratios+=("$ratio")
  echo "round $r: C++ $cpp s, Python $py s, Python / C++ $ratio"
done
"$python" -c "import statistics,sys; print('median Python / C++:', statistics.median(map(float, sys.argv[1:])))" "${ratios[@]}"
