#include "ulysses/cp/kernel_model.hpp"

#include <algorithm>
#include <cmath>

namespace ulysses {

namespace {

// L / (L + half): 1 when half is 0 (a flat model); lengths below one token count as one.
double saturation(double len, double half) { return half > 0 ? std::max(len, 1.0) / (std::max(len, 1.0) + half) : 1; }

}  // namespace

double block_efficiency(const KernelModel& m, std::int64_t head_dim, double q_len, double kv_len, bool diagonal) {
  double e = saturation(kv_len, m.kv_half);
  if (diagonal) e *= saturation(std::max(q_len, kv_len), m.causal_half);
  if (m.head_dim_half > 0) e *= saturation(double(head_dim), m.head_dim_half) / saturation(128, m.head_dim_half);
  return e;
}

RingPairs ring_visible_pairs(std::int64_t members, std::int64_t per_member, bool zigzag, bool causal) {
  if (members < 1 || per_member < 1 || (zigzag && per_member % 2 != 0)) return {};
  const double m = double(per_member), n = double(members) * m;  // n chunks in the ring
  if (!causal) return {m * n, 0};
  if (zigzag) return {m / 2 * (n + 1), m};
  return {m * n - m * (m - 1) / 2, m};  // positions n − m .. n − 1, each p + 1 pairs
}

double block_cache_factor(const KernelModel& m, std::int64_t head_dim, double element_bytes, double kv_len,
                          bool diagonal) {
  const double per_key = 2 * double(head_dim) * element_bytes;  // one key's K and V, one head
  if (!(m.cache_bytes > 0) || !(m.past_cache_extra > 0) || !std::isfinite(m.cache_bytes + m.past_cache_extra) ||
      !(per_key > 0) || !(kv_len * per_key > m.cache_bytes))
    return 1;
  const double past = 1 - m.cache_bytes / per_key / kv_len;  // the share of the stream past the cache
  return 1 + m.past_cache_extra * (diagonal ? past * past : past);
}

double stream_seconds(const KernelModel& m, double bytes) {
  const double past = bytes - std::max(m.stream_cache_bytes, 0.0), s = m.stream_s_per_byte * past;
  return m.stream_s_per_byte > 0 && past > 0 && std::isfinite(s) ? s : 0;
}

KernelSeconds kernel_seconds(const KernelModel& m, const KernelCalls& c, std::int64_t head_dim, double element_bytes,
                             double flat_fwd_s) {
  const double share = std::clamp(c.diagonal_share, 0.0, 1.0);
  const double off = block_efficiency(m, head_dim, c.q_len, c.kv_len, false) /
                     block_cache_factor(m, head_dim, element_bytes, c.kv_len, false);
  const double diag = block_efficiency(m, head_dim, c.q_len, c.kv_len, true) /
                      block_cache_factor(m, head_dim, element_bytes, c.kv_len, true);
  double work = flat_fwd_s * (share / diag + (1 - share) / off);
  const double calls = double(std::max<std::int64_t>(c.calls, 1)), d = double(head_dim);
  const double kv = c.kv_read > 0 ? c.kv_read : c.kv_len;
  double per_call = m.call_s;
  // Every call reads its q and K/V once and writes out: its working set, and the floor decode sits on.
  const double io = (2 * c.q_len * c.q_heads + 2 * kv * c.kv_heads) * d * element_bytes;
  work += calls * stream_seconds(m, io);
  if (m.memory_bandwidth > 0) {
    work = std::max(work, calls * io / m.memory_bandwidth);
    if (c.merge) per_call += m.merge_passes * c.q_len * c.q_heads * d * 4 / m.memory_bandwidth;
  }
  const double pack = m.kv_pack_s_per_byte * 2 * kv * c.kv_heads * d * element_bytes;
  return {work + calls * (per_call + pack), m.backward_ratio * work + calls * (per_call + 1.5 * pack)};
}

}  // namespace ulysses
