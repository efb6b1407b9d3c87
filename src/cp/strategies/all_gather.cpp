// cp_comm_type "all_gather" (Llama-3 style, as in TransformerEngine): gather the full K and V
// once, reorder them into sequence order, and run every local query chunk against its causal
// prefix of keys; the backward reduce-scatters dK and dV back to their owners. The simplest
// strategy and the most memory (full K and V on every rank); nothing overlaps. Q, K and V stay
// in the storage dtype, on the wire and in the kernels (bf16: the level's bf16 engine); out
// and the gradients are float32 until the end, dK/dV summed and reduce-scattered in float32
// (a bf16 sum over ranks would round once per rank). Cross-attention (k/v of s_k
// tokens) gathers K/V by their own chunks; the queries keep theirs, shifted by q_offset.
#include <numeric>

#include "../ring_attention.hpp"
#include "../tensor_ops.hpp"
#include "builtin.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

namespace {

struct AllGatherContext final : StrategyContext {
  SavedForward saved;                         // q and the float32 out
  Tensor kv_full;                             // [2b, s, h_kv, d] in sequence order, storage dtype
  std::vector<Tensor> lse;                    // per local chunk
  std::vector<std::vector<SeqChunk>> chunks;  // per rank: its K/V tokens
  std::vector<SeqChunk> mine;                 // this rank's query tokens
  AttentionParams params;
};

// Every rank's K|V rows [2b, n_r, h_kv, d] (n_r its tokens) back to back in rank order, as the
// all-gather and the reduce-scatter move them: exactly each rank's rows, no padding.
class RankBlocks {
 public:
  RankBlocks(const std::vector<std::vector<SeqChunk>>& chunks, const Shape& kv_of_one_token) : row_(kv_of_one_token) {
    for (const auto& c : chunks) rows_.push_back(total_tokens(c));
  }
  // Elements of every rank's block, in rank order.
  std::vector<std::size_t> all_elements() const {
    std::vector<std::size_t> n;
    for (std::size_t r = 0; r < rows_.size(); ++r) n.push_back(elements(int(r)));
    return n;
  }
  std::int64_t total_rows() const { return std::accumulate(rows_.begin(), rows_.end(), std::int64_t(0)); }
  // Rank r's block in `buffer`, which holds them all.
  TensorView block(const Tensor& buffer, int r) const {
    std::size_t offset = 0;
    for (int i = 0; i < r; ++i) offset += elements(i);
    void* data = static_cast<std::byte*>(buffer.data()) + offset * dtype_size(buffer.dtype());
    return TensorView::dense(data, buffer.dtype(), {row_.b, rows_[std::size_t(r)], row_.h, row_.d}, Layout::bshd,
                             buffer.device());
  }

 private:
  std::size_t elements(int r) const { return std::size_t(rows_[std::size_t(r)] * row_.b * row_.h * row_.d); }
  Shape row_;  // [2b, 1, h_kv, d]
  std::vector<std::int64_t> rows_;
};

// Every rank's K|V blocks (rank order) into sequence order.
void gather_kv(Communicator& comm, AllGatherContext& ctx, const TensorView& k, const TensorView& v) {
  const Shape& ks = k.shape;
  const RankBlocks blocks(ctx.chunks, {2 * ks.b, 1, ks.h, ks.d});
  Tensor local = Tensor::uninitialized({2 * ks.b, ks.s, ks.h, ks.d}, k.dtype, Layout::bshd, k.device);
  copy(k, kv_half(local.view(), 0));
  copy(v, kv_half(local.view(), 1));
  std::vector<std::size_t> bytes = blocks.all_elements();
  for (std::size_t& b : bytes) b *= dtype_size(k.dtype);
  const std::int64_t seq = blocks.total_rows();
  Tensor gathered = Tensor::uninitialized({2 * ks.b, seq, ks.h, ks.d}, k.dtype, Layout::bshd, k.device);  // the blocks'
  comm.allgatherv(buffer_of(local), buffer_of(gathered), bytes, "all_gather_kv");
  ctx.kv_full = Tensor::uninitialized({2 * ks.b, seq, ks.h, ks.d}, k.dtype, Layout::bshd, k.device);
  for (int r = 0; r < comm.size(); ++r)
    for (int which = 0; which < 2; ++which)
      unshard_sequence(kv_half(blocks.block(gathered, r), which), kv_half(ctx.kv_full.view(), which),
                       ctx.chunks[std::size_t(r)]);
}

class AllGatherStrategy final : public Strategy {
 public:
  using Strategy::Strategy;

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>& q_chunks,
                                           const std::vector<std::vector<SeqChunk>>& kv_chunks, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    Communicator& comm = group.comm();
    auto ctx = std::make_unique<AllGatherContext>();
    ctx->chunks = kv_chunks;
    ctx->mine = q_chunks[std::size_t(comm.rank())];
    ctx->params = attention_params(config);
    const double t0 = comm.now();
    gather_kv(comm, *ctx, k, v);
    const double t1 = comm.now();
    stats.comm_exposed_s += t1 - t0;

