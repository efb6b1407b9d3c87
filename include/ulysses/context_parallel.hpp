// Context-parallel attention: the user-facing entry point.
//
// Megatron's vocabulary: cp = the communicator's size; cp_comm_type selects the strategy:
//   a2a         DeepSpeed-Ulysses: all-to-all seq→head, local attention over the full
//               sequence on h/cp heads, all-to-all head→seq.          (implemented)
//   p2p         ring attention, zigzag under a causal mask.           (not yet: clear error)
//   all_gather  gather full K/V.                                       (not yet: clear error)
//   a2a+p2p     hierarchical, hierarchical_context_parallel_sizes = {inner, outer}.
//                                                                      (not yet: clear error)
//
// Sharding (a2a): rank r holds tokens [r·s/cp, (r+1)·s/cp) of every sequence.
//   q, out, dout, dq : [b, s/cp, h,    d]
//   k, v, dk, dv     : [b, s/cp, h_kv, d]
// float32 or bfloat16 storage (all the same dtype), any layout/strides with d contiguous.
// GQA: h_kv % cp == 0 splits KV heads; else cp % h_kv == 0 replicates each KV head cp/h_kv
// times before the all-to-all (gradients of the replicas are summed); else an error.
//
// Errors: every check that could differ between ranks is agreed collectively first, so a bad
// input anywhere makes every rank throw the same ulysses::Error before any data moves.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ulysses/attention.hpp"
#include "ulysses/comm.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

enum class CpCommType { p2p, a2a, all_gather, a2a_p2p };
const char* to_string(CpCommType type);             // "p2p", "a2a", "all_gather", "a2a+p2p"
CpCommType parse_cp_comm_type(std::string_view name);  // throws Error on unknown names

struct CpConfig {
  CpCommType cp_comm_type = CpCommType::a2a;
  std::vector<int> hierarchical_context_parallel_sizes;  // a2a+p2p: {inner, outer}
  bool causal = false;
  float scale = 0.0f;  // 0 means 1/sqrt(d)
};

// What a forward keeps for its backward (the autograd context), held per instance.
struct CpSaved;

class ContextParallelAttention {
 public:
  // Not collective; `comm` must outlive this object.
  ContextParallelAttention(Comm& comm, CpConfig config);
  ~ContextParallelAttention();
  ContextParallelAttention(const ContextParallelAttention&) = delete;
  ContextParallelAttention& operator=(const ContextParallelAttention&) = delete;

  // Collective. Writes out; keeps what backward needs (about 2× the head-sharded q+k+v).
  void forward(const TensorView& out, const TensorView& q, const TensorView& k,
               const TensorView& v);
  // Collective. Requires a preceding forward; writes dq, dk, dv.
  void backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const TensorView& dout);

  const CpConfig& config() const { return config_; }
  Comm& comm() const { return comm_; }

 private:
  Comm& comm_;
  CpConfig config_;
  std::unique_ptr<CpSaved> saved_;
};

}  // namespace ulysses
