#!/usr/bin/env bash
# The CLI end to end: .npy inputs and outputs at 1 and 2 ranks, and every bad input giving a
# clear error, a non-zero exit within seconds, and no output file.
# usage: cli_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'rm -rf "$dir"' EXIT

"$tool" make "$dir" 2 64 4 2 16 || { echo "cannot make inputs"; exit 1; }
mkdir -p "$dir/corrupt"
files=(--q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --dout "$dir/dout.npy")

# Every strategy through the CLI, zigzag included: 2 and 4 ranks agree with the reference.
for args in "--strategy p2p" "--strategy all_gather" "--strategy a2a+p2p --cp-sizes 2,2" "--strategy a2a+p2p --cp-sizes 1,4"; do
  if run 4 attention --batch 2 --seq 64 --heads 4 --kv-heads 2 --head-dim 16 --causal --backward --check $args > "$dir/s.log" 2>&1; then
    ok "np=4 $args"
  else
    bad "np=4 $args"; cat "$dir/s.log"
  fi
done

# Sequences and head counts that do not divide by cp: 1001 tokens of 8 heads on 2 and 3 ranks,
# every strategy, against the reference; the header's token counts add up to 1001.
tokens_sum() { grep "tokens per rank:" "$1" | sed 's/.*tokens per rank: \([0-9, ]*\);.*/\1/' | tr ',' '\n' | awk '{s += $1} END {print s}'; }
for n in 2 3; do
  for args in "--strategy a2a" "--strategy p2p" "--strategy all_gather" "--strategy a2a+p2p --cp-sizes $n,1" \
              "--strategy a2a+p2p --cp-sizes 1,$n"; do
    if run $n attention --seq 1001 --check $args > "$dir/u.log" 2>&1 && [ "$(tokens_sum "$dir/u.log")" = 1001 ]; then
      ok "np=$n --seq 1001 $args"
    else
      bad "np=$n --seq 1001 $args"; cat "$dir/u.log"
    fi
  done
done
# Zigzag and GQA heads shared unevenly (8 query, 2 KV heads on 3 ranks), forward and backward.
if run 3 attention --seq 1001 --heads 8 --kv-heads 2 --head-dim 16 --causal --backward --check --strategy a2a+p2p \
     --cp-sizes 3,1 > "$dir/h.log" 2>&1 && grep -q "query/KV heads per rank: 2/1, 2/1, 4/1" "$dir/h.log" &&
   grep -q "tokens per rank: 333, 334, 334; rank 0 holds tokens \[0, 167) \[835, 1001) (zigzag)" "$dir/h.log"; then
  ok "np=3 zigzag and uneven GQA heads"
else
  bad "np=3 zigzag and uneven GQA heads"; cat "$dir/h.log"
fi

# Packed documents (a list, and a text file) in every strategy against the reference; the
# work per rank is reported.
printf '0\n1 100\n333,334\n1001\n' > "$dir/cu.txt"
for args in "--strategy a2a" "--strategy p2p --causal" "--strategy all_gather" "--strategy a2a+p2p --cp-sizes 3,1 --causal"; do
  for cu in "0,1,100,333,334,1001" "$dir/cu.txt"; do
    if run 3 attention --seq 1001 --heads 6 --kv-heads 3 --head-dim 16 --backward --check --cu-seqlens "$cu" $args \
         > "$dir/d.log" 2>&1 && grep -q "packed documents: 5 (lengths 1 .. 667" "$dir/d.log" &&
       grep -q "attention work per rank" "$dir/d.log"; then
      ok "np=3 documents $args"
    else
      bad "np=3 documents $args ($cu)"; cat "$dir/d.log"
    fi
  done
done

# Per-document zigzag (the ring's default with documents) and plain zigzag (--per-document 0),
# both against the reference; the header names the layout.
for args in "--strategy p2p" "--strategy p2p --per-document 0" "--strategy a2a+p2p --cp-sizes 1,3" \
            "--strategy a2a+p2p --cp-sizes 1,3 --per-document 1"; do
  want="(per-document zigzag)"; case "$args" in *"--per-document 0"*) want="(zigzag)";; esac
  if run 3 attention --seq 1001 --heads 6 --kv-heads 3 --head-dim 16 --causal --backward --check \
       --cu-seqlens 0,1,4,100,333,334,1001 $args > "$dir/pd.log" 2>&1 && grep -qF "$want" "$dir/pd.log"; then
    ok "np=3 documents causal $args: $want"
  else
    bad "np=3 documents causal $args"; cat "$dir/pd.log"
  fi
done

