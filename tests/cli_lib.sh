# Shared by the CLI test scripts (sourced with their arguments): the arguments, a scratch
# directory $dir, run / ok / bad, and the checks of a refusal (expect, no_file). The caller
# sets its own EXIT trap (it owns $dir).
# arguments: ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
set -u
bin=$1 mpiexec=$2 flags=$3 tool=$4
dir=$(mktemp -d)
fails=0
# A run that has not ended after ULYSSES_HANG_S seconds (default 300) is hung. The deadline
# detects hangs, not slowness: a machine busy with other work must not fail a test.
hang_s=${ULYSSES_HANG_S:-300}
run() { local n=$1; shift; timeout "$hang_s" "$mpiexec" -n "$n" $flags "$bin" "$@"; }
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
# expect NAME NP MESSAGE ARGS...: a non-zero exit (not a hang), MESSAGE in the output.
expect() {
  local name=$1 n=$2 msg=$3; shift 3
  local start=$SECONDS
  run "$n" "$@" > "$dir/err.log" 2>&1
  local rc=$? took=$((SECONDS - start))
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "$name: exit code $rc after $took s"; cat "$dir/err.log"; return 1; fi
  if ! grep -qF -- "$msg" "$dir/err.log"; then bad "$name: message '$msg' missing"; cat "$dir/err.log"; return 1; fi
  ok "$name ($took s, rc $rc)"
}
# no_file PATH NAME: neither PATH nor a temp file of its writer was left behind.
no_file() { if [ -e "$1" ] || ls "$1".tmp.* > /dev/null 2>&1; then bad "$2: $1 was written"; else ok "$2: nothing written"; fi; }
