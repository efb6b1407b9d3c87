// cp_comm_type "a2a+p2p": hierarchical context parallelism (Megatron / TransformerEngine).
// hierarchical_context_parallel_sizes = {inner, outer}, inner·outer == cp: Ulysses inside
// groups of `inner` contiguous ranks (typically a node: fast all-to-all), a ring across the
// `outer` groups of strided ranks (one ring per inner position: slow links carry only K/V).
//
// forward:  seq_to_head inside the group → ring attention over the outer group on the
//           group's whole sequence and its inner rank's heads (ulysses_heads over `inner`:
//           h/inner when they split evenly) → head_to_seq inside the group.
// backward: the mirror image. Q, K, V and dO stay in the storage dtype, in the all-to-alls,
// on the ring and in the kernels (bf16: the level's bf16 engine); out and the gradients are
// float32 across ring steps, rounded to the storage dtype once, for the inner all-to-all back.
// Cross-attention (k/v of s_k tokens): q and k|v in separate inner all-to-alls (their token
// counts differ, as in a2a); the outer ring moves the groups' K/V chunks over s_k, the queries
// at q_offset + their positions.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <functional>
#include <map>
#include <numeric>
#include <span>
#include <string>

#include "../ring_attention.hpp"
#include "builtin.hpp"
#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/ulysses_heads.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses {

