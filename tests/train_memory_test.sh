#!/usr/bin/env bash
# `ulysses train`'s memory model against the measured peak RSS per rank, f32 and bf16 (each shape
# its own job: peak RSS is per process and only grows), within 10 %; --max-memory refuses a run
# the model says will not fit, with both numbers (on every rank: test_train); `plan --train` answers.
# arguments: ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh"
trap 'rm -rf "$dir"' EXIT
model=(--width 128 --heads 4 --kv-heads 2 --head-dim 32 --hidden 344 --layers 2 --steps 2 --eval-batches 0)
check_shape() {  # name, then train flags (on $ranks ranks, 2 unless set)
  local name=$1; shift
  run "${ranks:-2}" train "${model[@]}" "$@" --log "$dir/m.jsonl" > "$dir/m.log" 2>&1 || { bad "$name: run"; cat "$dir/m.log"; return; }
  local ratio
  ratio=$(grep 'measured peak RSS' "$dir/m.log" | grep -o 'measured/predicted [0-9.]*' | cut -d' ' -f2)
  if awk -v r="$ratio" 'BEGIN { exit !(r >= 0.90 && r <= 1.10) }'; then ok "$name: measured/predicted $ratio"
  else bad "$name: measured/predicted '$ratio'"; cat "$dir/m.log"; fi
  grep -q '"peak_rss_bytes": [1-9]' "$dir/m.jsonl" && grep -q '"predicted_bytes": [1-9]' "$dir/m.jsonl" \
    && ok "$name: peak and prediction in the JSON log" || bad "$name: JSON log lacks the memory fields"
}
check_shape "plain, s 1024 x 8" --seq 1024 --batch 8
check_shape "checkpointed + tiled, s 2048 x 8" --seq 2048 --batch 8 --checkpoint-activations --tiled-mlp --tiled-loss
check_shape "bf16, plain, s 1024 x 8" --seq 1024 --batch 8 --dtype bf16
check_shape "bf16, checkpointed + tiled, s 2048 x 8" --seq 2048 --batch 8 --checkpoint-activations --tiled-mlp --tiled-loss --dtype bf16
# Variable-length steps: same-length sequences run as one batch (512 of 64 tokens: one batch of
# 512), one long sequence, a pareto tail (the calibration's one-rank probe is its peak).
check_shape "--lengths 512x64" --lengths 512x64
check_shape "--lengths 1x8192" --lengths 1x8192
check_shape "--lengths pareto:16:64:4096:1.2:1" --lengths pareto:16:64:4096:1.2:1
# A batch split under the cap runs in pieces of unequal size by one sequence (171, 171, 170): the
# pool reuses the earlier pieces' blocks for the last (1.28 before it took near sizes).
check_shape "--lengths 512x64 in three pieces under --max-memory 180MiB" --lengths 512x64 --max-memory 180MiB
# One rank runs every sequence of a step in turn, each its own size after the 1024-token
# calibration: the activations' buffers of one size must not pin memory the next cannot use
# (1.20 and 1.14 while they lived in malloc's heap).
ranks=1 check_shape "one rank, --lengths 1x1031" --lengths 1x1031
ranks=1 check_shape "one rank, --lengths pareto:16:64:4096:1.2:1" --lengths pareto:16:64:4096:1.2:1

run 2 train "${model[@]}" --seq 4096 --batch 8 --max-memory 100MiB > "$dir/cap.log" 2>&1
if grep -q 'needs a predicted .* per rank, more than --max-memory 100.0 MiB' "$dir/cap.log"; then
  ok "--max-memory refuses with the numbers"
else bad "--max-memory"; cat "$dir/cap.log"; fi
run 1 plan --train --heads 8 --kv-heads 2 --head-dim 64 --width 512 --layers 4 --max-memory 2GiB --cp 4 > "$dir/plan.log" 2>&1
if grep -qE '^ +4 +a2a +[0-9]+ +[0-9]+' "$dir/plan.log"; then ok "plan --train"; else bad "plan --train"; cat "$dir/plan.log"; fi
exit $((fails > 0))
