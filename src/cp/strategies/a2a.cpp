// cp_comm_type "a2a": DeepSpeed-Ulysses as an explicit forward/backward pair.
//
// forward:  seq_to_head(q, k, v)  →  flash forward on [b, s, h_r, d]  →  head_to_seq(o)
// backward: seq_to_head(dO)       →  flash backward                   →  head_to_seq(dq, dk, dv)
// Rank r gets h_r query heads with their KV heads (ulysses_heads: h/cp each when they split
// evenly); ranks may hold different token counts. The backward is composed from the
// primitives' adjoints; nothing is hand-fused. bf16 inputs stay bf16 on the wire and in the
// kernels (the level's bf16 engine).
//
// With overlap_chunks = c > 1 the heads are independent work, so each rank's heads are cut into
// c chunks of whole GQA groups (ulysses_head_chunk) and pipelined: chunk i computes while chunk
// i+1's seq→head and chunk i−1's head→seq transposes travel (nonblocking all-to-alls, their
// progress driven between the chunk's KV groups). The same bytes in c× the messages; c = 1 is
// the plain algorithm, one transpose each way.
//
// Cross-attention (k/v of s_k tokens): q and k|v travel in separate transposes, their token
// counts differing; no overlap (validate_cp_config refuses overlap_chunks > 1 with it).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <span>
#include <utility>

#include "builtin.hpp"
#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/ulysses_heads.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses {

namespace {

// One chunk of every rank's heads (all of them without overlap) on this rank.
struct HeadChunk {
  HeadSplit heads;  // every rank's query and KV heads of this chunk
  FusedHeads qkv;   // head-sharded q | k | v in the wire dtype, [s, b, h_c + 2·h_kv_c, d]
  FusedHeads kv;    // cross-attention: k | v apart ([s_k, b, 2·h_kv_c, d]); qkv holds q only
  TensorView k() const { return kv.num_parts() ? kv.part(0) : qkv.part(1); }
  TensorView v() const { return kv.num_parts() ? kv.part(1) : qkv.part(2); }
  FusedHeads out;           // float32 head-sharded output
  std::vector<Tensor> lse;  // [b, h, s] of each piece (pieces_of)
};

struct UlyssesContext final : StrategyContext {
  std::vector<HeadChunk> chunks;
  HeadSplit heads;                      // every rank's query and KV heads
  std::vector<std::int64_t> tokens;     // every rank's n_r
  std::vector<std::int64_t> kv_tokens;  // cross-attention: every rank's k/v tokens; else empty
  AttentionParams params;
  DType dtype = DType::f32;  // storage / wire dtype
};

// A chunk's kernel calls: one per KV head while transposes travel (progress is driven between
// them), else one for the whole chunk.
std::int64_t pieces_of(const FusedHeads& qkv, bool overlapping) { return overlapping ? qkv.local_heads(1) : 1; }

// Heads [i·h/n, (i+1)·h/n) of a [b, s, h, d] view: piece i of n (query heads in whole groups).
TensorView piece(TensorView v, std::int64_t i, std::int64_t n) {
  const std::int64_t h = v.shape.h / n;
  v.data = v.row(0, 0, i * h);
  v.shape.h = h;
  return v;
}

// Runs compute(i, progress) for chunks i = 0..c−1 while chunk i+1's input transpose (post_in)
// and chunk i−1's output transpose (post_out) travel; `progress` drives them. Returns the
// seconds compute took.
template <class PostIn, class Compute, class PostOut>
double pipeline(const Communicator& comm, const char* what, int chunks, PostIn post_in, Compute compute,
                PostOut post_out) {
  std::vector<PendingTranspose> outs(static_cast<std::size_t>(chunks));
  PendingTranspose next = post_in(0);
  double compute_s = 0;
  for (int i = 0; i < chunks; ++i) {
    PendingTranspose current = std::exchange(next, PendingTranspose{});
    current.wait();
    if (i + 1 < chunks) next = post_in(i + 1);
    auto progress = [&] {
      next.test();
      if (i > 0) outs[std::size_t(i - 1)].test();
    };
    const double t0 = comm.now();
    compute(i, progress);
    const double t1 = comm.now();
    comm.trace(what, t0, t1);
    compute_s += t1 - t0;
    outs[std::size_t(i)] = post_out(i);
  }
  for (PendingTranspose& o : outs) o.wait();
  return compute_s;
}

class A2aStrategy final : public Strategy {
 public:
  using Strategy::Strategy;

