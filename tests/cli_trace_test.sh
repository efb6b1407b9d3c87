#!/bin/sh
# `ulysses attention --trace` and `ulysses train --trace` on 2 ranks: each writes a Chrome trace
# that parses, with one track per rank and the named events of the run.
# Usage: cli_trace_test.sh ULYSSES MPIEXEC "FLAGS"
set -eu
cli=$1 mpiexec=$2 flags=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck disable=SC2086
"$mpiexec" -n 2 $flags "$cli" attention --seq 64 --heads 4 --head-dim 8 --causal --backward --strategy p2p \
  --no-zigzag --trace "$dir/attention.json" > /dev/null
# shellcheck disable=SC2086
"$mpiexec" -n 2 $flags "$cli" train --steps 2 --seq 64 --batch 1 --eval-batches 1 --trace "$dir/train.json" > /dev/null
python3 - "$dir/attention.json" "$dir/train.json" <<'PY'
import json, sys
for path, wanted in ((sys.argv[1], {"forward p2p", "backward p2p", "fwd step 2/2", "p2p_kv"}),
                     (sys.argv[2], {"train step 1", "train step 2", "grad_allreduce", "deal", "ranks 0-1.seq_to_head",
                                   "idle: the other ranks' sequences and the all-reduce"})):
    events = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == {0, 1}, path
    for rank in (0, 1):
        names = {e["name"] for e in events if e["pid"] == rank}
        assert wanted <= names, (path, rank, wanted - names)
print("traces OK")
PY
