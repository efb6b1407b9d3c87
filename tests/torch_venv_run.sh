#!/usr/bin/env bash
# torch_venv_run.sh VENV COMMAND...: runs COMMAND (a torch >= 2 test) when the venv scripts/torch_venv
# makes is there. Missing, the test is skipped (exit 77) on a developer's machine, and FAILS in CI
# (CI=true): the tests of torch.distributed groups and of Hugging Face never silently vanish there.
venv=$1
shift
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch; assert int(torch.__version__.split('.')[0]) >= 2"; then
  if [ "${CI:-}" = true ]; then
    echo "FAILED: no torch >= 2 venv at $venv (scripts/torch_venv makes it; scripts/setup starts it); CI runs these tests"
    exit 1
  fi
  echo "SKIPPED: no torch >= 2 venv at $venv (scripts/torch_venv makes it)"
  exit 77
fi
exec "$@"
