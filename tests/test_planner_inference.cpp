// The planner's inference mode: decode over a sharded KV cache per layout, where sharding pays,
// pass-KV against pass-Q for a turn over a cache, and memory as a term that refuses rows.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/plan/plan_inference.hpp"
#include "ulysses/plan/planner.hpp"

namespace ulysses {
namespace {

PlanInput decode_input(std::int64_t seq, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, int cp) {
  PlanInput in;
  in.seq = seq;
  in.batch = batch;
  in.heads = heads;
  in.kv_heads = kv_heads;
  in.head_dim = 128;
  in.layers = 2;
  in.cp = cp;
  in.mode = PlanMode::decode;
  in.cluster.kernel.memory_bandwidth = 2e12;
  return in;
}

const DecodeRow& row(const DecodePlan& p, const std::string& layout) {
  return test_util::row_where(p.rows, &DecodeRow::layout, layout);
}

TEST(PlanInference, DecodeReadsEachRanksShareOfTheCacheAtMemoryBandwidth) {
  const PlanInput in = decode_input(1000, 3, 8, 8, 4);
  const DecodePlan p = plan_decode(in);
  ASSERT_EQ(p.rows.size(), 3u);
  // layers · batch · 2 (K, V) · rows · kv heads · d · 2 bytes (bf16).
  EXPECT_DOUBLE_EQ(row(p, "cp = 1").kv_bytes, 2.0 * 3 * 2 * 1000 * 8 * 128 * 2);
  EXPECT_DOUBLE_EQ(row(p, "heads").kv_bytes, 2.0 * 3 * 2 * 1000 * 2 * 128 * 2);
  EXPECT_DOUBLE_EQ(row(p, "interleaved").kv_bytes, 2.0 * 3 * 2 * 250 * 8 * 128 * 2);
  for (const DecodeRow& r : p.rows) {
    ASSERT_TRUE(r.valid) << r.reason;
    EXPECT_DOUBLE_EQ(r.read_s, r.kv_bytes / 2e12);
    EXPECT_EQ(r.collectives, r.cp > 1 ? 2 : 0);  // one allgatherv per layer
    EXPECT_GE(r.step_s, r.read_s);
    EXPECT_DOUBLE_EQ(r.tokens_per_s, 3 / r.step_s);
  }
  EXPECT_EQ(row(p, "cp = 1").comm_s, 0);
  // interleaved gathers every head's output and LSE; heads only its own heads' outputs.
  EXPECT_GT(row(p, "interleaved").comm_s, row(p, "heads").comm_s);
}

TEST(PlanInference, HeadsLayoutReplicatesFewKvHeadsAndRefusesTooFewQueryHeads) {
  const DecodePlan gqa = plan_decode(decode_input(4096, 1, 16, 2, 8));
  EXPECT_EQ(row(gqa, "heads").replication, 4);
  EXPECT_DOUBLE_EQ(row(gqa, "heads").kv_bytes, 2.0 * 2 * 4096 * 1 * 128 * 2);  // one KV head per rank
  const DecodePlan few = plan_decode(decode_input(4096, 1, 4, 4, 8));
  EXPECT_FALSE(row(few, "heads").valid);
  EXPECT_NE(row(few, "heads").reason.find("interleaved"), std::string::npos) << row(few, "heads").reason;
  EXPECT_TRUE(row(few, "interleaved").valid);
}

TEST(PlanInference, CrossoverIsTheLeastConcurrencyAtWhichShardingIsFaster) {
  PlanInput in = decode_input(512, 1, 32, 8, 8);
  in.cluster.intra.latency = 20e-6;  // a latency-bound collective against a short cache
  const DecodeRow r = row(plan_decode(in), "interleaved");
  ASSERT_GT(r.crossover_batch, 1);
  for (std::int64_t b : {r.crossover_batch - 1, r.crossover_batch}) {
    in.batch = b;
    const DecodePlan p = plan_decode(in);
    EXPECT_EQ(row(p, "interleaved").step_s < row(p, "cp = 1").step_s, b == r.crossover_batch) << b;
  }
  in.batch = 1;
  const std::int64_t s = row(plan_decode(in), "interleaved").crossover_context;
  ASSERT_GT(s, 512);
  for (std::int64_t ctx : {s - 1, s}) {
    in.seq = ctx;
    const DecodePlan p = plan_decode(in);
    EXPECT_EQ(row(p, "interleaved").step_s < row(p, "cp = 1").step_s, ctx == s) << ctx;
  }
}

TEST(PlanInference, EveryFigureIsFiniteAtTheExtremes) {
  for (auto [seq, cp] : {std::pair<std::int64_t, int>{1, 1}, {1, kMaxPlanRanks}, {std::int64_t(1) << 30, 2}}) {
    const DecodePlan p = plan_decode(decode_input(seq, 1, 8, 1, cp));
    for (const DecodeRow& r : p.rows)
      for (double x : {r.kv_bytes, r.read_s, r.comm_s, r.step_s, r.tokens_per_s}) EXPECT_TRUE(std::isfinite(x));
    EXPECT_GE(p.best, 0);
  }
  PlanInput bad = decode_input(100, 1, 8, 8, 2);
  bad.kv_heads = 3;
  EXPECT_THROW(plan_decode(bad), Error);
}

TEST(PlanInference, PassQMovesLessWhenTheTurnIsASmallPartOfTheContext) {
  PlanInput in = decode_input(1000, 1, 64, 8, 4);  // 2 · kv_heads / heads = 0.25
  in.mode = PlanMode::prefill;
  const TurnPlan small = plan_turn(in, 9000);  // 0.1 < 0.25
  EXPECT_TRUE(small.rule_prefers_pass_q);
  EXPECT_LT(small.pass_q_bytes, small.pass_kv_bytes);
  EXPECT_DOUBLE_EQ(small.pass_kv_bytes, 3.0 * 2500 * 2 * 8 * 128 * 2);
  EXPECT_DOUBLE_EQ(small.pass_q_bytes, 3.0 * 250 * 64 * (2 * 128 * 2 + 4));
  in.seq = 5000;
  const TurnPlan half = plan_turn(in, 5000);  // 0.5 >= 0.25
  EXPECT_FALSE(half.rule_prefers_pass_q);
  EXPECT_GT(half.pass_q_bytes, half.pass_kv_bytes);
  EXPECT_EQ(half.choice.rfind("pass-KV", 0), 0u) << half.choice;
  EXPECT_THROW(plan_turn(in, -1), Error);
}

TEST(PlanInference, MemoryRefusesRowsAndSaysItDecided) {
  PlanInput in = decode_input(8192, 1, 16, 16, 4);
  in.mode = PlanMode::train;
  const Plan free = make_plan(in);
  double lo = 1e300, hi = 0;
  for (const PlanRow& r : free.rows)
    if (r.valid) lo = std::min(lo, r.memory_bytes), hi = std::max(hi, r.memory_bytes);
  ASSERT_LT(lo, hi);
  in.max_memory_bytes = (lo + hi) / 2;
  const Plan capped = make_plan(in);
  ASSERT_GE(capped.best, 0);
  EXPECT_LE(capped.rows[std::size_t(capped.best)].memory_bytes, in.max_memory_bytes);
  EXPECT_EQ(capped.recommendation.rfind("memory decides", 0), 0u) << capped.recommendation;
  for (std::size_t i = 0; i < capped.rows.size(); ++i)
    if (free.rows[i].valid && free.rows[i].memory_bytes > in.max_memory_bytes) {
      EXPECT_FALSE(capped.rows[i].valid);
      EXPECT_EQ(capped.rows[i].reason.rfind("memory:", 0), 0u) << capped.rows[i].reason;
    }
  // Decode: a cache too big for one rank fits sharded.
  in.mode = PlanMode::decode;
  in.max_memory_bytes = 0.5 * row(plan_decode(in), "cp = 1").kv_bytes;
  const DecodePlan d = plan_decode(in);
  EXPECT_FALSE(row(d, "cp = 1").valid);
  EXPECT_TRUE(row(d, "interleaved").valid);
  EXPECT_NE(d.recommendation.find("refused by memory"), std::string::npos) << d.recommendation;
  in.max_memory_bytes = -1;
  EXPECT_THROW(make_plan(in), Error);
}

}  // namespace
}  // namespace ulysses
