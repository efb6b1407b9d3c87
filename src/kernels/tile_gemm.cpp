#include "tile_gemm.hpp"

#include "flash_common.hpp"
#include "vexp.hpp"

namespace ulysses::kernels {

std::int64_t packed_kt_size(std::int64_t n, std::int64_t k) { return (n + 15) / 16 * 16 * k; }

bool uses_packed_kt() { return active_isa() == Isa::avx2; }

void pack_kt(const float* kmat, std::int64_t ldk, std::int64_t n, std::int64_t k, float* packed) {
  for (std::int64_t p = 0; p < (n + 15) / 16; ++p) {
    float* dst = packed + p * 16 * k;
    for (std::int64_t j = 0; j < 16; ++j) {
      const bool real = p * 16 + j < n;
      const float* src = kmat + (p * 16 + j) * ldk;
      for (std::int64_t kk = 0; kk < k; ++kk) dst[kk * 16 + j] = real ? src[kk] : 0.0f;
    }
  }
}

void qk_scores(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* q, std::int64_t ldq,
               const float* kmat, std::int64_t ldk, const float* packed, float* s, std::int64_t lds,
               std::int64_t diag) {
  if (active_isa() == Isa::avx2) return qk_scores_avx2(m, n, k, alpha, q, ldq, packed, s, lds, diag);
  gemm(false, true, m, n, k, alpha, q, ldq, kmat, ldk, 0.0f, s, lds);
}

void pv_accumulate(std::int64_t m, std::int64_t n, std::int64_t k, const float* p, std::int64_t ldp, const float* v,
                   std::int64_t ldv, float* o, std::int64_t ldo, std::int64_t diag) {
  if (active_isa() == Isa::avx2) return pv_accumulate_avx2(m, n, k, p, ldp, v, ldv, o, ldo, diag);
  gemm(false, false, m, n, k, 1.0f, p, ldp, v, ldv, 1.0f, o, ldo);
}

}  // namespace ulysses::kernels
