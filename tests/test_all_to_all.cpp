// seq_to_head / head_to_seq: analytic hash tensors, bit-exact round trips, the adjoint
// identity, exact byte counts, and agreed errors. Runs at every rank count.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "mpi_helpers.hpp"
#include "ulysses/all_to_all.hpp"
#include "ulysses/bf16.hpp"

using namespace ulysses;

namespace {

// Exact in float32 for b < 4, s < 1024, h < 64, d < 16.
float hash_value(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return float(((b * 1024 + s) * 64 + h) * 16 + d);
}

void fill_hash(const TensorView& v, std::int64_t s_offset) {
  std::vector<float> row(static_cast<std::size_t>(v.shape.d));
  for (std::int64_t b = 0; b < v.shape.b; ++b)
    for (std::int64_t s = 0; s < v.shape.s; ++s)
      for (std::int64_t h = 0; h < v.shape.h; ++h) {
        for (std::int64_t d = 0; d < v.shape.d; ++d) row[std::size_t(d)] = hash_value(b, s + s_offset, h, d);
        store_row(v, b, s, h, row.data());
      }
}

TEST(SeqToHead, HashTensorsLandWhereTheSeedSays) {
  MpiCommunicator comm;
  const int cp = comm.size(), r = comm.rank();
  const std::int64_t b = 2, sl = 5, d = 4;
  // q: 2 heads per rank; k: one head per rank; v: ONE head replicated cp times (MQA).
  Tensor q({b, sl, 2 * cp, d}), k({b, sl, cp, d}, DType::f32, Layout::sbhd), v({b, sl, 1, d});
  for (const Tensor* t : {&q, &k, &v}) fill_hash(t->view(), r * sl);
  const std::array<SeqShard, 3> in{{{q.view(), 1}, {k.view(), 1}, {v.view(), cp}}};
  FusedHeads out = seq_to_head(comm, in);
  ASSERT_EQ(out.seq(), sl * cp);
  const std::int64_t replicas[3] = {1, 1, cp};
  std::int64_t bad = 0;
  for (int t = 0; t < 3; ++t) {
    const TensorView p = out.part(t);
    const std::int64_t L = out.local_heads(t);
    std::vector<float> row(static_cast<std::size_t>(d));
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t s = 0; s < sl * cp; ++s)
        for (std::int64_t i = 0; i < L; ++i) {
          load_row(p, bb, s, i, row.data());
          // local head i of rank r is global slot r*L + i, i.e. source head slot / replicas;
          // position s of the gathered sequence came from rank s / sl.
          const std::int64_t head = (r * L + i) / replicas[t];
          for (std::int64_t x = 0; x < d; ++x) bad += row[std::size_t(x)] != hash_value(bb, s, head, x);
        }
  }
  EXPECT_EQ(bad, 0);
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<DType, Layout, Layout>> {};

TEST_P(RoundTrip, HeadToSeqInvertsSeqToHeadBitForBit) {
  const auto [dtype, in_layout, out_layout] = GetParam();
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::int64_t b = 3, sl = 7, d = 12;
  Tensor q({b, sl, 3 * cp, d}, dtype, in_layout), k({b, sl, cp, d}, dtype, in_layout);
  fill_uniform(q.view(), 11, comm.rank() * sl);
  fill_uniform(k.view(), 12, comm.rank() * sl);
  const std::array<SeqShard, 2> in{{{q.view(), 1}, {k.view(), 1}}};
  FusedHeads h = seq_to_head(comm, in);
  Tensor q2({b, sl, 3 * cp, d}, dtype, out_layout), k2({b, sl, cp, d}, dtype, out_layout);
  const std::array<SeqShard, 2> out{{{q2.view(), 1}, {k2.view(), 1}}};
  head_to_seq(comm, h, out);
  Tensor q3({b, sl, 3 * cp, d}, dtype, in_layout), k3({b, sl, cp, d}, dtype, in_layout);
  copy(q2.view(), q3.view());
  copy(k2.view(), k3.view());
  EXPECT_EQ(std::memcmp(q.data(), q3.data(), q.nbytes()), 0);
  EXPECT_EQ(std::memcmp(k.data(), k3.data(), k.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RoundTrip,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(Layout::bshd, Layout::sbhd),
                                            ::testing::Values(Layout::bshd, Layout::sbhd)));

double dot(const TensorView& a, const TensorView& b) {
  double acc = 0;
  std::vector<float> x(static_cast<std::size_t>(a.shape.d)), y(static_cast<std::size_t>(a.shape.d));
  for (std::int64_t bb = 0; bb < a.shape.b; ++bb)
    for (std::int64_t s = 0; s < a.shape.s; ++s)
      for (std::int64_t h = 0; h < a.shape.h; ++h) {
        load_row(a, bb, s, h, x.data());
        load_row(b, bb, s, h, y.data());
        for (std::int64_t i = 0; i < a.shape.d; ++i) acc += double(x[std::size_t(i)]) * y[std::size_t(i)];
      }
  return acc;
}

TEST(SeqToHead, AdjointIdentityWithReplicatedHeads) {
  // <seq_to_head(x), y> == <x, head_to_seq(y)>, both sides summed over ranks.
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::int64_t b = 2, sl = 6, d = 8;
  Tensor x0({b, sl, 2 * cp, d}), x1({b, sl, 1, d});
  fill_uniform(x0.view(), 21, comm.rank() * sl);
  fill_uniform(x1.view(), 22, comm.rank() * sl);
  const std::array<SeqShard, 2> xs{{{x0.view(), 1}, {x1.view(), cp}}};
  FusedHeads ax = seq_to_head(comm, xs);
  FusedHeads y(DType::f32, b, sl * cp, d, {ax.local_heads(0), ax.local_heads(1)});
  fill_uniform(y.part(0), 23 + std::uint64_t(comm.rank()));
  fill_uniform(y.part(1), 99 + std::uint64_t(comm.rank()));
  Tensor g0({b, sl, 2 * cp, d}), g1({b, sl, 1, d});
  const std::array<SeqShard, 2> gs{{{g0.view(), 1}, {g1.view(), cp}}};
  head_to_seq(comm, y, gs);
  double sums[2] = {dot(ax.part(0), y.part(0)) + dot(ax.part(1), y.part(1)),
                    dot(x0.view(), g0.view()) + dot(x1.view(), g1.view())};
  comm.allreduce_sum(sums, 2);
  EXPECT_NEAR(sums[0], sums[1], 1e-5 * std::abs(sums[0]) + 1e-9);
}

TEST(SeqToHead, ByteCountersEqualTheFormula) {
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::int64_t b = 2, sl = 4, d = 8, h = 2 * cp;
  for (DType dtype : {DType::f32, DType::bf16}) {
    comm.reset_counters();
    Tensor q({b, sl, h, d}, dtype), k({b, sl, 1, d}, dtype);
    const std::array<SeqShard, 2> in{{{q.view(), 1}, {k.view(), cp}}};
    FusedHeads x = seq_to_head(comm, in);
    const std::array<SeqShard, 1> o{{{q.view(), 1}}};
    FusedHeads xq = seq_to_head(comm, std::span<const SeqShard>(in.data(), 1));
    head_to_seq(comm, xq, o);
    // (s/cp)·heads·d·(cp−1)/cp elements per tensor, per batch row; K sends cp head slots.
    const std::int64_t es = std::int64_t(dtype_size(dtype));
    const std::int64_t q_elems = b * sl * h * d * (cp - 1) / cp, k_elems = b * sl * cp * d * (cp - 1) / cp;
    EXPECT_EQ(comm.counters().at("seq_to_head").bytes_sent, (2 * q_elems + k_elems) * es);
    EXPECT_EQ(comm.counters().at("seq_to_head").calls, 2);
    EXPECT_EQ(comm.counters().at("head_to_seq").bytes_sent, q_elems * es);
  }
}

TEST(SeqToHead, ShapesDifferingBetweenRanksGiveTheSameErrorEverywhere) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP() << "needs two ranks";
  Tensor q({1, comm.rank() == 1 ? 5 : 4, cp, 8});
  const std::array<SeqShard, 1> in{{{q.view(), 1}}};
  ulysses::testing::expect_same_error_everywhere(comm, [&] { seq_to_head(comm, in); }, "differ between ranks");
}

TEST(SeqToHead, HeadsNotDivisibleByCpGiveTheSameErrorEverywhere) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP() << "every head count divides by 1";
  Tensor q({1, 4, cp + 1, 8});
  const std::array<SeqShard, 1> in{{{q.view(), 1}}};
  ulysses::testing::expect_same_error_everywhere(comm, [&] { seq_to_head(comm, in); }, "not divisible by cp");
}

}  // namespace
