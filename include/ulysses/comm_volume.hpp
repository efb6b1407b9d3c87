// The exact communication of one attention layer, per rank, by strategy: what the counters of
// a real run must show (the tests check it to the byte), and the planner's input.
//
// Keys are the Communicator counter names: "seq_to_head", "head_to_seq" (a2a), "p2p_kv", "p2p_dkv"
// (p2p), "all_gather_kv", "all_gather_dkv" (all_gather), and "inner.*" / "outer.*" for
// a2a+p2p. K/V travel in the storage dtype; gradients that are summed across ranks (dK/dV of
// p2p and all_gather) travel in float32.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ulysses/context_parallel.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

struct CommVolume {
  std::map<std::string, std::int64_t> forward_bytes, backward_bytes;        // per rank
  std::map<std::string, std::int64_t> forward_messages, backward_messages;  // per rank
  std::int64_t total_forward_bytes() const;
  std::int64_t total_backward_bytes() const;
};

// For global q [b, s, h, d] with `kv_heads` KV heads on cp ranks. Throws Error if the
// configuration is invalid (the same rules as ContextParallelAttention).
CommVolume predicted_comm_volume(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads,
                                 DType dtype);

}  // namespace ulysses
