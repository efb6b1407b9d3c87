#!/usr/bin/env bash
# Against the anchors: `ulysses train` (mpirun -n 2, CORES/2 threads per rank) beside
# the same model in PyTorch (bench/train_anchor.py: one process x CORES threads) and in
# DeepSpeed-Ulysses (DistributedAttention around SDPA, mpirun -n 2 over gloo, CORES/2 threads per
# rank), interleaved in one run (ulysses, torch, deepspeed for each case, ROUNDS times), on
#   --width 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 4 --hidden 1376, batch 1.
# First a correctness check at s = 256: the parameter count of `ulysses train`'s header and the
# losses of 3 steps must agree (same init, data and AdamW), and the first loss be near ln(256).
# Each run: STEPS steps, the first the warm-up (the anchors run theirs at s = 1024: their steps
# take minutes here); tokens/s = s / median step time of the rest (slowest rank); peak MiB =
# VmHWM per rank, the largest over ranks. Prints a markdown table; with ROUNDS > 1 each cell is
# the median over rounds. The JSON lines are appended to $OUT/train_anchors.jsonl as each run
# ends (OUT: a temporary folder unless set); `--table FILE` prints the table of such a file
# (also of an interrupted run). CORES: the environment variable, else nproc. Needs torch >= 2.5
# in ULYSSES_ANCHOR_PYTHON (default /tmp/anchors/bin/python), says so and exits 3 otherwise;
# without deepspeed there it says so and runs ulysses and torch only. Not part of the tests.
# usage: bench/train_anchors.sh [BUILD_DIR] [SEQ:DTYPE:STEPS list] [ROUNDS=1]
#        (default list "8192:f32:3 8192:bf16:2 16384:f32:2 16384:bf16:2")
#        bench/train_anchors.sh --table FILE
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# table FILE: the markdown table of a results file.
table() {
  python3 - "$1" <<'PY'
import json, statistics, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
runners = ("ulysses", "torch", "deepspeed")
def cell(runner, seq, dtype, key):
    v = [r[key] for r in rs if (r["runner"], r["seq"], r["dtype"]) == (runner, seq, dtype)]
    return statistics.median(v) if v else None
def num(x, fmt="{:.0f}"):
    return "—" if x is None else fmt.format(x)
print("| s | dtype | ulysses tokens/s | PyTorch tokens/s | DeepSpeed tokens/s | ulysses / max | "
      "ulysses MiB/rank | PyTorch MiB | DeepSpeed MiB/rank | MFU ulysses / PyTorch / DeepSpeed |")
print("|---|---|---|---|---|---|---|---|---|---|")
for seq, dtype in dict.fromkeys((r["seq"], r["dtype"]) for r in rs):
    t = {x: cell(x, seq, dtype, "tokens_per_s") for x in runners}
    m = {x: cell(x, seq, dtype, "peak_rss_mib") for x in runners}
    anchors = [t[x] for x in runners[1:] if t[x] is not None]
    ratio = t["ulysses"] / max(anchors) if anchors and t["ulysses"] else None
    mfu = {x: cell(x, seq, dtype, "mfu") if all(r.get("mfu") for r in rs if r["runner"] == x) else None
           for x in runners}
    gf = " / ".join(num(None if mfu[x] is None else 100 * mfu[x], "{:.0f}%") for x in runners)
    print(f"| {seq} | {dtype} | {num(t['ulysses'])} | {num(t['torch'])} | {num(t['deepspeed'])} | "
          f"{num(ratio, '{:.2f}x')} | {num(m['ulysses'])} | {num(m['torch'])} | {num(m['deepspeed'])} | {gf} |")
PY
}
if [ "${1:-}" = --table ]; then
  table "$2"
  exit 0
fi

bin=${1:-$root/build}/ulysses
cases=${2:-8192:f32:3 8192:bf16:2 16384:f32:2 16384:bf16:2}
rounds=${3:-1}
py=${ULYSSES_ANCHOR_PYTHON:-/tmp/anchors/bin/python}
source "$root/scripts/mpi_env"
if ! "$py" -c 'import torch, sys; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5))' \
    > /dev/null 2>&1; then
  echo "train_anchors: needs torch >= 2.5 importable by $py (set ULYSSES_ANCHOR_PYTHON); skipped" >&2
  exit 3
