// The halo exchange's counts in closed form (halo_volume.cpp) against counting, token by token,
// which keys each member's queries see, and against asking the members (the walk the closed form
// replaced, still the path of per-document layouts).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <tuple>

#include "cp/ring_attention.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/token_layout.hpp"
#include "ulysses/plan/planner.hpp"

using namespace ulysses;

namespace {

constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

// Every member's counts from the tokens: key k is seen by the queries in [k − right, k + left]
// (right 0 when causal); a member sends each other member its keys that member's queries see.
std::vector<HaloCounts> counted(const CpConfig& cfg, int cp, int width, std::int64_t s) {
  const int members = cp / width;
  std::vector<int> owner(static_cast<std::size_t>(s));
  for (int r = 0; r < cp; ++r)
    for (const SeqChunk& c : rank_chunks(cfg, cp, r, s))
      for (std::int64_t p = c.begin; p < c.begin + c.length; ++p) owner[std::size_t(p)] = r / width;
  const std::int64_t left = std::min(cfg.window_left, s), right = cfg.causal ? 0 : std::min(cfg.window_right, s);
  std::vector<HaloCounts> h(static_cast<std::size_t>(members));
  std::vector<std::set<int>> sent_to(h.size()), held_from(h.size());
  for (std::int64_t k = 0; k < s; ++k) {
    const int mine = owner[std::size_t(k)];
    std::set<int> seen_by;
    for (std::int64_t p = std::max<std::int64_t>(0, k - right); p <= std::min(s - 1, k + left); ++p)
      seen_by.insert(owner[std::size_t(p)]);
    seen_by.erase(mine);
    h[std::size_t(mine)].given += std::int64_t(seen_by.size());
    for (const int r : seen_by) {
      sent_to[std::size_t(mine)].insert(r);
      held_from[std::size_t(r)].insert(mine);
      ++h[std::size_t(r)].held;
    }
  }
  for (std::size_t m = 0; m < h.size(); ++m) {
    h[m].to = std::int64_t(sent_to[m].size());
    h[m].back = std::int64_t(held_from[m].size());
  }
  return h;
}

std::string show(const HaloCounts& h) { return fmt::format("{{{}, {}, {}, {}}}", h.given, h.held, h.to, h.back); }

}  // namespace

TEST(HaloVolume, ClosedFormEqualsCountingTokens) {
  int checked = 0;
  for (const int cp : {1, 2, 3, 4, 6, 8, 12})
    for (const int width : {1, 2, 3, 4})
      for (const bool zigzag : {true, false})
        for (auto [left, right, causal] : {std::tuple{std::int64_t(0), std::int64_t(-1), true},
                                           {1, -1, true},
                                           {3, -1, true},
                                           {7, -1, true},
                                           {20, -1, true},
                                           {kUnbounded, -1, true},
                                           {0, 0, false},
                                           {5, 2, false},
                                           {2, 9, false},
                                           {25, 25, false},
                                           {0, kUnbounded, false},
                                           {kUnbounded, kUnbounded, false}}) {
          if (cp % width != 0) continue;
          for (const std::int64_t s :
               {2 * std::int64_t(cp), 2 * std::int64_t(cp) + 1, 5 * std::int64_t(cp) + 3, std::int64_t(61)}) {
            if (s < 2 * cp) continue;
            const CpConfig cfg{"p2p", {}, causal, std::nullopt, zigzag, {}, left, right};
            const std::vector<HaloCounts> want = counted(cfg, cp, width, s);
            for (int m = 0; m < cp / width; ++m) {
              const HaloCounts got = halo_counts(cfg, cp, width, m, s);
              ASSERT_EQ(got, want[std::size_t(m)])
                  << fmt::format("cp {} width {} zigzag {} window {},{} causal {} s {} member {}: {} against {}", cp,
                                 width, zigzag, left, right, causal, s, m, show(got), show(want[std::size_t(m)]));
              ++checked;
            }
          }
        }
  EXPECT_GT(checked, 3000);
}

