#!/usr/bin/env bash
# The time `ulysses plan` takes on a matrix of single configurations (large cp, windows, packed
# documents, cross-attention, modes, presets, --lengths, --train, --scaling): CPU seconds (user,
# sys) and elapsed per plan, each plan's output kept, so two binaries' runs can be compared
# (`diff -r OUT_A OUT_B`: a faster planner must print the same). A plan past CPU_LIMIT CPU
# seconds is stopped (rc 137 or 152). Nice it on a shared machine; CPU seconds, not elapsed.
# usage: bench/plan_timing.sh ULYSSES_BINARY OUT [CPU_LIMIT=30]    (START=N: from plan N)
set -u
bin=$1 out=$2 limit=${3:-30}
mkdir -p "$out"
H="--heads 32 --kv-heads 8"
S=131072
i=0
while IFS= read -r cfg; do
  [ -z "$cfg" ] && continue
  i=$((i + 1))
  n=$(printf %02d $i)
  [ "$i" -lt "${START:-1}" ] && continue
  echo "$cfg" > "$out/$n.cfg"
  # shellcheck disable=SC2086  # cfg is a list of flags
  /usr/bin/time -f "%U %S %e" -o "$out/$n.time" bash -c "ulimit -t $limit; exec $bin \"\$@\"" _ plan $cfg \
    > "$out/$n.out" 2>&1
  echo "rc=$?" >> "$out/$n.time"
  printf "%s %s | %s\n" "$n" "$(tr '\n' ' ' < "$out/$n.time")" "$cfg"
done <<CFGS
--seq $S $H --cp 8
--seq $S $H --cp 65536
--seq $S $H --cp 65536 --no-causal
--seq 1048576 $H --cp 65536
--seq $S $H --cp 65536 --window 64
--seq $S $H --cp 65536 --window 4096
--seq 1048576 $H --cp 65536 --window 4096
--seq 1048576 $H --cp 65536 --window 64,64 --no-causal
--seq $S $H --cp 4096 --window 4096
--seq 1048576 $H --cp 1024 --window 8192,8192 --no-causal
--seq $S $H --cp 65536 --docs 256x512
--seq 1048576 $H --cp 65536 --docs 256x4096
--seq 1048576 $H --cp 1024 --docs 256x4096
--seq 1048576 $H --cp 1024 --docs 256x4096 --window 1024
--seq $S $H --cp 4096 --docs 256x512 --window 256
--seq $S $H --cp 65536 --docs 256x512 --window 4096
--seq $S $H --cp 65536 --kv-seq 262144 --q-offset 131072
--seq $S $H --cp 65536 --mode decode
--seq $S $H --cp 65536 --mode prefill --cached 131072
--seq $S $H --cp 65536 --mode forward
--seq $S $H --cp 65536 --gpu H100
--seq $S $H --cp 65536 --gpu H100 --window 4096
--seq $S $H --cp 65536 --json $out/plan.json
--seq $S $H --cp 1024 --scaling
--train --heads 8 --kv-heads 2 --head-dim 64 --width 512 --layers 4 --max-memory 2GiB --cp 65536
--lengths 256x4096 --world 1024 --heads 32 --head-dim 128 --layers 32 --width 4096
--lengths pareto:256:256:131072:1.1:1 --world 1024 --heads 32 --head-dim 128 --layers 32 --width 4096
--lengths 256x512 --world 65536 --heads 32 --head-dim 128 --layers 32 --width 4096
--seq $S --heads 65536 --kv-heads 1024 --cp 65536
--seq $S --heads 65536 --kv-heads 1024 --cp 65536 --window 64
--seq $S --heads 65536 --kv-heads 1024 --cp 65536 --window 64,64 --no-causal
--seq 1048576 --heads 65536 --kv-heads 1024 --cp 65536 --window 4096
CFGS
