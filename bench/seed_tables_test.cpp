// The seed section's tables (seed.hpp), on every rank count: the counted operations, messages
// and bytes equal the formulas the seed section plots; the valid-cp table equals what the
// library accepts. The benchmark's own test, beside it: the tests never include bench code.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "mpi_helpers.hpp"
#include "seed.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {
namespace {

using testing::run_layer;

// Claims 1 and 2 at cp = this job's size, for every shape the seed section measures: the
// counters equal the formulas on every rank, and the seed's count of forward operations.
TEST(SeedTables, CountedTrafficEqualsTheFormulas) {
  MpiCommunicator world;
  const int cp = world.size();
  const std::vector<int> cps = seed::run_cps();
  if (std::find(cps.begin(), cps.end(), cp) == cps.end()) GTEST_SKIP() << "cp " << cp << " is not plotted";
  for (const seed::PlotShape& shape : seed::run_shapes())
    for (const std::string strategy : {"a2a", "p2p", "all_gather"}) {
      const CpConfig cfg{strategy, {}, true};
      const auto chunks = rank_chunks(cfg, cp, world.rank(), shape.q.s);
      const Shape qs{1, total_tokens(chunks), shape.q.h, shape.q.d}, ks{1, qs.s, shape.kv_heads, shape.q.d};
      Tensor q(qs), k(ks), v(ks), out(qs), dout(qs), dq(qs), dk(ks), dv(ks);
      ContextParallelAttention attn(world, cfg);
      world.reset_counters();
      const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
      const seed::Traffic fwd = seed::counted_traffic(world.counters());
      world.reset_counters();
      attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
      const seed::Traffic bwd = seed::counted_traffic(world.counters());
      const auto formula = [&](bool b) {
        return seed::formula_traffic(cfg, cp, world.rank(), shape.q, shape.kv_heads, DType::f32, b);
      };
      EXPECT_EQ(fwd, formula(false)) << strategy << " " << shape.name;
      EXPECT_EQ(bwd, formula(true)) << strategy << " " << shape.name;
      // The seed's counts: a2a 2 all-to-alls of cp − 1 messages; the ring cp − 1 steps.
      if (strategy != "all_gather") EXPECT_EQ(fwd.calls, seed::seed_forward_calls(strategy, cp)) << strategy;
      EXPECT_EQ(fwd.messages, strategy == "a2a" ? 2 * (cp - 1) : cp - 1) << strategy;
      if (strategy == "p2p") EXPECT_EQ(bwd.calls, 2 * cp - 1);
    }
}

// Claim 4's experiment: CpConfig::zigzag = false keeps a causal ring's chunks contiguous.
TEST(SeedTables, RingWithoutZigzagHoldsContiguousChunks) {
  const CpConfig contiguous{"p2p", {}, true, std::nullopt, false}, zigzag{"p2p", {}, true};
  EXPECT_FALSE(uses_zigzag(contiguous));
  EXPECT_TRUE(uses_zigzag(zigzag));
  EXPECT_EQ(rank_chunks(contiguous, 4, 3, 16), (std::vector<SeqChunk>{{12, 4}}));
  EXPECT_EQ(rank_chunks(zigzag, 4, 3, 16), (std::vector<SeqChunk>{{6, 2}, {8, 2}}));
}

// Claim 7 at cp = this job's size: a real a2a forward runs exactly where the table says the
// library accepts it (the other cps through validate_cp_config, the same rule).
TEST(SeedTables, ValidCpTableEqualsTheLibrary) {
  MpiCommunicator world;
  const int cp = world.size();
  for (const seed::Model& m : seed::common_models()) {
    for (int c : seed::table_cps())
      EXPECT_EQ(seed::cp_validity(m.heads, m.kv_heads, c).library_a2a,
                seed::library_accepts({"a2a"}, c, m.heads, m.kv_heads))
          << m.name << " cp " << c;
    const auto cps = seed::table_cps();
    if (std::find(cps.begin(), cps.end(), cp) == cps.end()) continue;
    bool ran = true;
    try {
      run_layer(world, {"a2a", {}, true}, {1, 2 * cp, m.heads, 4}, m.kv_heads);
    } catch (const Error&) {  // agreed on every rank
      ran = false;
    }
    EXPECT_EQ(ran, seed::cp_validity(m.heads, m.kv_heads, cp).library_a2a) << m.name << " cp " << cp;
  }
}

// The table's rows for two models, written out: the seed's rules and the library's.
TEST(SeedTables, ValidCpRowsOfQwen2AndLlama70B) {
  const auto cps_where = [](std::int64_t h, std::int64_t kv, bool seed::CpValidity::*field) {
    std::vector<int> out;
    for (int c : seed::table_cps())
      if (seed::cp_validity(h, kv, c).*field) out.push_back(c);
    return out;
  };
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::seed_rule), (std::vector<int>{2, 4, 7, 14, 28}));
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::seed_kv_rule), (std::vector<int>{2, 4}));
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::library_a2a), (std::vector<int>{2, 4, 7, 8, 14, 16, 28}));
  EXPECT_EQ(cps_where(64, 8, &seed::CpValidity::seed_kv_rule), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(cps_where(64, 8, &seed::CpValidity::library_a2a), (std::vector<int>{2, 4, 7, 8, 14, 16, 28, 32, 64}));
  EXPECT_EQ(seed::cp_validity(28, 4, 64).hierarchical,
            (std::vector<std::array<int, 2>>{{2, 32}, {4, 16}, {8, 8}, {16, 4}}));
}

}  // namespace
}  // namespace ulysses
