#include "ulysses/cp/cost_model.hpp"

#include <algorithm>
#include <cmath>

namespace ulysses {

std::int64_t busiest_tokens(const PlanInput& in) { return (in.seq + in.cp - 1) / in.cp; }

std::int64_t kv_seq_of(const PlanInput& in) { return in.kv_seq > 0 ? in.kv_seq : in.seq; }

std::int64_t busiest_kv_tokens(const PlanInput& in) { return (kv_seq_of(in) + in.cp - 1) / in.cp; }

bool has_backward(const PlanInput& in) { return in.mode == PlanMode::train; }

KernelSeconds attention_seconds(const PlanInput& in, const KernelCalls& calls, double flat_fwd_s) {
  KernelSeconds t = kernel_seconds(in.cluster.kernel, calls, in.head_dim, double(dtype_size(in.dtype)), flat_fwd_s);
  if (!has_backward(in)) t.bwd = 0;
  return t;
}

bool counts_ring_pairs(const PlanInput& in) {
  return in.cluster.kernel.ring_pair_calls && in.documents.empty() && kv_seq_of(in) == in.seq;
}

KernelCalls ring_pair_calls(const PlanInput& in, std::int64_t members, std::int64_t per_member, bool zigzag,
                            bool causal, double q_heads, double kv_heads) {
  const RingPairs p = ring_visible_pairs(members, per_member, zigzag, causal);
  const double chunks = double(std::max<std::int64_t>(members * per_member, 1));
  const double q = double(in.seq) / chunks, kv = double(kv_seq_of(in)) / chunks;
  // A diagonal pair holds half a full pair's work.
  const double share = p.pairs > 0 ? p.diagonal / (2 * p.pairs - p.diagonal) : 0;
  return {std::int64_t(std::llround(p.pairs)), q, kv, q_heads, kv_heads, share, true, kv};
}

double message_seconds(const Link& l, double bytes) { return l.latency + bytes / l.bandwidth; }

double all_to_all_seconds(const Cluster& c, int g, double bytes) {
  if (g <= 1 || bytes == 0) return 0;
  const int intra_peers = std::min(g, c.ranks_per_node) - 1, inter_peers = g - 1 - intra_peers;
  const Link intra = alltoall_link(c, std::min(g, c.ranks_per_node));
  const Link inter = inter_link(c, std::min(g, c.ranks_per_node));
  const double per_peer = bytes / (g - 1);
  return double(g - 1) * std::max(intra.latency, inter_peers ? inter.latency : 0.0) +
         std::max(intra_peers * per_peer / intra.bandwidth, inter_peers * per_peer / inter.bandwidth);
}

Link alltoall_link(const Cluster& c, int g) {
  if (c.switch_ranks > 0 && g <= c.switch_ranks) return c.intra;
  if (c.socket_ranks > 0 && g <= c.socket_ranks && c.alltoall_socket.bandwidth > 0) return c.alltoall_socket;
  return c.alltoall_intra.bandwidth > 0 ? c.alltoall_intra : c.intra;
}

Link inter_link(const Cluster& c, int flows) {
  if (c.inter_concurrent.bandwidth <= 0 || flows <= 1) return c.inter;
  const double node = c.inter_concurrent.bandwidth * c.ranks_per_node;
  return {std::min(c.inter.bandwidth, node / flows), c.inter.latency, c.inter.overlap, c.inter.overlap_calls};
}

Link ring_link(const Cluster& c, int members, int stride) {
  const int span = members * stride;
  if (span > c.ranks_per_node) return inter_link(c, std::min(stride, c.ranks_per_node));
  const bool crosses = c.socket_ranks > 0 && span > c.socket_ranks && c.cross_socket.bandwidth > 0;
  return crosses && c.cross_socket.bandwidth < c.intra.bandwidth ? c.cross_socket : c.intra;
}

double step_overlap(const Link& link, double step_calls) {
  double f = link.overlap;
  if (link.overlap_calls >= 2) f *= std::max(0.0, step_calls - 1) / double(link.overlap_calls - 1);
  return std::isfinite(f) ? std::clamp(f, 0.0, 1.0) : 0.0;
}

RingSeconds ring_seconds(const Link& link, int members, double kv_bytes, double dkv_bytes, double fwd_s, double bwd_s,
                         double step_calls) {
  RingSeconds t;
  if (members <= 1) return t;
  const double fstep = fwd_s / members, bstep = bwd_s / members;
  const double kv = message_seconds(link, kv_bytes), dkv = message_seconds(link, dkv_bytes);
  const double f = step_overlap(link, step_calls);
  if (dkv_bytes <= 0 && bwd_s <= 0) {  // forward only
    t.comm = (members - 1) * kv;
    t.hidden = (members - 1) * f * std::min(kv, fstep);
    return t;
  }
  t.comm = (members - 1) * kv + (members - 1) * kv + members * dkv;
  t.hidden = (members - 1) * f * (std::min(kv, fstep) + std::min(kv + dkv, bstep));
  return t;
}

double pipeline_exposed(int chunks, double in_s, double out_s, double compute_s) {
  double exposed = in_s + out_s;
  for (int i = 0; i < chunks; ++i) {
    const double travelling = (i + 1 < chunks ? in_s : 0) + (i > 0 ? out_s : 0);
    exposed += std::max(0.0, travelling - compute_s);
  }
  return exposed;
}

}  // namespace ulysses
