#!/usr/bin/env bash
# `ulysses plan` at cp 65536 on the inputs that used to take seconds to minutes (a sliding
# window, whose halo the planner walked neighbour by neighbour; 256 packed documents, read
# document by document for every rank), against numbers worked out by hand from the layout.
# The numbers, not the time: a slow machine must not fail it.
# usage: plan_large_cp_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS"
source "$(dirname "$0")/cli_lib.sh" "$@" none
trap 'rm -rf "$dir"' EXIT

shape="--seq 131072 --heads 32 --kv-heads 8 --head-dim 128 --cp 65536"
# check NAME PYTHON_ASSERTS ARGS...: plans with --json, then asserts on p (the plan) and row(name).
check() {
  local name=$1 asserts=$2; shift 2
  if ! run 1 plan $shape "$@" --json "$dir/p.json" > "$dir/p.log" 2>&1; then bad "$name: plan failed"; cat "$dir/p.log"; return; fi
  if python3 - "$dir/p.json" <<PY; then ok "$name"; else bad "$name"; fi
import json, sys
p = json.load(open(sys.argv[1]))
rows = {r["name"]: r for r in p["strategies"]}
row = lambda n: rows[n]
$asserts
PY
}

# Zigzag chunks of one token (s = 2·cp): rank r holds tokens r and 2cp − 1 − r. Under a causal
# window W a key is seen by the W tokens after it, owned by W distinct ranks; the busiest rank
# sends 2W rows of K and V (8 KV heads × 128 × bf16, 2 bytes) to 2W ranks, and receives the
# float32 dK/dV of the 2W rows it holds from 2W ranks.
for W in 64 4096; do
  check "window $W: p2p's halo is 2W rows each way" "
kv = 2 * 8 * 128
r = row('p2p')
assert r['valid'], r
assert r['forward_bytes_per_rank'] == 2 * $W * kv * 2, r['forward_bytes_per_rank']
assert r['backward_bytes_per_rank'] == 2 * $W * kv * 4, r['backward_bytes_per_rank']
assert r['forward_messages'] == 2 * $W and r['backward_messages'] == 2 * $W, r" --window "$W"
done

# 256 documents of 512 tokens, per-document zigzag: each document is cut into 2cp chunks of 0 or
# 1 token, the first chunks of consecutive documents continuing one sweep over the ranks, so
# rank r holds the tokens at offset r mod 512 of two documents. A token at offset o sees o + 1
# keys: the busiest rank 2 × 512 pairs, the mean 2 × 256.5. The ring sends every K/V row but the
# next rank's 2 tokens, and the dK/dV of all of them.
check "256 documents of 512: p2p's work and bytes" "
kv = 2 * 8 * 128
r = row('p2p')
assert r['valid'], r
assert abs(r['work_imbalance'] - 1024 / 513) < 1e-12, r['work_imbalance']
assert r['forward_bytes_per_rank'] == (131072 - 2) * kv * 2, r['forward_bytes_per_rank']
assert r['backward_bytes_per_rank'] == (131072 - 2) * kv * 2 + 131072 * kv * 4, r['backward_bytes_per_rank']" \
  --docs 256x512

# The same documents under a window of 4096 (past every document: the band is positional). Each
# rank holds two single tokens, each in the band of the 4096 tokens after it, dealt one a rank in
# sweeps: 4096 distinct receivers a token, the same 4096 for both (the second token is dealt a
# whole sweep of the ranks later), so the busiest rank sends 2 × 4096 rows in 4096 messages and
# receives as many float32 dK/dV rows back. (Visiting every window entry, 5·10^8, gives the same;
# the plan reads each window as the few runs of consecutive ranks it crosses.)
check "256 documents of 512, window 4096: p2p's halo is 2W rows to W ranks" "
kv = 2 * 8 * 128
r = row('p2p')
assert r['valid'], r
assert r['forward_bytes_per_rank'] == 2 * 4096 * kv * 2, r['forward_bytes_per_rank']
assert r['backward_bytes_per_rank'] == 2 * 4096 * kv * 4, r['backward_bytes_per_rank']
assert r['forward_messages'] == 4096 and r['backward_messages'] == 4096, r" --docs 256x512 --window 4096

# 256 sequences of 512 tokens over 65536 ranks: the balancer's options are every (size,
# placement), ~300k a sequence, which it reads as classes of equal windows. Each sequence ends
# up alone on a node of 8 ranks: 2048 ranks busy, busy/mean = 65536 / 2048 = 32.
lengths="--lengths 256x512 --world 65536 --heads 32 --head-dim 128 --layers 32 --width 4096"
# shellcheck disable=SC2086  # a list of flags
if run 1 plan $lengths > "$dir/l.log" 2>&1 && grep -Eq "^  dynamic +[0-9.]+ +- +32\.000 .* 8x256$" "$dir/l.log"; then
  ok "256 sequences of 512 on 65536 ranks: one node each"
else
  bad "256 sequences of 512 on 65536 ranks"; cat "$dir/l.log"
fi

[ "$fails" -eq 0 ] && echo "plan large cp OK"
exit "$fails"
