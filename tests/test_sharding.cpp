// The sharding helpers (sharding.hpp): zigzag as in Megatron/TE, per-document zigzag (its cut,
// and the ring's causal work it balances), uneven token and head splits, shard/unshard round
// trips, and rank counts near int's range.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>

#include "test_util.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

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

CpConfig ring_with(std::vector<std::int64_t> cu, const char* type = "p2p") {
  CpConfig c{type, {}, true, std::nullopt};
  c.cu_seqlens = std::move(cu);
  return c;
}

TEST(Sharding, PerDocumentZigzagCutsEachDocument) {
  // cp = 2, documents of 8 and 4: each cut into 4 chunks, rank 0 holding chunks 0 and 3 of
  // both, rank 1 chunks 1 and 2; a rank's adjacent chunks are one.
  const CpConfig docs = ring_with({0, 8, 12});
  EXPECT_EQ(token_layout(docs), TokenLayout::per_document);
  EXPECT_EQ(rank_chunks(docs, 2, 0, 12), (std::vector<SeqChunk>{{0, 2}, {6, 3}, {11, 1}}));
  EXPECT_EQ(rank_chunks(docs, 2, 1, 12), (std::vector<SeqChunk>{{2, 4}, {9, 2}}));
  // Documents shorter than 2·cp spread one token per rank, round robin across documents.
  const CpConfig short_docs = ring_with({0, 1, 2, 3, 4});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_chunks(short_docs, 4, r, 4), (std::vector<SeqChunk>{{r, 1}}));
  // per_document = false, no documents, no causal mask, or a2a: the layouts as before.
  CpConfig plain = docs;
  plain.per_document = false;
  EXPECT_EQ(token_layout(plain), TokenLayout::zigzag);
  EXPECT_EQ(rank_chunks(plain, 2, 0, 12), (std::vector<SeqChunk>{{0, 3}, {9, 3}}));
  EXPECT_EQ(token_layout(ring_with({})), TokenLayout::zigzag);
  CpConfig full = docs;
  full.causal = false;
  EXPECT_EQ(token_layout(full), TokenLayout::contiguous);
  EXPECT_EQ(token_layout(ring_with({0, 8, 12}, "a2a")), TokenLayout::contiguous);
  EXPECT_EQ(token_layout(ring_with({0, 8, 12}, "all_gather")), TokenLayout::zigzag);
  EXPECT_EQ(token_layout(ring_with({0, 8, 12}, "a2a+p2p")), TokenLayout::per_document);
  // One token per rank is enough (not two chunks); bad documents have no layout.
  EXPECT_NE(error_of([&] {
              rank_chunks(ring_with({0, 3}), 4, 0, 3);
            }).find("must be at least cp (4)"),
            std::string::npos);
  EXPECT_EQ(error_of([&] {
              rank_chunks(ring_with({0, 2, 1, 4}), 2, 0, 4);
            }),
            "cu_seqlens must not decrease, got cu_seqlens[2] = 1 after 2");
  EXPECT_EQ(error_of([&] {
              tokens_held(ring_with({0, 3}), 2, 0, 1, 4);
            }),
            "cu_seqlens must end at the sequence length 4, got 3");
}

// The bulk forms the planner reads at large cp: every rank's tokens at once and every rank's
// chunks document by document, against rank_chunks rank by rank (random packings with empty,
// short and long documents; contiguous and zigzag too).
TEST(Sharding, EveryRanksTokensAndChunksAtOnceAreEachRanks) {
  std::mt19937_64 rng(37);
  for (int cp : {1, 2, 3, 4, 5, 8, 13})
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<std::int64_t> lengths(1 + rng() % 9);
      for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? 3 * cp : 30 * cp));
      const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
      const std::int64_t s = cu.back();
      if (s < 2 * cp) continue;
      for (CpConfig cfg : {ring_with(cu), ring_with({}), CpConfig{"p2p", {}, false}}) {
        SCOPED_TRACE(::testing::Message()
                     << "cp " << cp << " trial " << trial << " " << layout_name(token_layout(cfg)));
        std::vector<std::vector<SeqChunk>> pieces(static_cast<std::size_t>(cp));
        for_each_rank_chunk(cfg, cp, s, [&](int r, const SeqChunk& c) { pieces[std::size_t(r)].push_back(c); });
        const std::vector<std::int64_t> tokens = tokens_of_ranks(cfg, cp, s);
        ASSERT_EQ(tokens.size(), std::size_t(cp));
        for (int r = 0; r < cp; ++r) {
          EXPECT_EQ(tokens[std::size_t(r)], total_tokens(rank_chunks(cfg, cp, r, s))) << "rank " << r;
          EXPECT_EQ(token_positions(pieces[std::size_t(r)]), token_positions(rank_chunks(cfg, cp, r, s)))
              << "rank " << r;
        }
      }
    }
}

