// Local (single-rank) flash attention on the CPU, FlashAttention's mha_fwd / mha_bwd contract.
//
// Tiled online softmax: the s×s score matrix is never in memory, only one tile per thread.
// The forward returns the per-row log-sum-exp (float32, natural log, of the *scaled* scores),
// which the backward and the context-parallel merges need.
//
// Dtypes (FlashAttention's contract): q, k, v (and dout) share one dtype, float32 or bfloat16;
// out, dq, dk, dv may each be either. Accumulation is float32 always; bf16 inputs run on the
// level's bf16 engine (AMX tiles: P and dS are rounded to bf16 for their GEMMs) or, on a
// level without one, are converted to float32 first. See kernel_isa() / kernel_engine().
//
// Shapes (views may have any strides; d is contiguous):
//   q, out, dout, dq : [b, sq, h,    d]
//   k, v, dk, dv     : [b, sk, h_kv, d]       h % h_kv == 0 (GQA/MQA: q head i uses kv head
//                                             i / (h / h_kv))
//   lse              : float32 [b, h, sq]: lse_tensor(q.shape) (tensor.hpp), or any dense
//                      [b, sq, h, 1] view in bhsd layout (FlashAttention's softmax_lse)
//
// Masking: with `causal`, query row i (global position q_offset + i) sees key j (global
// position k_offset + j) iff k_offset + j <= q_offset + i. The offsets let one kernel serve
// ring / chunked strategies. With `cu_seqlens` (packed documents, documents.hpp; batch 1,
// FlashAttention's varlen contract), a query also sees only the keys of its own document, and
// key tiles outside every document of a query block are skipped. With a sliding window
// (window_left, window_right: FlashAttention's window_size over the same global positions), a
// query also sees only keys j with q − window_left <= j <= q + window_right (-1: unbounded
// side); key tiles outside the band are skipped the same way. A row that sees no key gets
// out = 0 and lse = -inf, and contributes nothing to any gradient (never NaN).
//
// Finite in, finite out: for finite q, k, v whose scores q·k are finite in float32, out, lse
// and the gradients are finite; exp never sees a positive argument (flash_forward.cpp states
// the bound and where accuracy ends: |scale·q·k| < FLT_MAX, sk·max|v| < FLT_MAX).
//
// Threads: OpenMP, using the calling thread's omp_get_max_threads().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ulysses/core/documents.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

struct AttentionParams {
  bool causal = false;
  std::optional<float> scale = std::nullopt;  // softmax scale, finite and > 0; unset: 1/sqrt(d)
  std::int64_t q_offset = 0;                  // global position of query row 0
  std::int64_t k_offset = 0;                  // global position of key row 0
  std::vector<std::int64_t> cu_seqlens = {};  // document boundaries over global positions; empty: one
  std::int64_t window_left = -1;              // sliding window (left, right) over global positions; -1: unbounded
  std::int64_t window_right = -1;
};

// The scale actually used: params.scale, or 1/sqrt(d) when it is unset.
float effective_scale(const AttentionParams& params, std::int64_t head_dim);

// The instruction-set level the kernels run at: "amx", "avx512", "avx2" or "portable" — the
// best this CPU and OS support, capped by the environment variable ULYSSES_MAX_ISA.
const char* kernel_isa();
// The engine inputs of `dtype` run on, e.g. "amx-bf16", "avx512-f32", "avx2-f32 (bf16 converted)".
std::string kernel_engine(DType dtype);
// True when inputs of `dtype` have no engine of their own at this level and run on float32
// copies on the float32 engine (what the training memory model counts).
bool kernel_converts(DType dtype);
// OpenBLAS's kernel core, which runs every GEMM outside the attention (and the portable
// level's), e.g. "SkylakeX", or "SkylakeX (re-selected at load; OpenBLAS chose Prescott)".
// An OpenBLAS older than the CPU does not know its model and falls back to slow generic
// kernels; unless OPENBLAS_CORETYPE is set, ulysses then selects the core the CPU runs.
std::string blas_core();

