#!/usr/bin/env bash
# Probes of `ulysses plan` as a hostile user: bounds, presets, modes and the options that do
# nothing in their combination each end within seconds with a clear message and a non-zero exit,
# and write nothing; the calibrate grid and the calibrated kernel give consistent, finite numbers.
# (Its own script beside hardening_cli_test.sh: each probe is an mpirun launch, so the two halves
# run side by side.)
# usage: hardening_plan_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'rm -rf "$dir"' EXIT

# The planner's bounds, short range errors.
expect "plan seq 2^58 --svg" 1 "too large to plan" plan --seq 288230376151711744 --heads 8 --svg "$dir/p.svg"
no_file "$dir/p.svg" "plan seq 2^58"
expect "plan cp 2e9" 1 "cp must be at most 65536, got 2000000000" plan --seq 1024 --heads 8 --cp 2000000000
run 1 plan --seq 1024 --heads 8 --cp 8 --svg "$dir/ok.svg" > /dev/null 2>&1 && grep -q "<polyline" "$dir/ok.svg" &&
  ok "plan --svg" || bad "plan --svg"
expect "plan cross, causal, no q_offset" 1 "cross-attention with a causal mask needs q_offset" plan --seq 1024 \
  --kv-seq 4096 --heads 8
run 1 plan --seq 1024 --kv-seq 4096 --q-offset 3072 --heads 8 --cp 4 --json "$dir/x.json" > "$dir/x.log" 2>&1 &&
  grep -q "cross-attention: k/v of 4096 tokens, q_offset 3072" "$dir/x.log" && python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p["input"]["kv_seq"] == 4096 and p["input"]["q_offset"] == 3072 and p["best"]
assert all(r["valid"] or "does not support cross-attention" in r["reason"] for r in p["strategies"])' "$dir/x.json" &&
  ok "plan --kv-seq --q-offset: valid rows or refused with the reason" || { bad "plan --kv-seq"; cat "$dir/x.log"; }
expect "plan --q-offset --no-causal" 1 "--q-offset has no effect with --no-causal and no --window" plan --seq 1024 \
  --kv-seq 4096 --q-offset 5 --no-causal --heads 8
# Presets and modes: unknown names list the known ones; explicit flags win and say so.
expect "plan --gpu X100" 1 "unknown GPU 'X100' (known: A100, A800, H100, H800, H20, H200, B200, L20, L40S)" plan --seq 1024 --heads 8 --gpu X100
expect "plan --intra-fabric nvlink9" 1 "unknown fabric 'nvlink9' (known: nvlink3" plan --seq 1024 --heads 8 --intra-fabric nvlink9
expect "plan --gpu A100 --kernel fa3" 1 "--kernel fa3 does not run on A100 (the presets it runs on: H100, H800" \
  plan --seq 1024 --heads 8 --gpu A100 --kernel fa3
expect "plan --kernel without --gpu" 1 "--kernel needs --gpu" plan --seq 1024 --heads 8 --kernel fa2
expect "plan --mode infer" 1 "unknown mode 'infer' (use one of train, forward, prefill, decode)" plan --seq 1024 --heads 8 --mode infer
run 1 plan --seq 65536 --heads 32 --kv-heads 8 --gpu H100 --efficiency 0.4 > "$dir/g.log" 2>&1 &&
  grep -q "presets: GPU H100" "$dir/g.log" && grep -q "flags over presets: --efficiency 0.4 (preset: 0.663)" "$dir/g.log" &&
  grep -q "p2p --no-zigzag" "$dir/g.log" && ok "plan --gpu with --efficiency: the flag wins, the header says so" ||
  { bad "plan --gpu --efficiency"; cat "$dir/g.log"; }
run 1 plan --seq 4096 --heads 4 --cp 8 --mode decode --batch 8 > "$dir/d.log" 2>&1 &&
  grep -q "^heads  *8 invalid: KV layout heads cannot hold 4 query heads at cp = 8" "$dir/d.log" &&
  grep -q "^interleaved  *8 .*b>=" "$dir/d.log" && grep -q "^decode recommendation: .* pays at 4096 tokens" "$dir/d.log" &&
  ok "plan --mode decode: each KV layout priced or invalid with why, the crossover printed" ||
  { bad "plan --mode decode"; cat "$dir/d.log"; }
expect "plan --train --cached" 2 "--cached has no effect with --train" plan --train --heads 4 --cached 10
expect "plan --cached past int64" 1 "the turn is too large to plan" plan --seq 1024 --heads 8 --mode prefill \
  --cached 9223372036854775000
grep -q "^ulysses plan:" "$dir/err.log" && bad "plan --cached past int64: the plan printed first" ||
  ok "plan --cached past int64: refused before any table"
