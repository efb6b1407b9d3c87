#!/usr/bin/env bash
# Faults injected into real runs of the CLI, each checked for a bounded, non-zero end with a
# clear message, and for what must survive it. Prints each teardown time ("teardown: X s").
# usage: fault_test.sh SOURCE_DIR ULYSSES_BIN WHERE CASE
#   WHERE  local: 4 ranks on this host | cluster: 2 hosts x 2 ranks (scripts/cluster, root)
#   CASE   strategies    every strategy against the float64 reference, bytes = formula
#          kill-forward  SIGKILL of one rank in the middle of an attention forward
#          kill-train    SIGKILL of one rank mid-training; --resume from the last checkpoint
#                        then reproduces the uninterrupted run bit for bit (losses, checkpoint)
#          disk-full     a checkpoint that does not fit: error naming the file, old one intact
#          link-down     (cluster) host h2's link goes down mid-run: mpirun's keepalive ends the job
#          link-down-watchdog  the same with the keepalive off: the ranks' watchdogs end it
#          calibrate     (cluster) plan --calibrate fits 2 ranks per host, the inter-host link point
#                        to point and with every rank sending across, and measures every strategy
set -u
src=$1 bin=$2 where=$3 case=$4
comm=$(basename "$(readlink -f "$bin")" | cut -c1-15)  # the ranks' process name
cluster="$src/scripts/cluster"
dir=$(mktemp -d)
fails=0
job=
# A launcher still running is stopped with SIGTERM (mpirun then ends its ranks; SIGKILL would
# orphan them); the cluster's namespaces, and all that runs inside, are deleted.
stop_job() {
  [ -n "$job" ] && kill -0 "$job" 2> /dev/null || return 0
  kill "$job"; sleep 3; kill -9 "$job" 2> /dev/null || true
}
cleanup() {
  stop_job
  [ "$where" = cluster ] && "$cluster" down
  rm -rf "$dir"
}
trap cleanup EXIT
source "$src/scripts/mpi_env"
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; fails=$((fails + 1)); }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc | xargs printf "%.1f"; }

# launch LOG ARGS...: the CLI on 4 ranks in the background (mpirun options from $map); $job
# is the launcher's pid.
map=()
launch() {
  local log=$1; shift
  if [ "$where" = cluster ]; then "$cluster" run 2 "${map[@]}" "$bin" "$@" > "$log" 2>&1 &
  else "${MPIRUN[@]}" -n 4 "${map[@]}" "$bin" "$@" > "$log" 2>&1 & fi
  job=$!
}

# Every rank of a --json report sent exactly the bytes its formula predicts, per operation.
bytes_match() {
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
nonzero = lambda d: {k: v for k, v in d.items() if v}
sys.exit(0 if r and all(nonzero(x["bytes_sent"]) == nonzero(x["expected_bytes_sent"]) for x in r) else 1)' "$1"
}

# The pid of the highest rank (the last one started on the last host), to kill.
victim() {
  local p
  if [ "$where" = cluster ]; then
    for p in $(ip netns pids ulc-h2); do [ "$(cat /proc/$p/comm 2> /dev/null)" = "$comm" ] && echo "$p"; done | sort -n | tail -1
  else
    pgrep -P "$job" -x "$comm" | sort -n | tail -1
  fi
}

# wait_for FILE REGEX SECONDS: until a line of FILE matches (1 when it never does).
wait_for() {
  local t=0
  until grep -Eq "$2" "$1" 2> /dev/null; do
    sleep 0.2; t=$((t + 1))
    [ $t -lt $(($3 * 5)) ] || return 1
  done
}

# ends_within NAME SECONDS: waits for $job; fails unless it ended non-zero in time.
ends_within() {
  local t0=$(now) rc=0 n=0
  while kill -0 "$job" 2> /dev/null; do
    sleep 0.1; n=$((n + 1))
    if [ $n -gt $(($2 * 10)) ]; then fail "$1: still running after $2 s"; stop_job; return 1; fi
  done
  wait "$job" || rc=$?
  echo "teardown: $1: exit $rc after $(since "$t0") s"
  [ "$rc" -ne 0 ] || { fail "$1: exit 0"; return 1; }
}