TEST(HaloVolume, ClosedFormEqualsAskingTheMembers) {
  // The walk over halo_rows (what traffic() ran before, per rank) at sizes counting tokens
  // would not reach: uneven chunks of tens of tokens, windows within a chunk and across many.
  for (const int cp : {16, 37, 64})
    for (const int width : {1, 4})
      for (const bool zigzag : {true, false})
        for (auto [left, right, causal] : {std::tuple{std::int64_t(0), std::int64_t(-1), true},
                                           {40, -1, true},
                                           {300, -1, true},
                                           {5000, -1, true},
                                           {70, 2, false},
                                           {9, 700, false}}) {
          if (cp % width != 0) continue;
          const std::int64_t s = 20 * cp + 7;
          const CpConfig cfg{"p2p", {}, causal, std::nullopt, zigzag, {}, left, right};
          const AttentionParams p = attention_params(cfg);
          const auto chunks_of = [&](int g) {
            std::vector<SeqChunk> c;
            for (int r = g * width; r < (g + 1) * width; ++r)
              for (const SeqChunk& x : rank_chunks(cfg, cp, r, s)) c.push_back(x);
            return c;
          };
          for (int m = 0; m < cp / width; ++m) {
            const HaloCounts got = halo_counts(cfg, cp, width, m, s),
                             want = walked_halo_counts(cp / width, m, chunks_of, p);
            ASSERT_EQ(got, want) << fmt::format("cp {} width {} zigzag {} window {},{} member {}: {} against {}", cp,
                                                width, zigzag, left, right, m, show(got), show(want));
          }
        }
}

TEST(HaloVolume, PerDocumentSweepEqualsCountingTokensAndAskingTheMembers) {
  // Per-document zigzag puts every member in every document: its counts come from one sweep
  // over all members' chunks. Random packings (empty, short and long documents), causal windows.
  std::mt19937_64 rng(41);
  int checked = 0;
  for (const int cp : {2, 3, 4, 6, 8})
    for (const int width : {1, 2})
      for (int trial = 0; trial < 12; ++trial) {
        if (cp % width != 0) continue;
        std::vector<std::int64_t> lengths(1 + rng() % 6);
        for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? 3 * cp : 12 * cp));
        const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
        const std::int64_t s = cu.back();
        if (s < 2 * cp) continue;
        for (const std::int64_t left :
             {std::int64_t(0), std::int64_t(1), std::int64_t(5), std::int64_t(30), kUnbounded}) {
          CpConfig cfg{"p2p", {}, true, std::nullopt};
          cfg.cu_seqlens = cu;
          cfg.window_left = left;
          const AttentionParams p = attention_params(cfg);
          const std::vector<HaloCounts> want = counted(cfg, cp, width, s), all = members_halo_counts(cfg, cp, width, s);
          for (const PartnerCount how : {PartnerCount::stamps, PartnerCount::bits, PartnerCount::segments})
            ASSERT_EQ(swept_halo_counts(cfg, cp, width, s, how), want) << cp << " " << width << " " << int(how);
          const auto chunks_of = [&](int g) {
            std::vector<SeqChunk> c;
            for (int r = g * width; r < (g + 1) * width; ++r)
              for (const SeqChunk& x : rank_chunks(cfg, cp, r, s)) c.push_back(x);
            return c;
          };
          for (int m = 0; m < cp / width; ++m) {
            const std::string what =
                fmt::format("cp {} width {} trial {} window {} member {}", cp, width, trial, left, m);
            ASSERT_EQ(all[std::size_t(m)], want[std::size_t(m)])
                << what << ": " << show(all[std::size_t(m)]) << " against " << show(want[std::size_t(m)]);
            ASSERT_EQ(halo_counts(cfg, cp, width, m, s), want[std::size_t(m)]) << what;
            ASSERT_EQ(walked_halo_counts(cp / width, m, chunks_of, p), want[std::size_t(m)]) << what;
            ++checked;
          }
        }
      }
  EXPECT_GT(checked, 500);
}

