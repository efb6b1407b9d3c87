// Ulysses (cp_comm_type a2a) against the float64 single-process reference at every rank
// count: forward and all gradients, batch > 1, both layouts, bf16, GQA split and replicated;
// exact byte counts; the same clear error on every rank for every bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "mpi_helpers.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/reference.hpp"

using namespace ulysses;

namespace {

struct Case {
  std::int64_t b, sl;  // batch, tokens per rank
  int heads_per_rank;
  int kv;              // KV heads: 0 means "one per rank" (split); otherwise that many
  std::int64_t d;
  bool causal;
  Layout layout;
  DType dtype;
};

std::string name_of(const Case& c) {
  return "b" + std::to_string(c.b) + "_sl" + std::to_string(c.sl) + "_hpr" + std::to_string(c.heads_per_rank) +
         "_kv" + (c.kv == 0 ? std::string("cp") : std::to_string(c.kv)) + "_d" + std::to_string(c.d) +
         (c.causal ? "_causal_" : "_full_") + to_string(c.layout) + "_" + to_string(c.dtype);
}

RefTensor slice_seq(const RefTensor& t, std::int64_t s0, std::int64_t n) {
  RefTensor r({t.shape.b, n, t.shape.h, t.shape.d});
  for (std::int64_t b = 0; b < t.shape.b; ++b)
    for (std::int64_t s = 0; s < n; ++s)
      for (std::int64_t h = 0; h < t.shape.h; ++h)
        for (std::int64_t x = 0; x < t.shape.d; ++x) r.at(b, s, h, x) = t.at(b, s0 + s, h, x);
  return r;
}

class UlyssesTest : public ::testing::TestWithParam<Case> {};

TEST_P(UlyssesTest, MatchesFloat64Reference) {
  const Case c = GetParam();
  Comm comm;
  const int cp = comm.size(), rank = comm.rank();
  const std::int64_t h = std::int64_t(c.heads_per_rank) * cp, hkv = c.kv == 0 ? cp : c.kv;
  const std::int64_t s = c.sl * cp;
  // This rank's shards: the same hash values as the global tensors at offset rank·s/cp.
  Tensor q({c.b, c.sl, h, c.d}, c.dtype, c.layout), k({c.b, c.sl, hkv, c.d}, c.dtype, c.layout),
      v({c.b, c.sl, hkv, c.d}, c.dtype, c.layout), dout({c.b, c.sl, h, c.d}, c.dtype, c.layout);
  const std::int64_t off = rank * c.sl;
  fill_uniform(q.view(), 1, off);
  fill_uniform(k.view(), 2, off);
  fill_uniform(v.view(), 3, off);
  fill_uniform(dout.view(), 4, off);
  Tensor out({c.b, c.sl, h, c.d}, c.dtype, c.layout), dq({c.b, c.sl, h, c.d}, c.dtype, c.layout),
      dk({c.b, c.sl, hkv, c.d}, c.dtype, c.layout), dv({c.b, c.sl, hkv, c.d}, c.dtype, c.layout);
  ContextParallelAttention attn(comm, CpConfig{CpCommType::a2a, {}, c.causal, 0.0f});
  attn.forward(out.view(), q.view(), k.view(), v.view());
  attn.backward(dq.view(), dk.view(), dv.view(), dout.view());

  // The reference sees the global tensors (rounded to the storage dtype, as the shards are).
  Tensor gq({c.b, s, h, c.d}, c.dtype), gk({c.b, s, hkv, c.d}, c.dtype), gv({c.b, s, hkv, c.d}, c.dtype),
      gdout({c.b, s, h, c.d}, c.dtype);
  fill_uniform(gq.view(), 1);
  fill_uniform(gk.view(), 2);
  fill_uniform(gv.view(), 3);
  fill_uniform(gdout.view(), 4);
  const RefTensor rq = RefTensor::from(gq.view()), rk = RefTensor::from(gk.view()), rv = RefTensor::from(gv.view());
  AttentionParams p{c.causal, 0.0f, 0, 0};
  RefTensor rout, rdq, rdk, rdv;
  std::vector<double> lse;
  reference_attention_forward(rout, lse, rq, rk, rv, p);
  reference_attention_backward(rdq, rdk, rdv, RefTensor::from(gdout.view()), rq, rk, rv, p);

  const double tol_out = c.dtype == DType::f32 ? 1e-5 : 1e-2;
  const double tol_grad = c.dtype == DType::f32 ? 1e-4 : 2.5e-2;
  EXPECT_LT(relative_error(out.view(), slice_seq(rout, off, c.sl)), tol_out);
  EXPECT_LT(relative_error(dq.view(), slice_seq(rdq, off, c.sl)), tol_grad);
  EXPECT_LT(relative_error(dk.view(), slice_seq(rdk, off, c.sl)), tol_grad);
  EXPECT_LT(relative_error(dv.view(), slice_seq(rdv, off, c.sl)), tol_grad);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, UlyssesTest,
    ::testing::Values(Case{1, 9, 1, 0, 8, false, Layout::bshd, DType::f32},
                      Case{2, 13, 2, 0, 16, true, Layout::bshd, DType::f32},    // batch > 1
                      Case{2, 13, 2, 0, 16, true, Layout::sbhd, DType::f32},    // seq-first
                      Case{2, 11, 2, 1, 16, true, Layout::bshd, DType::f32},    // MQA: replicated
                      Case{1, 70, 2, 0, 32, true, Layout::bshd, DType::f32},    // crosses a block
                      Case{2, 12, 2, 1, 16, false, Layout::sbhd, DType::bf16},  // bf16, replicated
                      Case{1, 16, 1, 0, 64, true, Layout::bshd, DType::bf16}),
    [](const auto& info) { return name_of(info.param); });

TEST(Ulysses, ByteCountersOfOneForwardEqualTheSeedsFormula) {
  Comm comm;
  const int cp = comm.size();
  const std::int64_t b = 2, sl = 8, d = 16, h = 2 * cp;
  for (auto [dtype, hkv] : {std::pair{DType::f32, std::int64_t(cp)}, {DType::bf16, 1}}) {
    Tensor q({b, sl, h, d}, dtype), k({b, sl, hkv, d}, dtype), v({b, sl, hkv, d}, dtype), out({b, sl, h, d}, dtype);
    ContextParallelAttention attn(comm, CpConfig{});
    comm.reset_counters();
    attn.forward(out.view(), q.view(), k.view(), v.view());
    // (s/cp)·heads·d·(cp−1)/cp elements per rank per tensor (times the batch); K and V send
    // the KV heads actually transferred: max(h_kv, cp) slots after replication.
    const std::int64_t es = std::int64_t(dtype_size(dtype)), kv_sent = std::max<std::int64_t>(hkv, cp);
    const std::int64_t per_q = b * sl * h * d * (cp - 1) / cp, per_kv = b * sl * kv_sent * d * (cp - 1) / cp;
    EXPECT_EQ(comm.counters().at("seq_to_head").bytes_sent, (per_q + 2 * per_kv) * es);
    EXPECT_EQ(comm.counters().at("head_to_seq").bytes_sent, per_q * es);
    EXPECT_EQ(comm.counters().at("seq_to_head").calls, 1);  // Q, K and V fused in one all-to-all
    EXPECT_EQ(comm.counters().at("seq_to_head").messages, cp - 1);
  }
}

TEST(Ulysses, HeadsNotDivisibleByCpNamesValuesRuleAndP2p) {
  Comm comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  Tensor q({1, 4, cp + 1, 8}), k({1, 4, 1, 8}), out({1, 4, cp + 1, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out.view(), q.view(), k.view(), k.view()); },
      "num_heads (" + std::to_string(cp + 1) + ") must be divisible by cp (" + std::to_string(cp) + ")");
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out.view(), q.view(), k.view(), k.view()); }, "p2p");
}

