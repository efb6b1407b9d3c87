// The polynomial of the kernels' exp: e^r ≈ 1 + r·P(r) for |r| <= ln2/2, degree 6, by Horner's
// rule (a minimax fit of the relative error, 2.0e-9; 0.9 ulp evaluated with FMAs, 1.2 without).
// Six multiply-adds, where Cephes' r + r²·P(r) form costs eight operations: on Intel cores the
// exp's operation count is the softmax's cost (simd_engine.hpp). The constant term is exactly
// 1, so e^0 is exactly 1. Written once for the scalar exp of the portable level
// (engine_blas.cpp) and the vector one of every SIMD level, so that they compute the same
// arithmetic. T is float or a GCC vector of floats. Internal linkage: each instruction set's
// object keeps its own copy and defines no weak symbol (tests/isa_symbols_test.sh).
#pragma once

namespace ulysses::kernels {
namespace {

template <class T>
inline T exp_poly(const T& r) {
  T p = T{} + 1.3843643246e-3f;
  p = p * r + 8.3741554990e-3f;
  p = p * r + 4.1668001562e-2f;
  p = p * r + 1.6666431725e-1f;
  p = p * r + 4.9999994040e-1f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

}  // namespace
}  // namespace ulysses::kernels