TEST(HaloVolume, PartnersBySegmentsEqualStampsAndBitSets) {
  // Members' runs of pieces (segments) only pay off on many members and long windows, where the
  // token count above cannot go: the three ways against one another on random packings.
  std::mt19937_64 rng(43);
  for (const int cp : {64, 96, 256})
    for (const int width : {1, 2, 8})
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<std::int64_t> lengths(1 + rng() % 40);
        for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? std::uint64_t(cp) : 8ull * cp));
        CpConfig cfg{"p2p", {}, true, std::nullopt};
        cfg.cu_seqlens = cu_seqlens_of(lengths);
        const std::int64_t s = cfg.cu_seqlens.back();
        if (s < 2 * cp) continue;
        for (const std::int64_t left : {std::int64_t(1), std::int64_t(17), std::int64_t(cp), 5 * s, kUnbounded}) {
          cfg.window_left = left;
          const auto stamps = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
          ASSERT_TRUE(stamps.has_value());
          EXPECT_EQ(swept_halo_counts(cfg, cp, width, s, PartnerCount::segments), stamps)
              << cp << " " << width << " " << left;
          EXPECT_EQ(swept_halo_counts(cfg, cp, width, s, PartnerCount::bits), stamps)
              << cp << " " << width << " " << left;
          EXPECT_EQ(members_halo_counts(cfg, cp, width, s), *stamps);
        }
      }
}

TEST(HaloVolume, TheSweepsPiecesOfOneRankAreTheDealtChunksJoined) {
  // At width 1 the sweep builds its pieces from the documents' cuts, not through
  // for_each_member_chunk: as many pieces as its chunks make once a member's adjacent ones are
  // joined, and the counts the tokens give, on random packings (empty documents, documents
  // shorter than cp, than 2·cp, and many times longer).
  std::mt19937_64 rng(61);
  for (const int cp : {1, 2, 3, 5, 8, 16})
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<std::int64_t> lengths(1 + rng() % 40);
      for (std::int64_t& n : lengths) n = std::int64_t(rng() % std::uint64_t(trial % 3 == 0 ? 12 * cp : 3 * cp));
      CpConfig cfg{"p2p", {}, true, std::nullopt};
      cfg.cu_seqlens = cu_seqlens_of(lengths);
      cfg.window_left = std::int64_t(rng() % std::uint64_t(4 * cp + 2));
      const std::int64_t s = cfg.cu_seqlens.back();
      if (s < cp) continue;
      std::int64_t pieces = 0;
      int last = -1;
      for_each_member_chunk(cfg, cp, 1, s, [&](int m, const SeqChunk&) { pieces += m != last, last = m; });
      SweepWork work;
      const auto h = swept_halo_counts(cfg, cp, 1, s, PartnerCount::cheapest, &work);
      ASSERT_TRUE(h.has_value());
      EXPECT_EQ(work.pieces, pieces) << fmt::format("cp {} lengths {}", cp, fmt::join(lengths, ","));
      ASSERT_EQ(*h, counted(cfg, cp, 1, s)) << fmt::format("cp {} lengths {}", cp, fmt::join(lengths, ","));
    }
}

