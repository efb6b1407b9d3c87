// Local (single-rank) flash attention on the CPU, FlashAttention's mha_fwd / mha_bwd contract.
//
// Tiled online softmax: the s×s score matrix is never in memory, only one tile per thread.
// The forward returns the per-row log-sum-exp (float32, natural log, of the *scaled* scores),
// which the backward and the context-parallel merges need.
//
// Shapes (views may have any strides; d is contiguous; float32 only — callers convert bf16):
//   q, out, dout, dq : [b, sq, h,    d]
//   k, v, dk, dv     : [b, sk, h_kv, d]       h % h_kv == 0 (GQA/MQA: q head i uses kv head
//                                             i / (h / h_kv))
//   lse              : [b, h, sq] contiguous float32
//
// Masking: with `causal`, query row i (global position q_offset + i) sees key j (global
// position k_offset + j) iff k_offset + j <= q_offset + i. The offsets let one kernel serve
// ring / chunked strategies. A row that sees no key gets out = 0 and lse = -inf, and
// contributes nothing to any gradient (never NaN).
//
// Threads: OpenMP, using the calling thread's omp_get_max_threads().
#pragma once

#include <cstdint>

#include "ulysses/tensor.hpp"

namespace ulysses {

struct AttentionParams {
  bool causal = false;
  float scale = 0.0f;        // softmax scale; 0 means 1/sqrt(d)
  std::int64_t q_offset = 0;  // global position of query row 0
  std::int64_t k_offset = 0;  // global position of key row 0
};

// The scale actually used: params.scale, or 1/sqrt(d) when it is 0.
float effective_scale(const AttentionParams& params, std::int64_t head_dim);

// Checks shapes, dtypes and the head ratio; throws ulysses::Error naming the bad value.
void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out);

// out and lse are overwritten.
void flash_attention_forward(const TensorView& out, float* lse, const TensorView& q,
                             const TensorView& k, const TensorView& v,
                             const AttentionParams& params);

// dq, dk, dv are overwritten. out and lse are the forward's results for these inputs.
void flash_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const float* lse,
                              const AttentionParams& params);

// FLOPs of one forward as FlashAttention counts them: 4·b·sq·sk·h·d, halved when causal
// (for sq == sk). The backward is 2.5× this.
double attention_forward_flops(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h,
                               std::int64_t d, bool causal);

}  // namespace ulysses