// Checks shapes, dtypes and the head ratio; throws ulysses::Error naming the bad value.
void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out);
// Checks params.cu_seqlens (when given) against the shapes: batch 1, a valid cu_seqlens
// (documents.hpp) that covers every query and key position.
void check_documents(const AttentionParams& params, const TensorView& q, const TensorView& k);

// Throws ulysses::Error unless window_left and window_right are each -1 or >= 0.
void check_window(const AttentionParams& params);
// Throws ulysses::Error unless every query and key position (q_offset + i, k_offset + j) is an
// int64: q_offset + sq and k_offset + sk do not overflow.
void check_offsets(const AttentionParams& params, const TensorView& q, const TensorView& k);
// Throws ulysses::Error unless params.scale is unset or finite and > 0.
void check_scale(const AttentionParams& params);

// Visible (query, key) pairs between chunks q and k per (batch, head) under the whole mask
// `params` describes (causal, cu_seqlens, window; its offsets are ignored: q and k are global
// positions): documents.hpp's count, for the kernels' parameters.
inline std::int64_t visible_pairs(const AttentionParams& params, const SeqChunk& q, const SeqChunk& k) {
  return visible_pairs(params.cu_seqlens, params.causal, q, k, {params.window_left, params.window_right});
}

// out and lse are overwritten.
void flash_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v, const AttentionParams& params);

// dq, dk, dv are overwritten. out and lse are the forward's results for these inputs.
// In place is allowed: dk and dv may be k and v themselves, and dq may be out when they share
// a dtype (k and v are read only through packed copies made first, out only for
// D = rowsum(dout ∘ out) before any gradient is written): a caller that needs neither
// afterwards saves their size (the a2a strategy's consuming backward).
void flash_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse, const AttentionParams& params);

// Decode attention: one query row per head over every cached row, a matrix-vector product per
// head streamed once (a prefill kernel's query tiles would be mostly empty). Query head i of q
// is the model's head q_first + i and reads KV head (q_first + i) / group − kv_first of k and v:
// a rank's query heads over the KV heads it holds.
struct DecodeParams {
  std::int64_t q_first = 0, kv_first = 0, group = 1;
  float scale = 0;  // 0: 1/sqrt(d)
};

// Not collective. out and q float32 [1, 1, h_q, d], k and v float32 [1, rows, h_kv, d], lse
// float32 [1, 1, h_q, 1] (any strides, d contiguous) on one device: out gets the attention of
// each query head, lse its natural-log sum of exp of the scaled scores (rows = 0: out = 0,
// lse = −inf). The CPU's kernel splits the rows over the threads and merges their partials in
// a fixed order (the same bits every run); each thread's pass is the active ISA level's
// (isa.hpp) and reads each KV head's rows in turn, at the memory's rate when they are
// contiguous (stride_s == d: the KV cache's order; a [rows, h_kv, d] order gives the same
// result, at a fraction of the rate). Another device runs its registered decode. Throws
// Error naming the tensor for shapes or heads that do not fit.
void decode_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                              const TensorView& v, const DecodeParams& params);

// The attention kernels of a device other than the CPU (whose are built in, chosen per ISA): a
// device backend registers its pair at start-up, and flash_attention_forward/backward run it,
// after their checks, on tensors of that device. `kernels` must outlive its use.
struct AttentionKernels {
  Device device = Device::cpu;
  void (*forward)(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                  const TensorView& v, const AttentionParams& params) = nullptr;
  void (*backward)(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                   const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const TensorView& lse, const AttentionParams& params) = nullptr;
  // decode_attention_forward after its checks (null: the device has no decode kernel).
  void (*decode)(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                 const TensorView& v, const DecodeParams& params) = nullptr;
};
void register_attention_kernels(const AttentionKernels& kernels);

// FLOPs of one forward as FlashAttention counts them: 4·b·sq·sk·h·d, halved when causal
// (for sq == sk). The backward is 2.5× this.
double attention_forward_flops(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t d,
                               bool causal);

}  // namespace ulysses