TEST(HaloVolume, RepeatedDocumentsExtrapolateTheSweepOfAFewRepetitions) {
  // Documents whose lengths repeat (COUNTxLENGTH packings) are cut the same way once the longer
  // chunks' runs come back to their ranks: the counts of a few repetitions, extrapolated, against
  // the sweep of every piece, on random patterns, cut short of a whole repetition, with windows
  // near multiples of the pattern's tokens (where a piece's reach crosses one repetition more).
  std::mt19937_64 rng(47);
  int extrapolated = 0;
  for (const int cp : {2, 3, 4, 8, 12, 16})
    for (const int width : {1, 2, 4})
      for (int trial = 0; trial < 8; ++trial) {
        if (cp % width != 0) continue;
        std::vector<std::int64_t> pattern(1 + rng() % 3);
        for (std::int64_t& n : pattern) n = std::int64_t(rng() % (trial % 2 ? 3ull * cp : 7ull));
        pattern.back() += 1;  // some tokens in every repetition
        std::int64_t tokens = 0;
        for (const std::int64_t n : pattern) tokens += n;
        std::vector<std::int64_t> lengths;
        const std::size_t docs = 1500 + rng() % 1500;
        for (std::size_t i = 0; i < docs; ++i) lengths.push_back(pattern[i % pattern.size()]);
        CpConfig cfg{"p2p", {}, true, std::nullopt};
        cfg.cu_seqlens = cu_seqlens_of(lengths);
        const std::int64_t s = cfg.cu_seqlens.back();
        for (const std::int64_t left :
             {std::int64_t(0), std::int64_t(1), tokens - 1, tokens, tokens + 1, 2 * tokens, cp * tokens - 1,
              cp * tokens, std::int64_t(rng() % std::uint64_t(4 * tokens))}) {
          cfg.window_left = left;
          const auto want = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
          ASSERT_TRUE(want.has_value());
          const auto got = periodic_halo_counts(cfg, cp, width, s);
          if (!got) continue;
          ASSERT_EQ(*got, *want) << fmt::format("cp {} width {} pattern {} docs {} window {}", cp, width,
                                                fmt::join(pattern, ","), docs, left);
          EXPECT_EQ(members_halo_counts(cfg, cp, width, s), *want);
          ++extrapolated;
        }
      }
  EXPECT_GT(extrapolated, 500);
  // Lengths that do not repeat, or an unbounded window: every piece is swept.
  CpConfig cfg{"p2p", {}, true, std::nullopt};
  std::vector<std::int64_t> lengths(3000, 5);
  lengths[1700] = 6;
  cfg.cu_seqlens = cu_seqlens_of(lengths);
  cfg.window_left = 3;
  EXPECT_FALSE(periodic_halo_counts(cfg, 4, 1, cfg.cu_seqlens.back()).has_value());
  lengths[1700] = 5;
  cfg.cu_seqlens = cu_seqlens_of(lengths);
  EXPECT_TRUE(periodic_halo_counts(cfg, 4, 1, cfg.cu_seqlens.back()).has_value());
  for (const std::int64_t left : {std::int64_t(-1), kUnbounded}) {
    cfg.window_left = left;
    EXPECT_FALSE(periodic_halo_counts(cfg, 4, 1, cfg.cu_seqlens.back()).has_value()) << left;
  }
}

TEST(HaloVolume, RepeatedDocumentsWithATailExtrapolateTheRepetitionsAndSweepTheTail) {
  // A repeating packing whose last documents break the pattern (`1048575x16,15,1`): the
  // repetitions extrapolated, the tail swept after a few of them, against the sweep of every
  // piece, on random patterns and tails of 1 to a few hundred documents, with windows near
  // multiples of the pattern's tokens.
  std::mt19937_64 rng(59);
  int extrapolated = 0;
  for (const int cp : {2, 3, 4, 8, 12, 16})
    for (const int width : {1, 2, 4})
      for (int trial = 0; trial < 8; ++trial) {
        if (cp % width != 0) continue;
        std::vector<std::int64_t> pattern(1 + rng() % 3);
        for (std::int64_t& n : pattern) n = std::int64_t(rng() % (trial % 2 ? 3ull * cp : 7ull));
        pattern.back() += 1;
        std::int64_t tokens = 0;
        for (const std::int64_t n : pattern) tokens += n;
        std::vector<std::int64_t> lengths;
        const std::size_t docs = 1500 + rng() % 1500, tail = 1 + (trial < 4 ? rng() % 3 : rng() % 200);
        for (std::size_t i = 0; i < docs; ++i) lengths.push_back(pattern[i % pattern.size()]);
        for (std::size_t i = 0; i < tail; ++i) lengths.push_back(std::int64_t(rng() % (3ull * cp)));
        CpConfig cfg{"p2p", {}, true, std::nullopt};
        cfg.cu_seqlens = cu_seqlens_of(lengths);
        const std::int64_t s = cfg.cu_seqlens.back();
        for (const std::int64_t left : {std::int64_t(0), std::int64_t(1), tokens - 1, tokens, tokens + 1, 2 * tokens,
                                        cp * tokens, std::int64_t(rng() % std::uint64_t(4 * tokens))}) {
          cfg.window_left = left;
          const auto want = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
          ASSERT_TRUE(want.has_value());
          const auto got = periodic_halo_counts(cfg, cp, width, s);
          if (!got) continue;
          ASSERT_EQ(*got, *want) << fmt::format("cp {} width {} pattern {} docs {} tail {} window {}", cp, width,
                                                fmt::join(pattern, ","), docs,
                                                fmt::join(std::span(lengths).subspan(docs), ","), left);
          EXPECT_EQ(members_halo_counts(cfg, cp, width, s), *want);
          ++extrapolated;
        }
      }
  EXPECT_GT(extrapolated, 500);
  // A tail of a sixth of the documents and more costs too much to sweep three times.
  CpConfig cfg{"p2p", {}, true, std::nullopt};
  cfg.window_left = 3;
  std::vector<std::int64_t> lengths(3000, 5);
  lengths.insert(lengths.end(), {4, 1});
  cfg.cu_seqlens = cu_seqlens_of(lengths);
  EXPECT_TRUE(periodic_halo_counts(cfg, 4, 1, cfg.cu_seqlens.back()).has_value());
  for (std::size_t i = 0; i < 700; ++i) lengths.push_back(std::int64_t(1 + i % 7 + i % 3));
  cfg.cu_seqlens = cu_seqlens_of(lengths);
  EXPECT_FALSE(periodic_halo_counts(cfg, 4, 1, cfg.cu_seqlens.back()).has_value());
}

