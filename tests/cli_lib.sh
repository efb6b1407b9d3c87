# Shared by the CLI test scripts (sourced with their arguments): the arguments, a scratch
# directory $dir, and run / ok / bad. The caller sets its own EXIT trap (it owns $dir).
# arguments: ULYSSES_BINARY MPIEXEC "MPIEXEC_FLAGS" NPY_TOOL
set -u
bin=$1 mpiexec=$2 flags=$3 tool=$4
dir=$(mktemp -d)
fails=0
run() { local n=$1; shift; timeout 60 "$mpiexec" -n "$n" $flags "$bin" "$@"; }
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
