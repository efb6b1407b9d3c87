#include "ulysses/comm_volume.hpp"

#include <fmt/format.h>

#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses {

void add_ulysses_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t b, std::int64_t local,
                        std::int64_t heads, std::int64_t kv_sent, std::int64_t d, std::int64_t es) {
  auto per = [&](std::int64_t n) { return b * local * n * d * (group - 1) / group * es; };
  const std::int64_t qkv = per(heads) + 2 * per(kv_sent), one = per(heads), msgs = group - 1;
  v.forward_bytes[prefix + "seq_to_head"] = qkv;
  v.forward_bytes[prefix + "head_to_seq"] = one;
  v.backward_bytes[prefix + "seq_to_head"] = one;
  v.backward_bytes[prefix + "head_to_seq"] = qkv;
  for (auto* m : {&v.forward_messages, &v.backward_messages}) {
    (*m)[prefix + "seq_to_head"] = msgs;
    (*m)[prefix + "head_to_seq"] = msgs;
  }
}

void add_ring_volume(CommVolume& v, const std::string& prefix, int members, std::int64_t kv_elems, std::int64_t es) {
  v.forward_bytes[prefix + "p2p_kv"] = (members - 1) * kv_elems * es;
  v.backward_bytes[prefix + "p2p_kv"] = (members - 1) * kv_elems * es;
  v.backward_bytes[prefix + "p2p_dkv"] = members > 1 ? members * kv_elems * 4 : 0;
  v.forward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_dkv"] = members > 1 ? members : 0;
}

std::int64_t CommVolume::total_forward_bytes() const {
  std::int64_t n = 0;
  for (const auto& [op, b] : forward_bytes) n += b;
  return n;
}

std::int64_t CommVolume::total_backward_bytes() const {
  std::int64_t n = 0;
  for (const auto& [op, b] : backward_bytes) n += b;
  return n;
}

CommVolume predicted_comm_volume(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads,
                                 DType dtype) {
  if (cp < 1 || q.s % cp != 0 || kv_heads < 1)
    throw Error(fmt::format("invalid volume query: cp {}, q {}, kv_heads {}", cp, q.str(), kv_heads));
  const Strategy& strategy = find_strategy(config.cp_comm_type);
  strategy.validate(config, cp, q, kv_heads);
  return strategy.traffic(config, cp, q, kv_heads, dtype);
}

}  // namespace ulysses