TEST(HaloVolume, EachSplitWidthsPiecesJoinTheLastWidthsLikeBuildingThemAnew) {
  // The planner sweeps widths 1, 2, 4, ... of one layout in turn, each width's pieces joined from
  // the last one's (members of k times the width) and its partners folded from the last one's
  // rows of bits: the counts against the sweep of pieces built anew for each width, on random
  // packings that do not repeat (so nothing is extrapolated), the widths in rising order,
  // skipping some, and back to a width that does not divide the last.
  std::mt19937_64 rng(53);
  for (const int cp : {8, 12, 48, 64, 192})  // 192: rows of several words
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<std::int64_t> lengths(2 + rng() % 60);
      for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? 3ull * cp : 2ull + cp / 4));
      lengths.back() = 2 * cp + 1;
      CpConfig cfg{"p2p", {}, true, std::nullopt};
      cfg.cu_seqlens = cu_seqlens_of(lengths);
      cfg.window_left = std::int64_t(1 + rng() % (4 * std::uint64_t(cp)));
      const std::int64_t s = cfg.cu_seqlens.back();
      for (const int width : {1, 2, 4, 12, 24, 3, 6, 48, 8, 16, 32, 64}) {
        if (cp % width != 0) continue;
        const auto want = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
        ASSERT_TRUE(want.has_value());
        ASSERT_EQ(members_halo_counts(cfg, cp, width, s), *want) << cp << " " << trial << " " << width;
      }
    }
}

TEST(HaloVolume, RepeatedDocumentsPiecesJoinTheLastWidthsLikeBuildingThemAnew) {
  // The periodic sweeps' pieces are kept from one split width to the next and joined, as the
  // swept ones are: repeating packings (extrapolated) at widths in rising order, skipping some,
  // and back to a width that does not divide the last, against the sweep of every piece.
  std::mt19937_64 rng(61);
  int extrapolated = 0;
  for (const int cp : {8, 12, 64})
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<std::int64_t> pattern(1 + rng() % 3), lengths;
      for (std::int64_t& n : pattern) n = std::int64_t(1 + rng() % (trial % 2 ? 3ull * cp : 5ull));
      for (std::size_t i = 0; i < 3000 + rng() % 1000; ++i) lengths.push_back(pattern[i % pattern.size()]);
      if (trial >= 2) lengths.push_back(std::int64_t(rng() % (3ull * cp)));  // a tail
      CpConfig cfg{"p2p", {}, true, std::nullopt};
      cfg.cu_seqlens = cu_seqlens_of(lengths);
      cfg.window_left = std::int64_t(rng() % (2 * std::uint64_t(cp)));
      const std::int64_t s = cfg.cu_seqlens.back();
      for (const int width : {1, 2, 4, 12, 3, 6, 8, 16, 64, 1}) {
        if (cp % width != 0) continue;
        const auto want = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
        ASSERT_TRUE(want.has_value());
        extrapolated += periodic_halo_counts(cfg, cp, width, s).has_value();
        ASSERT_EQ(members_halo_counts(cfg, cp, width, s), *want) << cp << " " << trial << " " << width;
      }
    }
  EXPECT_GT(extrapolated, 20);
}

