// The AVX2 FMA probe loop (peak_loops.hpp); compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "peak_loops.hpp"

namespace ulysses::kernels::peak_loops {

float fma_avx2(std::int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(float(c) * 1e-3f);
  // x · 1 + tiny: the values stay normal and bounded for any iters.
  const __m256 one = _mm256_set1_ps(1.0f), tiny = _mm256_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], one, tiny);
  __m256 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
  return _mm256_cvtss_f32(s);
}

}  // namespace ulysses::kernels::peak_loops
