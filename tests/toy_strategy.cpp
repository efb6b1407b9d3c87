// A strategy added from outside the library, in one file, through the registry: "all_gather
// in two halves" — K and V gathered by two all-gathers (float32 on the wire), dK and dV
// returned by two reduce-scatters. Written against the public headers only, it runs through
// every generic strategy test of test_context_parallel.cpp (reference match, exact bytes
// against its own traffic formula and the planner, equal causal work, errors), the training
// memory model (test_train.cpp) and the command line's options, which is the point: adding a
// strategy needs no edit anywhere else.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses::testing {
namespace {

TensorView rows_of(const TensorView& v, std::int64_t row, std::int64_t n) {
  TensorView r = v;
  r.data = v.row(0, row, 0);
  r.shape.s = n;
  return r;
}

struct ToyContext final : StrategyContext {
  Tensor q, out, k_full, v_full;              // float32; K and V in sequence order
  std::vector<Tensor> lse;                    // per local chunk
  std::vector<std::vector<SeqChunk>> chunks;  // per rank
  AttentionParams params;
};

// Rank r's rows of a [b, ·, h_kv, d] tensor in a buffer holding every rank's back to back.
TensorView rank_block(const Tensor& all, const ToyContext& ctx, const Shape& x, int r) {
  std::int64_t before = 0;
  for (int i = 0; i < r; ++i) before += total_tokens(ctx.chunks[std::size_t(i)]);
  const std::int64_t n = total_tokens(ctx.chunks[std::size_t(r)]);
  return TensorView::dense(all.f32() + before * x.b * x.h * x.d, DType::f32, {x.b, n, x.h, x.d}, Layout::bshd);
}

// Elements of every rank's block (its tokens differ by rank when s % cp != 0).
std::vector<std::size_t> block_elements(const ToyContext& ctx, const Shape& x) {
  std::vector<std::size_t> n;
  for (const auto& c : ctx.chunks) n.push_back(std::size_t(total_tokens(c) * x.b * x.h * x.d));
  return n;
}

// One all-gather of this rank's rows of `x` into `full` [b, s, h_kv, d] in sequence order.
void gather_half(Communicator& comm, const TensorView& x, const Tensor& full, const ToyContext& ctx, const char* op) {
  const Tensor mine = copy_of(x, DType::f32);
  std::vector<std::size_t> bytes = block_elements(ctx, x.shape);
  for (std::size_t& b : bytes) b *= sizeof(float);
  Tensor all(full.shape());
  comm.allgatherv(buffer_of(mine), buffer_of(all), bytes, op);
  for (int r = 0; r < comm.size(); ++r)
    unshard_sequence(rank_block(all, ctx, x.shape, r), full.view(), ctx.chunks[std::size_t(r)]);
}

// dX summed over ranks, this rank's rows into `out` (any dtype).
void scatter_half(Communicator& comm, const Tensor& full_grad, const TensorView& out, const ToyContext& ctx,
                  const char* op) {
  Tensor blocks(full_grad.shape()), mine(out.shape);
  for (int r = 0; r < comm.size(); ++r)
    shard_sequence(full_grad.view(), rank_block(blocks, ctx, out.shape, r), ctx.chunks[std::size_t(r)]);
  comm.reduce_scatter_sum(buffer_of(blocks), buffer_of(mine), block_elements(ctx, out.shape), op);
  copy(mine.view(), out);
}

void add_into(const Tensor& dst, const Tensor& src) {
  for (std::int64_t i = 0; i < dst.shape().numel(); ++i) dst.f32()[i] += src.f32()[i];
}

class ToyAllGatherHalves final : public Strategy {
 public:
  using Strategy::Strategy;
  // Options of its own (CpConfig::options["toy-max-cp"], --toy-max-cp on the command line): a
  // cap on the ranks, and a split of the ranks in two (checked, not used) that depends on how
  // many there are, so it must be resized for a group of another size (config_for_size).
  std::vector<StrategyOption> options() const override {
    return {{"toy-max-cp", "N", "refuse more ranks than N", "toy-max-cp", "unset"},
            {"toy-sizes", "A,B", "split the ranks as A * B", "toy-sizes", "unset", 0, ""}};
  }
  void validate(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads) const override {
    Strategy::validate(config, cp, q, kv_heads);
    const std::vector<std::int64_t> most = option_value(options()[0], config);
    if (!most.empty() && cp > most.front())
      throw Error("toy_all_gather_halves: cp " + std::to_string(cp) + " is more than toy-max-cp " +
                  std::to_string(most.front()));
    const std::vector<std::int64_t> sizes = option_value(options()[1], config);
    if (!sizes.empty() && sizes[0] * sizes[1] != cp)
      throw Error("toy_all_gather_halves: toy-sizes A * B must be cp (" + std::to_string(cp) + ")");
  }
  // Its resize rule: A keeps as much of itself as divides the group, B takes the rest.
  CpConfig config_for_size(const CpConfig& config, int cp) const override {
    CpConfig c = config;
    const std::vector<std::int64_t> sizes = option_value(options()[1], config);
    if (!sizes.empty()) {
      const std::int64_t a = std::gcd(sizes[0], std::int64_t(cp));
      set_option(options()[1], c, {a, cp / a});
    }
    return c;
  }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>& chunks,
                                           const std::vector<std::vector<SeqChunk>>&, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    Communicator& comm = group.comm();
    auto ctx = std::make_unique<ToyContext>();
    ctx->chunks = chunks;
    ctx->params = attention_params(config);  // its mask, documents included
    std::int64_t seq = 0;
    for (const auto& c : chunks) seq += total_tokens(c);
    const Shape full{k.shape.b, seq, k.shape.h, k.shape.d};
    ctx->k_full = Tensor(full);
    ctx->v_full = Tensor(full);
    gather_half(comm, k, ctx->k_full, *ctx, "toy_k");
    gather_half(comm, v, ctx->v_full, *ctx, "toy_v");
    ctx->q = copy_of(q, DType::f32);
    ctx->out = Tensor(q.shape);
    const std::vector<SeqChunk>& mine = ctx->chunks[std::size_t(comm.rank())];
    for (std::size_t i = 0; i < mine.size(); ++i) {
      AttentionParams p = ctx->params;
      p.q_offset = mine[i].begin;
      const std::int64_t row = chunk_row(mine, i), n = mine[i].length;
      ctx->lse.push_back(lse_tensor({q.shape.b, n, q.shape.h, q.shape.d}));
      flash_attention_forward(rows_of(ctx->out.view(), row, n), ctx->lse.back().view(), rows_of(ctx->q.view(), row, n),
                              ctx->k_full.view(), ctx->v_full.view(), p);
      stats.score_pairs += visible_pairs(p, mine[i], {0, full.s}) * q.shape.b * q.shape.h;
    }
    copy(ctx->out.view(), out);
    return ctx;
  }

  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats&) const override {
    Communicator& comm = group.comm();
    const auto& ctx = static_cast<const ToyContext&>(context);
    const Tensor g = copy_of(dout, DType::f32);
    Tensor dq32(dq.shape), dk_full(ctx.k_full.shape()), dv_full(ctx.k_full.shape());
    Tensor dk_part(ctx.k_full.shape()), dv_part(ctx.k_full.shape());
    const std::vector<SeqChunk>& mine = ctx.chunks[std::size_t(comm.rank())];
    for (std::size_t i = 0; i < mine.size(); ++i) {
      AttentionParams p = ctx.params;
      p.q_offset = mine[i].begin;
      const std::int64_t row = chunk_row(mine, i), n = mine[i].length;
      flash_attention_backward(rows_of(dq32.view(), row, n), dk_part.view(), dv_part.view(), rows_of(g.view(), row, n),
                               rows_of(ctx.q.view(), row, n), ctx.k_full.view(), ctx.v_full.view(),
                               rows_of(ctx.out.view(), row, n), ctx.lse[i].view(), p);
      add_into(dk_full, dk_part);
      add_into(dv_full, dv_part);
    }
    copy(dq32.view(), dq);
    scatter_half(comm, dk_full, dk, ctx, "toy_dk");
    scatter_half(comm, dv_full, dv, ctx, "toy_dv");
  }

  // Each half: this rank's rows to the cp − 1 others; back, the others' rows of the gradient.
  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t, std::int64_t kv_heads,
                     DType) const override {
    CommVolume v;
    const std::int64_t per_token = q.b * kv_heads * q.d * 4, mine = tokens_held(config, cp, rank, 1, q.s);
    for (const char* op : {"toy_k", "toy_v"}) {
      v.forward_bytes[op] = (cp - 1) * mine * per_token;
      v.forward_messages[op] = cp - 1;
      declare_transfer(v, "", op, Collective::all_gather);
    }
    for (const char* op : {"toy_dk", "toy_dv"}) {
      v.backward_bytes[op] = (q.s - mine) * per_token;
      v.backward_messages[op] = cp - 1;
      declare_transfer(v, "", op, Collective::reduce_scatter);
    }
    return v;
  }

  // Its context: float32 q, out and lse of the busiest rank's tokens, the full K and V in
  // float32; the forward gathers into one more full K and V beside its own, packed. The backward adds dq and dout of its
  // tokens, then full-length dK, dV, two partials and the reduce-scatter's blocks.
  StrategyMemory memory(const CpConfig&, int cp, const Shape& q, std::int64_t kv_seq, std::int64_t kv_heads,
                        DType) const override {
    const double tokens = double(q.b) * double((q.s + cp - 1) / cp), qd = double(q.h * q.d);
    const double full = double(q.b) * double(kv_seq) * double(kv_heads * q.d);
    const double kept = 4 * (tokens * (2 * qd + double(q.h)) + 2 * full);
    const double own = 8 * double(q.b) * double((kv_seq + cp - 1) / cp) * double(kv_heads * q.d);
    return {kept + 8 * full + own, kept, 4 * (2 * tokens * qd + 5 * full)};
  }

  StrategyCost cost(const PlanInput& in, const CpConfig&, const CommVolume& v, double, double) const override {
    const Link& l = ring_link(in.cluster, in.cp, 1);
    return {message_seconds(l, double(v.total_forward_bytes() + v.total_backward_bytes())), 0.0};
  }
};

