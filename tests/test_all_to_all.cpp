// seq_to_head / head_to_seq and the variable-block collectives under them: analytic hash
// tensors, bit-exact round trips, the adjoint identity, exact byte counts, and agreed errors,
// with ranks holding different numbers of tokens and of heads. Runs at every rank count.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "mpi_helpers.hpp"
#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/core/bf16.hpp"
#include "ulysses/cp/sharding.hpp"

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

// Tokens of rank r in these tests: uneven (ranks differ by up to two) whatever cp is.
std::int64_t tokens_of(int r, std::int64_t base) { return base + r % 3; }
std::int64_t tokens_before(int r, std::int64_t base) {
  std::int64_t n = 0;
  for (int i = 0; i < r; ++i) n += tokens_of(i, base);
  return n;
}

// Every rank gets heads [r, r + 1) of a tensor with cp heads, or all share head 0 of one.
std::vector<HeadRange> one_each(int cp) { return ulysses_head_split(cp, cp, cp).kv; }
std::vector<HeadRange> all_share_one(int cp) { return std::vector<HeadRange>(std::size_t(cp), HeadRange{0, 1}); }

COMM_TEST(Collectives, VariableBlocksMoveExactlyTheirBytes) {
  const int cp = comm.size(), me = comm.rank();
  // Rank i sends i + j + 1 bytes of value 16·i + j to rank j (its own block too).
  auto size = [](int from, int to) { return std::size_t(from + to + 1); };
  std::vector<std::size_t> sb, so, rb, ro;
  std::size_t send_total = 0, recv_total = 0, others = 0;
  for (int j = 0; j < cp; ++j) {
    so.push_back(send_total);
    sb.push_back(size(me, j));
    send_total += sb.back();
    ro.push_back(recv_total);
    rb.push_back(size(j, me));
    recv_total += rb.back();
    if (j != me) others += size(me, j);
  }
  std::vector<unsigned char> send(send_total), recv(recv_total, 0xff);
  for (int j = 0; j < cp; ++j) std::memset(send.data() + so[std::size_t(j)], 16 * me + j, sb[std::size_t(j)]);
  comm.alltoallv(send.data(), sb, so, recv.data(), rb, ro, "v");
  std::int64_t bad = 0;
  for (int j = 0; j < cp; ++j)
    for (std::size_t x = 0; x < rb[std::size_t(j)]; ++x) bad += recv[ro[std::size_t(j)] + x] != 16 * j + me;
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(comm.counters().at("v").bytes_sent, std::int64_t(others));
  EXPECT_EQ(comm.counters().at("v").messages, cp - 1);
  // allgatherv: rank i contributes i + 1 floats of value i; reduce-scatter them back, summed.
  std::vector<std::size_t> counts, bytes;
  for (int j = 0; j < cp; ++j) {
    counts.push_back(std::size_t(j + 1));
    bytes.push_back(counts.back() * sizeof(float));
  }
  std::vector<float> mine(std::size_t(me + 1), float(me)), all(std::size_t(cp * (cp + 1) / 2), -1.0f);
  comm.allgatherv(mine, all, bytes, "g");
  for (int j = 0, at = 0; j < cp; at += j + 1, ++j) EXPECT_EQ(all[std::size_t(at + j)], float(j));
  std::vector<float> sum(std::size_t(me + 1));
  comm.reduce_scatter_sum(all, sum, counts, "rs");
  EXPECT_EQ(sum[0], float(me * cp));
  EXPECT_EQ(comm.counters().at("g").bytes_sent, std::int64_t((cp - 1) * (me + 1) * 4));
  EXPECT_EQ(comm.counters().at("rs").bytes_sent, std::int64_t((cp * (cp + 1) / 2 - (me + 1)) * 4));
}

