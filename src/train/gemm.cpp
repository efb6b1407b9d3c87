#include "train/gemm.hpp"

#include "kernels/onednn_gemm.hpp"
#include "kernels/peak.hpp"
#include "ulysses/core/bf16.hpp"

namespace ulysses::train {

namespace {

bool dot_product_here() { return kernels::compute_unit(DType::bf16) == kernels::PeakUnit::bf16_dot; }

// dst[i] = src[i] rounded to bfloat16 and widened back to float32 (exact): the float32 GEMMs
// then multiply and add what a bf16 GEMM would.
void round_through_bf16(std::vector<float>& dst, const float* src, i64 n) {
  dst.resize(std::size_t(n));
  parallel_ranges(n, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) dst[std::size_t(i)] = bf16_to_float(float_to_bf16(src[i]));
  });
}

void widen(std::vector<float>& dst, const std::uint16_t* src, i64 n) {
  dst.resize(std::size_t(n));
  parallel_ranges(n, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) dst[std::size_t(i)] = bf16_to_float(src[i]);
  });
}

}  // namespace

void round_to_bf16(std::vector<std::uint16_t>& dst, const float* src, i64 n) {
  dst.resize(std::size_t(n));
  parallel_ranges(n, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) dst[std::size_t(i)] = float_to_bf16(src[i]);
  });
}

void matmul_forward_bf16(float* out, const float* inp, const std::uint16_t* w16, i64 N, i64 IC, i64 OC) {
  if (!dot_product_here()) {
    std::vector<float> x, w;
    round_through_bf16(x, inp, N * IC);
    widen(w, w16, IC * OC);
    return matmul_forward(out, x.data(), w.data(), N, IC, OC);
  }
  std::vector<std::uint16_t> x;
  round_to_bf16(x, inp, N * IC);
  parallel_ranges(N, [&](i64 r0, i64 r1) {
    kernels::onednn_gemm_bf16(false, false, r1 - r0, OC, IC, x.data() + r0 * IC, IC, w16, OC, out + r0 * OC, OC, false);
  });
}

void matmul_backward_bf16(float* dinp, float* dw, const float* dout, const float* inp, const std::uint16_t* w16, i64 N,
                          i64 IC, i64 OC) {
  if (!dot_product_here()) {
    std::vector<float> g, x, w;
    round_through_bf16(g, dout, N * OC);
    round_through_bf16(x, inp, N * IC);
    widen(w, w16, IC * OC);
    return matmul_backward(dinp, dw, g.data(), x.data(), w.data(), N, IC, OC);
  }
  std::vector<std::uint16_t> g, x;
  round_to_bf16(g, dout, N * OC);
  round_to_bf16(x, inp, N * IC);
  parallel_ranges(N, [&](i64 r0, i64 r1) {
    kernels::onednn_gemm_bf16(false, true, r1 - r0, IC, OC, g.data() + r0 * OC, OC, w16, OC, dinp + r0 * IC, IC, true);
  });
  parallel_ranges(OC, [&](i64 c0, i64 c1) {
    kernels::onednn_gemm_bf16(true, false, IC, c1 - c0, N, x.data(), IC, g.data() + c0, OC, dw + c0, OC, true);
  });
}

}  // namespace ulysses::train
