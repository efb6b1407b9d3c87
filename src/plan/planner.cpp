#include "ulysses/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "ulysses/attention.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/error.hpp"

namespace ulysses {

namespace {

// Parses "<number><unit>" (spaces allowed) against a unit table.
double parse_quantity(const std::string& text, const std::map<std::string, double>& units, const char* what) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    throw Error(fmt::format("{} '{}' does not start with a number", what, text));
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  if (unit == "µs") unit = "us";
  auto it = units.find(unit);
  if (it == units.end()) {
    std::string known;
    for (const auto& [u, f] : units) known += (known.empty() ? "" : ", ") + u;
    throw Error(fmt::format("{} '{}': unknown unit '{}' (use one of {})", what, text, unit, known));
  }
  if (!(value > 0) || !std::isfinite(value)) throw Error(fmt::format("{} '{}' must be positive", what, text));
  return value * it->second;
}

// Time of one message of `bytes` on a link.
double message_s(const Link& l, double bytes) { return l.latency + bytes / l.bandwidth; }

// An all-to-all over `g` contiguous ranks, `bytes` sent per rank: intra- and inter-node peers
// send in parallel; each peer costs one latency.
double all_to_all_s(const Cluster& c, int g, double bytes) {
  if (g <= 1 || bytes == 0) return 0;
  const int intra_peers = std::min(g, c.ranks_per_node) - 1, inter_peers = g - 1 - intra_peers;
  const Link& intra = c.alltoall_intra.bandwidth > 0 ? c.alltoall_intra : c.intra;
  const double per_peer = bytes / (g - 1);
  return double(g - 1) * std::max(intra.latency, inter_peers ? c.inter.latency : 0.0) +
         std::max(intra_peers * per_peer / intra.bandwidth, inter_peers * per_peer / c.inter.bandwidth);
}

// The slowest hop of a ring of `members` ranks `stride` apart (contiguous placement).
const Link& ring_link(const Cluster& c, int members, int stride) {
  return members * stride <= c.ranks_per_node ? c.intra : c.inter;
}

struct Times {
  double comm = 0, hidden = 0;
};

// A ring of `members` over `link`: forward (members−1) K/V steps, each hidden behind one
// step's compute; backward K/V steps plus dK/dV steps, the last dK/dV hop exposed.
Times ring_times(const Link& link, int members, double kv_bytes, double dkv_bytes, double fwd_compute,
                 double bwd_compute) {
  Times t;
  if (members <= 1) return t;
  const double fstep = fwd_compute / members, bstep = bwd_compute / members;
  const double kv = message_s(link, kv_bytes), dkv = message_s(link, dkv_bytes);
  t.comm = (members - 1) * kv + (members - 1) * kv + members * dkv;
  t.hidden = (members - 1) * std::min(kv, fstep) + (members - 1) * std::min(kv + dkv, bstep);
  return t;
}

PlanRow evaluate(const PlanInput& in, const CpConfig& cfg, const std::string& name) {
  PlanRow r;
  r.config = cfg;
  r.name = name;
  const Shape q{in.batch, in.seq, in.heads, in.head_dim};
  try {
    validate_cp_config(cfg, in.cp, q, in.kv_heads);
  } catch (const Error& e) {
    r.reason = e.what();
    return r;
  }
  r.valid = true;
  const CommVolume v = predicted_comm_volume(cfg, in.cp, q, in.kv_heads, in.dtype);
  r.forward_bytes_per_rank = v.total_forward_bytes();
  r.backward_bytes_per_rank = v.total_backward_bytes();
  for (const auto& [op, n] : v.forward_messages) r.forward_messages += n;
  for (const auto& [op, n] : v.backward_messages) r.backward_messages += n;

  const Cluster& c = in.cluster;
  const double rate = c.peak_flops * c.efficiency;
  const double fwd = attention_forward_flops(in.batch, in.seq, in.seq, in.heads, in.head_dim, in.causal) / in.cp / rate;
  const double bwd = 2.5 * fwd;
  r.compute_s = fwd + bwd;
  const double es = double(dtype_size(in.dtype)), local = double(in.batch) * double(in.seq / in.cp) * double(in.head_dim);
  auto get = [](const std::map<std::string, std::int64_t>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? 0.0 : double(it->second);
  };
  const double qo = 2 * double(in.heads) * local * es, kv = 2 * double(in.kv_heads) * local * es;
  switch (cfg.cp_comm_type) {
    case CpCommType::a2a: {
      r.comm_s = all_to_all_s(c, in.cp, get(v.forward_bytes, "seq_to_head")) + all_to_all_s(c, in.cp, get(v.forward_bytes, "head_to_seq")) +
                 all_to_all_s(c, in.cp, get(v.backward_bytes, "seq_to_head")) + all_to_all_s(c, in.cp, get(v.backward_bytes, "head_to_seq"));
      const double kvs = in.kv_heads % in.cp == 0 ? double(in.kv_heads) : double(in.cp);
      r.memory_bytes = qo + kv + qo + 2 * kvs * local * es;  // + head-sharded copies
      break;
    }
    case CpCommType::p2p: {
      const Times t = ring_times(ring_link(c, in.cp, 1), in.cp, kv, 2 * double(in.kv_heads) * local * 4, fwd, bwd);
      r.comm_s = t.comm;
      r.hidden_s = t.hidden;
      r.memory_bytes = qo + kv + 2 * kv;  // + two K/V ring buffers
      break;
    }
    case CpCommType::all_gather: {
      const Link& l = ring_link(c, in.cp, 1);
      r.comm_s = (in.cp - 1) * (message_s(l, kv) + message_s(l, kv / es * 4));
      r.memory_bytes = qo + kv + double(in.cp) * kv;  // the full K and V
      break;
    }
    case CpCommType::a2a_p2p: {
      const int I = cfg.hierarchical_context_parallel_sizes[0], O = cfg.hierarchical_context_parallel_sizes[1];
      r.comm_s = all_to_all_s(c, I, get(v.forward_bytes, "inner.seq_to_head")) + all_to_all_s(c, I, get(v.forward_bytes, "inner.head_to_seq")) +
                 all_to_all_s(c, I, get(v.backward_bytes, "inner.seq_to_head")) + all_to_all_s(c, I, get(v.backward_bytes, "inner.head_to_seq"));
      const double kvs = in.kv_heads % I == 0 ? double(in.kv_heads) : double(I);
      const double ring_kv = 2 * kvs * local * es;
      const Times t = ring_times(ring_link(c, O, I), O, ring_kv, ring_kv / es * 4, fwd, bwd);
      r.comm_s += t.comm;
      r.hidden_s = t.hidden;
      r.memory_bytes = qo + kv + qo + ring_kv + (O > 1 ? 2 * ring_kv : 0.0);
      break;
    }
  }
  r.predicted_step_s = double(in.layers) * (r.compute_s + r.comm_s - r.hidden_s);
  return r;
}

}  // namespace

