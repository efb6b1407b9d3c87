// The bfloat16 forms of matmul_forward / matmul_backward (layers.hpp) for --dtype bf16: the
// GEMM inputs are rounded to bfloat16 (activations here, the weights once per step by the
// caller: w16 is the bf16 copy of the float32 master weight), the products accumulate in
// float32, and gradients accumulate (+=) into float32. Threads split the work as the float32
// forms do. The unit is the faster one for bf16 on this CPU (kernels::compute_unit): oneDNN's
// bf16 matmul where the CPU's bf16 dot product outruns its float32 FMA (AMX, Zen 4), else
// the rounded inputs widened to float32 (exactly) on the float32 GEMMs (OpenBLAS), where
// vdpbf16ps runs at half the FMA's rate (Intel without AMX) or is missing (docs/perf.md).
#pragma once

#include <cstdint>
#include <vector>

#include "train/layers.hpp"

namespace ulysses::train {

// dst[i] = src[i] rounded to bfloat16 (nearest even), over OpenMP threads.
void round_to_bf16(std::vector<std::uint16_t>& dst, const float* src, i64 n);

// out[N, OC] = bf16(inp[N, IC]) · w16[IC, OC].
void matmul_forward_bf16(float* out, const float* inp, const std::uint16_t* w16, i64 N, i64 IC, i64 OC);
// dinp += bf16(dout) · w16ᵀ; dw += bf16(inp)ᵀ · bf16(dout).
void matmul_backward_bf16(float* dinp, float* dw, const float* dout, const float* inp, const std::uint16_t* w16, i64 N,
                          i64 IC, i64 OC);

}  // namespace ulysses::train