# Sliding windows: the ring's halo exchange and Ulysses' kernel mask against the reference.
for args in "--strategy p2p --causal --window 40" "--strategy p2p --window 30,7" "--strategy a2a --causal --window 5" \
            "--strategy a2a+p2p --cp-sizes 1,3 --causal --window 100"; do
  if run 3 attention --seq 601 --heads 6 --kv-heads 3 --head-dim 16 --backward --check $args > "$dir/w.log" 2>&1 &&
     grep -q "sliding window (" "$dir/w.log"; then
    ok "np=3 window $args"
  else
    bad "np=3 window $args"; cat "$dir/w.log"
  fi
done

# Files in, files out: 1 rank and 2 ranks agree with each other and with the reference.
for n in 1 2; do
  if run $n attention "${files[@]}" --causal --check --out "$dir/out$n.npy" --dq "$dir/dq$n.npy" \
       --dk "$dir/dk$n.npy" --dv "$dir/dv$n.npy" --json "$dir/r$n.json" > "$dir/log$n" 2>&1; then
    ok "files at np=$n"
  else
    bad "files at np=$n"; cat "$dir/log$n"
  fi
done
for t in out dq dk dv; do
  if "$tool" diff "$dir/${t}2.npy" "$dir/${t}1.npy" 1e-5 > /dev/null; then ok "$t np=2 == np=1"; else bad "$t np=2 vs np=1"; fi
done
# The zigzag layout is hidden by the CLI: global files out are in sequence order.
run 2 attention "${files[@]}" --causal --strategy p2p --out "$dir/outp2p.npy" > "$dir/p2p.log" 2>&1 || { bad "p2p files"; cat "$dir/p2p.log"; }
if "$tool" diff "$dir/outp2p.npy" "$dir/out1.npy" 1e-5 > /dev/null; then ok "p2p out (zigzag) == np=1"; else bad "p2p out vs np=1"; fi
grep -q '"forward_s"' "$dir/r2.json" && grep -q '"seq_to_head"' "$dir/r2.json" && ok "json report" || bad "json report"

# Bad inputs: expect a non-zero exit (not a timeout), the message, and no --out file.
expect_error() {
  local name=$1 n=$2 msg=$3; shift 3
  rm -f "$dir/never.npy"
  expect "$name" "$n" "$msg" attention "$@" --out "$dir/never.npy" && no_file "$dir/never.npy" "$name"
}
printf 'GARBAGE, NOT AN NPY FILE' > "$dir/garbage.npy"
head -c 200 "$dir/q.npy" > "$dir/truncated.npy"
"$tool" make "$dir/" 2 32 4 2 16 && mv "$dir/k.npy" "$dir/k_short.npy" && "$tool" make "$dir" 2 64 4 2 16
expect_error "missing file" 2 "cannot open" --q "$dir/nope.npy" --k "$dir/k.npy" --v "$dir/v.npy"
expect_error "malformed file" 2 "not a usable .npy file" --q "$dir/garbage.npy" --k "$dir/k.npy" --v "$dir/v.npy"
# With files, the random inputs' flags change nothing: refused, not ignored.
expect_error "--seq with files" 2 "--seq has no effect with --q/--k/--v" "${files[@]}" --seq 64
expect_error "--backward with files" 2 "--backward has no effect with --q/--k/--v" "${files[@]}" --backward
expect_error "truncated file" 2 "truncated data" --q "$dir/truncated.npy" --k "$dir/k.npy" --v "$dir/v.npy"
expect_error "k shorter than v (k/v may differ from q: cross-attention)" 2 "must have k's shape" --q "$dir/q.npy" --k "$dir/k_short.npy" --v "$dir/v.npy"
expect_error "heads < cp" 4 "num_heads (3) must be at least cp (4)" --heads 3 --seq 64
expect_error "heads < cp names p2p" 4 "cp_comm_type p2p" --heads 2 --seq 64
expect_error "partial GQA groups" 2 "num_heads (6) must be divisible by num_kv_heads (4)" --heads 6 --kv-heads 4 --seq 64
expect_error "seq < cp" 2 "sequence length (1) must be at least cp (2)" --seq 1
expect_error "unknown strategy" 2 "unknown cp_comm_type 'ring'" --strategy ring
expect_error "zigzag needs 2*cp" 2 "sequence length (3) must be at least 2*cp (4)" --strategy p2p --causal --seq 3
expect_error "cu_seqlens decreasing" 2 "cu_seqlens[2] = 3 after 5" --seq 64 --cu-seqlens 0,5,3,64
expect_error "cu_seqlens short" 2 "must end at the sequence length 64, got 60" --seq 64 --cu-seqlens 0,5,60
expect_error "cu_seqlens with batch" 2 "needs batch 1" --seq 64 --batch 2 --cu-seqlens 0,64
expect_error "cu_seqlens not a number" 2 "'5x' in the list is not an integer" --seq 64 --cu-seqlens 0,5x,64
expect_error "negative window" 2 "window_left must be -1 (unbounded) or >= 0, got -3" --seq 64 --window -3
expect_error "window not a number" 2 "--window: '3,x' is neither LEFT nor LEFT,RIGHT" --seq 64 --window 3,x
expect_error "a2a+p2p without sizes" 2 "needs --cp-sizes" --strategy a2a+p2p --seq 64
expect_error "a2a+p2p sizes product" 4 "inner * outer == cp (4)" --strategy a2a+p2p --cp-sizes 2,1 --seq 64
expect_error "a2a+p2p heads < inner" 4 "must be at least the inner (a2a) size (4)" --strategy a2a+p2p --cp-sizes 4,1 --heads 2 --seq 64
expect_error "bad cp sizes" 2 "--cp-sizes must be INNER,OUTER" --strategy a2a+p2p --cp-sizes 2x1 --seq 64
expect_error "dq without backward" 2 "need a backward" --seq 64 --dq "$dir/dq.npy"
expect_error "per-document on a2a" 2 "--per-document applies to --strategy p2p or a2a+p2p only" --strategy a2a --per-document 0 --seq 64
expect_error "per-document 2" 2 "--per-document must be 0|1 (an integer in [0, 1]), got '2'" --strategy p2p --per-document 2 --seq 64
expect_error "per-document text" 2 "--per-document must be 0|1 (an integer in [0, 1]), got 'no'" --strategy p2p --per-document no --seq 64

