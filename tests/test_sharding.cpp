// The sharding helpers (sharding.hpp): zigzag as in Megatron/TE, uneven token and head splits,
// shard/unshard round trips, and rank counts near int's range.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "test_util.hpp"
#include "ulysses/error.hpp"
#include "ulysses/reference.hpp"
#include "ulysses/sharding.hpp"

using namespace ulysses;
using test_util::error_of;

namespace {

TEST(Sharding, ZigzagMatchesMegatronAndTE) {
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  // cp = 2, s = 8: chunks of 2; rank 0 holds chunks {0, 3}, rank 1 holds {1, 2}.
  EXPECT_EQ(rank_chunks(ring, 2, 0, 8), (std::vector<SeqChunk>{{0, 2}, {6, 2}}));
  EXPECT_EQ(rank_chunks(ring, 2, 1, 8), (std::vector<SeqChunk>{{2, 2}, {4, 2}}));
  EXPECT_EQ(token_positions(rank_chunks(ring, 2, 1, 8)), (std::vector<std::int64_t>{2, 3, 4, 5}));
  // No causal mask, or Ulysses: contiguous.
  EXPECT_EQ(rank_chunks(CpConfig{"p2p", {}, false, std::nullopt}, 2, 1, 8), (std::vector<SeqChunk>{{4, 4}}));
  EXPECT_EQ(rank_chunks(CpConfig{"a2a", {}, true, std::nullopt}, 4, 3, 8), (std::vector<SeqChunk>{{6, 2}}));
}

TEST(Sharding, UnevenSequencesCutLikeTensorSplit) {
  const CpConfig ring{"p2p", {}, true, std::nullopt}, flat{"p2p", {}, false, std::nullopt};
  // s = 10 on 4 ranks: 3, 3, 2, 2 tokens.
  EXPECT_EQ(rank_chunks(flat, 4, 0, 10), (std::vector<SeqChunk>{{0, 3}}));
  EXPECT_EQ(rank_chunks(flat, 4, 2, 10), (std::vector<SeqChunk>{{6, 2}}));
  // Zigzag, s = 11 on 2 ranks: chunks of 3, 3, 3, 2; rank 0 holds chunks 0 and 3, rank 1 1 and 2.
  EXPECT_EQ(rank_chunks(ring, 2, 0, 11), (std::vector<SeqChunk>{{0, 3}, {9, 2}}));
  EXPECT_EQ(rank_chunks(ring, 2, 1, 11), (std::vector<SeqChunk>{{3, 3}, {6, 3}}));
  // Every layout, many shapes: counts differ by at most one, tokens_held agrees with the
  // chunks for any run of ranks, and together the ranks hold every position once.
  for (const CpConfig& cfg : {ring, flat})
    for (int cp : {1, 2, 3, 5, 8})
      for (std::int64_t s = 2 * cp; s < 6 * cp + 3; ++s) {
        std::vector<int> seen(std::size_t(s), 0);
        std::int64_t most = 0, least = s;
        for (int r = 0; r < cp; ++r) {
          const std::vector<SeqChunk> chunks = rank_chunks(cfg, cp, r, s);
          const std::int64_t n = total_tokens(chunks);
          most = std::max(most, n);
          least = std::min(least, n);
          EXPECT_EQ(tokens_held(cfg, cp, r, 1, s), n);
          for (std::int64_t p : token_positions(chunks)) ++seen[std::size_t(p)];
          std::int64_t run = 0;
          for (int q = r; q < cp; ++q) run += tokens_held(cfg, cp, q, 1, s);
          EXPECT_EQ(tokens_held(cfg, cp, r, cp - r, s), run);
        }
        EXPECT_LE(most - least, 1) << "cp " << cp << " s " << s;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), s);
      }
  // Too short to give every rank a token (two chunks under zigzag): an error naming the values.
  for (auto [cfg, s, msg] : {std::tuple{flat, 3, "sequence length (3) must be at least cp (4)"},
                             {ring, 7, "sequence length (7) must be at least 2*cp (8)"}}) {
    try {
      rank_chunks(cfg, 4, 0, s);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  }
}

TEST(Sharding, UlyssesHeadsKeepGqaGroupsWhole) {
  for (int group : {1, 2, 3, 4, 5, 8})
    for (std::int64_t kv : {1, 2, 3, 4, 6, 8, 12})
      for (std::int64_t g : {1, 2, 3, 4}) {
        const std::int64_t h = kv * g;
        if (h < group) continue;
        const HeadSplit split = ulysses_head_split(group, h, kv);
        std::vector<int> seen(std::size_t(h), 0);
        std::int64_t least = h;
        for (int r = 0; r < group; ++r) {
          const HeadRange q = split.q[std::size_t(r)], k = split.kv[std::size_t(r)];
          EXPECT_EQ(ulysses_heads(group, r, h, kv).q, q);
          EXPECT_GE(q.count, 1);
          least = std::min(least, q.count);
          // The rank's query heads use exactly its KV heads, as plain GQA: q.count / k.count each.
          EXPECT_EQ(q.first / g, k.first);
          EXPECT_EQ((q.first + q.count - 1) / g, k.first + k.count - 1);
          EXPECT_EQ(q.count % k.count, 0);
          EXPECT_TRUE(k.count == 1 || (q.first % g == 0 && q.count == k.count * g));
          for (std::int64_t i = 0; i < q.count; ++i) ++seen[std::size_t(q.first + i)];
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), h) << "every query head on exactly one rank";
        EXPECT_LE(most_heads(split.q) - least, g) << "ranks at most one GQA group apart";
        std::int64_t kv_total = 0;
        for (const HeadRange& k : split.kv) kv_total += k.count;
        EXPECT_EQ(kv_total, ulysses_kv_heads_held(group, kv));
      }
}

TEST(Sharding, ShardThenUnshardIsTheIdentity) {
  const int cp = 3;
  const std::int64_t s = 25;  // zigzag chunks of 5, 4, 4, 4, 4, 4
  Tensor global({2, s, 3, 4}), back({2, s, 3, 4});
  fill_uniform(global.view(), 9);
  const CpConfig ring{"all_gather", {}, true, std::nullopt};
  for (int r = 0; r < cp; ++r) {
    const auto chunks = rank_chunks(ring, cp, r, s);
    Tensor local({2, total_tokens(chunks), 3, 4}, DType::f32, Layout::sbhd);
    shard_sequence(global.view(), local.view(), chunks);
    unshard_sequence(local.view(), back.view(), chunks);
  }
  EXPECT_EQ(std::memcmp(global.data(), back.data(), global.nbytes()), 0);
}

TEST(ShardingBounds, ZigzagAtTwoBillionRanksDoesNotWrap) {
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  const int cp = 1500000000;  // 2 * cp overflows int
  const std::int64_t seq = 6000000000;
  const auto c = rank_chunks(ring, cp, cp - 1, seq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].begin, 2 * std::int64_t(cp - 1));
  EXPECT_EQ(c[1].begin, 2 * std::int64_t(cp));
  EXPECT_EQ(c[0].length + c[1].length, 4);
  EXPECT_EQ(tokens_held(ring, cp, 0, cp, seq), seq);
  EXPECT_NE(error_of([&] { rank_chunks(ring, cp, 0, 5); }).find("must be at least 2*cp (3000000000)"),
            std::string::npos);
}

}  // namespace
