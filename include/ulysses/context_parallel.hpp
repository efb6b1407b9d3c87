// Context-parallel attention: the user-facing entry point.
//
// Megatron's vocabulary: cp = the communicator's size; cp_comm_type selects the strategy:
//   a2a         DeepSpeed-Ulysses: all-to-all seq→head, local attention over the full
//               sequence on h/cp heads, all-to-all head→seq. Needs h % cp == 0.
//   p2p         ring attention: K/V travel around the ring, overlapped with compute.
//   all_gather  gather the full K/V once; reduce-scatter dK/dV.
//   a2a+p2p     hierarchical: hierarchical_context_parallel_sizes = {inner, outer},
//               inner·outer == cp; Ulysses inside groups of `inner` contiguous ranks, a ring
//               across the `outer` groups (strided ranks). Needs h % inner == 0.
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
// Errors: every check that could differ between ranks is agreed collectively first, so a bad
// input anywhere makes every rank throw the same ulysses::Error before any data moves.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ulysses/attention.hpp"
#include "ulysses/communicator.hpp"
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

// Where the time of one forward or backward went, and the attention work this rank did.
struct CpStats {
  double compute_s = 0;          // local attention kernels (and LSE merges)
  double comm_exposed_s = 0;     // blocked in communication (all of it for all-to-alls and
                                 // all-gathers; for the ring only what compute did not hide)
  std::int64_t score_pairs = 0;  // (query, key) pairs inside the mask this rank computed
};

// What a forward keeps for its backward (the autograd context), held per instance.
struct CpSaved;

// Not collective: throws the Error a forward would throw for this configuration on `cp`
// ranks with global q [b, s, h, d] and `kv_heads` KV heads (head rules, hierarchical sizes,
// sequence divisibility), so a program can refuse bad settings before doing any work.
void validate_cp_config(const CpConfig& config, int cp, const Shape& q_global, std::int64_t kv_heads);

class ContextParallelAttention {
 public:
  // Not collective; `comm` must outlive this object.
  ContextParallelAttention(Communicator& comm, CpConfig config);
  ~ContextParallelAttention();
  ContextParallelAttention(const ContextParallelAttention&) = delete;
  ContextParallelAttention& operator=(const ContextParallelAttention&) = delete;

  // Collective. Writes out; keeps what backward needs (about 2× the head-sharded q+k+v).
  void forward(const TensorView& out, const TensorView& q, const TensorView& k,
               const TensorView& v);
  // Collective. Requires a preceding forward; writes dq, dk, dv.
  void backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const TensorView& dout);

  const CpStats& forward_stats() const;
  const CpStats& backward_stats() const;
  const CpConfig& config() const { return config_; }
  Communicator& comm() const { return comm_; }

 private:
  Communicator& comm_;
  CpConfig config_;
  std::unique_ptr<CpSaved> saved_;
};

}  // namespace ulysses
