// Context-parallel attention: the user-facing entry point.
//
// cp = the communicator's size; config.cp_comm_type picks the strategy from the registry
// (strategy.hpp: a2a, p2p, all_gather, a2a+p2p). On one rank every strategy is plain flash
// attention.
//
// Sharding: which tokens rank r holds is given by rank_chunks() in sharding.hpp: contiguous
// for a2a and for any strategy without a causal mask, zigzag otherwise.
//   q, out, dout, dq : [b, s/cp, h,    d]
//   k, v, dk, dv     : [b, s/cp, h_kv, d]
// float32 or bfloat16 storage (all the same dtype), any layout/strides with d contiguous.
// GQA (a2a, and the inner all-to-all of a2a+p2p over a group of g ranks): h_kv % g == 0
// splits KV heads; else g % h_kv == 0 replicates each KV head g/h_kv times before the
// all-to-all (gradients of the replicas are summed); else an error. p2p and all_gather move
// K/V at their native head count.
//
// Autograd: forward() returns a CpContext that owns what the backward needs; any number of
// forwards may be in flight (layers, micro-batches, activation checkpointing), each context
// backwarded in any order. A context must not outlive the ContextParallelAttention that made it.
//
// Errors: every check that could differ between ranks is agreed collectively first, so a bad
// input anywhere makes every rank throw the same ulysses::Error before any data moves.
#pragma once

#include <cstdint>
#include <memory>

#include "ulysses/attention.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/cp_config.hpp"
#include "ulysses/strategy.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

// Not collective: throws the Error a forward would throw for this configuration on `cp`
// ranks with global q [b, s, h, d] and `kv_heads` KV heads (unknown strategy, head rules,
// hierarchical sizes, sequence divisibility), so a program can refuse bad settings early.
void validate_cp_config(const CpConfig& config, int cp, const Shape& q_global, std::int64_t kv_heads);

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
  [[nodiscard]] CpContext forward(const TensorView& out, const TensorView& q, const TensorView& k,
                                  const TensorView& v);
  // Collective. Writes dq, dk, dv for the forward that made `context` (which stays valid:
  // a second backward of the same context gives the same gradients). Returns its stats.
  CpStats backward(const CpContext& context, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                   const TensorView& dout);

  const CpConfig& config() const { return config_; }
  const Strategy& strategy() const { return strategy_; }
  Communicator& comm() const { return group_->comm(); }

 private:
  CpConfig config_;
  const Strategy& strategy_;
  std::unique_ptr<CpGroup> group_;
};

}  // namespace ulysses
