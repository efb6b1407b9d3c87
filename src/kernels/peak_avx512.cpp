// The AVX-512 probe loops (peak_loops.hpp); compiled with the AVX-512 flags and -mavx512bf16.
#include <immintrin.h>

#include "peak_chains.hpp"

namespace ulysses::kernels::peak_loops {

namespace {

constexpr auto add = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };

float lane0(__m512 v) {  // the checksum
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return lanes[0];
}

}  // namespace

float fma_avx512(std::int64_t iters) {
  const __m512 one = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(1e-7f);
  return lane0(run_chains<__m512>(
      iters, [](int c) { return _mm512_set1_ps(float(c) * 1e-3f); },
      [&](__m512 acc) { return _mm512_fmadd_ps(acc, one, tiny); }, add));
}

float dpbf16_avx512(std::int64_t iters) {
  // Pairs of 2^-10: each round adds 2^-19 per lane, far from overflow for any iters.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a80);
  return lane0(run_chains<__m512>(
      iters, [](int) { return _mm512_setzero_ps(); }, [&](__m512 acc) { return _mm512_dpbf16_ps(acc, a, a); }, add));
}

}  // namespace ulysses::kernels::peak_loops
