# What the two device checks (run1.sh, run2.sh) share; each sources it. The bundle's binaries
# run with OpenMPI and OpenBLAS relocated under /opt/ub, and python3 as /tmp/py, outside that
# library path (torch must not load the bundle's libraries).

# Unpacks .devb/bundle.tgz and sets the environment its binaries run in.
carried_env() {
  tar -xzf .devb/bundle.tgz -C /
  ln -sfn orterun /opt/ub/usr/bin/mpirun
  export LD_LIBRARY_PATH=/opt/ub/lib OPAL_PREFIX=/opt/ub/usr PATH=/opt/ub/usr/bin:$PATH
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
  printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH python3 "$@"\n' > /tmp/py && chmod +x /tmp/py
}

# train_json NAME SECONDS CMD...: runs CMD for at most SECONDS (stdout to /tmp/tr.out, stderr to
# /tmp/tr.err) and prints one JSON line: its name, exit code, wall seconds and result (a torch
# run's last line; a ulysses run's log, /tmp/tr.log, summarised).
train_json() {
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > /tmp/tr.out 2> /tmp/tr.err; local rc=$?
  if [[ $name == torch* ]]; then r=$(tail -1 /tmp/tr.out); else
    r=$(/tmp/py - /tmp/tr.log <<'PY'
import json, statistics, sys
st = [json.loads(l) for l in open(sys.argv[1])]
print(json.dumps({"tokens_per_s": statistics.median([x["tokens_per_s"] for x in st[1:]] or [st[0]["tokens_per_s"]]),
                  "peak_rss_mib": max(x["peak_rss_bytes"] for x in st) / 2**20, "losses": [x["loss"] for x in st]}))
PY
); fi
  echo "{\"run\": \"$name\", \"rc\": $rc, \"wall\": $(( $(date +%s) - s )), \"r\": ${r:-null}}"
}
