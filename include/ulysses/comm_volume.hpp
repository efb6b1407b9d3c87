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
#include "ulysses/sharding.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

struct CommVolume {
  std::map<std::string, std::int64_t> forward_bytes, backward_bytes;        // per rank
  std::map<std::string, std::int64_t> forward_messages, backward_messages;  // per rank
  std::int64_t total_forward_bytes() const;
  std::int64_t total_backward_bytes() const;
};

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

// Building blocks of the strategies' formulas for one rank, O(1) whatever the group size (the
// planner asks every rank).
// One Ulysses layer over `group` ranks, as "<prefix>seq_to_head" / "<prefix>head_to_seq": this
// rank holds `tokens` of the group's `group_tokens` and gets the heads `mine` of `heads` query
// heads and `kv_heads_held` KV heads in all (ulysses_kv_heads_held); it sends its tokens of the
// heads the others get and the others' tokens of its own heads, `row_bytes` = b·d·es per token
// and head (the seed's (s/cp)·heads·d·(cp−1)/cp per tensor when everything splits evenly).
void add_ulysses_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t tokens,
                        std::int64_t group_tokens, const RankHeads& mine, std::int64_t heads,
                        std::int64_t kv_heads_held, std::int64_t row_bytes);
// The same for cross-attention: k|v hold `kv_tokens` of the group's `group_kv_tokens` and are
// transposed apart from q (another token count): the forward's seq_to_head and the backward's
// head_to_seq are two all-to-alls each (k|v, then q).
void add_ulysses_cross_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t tokens,
                              std::int64_t group_tokens, std::int64_t kv_tokens, std::int64_t group_kv_tokens,
                              const RankHeads& mine, std::int64_t heads, std::int64_t kv_heads_held,
                              std::int64_t row_bytes);
// A ring of `members` ranks holding K and V of `total_elems` elements together, of which the
// next member holds `next_elems`: K/V once around ("<prefix>p2p_kv": every member's but the
// next one's, `es` bytes per element), float32 dK/dV all the way home ("<prefix>p2p_dkv":
// every member's).
void add_ring_volume(CommVolume& v, const std::string& prefix, int members, std::int64_t total_elems,
                     std::int64_t next_elems, std::int64_t es);

}  // namespace ulysses
