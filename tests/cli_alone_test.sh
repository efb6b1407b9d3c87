#!/usr/bin/env bash
# A process started without mpirun starts MPI only for a command that makes an MPI communicator:
# never for --version, --help, a parse error, a plan without --calibrate or --comm local; for
# attention --comm mpi (a world of one, the same output as --comm local's) and plan --calibrate.
# Observed through the process Open MPI's singleton start spawns (its orted), under strace:
# skipped (exit 77) where strace cannot trace or this MPI spawns nothing to see.
# usage: cli_alone_test.sh ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
source "$(dirname "$0")/cli_lib.sh" "$@"
trap 'rm -rf "$dir"' EXIT
# The launchers' variables (started_by_mpi_launcher), in case ctest itself runs under one.
unset OMPI_COMM_WORLD_SIZE PMIX_RANK PMI_RANK PMI_SIZE PMI_FD PMI_PORT MV2_COMM_WORLD_RANK SLURM_PROCID FLUX_TASK_RANK PALS_RANKID ALPS_APP_PE

# spawned ARGS...: runs the binary alone under strace; prints the programs it started besides
# itself, one a line ("" when none). The exit status is the command's.
spawned() {
  strace -f -qq -e trace=execve -o "$dir/trace" timeout "$hang_s" "$bin" "$@" > "$dir/cmd.log" 2>&1
  local rc=$?
  grep -o 'execve("[^"]*"' "$dir/trace" | sed 's/execve("//; s/"$//' | grep -v -e '/timeout$' -e "^$bin\$" -e '^timeout$'
  return $rc
}

shape=(--seq 96 --heads 4 --head-dim 16 --causal --backward)
if ! strace -f -qq -e trace=execve -o /dev/null true 2> /dev/null; then echo "SKIP: strace cannot trace here"; exit 77; fi
started=$(spawned attention "${shape[@]}" --out "$dir/mpi.npy")
rc=$?
[ $rc -eq 0 ] || { bad "attention --comm mpi alone: exit $rc"; cat "$dir/cmd.log"; }
grep -q "cp = 1 ranks" "$dir/cmd.log" || { bad "attention --comm mpi alone: not one rank"; cat "$dir/cmd.log"; }
timeout "$hang_s" "$bin" attention --comm local "${shape[@]}" --out "$dir/local.npy" > /dev/null 2>&1
if cmp -s "$dir/mpi.npy" "$dir/local.npy"; then ok "attention --comm mpi alone: the output of --comm local"
else bad "attention --comm mpi alone: its output differs from --comm local's"; fi
if [ -z "$started" ]; then echo "SKIP: this MPI's start spawns no process to observe"; exit $((fails ? 1 : 77)); fi
ok "attention --comm mpi alone started MPI (spawned $(echo "$started" | tr '\n' ' '))"

# none CODE ARGS...: the command exits CODE and starts no MPI.
none() {
  local code=$1; shift
  local s
  s=$(spawned "$@")
  local rc=$?
  if [ $rc -ne "$code" ]; then bad "$*: exit $rc, not $code"; cat "$dir/cmd.log"; return; fi
  if [ -n "$s" ]; then bad "$*: started MPI ($s)"; return; fi
  ok "$*: no MPI"
}
none 0 --version
none 0 plan --help
none 0 plan --seq 4096 --cp 8 --heads 32
none 0 plan --lengths pareto:256:64:65536:1.5 --heads 8 --world 16
none 0 plan --train --cp 8 --heads 8 --layers 2
none 2 plan --seq 4096 --cp 3 --heads 32 --cp-comm-type a2a
none 109 plan --no-such-flag
none 2 plan --grid quick
none 0 attention --comm local "${shape[@]}"

started=$(spawned plan --calibrate --seq 256 --heads 4 --head-dim 16)
rc=$?
if [ $rc -eq 0 ] && [ -n "$started" ]; then ok "plan --calibrate alone started MPI"
else bad "plan --calibrate alone: exit $rc, spawned '$started'"; cat "$dir/cmd.log"; fi

[ "$fails" -eq 0 ] && echo "cli alone OK"
exit $((fails ? 1 : 0))
