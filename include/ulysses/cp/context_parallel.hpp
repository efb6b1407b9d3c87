// Context-parallel attention: the user-facing entry point.
//
// cp = the communicator's size; config.cp_comm_type picks the strategy from the registry
// (strategy.hpp: a2a, p2p, all_gather, a2a+p2p). On one rank every strategy is plain flash
// attention.
//
// Sharding: which tokens rank r holds is given by rank_chunks() in token_layout.hpp: contiguous
// for a2a and for any strategy without a causal mask, zigzag otherwise. The global length s
// need not divide by cp: rank r holds s_r tokens, the first ranks (chunks) one more, and s is
// the sum over the ranks (s >= cp; s >= 2·cp under zigzag).
//   q, out, dout, dq : [b, s_r, h,    d]
//   k, v, dk, dv     : [b, s_r, h_kv, d]   (cross-attention: [b, sk_r, h_kv, d], below)
// b, h, h_kv, d, dtype and settings are the same on every rank; s_r is each rank's own.
// float32 or bfloat16 storage (all the same dtype), any layout/strides with d contiguous.
// Heads (a2a, and the inner all-to-all of a2a+p2p over a group of g ranks): ulysses_heads()
// in ulysses_heads.hpp, which needs h >= g only: whole GQA groups per rank when h_kv >= g, else
// each KV head shared by some ranks that split its query heads (gradients of the copies are
// summed); h need not divide by g. p2p and all_gather compute every head on their tokens and
// move K/V at their native head count.
//
// Cross-attention (is_cross in strategy.hpp; every built-in, Strategy::supports_cross): k/v
// hold s_k tokens in total, sharded by rank_chunks over s_k on their own (sk_r per rank); q
// holds s. Masks: none, or causal with config.q_offset (query i at key position q_offset + i);
// causal without q_offset is an Error when s_k != s. Every strategy uses contiguous chunks then.
//
// Autograd: forward() returns a CpContext that owns what the backward needs; any number of
// forwards may be in flight (layers, micro-batches, activation checkpointing), each context
// backwarded in any order. A context must not outlive the ContextParallelAttention that made it.
//
// Errors: every check that could differ between ranks is agreed collectively first, so a bad
// input anywhere makes every rank throw the same ulysses::Error before any data moves. The
// ranks' token counts are all-gathered first, so a count rank_chunks does not give a rank is
// named the same way everywhere ("rank 1 holds 5 tokens but cp_comm_type p2p with s = 11
// gives it 6").
#pragma once

#include <cstdint>
#include <memory>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

// Not collective: throws the Error a forward would throw for this configuration on `cp`
// ranks with global q [b, s, h, d] and `kv_heads` KV heads (unknown strategy, head rules,
// hierarchical sizes, too short a sequence), so a program can refuse bad settings early.
// kv_seq: the global k/v length s_k; 0 means q_global.s (self-attention).
void validate_cp_config(const CpConfig& config, int cp, const Shape& q_global, std::int64_t kv_heads,
                        std::int64_t kv_seq = 0);
// The error validate_cp_config throws for `config` on cp ranks at every sequence length (q
// [batch, s, heads, head_dim] for any s >= 1): its strategy's head rules (validate_heads), or ""
// when those accept the size (validate_cp_config may still refuse a length). For positive
// sizes, throws for an unknown strategy, as validate_cp_config does.
std::string cp_heads_error(const CpConfig& config, int cp, std::int64_t batch, std::int64_t heads,
                           std::int64_t head_dim, std::int64_t kv_heads);

// What one forward keeps for its backward (about 2× the head-sharded q+k+v for a2a).
class CpContext {
 public:
  CpContext();
  ~CpContext();
  CpContext(CpContext&&) noexcept;
  CpContext& operator=(CpContext&&) noexcept;
  bool valid() const { return impl_ != nullptr; }
  const CpStats& stats() const { return stats_; }  // the forward's

 private:
  friend class ContextParallelAttention;
  std::unique_ptr<StrategyContext> impl_;
  Shape q_shape_, kv_shape_;
  DType dtype_ = DType::f32;
  CpStats stats_;
};

class ContextParallelAttention {
 public:
  // Not collective; `comm` must outlive this object. Throws Error for an unknown cp_comm_type.
  ContextParallelAttention(Communicator& comm, CpConfig config);
  ~ContextParallelAttention();
  ContextParallelAttention(const ContextParallelAttention&) = delete;
  ContextParallelAttention& operator=(const ContextParallelAttention&) = delete;

  // Collective. Writes out and returns the context for the backward.
  [[nodiscard]] CpContext forward(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v);
  // The same with this call's packed documents (documents.hpp) in place of config().cu_seqlens:
  // packed training data brings other documents with every batch, as FlashAttention's varlen
  // functions take cu_seqlens per call. The context keeps them for its backward.
  [[nodiscard]] CpContext forward(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
                                  std::vector<std::int64_t> cu_seqlens);
  // Collective. This rank's part of a forward whose inputs failed the caller's own checks
  // (`error`, not empty): it joins the forward's one agreement in their place, so every rank
  // throws the lowest failing rank's error and the caller's checks cost no collective of their
  // own. Always throws.
  [[noreturn]] void refuse_forward(const std::string& error);
  // Collective. Writes dq, dk, dv for the forward that made `context` (which stays valid:
  // a second backward of the same context gives the same gradients). Returns its stats.
  CpStats backward(const CpContext& context, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const TensorView& dout);
  // Collective. The same for the last backward of a context (training): the strategy may
  // compute in the context's buffers (a2a: the head-sharded gradients over its k, v and out, so
  // no second head-sharded q|k|v-sized buffer lives at the peak). `context` is empty afterwards.
  CpStats backward(CpContext&& context, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const TensorView& dout);

  const CpConfig& config() const { return config_; }
  const Strategy& strategy() const { return strategy_; }
  Communicator& comm() const { return group_->comm(); }

 private:
  CpContext run_forward(const CpConfig& config, const TensorView& out, const TensorView& q, const TensorView& k,
                        const TensorView& v);
  CpStats run_backward(const CpContext& context, StrategyContext* consumed, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, const TensorView& dout);

  CpConfig config_;
  const Strategy& strategy_;
  std::unique_ptr<CpGroup> group_;
};

}  // namespace ulysses
