#!/usr/bin/env bash
# `ulysses plan --lengths`: each policy's predicted step time in the JSON equals the library's
# (through ulysses.balance), and bad input fails with the rule and no output file.
# usage: plan_lengths_test.sh ULYSSES_BINARY PYTHON   (PYTHONPATH: the built package)
set -u
bin=$1 py=$2 fails=0
dir=$(mktemp -d) && trap 'rm -rf "$dir"' EXIT
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

if "$bin" plan --lengths 1x16384,32x512 --world 2 --heads 8 --head-dim 64 --layers 2 --json "$dir/p.json" > "$dir/p.log" 2>&1 &&
   grep -q "dynamic .* 1x32 2x1" "$dir/p.log" &&
   "$py" - "$dir/p.json" <<'PY'
import json, sys
import ulysses
j = json.load(open(sys.argv[1]))
for p in j["worlds"][0]["policies"]:
    lib = ulysses.balance(j["lengths"], 2, p["policy"], heads=8, head_dim=64, layers=2,
                          gemm_flops_per_token=j["gemm_flops_per_token"])
    assert abs(lib.step_seconds - p["step_seconds"]) <= 1e-12 * lib.step_seconds, (p["policy"], lib.step_seconds, p)
    assert [list(g) for g in lib.groups] == p["groups"], p["policy"]
    assert p["max_memory_per_rank"] is None, p  # no --max-memory: no memory model priced it
PY
   grep -qE "^  dynamic .* +- +1x32 2x1" "$dir/p.log"  # the mem column: "-", not 0.0
then ok "plan --lengths: the JSON equals ulysses.balance"; else bad "plan --lengths vs the library"; cat "$dir/p.log"; fi

# Every world's policies are planned at once, but printed and written in order: the same text
# with --json as without it (which builds no JSON).
spec=(--lengths pareto:256:64:65536:1.5 --heads 8 --head-dim 64 --layers 2)
if "$bin" plan "${spec[@]}" > "$dir/a.log" 2>&1 && "$bin" plan "${spec[@]}" --json "$dir/a.json" > "$dir/b.log" 2>&1 &&
   cmp -s "$dir/a.log" "$dir/b.log" && "$py" - "$dir/a.json" "$dir/a.log" <<'PY'
import json, re, sys
worlds = [2**k for k in range(1, 11)]
j = json.load(open(sys.argv[1]))
assert [w["world"] for w in j["worlds"]] == worlds, [w["world"] for w in j["worlds"]]
assert [[p["policy"] for p in w["policies"]] for w in j["worlds"]] == [["static", "pow2", "dynamic"]] * 10
assert [int(w) for w in re.findall(r"^world (\d+)", open(sys.argv[2]).read(), re.M)] == worlds
PY
then ok "plan --lengths: every world in order, the same text with and without --json"
else bad "plan --lengths: every world in order"; cat "$dir/a.log"; fi
# Memory for one plan (~67 MB here) but not two: the plans run one at a time, the same text.
if ULYSSES_MEM_AVAILABLE=100000000 "$bin" plan "${spec[@]}" > "$dir/c.log" 2>&1 && cmp -s "$dir/a.log" "$dir/c.log"
then ok "plan --lengths: one plan at a time where the memory holds one, the same text"
else bad "plan --lengths: every world in order"; cat "$dir/a.log"; fi

check_error() {  # expected message, then the arguments
  local want=$1; shift
  if "$bin" plan "$@" --json "$dir/e.json" > "$dir/e.log" 2>&1; then bad "accepted: $*"; return; fi
  if grep -q -- "$want" "$dir/e.log" && [ ! -e "$dir/e.json" ]; then ok "refused: $*"; else bad "message for $*"; cat "$dir/e.log"; fi
}
check_error "dp 3 does not divide the world size 4" --lengths 8x512 --world 4 --dp 3 --heads 8
# Every world planned at once: the first world whose dynamic plan fails ends the output where it
# did when the worlds were planned in turn, after that world's other policies.
check_error "sequence 0 (300000 tokens) fits no group under the memory cap" --lengths 300000,4096,100 --heads 8 \
  --max-memory 2GiB
