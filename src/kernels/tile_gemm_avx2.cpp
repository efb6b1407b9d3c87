// Compiled with -mavx2 -mfma; called only when the CPU has both (see tile_gemm.cpp).
// Each micro-kernel keeps a 6×16 block of C in 12 ymm registers: per step of the inner
// dimension it loads 16 floats of B, broadcasts 6 floats of A and issues 12 FMAs. Templates on
// the row count MR make every loop over rows fully unrolled, so the accumulators never leave
// registers.
#include <immintrin.h>

#include <algorithm>

#include "tile_gemm.hpp"

namespace ulysses::kernels {

namespace {

constexpr std::int64_t kMR = 6, kNR = 16;

// The shared inner loop: c[r] += Σ_kk a[r·lda + kk] · b[kk·ldb + 0..16) for rows r < MR, the
// 6×16 block held in c0 (columns 0–7) and c1 (8–15).
template <int MR>
inline void fma_block(std::int64_t k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, __m256* c0,
                      __m256* c1) {
  for (std::int64_t kk = 0; kk < k; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * ldb), b1 = _mm256_loadu_ps(b + kk * ldb + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * lda + kk);
      c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
    }
  }
}

// S rows [0, MR) × panel columns [0, 16) = alpha · A[MR × k] · panel[k × 16].
template <int MR>
void qk_block(std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* panel, float* s,
              std::int64_t lds, std::int64_t nk) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  fma_block<MR>(k, a, lda, panel, kNR, c0, c1);
  const __m256 scale = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    const __m256 lo = _mm256_mul_ps(c0[r], scale), hi = _mm256_mul_ps(c1[r], scale);
    if (nk == kNR) {
      _mm256_storeu_ps(s + r * lds, lo);
      _mm256_storeu_ps(s + r * lds + 8, hi);
    } else {
      alignas(32) float tmp[16];
      _mm256_store_ps(tmp, lo);
      _mm256_store_ps(tmp + 8, hi);
      std::copy_n(tmp, nk, s + r * lds);
    }
  }
}

// O rows [0, MR) × columns [0, 16) += P[MR × k] · V[k × 16] (V rows ldv apart).
template <int MR>
void pv_block(std::int64_t k, const float* p, std::int64_t ldp, const float* v, std::int64_t ldv, float* o,
              std::int64_t ldo) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm256_loadu_ps(o + r * ldo);
    c1[r] = _mm256_loadu_ps(o + r * ldo + 8);
  }
  fma_block<MR>(k, p, ldp, v, ldv, c0, c1);
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(o + r * ldo, c0[r]);
    _mm256_storeu_ps(o + r * ldo + 8, c1[r]);
  }
}

}  // namespace

void qk_scores_avx2(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* q, std::int64_t ldq,
                    const float* pack, float* s, std::int64_t lds, std::int64_t diag) {
  const std::int64_t all_panels = (n + kNR - 1) / kNR;
  for (std::int64_t i0 = 0; i0 < m; i0 += kMR) {
    const std::int64_t mr = std::min(kMR, m - i0);
    // Panels this row block's last row can see (all of them without a causal diagonal).
    const std::int64_t seen = std::clamp<std::int64_t>(diag + i0 + mr, 0, n);
    const std::int64_t panels = std::min(all_panels, (seen + kNR - 1) / kNR);
    for (std::int64_t p = 0; p < panels; ++p) {
      const float* a = q + i0 * ldq;
      const float* panel = pack + p * k * kNR;
      float* out = s + i0 * lds + p * kNR;
      const std::int64_t nk = std::min(kNR, n - p * kNR);
      switch (mr) {
        case 6: qk_block<6>(k, alpha, a, ldq, panel, out, lds, nk); break;
        case 5: qk_block<5>(k, alpha, a, ldq, panel, out, lds, nk); break;
        case 4: qk_block<4>(k, alpha, a, ldq, panel, out, lds, nk); break;
        case 3: qk_block<3>(k, alpha, a, ldq, panel, out, lds, nk); break;
        case 2: qk_block<2>(k, alpha, a, ldq, panel, out, lds, nk); break;
        default: qk_block<1>(k, alpha, a, ldq, panel, out, lds, nk); break;
      }
    }
  }
}

void pv_accumulate_avx2(std::int64_t m, std::int64_t n, std::int64_t k, const float* p, std::int64_t ldp,
                        const float* v, std::int64_t ldv, float* o, std::int64_t ldo, std::int64_t diag) {
  const std::int64_t full = n / kNR * kNR, kall = k;
  for (std::int64_t i0 = 0; i0 < m; i0 += kMR) {
    const std::int64_t mr = std::min(kMR, m - i0);
    const std::int64_t k = std::clamp<std::int64_t>(diag + i0 + mr, 0, kall);  // later keys have P = 0
    const float* a = p + i0 * ldp;
    for (std::int64_t j0 = 0; j0 < full; j0 += kNR) {
      float* out = o + i0 * ldo + j0;
      switch (mr) {
        case 6: pv_block<6>(k, a, ldp, v + j0, ldv, out, ldo); break;
        case 5: pv_block<5>(k, a, ldp, v + j0, ldv, out, ldo); break;
        case 4: pv_block<4>(k, a, ldp, v + j0, ldv, out, ldo); break;
        case 3: pv_block<3>(k, a, ldp, v + j0, ldv, out, ldo); break;
        case 2: pv_block<2>(k, a, ldp, v + j0, ldv, out, ldo); break;
        default: pv_block<1>(k, a, ldp, v + j0, ldv, out, ldo); break;
      }
    }
    for (std::int64_t r = 0; r < mr; ++r)  // columns past the last full 16 (head dims like 8 or 24)
      for (std::int64_t kk = 0; kk < k; ++kk) {
        const float x = a[r * ldp + kk];
        for (std::int64_t j = full; j < n; ++j) o[(i0 + r) * ldo + j] += x * v[kk * ldv + j];
      }
  }
}

}  // namespace ulysses::kernels