expect "plan --cached without prefill" 1 "--cached has no effect without --mode prefill" plan --seq 1024 --heads 8 --cached 10
run 1 plan --seq 1024 --heads 64 --kv-heads 8 --cp 4 --mode prefill --cached 31744 > "$dir/t.log" 2>&1 &&
  grep -q "^turn recommendation: pass-Q: T/(T+P) = 1024/32768" "$dir/t.log" && ok "plan --cached: pass-Q by Meta's rule" ||
  { bad "plan --cached"; cat "$dir/t.log"; }
run 1 plan --seq 65536 --heads 32 --cp 8 --max-memory 1GiB > "$dir/m.log" 2>&1 &&
  grep -q "invalid: memory: needs" "$dir/m.log" && grep -q "^recommendation: memory decides" "$dir/m.log" &&
  ok "plan --max-memory: rows over it refused, the recommendation says memory decided" ||
  { bad "plan --max-memory"; cat "$dir/m.log"; }
# Options with no effect with the planner's modes are errors, never ignored.
expect "plan --calibrate --world" 2 "--world has no effect with --calibrate, which measures this machine and plans for the 2 rank(s)" \
  plan --calibrate --lengths 2x512 --world 64 --heads 4
expect "plan --calibrate --cp" 2 "--cp has no effect with --calibrate" plan --calibrate --seq 512 --heads 4 --cp 64
expect "plan --world without --lengths" 2 "--world has no effect without --lengths" plan --seq 512 --heads 4 --world 8
expect "plan --train --json" 2 "--json has no effect with --train" plan --train --heads 4 --json "$dir/t.json"
no_file "$dir/t.json" "plan --train --json"
# The calibrate grid: every valid row of every shape measured, the counts consistent with the
# rows; its options refused where they do nothing, nothing written.
run 2 plan --calibrate --grid quick --grid-runs 2 --json "$dir/grid.json" > "$dir/grid.log" 2>&1 && python3 -c '
import json, math, sys
g = json.load(open(sys.argv[1]))
assert len(g["shapes"]) == 4 and g["runs"] == 2 and g["clock"] == "cpu" and len(g["load_average"]) == 2, g
names = set()
for s in g["shapes"]:
    rows = {r["name"]: r for r in s["rows"]}
    assert {s["recommended"], s["predicted_fastest"], s["measured_fastest"]} <= rows.keys(), s
    assert all(r["measured_s"] > 0 and math.isfinite(r["measured_s"]) and r["predicted_s"] > 0 for r in s["rows"]), s
    best = min(r["measured_s"] for r in s["rows"])
    assert rows[s["measured_fastest"]]["measured_s"] == best, s
    names |= rows.keys()
assert {"a2a", "p2p", "p2p --no-zigzag", "all_gather"} <= names, names
assert 0 <= g["predicted_fastest_within_5_percent"] <= 4 and 0 <= g["recommended_within_5_percent"] <= 4
assert g["rows"] == sum(len(s["rows"]) for s in g["shapes"]) and 0 <= g["rows_within_20_percent"] <= g["rows"]
w = g["with_cache"]  # the same runs, priced with the cache term
assert w["rows"] == g["rows"] and 0 <= w["recommended_within_5_percent"] <= 4, w
assert all(r["predicted_with_cache_s"] > 0 for s in g["shapes"] for r in s["rows"])
assert 0 <= g["tie_band"] and all(0 <= s["tie_band"] and math.isfinite(s["tie_band"]) for s in g["shapes"]), g' \
  "$dir/grid.json" && grep -q "^grid: the recommendation measures within 5% of the fastest in [0-4] of 4 shapes" "$dir/grid.log" &&
  ok "plan --calibrate --grid quick: every row measured, the counts" || { bad "plan --grid"; cat "$dir/grid.log"; }
# The calibrated kernel: a fixed cost per call and a ring step's merge, finite and not negative;
# --memory-bw, given, wins over the measured rate.
run 2 plan --calibrate --seq 512 --heads 4 --head-dim 16 --mode forward --json "$dir/cal.json" > "$dir/cal.log" 2>&1 &&
  run 1 plan --calibrate --mode decode --seq 512 --heads 4 --head-dim 16 --memory-bw 5GB/s --json "$dir/dec.json" \
    >> "$dir/cal.log" 2>&1 && python3 -c '
import json, math, sys
k = json.load(open(sys.argv[1]))["input"]["kernel"]
assert all(math.isfinite(k[n]) and k[n] >= 0 for n in ("call_s", "merge_passes", "kv_half", "memory_bandwidth", "kv_pack_s_per_byte", "cache_bytes", "past_cache_extra")), k
assert k["call_s"] < 0.01 and k["memory_bandwidth"] > 0, k
assert json.load(open(sys.argv[2]))["input"]["kernel"]["memory_bandwidth"] == 5e9' "$dir/cal.json" "$dir/dec.json" &&
  grep -q "us per call, a ring step.s merge" "$dir/cal.log" &&
  ok "plan --calibrate: call cost and merge fitted, --memory-bw kept" || { bad "plan --calibrate kernel"; cat "$dir/cal.log"; }
