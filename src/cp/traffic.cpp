#include "ulysses/cp/traffic.hpp"

namespace ulysses {

std::int64_t Transfer::calls(std::int64_t messages, int members) const {
  if (messages == 0) return 0;
  switch (collective) {
    case Collective::all_to_all: return members > 1 ? messages / (members - 1) : 0;
    case Collective::ring: return messages;
    case Collective::all_gather:
    case Collective::reduce_scatter: return 1;
  }
  return 0;
}

int CommVolume::members(const Transfer& transfer, int cp) const {
  return transfer.group.empty() ? cp : groups.at(transfer.group).members;
}

void declare_transfer(CommVolume& v, const std::string& prefix, const std::string& op, Collective collective) {
  v.transfers[prefix + op] = {collective, prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1)};
}

void add_ulysses_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t tokens,
                        std::int64_t group_tokens, const RankHeads& mine, std::int64_t heads,
                        std::int64_t kv_heads_held, std::int64_t row_bytes) {
  const std::int64_t q = mine.q.count, kv = mine.kv.count;
  const std::int64_t out_q = tokens * (heads - q) * row_bytes, out_kv = tokens * (kv_heads_held - kv) * row_bytes;
  const std::int64_t others = (group_tokens - tokens) * row_bytes;  // the other ranks' tokens of our heads
  v.forward_bytes[prefix + "seq_to_head"] = out_q + 2 * out_kv;
  v.forward_bytes[prefix + "head_to_seq"] = others * q;
  v.backward_bytes[prefix + "seq_to_head"] = out_q;
  v.backward_bytes[prefix + "head_to_seq"] = others * (q + 2 * kv);
  for (auto* m : {&v.forward_messages, &v.backward_messages}) {
    (*m)[prefix + "seq_to_head"] = group - 1;
    (*m)[prefix + "head_to_seq"] = group - 1;
  }
  for (const char* op : {"seq_to_head", "head_to_seq"}) declare_transfer(v, prefix, op, Collective::all_to_all);
}

void add_ulysses_cross_volume(CommVolume& v, const std::string& prefix, int group, std::int64_t tokens,
                              std::int64_t group_tokens, std::int64_t kv_tokens, std::int64_t group_kv_tokens,
                              const RankHeads& mine, std::int64_t heads, std::int64_t kv_heads_held,
                              std::int64_t row_bytes) {
  const std::int64_t out_q = tokens * (heads - mine.q.count) * row_bytes;
  const std::int64_t out_kv = 2 * kv_tokens * (kv_heads_held - mine.kv.count) * row_bytes;
  const std::int64_t in_q = (group_tokens - tokens) * mine.q.count * row_bytes;
  const std::int64_t in_kv = 2 * (group_kv_tokens - kv_tokens) * mine.kv.count * row_bytes;
  const std::string s2h = prefix + "seq_to_head", h2s = prefix + "head_to_seq";
  v.forward_bytes[s2h] = out_q + out_kv;
  v.forward_bytes[h2s] = in_q;
  v.backward_bytes[s2h] = out_q;
  v.backward_bytes[h2s] = in_q + in_kv;
  v.forward_messages[s2h] = 2 * (group - 1);
  v.forward_messages[h2s] = group - 1;
  v.backward_messages[s2h] = group - 1;
  v.backward_messages[h2s] = 2 * (group - 1);
  for (const char* op : {"seq_to_head", "head_to_seq"}) declare_transfer(v, prefix, op, Collective::all_to_all);
}

void add_ring_volume(CommVolume& v, const std::string& prefix, int members, std::int64_t total_elems,
                     std::int64_t next_elems, std::int64_t es) {
  const std::int64_t kv = (total_elems - next_elems) * es;  // the next member's own K/V never travels to it
  v.forward_bytes[prefix + "p2p_kv"] = kv;
  v.backward_bytes[prefix + "p2p_kv"] = kv;
  v.backward_bytes[prefix + "p2p_dkv"] = members > 1 ? total_elems * 4 : 0;
  v.forward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_kv"] = members - 1;
  v.backward_messages[prefix + "p2p_dkv"] = members > 1 ? members : 0;
  for (const char* op : {"p2p_kv", "p2p_dkv"}) declare_transfer(v, prefix, op, Collective::ring);
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

}  // namespace ulysses