COMM_TEST(SeqToHead, HashTensorsLandWhereTheSeedSays) {
  const int cp = comm.size(), r = comm.rank();
  const std::int64_t b = 2, n = tokens_of(r, 5), d = 4, h = 2 * cp + 1;
  // q: 2cp + 1 heads split unevenly; k: one head per rank; v: ONE head every rank shares (MQA).
  Tensor q({b, n, h, d}), k({b, n, cp, d}, DType::f32, Layout::sbhd), v({b, n, 1, d});
  for (const Tensor* t : {&q, &k, &v}) fill_hash(t->view(), tokens_before(r, 5));
  const std::array<SeqShard, 3> in{
      {{q.view(), ulysses_head_split(cp, h, h).q}, {k.view(), one_each(cp)}, {v.view(), all_share_one(cp)}}};
  FusedHeads out = seq_to_head(comm, in);
  EXPECT_EQ(out.seq(), tokens_before(cp, 5));
  std::int64_t bad = 0;
  for (int t = 0; t < 3; ++t) {
    const TensorView p = out.part(t);
    EXPECT_EQ(out.local_heads(t), in[std::size_t(t)].heads[std::size_t(r)].count);
    std::vector<float> row(static_cast<std::size_t>(d));
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t s = 0; s < out.seq(); ++s)  // row s of the gathered sequence is global position s
        for (std::int64_t i = 0; i < out.local_heads(t); ++i) {
          load_row(p, bb, s, i, row.data());
          const std::int64_t head = in[std::size_t(t)].heads[std::size_t(r)].first + i;
          for (std::int64_t x = 0; x < d; ++x) bad += row[std::size_t(x)] != hash_value(bb, s, head, x);
        }
  }
  EXPECT_EQ(bad, 0);
}

// Each transpose agrees its inputs and learns every rank's n_r in one small collective before
// its all-to-all: the checks, the descriptions and the token counts travel together.
COMM_TEST(SeqToHead, OneAgreementBeforeEachAllToAll) {
  const int cp = comm.size(), r = comm.rank();
  Tensor q({2, tokens_of(r, 5), 2 * cp, 8}, DType::f32, Layout::bshd);
  fill_uniform(q.view(), 3, tokens_before(r, 5));
  const std::array<SeqShard, 1> in{{{q.view(), ulysses_head_split(cp, 2 * cp, 2 * cp).q}}};
  const std::int64_t before = comm.collectives();
  FusedHeads x = seq_to_head(comm, in);
  EXPECT_EQ(comm.collectives() - before, 2);
  head_to_seq(comm, x, in);
  EXPECT_EQ(comm.collectives() - before, 4);
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<DType, Layout, Layout>> {};

COMM_TEST_P(RoundTrip, HeadToSeqInvertsSeqToHeadBitForBit) {
  const auto [dtype, in_layout, out_layout] = GetParam();
  const int cp = comm.size(), r = comm.rank();
  const std::int64_t b = 3, n = tokens_of(r, 7), d = 12, h = 3 * cp + 1;
  Tensor q({b, n, h, d}, dtype, in_layout), k({b, n, cp, d}, dtype, in_layout);
  fill_uniform(q.view(), 11, tokens_before(r, 7));
  fill_uniform(k.view(), 12, tokens_before(r, 7));
  const std::vector<HeadRange> qh = ulysses_head_split(cp, h, h).q;
  const std::array<SeqShard, 2> in{{{q.view(), qh}, {k.view(), one_each(cp)}}};
  FusedHeads x = seq_to_head(comm, in);
  Tensor q2(q.shape(), dtype, out_layout), k2(k.shape(), dtype, out_layout);
  const std::array<SeqShard, 2> out{{{q2.view(), qh}, {k2.view(), one_each(cp)}}};
  head_to_seq(comm, x, out);
  Tensor q3(q.shape(), dtype, in_layout), k3(k.shape(), dtype, in_layout);
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

COMM_TEST(SeqToHead, AdjointIdentityWithSharedHeads) {
  // <seq_to_head(x), y> == <x, head_to_seq(y)>, both sides summed over ranks: the adjoint of
  // sending a head to several ranks sums their gradients.
  const int cp = comm.size(), r = comm.rank();
  const std::int64_t b = 2, n = tokens_of(r, 6), d = 8, h = 2 * cp + 1;
  Tensor x0({b, n, h, d}), x1({b, n, 1, d});
  fill_uniform(x0.view(), 21, tokens_before(r, 6));
  fill_uniform(x1.view(), 22, tokens_before(r, 6));
  const std::vector<HeadRange> qh = ulysses_head_split(cp, h, h).q;
  const std::array<SeqShard, 2> xs{{{x0.view(), qh}, {x1.view(), all_share_one(cp)}}};
  FusedHeads ax = seq_to_head(comm, xs);
  FusedHeads y(DType::f32, b, ax.rank_tokens(), d, {ax.local_heads(0), ax.local_heads(1)});
  fill_uniform(y.part(0), 23 + std::uint64_t(r));
  fill_uniform(y.part(1), 99 + std::uint64_t(r));
  Tensor g0(x0.shape()), g1(x1.shape());
  const std::array<SeqShard, 2> gs{{{g0.view(), qh}, {g1.view(), all_share_one(cp)}}};
  head_to_seq(comm, y, gs);
  double sums[2] = {dot(ax.part(0), y.part(0)) + dot(ax.part(1), y.part(1)),
                    dot(x0.view(), g0.view()) + dot(x1.view(), g1.view())};
  comm.allreduce_sum(sums, 2);
  EXPECT_NEAR(sums[0], sums[1], 1e-5 * std::abs(sums[0]) + 1e-9);
}

COMM_TEST(SeqToHead, ByteCountersEqualTheFormula) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t b = 2, d = 8;
  for (bool even : {true, false})
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(even ? "even " : "uneven ") + to_string(dtype));
      comm.reset_counters();
      const std::int64_t h = even ? 2 * cp : 2 * cp + 1, n = even ? 4 : tokens_of(me, 4);
      const std::int64_t total = even ? 4 * cp : tokens_before(cp, 4);
      Tensor q({b, n, h, d}, dtype), k({b, n, 1, d}, dtype);
      const std::vector<HeadRange> qh = ulysses_head_split(cp, h, h).q;
      const std::array<SeqShard, 2> in{{{q.view(), qh}, {k.view(), all_share_one(cp)}}};
      FusedHeads x = seq_to_head(comm, in);
      const std::array<SeqShard, 1> o{{{q.view(), qh}}};
      FusedHeads xq = seq_to_head(comm, std::span<const SeqShard>(in.data(), 1));
      head_to_seq(comm, xq, o);
      // Our tokens of the heads the others get; the others' tokens of our heads. Evenly:
      // (s/cp)·heads·d·(cp−1)/cp elements per tensor, per batch row, K sending cp head slots.
      const std::int64_t es = std::int64_t(dtype_size(dtype)), mine = qh[std::size_t(me)].count;
      const std::int64_t q_out = b * n * (h - mine) * d * es, k_out = b * n * (cp - 1) * d * es;
      EXPECT_EQ(comm.counters().at("seq_to_head").bytes_sent, 2 * q_out + k_out);
      EXPECT_EQ(comm.counters().at("seq_to_head").calls, 2);
      EXPECT_EQ(comm.counters().at("seq_to_head").messages, 2 * (cp - 1));
      EXPECT_EQ(comm.counters().at("head_to_seq").bytes_sent, b * (total - n) * mine * d * es);
      if (even)
        EXPECT_EQ(comm.counters().at("seq_to_head").bytes_sent,
                  (2 * b * 4 * h * d * (cp - 1) / cp + b * 4 * d * (cp - 1)) * es);
    }
}