  // Every rule is the heads' (Strategy's GQA rule among them, in check_ulysses_heads).
  void validate(const CpConfig&, int, const Shape&, std::int64_t) const override {}
  void validate_heads(const CpConfig& config, int cp, std::int64_t heads, std::int64_t kv_heads) const override {
    check_ulysses_heads(cp, heads, kv_heads, "cp", "a2a");
    if (config.overlap_chunks < 1)
      throw Error(
          fmt::format("overlap_chunks must be 1, or more for cp_comm_type a2a; got {} for a2a", config.overlap_chunks));
  }
  // Pipelining needs q and k|v in one transpose, so never with cross-attention.
  std::vector<StrategyOption> options() const override {
    StrategyOption chunks{
        "overlap-chunks",
        "N",
        "cut the heads into N chunks and pipeline their all-to-alls with compute (1 = plain Ulysses; at most "
        "the KV heads a rank holds; default: the planner's choice)",
        "overlap_chunks",
        "1",
        1024,
        "",
        [](const CpConfig& c) {
          return c.overlap_chunks == 1 ? std::vector<std::int64_t>() : std::vector<std::int64_t>{c.overlap_chunks};
        },
        [](CpConfig& c, const std::vector<std::int64_t>& v) { c.overlap_chunks = int(v.at(0)); }};
    chunks.cross = false;
    return {chunks};
  }
  std::string describe(const CpConfig& config, int cp, std::int64_t kv_heads) const override {
    if (cp == 1) return "";
    return fmt::format("  overlap_chunks {}: {}\n", ulysses_overlap_chunks(config.overlap_chunks, cp, kv_heads),
                       config.overlap_chunks > 1 ? "heads in chunks, their all-to-alls pipelined with compute"
                                                 : "plain all-to-alls");
  }
  // Every chunk count up to 8 that the KV heads allow (the planner weighs overlap against the
  // messages it adds).
  std::vector<CpConfig> tunings(const CpConfig& config, int cp, std::int64_t kv_heads) const override {
    std::vector<CpConfig> out;
    for (int c = 1; c <= 8 && ulysses_overlap_chunks(c, cp, kv_heads) == c; ++c) {
      out.push_back(config);
      out.back().overlap_chunks = c;
    }
    return out;
  }
  RankHeads heads_of(const CpConfig&, int cp, int rank, std::int64_t heads, std::int64_t kv_heads) const override {
    return ulysses_heads(cp, rank, heads, kv_heads);
  }
  // Every token's queries (at q_offset) against every key, on this rank's heads.
  std::int64_t work(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                    std::int64_t kv_heads) const override {
    const AttentionParams params = attention_params(config);
    return visible_pairs(params, {params.q_offset, q.s}, {0, kv_seq}) * q.b *
           ulysses_heads(cp, rank, q.h, kv_heads).q.count;
  }
  // The same pairs on every rank, counted once (per rank: every document walked again).
  std::vector<std::int64_t> work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                          std::int64_t kv_heads) const override {
    const AttentionParams params = attention_params(config);
    const std::int64_t pairs = visible_pairs(params, {params.q_offset, q.s}, {0, kv_seq});
    std::vector<std::int64_t> w(static_cast<std::size_t>(cp));
    for (int r = 0; r < cp; ++r) w[std::size_t(r)] = pairs * q.b * ulysses_heads(cp, r, q.h, kv_heads).q.count;
    return w;
  }
  // Balanced by heads, so never zigzag.
  TokenLayout token_layout(const CpConfig&) const override { return TokenLayout::contiguous; }

