// The portable level: the tile GEMMs through OpenBLAS (which re-packs its operands on every
// call, hence the hand-written engines) and a scalar exp with the same arithmetic as the
// vector ones. It runs on any x86-64 and is the reference the others are tested beside.
#include <cblas.h>

#include <cmath>
#include <cstring>

#include "engines.hpp"
#include "exp_poly.hpp"

namespace ulysses::kernels::native {

namespace {

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n),
              int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

std::int64_t packed_bytes(std::int64_t n, std::int64_t d) {
  return (n + kKeyAlign - 1) / kKeyAlign * kKeyAlign * d * 4;
}
std::int64_t packed_offset(std::int64_t j0, std::int64_t d) { return j0 * d * 4; }

// Both images are dense rows [n][d] (BLAS takes Kᵀ by a transpose flag), the padding rows
// up to the next kKeyAlign zero as the contract says.
void pack_rows(const void* rows, std::int64_t ld, std::int64_t n, std::int64_t d, void* packed) {
  const float* src = static_cast<const float*>(rows);
  float* dst = static_cast<float*>(packed);
  for (std::int64_t j = 0; j < n; ++j) std::memcpy(dst + j * d, src + j * ld, std::size_t(d) * 4);
  std::memset(dst + n * d, 0, std::size_t(packed_bytes(n, d) - n * d * 4));
}

void scores(std::int64_t m, std::int64_t n, std::int64_t d, const void* a, std::int64_t lda, const void* bt, float* s,
            std::int64_t lds, std::int64_t) {
  gemm(false, true, m, n, d, 1.0f, static_cast<const float*>(a), lda, static_cast<const float*>(bt), d, 0.0f, s, lds);
}

void pv(std::int64_t m, std::int64_t d, std::int64_t k, const float* p, std::int64_t ldp, const void* b, float* o,
        std::int64_t ldo, std::int64_t) {
  gemm(false, false, m, d, k, 1.0f, p, ldp, static_cast<const float*>(b), d, 1.0f, o, ldo);
}

void pt_b(std::int64_t k, std::int64_t d, std::int64_t m, const float* p, std::int64_t ldp, const void* b,
          std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t) {
  gemm(true, false, k, d, m, 1.0f, p, ldp, static_cast<const float*>(b), ldb, 1.0f, c, ldc);
}

// The scalar twin of the vector exp, for x <= 0 (plain multiply-adds: a CPU without FMA would
// run std::fma in software).
float exp_one(float x) {
  if (!(x >= -87.0f)) return 0.0f;  // also −inf and NaN
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float p = exp_poly(r);
  const std::int32_t bits = (std::int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

float exp_shifted_sum(const float* x, float* out, std::int64_t n, float scale, float shift) {
  float sum = 0.0f;
  // The product rounded as row_max rounds it, then clamped: the argument is <= 0 (the vector
  // ops' rule, simd_engine.hpp).
  for (std::int64_t i = 0; i < n; ++i) {
    const float t = x[i] * scale;
    sum += out[i] = exp_one((shift < t ? shift : t) - shift);
  }
  return sum;
}

float row_max(const float* x, std::int64_t n, float init, float scale) {
  for (std::int64_t i = 0; i < n; ++i) init = x[i] * scale > init ? x[i] * scale : init;
  return init;
}

void softmax_grad(const float* p, float* dp, std::int64_t n, float scale, float delta) {
  for (std::int64_t i = 0; i < n; ++i) dp[i] = scale * p[i] * (dp[i] - delta);
}

}  // namespace

extern const GemmEngine blas_f32;
const GemmEngine blas_f32 = {"blas-f32", DType::f32, packed_bytes, packed_offset, pack_rows,
                             pack_rows,  scores,     pv,           pt_b};
extern const VectorOps scalar_vec;
const VectorOps scalar_vec = {exp_shifted_sum, row_max, softmax_grad};

}  // namespace ulysses::kernels::native