namespace {

struct HierarchicalContext final : StrategyContext {
  FusedHeads qkv, out_heads;  // head-sharded inside the inner group: storage dtype, out float32
  FusedHeads kv;              // cross-attention: k | v apart (storage dtype); qkv holds q only
  TensorView k() const { return kv.num_parts() ? kv.part(0) : qkv.part(1); }
  TensorView v() const { return kv.num_parts() ? kv.part(1) : qkv.part(2); }
  RingSaved ring;                    // the outer ring's (points into qkv and out_heads)
  std::vector<std::int64_t> tokens;  // every inner rank's query tokens
  HeadSplit heads;                   // every inner rank's query and KV heads
  DType dtype = DType::f32;          // storage / wire dtype
  Communicator* inner = nullptr;
  Communicator* outer = nullptr;
};

// The groups it splits cp ranks into, I per inner group: the inner groups contiguous, each
// outer ring of one rank per inner group. The forward splits them, the traffic declares them.
std::map<std::string, Subgroup> subgroups(int I, int cp) { return {{"inner", {I, 1}}, {"outer", {cp / I, I}}}; }

// The token counts of the inner group of `rank`'s members, in inner rank order.
std::vector<std::int64_t> inner_tokens(const std::vector<std::vector<SeqChunk>>& per_rank, int inner, int rank) {
  std::vector<std::int64_t> tokens;
  for (int r = rank / inner * inner; r < rank / inner * inner + inner; ++r)
    tokens.push_back(total_tokens(per_rank[std::size_t(r)]));
  return tokens;
}

// The unchecked transposes, waited for: the inputs arrive validated and agreed (the Strategy
// contract), so the inner group adds no collective of its own before its all-to-all.
FusedHeads seq_to_head_in(Communicator& inner, std::span<const SeqShard> inputs,
                          const std::vector<std::int64_t>& tokens) {
  FusedHeads out;
  post_seq_to_head(inner, inputs, tokens, out).wait();
  return out;
}

// What a2a+p2p's traffic reads of `rank` (its traffic_key): its tokens and its inner group's
// (q), its query and KV head counts, the next group's K/V tokens, under cross-attention its and
// its group's K/V tokens (and under a halo, traffic_key adds its outer member's counts from
// kHaloAt). held(first, ranks, seq): tokens_held's count, asked per rank or read from every
// rank's at once.
constexpr std::size_t kHaloAt = 7;
using TokensHeld = std::function<std::int64_t(int, int, std::int64_t)>;
Strategy::TrafficKey ring_key(const CpConfig& config, int rank, const Shape& q, std::int64_t kv_seq,
                              std::int64_t kv_heads, const TokensHeld& held) {
  const int I = config.hierarchical_context_parallel_sizes[0], O = config.hierarchical_context_parallel_sizes[1];
  const int group = rank / I;
  const RankHeads mine = ulysses_heads(I, rank % I, q.h, kv_heads);
  const bool cross = is_cross(config, q.s, kv_seq);
  Strategy::TrafficKey key{held(rank, 1, q.s),
                           held(group * I, I, q.s),
                           mine.q.count,
                           mine.kv.count,
                           held((group + 1) % O * I, I, kv_seq),
                           cross ? held(rank, 1, kv_seq) : 0,
                           cross ? held(group * I, I, kv_seq) : 0};
  return key;
}

// The inner group's all-to-alls of the rank whose ring_key is `key`.
void add_inner_volume(CommVolume& v, const CpConfig& config, const Strategy::TrafficKey& key, const Shape& q,
                      std::int64_t kv_seq, std::int64_t kv_heads, std::int64_t es) {
  const int I = config.hierarchical_context_parallel_sizes[0];
  const RankHeads mine{{0, key[2]}, {0, key[3]}};  // the volumes read the counts alone
  if (is_cross(config, q.s, kv_seq))
    add_ulysses_cross_volume(v, "inner.", I, key[0], key[1], key[5], key[6], mine, q.h,
                             ulysses_kv_heads_held(I, kv_heads), q.b * q.d * es);
  else
    add_ulysses_volume(v, "inner.", I, key[0], key[1], mine, q.h, ulysses_kv_heads_held(I, kv_heads), q.b * q.d * es);
}

// For the outer ring: member o holds, after the inner all-to-all, the chunks of inner
// ranks o·inner + 0 .. o·inner + inner−1, in that order.
std::vector<std::vector<SeqChunk>> outer_chunks(const std::vector<std::vector<SeqChunk>>& per_rank, int inner) {
  std::vector<std::vector<SeqChunk>> c(per_rank.size() / std::size_t(inner));
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    c[r / std::size_t(inner)].insert(c[r / std::size_t(inner)].end(), per_rank[r].begin(), per_rank[r].end());
  return c;
}

// The visible (query, key) pairs of rank r's own tokens against all kv_seq keys, one head.
std::int64_t own_pairs(const CpConfig& config, int cp, int r, std::int64_t s, std::int64_t kv_seq) {
  const AttentionParams params = attention_params(config);
  std::int64_t pairs = 0;
  for (const SeqChunk& c : rank_chunks(config, cp, r, s))
    pairs += visible_pairs(params, {params.q_offset + c.begin, c.length}, {0, kv_seq});
  return pairs;
}

// The kernel calls of the busiest rank's forward on the busiest inner rank's heads. O > 1: O ring
// steps over chunks of s/(2·O) (zigzag) or s/O tokens, each merged. O = 1 runs the same ring over
// one member: a call per visible pair of the group's n chunks (2 per rank zigzagged, else 1),
// each merged, where plain a2a makes one call. Under KernelModel::ring_pair_calls (this library's
// ring) O > 1 counts a call per visible pair of the members' 2·I (zigzag) or I chunks too.
KernelCalls ring_calls(const PlanInput& in, const CpConfig& config, int I, int O) {
  const HeadSplit split = ulysses_head_split(I, in.heads, in.kv_heads);
  const bool zz = token_layout(config) != TokenLayout::contiguous;
  const double b = double(in.batch), s = double(in.seq), sk = double(kv_seq_of(in));
  const double q_heads = b * double(most_heads(split.q)), kv_heads = b * double(most_heads(split.kv));
  if (O == 1) {
    const double n = double(I) * (zz ? 2 : 1), pairs = config.causal ? n * (n + 1) / 2 : n * n;
    return {std::int64_t(pairs), s / n, sk / n, q_heads, kv_heads, config.causal ? 1 / n : 0.0, true, sk / n};
  }
  if (counts_ring_pairs(in))
    return ring_pair_calls(in, O, std::int64_t(I) * (zz ? 2 : 1), zz, config.causal, q_heads, kv_heads);
  const double chunk = sk / O / (zz ? 2 : 1), share = config.causal ? (zz ? 1.0 : 0.5) / O : 0;
  return {O, s / O, chunk, q_heads, kv_heads, share, true, sk / O};
}

class A2aP2pStrategy final : public Strategy {
 public:
  using Strategy::Strategy;

