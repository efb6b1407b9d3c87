#!/usr/bin/env bash
# python/tests_hf (ulysses.hf with Hugging Face transformers) under mpiexec with N ranks, run by a
# Python that has torch >= 2 and transformers: a virtual environment beside Debian's interpreter
# (whose torch 1.13 serves the rest of the suite). Without one the test is skipped (exit 77),
# except in CI (CI=true), where it fails: these tests never skip silently there.
# usage: hf_test.sh <source dir> <python> <ranks> <mpiexec> [mpiexec flags…]
set -euo pipefail
src=$1 py=$2 ranks=$3 mpiexec=$4
shift 4
check='import sys, torch, transformers
major = int(torch.__version__.split(".")[0])
sys.exit(f"torch {torch.__version__} is older than 2") if major < 2 else print(torch.__version__, transformers.__version__)'
if ! versions=$("$py" -c "$check" 2>&1); then
  why="no torch >= 2 with transformers in $py: ${versions##*$'\n'}"
  if [ "${CI:-}" = true ]; then
    echo "FAIL (CI=true): $why. Make the environment (scripts/torch_venv) or configure -DULYSSES_TORCH_PYTHON=…"
    exit 1
  fi
  echo "SKIPPED: $why (scripts/torch_venv makes one; -DULYSSES_TORCH_PYTHON=… points to another)"
  exit 77
fi
echo "torch, transformers: $versions"
exec "$mpiexec" -n "$ranks" "$@" "$py" -m pytest -q --color=no -p no:cacheprovider "$src/python/tests_hf"