# Decode calibrated here: the kernel's rates (memory and last-level cache), a step's gather and the
# row's rate measured, no --memory-bw needed; the row's options refused where they do nothing.
run 2 plan --calibrate --mode decode --seq 4096 --heads 4 --head-dim 16 --width 64 --json "$dir/dc.json" \
  > "$dir/dc.log" 2>&1 && python3 -c '
import json, math, sys
j = json.load(open(sys.argv[1]))
rows = {r["layout"]: r for r in j["decode"]["rows"]}
assert j["input"]["kernel"]["memory_bandwidth"] > 0, j["input"]
assert all(r["valid"] and r["row_s"] > 0 and math.isfinite(r["step_s"]) for r in rows.values()), rows
assert rows["heads"]["row_s"] == rows["cp = 1"]["row_s"] and rows["heads"]["comm_s"] > 0, rows
assert all(math.isfinite(r["calls_s"]) and r["calls_s"] > 0 for r in rows.values()), rows' "$dir/dc.json" &&
  grep -q "^decode calibrated (CPU seconds): the kernel reads" "$dir/dc.log" && grep -q "a step.s gather" "$dir/dc.log" &&
  grep -q "a request adds [0-9.]* us a layer (cp = 1; heads [0-9.]*, interleaved [0-9.]*)" "$dir/dc.log" &&
  grep -q "^decode rows calibrated (CPU seconds): [0-9.]* us a token at 1 rows a step" "$dir/dc.log" &&
  ok "plan --calibrate --mode decode --width: rates, gather and row measured" || { bad "plan decode calibrate"; cat "$dir/dc.log"; }
expect "plan --vocab without decode" 2 "--vocab has no effect without --mode decode --width" plan --seq 512 --heads 4 --vocab 100
expect "plan --width without a mode" 2 "--width has no effect without --train, --lengths or --mode decode" \
  plan --seq 512 --heads 4 --width 64
expect "plan --hidden without --width" 2 "--hidden has no effect with --mode decode but no --width" \
  plan --seq 512 --heads 4 --mode decode --hidden 100
expect "plan --width 0" 1 "--width" plan --seq 512 --heads 4 --mode decode --width 0
expect "plan --grid without --calibrate" 2 "--grid has no effect without --calibrate" plan --grid quick --json "$dir/g2.json"
no_file "$dir/g2.json" "plan --grid without --calibrate"
expect "plan --grid huge" 2 "unknown --grid 'huge' (use quick or full)" plan --calibrate --grid huge
expect "plan --grid --seq" 2 "--seq has no effect with --grid (the grid sets the shapes)" plan --calibrate --grid quick --seq 512
expect "plan --grid-runs without --grid" 2 "--grid-runs has no effect without --grid" plan --seq 512 --heads 4 --grid-runs 2
expect "plan --grid-clock without --grid" 2 "--grid-clock has no effect without --grid" plan --seq 512 --heads 4 --grid-clock wall
expect "plan --grid-clock gpu" 2 "--grid-clock: gpu not in {cpu,wall}" plan --calibrate --grid quick --grid-clock gpu
expect "plan without --heads" 1 "--heads is required (unless --grid)" plan --seq 512
# Work past 64 bits wrapped (the compute of s = 2^31 on 32 heads came out 0, of 2^32 that of
# 2^16): refused, a decode's prompt before its table is printed; a window bounds it.
expect "plan seq 2^31, 32 heads" 1 "too large to plan: a rank's work (batch x heads" plan --seq 2147483648 --heads 32 --json "$dir/w.json"
no_file "$dir/w.json" "plan seq 2^31"
expect "plan decode, a prompt of 2^31" 1 "too large to plan: a rank's work (batch x heads" plan --seq 2147483648 --heads 32 --mode decode
grep -q "^ulysses plan:" "$dir/err.log" && bad "plan decode 2^31: the table began before the error" ||
  ok "plan decode 2^31: refused before any table"
run 1 plan --seq 4294967296 --heads 32 --window 4096 --json "$dir/w.json" > "$dir/w.log" 2>&1 && python3 -c '
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["strategies"] if r["valid"]]
# A window of 4096 keys: 2^32 queries x 4097 pairs at most on 4 heads (32 / cp 8) per a2a rank.
a2a = next(r for r in rows if r["name"] == "a2a")
assert a2a["compute_s"] > 4 * 2**32 * 4000 * 4 * 128 / 989e12 and all(r["compute_s"] > 0 for r in rows), rows' "$dir/w.json" &&
  ok "plan seq 2^32 --window 4096: planned, compute not wrapped" || { bad "plan seq 2^32 --window"; cat "$dir/w.log"; }