double parse_bandwidth(const std::string& text) {
  static const std::map<std::string, double> units{{"B/s", 1.0},  {"KB/s", 1e3},     {"MB/s", 1e6},     {"GB/s", 1e9},
                                                   {"TB/s", 1e12}, {"Gb/s", 1e9 / 8}, {"Tb/s", 1e12 / 8}, {"Mb/s", 1e6 / 8}};
  return parse_quantity(text, units, "bandwidth");
}

double parse_latency(const std::string& text) {
  static const std::map<std::string, double> units{{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  return parse_quantity(text, units, "latency");
}

Plan make_plan(const PlanInput& in) {
  for (auto [name, v] : {std::pair{"seq", in.seq}, {"batch", in.batch}, {"heads", in.heads}, {"kv_heads", in.kv_heads},
                         {"head_dim", in.head_dim}, {"layers", in.layers}, {"cp", std::int64_t(in.cp)},
                         {"ranks_per_node", std::int64_t(in.cluster.ranks_per_node)}})
    if (v <= 0) throw Error(fmt::format("{} must be positive, got {}", name, v));
  if (in.heads % in.kv_heads != 0)
    throw Error(fmt::format("heads ({}) must be divisible by kv_heads ({})", in.heads, in.kv_heads));
  if (!(in.cluster.peak_flops > 0) || !(in.cluster.efficiency > 0) || in.cluster.efficiency > 1)
    throw Error("the compute rate must be positive and the efficiency in (0, 1]");
  Plan p;
  p.rows.push_back(evaluate(in, {CpCommType::a2a, {}, in.causal, 0.0f}, "a2a"));
  p.rows.push_back(evaluate(in, {CpCommType::p2p, {}, in.causal, 0.0f}, "p2p"));
  p.rows.push_back(evaluate(in, {CpCommType::all_gather, {}, in.causal, 0.0f}, "all_gather"));
  for (int inner = 1; inner <= in.cp; ++inner)
    if (in.cp % inner == 0)
      p.rows.push_back(evaluate(in, {CpCommType::a2a_p2p, {inner, in.cp / inner}, in.causal, 0.0f},
                                fmt::format("a2a+p2p [{},{}]", inner, in.cp / inner)));
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    if (!r.valid) continue;
    if (p.best < 0) {
      p.best = int(i);
      continue;
    }
    const PlanRow& b = p.rows[std::size_t(p.best)];
    // Faster wins; within 2 % the one with less memory, then the simpler (listed first).
    if (r.predicted_step_s < 0.98 * b.predicted_step_s ||
        (r.predicted_step_s < 1.02 * b.predicted_step_s && r.memory_bytes < 0.9 * b.memory_bytes))
      p.best = int(i);
  }
  if (p.best < 0) {
    p.recommendation = "no strategy is valid for this shape: " + p.rows[1].reason;
    return p;
  }
  const PlanRow& b = p.rows[std::size_t(p.best)];
  const double exposed = b.comm_s - b.hidden_s;
  p.recommendation = fmt::format("{}: {:.3g} s per step, {:.0f}% of it attention compute; {:.3g} ms of communication "
                                 "per layer, {:.0f}% hidden",
                                 b.name, b.predicted_step_s, 100 * b.compute_s / (b.compute_s + exposed),
                                 b.comm_s * 1e3, b.comm_s > 0 ? 100 * b.hidden_s / b.comm_s : 100.0);
  if (!p.rows[0].valid) p.recommendation += "; a2a is ruled out: " + p.rows[0].reason;
  int second = -1;
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (int(i) != p.best && p.rows[i].valid &&
        (second < 0 || p.rows[i].predicted_step_s < p.rows[std::size_t(second)].predicted_step_s))
      second = int(i);
  if (second >= 0) {
    const double diff = 100 * (p.rows[std::size_t(second)].predicted_step_s / b.predicted_step_s - 1);
    p.recommendation += std::abs(diff) < 2.0
                            ? fmt::format("; {} is within 2% (a tie: the first listed, simpler strategy wins)",
                                          p.rows[std::size_t(second)].name)
                            : fmt::format("; next: {} ({:+.1f}%)", p.rows[std::size_t(second)].name, diff);
  }
  return p;
}

}  // namespace ulysses
