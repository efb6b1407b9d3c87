#!/usr/bin/env bash
# Probes of the CLI as a hostile user: every one ends on every rank within seconds
# with a clear message and a non-zero exit, and leaves no output behind. The planner's probes
# are in hardening_plan_test.sh.
# usage: hardening_cli_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'umount "$dir/full" 2> /dev/null; rm -rf "$dir"' EXIT


"$tool" make "$dir" 1 16 2 2 8 || { echo "cannot make inputs"; exit 1; }
files=(--q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy")

# 1. Shape products are checked.
expect "seq wraps numel" 2 "tensor shape [4, 1152921504606846978, 2, 4] is too large" attention --batch 4 \
  --seq 1152921504606846978 --heads 2 --head-dim 4
expect "seq wraps to zero" 2 "is too large: more than 2^56 elements" attention --seq 4611686018427387904
expect "causal window right side" 2 "--window 4,8: the right side has no effect under a causal mask" attention \
  --seq 64 --heads 2 --causal --window 4,8
# 2, 3. Hostile .npy headers (written by python-free printf: a version 2.0 header).
npy() {  # npy FILE DICT DATA_BYTES
  local h="$2" pad
  pad=$(( (64 - (12 + ${#h} + 1) % 64) % 64 ))
  { printf '\x93NUMPY\x02\x00'; printf "$(printf '\\x%02x\\x%02x\\x%02x\\x00' $(( (${#h} + pad + 1) & 255 )) $(( ((${#h} + pad + 1) >> 8) & 255 )) $(( ((${#h} + pad + 1) >> 16) & 255 )))";
    printf '%s%*s\n' "$h" $pad ''; head -c "$3" /dev/zero; } > "$1"
}
npy "$dir/huge.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 68719476736, 4, 4), }" 64
expect "npy declares 1 TiB" 2 "truncated data: expected 4398046511104 bytes" attention --q "$dir/huge.npy" --k "$dir/k.npy" --v "$dir/v.npy"
npy "$dir/big.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4294967296, 1, 1), }" 64
expect "npy declares 16 GiB" 2 "truncated data: expected 17179869184 bytes" attention --q "$dir/big.npy" --k "$dir/k.npy" --v "$dir/v.npy"
npy "$dir/descr.npy" "{'descr': '$(head -c 60000 /dev/zero | tr '\0' x)', 'fortran_order': False, 'shape': (1,), }" 4
expect "60 000-character descr" 2 "is not little-endian float32" attention --q "$dir/descr.npy" --k "$dir/k.npy" --v "$dir/v.npy" &&
  { [ "$(wc -c < "$dir/err.log")" -lt 3000 ] && ok "descr not echoed whole" || bad "descr echoed whole"; }
# 4. Exceptions other than ulysses::Error end every rank with a message.
mkdir -p "$dir/textdir"
expect "train --data DIR" 2 "is a directory" train --steps 1 --seq 64 --data "$dir/textdir"
# 6. Memory estimated up front.
expect "memory estimate" 2 "available (MemAvailable)" attention --seq 8388608
# 7. Non-finite inputs are errors unless allowed.
cp "$dir/q.npy" "$dir/q_nan.npy" && "$tool" set "$dir/q_nan.npy" 37 nan
expect "NaN in q" 2 "q has a non-finite value (nan) at [0, 2, 0, 5]" attention --q "$dir/q_nan.npy" --k "$dir/k.npy" --v "$dir/v.npy"
cp "$dir/k.npy" "$dir/k_inf.npy" && "$tool" set "$dir/k_inf.npy" 0 inf
expect "Inf in k" 2 "k has a non-finite value (inf) at [0, 0, 0, 0]" attention --q "$dir/q.npy" --k "$dir/k_inf.npy" --v "$dir/v.npy"
run 2 attention --q "$dir/q_nan.npy" --k "$dir/k.npy" --v "$dir/v.npy" --allow-nonfinite > "$dir/allow.log" 2>&1 &&
  ok "--allow-nonfinite runs" || { bad "--allow-nonfinite"; cat "$dir/allow.log"; }
# 8. Every rank must read the same input (compared by contents before reading it); a failed --check writes nothing.
mkdir -p "$dir/other" && "$tool" make "$dir/other" 1 16 2 2 8
"$tool" set "$dir/other/q.npy" 3 0.5
start=$SECONDS
timeout "${ULYSSES_HANG_S:-300}" "$mpiexec" $flags -n 1 "$bin" attention "${files[@]}" --out "$dir/mpmd.npy" : \
  -n 1 "$bin" attention --q "$dir/other/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --out "$dir/mpmd.npy" > "$dir/mpmd.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF "ranks were given different --q: rank 0 has $dir/q.npy (1152 bytes" "$dir/mpmd.log"; then
  ok "different input per rank ($((SECONDS - start)) s)"; else bad "different input per rank: rc $rc"; cat "$dir/mpmd.log"; fi
no_file "$dir/mpmd.npy" "different input per rank"
cp "$dir/q.npy" "$dir/q_big.npy"
for i in 0 1 2 3 4 5 6 7; do "$tool" set "$dir/q_big.npy" $i 3e38; done
expect "failed --check" 2 "FAILED" attention --q "$dir/q_big.npy" --k "$dir/k.npy" --v "$dir/v.npy" --check \
  --out "$dir/checked.npy" --json "$dir/checked.json"
no_file "$dir/checked.npy" "failed --check"
# 9. Output paths are checked before computing, and written all or none.
expect "unwritable output" 2 "missing_dir/x.npy: cannot write here: No such file or directory" attention --seq 64 \
  --backward --out "$dir/o.npy" --dq "$dir/dq.npy" --dk "$dir/missing_dir/x.npy"
no_file "$dir/o.npy" "unwritable output (out)"
no_file "$dir/dq.npy" "unwritable output (dq)"
expect "output named twice" 2 "named for two outputs" attention --seq 64 --backward --out "$dir/o.npy" --dq "$dir/o.npy"
# 10. A diverging run stops, keeps the last good checkpoint and a valid JSON log.
tiny=(--seq 64 --batch 2 --width 16 --heads 2 --kv-heads 1 --head-dim 8 --hidden 24)
run 2 train "${tiny[@]}" --steps 2 --save "$dir/ckpt" > "$dir/t.log" 2>&1 || { bad "train --save"; cat "$dir/t.log"; }
sum=$(md5sum < "$dir/ckpt/checkpoint.bin")
expect "NaN loss" 2 "training diverged at step" train "${tiny[@]}" --steps 6 --lr 1e30 --warmup 0 --save "$dir/ckpt" \
  --log "$dir/nan.jsonl"
[ "$(md5sum < "$dir/ckpt/checkpoint.bin")" = "$sum" ] && ok "the last good checkpoint is kept" || bad "checkpoint replaced"
if grep -qi "nan" "$dir/nan.jsonl"; then bad "NaN in the log"; cat "$dir/nan.jsonl"; else ok "log has no NaN"; fi
if python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$dir/nan.jsonl" 2> /dev/null; then
  ok "log is valid JSON lines"; else bad "log is not valid JSON lines"; cat "$dir/nan.jsonl"; fi
run 2 train --steps 3 --resume "$dir/ckpt" > "$dir/r.log" 2>&1 && grep -q "resumed from" "$dir/r.log" && ok "it resumes" ||
  { bad "resume after divergence"; cat "$dir/r.log"; }

# 12, 14. --threads and the sizes past int; short range errors.
expect "threads 100000" 2 "--threads: Value 100000 not in range 0 to 1024" attention --threads 100000 --seq 64
expect "cp-sizes past int" 2 "--cp-sizes must be INNER,OUTER (two positive integers), got '99999999999,1'" attention \
  --strategy a2a+p2p --cp-sizes 99999999999,1
expect "negative seq" 2 "--seq: must be positive, got '-5'" attention --seq -5
[ "$(grep -F -- "--seq:" "$dir/err.log" | wc -c)" -lt 100 ] && ok "short range error" || bad "range error: $(grep -F -- "--seq:" "$dir/err.log")"

# What already holds: a full disk keeps the old output (64 KiB tmpfs; root only).
mkdir -p "$dir/full"
if mount -t tmpfs -o size=64k tmpfs "$dir/full" 2> /dev/null; then
  run 1 attention --seq 16 --heads 2 --head-dim 8 --out "$dir/full/o.npy" > /dev/null 2>&1 && cp "$dir/full/o.npy" "$dir/o_small.npy"
  expect "full disk" 1 "write failed: No space left on device" attention --seq 4096 --heads 8 --out "$dir/full/o.npy"
  cmp -s "$dir/full/o.npy" "$dir/o_small.npy" && ok "full disk kept the old file" || bad "full disk lost the old file"
  [ "$(ls "$dir/full")" = "o.npy" ] && ok "full disk left no temp file" || bad "full disk left $(ls "$dir/full")"
  umount "$dir/full"
else
  echo "SKIP: full disk (cannot mount a tmpfs here: needs root)"
fi
# Concurrent writers of one --out leave one complete file.
for i in 1 2 3 4; do run 1 attention "${files[@]}" --out "$dir/shared.npy" > /dev/null 2>&1 & done
wait
run 1 attention "${files[@]}" --out "$dir/single.npy" > /dev/null 2>&1
"$tool" diff "$dir/shared.npy" "$dir/single.npy" 0 > /dev/null && ok "concurrent writers: one complete file" ||
  bad "concurrent writers"
ls "$dir"/shared.npy.tmp.* > /dev/null 2>&1 && bad "concurrent writers left temp files" || ok "concurrent writers: no temp files"

# Messages: integer .npy cu_seqlens, a directory for a file, --resume with other flags.
npy "$dir/cu_int32.npy" "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }" 0
printf '\x00\x00\x00\x00\x06\x00\x00\x00\x10\x00\x00\x00' >> "$dir/cu_int32.npy"  # 0, 6, 16
npy "$dir/cu_int64.npy" "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }" 0
printf '\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00\x00' >> "$dir/cu_int64.npy"
npy "$dir/cu_u8.npy" "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }" 0
printf '\x00\x06\x10' >> "$dir/cu_u8.npy"
for t in int32 int64; do
  run 2 attention "${files[@]}" --cu-seqlens "$dir/cu_$t.npy" --check > "$dir/cu.log" 2>&1 && grep -q "packed documents: 2" "$dir/cu.log" &&
    ok "--cu-seqlens $t .npy" || { bad "--cu-seqlens $t .npy"; cat "$dir/cu.log"; }
done
expect "--cu-seqlens uint8 .npy" 2 "--cu-seqlens: $dir/cu_u8.npy: not a usable .npy file: dtype '|u1' is not little-endian int32, int64 or float32" \
  attention "${files[@]}" --cu-seqlens "$dir/cu_u8.npy"
expect "--cu-seqlens a directory" 2 "--cu-seqlens: $dir is a directory, not a file" attention --seq 16 --cu-seqlens "$dir"
expect "--data a directory" 2 "--data: $dir is a directory, not a file" train --data "$dir"
expect "--q a directory" 2 "--q: $dir is a directory, not a file" attention --q "$dir" --k "$dir/k.npy" --v "$dir/v.npy"
expect "--resume --width other than the checkpoint's" 2 "--width 32 conflicts with the checkpoint $dir/ckpt (--width" \
  train --steps 3 --resume "$dir/ckpt" --width 32
expect "--resume --seed other than the checkpoint's" 2 "--seed 9 conflicts with the checkpoint $dir/ckpt (--seed 0)" \
  train --steps 3 --resume "$dir/ckpt" --seed 9

# Memory admitted before anything is allocated or calibrated, with both numbers, on every rank.
expect "train: a sequence of 10^12 tokens" 2 "more than this machine has" train --steps 1 --lengths 1x1000000000000
grep -q "calibrated" "$dir/err.log" && bad "train 10^12: calibrated before refusing" || ok "train 10^12: refused first"
ULYSSES_MEM_AVAILABLE=$((256 << 20)) expect "train: a batch over MemAvailable" 2 \
  "per rank, more than this machine has: 115.2 MiB per rank (90 % of 256.0 MiB available" train --steps 1 --seq 8192 --batch 8
expect "train: over --max-memory" 2 "more than --max-memory 16.0 MiB" train --steps 1 --lengths 4096x64 --max-memory 16MiB
printf 'a first document\n%s\n' "$(head -c 20000000 /dev/zero | tr '\0' x)" > "$dir/huge_doc.txt"
ULYSSES_MEM_AVAILABLE=$((1 << 30)) expect "train: a 20M-token document" 2 "more than this machine has" \
  train --steps 1 --data "$dir/huge_doc.txt" --holdout 0 --tokens-per-step 20000002
rm -f "$dir/huge_doc.txt"
# Sizes parse strictly.
for size in 0x10 1e9 inf nan -5 0 2GiBs ""; do
  expect "--max-memory '$size'" 2 "is not a memory size" train --steps 1 --seq 64 --max-memory "$size"
done
# Every document checked before step 1, named with its line and length.
printf 'one document of some length\nanother one here\nx\nthe last document\n' > "$dir/docs1.txt"
expect "train: a one-token document" 2 "the document 3 (line 3, byte 45) has 1 token(s): a document needs 2 tokens or more" \
  train --steps 60 --data "$dir/docs1.txt" --holdout 0 --tokens-per-step 64
# Options with no effect in their combination are errors, never ignored.
expect "--doc-separator without --pack" 2 "--doc-separator splits --data into documents for --pack or --tokens-per-step" \
  train --steps 1 --seq 64 --data "$dir/docs1.txt" --doc-separator '|'
expect "--holdout without --data" 2 "--holdout is about --data FILE's held-out text" train --steps 1 --seq 64 --holdout 0.1
expect "--save-every without --save" 2 "--save-every needs --save DIR" train --steps 1 --seq 64 --save-every 2
expect "--tile-rows without tiling" 2 "--tile-rows sizes the tiles" train --steps 1 --seq 64 --tile-rows 64
echo "$fails failure(s)"
[ $fails -eq 0 ]
