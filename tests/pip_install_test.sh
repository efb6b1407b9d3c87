#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment (Debian's torch, numpy and mpi4py seen
# through --system-site-packages; scikit-build-core and pybind11 come from PyPI in pip's
# isolated build), then ContextParallelAttention from the installed package on 2 ranks, and the
# stubs and py.typed beside it.
# usage: pip_install_test.sh SOURCE_DIR PYTHON MPIEXEC "MPIEXEC_FLAGS"
set -eu
src=$1 python=$2 mpiexec=$3 flags=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv --system-site-packages "$scratch/venv"
# Unoptimised (-O0, no build type's flags): this checks the package, not the kernels' speed, and
# the library compiles 4x faster; the optimised build is what the rest of the suite runs.
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check --config-settings=build-dir="$scratch/build" \
  --config-settings=cmake.build-type=None --config-settings=cmake.define.ULYSSES_OPT=-O0 "$src" \
  > "$scratch/pip.log" 2>&1 || { tail -30 "$scratch/pip.log"; exit 1; }
cd "$scratch"  # not the source tree: import the installed package
"$mpiexec" -n 2 $flags "$scratch/venv/bin/python" -c '
from mpi4py import MPI
import torch, ulysses, ulysses.torch as ut
comm = ulysses.Communicator(MPI.COMM_WORLD)
assert "site-packages" in ulysses.__file__, ulysses.__file__
import importlib.metadata
assert ulysses.__version__ == importlib.metadata.version("ulysses"), (ulysses.__version__, importlib.metadata.version("ulysses"))
import pathlib  # the type information ships in the wheel (PEP 561)
assert all((pathlib.Path(ulysses.__file__).parent / f).is_file() for f in ("py.typed", "_ulysses.pyi")), ulysses.__file__
torch.manual_seed(0)
x = torch.randn(1, 8 * comm.size, 2 * comm.size, 16)
out = ulysses.unshard(ut.ContextParallelAttention(comm, "a2a")(*(ulysses.shard(x, comm),) * 3), comm)
w = torch.einsum("bqhd,bkhd->bhqk", x.double(), x.double()).mul(0.25).softmax(-1)
err = (out.double() - torch.einsum("bhqk,bkhd->bqhd", w, x.double())).norm().item()
assert err < 1e-4, err
if comm.rank == 0: print("installed package OK:", ulysses.__file__)
'