TEST(HaloVolume, ASharedBufferRefilledUnderANewScopeIsSweptAnew) {
  // The memos key on documents_generation, which a SharedDocuments scope answers without looking
  // at the boundaries: one buffer, refilled with other boundaries of the same count between two
  // scopes (the same data pointer and size), gets the new boundaries' counts in the second.
  const int cp = 8;
  std::vector<std::int64_t> buffer(401);
  const std::int64_t* const data = buffer.data();
  for (const std::int64_t length : {3, 5}) {
    const std::vector<std::int64_t> cu = cu_seqlens_of(std::vector<std::int64_t>(400, length));
    std::copy(cu.begin(), cu.end(), buffer.begin());
    CpConfig cfg{"p2p", {}, true, std::nullopt};
    cfg.window_left = 7;
    const SharedDocuments shared(buffer);
    cfg.cu_seqlens.swap(buffer);
    const std::int64_t s = cfg.cu_seqlens.back();
    for (const int width : {1, 2, 4}) {
      CpConfig copy{"p2p", {}, true, std::nullopt};
      copy.cu_seqlens = cu, copy.window_left = 7;
      const auto want = swept_halo_counts(copy, cp, width, s, PartnerCount::stamps);
      ASSERT_TRUE(want.has_value());
      EXPECT_EQ(members_halo_counts(cfg, cp, width, s), *want) << width;
    }
    cfg.cu_seqlens.swap(buffer);
    ASSERT_EQ(buffer.data(), data);  // the same buffer in both scopes
  }
}

TEST(HaloVolume, TheLastSweepIsKeptOnlyForTheSameDocuments) {
  // The sweep of the last documents is kept for the next member asked (a number stands for the
  // boundaries): document lists of the same count and tokens, asked in turn, each get their own
  // counts, those of a sweep that keeps nothing.
  const int cp = 8;
  const std::vector<std::vector<std::int64_t>> lists{{5, 40, 3, 16}, {40, 5, 3, 16}, {5, 40, 16, 3}};
  for (int round = 0; round < 2; ++round)
    for (const int width : {1, 2, 4})  // the same sizes in turn: only the documents tell the sweeps apart
      for (const auto& lengths : lists) {
        CpConfig cfg{"p2p", {}, true, std::nullopt};
        cfg.cu_seqlens = cu_seqlens_of(lengths);
        cfg.window_left = 6;
        const std::int64_t s = cfg.cu_seqlens.back();
        const auto want = swept_halo_counts(cfg, cp, width, s, PartnerCount::stamps);
        ASSERT_TRUE(want.has_value());
        EXPECT_EQ(members_halo_counts(cfg, cp, width, s), *want) << fmt::format("{} {}", lengths, width);
        EXPECT_EQ(members_halo_counts(cfg, cp, width, s), counted(cfg, cp, width, s));
      }
}

TEST(HaloVolume, PackedDocumentsUnderALongWindowAtAWorldOf65536CostPiecesNotWindows) {
  // 256 documents of 512 at cp 65536 under a window of 4096: 131072 one-token pieces, each
  // window 4096 of them (5·10^8 window entries, 65536² bits: the planner asked every member
  // about every other, minutes). The documents' chunks continue one sweep over the ranks, token
  // x on rank x mod 65536: two runs of consecutive ranks, so a window crosses at most 2 and the
  // partners cost at most 2 steps a piece, by construction.
  CpConfig cfg{"p2p", {}, true, std::nullopt};
  cfg.cu_seqlens = cu_seqlens_of(std::vector<std::int64_t>(256, 512));
  cfg.window_left = 4096;
  SweepWork work;
  const auto h = swept_halo_counts(cfg, 65536, 1, 131072, PartnerCount::cheapest, &work);
  ASSERT_TRUE(h.has_value());
  EXPECT_LE(work.partner_steps, 2 * 131072);
  // Rank 0 holds tokens 0 and 65536: each is seen by the 4096 tokens after it, on ranks
  // 1..4096 both times (2 · 4096 rows to 4096 ranks); token 65536's band holds tokens
  // 61440..65535 of ranks 61440..65535 (4096 rows from 4096 ranks).
  EXPECT_EQ((*h)[0], (HaloCounts{2 * 4096, 4096, 4096, 4096})) << show((*h)[0]);
}