strategies() {
  local args m
  # By slot, ranks 0-1 are on h1 and 2-3 on h2: a2a+p2p [2, 2] runs Ulysses inside each host
  # and the ring across; by node (0, 2 on h1) the other way round.
  # ([4,1] and [1,4] are a2a and p2p again; cli_test.sh runs them on one host.)
  for args in "a2a" "p2p" "all_gather" "a2a+p2p --cp-sizes 2,2" "a2a+p2p --cp-sizes 2,2 ~node"; do
    m=slot; [[ $args == *~node ]] && m=node
    map=(--map-by "$m")
    launch "$dir/s.log" attention --batch 2 --seq 256 --heads 8 --kv-heads 4 --head-dim 32 --causal --backward \
      --check --json "$dir/s.json" --strategy ${args%~node}
    if wait "$job" && grep -q "(tolerance .*) OK" "$dir/s.log" && bytes_match "$dir/s.json"; then
      pass "$where: --strategy $args (map by $m): float64 check OK, bytes = formula on every rank"
    else fail "$where: --strategy $args (map by $m)"; cat "$dir/s.log"; fi
  done
  map=()
}

calibrate() {
  launch "$dir/c.log" plan --calibrate --seq 512 --heads 4 --head-dim 16 --json "$dir/c.json"
  if wait "$job" && python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); i = j["input"]
ok = i["ranks_per_node"] == 2 and 0 < i["inter_concurrent_bandwidth"] <= 1.5 * i["inter_bandwidth"]
sys.exit(0 if ok and all(r["measured_step_s"] > 0 for r in j["strategies"] if r["valid"]) else 1)' "$dir/c.json"; then
    pass "$where: plan --calibrate: 2 ranks per host, inter-host link fitted alone and shared, every strategy measured"
  else fail "$where: plan --calibrate"; cat "$dir/c.log"; fi
}

kill_forward() {
  launch "$dir/f.log" attention --seq 2048 --heads 8 --head-dim 64 --repeat 500 --out "$dir/out.npy"
  wait_for "$dir/f.log" "^ulysses attention" 60 || { fail "kill-forward: never started"; cat "$dir/f.log"; return; }
  sleep 1
  kill -9 "$(victim)" || { fail "kill-forward: no rank to kill"; return; }
  ends_within "$where: SIGKILL of a rank mid-forward" 60 || cat "$dir/f.log"
  # mpirun names the first process it sees end: the killed one (signal 9), or a survivor on the
  # other host that wrote to the dead rank's socket first (SIGPIPE, 13), beside OpenMPI's "peer
  # process has unexpectedly disconnected" naming the dead rank's host. Which comes first is a
  # race between the two hosts' daemons; either tells the user what died.
  grep -q "exited on signal 9" "$dir/f.log" ||
    { grep -q "exited on signal 13" "$dir/f.log" && grep -q "unexpectedly disconnected" "$dir/f.log"; } ||
    { fail "kill-forward: mpirun did not name the dead rank"; cat "$dir/f.log"; }
  grep "exited on signal\|Peer host" "$dir/f.log"
  [ ! -e "$dir/out.npy" ] || fail "kill-forward: an output was written"
}

# train DIR LOG [ARGS]: the same small run every time.
train_args=(train --steps 24 --seq 1024 --batch 2 --layers 1 --width 32 --heads 4 --kv-heads 2 --head-dim 8 --hidden 64
            --warmup 2 --eval-batches 1 --threads 1)
# Each step's loss, once (a step logged twice, before a kill and after the resume, must agree).
losses() { grep -o '"step": [0-9]*, "loss": [-0-9.e]*' "$1" | sort -u | sort -t' ' -k2 -n; }

kill_train() {
  launch "$dir/a.out" "${train_args[@]}" --save "$dir/a" --save-every 8 --log "$dir/a.log"
  wait "$job" || { fail "kill-train: the uninterrupted run failed"; cat "$dir/a.out"; return; }
  launch "$dir/b.out" "${train_args[@]}" --save "$dir/b" --save-every 8 --log "$dir/b.log"
  # stdout is flushed every step (the log file is not): past the first checkpoint
  wait_for "$dir/b.out" 'step 10/24' 120 || { fail "kill-train: never reached step 10"; cat "$dir/b.out"; return; }
  kill -9 "$(victim)" || { fail "kill-train: no rank to kill"; return; }
  ends_within "$where: SIGKILL of a rank mid-training" 60 || cat "$dir/b.out"
  launch "$dir/c.out" "${train_args[@]}" --resume "$dir/b" --save "$dir/b" --save-every 8 --log "$dir/b.log"
  wait "$job" || { fail "kill-train: resume failed"; cat "$dir/c.out"; return; }
  grep "resumed from" "$dir/c.out"
  grep -q "resumed from .* at step \(8\|16\)$" "$dir/c.out" || fail "kill-train: did not resume from step 8 or 16"
  if diff <(losses "$dir/a.log") <(losses "$dir/b.log") > /dev/null && cmp -s "$dir/a/checkpoint.bin" "$dir/b/checkpoint.bin"
  then pass "$where: resumed run = uninterrupted run (24 losses, final checkpoint byte for byte)"
  else fail "kill-train: resumed run differs"; diff <(losses "$dir/a.log") <(losses "$dir/b.log"); fi
}

