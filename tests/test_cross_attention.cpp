// Cross-attention (q of s tokens, k/v of s_k, each sharded over cp by its own rank_chunks):
// every strategy that supports it (all four built-ins; a2a+p2p at every [inner, outer]) against
// the float64 reference, forward and all gradients, with and without a causal mask at an
// explicit q_offset, GQA/MQA, bf16 and f32, token counts that do not divide by cp; exact bytes
// and messages against Strategy::traffic; the visible pairs computed (the ring skips fully masked
// chunks, no pair counted twice); the same clear error on every rank for what is refused.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>

#include "mpi_helpers.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"

using namespace ulysses;
using ulysses::testing::forward_backward_counted;
using ulysses::testing::select_rows;

namespace {

std::int64_t counted(const std::map<std::string, CommCounter>& m, const std::string& op, bool messages) {
  auto it = m.find(op);
  return it == m.end() ? 0 : messages ? it->second.messages : it->second.bytes_sent;
}

struct Case {
  std::int64_t b, sq, sk, h, hkv, d;
  std::optional<std::int64_t> q_offset;  // set: causal at this offset; unset: no mask
  DType dtype;
};

// One rank's shards of a global cross-attention problem and the reference's rows for them.
struct CrossProblem {
  Tensor q, k, v, dout, out, dq, dk, dv;
  RefTensor rout, rdq, rdk, rdv;
  CrossProblem(const Case& c, const CpConfig& cfg, int cp, int rank) {
    Tensor gq({c.b, c.sq, c.h, c.d}, c.dtype), gk({c.b, c.sk, c.hkv, c.d}, c.dtype), gv(gk.shape(), c.dtype),
        gdout(gq.shape(), c.dtype);
    for (auto [t, i] : {std::pair{&gq, 0}, {&gk, 1}, {&gv, 2}, {&gdout, 3}})
      fill_uniform(t->view(), 7 + std::uint64_t(i));
    const RefTensor rq = RefTensor::from(gq.view()), rk = RefTensor::from(gk.view()), rv = RefTensor::from(gv.view());
    const AttentionParams p{c.q_offset.has_value(), std::nullopt, c.q_offset.value_or(0), 0};
    RefTensor gout, gdq, gdk, gdv;
    std::vector<double> lse;
    reference_attention_forward(gout, lse, rq, rk, rv, p);
    reference_attention_backward(gdq, gdk, gdv, RefTensor::from(gdout.view()), rq, rk, rv, p);
    const auto qc = rank_chunks(cfg, cp, rank, c.sq), kc = rank_chunks(cfg, cp, rank, c.sk);
    q = shard_of(gq.view(), qc, c.dtype, Layout::bshd);
    dout = shard_of(gdout.view(), qc, c.dtype, Layout::bshd);
    k = shard_of(gk.view(), kc, c.dtype, Layout::bshd);
    v = shard_of(gv.view(), kc, c.dtype, Layout::bshd);
    for (auto [grad, like] : {std::pair{&out, &q}, {&dq, &q}, {&dk, &k}, {&dv, &k}})
      *grad = Tensor(like->shape(), c.dtype, Layout::bshd);
    rout = select_rows(gout, token_positions(qc));
    rdq = select_rows(gdq, token_positions(qc));
    rdk = select_rows(gdk, token_positions(kc));
    rdv = select_rows(gdv, token_positions(kc));
  }
};

std::vector<Case> cases(int cp) {
  return {Case{2, 4 * cp, 7 * cp + 1, 2 * cp, cp, 16, std::nullopt, DType::f32},   // encoder-decoder, no mask
          Case{1, 3 * cp + 1, 9 * cp, 2 * cp, 1, 8, std::nullopt, DType::f32},     // MQA, uneven q
          Case{1, 5 * cp, 8 * cp + 3, 4 * cp, 2 * cp, 8, 3 * cp + 3, DType::f32},  // prefix: last queries
          Case{2, 6 * cp + 1, 4 * cp, 2 * cp, cp, 16, 0, DType::f32},              // sq > sk, causal at 0
          Case{2, 4 * cp, 6 * cp, 2 * cp, cp, 16, 2 * cp, DType::bf16},
          Case{1, 70, 90, 2 * cp, cp, 32, 20, DType::f32}};  // crosses a kernel block
}

// The (query, key) pairs rank `rank` computes: its query tokens (the ring's own; a2a+p2p's
// inner group's) against all of s_k, on its heads. Only for the ring strategies here; every
// strategy's ranks together compute each visible pair on each head once (checked below).
std::int64_t ring_work(const Strategy& s, const CpConfig& cfg, int cp, int rank, const Case& c) {
  const int group = s.hierarchical() ? cfg.hierarchical_context_parallel_sizes[0] : 1, first = rank / group * group;
  const AttentionParams p{cfg.causal, std::nullopt, 0, 0};
  std::int64_t pairs = 0;
  for (int r = first; r < first + group; ++r)
    for (const SeqChunk& q : rank_chunks(cfg, cp, r, c.sq))
      pairs += visible_pairs(p, {q.begin + c.q_offset.value_or(0), q.length}, {0, c.sk});
  return pairs * c.b * s.heads_of(cfg, cp, rank, c.h, c.hkv).q.count;
}

}  // namespace

