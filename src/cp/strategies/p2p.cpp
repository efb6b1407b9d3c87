// cp_comm_type "p2p": ring attention over the whole communicator (ring_attention.hpp has the
// algorithm, which the outer ring of a2a+p2p shares). Q, K and V stay in the storage dtype,
// on the wire and in the kernels (bf16: the level's bf16 engine); partial outputs, their LSE
// merges and the gradients are float32 across ring steps, rounded once at the end.
// Cross-attention (k/v of s_k tokens): the K/V chunks over s_k travel, the queries stay at
// q_offset + their positions over s.
#include "../ring_attention.hpp"
#include "../tensor_ops.hpp"
#include "builtin.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

namespace {

struct RingContext final : StrategyContext {
  SavedForward saved;  // q and the float32 out (RingSaved points into them)
  RingSaved ring;
};

class P2pStrategy final : public Strategy {
 public:
  using Strategy::Strategy;
  std::vector<StrategyOption> options() const override { return {per_document_option()}; }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>& q_chunks,
                                           const std::vector<std::vector<SeqChunk>>& kv_chunks, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    auto ctx = std::make_unique<RingContext>();
    ctx->saved = SavedForward(q);
    const AttentionParams params = attention_params(config);
    ring_attention_forward(group.comm(), ctx->saved.out.view(), ctx->ring, ctx->saved.q.view(), k, v, kv_chunks,
                           shifted(q_chunks[std::size_t(group.comm().rank())], params.q_offset), params, stats);
    copy(ctx->saved.out.view(), out);
    return ctx;
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    const auto& ctx = static_cast<const RingContext&>(context);
    Float32Backward g(dq, dk, dv);
    ring_attention_backward(group.comm(), g.dq.view(), g.dk.view(), g.dv.view(), dout, ctx.ring, stats);
    g.store(dq, dk, dv);
  }

  // Every K/V row over s_k goes around the ring whatever the mask (no window with cross-attention).
  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                     std::int64_t kv_heads, DType dtype) const override {
    return keyed_traffic(config, cp, rank, traffic_key(config, cp, rank, q, kv_seq, kv_heads), q, kv_seq, kv_heads,
                         dtype);
  }
  CommVolume keyed_traffic(const CpConfig& config, int cp, int, const TrafficKey& key, const Shape& q,
                           std::int64_t kv_seq, std::int64_t kv_heads, DType dtype) const override {
    CommVolume v;
    const std::int64_t per_token = 2 * q.b * kv_heads * q.d;  // K and V
    if (uses_halo(config)) {
      add_halo_volume(v, "", halo_of(key, 0), per_token, std::int64_t(dtype_size(dtype)));
      return v;
    }
    add_ring_volume(v, "", cp, per_token * kv_seq, per_token * key[0], std::int64_t(dtype_size(dtype)));
    return v;
  }
  // The ring's: the next rank's K/V tokens (its own never travel to it). A halo: its counts.
  TrafficKey traffic_key(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                         std::int64_t) const override {
    TrafficKey key{};
    if (uses_halo(config))
      put_halo_key(key, 0, halo_counts(config, cp, 1, rank, q.s));
    else
      key[0] = tokens_held(config, cp, (rank + 1) % cp, 1, kv_seq);
    return key;
  }

  std::vector<TrafficKey> traffic_keys(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                       std::int64_t) const override {
    std::vector<TrafficKey> keys(static_cast<std::size_t>(cp));
    if (uses_halo(config)) {
      const std::vector<HaloCounts> h = members_halo_counts(config, cp, 1, q.s);
      for (int r = 0; r < cp; ++r) put_halo_key(keys[std::size_t(r)], 0, h[std::size_t(r)]);
      return keys;
    }
    const std::vector<std::int64_t> tokens = tokens_of_ranks(config, cp, kv_seq);
    for (int r = 0; r < cp; ++r) keys[std::size_t(r)][0] = tokens[std::size_t((r + 1) % cp)];
    return keys;
  }
  // Each rank's query chunks against every key (work()), the layout's chunks listed once.
  std::vector<std::int64_t> work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                          std::int64_t kv_heads) const override {
    std::vector<std::int64_t> w = pairs_of_ranks(config, cp, q.s, kv_seq);
    for (int r = 0; r < cp; ++r) w[std::size_t(r)] *= q.b * heads_of(config, cp, r, q.h, kv_heads).q.count;
    return w;
  }

  StrategyCost cost(const PlanInput& in, const CpConfig& config, const CommVolume& volume, double fwd_s,
                    double /*bwd_s: kernel_model's at its blocks*/) const override {
    const double es = double(dtype_size(in.dtype));
    const double row = double(in.batch) * double(in.head_dim);
    const double kv_rows = double(in.kv_heads) * double(busiest_kv_tokens(in)) * row;  // s_k under cross-attention
    const double kv = 2 * kv_rows * es;
    if (uses_halo(config)) {  // + the halos received (the busiest rank's)
      const RingSeconds t = halo_seconds(ring_link(in.cluster, in.cp, 1), volume, "", fwd_s);
      return {t.comm, t.hidden};
    }
    // cp steps, each over chunks of s/(2cp) (zigzag) or s/cp tokens, merged by their LSE; or the
    // calls this library's ring makes, one per visible chunk pair (KernelModel::ring_pair_calls)
    const bool zz = token_layout(config) != TokenLayout::contiguous;
    const double chunk = double(busiest_kv_tokens(in)) / (zz ? 2 : 1);
    const double q_rows = double(in.batch) * double(in.heads), share = config.causal ? (zz ? 1.0 : 0.5) / in.cp : 0;
    const double kv_rows_heads = double(in.batch) * double(in.kv_heads);
    const KernelCalls calls =
        counts_ring_pairs(in) ? ring_pair_calls(in, in.cp, zz ? 2 : 1, zz, config.causal, q_rows, kv_rows_heads)
                              : KernelCalls{in.cp, double(busiest_tokens(in)),   chunk, q_rows, kv_rows_heads, share,
                                            true,  double(busiest_kv_tokens(in))};
    const KernelSeconds k = attention_seconds(in, calls, fwd_s);
    const bool bwd = has_backward(in);
    const RingSeconds t = ring_seconds(ring_link(in.cluster, in.cp, 1), in.cp, kv, bwd ? 2 * kv_rows * 4 : 0, k.fwd,
                                       k.bwd, double(calls.calls) / in.cp);
    return {t.comm, t.hidden, k.fwd + k.bwd};
  }
};

}  // namespace

std::unique_ptr<Strategy> make_p2p_strategy() {
  return std::make_unique<P2pStrategy>(
      StrategyTraits{.name = "p2p",
                     .per_document_zigzag = true,
                     .summary = "ring attention: K/V chunks travel around the ring, each transfer hidden behind a step "
                                "of compute (with a sliding window: only the halo the band reaches)",
                     .accepts = {.documents = true, .window = true, .cross = true}});
}

}  // namespace ulysses
