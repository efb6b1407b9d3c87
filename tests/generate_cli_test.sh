#!/usr/bin/env bash
# `ulysses generate` end to end: the tokens and logits-driven choices of every rank count and
# both KV layouts equal one rank's (over MPI and over ranks as threads), and every bad request
# is one clear error before any data moves, with nothing written.
# usage: generate_cli_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS"
source "$(dirname "$0")/cli_lib.sh" "$@" none
trap 'rm -rf "$dir"' EXIT

run 2 train --seq 64 --batch 2 --steps 3 --width 32 --heads 4 --kv-heads 2 --head-dim 8 --save "$dir/ck" \
  > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; echo "cannot train"; exit 1; }
gen=(generate --checkpoint "$dir/ck" --prompt-tokens 64 --max-new-tokens 12)
tokens() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"])' "$1"; }

# 1. Greedy tokens at every cp and layout equal cp = 1's (sampled ones: test_generate).
run 1 "${gen[@]}" --json "$dir/one.json" > /dev/null 2>&1 || bad "cp 1 failed"
want=$(tokens "$dir/one.json")
for layout in heads interleaved; do
  for n in 2 3 4; do
    for prefill in ulysses ring; do
      if run "$n" "${gen[@]}" --kv-layout "$layout" --prefill $prefill --json "$dir/g.json" > "$dir/g.log" 2>&1 &&
        [ "$(tokens "$dir/g.json")" = "$want" ]; then ok "cp $n $layout $prefill = cp 1"
      else bad "cp $n $layout $prefill differs from cp 1"; cat "$dir/g.log"; fi
    done
  done
  if timeout 60 "$bin" "${gen[@]}" --kv-layout "$layout" --comm local --ranks 3 --json "$dir/l.json" \
    > "$dir/l.log" 2>&1 && [ "$(tokens "$dir/l.json")" = "$want" ]; then ok "local 3 $layout = cp 1"
  else bad "local 3 $layout differs"; cat "$dir/l.log"; fi
done
# A second turn over the cache (Ulysses over it, pass-Q): both turns' tokens equal cp = 1's.
turns() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["tokens"], j["turn"]["tokens"])' "$1"; }
run 1 "${gen[@]}" --turn-tokens 64 --json "$dir/one.json" > /dev/null 2>&1 || bad "cp 1 turn failed"
want=$(turns "$dir/one.json")
for layout in heads interleaved; do
  if run 3 "${gen[@]}" --turn-tokens 64 --kv-layout "$layout" --json "$dir/t.json" > "$dir/t.log" 2>&1 &&
    [ "$(turns "$dir/t.json")" = "$want" ]; then ok "cp 3 $layout second turn = cp 1"
  else bad "cp 3 $layout second turn differs"; cat "$dir/t.log"; fi
done
# A second turn from a file (its bytes, as --prompt FILE): at cp 3 both turns equal cp = 1's,
# and the file's 40 bytes are the turn's tokens.
printf 'And what did the needle say? Answer now.' > "$dir/turn.txt"
run 1 "${gen[@]}" --turn "$dir/turn.txt" --json "$dir/one.json" > /dev/null 2>&1 || bad "cp 1 --turn failed"
want=$(turns "$dir/one.json")
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["turn"]["tokens_over_cache"] == 40' "$dir/one.json" &&
  ok "--turn FILE: 40 tokens over the cache" || bad "--turn FILE's tokens"
for layout in heads interleaved; do
  if run 3 "${gen[@]}" --turn "$dir/turn.txt" --kv-layout "$layout" --json "$dir/t.json" > "$dir/t.log" 2>&1 &&
    [ "$(turns "$dir/t.json")" = "$want" ]; then ok "cp 3 $layout --turn FILE = cp 1"
  else bad "cp 3 $layout --turn FILE differs"; cat "$dir/t.log"; fi
done
grep -q "(equal)" "$dir/g.log" && ! grep -q "DIFFERENT" "$dir/g.log" && ok "KV bytes = formula" || bad "KV bytes"