TEST(Ulysses, InvalidKvHeadsGiveTheSameErrorEverywhere) {
  Comm comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  const std::int64_t hkv = cp + 1, h = cp * hkv;  // neither hkv % cp nor cp % hkv is 0
  Tensor q({1, 4, h, 8}), k({1, 4, hkv, 8}), out({1, 4, h, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out.view(), q.view(), k.view(), k.view()); },
      "num_kv_heads (" + std::to_string(hkv) + ") does not fit cp (" + std::to_string(cp) + ")");
}

TEST(Ulysses, ShapesThatDifferBetweenRanksAreRefusedEverywhere) {
  Comm comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  const std::int64_t sl = comm.rank() == cp - 1 ? 5 : 4;
  Tensor q({2, sl, cp, 8}), out({2, sl, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out.view(), q.view(), q.view(), q.view()); },
      "rank 0 has q [2, 4, " + std::to_string(cp) + ", 8]");
}

TEST(Ulysses, LocalShapeErrorsAndMisuseAreAgreed) {
  Comm comm;
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), bad_out({1, 4, cp, 16});
  Tensor out_ok({1, 4, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  // Only the last rank passes a wrong out; every rank must report it.
  const TensorView out = comm.rank() == cp - 1 ? bad_out.view() : out_ok.view();
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out, q.view(), q.view(), q.view()); }, "out must be [1, 4, ");
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.backward(q.view(), q.view(), q.view(), q.view()); }, "without a successful forward");
}

TEST(Ulysses, OtherStrategiesAreAClearErrorForNow) {
  Comm comm;
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), out({1, 4, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{CpCommType::p2p, {}, false, 0.0f});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.forward(out.view(), q.view(), q.view(), q.view()); }, "cp_comm_type p2p is not implemented");
  ContextParallelAttention hier(comm, CpConfig{CpCommType::a2a_p2p, {3, 7}, false, 0.0f});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { hier.forward(out.view(), q.view(), q.view(), q.view()); }, "inner * outer == cp");
}

}  // namespace
