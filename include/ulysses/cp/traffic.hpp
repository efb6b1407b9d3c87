// CommVolume, the bytes and messages one rank sends per Communicator counter and how each
// travels, and the blocks the strategies' traffic formulas (Strategy::traffic) are made of:
// below the strategies, so that predicted_comm_volume (comm_volume.hpp), which asks them, sits
// above.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ulysses/core/ranges.hpp"

namespace ulysses {

// How a counter's bytes travel. Code that replays a strategy's traffic without its compute
// (the benchmark) or counts its calls reads this, never the counter's name, so a new
// strategy's traffic replays as its formula declares it.
enum class Collective {
  all_to_all,      // messages / (members − 1) all-to-alls: a block to every other member each
  ring,            // `messages` sends, each its own call (a ring's steps, a halo's neighbours)
  all_gather,      // one all-gather: a block to every other member
  reduce_scatter,  // one float32 reduce-scatter: a block to every other member
};

// A group a strategy splits its ranks into (MPI_Comm_split): `members` ranks `stride` apart.
// a2a+p2p's inner groups are contiguous ({inner, 1}), its outer rings strided ({outer, inner}).
struct Subgroup {
  int members = 1, stride = 1;
  // The split's color of `rank`: the ranks of one group share it (the key is the rank).
  int color(int rank) const { return rank / (members * stride) * stride + rank % stride; }
};

struct Transfer {
  Collective collective = Collective::all_to_all;
  std::string group;  // "": the strategy's whole group; else a key of CommVolume::groups
  // The calls that send `messages` messages to the other ranks of a group of `members`.
  std::int64_t calls(std::int64_t messages, int members) const;
};

struct CommVolume {
  std::map<std::string, std::int64_t> forward_bytes, backward_bytes;        // per rank
  std::map<std::string, std::int64_t> forward_messages, backward_messages;  // per rank
  std::map<std::string, Transfer> transfers;  // per counter: how it travels (every counter has one)
  std::map<std::string, Subgroup> groups;     // the sub-groups the transfers name, by name
  // The members of the group `transfer` runs in, in a strategy's group of `cp` ranks.
  int members(const Transfer& transfer, int cp) const;
  std::int64_t total_forward_bytes() const;
  std::int64_t total_backward_bytes() const;
};

// Building blocks of the strategies' formulas for one rank, O(1) whatever the group size (the
// planner asks every rank). They name their counters "<prefix><op>" and their transfers' group
// after the prefix ("inner." → "inner": how CpGroup names a subgroup's counters); a strategy
// that runs in subgroups declares their shapes in CommVolume::groups.
// Counter "<prefix><op>" travels as `collective`, in the group the prefix names.
void declare_transfer(CommVolume& v, const std::string& prefix, const std::string& op, Collective collective);
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