// The planner's bulk forms under per-document zigzag, against rank_chunks rank by rank (random
// packings: empty documents, documents shorter than 2·cp, one token a rank, and longer): every
// member's chunks hold its ranks' positions, in position order; every rank's visible pairs
// are its chunks' (visible_pairs per chunk), under windows and without.
TEST(Sharding, EveryMembersChunksAndEveryRanksPairsAtOnceAreTheirRanks) {
  std::mt19937_64 rng(48);
  for (int cp : {1, 2, 3, 4, 6, 8, 12, 16})
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::int64_t> lengths(1 + rng() % 9);
      for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? 3 * cp : 30 * cp));
      const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
      const std::int64_t s = cu.back();
      if (s < 2 * cp) continue;
      CpConfig cfg = ring_with(cu);
      for (int width = 1; width <= cp; ++width) {
        if (cp % width != 0) continue;
        std::vector<std::vector<SeqChunk>> got(static_cast<std::size_t>(cp / width));
        std::int64_t end = 0;
        for_each_member_chunk(cfg, cp, width, s, [&](int m, const SeqChunk& c) {
          EXPECT_EQ(c.begin, end) << "cp " << cp << " width " << width;  // in order, tiling the sequence
          end = c.begin + c.length;
          got[std::size_t(m)].push_back(c);
        });
        for (int m = 0; m < cp / width; ++m) {
          std::vector<SeqChunk> want;
          for (int r = m * width; r < (m + 1) * width; ++r)
            for (const SeqChunk& c : rank_chunks(cfg, cp, r, s)) want.push_back(c);
          std::vector<std::int64_t> w = token_positions(want);
          std::sort(w.begin(), w.end());
          ASSERT_EQ(token_positions(got[std::size_t(m)]), w) << "cp " << cp << " width " << width << " member " << m;
        }
      }
      constexpr std::int64_t kFar = std::numeric_limits<std::int64_t>::max();
      for (const auto& [left, right] :
           {std::pair<std::int64_t, std::int64_t>{-1, -1}, {0, -1}, {3, -1}, {7, 2}, {100, 0}, {kFar, kFar}}) {
        cfg.window_left = left, cfg.window_right = right;
        const std::vector<std::int64_t> pairs = per_document_pairs(cfg, cp, s);
        for (int r = 0; r < cp; ++r) {
          std::int64_t want = 0;
          for (const SeqChunk& c : rank_chunks(cfg, cp, r, s))
            want += visible_pairs(cu, true, c, {0, s}, {cfg.window_left, cfg.window_right});
          ASSERT_EQ(pairs[std::size_t(r)], want) << "cp " << cp << " rank " << r << " window " << left << "," << right;
        }
      }
    }
  EXPECT_NE(error_of([] { per_document_pairs(ring_with({}), 4, 64); }), "");  // plain zigzag: not per document
}

