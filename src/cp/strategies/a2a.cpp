// cp_comm_type "a2a": DeepSpeed-Ulysses as an explicit forward/backward pair.
//
// forward:  seq_to_head(q, k, v)  →  flash forward on [b, s, h_r, d]  →  head_to_seq(o)
// backward: seq_to_head(dO)       →  flash backward                   →  head_to_seq(dq, dk, dv)
// Rank r gets h_r query heads with their KV heads (ulysses_heads: h/cp each when they split
// evenly); ranks may hold different token counts. The backward is composed from the
// primitives' adjoints; nothing is hand-fused. bf16 inputs stay bf16 on the wire and in the
// kernels (the level's bf16 engine).
#include <array>

#include "../head_split.hpp"
#include "builtin.hpp"
#include "ulysses/all_to_all.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/documents.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses {

namespace {

struct UlyssesContext final : StrategyContext {
  FusedHeads qkv;          // head-sharded q | k | v in the wire dtype, [s, b, h_r + 2·h_kv_r, d]
  FusedHeads out;          // float32 head-sharded output
  Tensor lse;              // [b, h_r, s]
  HeadSplit heads;         // every rank's query and KV heads
  AttentionParams params;
  DType dtype = DType::f32;  // storage / wire dtype
};

class A2aStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "a2a"; }
  bool supports_documents() const override { return true; }
  bool supports_window() const override { return true; }
  std::string_view summary() const override {
    return "DeepSpeed-Ulysses: all-to-all seq->head, attention on h/cp heads over the full sequence, all-to-all back";
  }

  void validate(const CpConfig&, int cp, const Shape& q, std::int64_t kv_heads) const override {
    check_ulysses_heads(cp, q.h, kv_heads, "cp", "a2a");
  }
  RankHeads heads_of(const CpConfig&, int cp, int rank, std::int64_t heads, std::int64_t kv_heads) const override {
    return ulysses_heads(cp, rank, heads, kv_heads);
  }
  // Every token's queries on this rank's heads.
  std::int64_t work(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads) const override {
    return visible_pairs(attention_params(config), {0, q.s}, {0, q.s}) * q.b *
           ulysses_heads(cp, rank, q.h, kv_heads).q.count;
  }
  // Balanced by heads, so never zigzag.
  TokenLayout token_layout(const CpConfig&) const override { return TokenLayout::contiguous; }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>&, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    Communicator& comm = group.comm();
    auto ctx = std::make_unique<UlyssesContext>();
    ctx->heads = ulysses_head_split(comm.size(), q.shape.h, k.shape.h);
    ctx->params = attention_params(config);
    ctx->dtype = q.dtype;
    const std::array<SeqShard, 3> in{{{q, ctx->heads.q}, {k, ctx->heads.kv}, {v, ctx->heads.kv}}};
    const double t0 = comm.now();
    ctx->qkv = seq_to_head(comm, in);  // in the wire dtype: the kernels take bf16 as it is
    const double t1 = comm.now();
    const TensorView hq = ctx->qkv.part(0);
    ctx->out = FusedHeads(DType::f32, hq.shape.b, ctx->qkv.rank_tokens(), hq.shape.d, {hq.shape.h});
    ctx->lse = lse_tensor(hq.shape);
    flash_attention_forward(ctx->out.part(0), ctx->lse.view(), hq, ctx->qkv.part(1), ctx->qkv.part(2), ctx->params);
    const double t2 = comm.now();
    const std::array<SeqShard, 1> o{{{out, ctx->heads.q}}};
    if (ctx->dtype == DType::f32) head_to_seq(comm, ctx->out, o);
    else head_to_seq(comm, ctx->out.converted(ctx->dtype), o);
    stats.compute_s += t2 - t1;
    comm.trace("flash forward", t1, t2);
    stats.comm_exposed_s += (t1 - t0) + (comm.now() - t2);
    stats.score_pairs += visible_pairs(ctx->params, {0, hq.shape.s}, {0, hq.shape.s}) * hq.shape.b * hq.shape.h;
    return ctx;
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    Communicator& comm = group.comm();
    const auto& ctx = static_cast<const UlyssesContext&>(context);
    const std::array<SeqShard, 1> g{{{dout, ctx.heads.q}}};
    const double t0 = comm.now();
    const FusedHeads hdout = seq_to_head(comm, g);
    const double t1 = comm.now();
    const FusedHeads& qkv = ctx.qkv;
    FusedHeads grads(ctx.dtype, qkv.batch(), qkv.rank_tokens(), qkv.head_dim(),
                     {qkv.local_heads(0), qkv.local_heads(1), qkv.local_heads(2)});
    flash_attention_backward(grads.part(0), grads.part(1), grads.part(2), hdout.part(0), qkv.part(0), qkv.part(1),
                             qkv.part(2), ctx.out.part(0), ctx.lse.view(), ctx.params);
    const double t2 = comm.now();
    const std::array<SeqShard, 3> out{{{dq, ctx.heads.q}, {dk, ctx.heads.kv}, {dv, ctx.heads.kv}}};
    head_to_seq(comm, grads, out);
    stats.compute_s += t2 - t1;
    comm.trace("flash backward", t1, t2);
    stats.comm_exposed_s += (t1 - t0) + (comm.now() - t2);
    const std::int64_t s = qkv.seq();
    stats.score_pairs += visible_pairs(ctx.params, {0, s}, {0, s}) * qkv.batch() * qkv.local_heads(0);
  }

  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads,
                     DType dtype) const override {
    CommVolume v;
    add_ulysses_volume(v, "", cp, tokens_held(config, cp, rank, 1, q.s), q.s, ulysses_heads(cp, rank, q.h, kv_heads),
                       q.h, ulysses_kv_heads_held(cp, kv_heads), q.b * q.d * std::int64_t(dtype_size(dtype)));
    return v;
  }

  StrategyCost cost(const PlanInput& in, const CpConfig&, const CommVolume& v, double, double) const override {
    const Cluster& c = in.cluster;
    StrategyCost r;
    for (const auto* bytes : {&v.forward_bytes, &v.backward_bytes})
      for (const char* op : {"seq_to_head", "head_to_seq"}) r.comm_s += all_to_all_seconds(c, in.cp, double(bytes->at(op)));
    const double row = double(in.batch) * double(in.head_dim) * double(dtype_size(in.dtype));
    const HeadSplit split = ulysses_head_split(in.cp, in.heads, in.kv_heads);
    const double seq_side = 2 * double(in.heads + in.kv_heads) * double(busiest_tokens(in)) * row;  // q, out, k, v
    r.memory_bytes = seq_side + 2 * double(most_heads(split.q) + most_heads(split.kv)) * double(in.seq) * row;
    return r;
  }
};

}  // namespace

std::unique_ptr<Strategy> make_a2a_strategy() { return std::make_unique<A2aStrategy>(); }

}  // namespace ulysses
