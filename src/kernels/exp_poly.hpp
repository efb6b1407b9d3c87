// The polynomial of the kernels' exp: e^r ≈ 1 + r + r²·P(r) for |r| <= ln2/2, degree 6 (the
// constants of Cephes' expf), written once for the scalar exp of the portable level
// (engine_blas.cpp) and the vector one of every SIMD level (simd_engine.hpp), so that they
// compute the same arithmetic. T is float or a GCC vector of floats. Internal linkage: each
// instruction set's object keeps its own copy and defines no weak symbol
// (tests/isa_symbols_test.sh).
#pragma once

namespace ulysses::kernels {
namespace {

template <class T>
inline T exp_poly(T r) {
  T p = T{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + (r + 1.0f);
}

}  // namespace
}  // namespace ulysses::kernels
