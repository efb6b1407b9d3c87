#!/usr/bin/env bash
# cmake --install into a scratch prefix, build examples/minimal against it with
# find_package(ulysses), and run it on 2 ranks.
# usage: install_test.sh BUILD_DIR EXAMPLE_SOURCE_DIR MPIEXEC "MPIEXEC_FLAGS"
set -eu
build=$1 example=$2 mpiexec=$3 flags=$4
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" > "$scratch/install.log"
test -f "$scratch/prefix/include/ulysses/cp/context_parallel.hpp"
cmake -S "$example" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release > "$scratch/configure.log"
cmake --build "$scratch/build" -j 2 > "$scratch/build.log"
"$mpiexec" -n 2 $flags "$scratch/build/minimal"