# A disk that holds one checkpoint and a half (a tmpfs in a private mount namespace): the
# step-4 checkpoint fits, the step-8 one cannot be written beside it. The run must stop
# non-zero naming the file, and the step-4 checkpoint must survive intact (it resumes).
disk_full() {
  "${MPIRUN[@]}" -n 2 "$bin" "${train_args[@]}" --steps 4 --save "$dir/probe" > "$dir/p.out" 2>&1 \
    || { fail "disk-full: probe run failed"; cat "$dir/p.out"; return; }
  local kb=$(( $(stat -c %s "$dir/probe/checkpoint.bin") * 3 / 2 / 1024 + 4 ))
  mkdir -p "$dir/disk"
  unshare -m bash -c '
    set -u; mount -t tmpfs -o size='"$kb"'k tmpfs "$1" || exit 99; shift
    d=$1; shift
    "$@" --steps 8 --save-every 4 --save "$d/ck" > "$d/../full.out" 2>&1; echo "rc=$?" >> "$d/../full.out"
    "$@" --steps 4 --resume "$d/ck" > "$d/../resume.out" 2>&1; echo "rc=$?" >> "$d/../resume.out"
  ' sh "$dir/disk" "$dir/disk" "${MPIRUN[@]}" -n 2 "$bin" "${train_args[@]}"
  [ $? -ne 99 ] || { echo "SKIPPED: disk-full: cannot mount a tmpfs here"; return; }
  cat "$dir/full.out" | grep -i "error"
  if grep -q "rc=0" "$dir/full.out" || ! grep -q "checkpoint" "$dir/full.out" || ! grep -qi "error" "$dir/full.out"; then
    fail "disk-full: the run did not stop with an error naming the checkpoint"; cat "$dir/full.out"
  else pass "disk-full: the step-8 save failed with an error naming the file, exit non-zero"; fi
  if grep -q "nothing to do: the run is already at step 4" "$dir/resume.out" && grep -q "rc=0" "$dir/resume.out"; then
    pass "disk-full: the step-4 checkpoint survived intact (it resumes)"
  else fail "disk-full: the step-4 checkpoint did not survive"; cat "$dir/resume.out"; fi
}

# link_down KEEPALIVE LIMIT REGEX: h2's link goes down mid-run; the job must end within LIMIT
# seconds, its output matching REGEX, and write nothing. With the runtime's keepalive on
# (2 s), mpirun notices the lost daemon first; with it off, the ranks' watchdogs fire.
link_down() {
  local name="h2's link down mid-run (keepalive $1 s, --timeout 8)"
  launch "$dir/l.log" attention --seq 2048 --heads 8 --head-dim 64 --repeat 500 --timeout 8 --out "$dir/out.npy"
  wait_for "$dir/l.log" "^ulysses attention" 60 || { fail "link-down: never started"; cat "$dir/l.log"; return; }
  sleep 2
  "$cluster" exec h2 ip link set dev eth0 down
  ends_within "$where: $name" "$2" || { cat "$dir/l.log"; return; }
  grep -E "$3" "$dir/l.log" | head -2
  grep -Eq "$3" "$dir/l.log" || { fail "$name: no line matching $3"; cat "$dir/l.log"; }
  [ ! -e "$dir/out.npy" ] || fail "$name: an output was written"
}

if [ "$where" = cluster ]; then
  if ! "$cluster" usable; then
    echo "SKIPPED: network namespaces are not usable here (needs root: ip netns, veth, unshare)"
    trap - EXIT; rm -rf "$dir"; exit 77
  fi
  "$cluster" up 2 > /dev/null || { echo "FAIL: cluster up"; exit 1; }
fi
case "$case" in
  strategies) strategies ;;
  calibrate) calibrate ;;
  kill-forward) kill_forward ;;
  kill-train) kill_train ;;
  disk-full) disk_full ;;
  link-down) export CLUSTER_KEEPALIVE=2; link_down 2 20 "ORTE has lost communication with a remote daemon" ;;
  link-down-watchdog) export CLUSTER_KEEPALIVE=0; link_down 0 30 "ulysses watchdog: rank . of 4 .* waited 8 s \(the timeout\) for" ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
exit $fails
