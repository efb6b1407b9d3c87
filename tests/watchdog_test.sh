#!/usr/bin/env bash
# The watchdog ends a hung job: one rank misses an operation, the others wait under a 2 s
# timeout; the job must end (non-zero) within timeout + a few seconds, and stderr must carry
# the watchdog's line naming the operation, the waiting rank, the peer or group and the step.
# usage: watchdog_test.sh WATCHDOG_HANG MPIEXEC "MPIEXEC_FLAGS"
set -u
bin=$1 mpiexec=$2 flags=$3
# The job's deadline: the timeout, MPI_Abort's teardown and slack for a machine busy with other
# work; without the watchdog the job would wait for the test's own timeout (60 s) or forever.
timeout_s=2 limit_s=30
fails=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# check NAME NP MODE REGEX...: the job ends in time, non-zero, and its output matches each REGEX
check() {
  local name=$1 np=$2 mode=$3; shift 3
  local t0=$(date +%s.%N)
  timeout 60 "$mpiexec" -n "$np" $flags "$bin" "$timeout_s" "$mode" > "$log" 2>&1
  local rc=$? t=$(echo "$(date +%s.%N) - $t0" | bc | xargs printf "%.1f")
  local ok=1
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL $name: exit $rc (want non-zero, not the test's timeout)"; ok=0; }
  (( $(echo "$t < $limit_s" | bc) )) || { echo "FAIL $name: took $t s (limit $limit_s s)"; ok=0; }
  for re in "$@"; do
    grep -Eq "$re" "$log" || { echo "FAIL $name: no line matching: $re"; ok=0; }
  done
  if [ $ok = 1 ]; then echo "PASS $name: exit $rc after $t s"; grep "ulysses watchdog" "$log" | head -2
  else fails=$((fails + 1)); cat "$log"; fi
}

check "skipped all-reduce, 3 ranks" 3 collective \
  "ulysses watchdog: rank [01] of 3 \(world rank [01], host [^)]+\) waited 2 s \(the timeout\) for allreduce 'loss_sum' on the group of 3 ranks \(world ranks 0,1,2\), during test step 3; ending the job"
check "missing message, 2 ranks" 2 recv \
  "ulysses watchdog: rank 0 of 2 \(world rank 0, host [^)]+\) waited 2 s \(the timeout\) for the receive from rank 1 \(world rank 1\) \(tag 5, 64 bytes\), during test step 3"
check "skipped nonblocking all-to-all, 3 ranks" 3 ialltoallv \
  "ulysses watchdog: rank [01] of 3 \(world rank [01], host [^)]+\) waited 2 s \(the timeout\) for alltoallv 'seq_to_head' on the group of 3 ranks \(world ranks 0,1,2\), during test step 3"
exit $fails
