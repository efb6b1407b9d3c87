#include "ulysses/plan/plan_inference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ulysses/core/error.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

namespace {

// generate's ring prefill leaves the prompt's chunks in place: the planner's contiguous ring.
constexpr const char* kNoZigzag = " --no-zigzag";
constexpr const char* kContiguousRing = "p2p --no-zigzag";

// One layer of a decode step for `batch` requests over `context` tokens on the busiest rank.
struct StepCost {
  double read_s = 0, compute_s = 0, comm_s = 0, kv_bytes = 0;
  double bandwidth = 0;  // the rate the cache and the row's weights are read at
};

// The busiest rank's query and KV heads under `layout` at `cp` (an uneven Ulysses split gives
// some ranks one more head; interleaved: all of them).
struct LayoutHeads {
  double q = 0, kv = 0;
};
LayoutHeads layout_heads(const PlanInput& in, KvLayout layout, int cp) {
  if (layout == KvLayout::interleaved || cp == 1) return {double(in.heads), double(in.kv_heads)};
  LayoutHeads h;
  for (int r = 0; r < cp; ++r) {
    const RankHeads rh = ulysses_heads(cp, r, in.heads, in.kv_heads);
    h.q = std::max(h.q, double(rh.q.count));
    h.kv = std::max(h.kv, double(rh.kv.count));
  }
  return h;
}

// `layout` at `cp` ranks (cp 1: the unsharded cache): its reads, its flops, and its one allgatherv.
// The rate a step reads its cache at: the last-level cache's when the node's caches and the row's
// weights fit in it (steps re-read them), else the memory's.
double read_bandwidth(const PlanInput& in, const DecodeModel& m, int cp, double rank_cache_bytes) {
  const double ranks_here = double(std::min(cp, std::max(1, in.cluster.ranks_per_node)));
  const double node = ranks_here * (rank_cache_bytes + row_weights(in, m) * double(dtype_size(in.dtype)));
  return m.llc_bytes > 0 && m.llc_bandwidth > 0 && node <= m.llc_bytes ? m.llc_bandwidth
                                                                       : in.cluster.kernel.memory_bandwidth;
}

StepCost step_cost(const PlanInput& in, const DecodeModel& m, KvLayout layout, int cp, const LayoutHeads& h,
                   double batch, std::int64_t context) {
  const double e = double(dtype_size(in.dtype)), d = double(in.head_dim);
  const double rows = double(kv_rows(layout, context, cp, 0));  // rank 0 holds the most
  const bool by_heads = layout == KvLayout::heads;
  StepCost c;
  c.kv_bytes = 2 * rows * h.kv * d * e;  // per request, one layer
  const double bw = c.bandwidth = read_bandwidth(in, m, cp, double(in.layers) * batch * c.kv_bytes);
  c.read_s = bw > 0 ? batch * c.kv_bytes / bw : 0;
  c.compute_s = m.kernel_measured ? 0 : 4 * d * h.q * rows * batch / (in.cluster.peak_flops * in.cluster.efficiency);
  if (cp > 1) {
    // A ring allgatherv: cp − 1 hops of one rank's part (its heads' outputs; interleaved: every
    // head's partial output and its float32 LSE).
    const double part = batch * h.q * (d * e + (by_heads ? 0.0 : 4.0));
    c.comm_s = m.collective_s > 0 ? m.collective_s : (cp - 1) * message_seconds(ring_link(in.cluster, cp, 1), part);
  }
  return c;
}

// The rows' own work of one step: their FLOPs at the row rate (the layers' at the batch's own
// measured rate when calibrated; the LM head, one product a request, at the one-row rate), or
// their weights' one read at `bw` (the cache's rate: both stay in the last-level cache or
// neither) when that is slower (a large model at small batch).
double row_seconds(const PlanInput& in, const DecodeModel& row, double batch, double bw) {
  if (row.width <= 0) return 0;
  const double rate = row.flops_per_s > 0 ? row.flops_per_s : in.cluster.peak_flops * in.cluster.efficiency;
  const double weights_s = bw > 0 ? row_weights(in, row) * double(dtype_size(in.dtype)) / bw : 0;
  const double head_flops = 2 * double(row.width) * double(row.vocab);
  const double token_s = row.batch_token_s > 0 ? row.batch_token_s + head_flops / rate : row_flops(in, row) / rate;
  return std::max(batch * token_s, weights_s);
}

// What each of `layout`'s requests adds to a layer beyond its read (cp 1: the unsharded cache's).
double request_seconds(const DecodeModel& m, KvLayout layout, int cp) {
  if (cp == 1) return m.request_s.unsharded;
  return layout == KvLayout::heads ? m.request_s.heads : m.request_s.interleaved;
}

// One step's fixed costs beyond its reads, all layers: the layer's kernel call and each request's.
double calls_seconds(const PlanInput& in, const DecodeModel& m, KvLayout layout, int cp, double batch) {
  return double(in.layers) * (in.cluster.kernel.call_s + batch * request_seconds(m, layout, cp));
}

double step_seconds(const PlanInput& in, const DecodeModel& row, KvLayout layout, int cp, const LayoutHeads& h,
                    double batch, std::int64_t context) {
  const StepCost c = step_cost(in, row, layout, cp, h, batch, context);
  return double(in.layers) * (std::max(c.read_s, c.compute_s) + c.comm_s) + calls_seconds(in, row, layout, cp, batch) +
         row_seconds(in, row, batch, c.bandwidth);
}

// The least x in [1, 2^30] with wins(x) (monotone: sharding saves per request and per token what
// it pays once per step), 0 when none.
template <class F>
std::int64_t least(F wins) {
  const std::int64_t top = std::int64_t(1) << 30;
  if (!wins(top)) return 0;
  std::int64_t lo = 0, hi = top;  // wins(hi), !wins(lo) (or lo = 0)
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (wins(mid) ? hi : lo) = mid;
  }
  return hi;
}