fi
runners=(ulysses torch deepspeed)
if ! "$py" -c 'import deepspeed' > /dev/null 2>&1; then
  echo "train_anchors: no deepspeed in $py: DeepSpeed's column stays empty" >&2
  runners=(ulysses torch)
fi
cores=${CORES:-$(nproc)}
half=$(( cores / 2 > 0 ? cores / 2 : 1 ))
model=(--width 512 --heads 8 --kv-heads 2 --head-dim 64 --layers 4 --hidden 1376 --batch 1)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
results=$out/train_anchors.jsonl
: > "$results"
export OMP_NUM_THREADS=$half
declare -A peak  # by dtype: one thread's peak of its unit, from the ulysses run (which runs first)

# run RUNNER SEQ DTYPE STEPS WARMUP_SEQ: appends one JSON line {runner, seq, dtype, ...} to $results.
run() {
  local runner=$1 seq=$2 dtype=$3 steps=$4 warm=$5 json
  case $runner in
    ulysses)
      "${MPIRUN[@]}" -n 2 "$bin" train "${model[@]}" --seq "$seq" --dtype "$dtype" --steps "$steps" --threads "$half" \
        --eval-batches 0 --log "$out/ulysses.log" > "$out/ulysses.out"
      json=$(python3 - "$out/ulysses.log" "$out/ulysses.out" <<'PY'
import json, re, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
out = open(sys.argv[2]).read()
timed = [r["tokens_per_s"] for r in steps[1:]] or [steps[0]["tokens_per_s"]]
print(json.dumps({"tokens_per_s": statistics.median(timed), "peak_rss_mib": max(r["peak_rss_bytes"] for r in steps) / 2**20,
                  "losses": [r["loss"] for r in steps], "params": int(re.search(r"(\d+) parameters", out).group(1)),
                  "mfu": statistics.median([r["mfu"] for r in steps[1:]] or [steps[0]["mfu"]]),
                  "peak_gflops_per_thread": float(re.search(r"peak for MFU: .* ([\d.]+) GFLOP/s per thread", out).group(1))}))
PY
)
      peak[$dtype]=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["peak_gflops_per_thread"])' "$json")
      ;;
    torch)
      json=$("$py" "$root/bench/train_anchor.py" --mode single "${model[@]}" --seq "$seq" --dtype "$dtype" \
               --steps "$steps" --warmup-seq "$warm" --threads "$cores" --peak-gflops "${peak[$dtype]}" 2> "$out/torch.err")
      ;;
    deepspeed)
      json=$("${MPIRUN[@]}" -n 2 -x OMP_NUM_THREADS "$py" "$root/bench/train_anchor.py" --mode deepspeed "${model[@]}" \
               --seq "$seq" --dtype "$dtype" --steps "$steps" --warmup-seq "$warm" --threads "$half" \
               --peak-gflops "${peak[$dtype]}" 2> "$out/deepspeed.err")
      ;;
  esac
  python3 -c 'import json,sys; r=json.loads(sys.argv[4]); r.update(runner=sys.argv[1], seq=int(sys.argv[2]), dtype=sys.argv[3]); print(json.dumps(r))' \
    "$runner" "$seq" "$dtype" "$json" | tee -a "$results" | cut -c1-200 >&2
}

echo "correctness at s = 256 (3 steps, f32):" >&2
for r in "${runners[@]}"; do run "$r" 256 f32 3 256; done
python3 - "$results" <<'PY'
import json, math, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
params = {r["runner"]: r["params"] for r in rs}
ok = len(set(params.values())) == 1
ok &= all(abs(a - b) <= 1e-4 * abs(b) for r in rs for a, b in zip(r["losses"], rs[0]["losses"]))
ok &= abs(rs[0]["losses"][0] - math.log(256)) < 1.0
print(f"check: parameters {params}; losses " + "; ".join(f"{r['runner']} {r['losses']}" for r in rs) +
      f"; ln(256) = {math.log(256):.4f}: {'OK' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
: > "$results"

for ((round = 1; round <= rounds; round++)); do
  for c in $cases; do
    IFS=: read -r seq dt steps <<< "$c"
    for r in "${runners[@]}"; do run "$r" "$seq" "$dt" "$steps" "$((seq < 1024 ? seq : 1024))"; done
  done
done
table "$results"