# Training: a short run with a checkpoint, resumed to the end, equals the uninterrupted run.
model=(--steps 6 --width 16 --heads 2 --kv-heads 1 --head-dim 8 --hidden 24)
tiny=("${model[@]}" --seq 64 --batch 2)
run 2 train "${tiny[@]}" --log "$dir/full.jsonl" > "$dir/t1.log" 2>&1 || { bad "train"; cat "$dir/t1.log"; }
run 2 train "${tiny[@]}" --steps 3 --save "$dir/ckpt" > "$dir/t2.log" 2>&1 || { bad "train --save"; cat "$dir/t2.log"; }
run 2 train --steps 6 --resume "$dir/ckpt" --log "$dir/resumed.jsonl" --svg "$dir/loss.svg" > "$dir/t3.log" 2>&1 || { bad "train --resume"; cat "$dir/t3.log"; }
if [ "$(tail -n 3 "$dir/full.jsonl" | cut -d, -f1-2)" = "$(cut -d, -f1-2 "$dir/resumed.jsonl")" ]; then ok "train resume = uninterrupted (steps 4-6)"; else bad "train resume differs"; tail -n 3 "$dir/full.jsonl"; cat "$dir/resumed.jsonl"; fi
grep -q "<polyline" "$dir/loss.svg" && ok "train --svg" || bad "train --svg"
expect_train_error() {
  local name=$1 n=$2 msg=$3; shift 3
  expect "$name" "$n" "$msg" train "$@"
}
expect_train_error "train heads < cp" 4 "num_heads (2) must be at least cp (4)" "${tiny[@]}" --heads 2 --kv-heads 2
run 2 train "${tiny[@]}" --seq 65 --steps 2 --strategy a2a > "$dir/t4.log" 2>&1 && ok "train --seq 65 on 2 ranks" || { bad "train --seq 65"; cat "$dir/t4.log"; }
expect_train_error "train missing data" 2 "cannot open" "${tiny[@]}" --data "$dir/no_such_file.txt"
cp "$dir/ckpt/checkpoint.bin" "$dir/corrupt/checkpoint.bin"
printf '\x5a' | dd of="$dir/corrupt/checkpoint.bin" bs=1 seek=1000 conv=notrunc status=none
expect_train_error "train corrupted checkpoint" 2 "checksum mismatch" --resume "$dir/corrupt"

# --data: the held-out tail's loss every --eval-every steps and at the end, in the log and the summary.
for i in $(seq 300); do echo "the cat sees the moon $((i % 7)) times."; done > "$dir/text.txt"
run 2 train "${tiny[@]}" --data "$dir/text.txt" --eval-every 3 --log "$dir/text.jsonl" > "$dir/t5.log" 2>&1 || { bad "train --data"; cat "$dir/t5.log"; }
[ "$(grep -c '"held_out_loss": [0-9]' "$dir/text.jsonl")" = 2 ] && grep -q '"held_out_bpb": [0-9]' "$dir/text.jsonl" \
  && ok "train --data: held-out loss at steps 3 and 6 in the log" || { bad "train --data: held-out loss in the log"; cat "$dir/text.jsonl"; }
