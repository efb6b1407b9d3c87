#!/usr/bin/env bash
# The headline: for one model and a memory cap per rank, the longest sequence that trains
# (2 steps, loss finite) at cp = 1, 2, 4 with activation checkpointing, tiled MLP and tiled
# loss, beside the memory model's prediction (`ulysses plan --train`), and tokens/s there.
# Measured longest: the peak RSS per rank (largest over ranks) is measured at half the
# predicted length and at the predicted length, the cap solved on the line through them, and
# the run repeated at that length to check it trains within the cap (1 % shorter while it
# does not, up to 3 times). 4 ranks on 2 cores are
# oversubscribed: memory is what this measures; tokens/s there are not a speed claim.
# usage: bench/train_headline.sh [BUILD_DIR] [CAP_MIB]   (prints a markdown table)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/ulysses
cap_mib=${2:-64}
source "$root/scripts/mpi_env"
model=(--width 128 --heads 4 --kv-heads 4 --head-dim 32 --hidden 344 --layers 2)
mem=(--checkpoint-activations --tiled-mlp --tiled-loss --tile-rows 256)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
plan=$("$bin" plan --train --heads 4 --kv-heads 4 --head-dim 32 --width 128 --hidden 344 --layers 2 \
       --max-memory "${cap_mib}MiB" --cp 4 --tile-rows 256)
echo "$plan" | head -1
# measure CP SEQ: "PEAK_BYTES LOSS TOKENS_PER_S" of step 2
measure() {
  "${MPIRUN[@]}" -n "$1" "$bin" train "${model[@]}" "${mem[@]}" --batch 1 --seq "$2" --steps 2 --warmup 2 \
    --eval-batches 0 --log "$log" > /dev/null
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(int(r["peak_rss_bytes"]), r["loss"], r["tokens_per_s"])' "$log"
}
echo "| cp | longest s, predicted | longest s, measured | measured / predicted | peak RSS at it (cap ${cap_mib} MiB) | loss | tokens/s |"
echo "|---|---|---|---|---|---|---|"
for cp in 1 2 4; do
  pred=$(echo "$plan" | awk -v cp="$cp" '$1 == cp { print $4 }')
  half=$(( pred / 2 / (2 * cp) * (2 * cp) ))
  read -r p1 _ _ <<< "$(measure "$cp" "$half")"
  read -r p2 _ _ <<< "$(measure "$cp" "$pred")"
  meas=$(python3 -c "s1,p1,s2,p2,cap,u=$half,$p1,$pred,$p2,$cap_mib*2**20,2*$cp; print(int((s1+(cap-p1)*(s2-s1)/(p2-p1))//u*u))")
  read -r peak loss tps <<< "$(measure "$cp" "$meas")"
  for _ in 1 2 3; do  # the line is not exact to the last page: step down 1 % while over the cap
    [ "$peak" -le $((cap_mib << 20)) ] && break
    meas=$(( meas * 99 / 100 / (2 * cp) * (2 * cp) ))
    read -r peak loss tps <<< "$(measure "$cp" "$meas")"
  done
  fits=$(python3 -c "import math; print('yes' if $peak <= $cap_mib*2**20 and math.isfinite($loss) else 'NO')")
  printf "| %d | %d | %d | %.3f | %.1f MiB (%s) | %.3f | %.0f |\n" "$cp" "$pred" "$meas" \
    "$(python3 -c "print($meas/$pred)")" "$(python3 -c "print($peak/2**20)")" "$fits" "$loss" "$tps"
done