DecodeRow decode_row(const PlanInput& in, const DecodeModel& row, KvLayout layout, int cp) {
  DecodeRow r;
  r.layout = cp == 1 ? "cp = 1" : to_string(layout);
  r.cp = cp;
  r.reason = kv_layout_error(layout, {in.layers, in.heads, in.kv_heads, in.head_dim, in.seq}, cp);
  r.replication = layout == KvLayout::heads && in.kv_heads < cp ? cp / in.kv_heads : 1;
  const double batch = double(in.batch);
  const LayoutHeads heads = layout_heads(in, layout, cp);
  const StepCost c = step_cost(in, row, layout, cp, heads, batch, in.seq);
  const double layers = double(in.layers);
  r.kv_bytes = layers * batch * c.kv_bytes;
  if (r.reason.empty() && in.max_memory_bytes > 0 && r.kv_bytes > in.max_memory_bytes)
    r.reason = fmt::format("memory: the cache needs {:.4g} GB per rank, over the cap of {:.4g} GB", r.kv_bytes / 1e9,
                           in.max_memory_bytes / 1e9);
  r.valid = r.reason.empty();
  if (!r.valid) return r;
  r.read_s = layers * c.read_s;
  r.compute_s = layers * c.compute_s;
  r.comm_s = layers * c.comm_s;
  r.collectives = cp > 1 ? in.layers : 0;
  r.row_s = row_seconds(in, row, batch, c.bandwidth);
  r.calls_s = calls_seconds(in, row, layout, cp, batch);
  r.step_s = step_seconds(in, row, layout, cp, heads, batch, in.seq);
  r.tokens_per_s = r.step_s > 0 ? batch / r.step_s : 0;
  if (cp == 1) return r;
  const LayoutHeads all = layout_heads(in, layout, 1);
  auto faster = [&](double b, std::int64_t s) {
    return step_seconds(in, row, layout, cp, heads, b, s) < step_seconds(in, row, layout, 1, all, b, s);
  };
  r.crossover_batch = least([&](std::int64_t b) { return faster(double(b), in.seq); });
  r.crossover_context = least([&](std::int64_t s) { return faster(batch, std::max<std::int64_t>(s, cp)); });
  return r;
}

std::string crossover_text(const DecodeRow& r, const PlanInput& in) {
  auto one = [](std::int64_t x, const char* what) {
    return x == 0   ? fmt::format("never below 2^30 {}", what)
           : x == 1 ? fmt::format("from 1 {}", what)
                    : fmt::format("from {} {}", x, what);
  };
  return fmt::format("{} pays at {} tokens of context {}; at {} request(s) {}", r.layout, in.seq,
                     one(r.crossover_batch, "concurrent requests"), in.batch, one(r.crossover_context, "tokens"));
}

