// The exact communication of one attention layer, per rank, by strategy: what the counters of
// a real run must show (the tests check it to the byte), and the planner's input. Each
// strategy's own formula (Strategy::traffic) is built from traffic.hpp's blocks.
//
// Keys are the Communicator counter names: "seq_to_head", "head_to_seq" (a2a), "p2p_kv", "p2p_dkv"
// (p2p), "all_gather_kv", "all_gather_dkv" (all_gather), and "inner.*" / "outer.*" for
// a2a+p2p. K/V travel in the storage dtype; gradients that are summed across ranks (dK/dV of
// p2p and all_gather) travel in float32. Each key's CommVolume::transfers entry says which
// collective carries it and in which group: what reads the volume (the benchmark's replay,
// the call counts) dispatches on that, not on the names.
#pragma once

#include <cstdint>

#include "ulysses/cp/cp_config.hpp"
#include "ulysses/core/tensor.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses {

// For global q [b, s, h, d] with `kv_heads` KV heads on cp ranks: what rank `rank` sends, the
// strategy's own formula (Strategy::traffic). Throws Error if the configuration is invalid
// (the same rules as ContextParallelAttention). kv_seq: the k/v length s_k (cross-attention);
// 0 means q.s.
CommVolume predicted_comm_volume(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads,
                                 DType dtype, std::int64_t kv_seq = 0);
// The same for the busiest rank of each counter: every rank's volume when the tokens and heads
// split evenly, an upper bound per counter otherwise (the planner's input).
CommVolume predicted_comm_volume(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads, DType dtype,
                                 std::int64_t kv_seq = 0);

}  // namespace ulysses
