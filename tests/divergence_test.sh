#!/usr/bin/env bash
# Ranks launched with different arguments (mpirun's MPMD `A : B`): for every option of every
# subcommand, as the binary lists them (ULYSSES_PRINT_OPTIONS, so a new option is covered
# without editing this test), rank 1 alone gets a changed value. Every such job must end
# within seconds, non-zero, with no crash signal, one error naming the option, and nothing
# written; an option listed as per-rank must run to the end instead.
# usage: divergence_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS"
set -u
bin=$1 mpiexec=$2 flags=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0 jobs=0
head -c 200 /dev/zero | tr '\0' a > "$dir/input.txt"  # enough for one 64-token sequence
mkdir "$dir/input.dir" "$dir/work"
# A tiny checkpoint for generate's base arguments.
timeout 60 "$mpiexec" $flags -n 1 "$bin" train --steps 1 --seq 64 --batch 1 --layers 1 --width 16 --heads 2 \
  --kv-heads 2 --head-dim 8 --save "$dir/ck" > "$dir/ck.log" 2>&1 || { echo "FAIL: cannot train"; cat "$dir/ck.log"; exit 1; }

declare -A base=(
  [attention]="--seq 32 --heads 2 --head-dim 8"
  [train]="--steps 1 --seq 64 --batch 1 --layers 1 --width 16 --heads 2 --kv-heads 2 --head-dim 8 --eval-batches 1"
  [plan]="--seq 1024 --heads 8"
  [generate]="--checkpoint $dir/ck --prompt-tokens 64 --max-new-tokens 2"
)

# changed KIND: what rank 1 alone is given for an option of that kind.
changed() {
  case $1 in
    flag) echo "" ;;
    file) echo "$dir/input.txt" ;;
    dir) echo "$dir/input.dir" ;;
    *) echo 3 ;;  # a value no default has: parsed or refused by the parser, it differs
  esac
}

# check ID CMD NAME KIND AGREEMENT: one 2-rank job, its verdict in $dir/fail.ID (absent: passed).
check() {
  local id=$1 cmd=$2 name=$3 kind=$4 agreement=$5 value work="$dir/work.$1" log="$dir/log.$1"
  value=$(changed "$kind")
  mkdir "$work"
  # shellcheck disable=SC2086  # the base arguments are words
  (cd "$work" && timeout "${ULYSSES_HANG_S:-300}" "$mpiexec" $flags -n 1 "$bin" "$cmd" ${base[$cmd]} : \
                                        -n 1 "$bin" "$cmd" ${base[$cmd]} "$name" $value) < /dev/null > "$log" 2>&1
  local rc=$? what="$cmd $name${value:+ $value} on rank 1" errors
  errors=$(grep -c "^ulysses: error:" "$log")
  if [ "$agreement" = per-rank ]; then
    [ $rc -eq 0 ] || { echo "FAIL: $what (per-rank): exit $rc"; cat "$log"; } > "$dir/fail.$id"
  elif [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -gt 128 ] || grep -qiE "signal|segmentation|core dumped" "$log"; then
    { echo "FAIL: $what: exit $rc"; cat "$log"; } > "$dir/fail.$id"
  elif [ "$errors" -ne 1 ] || ! grep "^ulysses: error:" "$log" | grep -qF -- "$name"; then
    { echo "FAIL: $what: not one error naming $name"; cat "$log"; } > "$dir/fail.$id"
  elif [ -n "$(ls -A "$work")" ]; then
    echo "FAIL: $what: wrote $(ls -A "$work")" > "$dir/fail.$id"
  else
    echo "ok: $what: $(grep "^ulysses: error:" "$log" | cut -c1-160)" > "$dir/pass.$id"
  fi
}

# Jobs four at a time: most of a job's time is mpirun noticing a non-zero exit.
for cmd in attention train plan generate; do
  ULYSSES_PRINT_OPTIONS=$cmd "$bin" > "$dir/options.$cmd" || { echo "FAIL: $cmd: cannot list its options"; exit 1; }
  [ -s "$dir/options.$cmd" ] || { echo "FAIL: $cmd lists no options"; exit 1; }
  while read -r name kind agreement; do
    jobs=$((jobs + 1))
    check "$jobs" "$cmd" "$name" "$kind" "$agreement" &
    while [ "$(jobs -r | wc -l)" -ge 4 ]; do wait -n; done
  done < "$dir/options.$cmd"
done
wait
for f in $(ls "$dir" | grep '^pass\.' | sort -t. -k2 -n); do cat "$dir/$f"; done
for f in "$dir"/fail.*; do [ -e "$f" ] && { cat "$f"; fails=$((fails + 1)); }; done
mkdir -p "$dir/work"

# The messages users see, word for word.
(cd "$dir/work" && timeout "${ULYSSES_HANG_S:-300}" "$mpiexec" $flags -n 1 "$bin" attention --seq 4096 --heads 2 --head-dim 8 : \
                                       -n 1 "$bin" attention --seq 2048 --heads 2 --head-dim 8) > "$dir/log" 2>&1
grep -qF "ulysses: error: ranks were given different --seq: rank 0 has 4096, rank 1 has 2048" "$dir/log" ||
  { echo "FAIL: different --seq message"; cat "$dir/log"; fails=$((fails + 1)); }
# Two paths to the same contents agree; different contents do not, whatever the paths.
cp "$dir/input.txt" "$dir/copy.txt"
t=(train --steps 1 --seq 64 --batch 1 --layers 1 --width 16 --heads 2 --kv-heads 2 --head-dim 8 --eval-batches 1 --holdout 0.5)
(cd "$dir/work" && timeout "${ULYSSES_HANG_S:-300}" "$mpiexec" $flags -n 1 "$bin" "${t[@]}" --data "$dir/input.txt" : \
                                       -n 1 "$bin" "${t[@]}" --data "$dir/copy.txt") > "$dir/log" 2>&1 ||
  { echo "FAIL: copies of one --data file"; cat "$dir/log"; fails=$((fails + 1)); }
head -c 200 /dev/zero | tr '\0' b > "$dir/copy.txt"
(cd "$dir/work" && timeout "${ULYSSES_HANG_S:-300}" "$mpiexec" $flags -n 1 "$bin" "${t[@]}" --data "$dir/input.txt" : \
                                       -n 1 "$bin" "${t[@]}" --data "$dir/input.txt" --data "$dir/copy.txt") > "$dir/log" 2>&1
grep -qF "ranks were given different --data: rank 0 has $dir/input.txt (200 bytes" "$dir/log" ||
  { echo "FAIL: different --data contents"; cat "$dir/log"; fails=$((fails + 1)); }

echo "divergence: $jobs options changed on one rank, $fails failure(s)"
[ $fails -eq 0 ] && echo "divergence OK"
exit $((fails > 0))