COMM_TEST(SeqToHead, ShapesDifferingBetweenRanksGiveTheSameErrorEverywhere) {
  const int cp = comm.size();
  if (cp == 1) return;  // needs two ranks (a skip would mark the local worlds of 2 to 4 skipped too)
  Tensor q({1, 4, cp, comm.rank() == 1 ? 12 : 8});  // token counts may differ, head dims may not
  const std::array<SeqShard, 1> in{{{q.view(), one_each(cp)}}};
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { seq_to_head(comm, in); }, "differ between ranks");
}

COMM_TEST(SeqToHead, HeadListsThatDoNotFitGiveTheSameErrorEverywhere) {
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8});
  std::vector<HeadRange> beyond = one_each(cp);
  if (comm.rank() == cp - 1) beyond.back().count = 2;  // one head past the end, on one rank only
  const std::array<SeqShard, 1> in{{{q.view(), beyond}}};
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { seq_to_head(comm, in); },
      "gives a rank heads [" + std::to_string(cp - 1) + ", " + std::to_string(cp + 1) + ") of its " +
          std::to_string(cp));
  const std::array<SeqShard, 1> short_list{{{q.view(), std::vector<HeadRange>(std::size_t(cp + 1))}}};
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { seq_to_head(comm, short_list); }, "lists the heads of " + std::to_string(cp + 1) + " ranks");
}

}  // namespace