// Packings of runs of equal lengths (COUNTxLENGTH terms, counts past cp: the ranks each run's
// documents start on wrap around many times), whose counts the planner takes a run at a time:
// every rank's tokens and visible pairs against rank_chunks and visible_pairs chunk by chunk,
// under per-document zigzag, plain zigzag and contiguous chunks, with windows and without.
TEST(Sharding, RunsOfEqualLengthsCountAsTheirDocumentsOneByOne) {
  std::mt19937_64 rng(60);
  for (int cp : {1, 2, 3, 4, 6, 8, 12, 16})
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<std::int64_t> lengths;
      for (std::size_t terms = 1 + rng() % 4; terms-- > 0;) {
        const std::int64_t picks[] = {0,
                                      1,
                                      2,
                                      cp - 1,
                                      cp,
                                      cp + 1,
                                      2 * cp - 1,
                                      2 * cp,
                                      2 * cp + 1,
                                      3 * cp - 1,
                                      std::int64_t(rng() % (3 * cp + 1))};
        const std::int64_t n = std::max<std::int64_t>(0, picks[rng() % std::size(picks)]);
        lengths.insert(lengths.end(), 1 + rng() % (trial % 3 == 0 ? 5 * cp : 3), n);
      }
      const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
      const std::int64_t s = cu.back();
      if (s < 2 * cp) continue;
      CpConfig per_document = ring_with(cu), zigzag = ring_with(cu), flat = ring_with(cu);
      zigzag.per_document = false, flat.zigzag = false;
      for (const auto& [left, right] : {std::pair<std::int64_t, std::int64_t>{-1, -1}, {0, -1}, {1, -1}, {5, 0}})
        for (CpConfig* cfg : {&per_document, &zigzag, &flat}) {
          cfg->window_left = left, cfg->window_right = right;
          SCOPED_TRACE(::testing::Message() << "cp " << cp << " trial " << trial << " window " << left << " "
                                            << layout_name(token_layout(*cfg)));
          const std::vector<std::int64_t> pairs = pairs_of_ranks(*cfg, cp, s, s), tokens = tokens_of_ranks(*cfg, cp, s);
          for (int r = 0; r < cp; ++r) {
            std::int64_t want = 0;
            for (const SeqChunk& c : rank_chunks(*cfg, cp, r, s))
              want += visible_pairs(cu, true, c, {0, s}, {cfg->window_left, cfg->window_right});
            ASSERT_EQ(pairs[std::size_t(r)], want) << "rank " << r;
            ASSERT_EQ(tokens[std::size_t(r)], total_tokens(rank_chunks(*cfg, cp, r, s))) << "rank " << r;
          }
        }
    }
}

// While a SharedDocuments holds a vector of boundaries, a config holding that very buffer gets
// what it gets without one (counts kept, not recounted; the same errors, for each length asked),
// and a config holding an equal copy, or other boundaries, is counted on its own.
TEST(Sharding, SharedDocumentsAnswerAsTheDocumentsWould) {
  const std::vector<std::int64_t> lengths{5, 5, 5, 1, 1, 1, 1, 0, 9};
  const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
  const std::int64_t s = cu.back();
  CpConfig alone = ring_with(cu);
  alone.window_left = 2;
  const std::vector<std::int64_t> pairs = pairs_of_ranks(alone, 4, s, s), tokens = tokens_of_ranks(alone, 4, s);
  const std::string short_by_one = error_of([&] { tokens_of_ranks(alone, 4, s + 1); });
  ASSERT_NE(short_by_one, "");
  std::vector<std::int64_t> lent = cu;
  const SharedDocuments shared(lent);
  CpConfig cfg = alone;
  cfg.cu_seqlens.swap(lent);  // lent as the planner lends them: the buffer moves, not copied
  EXPECT_EQ(SharedDocuments::of(cfg), &shared);
  EXPECT_EQ(SharedDocuments::of(alone), nullptr);  // equal boundaries, another buffer
  for (int twice = 0; twice < 2; ++twice) {
    EXPECT_EQ(pairs_of_ranks(cfg, 4, s, s), pairs);
    EXPECT_EQ(tokens_of_ranks(cfg, 4, s), tokens);
    EXPECT_EQ(error_of([&] { tokens_of_ranks(cfg, 4, s + 1); }), short_by_one);
    EXPECT_EQ(error_of([&] { pairs_of_ranks(cfg, 4, s + 1, s + 1); }), short_by_one);
    EXPECT_EQ(documents_error(cfg, s + 1), cu_seqlens_error(cu, s + 1));
  }
  cfg.window_left = 0;  // another key: counted anew
  alone.window_left = 0;
  EXPECT_EQ(pairs_of_ranks(cfg, 4, s, s), pairs_of_ranks(alone, 4, s, s));
  cfg.zigzag = false, alone.zigzag = false;
  EXPECT_EQ(pairs_of_ranks(cfg, 4, s, s), pairs_of_ranks(alone, 4, s, s));
  CpConfig other = ring_with(cu_seqlens_of(std::vector<std::int64_t>{8, 6, 13}));  // same count, other boundaries
  EXPECT_EQ(SharedDocuments::of(other), nullptr);
  {
    const SharedDocuments inner(other.cu_seqlens);  // nested: the innermost answers for its own
    EXPECT_EQ(SharedDocuments::of(other), &inner);
    EXPECT_EQ(SharedDocuments::of(cfg), nullptr);
  }
  EXPECT_EQ(SharedDocuments::of(cfg), &shared);
}