// The registration: what the strategy is, and the inputs it accepts.
[[maybe_unused]] const bool registered = [] {
  register_strategy(std::make_unique<ToyAllGatherHalves>(
      StrategyTraits{.name = "toy_all_gather_halves",
                     .summary = "test strategy: all_gather with K and V in two halves",
                     .accepts = {.documents = true}}));
  return true;
}();

}  // namespace

// Its resize rule, as training applies it to a group of another size (the registry's
// config_for_size): toy-sizes set for 4 ranks is refused on 2 until resized.
TEST(ToyStrategy, ResizesItsOptionForAGroupOfAnotherSize) {
  const Strategy& toy = find_strategy("toy_all_gather_halves");
  CpConfig c{"toy_all_gather_halves", {}, true, std::nullopt};
  c.options["toy-sizes"] = {2, 2};
  const Shape q{1, 24, 2, 8};
  EXPECT_NO_THROW(validate_cp_config(c, 4, q, 2));
  EXPECT_THROW(validate_cp_config(c, 2, q, 2), Error);
  const CpConfig two = toy.config_for_size(c, 2);
  EXPECT_EQ(two.options.at("toy-sizes"), (std::vector<std::int64_t>{2, 1}));
  EXPECT_NO_THROW(validate_cp_config(two, 2, q, 2));
  EXPECT_EQ(toy.config_for_size(c, 3).options.at("toy-sizes"), (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(toy.config_for_size(c, 6).options.at("toy-sizes"), (std::vector<std::int64_t>{2, 3}));
}

}  // namespace ulysses::testing
