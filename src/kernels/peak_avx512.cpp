// The AVX-512 probe loops (peak_loops.hpp); compiled with the AVX-512 flags and -mavx512bf16.
#include <immintrin.h>

#include "peak_loops.hpp"

namespace ulysses::kernels::peak_loops {

namespace {
float lane0(__m512 v) {  // the checksum
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return lanes[0];
}
}  // namespace

float fma_avx512(std::int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c) * 1e-3f);
  const __m512 one = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(1e-7f);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], one, tiny);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return lane0(s);
}

float dpbf16_avx512(std::int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  // Pairs of 2^-10: each round adds 2^-19 per lane, far from overflow for any iters.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a80);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  return lane0(s);
}

}  // namespace ulysses::kernels::peak_loops
