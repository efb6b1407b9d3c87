#!/usr/bin/env bash
# Device check 1: the AVX-512/AMX code paths on a real CPU that has them, and issue 15's
# training beside PyTorch on 16 cores. Binaries built on the Debian 12 dev machine (runtime
# ISA dispatch), OpenMPI 4.1 + OpenBLAS carried and relocated under /opt/ub.
exec > >(tee "$OUT/log.txt") 2>&1
set -x
t0=$(date +%s)
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
carried_env
export ULYSSES_ANCHOR_PYTHON=/tmp/py
lscpu > "$OUT/cpu.txt"; grep -m1 flags /proc/cpuinfo >> "$OUT/cpu.txt"
grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|L2|L3|NUMA node\(" "$OUT/cpu.txt"
grep -o -w -E "avx512f|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_int8" /proc/cpuinfo | sort | uniq -c
/tmp/py -c 'import torch; print("torch", torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())'
N=$(nproc)
cd /work/main
M=(--width 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 4 --hidden 1376 --batch 1)

echo "=== 1. kernels on every ISA this CPU runs (real, not emulated)"
timeout 90 build/tests/test_kernels 2>&1 | grep -E "^\[  (FAILED|PASSED) |tests ran|Failure|error" | head -40

echo "=== 2. end to end, checked against float64"
for dt in f32 bf16; do
  timeout 30 build/ulysses attention --seq 2048 --heads 8 --head-dim 64 --causal --backward --dtype $dt --check --threads 4 2>&1 | grep -E "engine|isa|relative|OK|FAIL|rror" | head -6
  timeout 30 mpirun --oversubscribe --bind-to none -n 2 build/ulysses attention --strategy a2a --seq 2048 --heads 8 --head-dim 64 --causal --backward --dtype $dt --check --threads 4 2>&1 | grep -E "engine|relative|OK|FAIL|rror" | head -4
done

echo "=== 3. training, width 512 model, s 8192: ulysses cp 1 x $N threads, cp 2 x $((N/2)), PyTorch 1 x $N  ($(( $(date +%s) - t0 )) s)"
tr() {  # tr NAME CMD...: one JSON line to train.jsonl
  local name=$1; shift
  train_json "$name" 75 "$@" | tee -a "$OUT/train.jsonl"
  grep -E "engine|sgemm|isa" /tmp/tr.out | head -3; tail -2 /tmp/tr.err
}
for dt in f32 bf16; do
  rm -f /tmp/tr.log; tr "ulysses-cp1-$dt" build/ulysses train "${M[@]}" --seq 8192 --dtype $dt --steps 3 --threads $N --eval-batches 0 --log /tmp/tr.log
  rm -f /tmp/tr.log; tr "ulysses-cp2-$dt" mpirun --oversubscribe --bind-to none -n 2 build/ulysses train "${M[@]}" --seq 8192 --dtype $dt --steps 3 --threads $((N/2)) --eval-batches 0 --log /tmp/tr.log
  tr "torch-single-$dt" /tmp/py bench/train_anchor.py --mode single "${M[@]}" --seq 8192 --dtype $dt --steps 3 --warmup-seq 1024 --threads $N
done

echo "=== 4. kernel section of the benchmark, 1 thread per rank, with PyTorch SDPA  ($(( $(date +%s) - t0 )) s)"
rem=$(( 400 - ($(date +%s) - t0) )); [ $rem -lt 30 ] && rem=30
timeout $rem mpirun --oversubscribe --bind-to none -n 2 build/ulysses_bench --only kernels --reps 3 --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.txt" | tail -70
echo "done in $(( $(date +%s) - t0 )) s"