    ctx->saved = SavedForward(q);
    const TensorView qs = ctx->saved.q.view(), out32 = ctx->saved.out.view();
    const std::vector<SeqChunk>& mine = ctx->mine;
    const TensorView kf = kv_half(ctx->kv_full.view(), 0), vf = kv_half(ctx->kv_full.view(), 1);
    const std::int64_t S = kf.shape.s;
    for (std::size_t ia = 0; ia < mine.size(); ++ia) {
      const SeqChunk& a = mine[ia];
      AttentionParams p = ctx->params;
      p.q_offset += a.begin;
      const std::int64_t ra = chunk_row(mine, ia);
      ctx->lse.push_back(lse_tensor({q.shape.b, a.length, q.shape.h, q.shape.d}, q.device));
      flash_attention_forward(rows(out32, ra, a.length), ctx->lse.back().view(), rows(qs, ra, a.length), kf, vf, p);
      stats.score_pairs += visible_pairs(p, {p.q_offset, a.length}, {0, S}) * q.shape.b * q.shape.h;
    }
    copy(out32, out);
    stats.compute_s += comm.now() - t1;
    comm.trace("attention forward", t1, comm.now());
    return ctx;
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    Communicator& comm = group.comm();
    const auto& ctx = static_cast<const AllGatherContext&>(context);
    const int R = comm.size();
    const Shape full = ctx.kv_full.shape();  // [2b, s, h_kv, d]
    const std::vector<SeqChunk>& mine = ctx.mine;
    const TensorView kf = kv_half(ctx.kv_full.view(), 0), vf = kv_half(ctx.kv_full.view(), 1);
    Float32Backward g(dq, dk, dv);
    const TensorView qs = ctx.saved.q.view(), out32 = ctx.saved.out.view();