// A scope made without boundaries answers for the configs without documents, with the counts
// and errors they get outside it (each key counted once: the layout, cp, the lengths and the
// mask), and not for a config holding documents; a scope holding documents does not answer for
// a config without them.
TEST(Sharding, AScopeWithoutDocumentsAnswersAsNoScope) {
  CpConfig zigzag = ring_with({}), contiguous = ring_with({}), hierarchical = ring_with({}, "a2a+p2p");
  contiguous.zigzag = false;
  hierarchical.hierarchical_context_parallel_sizes = {2, 2};
  CpConfig windowed = zigzag;
  windowed.window_left = 3;
  const std::vector<CpConfig> configs{zigzag, contiguous, hierarchical, windowed};
  struct Counts {
    std::vector<std::vector<std::int64_t>> pairs, tokens;
    std::vector<std::string> errors;
  };
  auto count_all = [&] {
    Counts c;
    for (const CpConfig& cfg : configs)
      for (const std::int64_t s : {8, 13, 29}) {
        c.pairs.push_back(pairs_of_ranks(cfg, 4, s, s));
        c.tokens.push_back(tokens_of_ranks(cfg, 4, s));
        c.errors.push_back(error_of([&] { tokens_of_ranks(cfg, 4, 7); }));  // zigzag needs 2·cp
        c.errors.push_back(error_of([&] { pairs_of_ranks(cfg, 4, 3, 3); }));
      }
    return c;
  };
  const Counts alone = count_all();
  std::vector<std::int64_t> none, documents = cu_seqlens_of(std::vector<std::int64_t>{5, 8});
  {
    const SharedDocuments shared(none);
    EXPECT_EQ(SharedDocuments::of(zigzag), &shared);
    EXPECT_EQ(SharedDocuments::of(ring_with(documents)), nullptr);
    for (int twice = 0; twice < 2; ++twice) {
      const Counts scoped = count_all();
      EXPECT_EQ(scoped.pairs, alone.pairs);
      EXPECT_EQ(scoped.tokens, alone.tokens);
      EXPECT_EQ(scoped.errors, alone.errors);
    }
  }
  const SharedDocuments with_documents(documents);
  EXPECT_EQ(SharedDocuments::of(zigzag), nullptr);
}

// documents_generation against comparing the boundaries themselves: random configs asked in
// and out of random scopes (lent buffers, equal copies, other boundaries of the same count),
// two numbers equal only where the boundaries are; a live scope's buffer always gets its own.
TEST(Sharding, DocumentsGenerationsAreEqualOnlyForEqualBoundaries) {
  std::mt19937 rng(3705);
  const std::vector<std::vector<std::int64_t>> pool{
      cu_seqlens_of(std::vector<std::int64_t>{3, 3, 3}), cu_seqlens_of(std::vector<std::int64_t>{2, 4, 3}),
      cu_seqlens_of(std::vector<std::int64_t>{9}), cu_seqlens_of(std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1})};
  std::vector<std::pair<std::uint64_t, std::vector<std::int64_t>>> seen;  // every number given, and its boundaries
  auto check = [&](const CpConfig& c) {
    const std::uint64_t g = documents_generation(c);
    for (const auto& [number, cu] : seen)
      if (number == g) EXPECT_EQ(cu, c.cu_seqlens);
    seen.emplace_back(g, c.cu_seqlens);
    return g;
  };
  for (int round = 0; round < 200; ++round) {
    std::vector<std::int64_t> lent = pool[rng() % pool.size()];
    const SharedDocuments shared(lent);
    CpConfig in_scope = ring_with({});
    in_scope.cu_seqlens.swap(lent);
    const std::uint64_t own = check(in_scope);
    EXPECT_EQ(own, shared.generation());
    for (int ask = 0; ask < 4; ++ask) {
      const CpConfig outside = ring_with(pool[rng() % pool.size()]);  // another buffer: compared
      const CpConfig copy = outside;
      EXPECT_EQ(check(outside), check(copy));  // the same boundaries again: the same number
      EXPECT_EQ(check(in_scope), own);         // no comparison in the scope: its number
    }
    in_scope.cu_seqlens.swap(lent);
  }
}

