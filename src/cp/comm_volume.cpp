#include "ulysses/cp/comm_volume.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses {

CommVolume predicted_comm_volume(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads,
                                 DType dtype, std::int64_t kv_seq) {
  if (rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in [0, cp = {})", rank, cp));
  validate_cp_config(config, cp, q, kv_heads, kv_seq);
  return find_strategy(config.cp_comm_type).traffic(config, cp, rank, q, kv_seq == 0 ? q.s : kv_seq, kv_heads, dtype);
}

CommVolume predicted_comm_volume(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads, DType dtype,
                                 std::int64_t kv_seq) {
  if (cp < 1) throw Error(fmt::format("invalid volume query: cp {}", cp));
  validate_cp_config(config, cp, q, kv_heads, kv_seq);
  const Strategy& strategy = find_strategy(config.cp_comm_type);
  CommVolume busiest;
  auto take_max = [](std::map<std::string, std::int64_t>& into, const std::map<std::string, std::int64_t>& from) {
    for (const auto& [op, n] : from) into[op] = std::max(into[op], n);
  };
  const std::int64_t s_k = kv_seq == 0 ? q.s : kv_seq;
  // Ranks with equal keys send alike: each distinct key's formula once (a few under an even
  // split, every rank's under a halo), the keys in a set that holds no more than cp of them.
  std::set<Strategy::TrafficKey> priced;
  const std::vector<Strategy::TrafficKey> keys = strategy.traffic_keys(config, cp, q, s_k, kv_heads);
  for (int r = 0; r < cp; ++r) {
    if (!priced.insert(keys[std::size_t(r)]).second) continue;
    const CommVolume v = strategy.keyed_traffic(config, cp, r, keys[std::size_t(r)], q, s_k, kv_heads, dtype);
    take_max(busiest.forward_bytes, v.forward_bytes);
    take_max(busiest.backward_bytes, v.backward_bytes);
    take_max(busiest.forward_messages, v.forward_messages);
    take_max(busiest.backward_messages, v.backward_messages);
    busiest.transfers.insert(v.transfers.begin(), v.transfers.end());  // the same on every rank
    busiest.groups.insert(v.groups.begin(), v.groups.end());
  }
  return busiest;
}

}  // namespace ulysses