    const double t0 = comm.now();
    Tensor dkv_full(full, DType::f32, Layout::bshd, kf.device), dk_part = f32_like(kf), dv_part = f32_like(kf);
    for (std::size_t ia = 0; ia < mine.size(); ++ia) {
      const SeqChunk& a = mine[ia];
      AttentionParams p = ctx.params;
      p.q_offset += a.begin;
      const std::int64_t ra = chunk_row(mine, ia);
      flash_attention_backward(rows(g.dq.view(), ra, a.length), dk_part.view(), dv_part.view(),
                               rows(dout, ra, a.length), rows(qs, ra, a.length), kf, vf, rows(out32, ra, a.length),
                               ctx.lse[ia].view(), p);
      accumulate(kv_half(dkv_full.view(), 0), dk_part.view());
      accumulate(kv_half(dkv_full.view(), 1), dv_part.view());
      stats.score_pairs += visible_pairs(p, {p.q_offset, a.length}, {0, full.s}) * qs.shape.b * qs.shape.h;
    }
    // Rank r's rows of dK/dV, in its local order, as block r of the reduce-scatter.
    const RankBlocks layout(ctx.chunks, {full.b, 1, full.h, full.d});
    Tensor blocks = Tensor::uninitialized(full, DType::f32, Layout::bshd, kf.device);  // as many elements as the blocks
    for (int r = 0; r < R; ++r)
      for (int which = 0; which < 2; ++which)
        shard_sequence(kv_half(dkv_full.view(), which), kv_half(layout.block(blocks, r), which),
                       ctx.chunks[std::size_t(r)]);
    const double t1 = comm.now();
    stats.compute_s += t1 - t0;
    comm.trace("attention backward", t0, t1);
    Tensor mine_total =
        Tensor::uninitialized({full.b, g.dk.shape().s, full.h, full.d}, DType::f32, Layout::bshd, kf.device);
    comm.reduce_scatter_sum(buffer_of(blocks), buffer_of(mine_total), layout.all_elements(), "all_gather_dkv");
    stats.comm_exposed_s += comm.now() - t1;
    copy(kv_half(mine_total.view(), 0), g.dk.view());
    copy(kv_half(mine_total.view(), 1), g.dv.view());
    g.store(dq, dk, dv);
  }

  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                     std::int64_t kv_heads, DType dtype) const override {
    return keyed_traffic(config, cp, rank, traffic_key(config, cp, rank, q, kv_seq, kv_heads), q, kv_seq, kv_heads,
                         dtype);
  }
  CommVolume keyed_traffic(const CpConfig&, int cp, int, const TrafficKey& key, const Shape& q, std::int64_t kv_seq,
                           std::int64_t kv_heads, DType dtype) const override {
    CommVolume v;
    const std::int64_t per_token = 2 * q.b * kv_heads * q.d, mine = key[0];
    v.forward_bytes["all_gather_kv"] = (cp - 1) * mine * per_token * std::int64_t(dtype_size(dtype));
    v.backward_bytes["all_gather_dkv"] = (kv_seq - mine) * per_token * 4;  // the others' rows
    v.forward_messages["all_gather_kv"] = cp - 1;
    v.backward_messages["all_gather_dkv"] = cp - 1;
    declare_transfer(v, "", "all_gather_kv", Collective::all_gather);
    declare_transfer(v, "", "all_gather_dkv", Collective::reduce_scatter);
    return v;
  }
  // Its own K/V tokens.
  TrafficKey traffic_key(const CpConfig& config, int cp, int rank, const Shape&, std::int64_t kv_seq,
                         std::int64_t) const override {
    return {tokens_held(config, cp, rank, 1, kv_seq)};
  }
  // Each rank's query chunks against every key (work()), the layout's chunks listed once.
  std::vector<std::int64_t> work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                          std::int64_t kv_heads) const override {
    std::vector<std::int64_t> w = pairs_of_ranks(config, cp, q.s, kv_seq);
    for (int r = 0; r < cp; ++r) w[std::size_t(r)] *= q.b * heads_of(config, cp, r, q.h, kv_heads).q.count;
    return w;
  }
  std::vector<TrafficKey> traffic_keys(const CpConfig& config, int cp, const Shape&, std::int64_t kv_seq,
                                       std::int64_t) const override {
    const std::vector<std::int64_t> tokens = tokens_of_ranks(config, cp, kv_seq);
    std::vector<TrafficKey> keys(static_cast<std::size_t>(cp));
    for (int r = 0; r < cp; ++r) keys[std::size_t(r)][0] = tokens[std::size_t(r)];
    return keys;
  }

  // Kept: q of the busiest rank's tokens and the full K and V in `dtype`, its out and lse in
  // float32; the forward receives the full K and V once more (the gather's blocks) beside its
  // own K and V packed to send.
  StrategyMemory memory(const CpConfig&, int cp, const Shape& q, std::int64_t kv_seq, std::int64_t kv_heads,
                        DType dtype) const override {
    const double es = double(dtype_size(dtype)), d = double(q.d);
    const double tokens = double(q.b) * double((q.s + cp - 1) / cp);
    const double full_kv = es * 2 * double(q.b) * double(kv_seq) * double(kv_heads) * d;
    const double kept = es * tokens * double(q.h) * d + full_kv + 4 * tokens * double(q.h) * (d + 1);
    const double own_kv = es * 2 * double(q.b) * double((kv_seq + cp - 1) / cp) * double(kv_heads) * d;
    return {kept + full_kv + own_kv, kept, 3.5 * kept};
  }

  StrategyCost cost(const PlanInput& in, const CpConfig& config, const CommVolume&, double fwd_s,
                    double) const override {
    const double es = double(dtype_size(in.dtype));
    const double row = double(in.batch) * double(in.head_dim) * es;
    const double kv =
        2 * double(in.kv_heads) * double(busiest_kv_tokens(in)) * row;  // s_k tokens under cross-attention
    const Link& l = ring_link(in.cluster, in.cp, 1);
    const double comm =
        (in.cp - 1) * (message_seconds(l, kv) + (has_backward(in) ? message_seconds(l, kv / es * 4) : 0));
    // a call per local chunk (two under zigzag) against the gathered K/V
    const bool zz = token_layout(config) != TokenLayout::contiguous;
    const double q_len = double(busiest_tokens(in)) / (zz ? 2 : 1), b = double(in.batch);
    const KernelSeconds k = attention_seconds(in,
                                              {zz ? 2 : 1, q_len, double(kv_seq_of(in)), b * double(in.heads),
                                               b * double(in.kv_heads), config.causal ? 1.0 / in.cp : 0.0, false},
                                              fwd_s);
    // The gathered blocks copied into the full K/V (read and written once), and the backward's
    // full float32 dK/dV into the reduce-scatter's blocks: memory-bound passes, priced at the
    // calibrated or preset memory rate (none in the flat model).
    const double bw = in.cluster.kernel.memory_bandwidth;
    const double copies = bw > 0 ? 2 * kv / bw + (has_backward(in) ? 2 * kv / es * 4 / bw : 0.0) : 0.0;
    return {comm, 0.0, k.fwd + k.bwd + copies};
  }
};

}  // namespace

std::unique_ptr<Strategy> make_all_gather_strategy() {
  return std::make_unique<AllGatherStrategy>(
      StrategyTraits{.name = "all_gather",
                     .summary = "gather the full K/V once, reduce-scatter dK/dV (simplest, most memory, no overlap)",
                     .accepts = {.documents = true, .window = true, .cross = true}});
}

}  // namespace ulysses