TEST(Sharding, EveryRanksTokensAndChunksAtOnceRefuseWhatRankChunksRefuses) {
  const auto none = [](int, const SeqChunk&) {};
  for (const auto& c : {std::tuple{ring_with({0, 5, 9}), 2, std::int64_t(10)},  // documents cut 9, not 10
                        std::tuple{ring_with({}), 4, std::int64_t(7)},          // zigzag: fewer than 2·cp
                        std::tuple{CpConfig{"p2p", {}, false}, 8, std::int64_t(5)}}) {
    // Plain names, not a structured binding: C++17 lambdas (clang's sanitizer trees) cannot capture one.
    const CpConfig& cfg = std::get<0>(c);
    const int cp = std::get<1>(c);
    const std::int64_t s = std::get<2>(c);
    const std::string want = error_of([&] { rank_chunks(cfg, cp, 0, s); });
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(error_of([&] { tokens_of_ranks(cfg, cp, s); }), want);
    EXPECT_EQ(error_of([&] { for_each_rank_chunk(cfg, cp, s, none); }), want);
    EXPECT_EQ(error_of([&] { for_each_member_chunk(cfg, cp, 1, s, none); }), want);
  }
}

// Random packings (empty, short, long documents): every position on exactly one rank; one
// document alone is exactly zigzag; inside each document the owners rise 0..cp−1 and fall back
// (chunk r, then chunk 2·cp−1−r, each of ⌊n/2cp⌋ or one more tokens); the ranks' counts differ
// by at most one; tokens_held agrees with the chunks for every run of ranks.
TEST(Sharding, PerDocumentZigzagIsZigzagInEveryDocument) {
  std::mt19937_64 rng(25);
  for (int cp : {1, 2, 3, 4, 5, 8})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<std::int64_t> lengths(1 + rng() % 7);
      for (std::int64_t& n : lengths) n = std::int64_t(rng() % (trial % 2 ? 5 * cp : 40 * cp));
      std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
      const std::int64_t s = cu.back();
      if (s < cp) continue;
      const CpConfig cfg = ring_with(cu);
      SCOPED_TRACE(::testing::Message() << "cp " << cp << " trial " << trial);
      std::vector<int> owner(std::size_t(s), -1);
      std::int64_t most = 0, least = s;
      for (int r = 0; r < cp; ++r) {
        const std::vector<SeqChunk> chunks = rank_chunks(cfg, cp, r, s);
        for (std::size_t i = 1; i < chunks.size(); ++i)
          EXPECT_GT(chunks[i].begin, chunks[i - 1].begin + chunks[i - 1].length);
        for (std::int64_t p : token_positions(chunks)) {
          EXPECT_EQ(owner[std::size_t(p)], -1);
          owner[std::size_t(p)] = r;
        }
        most = std::max(most, total_tokens(chunks));
        least = std::min(least, total_tokens(chunks));
        for (int k = 0; r + k <= cp; ++k) {
          std::int64_t run = 0;
          for (int q = r; q < r + k; ++q) run += total_tokens(rank_chunks(cfg, cp, q, s));
          EXPECT_EQ(tokens_held(cfg, cp, r, k, s), run);
        }
      }
      EXPECT_LE(most - least, 1);
      for (std::size_t d = 1; d < cu.size(); ++d) {
        const std::int64_t n = cu[d] - cu[d - 1], base = n / (2 * cp);
        std::vector<int> pieces;  // owners of the document's chunks in order, and their lengths
        std::vector<std::int64_t> len;
        for (std::int64_t p = cu[d - 1]; p < cu[d]; ++p) {
          const int o = owner[std::size_t(p)];
          ASSERT_GE(o, 0);
          if (!pieces.empty() && pieces.back() == o)
            ++len.back();
          else
            pieces.push_back(o), len.push_back(1);
        }
        std::size_t top = 0;  // rising to the last rank, then falling: chunk r before chunk 2cp−1−r
        while (top + 1 < pieces.size() && pieces[top + 1] > pieces[top]) ++top;
        for (std::size_t i = top + 1; i < pieces.size(); ++i) EXPECT_LT(pieces[i], pieces[i - 1]);
        for (std::size_t i = 0; i < len.size(); ++i) {
          const std::int64_t most_len = pieces[i] == cp - 1 ? 2 * base + 2 : base + 1;  // the middle: two chunks
          EXPECT_LE(len[i], most_len);
          if (n >= 2 * cp && pieces[i] != cp - 1) EXPECT_GE(len[i], base);
        }
      }
      if (cu.size() == 2 && s >= 2 * cp)
        for (int r = 0; r < cp; ++r) {
          std::vector<SeqChunk> zigzag = rank_chunks(ring_with({}), cp, r, s);
          if (zigzag.size() == 2 && zigzag[0].begin + zigzag[0].length == zigzag[1].begin)
            zigzag = {{zigzag[0].begin, zigzag[0].length + zigzag[1].length}};  // the middle rank's, merged
          EXPECT_EQ(rank_chunks(cfg, cp, r, s), zigzag);
        }
    }
}

