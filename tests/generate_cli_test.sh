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
grep -q "(equal)" "$dir/g.log" && ! grep -q "DIFFERENT" "$dir/g.log" && ok "KV bytes = formula" || bad "KV bytes"

# Concurrent requests of different lengths, finishing at different steps, decoded together:
# each request's tokens equal running it alone (request i: --seed i) at cp = 1, at every cp and
# layout, and every step takes one collective per layer (2) whatever the requests running.
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
for layout in heads interleaved; do
  for n in 1 2 3; do
    if run "$n" "${reqs[@]}" --kv-layout "$layout" --json "$dir/r.json" > "$dir/r.log" 2>&1 &&
      [ "$(each "$dir/r.json")" = "$want" ]; then ok "requests cp $n $layout = each alone"
    else bad "requests cp $n $layout differ from each alone"; cat "$dir/r.log"; fi
  done
  if timeout 60 "$bin" "${reqs[@]}" --kv-layout "$layout" --comm local --ranks 3 --json "$dir/r.json" \
    > "$dir/r.log" 2>&1 && [ "$(each "$dir/r.json")" = "$want" ]; then ok "requests local 3 $layout = each alone"
  else bad "requests local 3 $layout differ"; cat "$dir/r.log"; fi
done
grep -q "tokens/s across them" "$dir/r.log" && ok "per-step tokens/s printed" || bad "per-step tokens/s"

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
grep -q "memory per rank: predicted" "$dir/m.log" && ok "memory in the header" || bad "memory line"

# --trace: one Chrome trace, a track per rank, the prefill and every decode step as phases
# around the collectives (one request, and concurrent requests).
for args in "--prompt-tokens 64" "--requests 2x96"; do
  ck=$([ "$args" = "--prompt-tokens 64" ] && echo ck || echo ck160)
  if run 2 generate --checkpoint "$dir/$ck" $args --max-new-tokens 3 --trace "$dir/g.trace" > "$dir/tr.log" 2>&1 &&
    python3 -c 'import json,sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in ev if e.get("cat") == "phase"}
assert {e["pid"] for e in ev} == {0, 1}, ev
assert any(n.startswith("prefill") for n in names) and sum(n.startswith("decode step") for n in names) == 2, names
assert any(e.get("cat") == "comm" for e in ev)' "$dir/g.trace"; then ok "--trace $args"
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
expect "over --max-memory" 2 "more than --max-memory 100.0 MiB" \
  generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 2000000 --max-memory 100MiB "${out[@]}"
expect "over the machine" 2 "more than this machine has" \
  generate --checkpoint "$dir/ck160" --prompt-tokens 160 --capacity 4000000000 "${out[@]}"
expect "trace unwritable" 2 "--trace" "${gen[@]}" --trace /nonexistent/dir/t.json "${out[@]}"
no_file "$dir/never.json" "every refusal"

[ $fails -eq 0 ] && echo "generate cli OK" || { echo "$fails failure(s)"; exit 1; }