// Every strategy, and a2a+p2p at every [inner, outer] with inner · outer = cp.
COMM_TEST(Cross, EverySupportingStrategyMatchesFloat64ReferenceWithExactBytes) {
  const int cp = comm.size(), me = comm.rank();
  for (const Case& c : cases(cp))
    for (const Strategy* s : strategies()) {
      if (!s->supports_cross()) continue;
      for (CpConfig cfg : s->plan_configs(cp, c.q_offset.has_value())) {
        cfg.q_offset = c.q_offset;
        SCOPED_TRACE(fmt::format("{} sq {} sk {} h {} h_kv {} q_offset {} {}", s->config_name(cfg), c.sq, c.sk, c.h,
                                 c.hkv, c.q_offset.value_or(-1), to_string(c.dtype)));
        CrossProblem p(c, cfg, cp, me);
        ContextParallelAttention attn(comm, cfg);
        std::pair<CpStats, CpStats> stats;
        const auto [fwd, bwd] = forward_backward_counted(comm, attn, p, &stats);
        const double tol_out = c.dtype == DType::f32 ? 1e-5 : 1e-2, tol_grad = c.dtype == DType::f32 ? 1e-4 : 2.5e-2;
        EXPECT_LT(relative_error(p.out.view(), p.rout), tol_out);
        EXPECT_LT(relative_error(p.dq.view(), p.rdq), tol_grad);
        EXPECT_LT(relative_error(p.dk.view(), p.rdk), tol_grad);
        EXPECT_LT(relative_error(p.dv.view(), p.rdv), tol_grad);
        const std::int64_t all_pairs =
            visible_pairs(AttentionParams{cfg.causal, std::nullopt, 0, 0}, {c.q_offset.value_or(0), c.sq}, {0, c.sk}) *
            c.b * c.h;
        for (const std::int64_t pairs : {stats.first.score_pairs, stats.second.score_pairs}) {
          const std::vector<std::int64_t> every = comm.allgather_value(pairs, "test");
          EXPECT_EQ(std::accumulate(every.begin(), every.end(), std::int64_t(0)), all_pairs);
          if (s->name() == "p2p" || s->hierarchical()) EXPECT_EQ(pairs, ring_work(*s, cfg, cp, me, c));
          EXPECT_EQ(pairs, s->work(cfg, cp, me, {c.b, c.sq, c.h, c.d}, c.sk, c.hkv));
        }
        if (cp == 1) continue;
        const CommVolume want = s->traffic(cfg, cp, me, {c.b, c.sq, c.h, c.d}, c.sk, c.hkv, c.dtype);
        for (bool m : {false, true}) {
          for (const auto& [op, n] : m ? want.forward_messages : want.forward_bytes)
            EXPECT_EQ(counted(fwd, op, m), n) << op;
          for (const auto& [op, n] : m ? want.backward_messages : want.backward_bytes)
            EXPECT_EQ(counted(bwd, op, m), n) << op;
        }
        for (const auto& [op, n] : fwd) EXPECT_TRUE(op.ends_with("validate") || want.forward_bytes.count(op)) << op;
        for (const auto& [op, n] : bwd) EXPECT_TRUE(op.ends_with("validate") || want.backward_bytes.count(op)) << op;
      }
    }
}

COMM_TEST(Cross, RefusalsAreTheSameErrorEverywhereBeforeAnyData) {
  const int cp = comm.size();
  Tensor q({1, 3, 2 * cp, 8}), out(q.shape()), kv({1, 5, cp, 8});
  auto expect = [&](CpConfig cfg, const std::string& needle) {
    ContextParallelAttention attn(comm, cfg);
    comm.reset_counters();
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), kv.view(), kv.view()); }, needle);
    for (const auto& [op, n] : comm.counters()) EXPECT_TRUE(op.ends_with("validate") || n.bytes_sent == 0) << op;
  };
  expect(CpConfig{"a2a", {}, true, std::nullopt}, "cross-attention with a causal mask needs q_offset");
  CpConfig overlap{"a2a", {}, false, std::nullopt};
  overlap.overlap_chunks = 2;
  if (cp > 1) expect(overlap, "overlap_chunks must be 1 with cross-attention");
  for (const char* ring : {"p2p", "a2a+p2p"}) {  // the ring's halo exchange is self-attention only
    CpConfig window = find_strategy(ring).plan_configs(cp, false).front();
    window.window_left = 2;
    expect(window, "cross-attention does not take a sliding window");
  }
  for (const Strategy* s : strategies())
    if (!s->supports_cross() && cp > 1) {
      CpConfig cfg = s->plan_configs(cp, false).front();
      expect(cfg, fmt::format("cp_comm_type {} does not support cross-attention", s->name()));
    }
  // Self-attention strategies keep their rules: a causal mask with sq == sk needs no offset.
  EXPECT_NO_THROW(validate_cp_config(CpConfig{"a2a", {}, true, std::nullopt}, cp, {1, 4 * cp, cp, 8}, cp, 4 * cp));
  EXPECT_THROW(validate_cp_config(CpConfig{"a2a", {}, true, std::nullopt}, cp, {1, 4 * cp, cp, 8}, cp, 5 * cp), Error);
}