# Concurrent requests of different lengths, finishing at different steps, decoded together:
# each request's tokens equal running it alone (request i: --seed i) at cp = 1, at every cp and
# layout, and every step takes one collective per layer (2) whatever the requests running. The
# same with staggered arrivals (--requests-arrive 0,2x2,7): requests 1 and 2 are prefilled after
# step 2 and join step 3, request 3 after step 7 and joins step 8.
run 1 train --seq 160 --batch 2 --steps 1 --width 32 --heads 4 --kv-heads 2 --head-dim 8 --save "$dir/ck160" \
  > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; echo "cannot train at 160"; exit 1; }
lens=(64 96 96 160) news=(4 12 8 6) alone=()
for i in 0 1 2 3; do
  run 1 generate --checkpoint "$dir/ck160" --prompt-tokens "${lens[$i]}" --max-new-tokens "${news[$i]}" --seed $i \
    --json "$dir/a.json" > /dev/null 2>&1 || bad "request $i alone failed"
  alone+=("$(tokens "$dir/a.json")")
done
want=$(printf '%s\n' "${alone[@]}")
reqs=(generate --checkpoint "$dir/ck160" --requests 64,2x96,160 --requests-new-tokens 4,12,8,6)
each() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("\n".join(str(r["tokens"]) for r in j["requests"])); assert {s["collectives"] for s in j["steps"]} == {2}' "$1"; }
# The schedule of --requests-arrive 0,2x2,7 in the JSON: steps 1-13, who ran and joined each,
# each request's first and last step, arrivals together at the same time, and each time to
# first token from its own arrival (request 2's includes request 1's prefill before it).
joins() { python3 -c 'import json,sys
j = json.load(open(sys.argv[1])); r = j["requests"]; s = j["steps"]
assert [x["step"] for x in s] == list(range(1, 14)), s
assert {x["step"]: x["joined"] for x in s if x["joined"]} == {1: [0], 3: [1, 2], 8: [3]}, s
assert [x["running"] for x in s[:4]] == [[0], [0], [0, 1, 2], [1, 2]] and s[7]["running"] == [1, 2, 3], s
assert [(x["arrival_step"], x["first_step"], x["last_step"]) for x in r] == [(0, 1, 3), (2, 3, 13), (2, 3, 9), (7, 8, 12)], r
assert r[1]["arrival_s"] == r[2]["arrival_s"] and r[1]["time_to_first_token_s"] < r[2]["time_to_first_token_s"], r
assert r[0]["arrival_s"] < r[1]["arrival_s"] < r[3]["arrival_s"], r' "$1"; }
for arrive in "" "0,2x2,7"; do
  arrival=(${arrive:+--requests-arrive "$arrive"}) name="requests${arrive:+ arriving $arrive}"
  for layout in heads interleaved; do
    for n in 1 2 3; do
      if run "$n" "${reqs[@]}" "${arrival[@]}" --kv-layout "$layout" --json "$dir/r.json" > "$dir/r.log" 2>&1 &&
        [ "$(each "$dir/r.json")" = "$want" ] && { [ -z "$arrive" ] || joins "$dir/r.json"; }; then
        ok "$name cp $n $layout = each alone"
      else bad "$name cp $n $layout differ from each alone"; cat "$dir/r.log"; fi
    done
    if timeout 60 "$bin" "${reqs[@]}" "${arrival[@]}" --kv-layout "$layout" --comm local --ranks 3 \
      --json "$dir/r.json" > "$dir/r.log" 2>&1 && [ "$(each "$dir/r.json")" = "$want" ] &&
      { [ -z "$arrive" ] || joins "$dir/r.json"; }; then ok "$name local 3 $layout = each alone"
    else bad "$name local 3 $layout differ"; cat "$dir/r.log"; fi
  done
done
grep -q "tokens/s across them" "$dir/r.log" && ok "per-step tokens/s printed" || bad "per-step tokens/s"
grep -qF "step 3: requests 0, 1, 2 (1, 2 joined after" "$dir/r.log" && ok "joins printed" ||
  { bad "joins not printed"; cat "$dir/r.log"; }

# Chunked prefill (--prefill-chunk 32): the prompts are prefilled 32 tokens before each step
# (2, 3, 3 and 5 pieces), the tokens are still each alone's, and the longest wait of a running
# request between two tokens is reported.
pieces() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
assert [r["prefill_pieces"] for r in j["requests"]] == [2, 3, 3, 5], j["requests"]
assert j["longest_token_gap"]["seconds"] > 0 and max(s["prefill_tokens"] for s in j["steps"]) <= 64, j["steps"]' "$1"; }
for layout in heads interleaved; do
  if run 2 "${reqs[@]}" --requests-arrive 0,2x2,7 --prefill-chunk 32 --kv-layout "$layout" --json "$dir/r.json" \
    > "$dir/r.log" 2>&1 && [ "$(each "$dir/r.json")" = "$want" ] && pieces "$dir/r.json"; then
    ok "requests prefilled 32 tokens a step, cp 2 $layout = each alone"
  else bad "chunked prefill cp 2 $layout"; cat "$dir/r.log"; fi
done
grep -qF "prompts 32 tokens at a time" "$dir/r.log" && ok "token gap printed" || bad "token gap not printed"

# The memory model of generate against the measured peak RSS (largest over ranks), within 10 %:
# a cache of 2M tokens (its formula's bytes, allocated whole), the bandwidth probe's buffer,
# the prefill; concurrent requests.
memory_within() {  # name, then generate flags
  local name=$1; shift
  run "${@:1:1}" "${@:2}" --json "$dir/m.json" > "$dir/m.log" 2>&1 || { bad "$name: run"; cat "$dir/m.log"; return; }
  local ratio
  ratio=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory"]["measured_over_predicted"])' "$dir/m.json")
  if awk -v r="$ratio" 'BEGIN { exit !(r >= 0.9 && r <= 1.1) }'; then ok "$name: measured/predicted $ratio"
  else bad "$name: measured/predicted '$ratio'"; cat "$dir/m.log"; fi
}
memory_within "memory, heads cp 2" 2 generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 2000000
memory_within "memory, interleaved cp 3" 3 generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 2000000 \
  --kv-layout interleaved
memory_within "memory, 3 requests cp 2" 2 "${reqs[@]:0:5}" --capacity 1000000
# A prompt whose prefill is as large as the probe's buffer: the probe comes after the prefill's
# memory is returned, so the peak is the larger of the two, at one rank as at several.
run 1 train --seq 8192 --batch 1 --steps 0 --eval-batches 0 --width 64 --heads 4 --kv-heads 4 --head-dim 16 \
  --save "$dir/ck8k" > "$dir/t8k.log" 2>&1 || { bad "8k checkpoint"; cat "$dir/t8k.log"; }
for n in 1 2; do
  for layout in heads interleaved; do
    memory_within "memory, 8192-token prefill and the probe, cp $n $layout" "$n" generate --checkpoint "$dir/ck8k" \
      --prompt-tokens 8192 --max-new-tokens 2 --kv-layout "$layout"
  done
done
grep -q "memory per rank: predicted" "$dir/m.log" && ok "memory in the header" || bad "memory line"

# --trace: one Chrome trace, a track per rank, the prefill and every decode step as phases
# around the collectives (one request, and concurrent requests).
# With arrivals (request 0 at the start, requests 1 and 2 after step 1): the arrival and the
# step they joined are phases too.
trace_ok() {  # TRACE STEPS [PHASE...]: a track per rank, STEPS decode steps, these phases
  python3 -c 'import json,sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in ev if e.get("cat") == "phase"}
assert {e["pid"] for e in ev} == {0, 1}, ev
assert any(n.startswith("prefill") for n in names) and sum(n.startswith("decode step") for n in names) == int(sys.argv[2]), names
for n in sys.argv[3:]: assert n in names, (n, names)
assert any(e.get("cat") == "comm" for e in ev)' "$@"
}
for args in "--prompt-tokens 64" "--requests 2x96" "--requests 3x96 --requests-arrive 0,1,1"; do
  ck=ck160 steps=2 phases=()
  [ "$args" = "--prompt-tokens 64" ] && ck=ck
  [[ "$args" == *arrive* ]] && steps=3 phases=("arrivals after step 1: request 1, 2" "decode step 2 (3 requests; request 1, 2 joined)")
  # shellcheck disable=SC2086  # the arguments are words
  if run 2 generate --checkpoint "$dir/$ck" $args --max-new-tokens 3 --trace "$dir/g.trace" > "$dir/tr.log" 2>&1 &&
    trace_ok "$dir/g.trace" "$steps" "${phases[@]}"; then ok "--trace $args"
  else bad "--trace $args"; cat "$dir/tr.log"; fi
done

# 2. Bad requests: one error, nothing written.
: > "$dir/empty.txt"
head -c 100 "$dir/ck/checkpoint.bin" > "$dir/short.bin" && mkdir "$dir/cut" && mv "$dir/short.bin" "$dir/cut/checkpoint.bin"
out=(--json "$dir/never.json")
expect "empty prompt" 2 "the prompt is empty" generate --checkpoint "$dir/ck" --prompt "$dir/empty.txt" "${out[@]}"
no_file "$dir/never.json" "empty prompt"
expect "no new tokens" 2 "--max-new-tokens must be positive, got 0" "${gen[@]}" --max-new-tokens 0 "${out[@]}"
expect "over capacity" 2 "do not fit in the KV cache's capacity of 70 tokens" "${gen[@]}" --capacity 70 "${out[@]}"
expect "over positions" 2 "the prompt has 80 tokens, longer than the model's 64 positions" \
  generate --checkpoint "$dir/ck" --prompt-tokens 80 "${out[@]}"
expect "heads at cp 5" 5 "use --kv-layout interleaved (any cp) or cp <= 4" "${gen[@]}" "${out[@]}"
expect "short turn" 2 "a synthetic sequence has at least 64 tokens" "${gen[@]}" --turn-tokens 10 "${out[@]}"
expect "truncated checkpoint" 2 "corrupt checkpoint" generate --checkpoint "$dir/cut" --prompt-tokens 64 "${out[@]}"
expect "requests new tokens" 2 "--requests-new-tokens gives 2 counts for 3 requests" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --requests-new-tokens 4,5 "${out[@]}"
expect "request over positions" 2 "request 1 of 2: the prompt has 200 tokens, longer than the model's 160" \
  generate --checkpoint "$dir/ck160" --requests 64,200 "${out[@]}"
expect "arrivals too few" 2 "--requests-arrive '0,2' gives 2 steps for 3 requests (give one a request)" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --requests-arrive 0,2 "${out[@]}"
expect "arrivals too many" 2 "--requests-arrive '0,4x1' gives more steps for 3 requests" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --requests-arrive 0,4x1 "${out[@]}"
expect "arrival negative" 2 "--requests-arrive '0,-1,2': step -1 is negative" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --requests-arrive 0,-1,2 "${out[@]}"
expect "arrival malformed" 2 "--requests-arrive '0,,2': '' is not a step" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --requests-arrive 0,,2 "${out[@]}"
expect "prefill chunk under cp" 2 "--prefill-chunk 1: a prefill chunk of 1 tokens is shorter than the 2 ranks" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --prefill-chunk 1 "${out[@]}"
expect "prefill chunk negative" 2 "--prefill-chunk -4: a prefill chunk of -4 tokens is negative" \
  generate --checkpoint "$dir/ck160" --requests 3x64 --prefill-chunk -4 "${out[@]}"
# Ranks given different arrivals (mpirun's MPMD): one error, before anything runs.
a=(generate --checkpoint "$dir/ck160" --requests 2x64 "${out[@]}")
timeout "$hang_s" "$mpiexec" $flags -n 1 "$bin" "${a[@]}" --requests-arrive 0,1 : -n 1 "$bin" "${a[@]}" \
  --requests-arrive 0,2 > "$dir/err.log" 2>&1
if [ $? -ne 0 ] && [ "$(grep -c "^ulysses: error:" "$dir/err.log")" -eq 1 ] &&
  grep -qF "ranks were given different --requests-arrive: rank 0 has 0,1, rank 1 has 0,2" "$dir/err.log"; then
  ok "arrivals differing between ranks"
else bad "arrivals differing between ranks"; cat "$dir/err.log"; fi
expect "turn file empty" 2 "--turn $dir/empty.txt: a turn of 0 tokens; it needs at least one token a rank (2)" \
  "${gen[@]}" --turn "$dir/empty.txt" "${out[@]}"
head -c 2 "$dir/turn.txt" > "$dir/short.txt"
expect "turn file short" 3 "a turn of 2 tokens; it needs at least one token a rank (3)" \
  "${gen[@]}" --turn "$dir/short.txt" "${out[@]}"
expect "turn file missing" 2 "--turn $dir/nonexistent.txt: cannot open" "${gen[@]}" --turn "$dir/nonexistent.txt" "${out[@]}"
expect "turn and turn tokens" 2 "--turn excludes --turn-tokens" "${gen[@]}" --turn "$dir/turn.txt" --turn-tokens 64 "${out[@]}"
expect "turn with requests" 2 "not with --requests" \
  generate --checkpoint "$dir/ck160" --requests 2x64 --turn "$dir/turn.txt" "${out[@]}"
expect "turn file is the json" 2 "refusing to overwrite an input" "${gen[@]}" --turn "$dir/turn.txt" --json "$dir/turn.txt"
[ "$(cat "$dir/turn.txt")" = "And what did the needle say? Answer now." ] && ok "the turn file kept" ||
  bad "the turn file was overwritten"
expect "over --max-memory" 2 "more than --max-memory 100.0 MiB" \
  generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 2000000 --max-memory 100MiB "${out[@]}"
# Requests that never overlap hold one cache at a time (allocated at its prefill, returned after
# its last token): a --max-memory under their four caches together (4 x 48.8 MiB) and over one
# admits them, and the measured peak stays under it; arriving at once they are refused, the
# message naming the prediction, the limit and the caches held together.
mem=(generate --checkpoint "$dir/ck160" --requests 4x64 --capacity 200000 --max-new-tokens 2 --max-memory 120MiB)
if run 1 "${mem[@]}" --requests-arrive 0,10,20,30 --json "$dir/m.json" > "$dir/m.log" 2>&1 &&
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); m=j["memory"]; k=j["kv_cache"][0]
assert m["predicted_bytes"] < 120 * 2**20 and m["peak_rss_bytes"] < 120 * 2**20, m
assert k["bytes"] == k["formula_bytes"] == 51200000 and len(k["requests"]) == 1, k' "$dir/m.json"; then
  ok "requests one after another fit a --max-memory their sum is over"
else bad "requests one after another refused or over"; cat "$dir/m.log"; fi
expect "caches at once over --max-memory" 1 \
  "more than --max-memory 120.0 MiB: the KV caches of requests 0, 1, 2, 3 held at once (of 4)" "${mem[@]}" "${out[@]}" &&
  { grep -qF "attention 195.3 MiB" "$dir/err.log" && ok "the refusal names the caches' bytes" ||
    bad "the refusal does not name the caches' bytes"; }
expect "over the machine" 2 "more than this machine has" \
  generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 4000000000 "${out[@]}"
expect "trace unwritable" 2 "--trace" "${gen[@]}" --trace /nonexistent/dir/t.json "${out[@]}"
no_file "$dir/never.json" "every refusal"

[ $fails -eq 0 ] && echo "generate cli OK" || { echo "$fails failure(s)"; exit 1; }
