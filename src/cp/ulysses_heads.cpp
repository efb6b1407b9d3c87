#include "ulysses/cp/ulysses_heads.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ulysses/core/error.hpp"

namespace ulysses {

RankHeads ulysses_heads(int group, int rank, std::int64_t heads, std::int64_t kv_heads) {
  const std::int64_t g = heads / kv_heads;  // query heads per KV head
  if (kv_heads >= group) {
    const HeadRange kv = even_part(kv_heads, group, rank);
    return {{kv.first * g, kv.count * g}, kv};
  }
  const std::int64_t k = part_holding(group, kv_heads, rank);
  const HeadRange sharers = even_part(group, kv_heads, k);
  const HeadRange q = even_part(g, sharers.count, rank - sharers.first);
  return {{k * g + q.first, q.count}, {k, 1}};
}

std::int64_t ulysses_kv_heads_held(int group, std::int64_t kv_heads) { return std::max<std::int64_t>(kv_heads, group); }

std::int64_t most_heads(const std::vector<HeadRange>& ranges) {
  std::int64_t n = 0;
  for (const HeadRange& r : ranges) n = std::max(n, r.count);
  return n;
}

HeadSplit ulysses_head_split(int group, std::int64_t heads, std::int64_t kv_heads) {
  HeadSplit s;
  for (int r = 0; r < group; ++r) {
    const RankHeads mine = ulysses_heads(group, r, heads, kv_heads);
    s.q.push_back(mine.q);
    s.kv.push_back(mine.kv);
  }
  return s;
}

int ulysses_overlap_chunks(int requested, int group, std::int64_t kv_heads) {
  const std::int64_t fewest_kv = kv_heads >= group ? kv_heads / group : 1;
  return int(std::clamp<std::int64_t>(requested, 1, fewest_kv));
}

HeadSplit ulysses_head_chunk(const HeadSplit& split, int chunks, int i) {
  if (chunks == 1) return split;
  HeadSplit c;
  for (std::size_t r = 0; r < split.kv.size(); ++r) {
    const HeadRange kv = split.kv[r], part = even_part(kv.count, chunks, i);
    const std::int64_t g = split.q[r].count / kv.count;  // whole groups when chunks > 1
    c.kv.push_back({kv.first + part.first, part.count});
    c.q.push_back({split.q[r].first + part.first * g, part.count * g});
  }
  return c;
}

void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads) {
  if (heads % kv_heads != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({}) (GQA groups)", heads, kv_heads));
}

void check_ulysses_heads(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                         std::string_view strategy) {
  check_gqa_groups(heads, kv_heads);
  if (heads < group)
    throw Error(
        fmt::format("num_heads ({}) must be at least {} ({}) for cp_comm_type {}: Ulysses gives every rank "
                    "of the all-to-all at least one whole head. cp_comm_type p2p (ring attention) has no "
                    "head constraint",
                    heads, group_name, group, strategy));
}

}  // namespace ulysses