  std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                           const std::vector<std::vector<SeqChunk>>& q_chunks,
                                           const std::vector<std::vector<SeqChunk>>& kv_chunks, const TensorView& out,
                                           const TensorView& q, const TensorView& k, const TensorView& v,
                                           CpStats& stats) const override {
    const bool cross = is_cross(config, q_chunks, kv_chunks);
    auto ctx = std::make_unique<UlyssesContext>();
    for (const std::vector<SeqChunk>& chunks : q_chunks) ctx->tokens.push_back(total_tokens(chunks));
    if (cross)
      for (const std::vector<SeqChunk>& chunks : kv_chunks) ctx->kv_tokens.push_back(total_tokens(chunks));
    return run_forward(group, config, std::move(ctx), out, q, k, v, stats);
  }

 private:
  // ctx holds every rank's token counts (and k/v's under cross-attention). The inputs are
  // validated and agreed (the contract), so the unchecked transposes run straight away.
  std::unique_ptr<StrategyContext> run_forward(CpGroup& group, const CpConfig& config,
                                               std::unique_ptr<UlyssesContext> ctx, const TensorView& out,
                                               const TensorView& q, const TensorView& k, const TensorView& v,
                                               CpStats& stats) const {
    Communicator& comm = group.comm();
    const double t0 = comm.now();
    const bool cross = !ctx->kv_tokens.empty();
    ctx->heads = ulysses_head_split(comm.size(), q.shape.h, k.shape.h);
    ctx->params = attention_params(config);
    ctx->dtype = q.dtype;
    const int c = ulysses_overlap_chunks(config.overlap_chunks, comm.size(), k.shape.h);
    ctx->chunks.resize(std::size_t(c));  // never reallocated: transposes in flight point into them
    std::vector<FusedHeads> wire(static_cast<std::size_t>(c));  // the output in a bf16 wire dtype, while it travels
    auto post_in = [&](int i) {
      HeadChunk& ch = ctx->chunks[std::size_t(i)];
      ch.heads = ulysses_head_chunk(ctx->heads, c, i);
      const std::array<SeqShard, 3> part{{{q, ch.heads.q}, {k, ch.heads.kv}, {v, ch.heads.kv}}};
      if (!cross) return post_seq_to_head(comm, part, ctx->tokens, ch.qkv);  // in the wire dtype: the kernels take bf16
      post_seq_to_head(comm, std::span<const SeqShard>(part).last(2), ctx->kv_tokens, ch.kv).wait();
      return post_seq_to_head(comm, std::span<const SeqShard>(part).first(1), ctx->tokens, ch.qkv);
    };
    auto compute = [&](int i, auto progress) {
      HeadChunk& ch = ctx->chunks[std::size_t(i)];
      const TensorView hq = ch.qkv.part(0);
      ch.out = FusedHeads(DType::f32, hq.shape.b, ch.qkv.rank_tokens(), hq.shape.d, {hq.shape.h}, nullptr, hq.device);
      const std::int64_t n = pieces_of(ch.qkv, c > 1);
      for (std::int64_t p = 0; p < n; ++p) {
        ch.lse.push_back(lse_tensor(piece(hq, p, n).shape, hq.device));
        flash_attention_forward(piece(ch.out.part(0), p, n), ch.lse.back().view(), piece(hq, p, n), piece(ch.k(), p, n),
                                piece(ch.v(), p, n), ctx->params);
        progress();
      }
      stats.score_pairs +=
          visible_pairs(ctx->params, {ctx->params.q_offset, hq.shape.s}, {0, ch.k().shape.s}) * hq.shape.b * hq.shape.h;
    };
    auto post_out = [&](int i) {
      const HeadChunk& ch = ctx->chunks[std::size_t(i)];
      const std::array<SeqShard, 1> part{{{out, ch.heads.q}}};
      if (ctx->dtype == DType::f32) return post_head_to_seq(comm, ch.out, part);
      wire[std::size_t(i)] = ch.out.converted(ctx->dtype);
      return post_head_to_seq(comm, wire[std::size_t(i)], part);
    };
    const double compute_s = pipeline(comm, "flash forward", c, post_in, compute, post_out);
    stats.compute_s += compute_s;
    stats.comm_exposed_s += comm.now() - t0 - compute_s;
    return ctx;
  }

 public:
  void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    run_backward(group, static_cast<const UlyssesContext&>(context), false, dq, dk, dv, dout, stats);
  }
  // A float32 self-attention context computes its gradients in place: dk, dv over its k, v and dq
  // over its out (flash_attention_backward allows it), then dq over q, so each chunk's q|k|v
  // buffer becomes the q|k|v gradients that travel back; no second head-sharded buffer. The
  // head-sharded dout lands in dq's memory where it fits (dout_storage).
  void backward_consuming(CpGroup& group, StrategyContext& context, const TensorView& dq, const TensorView& dk,
                          const TensorView& dv, const TensorView& dout, CpStats& stats) const override {
    const auto& ctx = static_cast<const UlyssesContext&>(context);
    run_backward(group, ctx, ctx.dtype == DType::f32 && ctx.kv_tokens.empty(), dq, dk, dv, dout, stats);
  }

 private:
  void run_backward(CpGroup& group, const UlyssesContext& ctx, bool in_place, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, const TensorView& dout, CpStats& stats) const {
    Communicator& comm = group.comm();
    const double t0 = comm.now();
    const bool cross = !ctx.kv_tokens.empty();
    const int c = int(ctx.chunks.size());
    std::vector<FusedHeads> hdout(static_cast<std::size_t>(c)), grads(static_cast<std::size_t>(c));
    FusedHeads kv_grads;  // cross-attention (one chunk): dk | dv apart
    const std::vector<void*> hdout_at = in_place ? dout_storage(ctx, dq, dout) : std::vector<void*>(std::size_t(c));
    auto post_in = [&](int i) {
      const std::array<SeqShard, 1> part{{{dout, ctx.chunks[std::size_t(i)].heads.q}}};
      return post_seq_to_head(comm, part, ctx.tokens, hdout[std::size_t(i)], hdout_at[std::size_t(i)]);
    };
    auto compute = [&](int i, auto progress) {
      const HeadChunk& ch = ctx.chunks[std::size_t(i)];
      const FusedHeads& qkv = ch.qkv;
      const std::array<TensorView, 3> grad = in_place ? std::array{ch.out.part(0), ch.k(), ch.v()}
                                                      : allocate_grads(ctx, ch, grads[std::size_t(i)], kv_grads);
      const std::int64_t n = std::int64_t(ch.lse.size());
      for (std::int64_t p = 0; p < n; ++p) {
        auto at = [&](const TensorView& t) { return piece(t, p, n); };
        flash_attention_backward(at(grad[0]), at(grad[1]), at(grad[2]), at(hdout[std::size_t(i)].part(0)),
                                 at(qkv.part(0)), at(ch.k()), at(ch.v()), at(ch.out.part(0)),
                                 ch.lse[std::size_t(p)].view(), ctx.params);
        progress();
      }
      if (in_place) copy(grad[0], qkv.part(0));
      stats.score_pairs += visible_pairs(ctx.params, {ctx.params.q_offset, qkv.seq()}, {0, ch.k().shape.s}) *
                           qkv.batch() * qkv.local_heads(0);
    };
    auto post_out = [&](int i) {
      const HeadSplit& h = ctx.chunks[std::size_t(i)].heads;
      const std::array<SeqShard, 3> part{{{dq, h.q}, {dk, h.kv}, {dv, h.kv}}};
      if (!cross)
        return post_head_to_seq(comm, in_place ? ctx.chunks[std::size_t(i)].qkv : grads[std::size_t(i)], part);
      post_head_to_seq(comm, kv_grads, std::span<const SeqShard>(part).last(2)).wait();
      return post_head_to_seq(comm, grads[std::size_t(i)], std::span<const SeqShard>(part).first(1));
    };
    const double compute_s = pipeline(comm, "flash backward", c, post_in, compute, post_out);
    stats.compute_s += compute_s;
    stats.comm_exposed_s += comm.now() - t0 - compute_s;
  }

  // Where each chunk's head-sharded dout goes: back to back in dq's memory when dq is dense,
  // holds them all and does not overlap dout (which has dq's shape; dq is written only by the
  // head→seq unpacks, after every chunk's kernel: scratch until then); else null, buffers of
  // their own.
  static std::vector<void*> dout_storage(const UlyssesContext& ctx, const TensorView& dq, const TensorView& dout) {
    std::vector<void*> at(ctx.chunks.size(), nullptr);
    auto dense = [](const TensorView& t) { return t.is_dense(Layout::bshd) || t.is_dense(Layout::bhsd); };
    const std::size_t have = std::size_t(dq.shape.numel()) * dtype_size(dq.dtype);
    std::byte* const lo = static_cast<std::byte*>(dq.data);
    const std::byte* g = static_cast<const std::byte*>(dout.data);
    if (!dense(dq) || !dense(dout) || dq.dtype != ctx.dtype || (g < lo + have && lo < g + have)) return at;
    std::size_t used = 0;
    for (std::size_t i = 0; i < at.size(); ++i) {
      const std::size_t bytes =
          FusedHeads::bytes_for(ctx.dtype, dq.shape.b, ctx.tokens, dq.shape.d, {ctx.chunks[i].qkv.local_heads(0)});
      if (used + bytes > have) return std::vector<void*>(ctx.chunks.size(), nullptr);
      at[i] = lo + used;
      used += bytes;
    }
    return at;
  }

  // A chunk's head-sharded dq, dk, dv in new buffers: grads (dq | dk | dv, or dq alone under
  // cross-attention, with dk | dv in kv_grads).
  static std::array<TensorView, 3> allocate_grads(const UlyssesContext& ctx, const HeadChunk& ch, FusedHeads& grads,
                                                  FusedHeads& kv_grads) {
    const FusedHeads& qkv = ch.qkv;
    const std::int64_t hkv = ch.k().shape.h;
    if (ctx.kv_tokens.empty()) {
      grads = FusedHeads(ctx.dtype, qkv.batch(), qkv.rank_tokens(), qkv.head_dim(), {qkv.local_heads(0), hkv, hkv},
                         nullptr, qkv.device());
      return {grads.part(0), grads.part(1), grads.part(2)};
    }
    grads = FusedHeads(ctx.dtype, qkv.batch(), qkv.rank_tokens(), qkv.head_dim(), {qkv.local_heads(0)}, nullptr,
                       qkv.device());
    kv_grads = FusedHeads(ctx.dtype, qkv.batch(), ctx.kv_tokens, qkv.head_dim(), {hkv, hkv}, nullptr, qkv.device());
    return {grads.part(0), kv_grads.part(0), kv_grads.part(1)};
  }

 public:
  // The plain transposes' bytes, in c× the messages (every chunk has heads on every rank).
  // Cross-attention: q and k|v each transposed on their own token counts, so the q-only
  // directions keep one message per peer and the k|v ones add one.
  // Read through traffic_key: its tokens (of q and, under cross-attention, of k/v) and head counts.
  CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                     std::int64_t kv_heads, DType dtype) const override {
    return keyed_traffic(config, cp, rank, traffic_key(config, cp, rank, q, kv_seq, kv_heads), q, kv_seq, kv_heads,
                         dtype);
  }
  CommVolume keyed_traffic(const CpConfig& config, int cp, int, const TrafficKey& key, const Shape& q,
                           std::int64_t kv_seq, std::int64_t kv_heads, DType dtype) const override {
    const RankHeads mine{{0, key[1]}, {0, key[2]}};  // the volumes read the counts alone
    const std::int64_t row_bytes = q.b * q.d * std::int64_t(dtype_size(dtype));
    CommVolume v;
    if (is_cross(config, q.s, kv_seq)) {
      add_ulysses_cross_volume(v, "", cp, key[0], q.s, key[3], kv_seq, mine, q.h, ulysses_kv_heads_held(cp, kv_heads),
                               row_bytes);
      return v;
    }
    add_ulysses_volume(v, "", cp, key[0], q.s, mine, q.h, ulysses_kv_heads_held(cp, kv_heads), row_bytes);
    const int c = ulysses_overlap_chunks(config.overlap_chunks, cp, kv_heads);
    for (auto* m : {&v.forward_messages, &v.backward_messages})
      for (auto& [op, n] : *m) n *= c;
    return v;
  }
  TrafficKey traffic_key(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                         std::int64_t kv_heads) const override {
    const RankHeads h = ulysses_heads(cp, rank, q.h, kv_heads);
    const std::int64_t kv_tokens = is_cross(config, q.s, kv_seq) ? tokens_held(config, cp, rank, 1, kv_seq) : 0;
    return {tokens_held(config, cp, rank, 1, q.s), h.q.count, h.kv.count, kv_tokens};
  }
  // The same, every rank's tokens read at once.
  std::vector<TrafficKey> traffic_keys(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                       std::int64_t kv_heads) const override {
    const bool cross = is_cross(config, q.s, kv_seq);
    const std::vector<std::int64_t> tokens = tokens_of_ranks(config, cp, q.s),
                                    kv_tokens = cross ? tokens_of_ranks(config, cp, kv_seq) : tokens;
    std::vector<TrafficKey> keys(static_cast<std::size_t>(cp));
    for (int r = 0; r < cp; ++r) {
      const RankHeads h = ulysses_heads(cp, r, q.h, kv_heads);
      keys[std::size_t(r)] = {tokens[std::size_t(r)], h.q.count, h.kv.count, cross ? kv_tokens[std::size_t(r)] : 0};
    }
    return keys;
  }

  // Kept: head-sharded q | k | v in `dtype` and out (float32) over the whole sequence, and lse.
  // Forward: the first transpose (the fused heads, their packed sequence shards and lse), or
  // the second (what is kept and out's heads twice in `dtype`, packed and converted). A float32
  // backward computes in the context's buffers and receives dout into dq's
  // (backward_consuming): what is left grows with the other ranks' share of the transposes'
  // send and receive buffers, 0.1 + 0.92·(cp − 1)/cp contexts, fitted to the headline at cp = 2
  // and 4 and the a2a shapes of train_memory_test.sh (1.7 before, as bf16 still is).
  StrategyMemory memory(const CpConfig&, int cp, const Shape& q, std::int64_t kv_seq, std::int64_t kv_heads,
                        DType dtype) const override {
    const HeadSplit split = ulysses_head_split(cp, q.h, kv_heads);
    const double h = double(most_heads(split.q)), kv = double(most_heads(split.kv));
    const double es = double(dtype_size(dtype)), d = double(q.d), b = double(q.b);
    const double tokens = b * double(q.s), kv_tokens = b * double(kv_seq);
    const double heads = es * (tokens * h + 2 * kv_tokens * kv) * d, lse = 4 * tokens * h;
    const double kept = heads + 4 * tokens * h * d + lse;
    const double shards =
        es * b * (double((q.s + cp - 1) / cp) * double(q.h) + 2 * double((kv_seq + cp - 1) / cp) * double(kv_heads)) *
        d;
    const double forward = std::max(heads + shards + lse, kept + 2 * es * tokens * h * d);
    return {forward, kept, kept * (dtype == DType::f32 ? 0.1 + 0.92 * double(cp - 1) / double(cp) : 1.7)};
  }

  // Each transpose as c all-to-alls of 1/c of the bytes; the pipeline hides what travels while
  // a chunk computes (pipeline_exposed).
  StrategyCost cost(const PlanInput& in, const CpConfig& config, const CommVolume& v, double fwd_s,
                    double /*bwd_s: kernel_model's at its blocks*/) const override {
    const Cluster& cl = in.cluster;
    const int c = ulysses_overlap_chunks(config.overlap_chunks, in.cp, in.kv_heads);
    StrategyCost r;
    // c calls (one per chunk of heads) over the full sequence on the busiest rank's heads
    const HeadSplit split = ulysses_head_split(in.cp, in.heads, in.kv_heads);
    const double b = double(in.batch) / c;
    const KernelSeconds k =
        attention_seconds(in,
                          {c, double(in.seq), double(kv_seq_of(in)), b * double(most_heads(split.q)),
                           b * double(most_heads(split.kv)), config.causal ? 1.0 : 0.0, false},
                          fwd_s);
    r.compute_s = k.fwd + k.bwd;
    double exposed = 0;
    for (const auto& [bytes, compute_s] : {std::pair{&v.forward_bytes, k.fwd}, std::pair{&v.backward_bytes, k.bwd}}) {
      const double in_s = all_to_all_seconds(cl, in.cp, double(bytes->at("seq_to_head")) / c);
      const double out_s = all_to_all_seconds(cl, in.cp, double(bytes->at("head_to_seq")) / c);
      r.comm_s += c * (in_s + out_s);
      exposed += pipeline_exposed(c, in_s, out_s, compute_s / c);
    }
    r.hidden_s = r.comm_s - exposed;
    return r;
  }
};

}  // namespace

std::unique_ptr<Strategy> make_a2a_strategy() {
  return std::make_unique<A2aStrategy>(
      StrategyTraits{.name = "a2a",
                     .summary = "DeepSpeed-Ulysses: all-to-all seq->head, attention on h/cp heads over the full "
                                "sequence, all-to-all back",
                     .accepts = {.documents = true, .window = true, .cross = true}});
}

}  // namespace ulysses