  std::vector<StrategyOption> options() const override {
    return {{"cp-sizes", "INNER,OUTER", "hierarchical_context_parallel_sizes INNER,OUTER",
             "hierarchical_context_parallel_sizes", "empty", 0, "INNER * OUTER == {} (ranks)",
             [](const CpConfig& c) {
               const auto& hs = c.hierarchical_context_parallel_sizes;
               return std::vector<std::int64_t>(hs.begin(), hs.end());
             },
             [](CpConfig& c, const std::vector<std::int64_t>& v) {
               c.hierarchical_context_parallel_sizes.assign(v.begin(), v.end());
             }},
            per_document_option()};
  }
  std::string describe(const CpConfig& config, int, std::int64_t) const override {
    const auto& hs = config.hierarchical_context_parallel_sizes;
    if (hs.size() != 2) return "";
    return fmt::format(
        "  hierarchical_context_parallel_sizes [{}, {}]: Ulysses in groups of {} contiguous ranks, ring over {}{}\n",
        hs[0], hs[1], hs[0], hs[1],
        hs[0] == 1   ? " (inner 1: this is plain p2p)"
        : hs[1] == 1 ? " (outer 1: this is plain a2a)"
                     : "");
  }

  void validate(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads) const override {
    const auto& hs = config.hierarchical_context_parallel_sizes;
    if (hs.size() != 2 || hs[0] < 1 || hs[1] < 1 || hs[0] * hs[1] != cp)
      throw Error(
          fmt::format("a2a+p2p needs hierarchical_context_parallel_sizes = [inner, outer] with "
                      "inner * outer == cp ({}), got [{}]",
                      cp, fmt::join(hs, ", ")));
    check_ulysses_heads(hs[0], q.h, kv_heads, "the inner (a2a) size", "a2a+p2p");
  }
  // Ulysses keeps as much of its inner size as divides the group (the all-to-all stays inside a
  // node); the ring takes the rest.
  CpConfig config_for_size(const CpConfig& config, int cp) const override {
    CpConfig c = config;
    if (!c.hierarchical_context_parallel_sizes.empty()) {
      const int inner = std::gcd(c.hierarchical_context_parallel_sizes[0], cp);
      c.hierarchical_context_parallel_sizes = {inner, cp / inner};
    }
    return c;
  }
  RankHeads heads_of(const CpConfig& config, int, int rank, std::int64_t heads, std::int64_t kv_heads) const override {
    const int I = config.hierarchical_context_parallel_sizes[0];
    return ulysses_heads(I, rank % I, heads, kv_heads);
  }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>& q_chunks,
                                           const std::vector<std::vector<SeqChunk>>& kv_chunks, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    return run_forward(group, config, is_cross(config, q_chunks, kv_chunks), q_chunks, kv_chunks, out, q, k, v, stats);
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    Communicator& comm = group.comm();
    const auto& ctx = static_cast<const HierarchicalContext&>(context);
    const std::array<SeqShard, 1> g{{{dout, ctx.heads.q}}};
    double t0 = comm.now();
    const FusedHeads hdout = seq_to_head_in(*ctx.inner, g, ctx.tokens);
    stats.comm_exposed_s += comm.now() - t0;
    const FusedHeads& x = ctx.qkv;
    const bool cross = ctx.kv.num_parts() > 0;
    const std::int64_t hkv = ctx.k().shape.h;
    FusedHeads grads(DType::f32, x.batch(), x.rank_tokens(), x.head_dim(),
                     cross ? std::vector<std::int64_t>{x.local_heads(0)}
                           : std::vector<std::int64_t>{x.local_heads(0), hkv, hkv},
                     nullptr, x.device());
    FusedHeads kv_grads =
        cross ? FusedHeads(DType::f32, x.batch(), ctx.kv.rank_tokens(), x.head_dim(), {hkv, hkv}, nullptr, x.device())
              : FusedHeads();
    const FusedHeads& gkv = cross ? kv_grads : grads;
    const int first_kv = cross ? 0 : 1;
    ring_attention_backward(*ctx.outer, grads.part(0), gkv.part(first_kv), gkv.part(first_kv + 1), hdout.part(0),
                            ctx.ring, stats);
    t0 = comm.now();
    const std::array<SeqShard, 3> out{{{dq, ctx.heads.q}, {dk, ctx.heads.kv}, {dv, ctx.heads.kv}}};
    const std::span<const SeqShard> all(out);
    if (cross) head_to_seq_in(*ctx.inner, kv_grads, all.last(2), ctx.dtype);
    head_to_seq_in(*ctx.inner, grads, cross ? all.first(1) : all, ctx.dtype);
    stats.comm_exposed_s += comm.now() - t0;
    group.absorb();
  }