expect "plan --tflops inf" 1 "the compute rate must be finite, got inf" plan --seq 1024 --heads 8 --tflops inf
# An empty value read as none given: refused like an unknown one.
for flag in --json --svg --docs --window --lengths --grid; do
  expect "plan $flag ''" 1 "$flag was given an empty value: name " plan --seq 1024 --heads 8 "$flag" ''
done
expect "plan --gpu ''" 1 "unknown GPU '' (known: A100" plan --seq 1024 --heads 8 --gpu ''
expect "plan --inter-fabric ''" 1 "unknown fabric '' (known: nvlink3" plan --seq 1024 --heads 8 --inter-fabric ''
# The decode table prices a whole cache of --seq tokens: what it does not price is refused.
for flag in "--window 512" "--docs 2x512" "--kv-seq 2048" "--q-offset 0"; do
  expect "plan --mode decode $flag" 1 "${flag%% *} is not priced by --mode decode" plan --seq 1024 --heads 8 --mode decode $flag
done
expect "plan --mode decode --svg" 1 "--svg is not drawn for --mode decode" plan --seq 1024 --heads 8 --mode decode \
  --svg "$dir/d.svg"
no_file "$dir/d.svg" "plan --mode decode --svg"
# No row valid at any length (a memory cap): a plot that says so, its coordinates finite.
run 1 plan --seq 65536 --heads 32 --max-memory 1KiB --svg "$dir/e.svg" > "$dir/e.log" 2>&1 && python3 -c '
import re, sys, xml.etree.ElementTree as ET
t = open(sys.argv[1]).read()
ET.fromstring(t)
assert "no strategy is valid at any of these lengths" in t and not re.search(r"nan|inf", t, re.I), t' "$dir/e.svg" &&
  ok "plan --svg, every row refused: the plot says so" || { bad "plan --svg all refused"; cat "$dir/e.log" "$dir/e.svg"; }
expect "plan causal --window 10,20" 1 "--window 10,20: the right side has no effect under a causal mask" \
  plan --seq 1024 --heads 8 --window 10,20
# Every figure finite at the slowest rates accepted (1 B/s, 1000 s, 1 FLOP/s; below them refused)
# in every mode, text and JSON (nlohmann writes a non-finite double as null).
expect "plan --intra-bw 1e-300B/s" 1 "bandwidth '1e-300B/s' is below 1 B/s" plan --seq 1024 --heads 8 --intra-bw 1e-300B/s
expect "plan --efficiency 1e-300" 1 "must be at least 1 FLOP/s" plan --seq 1024 --heads 8 --efficiency 1e-300
for mode in train forward prefill decode; do
  run 1 plan --seq 4096 --heads 8 --cp 16 --ranks-per-node 4 --intra-bw 1B/s --inter-lat 1000s --tflops 1e-10 \
    --efficiency 0.01 --memory-bw 1B/s --layers 1000 --mode $mode --json "$dir/f.json" > "$dir/f.log" 2>&1 &&
    ! grep -qiwE "nan|-nan|inf" "$dir/f.log" && python3 -c '
import json, math, sys
def bad(x):
    if isinstance(x, dict): return any(bad(v) for v in x.values())
    if isinstance(x, list): return any(bad(v) for v in x)
    return isinstance(x, float) and not math.isfinite(x)
def nulls(x, key=""):
    if isinstance(x, dict): return [n for k, v in x.items() for n in nulls(v, k)]
    if isinstance(x, list): return [n for v in x for n in nulls(v, key)]
    return [key] if x is None and key != "q_offset" else []
j = json.load(open(sys.argv[1]))
assert not bad(j) and not nulls(j), nulls(j)' "$dir/f.json" &&
    ok "plan --mode $mode at the slowest rates: every figure finite" || { bad "plan --mode $mode slowest"; cat "$dir/f.log"; }
done
run 1 plan --seq 65536 --heads 32 --gpu H100 --memory-bw 1TB/s --mode decode > "$dir/mb.log" 2>&1 &&
  grep -q "flags over presets: --memory-bw 1 TB/s (preset: 3.35)" "$dir/mb.log" &&
  grep -q "^decode over a sharded KV cache: .* memory 1000 GB/s" "$dir/mb.log" &&
  ok "plan --gpu --memory-bw: the flag wins, the header says so" || { bad "plan --gpu --memory-bw"; cat "$dir/mb.log"; }

echo "$fails failure(s)"
[ $fails -eq 0 ]
