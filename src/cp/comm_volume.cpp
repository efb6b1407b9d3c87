#include "ulysses/comm_volume.hpp"

#include <fmt/format.h>

#include "ulysses/error.hpp"

namespace ulysses {

namespace {

// KV heads an all-to-all over `group` ranks sends: split (h_kv) or replicated (group).
std::int64_t kv_heads_sent(std::int64_t kv_heads, int group) {
  if (kv_heads % group == 0) return kv_heads;
  if (group % kv_heads == 0) return group;
  throw Error(fmt::format("num_kv_heads ({}) does not fit an all-to-all over {} ranks", kv_heads, group));
}

// One Ulysses layer over `group` ranks with `local` tokens per rank: the seed's formula,
// (s/cp)·heads·d·(cp−1)/cp elements per rank per tensor.
void add_ulysses(CommVolume& v, const std::string& prefix, int group, std::int64_t b, std::int64_t local,
                 std::int64_t h, std::int64_t kvs, std::int64_t d, std::int64_t es) {
  auto per = [&](std::int64_t heads) { return b * local * heads * d * (group - 1) / group * es; };
  const std::int64_t qkv = per(h) + 2 * per(kvs), one = per(h), msgs = group - 1;
  v.forward_bytes[prefix + "seq_to_head"] = qkv;
  v.forward_bytes[prefix + "head_to_seq"] = one;
  v.backward_bytes[prefix + "seq_to_head"] = one;
  v.backward_bytes[prefix + "head_to_seq"] = qkv;
  for (auto* m : {&v.forward_messages, &v.backward_messages}) {
    (*m)[prefix + "seq_to_head"] = msgs;
    (*m)[prefix + "head_to_seq"] = msgs;
  }
}

// A ring of `members` ranks, each holding K and V of `kv_elems` elements (both together).
void add_ring(CommVolume& v, const std::string& prefix, int members, std::int64_t kv_elems, std::int64_t es) {
  v.forward_bytes[prefix + "p2p_kv"] = (members - 1) * kv_elems * es;
  v.backward_bytes[prefix + "p2p_kv"] = (members - 1) * kv_elems * es;
  v.backward_bytes[prefix + "p2p_dkv"] = members > 1 ? members * kv_elems * 4 : 0;
  v.forward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_dkv"] = members > 1 ? members : 0;
}

}  // namespace

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
  const std::int64_t es = std::int64_t(dtype_size(dtype)), local = q.s / cp;
  CommVolume v;
  switch (config.cp_comm_type) {
    case CpCommType::a2a:
      add_ulysses(v, "", cp, q.b, local, q.h, kv_heads_sent(kv_heads, cp), q.d, es);
      break;
    case CpCommType::p2p:
      add_ring(v, "", cp, 2 * q.b * local * kv_heads * q.d, es);
      break;
    case CpCommType::all_gather: {
      const std::int64_t kv = 2 * q.b * local * kv_heads * q.d;
      v.forward_bytes["all_gather_kv"] = (cp - 1) * kv * es;
      v.backward_bytes["all_gather_dkv"] = (cp - 1) * kv * 4;
      v.forward_messages["all_gather_kv"] = cp - 1;
      v.backward_messages["all_gather_dkv"] = cp - 1;
      break;
    }
    case CpCommType::a2a_p2p: {
      const auto& hs = config.hierarchical_context_parallel_sizes;
      if (hs.size() != 2 || hs[0] < 1 || hs[1] < 1 || hs[0] * hs[1] != cp)
        throw Error(fmt::format("a2a+p2p needs [inner, outer] with inner * outer == cp ({})", cp));
      const std::int64_t kvs = kv_heads_sent(kv_heads, hs[0]);
      add_ulysses(v, "inner.", hs[0], q.b, local, q.h, kvs, q.d, es);
      add_ring(v, "outer.", hs[1], 2 * q.b * local * kvs * q.d, es);  // I·local tokens × kvs/I heads
      break;
    }
  }
  return v;
}

}  // namespace ulysses