  // The inner group's query tokens (every rank of it, at q_offset) against every key, on this
  // rank's heads.
  std::int64_t work(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                    std::int64_t kv_heads) const override {
    const int I = config.hierarchical_context_parallel_sizes[0], first = rank / I * I;
    std::int64_t pairs = 0;
    for (int r = first; r < first + I; ++r) pairs += own_pairs(config, cp, r, q.s, kv_seq);
    return pairs * q.b * heads_of(config, cp, rank, q.h, kv_heads).q.count;
  }

  // Every rank's work with each inner group's pairs counted once (work() counts them per member:
  // cp × I chunk scans, where the planner asks all cp ranks), the layout's chunks listed once.
  std::vector<std::int64_t> work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                          std::int64_t kv_heads) const override {
    const int I = config.hierarchical_context_parallel_sizes[0];
    const std::vector<std::int64_t> own = pairs_of_ranks(config, cp, q.s, kv_seq);
    std::vector<std::int64_t> w(static_cast<std::size_t>(cp));
    for (int first = 0; first < cp; first += I) {
      std::int64_t pairs = 0;
      for (int r = first; r < first + I; ++r) pairs += own[std::size_t(r)];
      for (int r = first; r < first + I; ++r)
        w[std::size_t(r)] = pairs * q.b * heads_of(config, cp, r, q.h, kv_heads).q.count;
    }
    return w;
  }

  // Inner group g = rank / I holds the tokens of ranks [g·I, g·I + I); after the inner
  // all-to-all, outer member g of this rank's ring holds all of them, on this rank's heads.
  // Cross-attention: the inner transposes of q and k|v apart, the ring's K/V over s_k.
  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                     std::int64_t kv_heads, DType dtype) const override {
    return keyed_traffic(config, cp, rank, traffic_key(config, cp, rank, q, kv_seq, kv_heads), q, kv_seq, kv_heads,
                         dtype);
  }
  // This reads `rank` through its traffic_key alone.
  CommVolume keyed_traffic(const CpConfig& config, int cp, int, const TrafficKey& key, const Shape& q,
                           std::int64_t kv_seq, std::int64_t kv_heads, DType dtype) const override {
    const int I = config.hierarchical_context_parallel_sizes[0], O = config.hierarchical_context_parallel_sizes[1];
    const std::int64_t es = std::int64_t(dtype_size(dtype));
    CommVolume v;
    v.groups = subgroups(I, cp);
    add_inner_volume(v, config, key, q, kv_seq, kv_heads, es);
    const std::int64_t per_token = 2 * q.b * key[3] * q.d;  // K and V of this rank's KV heads
    if (uses_halo(config)) {                                // outer member g holds its inner group's chunks
      add_halo_volume(v, "outer.", halo_of(key, kHaloAt), per_token, es);
      return v;
    }
    add_ring_volume(v, "outer.", O, per_token * kv_seq, per_token * key[4], es);
    return v;
  }
  TrafficKey traffic_key(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                         std::int64_t kv_heads) const override {
    TrafficKey key = ring_key(config, rank, q, kv_seq, kv_heads, [&](int first, int ranks, std::int64_t seq) {
      return tokens_held(config, cp, first, ranks, seq);
    });
    const int I = config.hierarchical_context_parallel_sizes[0];
    if (uses_halo(config)) put_halo_key(key, kHaloAt, halo_counts(config, cp, I, rank / I, q.s));
    return key;
  }
  std::vector<TrafficKey> traffic_keys(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                       std::int64_t kv_heads) const override {
    std::map<std::int64_t, std::vector<std::int64_t>> below;  // per length: tokens of the ranks below each rank
    for (const std::int64_t seq : {q.s, kv_seq}) {
      if (below.count(seq)) continue;
      std::vector<std::int64_t>& b = below[seq] = {0};
      for (const std::int64_t n : tokens_of_ranks(config, cp, seq)) b.push_back(b.back() + n);
    }
    const TokensHeld held = [&](int first, int ranks, std::int64_t seq) {
      const std::vector<std::int64_t>& b = below.at(seq);
      return b[std::size_t(first + ranks)] - b[std::size_t(first)];
    };
    std::vector<TrafficKey> keys(static_cast<std::size_t>(cp));
    for (int r = 0; r < cp; ++r) keys[std::size_t(r)] = ring_key(config, r, q, kv_seq, kv_heads, held);
    const int I = config.hierarchical_context_parallel_sizes[0];
    if (uses_halo(config)) {  // one outer member's counts for its I ranks
      const std::vector<HaloCounts> h = members_halo_counts(config, cp, I, q.s);
      for (int r = 0; r < cp; ++r) put_halo_key(keys[std::size_t(r)], kHaloAt, h[std::size_t(r / I)]);
    }
    return keys;
  }

  std::vector<CpConfig> plan_configs(int cp, bool causal) const override {
    std::vector<CpConfig> out;
    for (int inner = 1; inner <= cp; ++inner)
      if (cp % inner == 0) out.push_back(CpConfig{"a2a+p2p", {inner, cp / inner}, causal, std::nullopt});
    return out;
  }
  std::string config_name(const CpConfig& c) const override {
    const auto& hs = c.hierarchical_context_parallel_sizes;
    return hs.size() == 2 ? fmt::format("a2a+p2p [{},{}]", hs[0], hs[1]) : "a2a+p2p";
  }

  // Kept: head-sharded q | k | v of the inner group's tokens in `dtype`, the ring's copy of its
  // K and V, out and lse in float32. The forward adds the ring's three K/V blocks and a partial
  // out (a ring of one keeps only its copy).
  StrategyMemory memory(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq, std::int64_t kv_heads,
                        DType dtype) const override {
    const int I = config.hierarchical_context_parallel_sizes[0];
    const HeadSplit split = ulysses_head_split(I, q.h, kv_heads);
    const double h = double(most_heads(split.q)), es = double(dtype_size(dtype)), d = double(q.d);
    const double tokens = double(q.b) * double((q.s + cp - 1) / cp * I);
    const double kv = es * 2 * double(q.b) * double((kv_seq + cp - 1) / cp * I) * double(most_heads(split.kv)) * d;
    const double out = 4 * tokens * h * (d + 1);  // out and lse
    const double kept = es * tokens * h * d + 2 * kv + out;
    return {kept + 3 * kv + out, kept, 3.5 * kept};
  }

  StrategyCost cost(const PlanInput& in, const CpConfig& config, const CommVolume& v, double fwd_s,
                    double /*bwd_s: kernel_model's at its blocks*/) const override {
    const int I = config.hierarchical_context_parallel_sizes[0], O = config.hierarchical_context_parallel_sizes[1];
    StrategyCost r;
    for (const auto* bytes : {&v.forward_bytes, &v.backward_bytes})
      for (const char* op : {"inner.seq_to_head", "inner.head_to_seq"})
        r.comm_s += all_to_all_seconds(in.cluster, I, double(bytes->at(op)));
    const double es = double(dtype_size(in.dtype));
    const double row = double(in.batch) * double(in.head_dim) * es;
    const double local_kv = double(busiest_kv_tokens(in)) * row;
    const double kvs = double(most_heads(ulysses_head_split(I, in.heads, in.kv_heads).kv) * I);
    const double ring_kv = 2 * kvs * local_kv;  // s_k under cross-attention
    const KernelCalls calls = ring_calls(in, config, I, O);
    const KernelSeconds k = attention_seconds(in, calls, fwd_s);
    const bool halo = uses_halo(config), bwd = has_backward(in);
    if (!halo) r.compute_s = k.fwd + k.bwd;
    const RingSeconds t = halo ? halo_seconds(ring_link(in.cluster, O, I), v, "outer.", fwd_s)
                               : ring_seconds(ring_link(in.cluster, O, I), O, ring_kv, bwd ? ring_kv / es * 4 : 0,
                                              k.fwd, k.bwd, double(calls.calls) / O);
    r.comm_s += t.comm;
    r.hidden_s = t.hidden;
    return r;
  }

 private:
  std::unique_ptr<StrategyContext> run_forward(CpGroup& group, const CpConfig& config, bool cross,
                                               const std::vector<std::vector<SeqChunk>>& q_chunks,
                                               const std::vector<std::vector<SeqChunk>>& kv_chunks,
                                               const TensorView& out, const TensorView& q, const TensorView& k,
                                               const TensorView& v, CpStats& stats) const {
    Communicator& comm = group.comm();
    const int I = config.hierarchical_context_parallel_sizes[0];
    auto ctx = std::make_unique<HierarchicalContext>();
    const auto shapes = subgroups(I, comm.size());
    ctx->inner = &group.subgroup("inner", shapes.at("inner").color(comm.rank()), comm.rank());
    ctx->outer = &group.subgroup("outer", shapes.at("outer").color(comm.rank()), comm.rank());
    ctx->heads = ulysses_head_split(I, q.shape.h, k.shape.h);
    ctx->dtype = q.dtype;
    const std::array<SeqShard, 3> in{{{q, ctx->heads.q}, {k, ctx->heads.kv}, {v, ctx->heads.kv}}};
    const std::span<const SeqShard> all(in);
    double t0 = comm.now();
    ctx->tokens = inner_tokens(q_chunks, I, comm.rank());
    if (cross) ctx->kv = seq_to_head_in(*ctx->inner, all.last(2), inner_tokens(kv_chunks, I, comm.rank()));
    ctx->qkv = seq_to_head_in(*ctx->inner, cross ? all.first(1) : all, ctx->tokens);
    stats.comm_exposed_s += comm.now() - t0;
    const TensorView hq = ctx->qkv.part(0);
    ctx->out_heads =
        FusedHeads(DType::f32, hq.shape.b, ctx->qkv.rank_tokens(), hq.shape.d, {hq.shape.h}, nullptr, hq.device);
    const AttentionParams params = attention_params(config);
    const std::vector<SeqChunk> queries = outer_chunks(q_chunks, I)[std::size_t(ctx->outer->rank())];
    ring_attention_forward(*ctx->outer, ctx->out_heads.part(0), ctx->ring, hq, ctx->k(), ctx->v(),
                           outer_chunks(kv_chunks, I), shifted(queries, params.q_offset), params, stats);
    t0 = comm.now();
    const std::array<SeqShard, 1> o{{{out, ctx->heads.q}}};
    head_to_seq_in(*ctx->inner, ctx->out_heads, o, q.dtype);
    stats.comm_exposed_s += comm.now() - t0;
    group.absorb();
    return ctx;
  }

  // head_to_seq of the float32 `x` in the storage dtype (unchecked, like seq_to_head_in).
  static void head_to_seq_in(Communicator& inner, const FusedHeads& x, std::span<const SeqShard> outputs, DType dtype) {
    if (dtype == DType::f32)
      post_head_to_seq(inner, x, outputs).wait();
    else
      post_head_to_seq(inner, x.converted(dtype), outputs).wait();
  }
};

}  // namespace

std::unique_ptr<Strategy> make_a2a_p2p_strategy() {
  return std::make_unique<A2aP2pStrategy>(
      StrategyTraits{.name = "a2a+p2p",
                     .hierarchical = true,
                     .per_document_zigzag = true,
                     .summary = "hierarchical: Ulysses inside groups of INNER contiguous ranks, a ring across OUTER "
                                "groups (--cp-sizes)",
                     .accepts = {.documents = true, .window = true, .cross = true}});
}

}  // namespace ulysses