// The ring's causal work per rank (Strategy::work, what the strategies count when they run) on
// packed documents: per-document zigzag keeps the busiest rank within 5 % of the mean where
// plain zigzag leaves it at up to 1.77x (docs/seed_claims.md claim 4's packing), at cp = 2, 4, 8
// for p2p and every a2a+p2p factorisation.
double busiest_over_mean(const CpConfig& cfg, int cp, std::int64_t s) {
  const Strategy& strategy = find_strategy(cfg.cp_comm_type);
  double most = 0, total = 0;
  for (int r = 0; r < cp; ++r) {
    const double w = double(strategy.work(cfg, cp, r, {1, s, 8, 64}, s, 8));
    most = std::max(most, w);
    total += w;
  }
  return most * cp / total;
}

TEST(Sharding, PerDocumentZigzagBalancesTheRingOnPackedDocuments) {
  std::mt19937_64 rng(4);
  std::vector<std::int64_t> uniform(64), long_tail(48);
  for (std::int64_t& n : uniform) n = 1 + std::int64_t(rng() % 2048);
  for (std::int64_t& n : long_tail) n = std::int64_t(std::exp(4.0 + 5.0 * double(rng() % 1000) / 1000.0));  // 55 .. 8k
  std::vector<std::int64_t> claim4{32768};
  for (int i = 0; i < 8; ++i) claim4.push_back(2048);
  for (int i = 0; i < 4; ++i) claim4.push_back(4096);
  for (const auto& [name, lengths] : {std::pair{"claim 4", claim4}, {"uniform", uniform}, {"long tail", long_tail}})
    for (int cp : {2, 4, 8}) {
      const std::vector<std::int64_t> cu = cu_seqlens_of(lengths);
      for (const Strategy* s : strategies())
        for (CpConfig cfg : s->plan_configs(cp, true)) {
          cfg.cu_seqlens = cu;
          if (token_layout(cfg) != TokenLayout::per_document) continue;
          const double balanced = busiest_over_mean(cfg, cp, cu.back());
          cfg.per_document = false;
          const double plain = busiest_over_mean(cfg, cp, cu.back());
          SCOPED_TRACE(::testing::Message() << name << " cp " << cp << " " << s->config_name(cfg) << ": per-document "
                                            << balanced << ", plain zigzag " << plain);
          EXPECT_LE(balanced, 1.05);
          EXPECT_LE(balanced, plain + 1e-9);
          if (std::string(name) == "claim 4" && cp == 8 && cfg.cp_comm_type == "p2p") EXPECT_NEAR(plain, 1.77, 0.005);
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
