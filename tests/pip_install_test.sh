#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment (Debian's torch, numpy and mpi4py seen
# through --system-site-packages; scikit-build-core and pybind11 come from PyPI in pip's
# isolated build), then ContextParallelAttention from the installed package on 2 ranks, and the
# stubs and py.typed beside it.
# usage: pip_install_test.sh SOURCE_DIR PYTHON MPIEXEC "MPIEXEC_FLAGS" CXX
set -eu
src=$1 python=$2 mpiexec=$3 flags=$4 cxx=$5
scratch=$(mktemp -d)
# The wheel builds with pyproject.toml's own flags (what a user's `pip install .` builds), through
# ccache as scripts/setup's build/ does (scripts/ccache_env: paths relative to the checkout), with
# the compiler of this tree (ccache hashes its name: scikit-build-core would pick g++ where CMake
# picked c++), in a tree beside build/ at the same depth. The library's compile commands are then
# the release tree's word for word, and its objects come from the cache that build filled: only
# the module's two sources compile (pybind11 comes from pip's isolated environment, a new path
# each time). Measured on 2 cores: 155 CPU-s at -O0 without the cache, 46 with it.
build=$(mktemp -d "$src/build-pip.XXXXXX")
trap 'rm -rf "$scratch" "$build"' EXIT
settings=(--config-settings=build-dir="$build")
if command -v ccache > /dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1 CXX=$cxx
else  # no cache to reuse: unoptimised (-O0), the library compiles 4x faster than at -O3
  settings+=(--config-settings=cmake.build-type=None --config-settings=cmake.define.ULYSSES_OPT=-O0)
fi
"$python" -m venv --system-site-packages "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check "${settings[@]}" "$src" \
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