grep -qE 'held-out loss [0-9.]+ \([0-9.]+ bits per byte\) on the last [0-9]+ bytes' "$dir/t5.log" \
  && ok "train --data: held-out loss in the summary" || { bad "train --data: summary"; cat "$dir/t5.log"; }
expect_train_error "train --holdout too short for --seq" 2 "held-out sequences of 64 tokens need at least 65" "${tiny[@]}" --data "$dir/text.txt" --holdout 0.002
# DP x CP on variable-length steps: --dp, --lengths, whole documents under --tokens-per-step;
# every rank's idle time in the log; the bad input refused on every rank.
run 2 train "${model[@]}" --steps 2 --dp 2 --lengths 1x128,3x64 --log "$dir/dp.jsonl" > "$dir/t7.log" 2>&1 \
  && grep -q '"tokens": 320, "step_s": [0-9.]*, "predicted_step_s": [0-9.]*, "idle_ms": \[[0-9.]*, [0-9.]*\]' "$dir/dp.jsonl" \
  && grep -q 'dp 2 x cp 1 (--balance static' "$dir/t7.log" && ok "train --dp 2 --lengths: tokens and idle per rank" \
  || { bad "train --dp 2 --lengths"; cat "$dir/t7.log" "$dir/dp.jsonl"; }
printf 'first document here\nsecond one\nthe third and longest document of all\nfourth\n' > "$dir/docs.txt"
run 2 train "${model[@]}" --steps 2 --strategy p2p --data "$dir/docs.txt" --holdout 0 --tokens-per-step 64 > "$dir/t8.log" 2>&1 \
  && grep -q 'whole documents, each one sequence of its own length, up to 64 tokens' "$dir/t8.log" \
  && ok "train --tokens-per-step: whole documents" || { bad "train --tokens-per-step"; cat "$dir/t8.log"; }
expect_train_error "train --dp not dividing" 2 "--dp 3 must divide the world size 2" "${tiny[@]}" --dp 3
expect_train_error "train --lengths to nothing" 2 "no sequence (expected e.g." "${model[@]}" --lengths ""
expect_train_error "train --tokens-per-step < a document" 2 "--data $dir/docs.txt: the document 3 (line 3, byte 31) has 37 token(s): --tokens-per-step 20 is smaller" \
  "${model[@]}" --data "$dir/docs.txt" --holdout 0 --tokens-per-step 20
# A variable-length step is its own sequences: --seq or --batch beside it is refused, not ignored.
expect_train_error "train --seq with --lengths" 2 "--seq has no effect with --lengths" "${model[@]}" --lengths 1x128 \
  --seq 64 --log "$dir/never.jsonl" && no_file "$dir/never.jsonl" "train --seq with --lengths"
expect_train_error "train --batch with --tokens-per-step" 2 "--batch has no effect with --tokens-per-step" "${model[@]}" \
  --data "$dir/docs.txt" --holdout 0 --tokens-per-step 64 --batch 2 --log "$dir/never.jsonl" \
  && no_file "$dir/never.jsonl" "train --batch with --tokens-per-step"
expect_train_error "train --balance unknown" 2 "balance policy 'best': expected static, pow2 or dynamic" "${tiny[@]}" --balance best
# The dtype in the log and the summary; the default --hidden follows --width; plan --train --dtype.
grep -q '"dtype": "f32"' "$dir/full.jsonl" && grep -q 'attention dtype f32' "$dir/t1.log" && ok "train: dtype in log and summary" || bad "train: dtype in log and summary"
run 1 train --steps 0 --width 128 --seq 64 > "$dir/t6.log" 2>&1 && grep -q 'width 128, .* SwiGLU 344)' "$dir/t6.log" \
  && ok "train: default --hidden 8/3 width" || { bad "train: default --hidden"; cat "$dir/t6.log"; }
run 1 plan --train --heads 4 --head-dim 32 --dtype bf16 --max-memory 64MiB --cp 2 > "$dir/p1.log" 2>&1 && grep -q 'SwiGLU 344), batch 1, bf16' "$dir/p1.log" \
  && ok "plan --train --dtype bf16" || { bad "plan --train --dtype bf16"; cat "$dir/p1.log"; }

echo "$fails failure(s)"
[ $fails -eq 0 ]