// The prefill path `name` at `cp`: the strategies' table's row `strategy` (forward only, the
// prefill's kernel rate when calibrated), and the busiest rank's prompt rows.
PrefillRow prefill_row(const PlanInput& in, const DecodeModel& m, const char* name, int cp,
                       const std::string& strategy) {
  PlanInput p = in;
  p.mode = PlanMode::prefill;
  p.cp = cp;
  if (m.prefill_flops > 0) p.cluster.peak_flops = m.prefill_flops, p.cluster.efficiency = 1;
  PrefillRow r;
  r.prefill = name;
  r.cp = cp;
  const Plan plan = make_plan(p);
  // The table has no --no-zigzag twin where the layout changes neither balance nor time (full
  // attention and cross-attention are contiguous already): then its p2p row prices that ring.
  auto it = std::find_if(plan.rows.begin(), plan.rows.end(), [&](const PlanRow& x) { return x.name == strategy; });
  if (it == plan.rows.end() && strategy == kContiguousRing)
    it = std::find_if(plan.rows.begin(), plan.rows.end(),
                      [&](const PlanRow& x) { return x.name + kNoZigzag == kContiguousRing; });
  if (it == plan.rows.end() || !it->valid) {
    r.reason = it == plan.rows.end() ? fmt::format("no {} row at cp = {}", strategy, cp) : it->reason;
    return r;
  }
  r.valid = true;
  r.attention_s = it->predicted_step_s;
  const double rate = m.flops_per_s > 0 ? m.flops_per_s : in.cluster.peak_flops * in.cluster.efficiency;
  const double tokens = double(in.batch) * std::ceil(double(in.seq) / double(cp));
  const double lm_head = m.width > 0 ? double(in.batch) * 2 * double(m.width) * double(m.vocab) / rate : 0;
  r.rows_s = tokens * prefill_token_seconds(in, m) + lm_head;
  r.ttft_s = r.attention_s + r.rows_s;
  return r;
}

// "" when the row's model can price a step, else what is wrong with it.
std::string decode_model_error(const DecodeModel& m) {
  const DecodeModel::RequestCost& q = m.request_s;
  if (m.width < 0 || (m.width > 0 && (m.hidden < 1 || m.vocab < 1)) || !(m.flops_per_s >= 0) || !(m.llc_bytes >= 0) ||
      !(m.llc_bandwidth >= 0) || !(m.collective_s >= 0) || !(m.prefill_token_s >= 0) || !(m.prefill_flops >= 0))
    return fmt::format(
        "the row's model needs width >= 0 and, with a width, hidden >= 1 and vocab >= 1 and a "
        "rate, cache bytes, cache bandwidth, collective and prefill figures >= 0; got width {}, hidden {}, "
        "vocab {}, rate {}, {}, {}, {}, prefill {}, {}",
        m.width, m.hidden, m.vocab, m.flops_per_s, m.llc_bytes, m.llc_bandwidth, m.collective_s, m.prefill_token_s,
        m.prefill_flops);
  if (!(m.batch_token_s >= 0) || !std::isfinite(m.batch_token_s) || m.batch_rows < 0 ||
      (m.batch_token_s > 0) != (m.batch_rows > 0))
    return fmt::format(
        "the rows at the batch need seconds a token >= 0 and finite, measured on rows >= 1 (both 0: not "
        "measured); got {} s on {} rows",
        m.batch_token_s, m.batch_rows);
  for (double x : {q.unsharded, q.heads, q.interleaved})
    if (!(x >= 0) || !std::isfinite(x))
      return fmt::format("a request's seconds a layer must be >= 0 and finite; got {}, {} (heads), {} (interleaved)",
                         q.unsharded, q.heads, q.interleaved);
  return "";
}

}  // namespace

double prefill_token_seconds(const PlanInput& in, const DecodeModel& row) {
  if (row.prefill_token_s > 0) return row.prefill_token_s;
  if (row.width <= 0) return 0;
  const double rate = row.flops_per_s > 0 ? row.flops_per_s : in.cluster.peak_flops * in.cluster.efficiency;
  return (row_flops(in, row) - 2 * double(row.width) * double(row.vocab)) / rate;
}

std::vector<std::pair<std::int64_t, std::int64_t>> row_products(const PlanInput& in, const DecodeModel& row) {
  if (row.width <= 0) return {};
  const std::int64_t C = row.width, QD = in.heads * in.head_dim, KD = in.kv_heads * in.head_dim, F = row.hidden;
  return {{C, QD}, {C, KD}, {C, KD}, {QD, C}, {C, F}, {C, F}, {F, C}, {C, row.vocab}};
}

double row_weights(const PlanInput& in, const DecodeModel& row) {
  const auto products = row_products(in, row);
  double layer = 0;
  for (std::size_t i = 0; i + 1 < products.size(); ++i) layer += double(products[i].first) * double(products[i].second);
  // In double like the layers' products: width x vocab in int64 wrapped (2^32 x 2^32 priced the LM head at 0).
  return products.empty() ? 0
                          : double(in.layers) * layer + double(products.back().first) * double(products.back().second);
}

double row_flops(const PlanInput& in, const DecodeModel& row) { return 2 * row_weights(in, row); }

