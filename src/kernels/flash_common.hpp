// Shared pieces of the flash forward and backward kernels.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <limits>

#include "ulysses/attention.hpp"

namespace ulysses::kernels {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes: a query block of 64 rows against a key block sized so the tile's working set
// (K and V blocks, scores, output accumulator) stays in the 512 KB L2 of this machine.
constexpr std::int64_t kBlockQ = 64;
inline std::int64_t block_k(std::int64_t d) { return d <= 64 ? 256 : 128; }

// Number of keys of [0, sk) that query row `i` may see (all of them when not causal).
inline std::int64_t visible_keys(const AttentionParams& p, std::int64_t i, std::int64_t sk) {
  if (!p.causal) return sk;
  std::int64_t n = p.q_offset + i - p.k_offset + 1;
  return n < 0 ? 0 : (n > sk ? sk : n);
}

// Row-major sgemm with leading dimensions in elements: C = alpha·op(A)·op(B) + beta·C.
inline void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace ulysses::kernels