TEST(HaloVolume, TheSweepVisitsEachMembersRunsOfChunksNotEveryChunk) {
  // The planner sweeps once for every split width (p2p and each a2a+p2p inner size). 16
  // documents of 512 at cp 64: each cut into 128 chunks of 4, dealt to ranks 0..63 and back
  // 63..0, so a member of `width` ranks holds runs of `width` adjacent chunks: 2 · 64 / width
  // runs a document, less the middle pair (rank 63's two chunks touch) and one at each of the 15
  // document joins (rank 0's last chunk touches its next first). The sweep must visit those runs,
  // not the 2048 chunks at every width, with the counts the tokens give.
  CpConfig cfg{"p2p", {}, true, std::nullopt};
  cfg.cu_seqlens = cu_seqlens_of(std::vector<std::int64_t>(16, 512));
  cfg.window_left = 100;
  for (const int width : {1, 2, 8, 64}) {
    SweepWork work;
    const auto h = swept_halo_counts(cfg, 64, width, 8192, PartnerCount::cheapest, &work);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(work.pieces, 16 * (2 * 64 / width - 1) - 15) << width;
    EXPECT_EQ(*h, counted(cfg, 64, width, 8192)) << width;
  }
}

TEST(HaloVolume, WindowsAtAWorldOf65536MatchTheirArithmetic) {
  // Plans that asked every neighbour inside the band (minutes at cp 65536 with a window of
  // 4096), against what the layout says by hand. Zigzag chunks of s/2cp = 1 token: the first
  // chunk of rank r is token r, its mirror 2cp − 1 − r. A key's halo goes to every rank that
  // owns one of the W tokens after it. Rank 0 (tokens 0 and 131071): token 0 is seen by the
  // owners of tokens 1..W, W distinct ranks (W < cp); token 131071 by none, and its band holds
  // tokens 131071 − W.. of ranks W..1. Rank cp − 1
  // (tokens 65535, 65536, adjacent): 65535 is seen by the owners of 65537..65535 + W (ranks
  // cp − 2, cp − 3, ...: W − 1 others), 65536 by those of 65537..65536 + W (W others): 2W − 1 rows
  // to W ranks. A member holds the union of what its queries see, less its own: rank 0 the W
  // keys before token 131071, rank cp − 1 the W before 65535.
  const Shape q{1, 131072, 32, 128};
  const std::int64_t per_token = 2 * 8 * 128, W = 4096;
  CpConfig cfg{"p2p", {}, true};
  cfg.window_left = W;
  EXPECT_EQ(halo_counts(cfg, 65536, 1, 0, q.s), (HaloCounts{W, W, W, W}));
  EXPECT_EQ(halo_counts(cfg, 65536, 1, 65535, q.s), (HaloCounts{2 * W - 1, W, W, W}));
  // The busiest: a rank whose two tokens lie W and more apart from each other and from the ends
  // sends 2W rows, to 2W ranks, and holds 2W rows from 2W ranks.
  const CommVolume v = predicted_comm_volume(cfg, 65536, q, 8, DType::bf16);
  EXPECT_EQ(v.forward_bytes.at("p2p_kv"), 2 * W * per_token * 2);
  EXPECT_EQ(v.backward_bytes.at("p2p_dkv"), 2 * W * per_token * 4);
  EXPECT_EQ(v.forward_messages.at("p2p_kv"), 2 * W);
  EXPECT_EQ(v.backward_messages.at("p2p_dkv"), 2 * W);
  // a2a+p2p [16, 4096], contiguous (full mask, window 64 on both sides): groups of 32 tokens,
  // every group's keys seen by the 64 tokens on each side: two groups each way, 64 rows each.
  CpConfig h{"a2a+p2p", {16, 4096}, false};
  h.window_left = h.window_right = 64;
  const CommVolume hv = predicted_comm_volume(h, 65536, q, 8, DType::bf16);
  const std::int64_t outer_per_token = 2 * 1 * 128;  // 8 KV heads over 16 inner ranks: one each (ulysses_heads)
  EXPECT_EQ(hv.forward_bytes.at("outer.p2p_kv"), 2 * 64 * outer_per_token * 2);
  EXPECT_EQ(hv.forward_messages.at("outer.p2p_kv"), 4);
  EXPECT_EQ(hv.backward_messages.at("outer.p2p_dkv"), 4);
}
