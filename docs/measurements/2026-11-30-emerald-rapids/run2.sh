#!/usr/bin/env bash
# Device check 2: OpenBLAS's core on this CPU (what it picks, what each core runs sgemm at, what
# ulysses re-selects at load), then issue 15's training beside PyTorch with the corrected core.
exec > >(tee "$OUT/log.txt") 2>&1
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
carried_env
export PMIX_MCA_pcompress_base_silence_warning=1
N=$(nproc); R=$PWD; cd /work/main
echo "=== 1. the core ulysses runs on, and the re-selection test"
build/ulysses attention --seq 1024 --heads 4 --head-dim 64 --check 2>&1 | grep -E "kernels|relative"
timeout 30 build/tests/test_kernels --gtest_filter='Isa.*' 2>&1 | grep -E "OK|FAILED|PASSED|Failure|core" | head
echo "=== 2. sgemm per OpenBLAS core ($(el) s)"
for c in - Prescott Haswell SkylakeX Cooperlake; do
  if [ "$c" = - ]; then e=(env -u OPENBLAS_CORETYPE); else e=(env OPENBLAS_CORETYPE=$c); fi
  "${e[@]}" timeout 40 python3 $R/.devb/sgemm.py 2>&1 | tail -1 | tee -a "$OUT/sgemm.txt"
done
M=(--width 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 4 --hidden 1376 --batch 1)
tr() {  # tr NAME CMD...: one JSON line to train.jsonl
  local name=$1; shift
  if [ "$(el)" -gt 265 ]; then echo "skip $name ($(el) s)"; return; fi
  train_json "$name" 80 "$@" | tee -a "$OUT/train.jsonl" | cut -c1-300
  grep -E "OpenBLAS core|throughput" /tmp/tr.out | head -3; grep -v -E "pmix|dlopen|Perhaps" /tmp/tr.err | tail -2
}
U() { rm -f /tmp/tr.log; tr "ulysses-cp$1-$2-s$3" mpirun --oversubscribe --bind-to none -n $1 build/ulysses train "${M[@]}" --seq $3 --dtype $2 --steps 3 --threads $((N/$1)) --eval-batches 0 --log /tmp/tr.log; }
T() { tr "torch-single-$1-s$2" /tmp/py bench/train_anchor.py --mode single "${M[@]}" --seq $2 --dtype $1 --steps 3 --warmup-seq 1024 --threads $N; }
echo "=== 3. training, width 512 model ($(el) s)"
U 2 f32 8192; T f32 8192; U 2 bf16 8192; T bf16 8192; U 1 f32 8192
U 2 f32 16384; T f32 16384; U 2 bf16 16384; T bf16 16384
echo "done in $(el) s"
