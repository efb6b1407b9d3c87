// Re-selecting OpenBLAS's kernel core (blas_core.cpp; the public query is ulysses::blas_core()).
#pragma once

#include <string>

namespace ulysses::kernels {

// Makes OpenBLAS use the core `name` (one of its OPENBLAS_CORETYPE names) from now on and
// returns the core it then reports (unchanged where OpenBLAS was built for one core only).
// Only while no GEMM runs: at load, and in tests.
std::string reselect_blas_core(const char* name);

}  // namespace ulysses::kernels
