// Shared pieces of the flash forward and backward loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "engine.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/saturating.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

// The registered kernels of a device other than the CPU, or null (register_attention_kernels).
const AttentionKernels* device_kernels(Device device);
// Every check of a flash forward or backward call, before any work: the shapes, `lse` the
// dense float32 [b, sq, h, 1] bhsd tensor for q, the offsets, documents, window and scale.
// Throws Error naming the first that fails.
void check_attention_call(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, const AttentionParams& params);
}  // namespace ulysses

namespace ulysses::kernels {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes: a query block of 64 rows against a key block sized so the tile's working set
// (K and V blocks, scores, output accumulator) stays in a 512 KB L2; multiples of kKeyAlign.
constexpr std::int64_t kBlockQ = 64;
inline std::int64_t block_k(std::int64_t d) { return d <= 128 ? 256 : 128; }

// The keys [lo, hi) of [0, sk) that query row `i` may see: its document's, inside its window,
// and under a causal mask none after it. Both ends never decrease with i, so the rows that see a key block, and
// the keys a query block sees, are each one contiguous range.
struct KeyRange {
  std::int64_t lo = 0, hi = 0;
};
inline KeyRange visible_keys(const AttentionParams& p, std::int64_t i, std::int64_t sk) {
  const Window window{p.window_left, p.window_right};
  if (p.cu_seqlens.empty() && !p.causal && !window.bounded()) return {0, sk};
  const Document r = ulysses::visible_keys(p.cu_seqlens, p.causal, p.q_offset + i, {p.k_offset, sk}, window);
  const std::int64_t lo = std::clamp<std::int64_t>(r.begin - p.k_offset, 0, sk);
  return {lo, std::clamp<std::int64_t>(r.end - p.k_offset, lo, sk)};
}
// The engines' `diag` for the tile of query rows from i0 and keys from j0 (engine.hpp): under a
// causal mask q_offset + i0 − k_offset − j0, clamped to ±kNoDiagonal (a tile's row sees all its
// keys, or none, well before that) so the engines' diag + i stays far from overflow.
inline std::int64_t tile_diagonal(const AttentionParams& p, std::int64_t i0, std::int64_t j0) {
  if (!p.causal) return kNoDiagonal;
  return std::clamp(sat_sub(sat_sub(p.q_offset + i0, p.k_offset), j0), -kNoDiagonal, kNoDiagonal);
}

// The part of `r` inside the key block [j0, j0 + nk), relative to j0 (lo == hi: none).
inline KeyRange in_block(KeyRange r, std::int64_t j0, std::int64_t nk) {
  const std::int64_t lo = std::clamp<std::int64_t>(r.lo - j0, 0, nk);
  return {lo, std::clamp<std::int64_t>(r.hi - j0, lo, nk)};
}

// The per-(batch, KV head) images of one of K or V, made once per call by `pack`.
struct PackedHeads {
  Tensor storage;
  std::int64_t per_head = 0;  // bytes
  const std::byte* at(std::int64_t bb, std::int64_t g, std::int64_t heads) const {
    return static_cast<const std::byte*>(storage.data()) + (bb * heads + g) * per_head;
  }
};
using PackFn = void (*)(const void*, std::int64_t, std::int64_t, std::int64_t, void*);
PackedHeads pack_heads(const GemmEngine& e, PackFn pack, const TensorView& x);

// The engine for operands of `dtype` on `level` (null: convert to float32 first).
inline const GemmEngine* engine_for(const KernelLevel& level, DType dtype) {
  return dtype == DType::f32 ? level.f32 : level.bf16;
}

// Forward and backward on an explicit level (tests pass emulated levels; the public entry
// points pass active_level()). Shapes are checked by the callers.
void flash_forward(const KernelLevel& level, const TensorView& out, float* lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, const AttentionParams& params);
void flash_backward(const KernelLevel& level, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const float* lse, const AttentionParams& params);

}  // namespace ulysses::kernels
