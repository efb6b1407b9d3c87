// cp_comm_type "all_gather" (Llama-3 style, as in TransformerEngine): gather the full K and V
// once, reorder them into sequence order, and run every local query chunk against its causal
// prefix of keys; the backward reduce-scatters dK and dV back to their owners. The simplest
// strategy and the most memory (full K and V on every rank); nothing overlaps. Computes in
// float32; K/V travel in the storage dtype, dK/dV in float32.
#include "../ring_attention.hpp"
#include "../tensor_ops.hpp"
#include "builtin.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses {

namespace {

struct AllGatherContext final : StrategyContext {
  Float32Forward f32;                         // q and out in float32
  Tensor kv_full;                             // float32 [2b, s, h_kv, d] in sequence order
  std::vector<Tensor> lse;                    // per local chunk
  std::vector<std::vector<SeqChunk>> chunks;  // per rank
  AttentionParams params;
};

// Every rank's K|V blocks (rank order) into sequence order.
void gather_kv(Communicator& comm, AllGatherContext& ctx, const TensorView& k, const TensorView& v) {
  const int R = comm.size();
  const Shape& ks = k.shape;
  ctx.kv_full = Tensor::uninitialized({2 * ks.b, ks.s * R, ks.h, ks.d});
  Tensor local = Tensor::uninitialized({2 * ks.b, ks.s, ks.h, ks.d}, k.dtype);
  copy(k, kv_half(local.view(), 0));
  copy(v, kv_half(local.view(), 1));
  Tensor gathered = Tensor::uninitialized({2 * ks.b * R, ks.s, ks.h, ks.d}, k.dtype);
  comm.allgather(local.data(), gathered.data(), local.nbytes(), "all_gather_kv");
  for (int r = 0; r < R; ++r) {
    TensorView block = gathered.view();
    block.shape.b = 2 * ks.b;
    block.data = gathered.view().row(2 * ks.b * r, 0, 0);
    for (int which = 0; which < 2; ++which)
      unshard_sequence(kv_half(block, which), kv_half(ctx.kv_full.view(), which), ctx.chunks[std::size_t(r)]);
  }
}

class AllGatherStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "all_gather"; }
  std::string_view summary() const override {
    return "gather the full K/V once, reduce-scatter dK/dV (simplest, most memory, no overlap)";
  }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    Communicator& comm = group.comm();
    auto ctx = std::make_unique<AllGatherContext>();
    ctx->chunks = all_rank_chunks(config, comm.size(), q.shape.s * comm.size());
    ctx->params = {config.causal, config.scale, 0, 0};
    const double t0 = comm.now();
    gather_kv(comm, *ctx, k, v);
    const double t1 = comm.now();
    stats.comm_exposed_s += t1 - t0;

    ctx->f32 = Float32Forward(q);
    const TensorView q32 = ctx->f32.q.view(), out32 = ctx->f32.out.view();
    const std::vector<SeqChunk>& mine = ctx->chunks[std::size_t(comm.rank())];
    const TensorView kf = kv_half(ctx->kv_full.view(), 0), vf = kv_half(ctx->kv_full.view(), 1);
    const std::int64_t S = kf.shape.s;
    for (std::size_t ia = 0; ia < mine.size(); ++ia) {
      const SeqChunk& a = mine[ia];
      AttentionParams p = ctx->params;
      p.q_offset = a.begin;
      const std::int64_t ra = chunk_row(mine, ia);
      ctx->lse.push_back(lse_tensor({q.shape.b, a.length, q.shape.h, q.shape.d}));
      flash_attention_forward(rows(out32, ra, a.length), ctx->lse.back().view(), rows(q32, ra, a.length), kf, vf, p);
      stats.score_pairs += visible_pairs(a, {0, S}, config.causal) * q.shape.b * q.shape.h;
    }
    copy(out32, out);
    stats.compute_s += comm.now() - t1;
    return ctx;
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    Communicator& comm = group.comm();
    const auto& ctx = static_cast<const AllGatherContext&>(context);
    const int R = comm.size();
    const Shape full = ctx.kv_full.shape();  // [2b, s, h_kv, d]
    const std::int64_t m = full.s / R;
    const std::vector<SeqChunk>& mine = ctx.chunks[std::size_t(comm.rank())];
    const TensorView kf = kv_half(ctx.kv_full.view(), 0), vf = kv_half(ctx.kv_full.view(), 1);
    Float32Backward g(dout, dq, dk, dv);
    const TensorView q32 = ctx.f32.q.view(), out32 = ctx.f32.out.view();

    const double t0 = comm.now();
    Tensor dkv_full(full), dk_part = Tensor::uninitialized(kf.shape), dv_part = Tensor::uninitialized(kf.shape);
    for (std::size_t ia = 0; ia < mine.size(); ++ia) {
      const SeqChunk& a = mine[ia];
      AttentionParams p = ctx.params;
      p.q_offset = a.begin;
      const std::int64_t ra = chunk_row(mine, ia);
      flash_attention_backward(rows(g.dq.view(), ra, a.length), dk_part.view(), dv_part.view(),
                               rows(g.dout.view(), ra, a.length), rows(q32, ra, a.length), kf, vf,
                               rows(out32, ra, a.length), ctx.lse[ia].view(), p);
      accumulate(kv_half(dkv_full.view(), 0), dk_part.view());
      accumulate(kv_half(dkv_full.view(), 1), dv_part.view());
      stats.score_pairs += visible_pairs(a, {0, full.s}, ctx.params.causal) * q32.shape.b * q32.shape.h;
    }
    // Rank r's rows of dK/dV, in its local order, as block r of the reduce-scatter.
    Tensor blocks = Tensor::uninitialized({full.b * R, m, full.h, full.d});
    for (int r = 0; r < R; ++r) {
      TensorView block = blocks.view();
      block.shape.b = full.b;
      block.data = blocks.view().row(full.b * r, 0, 0);
      for (int which = 0; which < 2; ++which)
        shard_sequence(kv_half(dkv_full.view(), which), kv_half(block, which), ctx.chunks[std::size_t(r)]);
    }
    const double t1 = comm.now();
    stats.compute_s += t1 - t0;
    Tensor mine_total = Tensor::uninitialized({full.b, m, full.h, full.d});
    comm.reduce_scatter_sum(blocks.f32(), mine_total.f32(), std::size_t(mine_total.shape().numel()), "all_gather_dkv");
    stats.comm_exposed_s += comm.now() - t1;
    copy(kv_half(mine_total.view(), 0), g.dk.view());
    copy(kv_half(mine_total.view(), 1), g.dv.view());
    g.store(dq, dk, dv);
  }

  CommVolume traffic(const CpConfig&, int cp, const Shape& q, std::int64_t kv_heads, DType dtype) const override {
    CommVolume v;
    const std::int64_t kv = 2 * q.b * (q.s / cp) * kv_heads * q.d;
    v.forward_bytes["all_gather_kv"] = (cp - 1) * kv * std::int64_t(dtype_size(dtype));
    v.backward_bytes["all_gather_dkv"] = (cp - 1) * kv * 4;
    v.forward_messages["all_gather_kv"] = cp - 1;
    v.backward_messages["all_gather_dkv"] = cp - 1;
    return v;
  }

  StrategyCost cost(const PlanInput& in, const CpConfig&, const CommVolume&, double, double) const override {
    const double es = double(dtype_size(in.dtype)), local = double(in.batch) * double(in.seq / in.cp) * double(in.head_dim);
    const double qo = 2 * double(in.heads) * local * es, kv = 2 * double(in.kv_heads) * local * es;
    const Link& l = ring_link(in.cluster, in.cp, 1);
    const double comm = (in.cp - 1) * (message_seconds(l, kv) + message_seconds(l, kv / es * 4));
    return {comm, 0.0, qo + kv + double(in.cp) * kv};  // the full K and V
  }
};

}  // namespace

std::unique_ptr<Strategy> make_all_gather_strategy() { return std::make_unique<AllGatherStrategy>(); }

}  // namespace ulysses