if [ "$(grep -c '^world ' "$dir/e.log")" = 1 ] && grep -q '^  pow2     cannot place the step' "$dir/e.log"; then
  ok "plan --lengths: a failing world ends the output"
else bad "plan --lengths: a failing world ends the output"; cat "$dir/e.log"; fi
check_error "pareto" --lengths pareto:4:10:5:1 --world 2 --heads 8
# What the plans would meet inside is refused before any table: an unknown strategy, and a length
# whose work on one rank passes the planner's 64-bit counts (priced wrong, 6124x static, before).
check_error "unknown cp_comm_type 'foo'" --lengths 4x1024 --world 8 --heads 32 --cp-comm-type foo
if grep -q '^world ' "$dir/e.log"; then bad "plan --lengths: a table before the unknown strategy"; fi
check_error "longest sequence (1073741824 tokens) on one rank: the problem is too large to plan" \
  --lengths 1x1073741824 --world 8 --heads 32
if grep -q '^world ' "$dir/e.log"; then bad "plan --lengths: a table before the too-large length"; fi
check_error "sequence 0 (16384 tokens) fits no group under the memory cap" --lengths 1x16384 --world 2 --heads 8 \
  --head-dim 64 --max-memory 1MiB
# a2a+p2p picks its split [inner, outer] per group: under a cap each group is priced at the most
# any valid split needs (it crashed on the split it had not picked yet), and stays under the cap.
if "$bin" plan --lengths 8x65536,64x4096 --world 16 --heads 32 --cp-comm-type a2a+p2p --max-memory 8GiB \
     --json "$dir/h.json" > "$dir/h.log" 2>&1 &&
   "$py" - "$dir/h.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for p in j["worlds"][0]["policies"]:
    assert 0 < p["max_memory_per_rank"] <= 8 * 2**30, p
PY
then ok "plan --lengths a2a+p2p under --max-memory"; else bad "plan --lengths a2a+p2p under --max-memory"; cat "$dir/h.log"; fi
check_error "fits no group under the memory cap" --lengths 8x4096 --world 8 --heads 32 --cp-comm-type a2a+p2p \
  --max-memory 1GiB
# The planner's memory is bounded before it plans: a stated limit of sequences x ranks, and what
# the machine has.
check_error "are 1024000000 sequence x rank pairs, more than the planner's limit of 134217728" \
  --lengths 1000000x512 --world 1024 --heads 8
# Its memory grows with distinct lengths, not sequences x ranks: 200 000 sequences of 4 lengths
# at world 64 peak at about 150 MB (1.4 GB when every sequence kept its own options).
if "$py" - "$bin" "$dir/big.log" <<'PY'
import resource, subprocess, sys
with open(sys.argv[2], "w") as log:
    subprocess.run([sys.argv[1], "plan", "--lengths", "100000x512,60000x2048,30000x8192,10000x32768", "--world", "64",
                    "--heads", "8", "--head-dim", "64", "--layers", "2"], stdout=log, stderr=log, check=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
assert peak < 400e6, f"peak RSS {peak / 1e6:.0f} MB"
print(f"peak RSS {peak / 1e6:.0f} MB")
PY
then ok "plan --lengths: 200 000 sequences of 4 lengths plan in under 400 MB"; else bad "plan --lengths memory"; cat "$dir/big.log"; fi
ULYSSES_MEM_AVAILABLE=1000000 check_error "ulysses plan --lengths needs about" --lengths 8x512 --world 4 --heads 8
# Options the mode leaves without effect are refused, not ignored.
check_error "--world has no effect with --calibrate" --lengths 8x512 --world 4 --heads 8 --calibrate
check_error "--seq has no effect with --lengths" --lengths 8x512 --world 4 --heads 8 --seq 4096
check_error "--tile-rows has no effect without --train" --lengths 8x512 --world 4 --heads 8 --tile-rows 64
exit $((fails > 0))
