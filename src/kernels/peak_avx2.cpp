// The AVX2 FMA probe loop (peak_loops.hpp); compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "peak_chains.hpp"

namespace ulysses::kernels::peak_loops {

float fma_avx2(std::int64_t iters) {
  // x · 1 + tiny: the values stay normal and bounded for any iters.
  const __m256 one = _mm256_set1_ps(1.0f), tiny = _mm256_set1_ps(1e-7f);
  const __m256 s = run_chains<__m256>(
      iters, [](int c) { return _mm256_set1_ps(float(c) * 1e-3f); },
      [&](__m256 acc) { return _mm256_fmadd_ps(acc, one, tiny); },
      [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
  return _mm256_cvtss_f32(s);
}

}  // namespace ulysses::kernels::peak_loops
