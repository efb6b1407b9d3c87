#!/usr/bin/env bash
# The CLI on the local backend (--comm local --ranks N: ranks as threads of one process, no
# mpirun) against the same run under mpirun -n N: the same outputs to the byte (where no sum
# depends on the backend's reduction order), the same bytes sent by every rank, and each misuse
# of --comm / --ranks one clear error with nothing written.
# usage: cli_local_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'rm -rf "$dir"' EXIT

shape=(--batch 2 --seq 90 --heads 4 --kv-heads 2 --head-dim 16 --causal --backward --check)
# outputs PREFIX: the --out/--dq/--dk/--dv arguments writing PREFIX.{out,dq,dk,dv}.npy.
outputs() { for t in out dq dk dv; do echo "--$t" "$1.$t.npy"; done; }
# sent LOG: the bytes every rank sent, per operation, and the formula's (peak memory is the process's).
sent() { grep -E '^  rank [0-9]+:' "$1" | sed 's/; peak memory.*//'; }

# compare NAME EXACT ARGS...: 4 MPI processes against 4 rank threads. EXACT: outputs byte for
# byte; otherwise within float32 rounding (all_gather's reduce-scatter adds dK/dV in the
# backend's order).
compare() {
  local name=$1 exact=$2; shift 2
  local m="$dir/mpi" l="$dir/local"
  # shellcheck disable=SC2046  # outputs prints words
  if ! run 4 attention "${shape[@]}" "$@" $(outputs "$m") > "$m.log" 2>&1; then bad "$name: mpirun -n 4"; cat "$m.log"; return; fi
  # shellcheck disable=SC2046
  if ! timeout "${ULYSSES_HANG_S:-300}" "$bin" attention --comm local --ranks 4 "${shape[@]}" "$@" $(outputs "$l") > "$l.log" 2>&1; then
    bad "$name: --comm local --ranks 4"; cat "$l.log"; return
  fi
  grep -q "cp = 4 ranks" "$l.log" || { bad "$name: the local run is not 4 ranks"; cat "$l.log"; return; }
  if [ "$(sent "$m.log")" != "$(sent "$l.log")" ] || [ -z "$(sent "$l.log")" ]; then
    bad "$name: bytes sent differ"; diff <(sent "$m.log") <(sent "$l.log"); return
  fi
  for t in out dq dk dv; do
    if [ "$exact" = exact ]; then
      cmp -s "$m.$t.npy" "$l.$t.npy" || { bad "$name: $t differs"; return; }
    else
      "$tool" diff "$m.$t.npy" "$l.$t.npy" 1e-6 > /dev/null || { bad "$name: $t differs beyond rounding"; return; }
    fi
  done
  ok "$name: local == mpirun -n 4 ($exact)"
}
compare "a2a" exact --strategy a2a
compare "p2p" exact --strategy p2p
compare "a2a+p2p 2,2" exact --strategy a2a+p2p --cp-sizes 2,2
compare "all_gather" close --strategy all_gather

# Misuse: a clear error on every rank (one line), non-zero, nothing written.
misuse() {
  local name=$1 n=$2 msg=$3; shift 3
  rm -f "$dir/never.npy"
  expect "$name" "$n" "$msg" attention --seq 32 --heads 4 --head-dim 8 "$@" --out "$dir/never.npy" || return
  [ "$(grep -cF -- "$msg" "$dir/err.log")" -eq 1 ] || { bad "$name: said more than once"; cat "$dir/err.log"; }
  no_file "$dir/never.npy" "$name"
}
misuse "--ranks 0" 1 "--ranks" --comm local --ranks 0
misuse "--ranks absurd" 1 "--ranks" --comm local --ranks 100000
misuse "--ranks without --comm local" 1 "--ranks 4 needs --comm local" --ranks 4
misuse "unknown backend" 1 "--comm" --comm nccl
misuse "--comm local under mpirun -n 2" 2 "the launcher started 2 processes" --comm local --ranks 2

[ $fails -eq 0 ] && echo "cli local OK"
exit $fails
