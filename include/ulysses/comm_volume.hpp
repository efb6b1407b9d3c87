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

#include "ulysses/cp_config.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

struct CommVolume {
  std::map<std::string, std::int64_t> forward_bytes, backward_bytes;        // per rank
  std::map<std::string, std::int64_t> forward_messages, backward_messages;  // per rank
  std::int64_t total_forward_bytes() const;
  std::int64_t total_backward_bytes() const;
};

// For global q [b, s, h, d] with `kv_heads` KV heads on cp ranks: the strategy's own formula
// (Strategy::traffic). Throws Error if the configuration is invalid (the same rules as
// ContextParallelAttention).
CommVolume predicted_comm_volume(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads,
                                 DType dtype);

// Building blocks of the strategies' formulas, `es` bytes per element.
// One Ulysses layer over `group` ranks holding `local` tokens each, with `kv_sent` KV heads
// after replication: the seed's (s/cp)·heads·d·(cp−1)/cp elements per rank per tensor, as
// "<prefix>seq_to_head" / "<prefix>head_to_seq".
void add_ulysses_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t b, std::int64_t local,
                        std::int64_t heads, std::int64_t kv_sent, std::int64_t d, std::int64_t es);
// A ring of `members` ranks, each holding K and V of `kv_elems` elements together: K/V once
// around ("<prefix>p2p_kv"), float32 dK/dV all the way home ("<prefix>p2p_dkv").
void add_ring_volume(CommVolume& v, const std::string& prefix, int members, std::int64_t kv_elems, std::int64_t es);

}  // namespace ulysses