DecodePlan plan_decode(const PlanInput& in, const DecodeModel& row) {
  if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
  if (const std::string err = decode_model_error(row); !err.empty()) throw Error(err);
  DecodePlan p;
  p.rows.push_back(decode_row(in, row, KvLayout::heads, 1));
  if (in.cp > 1)
    for (KvLayout l : {KvLayout::heads, KvLayout::interleaved}) p.rows.push_back(decode_row(in, row, l, in.cp));
  // generate's prefills: `ulysses` is the a2a strategy (CpConfig's default cp_comm_type), `ring`
  // the p2p strategy's contiguous ring (the planner's row of it, as the prefill leaves the
  // prompt's chunks in place).
  const std::string ulysses = CpConfig().cp_comm_type;
  p.prefill.push_back(prefill_row(in, row, "cp = 1", 1, ulysses));
  if (in.cp > 1)
    for (auto [name, strategy] : {std::pair<const char*, std::string>{"ulysses", ulysses}, {"ring", kContiguousRing}})
      p.prefill.push_back(prefill_row(in, row, name, in.cp, strategy));
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].valid && (p.best < 0 || p.rows[i].step_s < (1 - kPlanTieBand) * p.rows[std::size_t(p.best)].step_s))
      p.best = int(i);
  if (p.best < 0) {
    p.recommendation = "no layout holds this cache: " + p.rows.front().reason;
    return p;
  }
  const DecodeRow& b = p.rows[std::size_t(p.best)];
  p.recommendation = fmt::format("{}: {:.3g} ms per output token, {:.4g} tokens/s ({:.0f}% reading the cache)",
                                 b.layout, b.step_s * 1e3, b.tokens_per_s,
                                 b.step_s > 0 ? 100 * std::max(b.read_s, b.compute_s) / b.step_s : 0.0);
  for (const DecodeRow& r : p.rows)
    if (r.cp > 1 && r.valid) p.recommendation += "; " + crossover_text(r, in);
  for (const DecodeRow& r : p.rows)
    if (!r.valid && r.reason.rfind("memory", 0) == 0) p.recommendation += "; " + r.layout + " refused by " + r.reason;
  return p;
}

TurnPlan plan_turn(const PlanInput& in, std::int64_t cached) {
  if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
  if (cached < 0) throw Error(fmt::format("cached tokens must not be negative, got {}", cached));
  // seq + cached wrapped past int64 (a negative context, negative bytes); the cache's bytes are
  // held to what plan_input_error allows a sequence's.
  std::int64_t context = 0;
  if (__builtin_add_overflow(in.seq, cached, &context) ||
      double(in.batch) * double(context) * 64 * double(std::max(in.heads, in.kv_heads)) * double(in.head_dim) >= 9.2e18)
    throw Error(fmt::format(
        "the turn is too large to plan: batch x (cached + new tokens) x heads x head_dim = {} x ({} + {}) x {} x {} "
        "does not fit 64 bits with room for byte counts",
        in.batch, cached, in.seq, std::max(in.heads, in.kv_heads), in.head_dim));
  TurnPlan t;
  t.turn = in.seq;
  t.cached = cached;
  const double e = double(dtype_size(in.dtype)), d = double(in.head_dim), cp = double(in.cp);
  const double total = double(in.seq + cached), hops = cp - 1, b = double(in.batch);
  // Every rank's shard travels cp − 1 hops: the context's K and V, or the new tokens' queries
  // (and back, their partial outputs with a float32 LSE per head).
  t.pass_kv_bytes = hops * b * std::ceil(total / cp) * 2 * double(in.kv_heads) * d * e;
  t.pass_q_bytes = hops * b * std::ceil(double(in.seq) / cp) * double(in.heads) * (2 * d * e + 4);
  // The new queries see every cached key and the causal half of their own.
  const double pairs = b * double(in.heads) * double(in.seq) * (double(cached) + double(in.seq + 1) / 2);
  const double compute = 4 * d * pairs / cp / (in.cluster.peak_flops * in.cluster.efficiency);
  const Link link = ring_link(in.cluster, in.cp, 1);
  auto seconds = [&](double bytes) {
    const double comm = in.cp > 1 ? hops * message_seconds(link, bytes / std::max(hops, 1.0)) : 0;
    return double(in.layers) * (compute + std::max(0.0, comm - compute * hops / cp));
  };
  t.pass_kv_s = seconds(t.pass_kv_bytes);
  t.pass_q_s = seconds(t.pass_q_bytes);
  t.rule_prefers_pass_q = double(in.seq) / total < 2 * double(in.kv_heads) / double(in.heads);
  t.choice = fmt::format(
      "{}: T/(T+P) = {}/{} = {:.3f} {} 2*kv_heads/heads = {:.3f} (Meta's rule); bytes per rank "
      "{:.3g} MB (pass-KV) vs {:.3g} MB (pass-Q)",
      t.rule_prefers_pass_q ? "pass-Q" : "pass-KV", in.seq, in.seq + cached, double(in.seq) / total,
      t.rule_prefers_pass_q ? "<" : ">=", 2 * double(in.kv_heads) / double(in.heads), t.pass_kv_bytes / 1e6,
      t.pass_q_bytes / 1e6);
  return t;
}

}  // namespace ulysses
