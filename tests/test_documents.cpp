// Packed documents (documents.hpp): the visible-pair count in closed form against a brute-force
// count, document lookup with empty documents, and the cu_seqlens checks.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "ulysses/core/documents.hpp"

using namespace ulysses;

namespace {

// Independent of documents.cpp: query p sees key j iff no boundary lies between them.
std::int64_t brute_pairs(const std::vector<std::int64_t>& cu, bool causal, const SeqChunk& q, const SeqChunk& k,
                         Window w = {}) {
  std::int64_t n = 0;
  for (std::int64_t p = q.begin; p < q.begin + q.length; ++p)
    for (std::int64_t j = k.begin; j < k.begin + k.length; ++j) {
      bool same = true;
      for (std::int64_t b : cu) same &= !(std::min(p, j) < b && b <= std::max(p, j));
      same &= (w.left < 0 || j >= p - w.left) && (w.right < 0 || j <= p + w.right);
      n += same && (!causal || j <= p);
    }
  return n;
}

// Random document lengths below `bound` (0: an empty document) that add up to s.
std::vector<std::int64_t> random_lengths(std::mt19937& rng, std::int64_t s, std::int64_t bound) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t left = s; left > 0;) {
    const std::int64_t n = std::min<std::int64_t>(left, std::int64_t(rng() % std::uint64_t(bound)));
    lengths.push_back(n);
    left -= n;
  }
  return lengths;
}

// A random case on at most 90 tokens: documents shorter than `bound` (none when `plain`), a
// query chunk and a key chunk.
struct PairCase {
  std::vector<std::int64_t> cu;
  SeqChunk q, k;
};
PairCase random_case(std::mt19937& rng, std::int64_t bound, bool plain) {
  const std::int64_t s = 1 + std::int64_t(rng() % 90);
  const std::vector<std::int64_t> lengths = random_lengths(rng, s, bound);
  PairCase c;
  if (!plain) c.cu = cu_seqlens_of(lengths);
  const std::int64_t qb = std::int64_t(rng() % std::uint64_t(s)), kb = std::int64_t(rng() % std::uint64_t(s));
  c.q = {qb, 1 + std::int64_t(rng() % std::uint64_t(s - qb))};
  c.k = {kb, 1 + std::int64_t(rng() % std::uint64_t(s - kb))};
  EXPECT_EQ(cu_seqlens_error(c.cu, s), "");
  return c;
}

TEST(Documents, VisiblePairsEqualABruteForceCount) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const auto [cu, q, k] = random_case(rng, 12, trial % 5 == 0);
    for (bool causal : {false, true})
      ASSERT_EQ(visible_pairs(cu, causal, q, k), brute_pairs(cu, causal, q, k))
          << "trial " << trial << " causal " << causal << " q " << q.begin << "+" << q.length << " k " << k.begin << "+"
          << k.length;
  }
}

TEST(Documents, WindowedVisiblePairsEqualABruteForceCount) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const auto [cu, q, k] = random_case(rng, 40, trial % 3 == 0);
    auto side = [&] {
      return rng() % 4 == 0 ? std::int64_t(-1) : std::int64_t(rng() % 3 == 0 ? rng() % 3 : rng() % 100);
    };
    const Window w{side(), side()};
    for (bool causal : {false, true}) {
      ASSERT_EQ(visible_pairs(cu, causal, q, k, w), brute_pairs(cu, causal, q, k, w))
          << "trial " << trial << " causal " << causal << " window " << w.left << "," << w.right << " q " << q.begin
          << "+" << q.length << " k " << k.begin << "+" << k.length;
      for (std::int64_t p = q.begin; p < q.begin + q.length; ++p) {  // the per-row interval agrees too
        const Document r = visible_keys(cu, causal, p, k, w);
        ASSERT_EQ(r.end - r.begin, brute_pairs(cu, causal, {p, 1}, k, w)) << "trial " << trial << " row " << p;
      }
    }
  }
}

// Windows and positions near INT64_MAX: the bounds saturate (saturating.hpp) and stay exact,
// against a brute-force count in 128-bit integers (no signed overflow: UBSan runs this).
TEST(Documents, WindowsAndPositionsNearInt64MaxSaturateExactly) {
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  auto brute = [](bool causal, const SeqChunk& q, const SeqChunk& k, Window w) {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < q.length; ++i)
      for (std::int64_t j = 0; j < k.length; ++j) {
        const __int128 p = __int128(q.begin) + i, key = __int128(k.begin) + j;
        n += (w.left < 0 || key >= p - w.left) && (w.right < 0 || key <= p + w.right) && (!causal || key <= p);
      }
    return n;
  };
  const std::vector<std::int64_t> windows = {-1, 0, 5, max - 120, max - 1, max};
  const std::vector<SeqChunk> chunks = {{0, 100}, {max - 64, 64}, {max - 100, 70}, {max - 200, 30}};
  for (const SeqChunk& q : chunks)
    for (const SeqChunk& k : chunks)
      for (std::int64_t left : windows)
        for (std::int64_t right : windows)
          for (bool causal : {false, true}) {
            const Window w{left, right};
            ASSERT_EQ(visible_pairs({}, causal, q, k, w), brute(causal, q, k, w))
                << "causal " << causal << " window " << left << "," << right << " q " << q.begin << " k " << k.begin;
            const Document r = visible_keys({}, causal, q.begin + q.length - 1, k, w);
            ASSERT_EQ(std::max<std::int64_t>(0, r.end - r.begin), brute(causal, {q.begin + q.length - 1, 1}, k, w));
          }
}

TEST(Documents, LookupSkipsEmptyDocuments) {
  const std::vector<std::int64_t> cu{0, 3, 3, 3, 7, 10};
  EXPECT_EQ(document_of(cu, 0).end, 3);
  EXPECT_EQ(document_of(cu, 3).begin, 3);
  EXPECT_EQ(document_of(cu, 3).end, 7);
  EXPECT_EQ(document_of(cu, 9).begin, 7);
  EXPECT_EQ(document_of(cu, 9).end, 10);
  const Document keys = visible_keys(cu, true, 5, {0, 10});  // its document [3, 7), causal: up to 5
  EXPECT_EQ(keys.begin, 3);
  EXPECT_EQ(keys.end, 6);
}

TEST(Documents, BadCuSeqlensAreNamed) {
  EXPECT_EQ(cu_seqlens_error({}, 10), "");
  const std::vector<std::int64_t> start{2, 10}, down{0, 6, 4, 10}, end{0, 9};
  EXPECT_NE(cu_seqlens_error(start, 10).find("must start at 0, got 2"), std::string::npos);
  EXPECT_NE(cu_seqlens_error(down, 10).find("cu_seqlens[2] = 4 after 6"), std::string::npos);
  EXPECT_NE(cu_seqlens_error(end, 10).find("must end at the sequence length 10, got 9"), std::string::npos);
}

}  // namespace
