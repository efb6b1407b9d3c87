// The planner's inference mode: decode over a sharded KV cache per layout, where sharding pays,
// pass-KV against pass-Q for a turn over a cache, and memory as a term that refuses rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

// Every figure of one step counted by hand: the tiny GPT `generate` runs (2 layers, 4 heads of
// 32, width 128, SwiGLU 344, 256 tokens), float32, 2 requests of 1000 tokens at cp 2.
PlanInput counted_input() {
  PlanInput in = decode_input(1000, 2, 4, 4, 2);
  in.head_dim = 32;
  in.dtype = DType::f32;
  in.cluster.kernel.memory_bandwidth = 1e10;
  in.cluster.kernel.call_s = 5e-6;
  in.cluster.peak_flops = 1e12;
  in.cluster.efficiency = 1;
  in.cluster.ranks_per_node = 2;
  in.cluster.intra = {1e9, 10e-6};
  return in;
}

TEST(PlanInference, DecodeStepCountedByHandWithTheRowAroundTheAttention) {
  const PlanInput in = counted_input();
  const DecodeModel model{128, 344, 256, 5e9};
  // A layer's weights: 128·128 (q) + 2·128·128 (k, v) + 128·128 (out) + 2·128·344 + 344·128 (MLP)
  // = 197632; two layers and the head's 128·256: 428032; 2 FLOPs each.
  EXPECT_DOUBLE_EQ(row_weights(in, model), 428032);
  EXPECT_DOUBLE_EQ(row_flops(in, model), 856064);
  // The head's width x vocab past int64 (2^32 x 2^32 wrapped to 0): 2^64 weights more.
  const DecodeModel wide{std::int64_t(1) << 32, 344, std::int64_t(1) << 32, 5e9};
  const DecodeModel narrow{std::int64_t(1) << 32, 344, 1, 5e9};
  EXPECT_DOUBLE_EQ(row_weights(in, wide) - row_weights(in, narrow), 0x1p64 - 0x1p32);
  const DecodePlan p = plan_decode(in, model);
  // The row: 2 rows · 856064 FLOP at 5 GFLOP/s = 342.4256 us, over the weights' one read
  // (428032 · 4 B at 10 GB/s = 171.2128 us); the same at every cp.
  for (const DecodeRow& r : p.rows) EXPECT_NEAR(r.row_s, 342.4256e-6, 1e-15) << r.layout;
  // cp = 1: 2 requests · 2 (K, V) · 1000 rows · 4 heads · 32 · 4 B = 2.048 MB a layer at 10 GB/s
  // = 204.8 us; compute 4 · 32 · 4 heads · 1000 · 2 at 1 TFLOP/s = 1.024 us (under the read);
  // 5 us a call; 2 layers: 2 · 209.8 us + the row.
  EXPECT_NEAR(row(p, "cp = 1").read_s, 409.6e-6, 1e-15);
  EXPECT_NEAR(row(p, "cp = 1").step_s, 419.6e-6 + 342.4256e-6, 1e-15);
  // heads: 2 KV heads a rank: 102.4 us of read a layer; one allgatherv of 2 requests · 2 heads ·
  // 32 · 4 B = 512 B, one hop: 10 us + 0.512 us.
  EXPECT_NEAR(row(p, "heads").comm_s, 2 * 10.512e-6, 1e-15);
  EXPECT_NEAR(row(p, "heads").step_s, 2 * (102.4e-6 + 5e-6 + 10.512e-6) + 342.4256e-6, 1e-15);
  // interleaved: 500 rows, every head; the gather: 2 · 4 heads · (32 · 4 + 4 LSE) B = 1056 B.
  EXPECT_NEAR(row(p, "interleaved").comm_s, 2 * 11.056e-6, 1e-15);
  EXPECT_NEAR(row(p, "interleaved").step_s, 2 * (102.4e-6 + 5e-6 + 11.056e-6) + 342.4256e-6, 1e-15);
  // Crossover at 2 requests: heads saves 2 · s · 512 B / 10 GB/s = s · 102.4 ns a layer against
  // its 10.512 us gather: from s = 103; interleaved saves 2 · floor(s / 2) · 1024 B / 10 GB/s
  // against 11.056 us: from floor(s / 2) = 54, s = 108. At 1000 tokens one request pays.
  EXPECT_EQ(row(p, "heads").crossover_context, 103);
  EXPECT_EQ(row(p, "interleaved").crossover_context, 108);
  EXPECT_EQ(row(p, "heads").crossover_batch, 1);
  // The row is the same on both sides of the crossover: it moves neither.
  const DecodePlan bare = plan_decode(in);
  EXPECT_EQ(row(bare, "heads").row_s, 0);
  for (const char* layout : {"heads", "interleaved"}) {
    EXPECT_EQ(row(bare, layout).crossover_context, row(p, layout).crossover_context) << layout;
    EXPECT_EQ(row(bare, layout).crossover_batch, row(p, layout).crossover_batch) << layout;
  }
  // One request at 20 GFLOP/s: 42.8 us of FLOPs, so the weights' read decides (171.2128 us).
  PlanInput one = in;
  one.batch = 1;
  EXPECT_NEAR(row(plan_decode(one, {128, 344, 256, 2e10}), "cp = 1").row_s, 171.2128e-6, 1e-15);
}

// The step's calibrated fixed costs counted by hand: each request's own a layer (its row
// appended, its kernel call, its block unpacked or merged; one figure per layout) and the rows at
// the batch's own measured seconds a token.
TEST(PlanInference, EachRequestPaysItsOwnCostsALayerAndTheRowsTheirBatchsRate) {
  const PlanInput in = counted_input();
  DecodeModel m{128, 344, 256, 5e9};
  m.request_s = {2e-6, 3e-6, 4e-6};
  m.batch_token_s = 100e-6;
  m.batch_rows = 2;
  const DecodePlan p = plan_decode(in, m);
  // The rows: 2 tokens · (100 us of layers + the LM head's 2 · 128 · 256 FLOP at 5 GFLOP/s,
  // 13.1072 us) = 226.2144 us, over the weights' read (171.2128 us); the same at every cp.
  for (const DecodeRow& r : p.rows) EXPECT_NEAR(r.row_s, 226.2144e-6, 1e-15) << r.layout;
  // A layer's calls: the 5 us call and 2 requests' own: 2 · (5 + 2 · 2) = 18 us at cp = 1,
  // 2 · (5 + 2 · 3) = 22 us (heads), 2 · (5 + 2 · 4) = 26 us (interleaved).
  EXPECT_NEAR(row(p, "cp = 1").calls_s, 18e-6, 1e-15);
  EXPECT_NEAR(row(p, "heads").calls_s, 22e-6, 1e-15);
  EXPECT_NEAR(row(p, "interleaved").calls_s, 26e-6, 1e-15);
  EXPECT_NEAR(row(p, "cp = 1").step_s, 409.6e-6 + 18e-6 + 226.2144e-6, 1e-15);
  EXPECT_NEAR(row(p, "heads").step_s, 2 * (102.4e-6 + 10.512e-6) + 22e-6 + 226.2144e-6, 1e-15);
  EXPECT_NEAR(row(p, "interleaved").step_s, 2 * (102.4e-6 + 11.056e-6) + 26e-6 + 226.2144e-6, 1e-15);
  // Crossover at 2 requests: heads saves s · 102.4 ns a layer against its 10.512 us gather and
  // 2 · (3 − 2) us of requests' costs: from s = 123 (122 · 102.4 ns = 12.4928 us); interleaved
  // saves floor(s / 2) · 204.8 ns against 11.056 + 2 · (4 − 2) = 15.056 us: from floor(s / 2) =
  // 74, s = 148. At 1000 tokens one request pays: 51.2 − 1 us saved against 10.512.
  EXPECT_EQ(row(p, "heads").crossover_context, 123);
  EXPECT_EQ(row(p, "interleaved").crossover_context, 148);
  EXPECT_EQ(row(p, "heads").crossover_batch, 1);
  // Bad figures are refused: negative, not a number, seconds without the rows they were measured on.
  for (double bad : {-1e-6, std::nan("")}) {
    DecodeModel b = m;
    b.request_s.interleaved = bad;
    EXPECT_THROW(plan_decode(in, b), Error);
    b = m;
    b.batch_token_s = bad;
    EXPECT_THROW(plan_decode(in, b), Error);
  }
  DecodeModel no_rows = m;
  no_rows.batch_rows = 0;
  EXPECT_THROW(plan_decode(in, no_rows), Error);
}

TEST(PlanInference, ACacheThatFitsTheNodesLastLevelCacheReadsAtItsRate) {
  const PlanInput in = counted_input();
  DecodeModel m{128, 344, 256, 5e9};
  m.llc_bytes = 6e6;
  m.llc_bandwidth = 4e10;
  m.kernel_measured = true;  // the rates are the kernel's own: no compute term
  const DecodePlan p = plan_decode(in, m);
  // cp = 1: 2 layers · 2 requests · 1.024 MB of cache + 428032 · 4 B of weights = 5808128 B on
  // the node, under 6 MB: 4.096 MB at 40 GB/s = 102.4 us, 5 us a call, the row 342.4256 us.
  EXPECT_NEAR(row(p, "cp = 1").read_s, 102.4e-6, 1e-15);
  EXPECT_EQ(row(p, "cp = 1").compute_s, 0);
  EXPECT_NEAR(row(p, "cp = 1").step_s, 102.4e-6 + 10e-6 + 342.4256e-6, 1e-15);
  // heads: 2 ranks · (2.048 MB + 1712128 B) = 7520256 B, over it: from memory, as without it.
  EXPECT_NEAR(row(p, "heads").read_s, 204.8e-6, 1e-15);
  EXPECT_NEAR(row(p, "heads").step_s, 2 * (102.4e-6 + 5e-6 + 10.512e-6) + 342.4256e-6, 1e-15);
  // A measured collective replaces the link's message: 30 us a layer.
  m.collective_s = 30e-6;
  EXPECT_NEAR(row(plan_decode(in, m), "interleaved").comm_s, 2 * 30e-6, 1e-15);
  m.llc_bandwidth = -1;
  EXPECT_THROW(plan_decode(in, m), Error);
}

TEST(PlanInference, DecodeModelRefusesAWidthWithoutItsSizes) {
  const PlanInput in = counted_input();
  EXPECT_THROW(plan_decode(in, {128, 0, 256, 0}), Error);
  EXPECT_THROW(plan_decode(in, {128, 344, 0, 0}), Error);
  EXPECT_THROW(plan_decode(in, {-1, 344, 256, 0}), Error);
  EXPECT_THROW(plan_decode(in, {128, 344, 256, -1}), Error);
  EXPECT_NO_THROW(plan_decode(in, {0, 0, 0, 0}));  // no row: the attention alone
}

// The time to first token counted by hand: the tiny GPT's prompt of 1000 tokens (2 requests) on
// a flat kernel at the prefill's 50 GFLOP/s, links too fast to count, the rows 30 us a token.
TEST(PlanInference, TimeToFirstTokenIsTheAttentionAndThePromptsRowsCountedByHand) {
  PlanInput in = counted_input();
  in.cluster.kernel.call_s = 0;
  in.cluster.intra = {1e18, 0};
  DecodeModel m{128, 344, 256, 5e9};
  m.prefill_token_s = 30e-6;
  m.prefill_flops = 5e10;
  const DecodePlan p = plan_decode(in, m);
  ASSERT_EQ(p.prefill.size(), 3u);
  auto path = [&](const std::string& name) -> const PrefillRow& {
    return test_util::row_where(p.prefill, &PrefillRow::prefill, name);
  };
  // A layer's causal attention: 4 · 32 · 4 heads · 2 requests · 1000 · 1001 / 2 visible pairs
  // (the diagonal included) = 5.12512e8 FLOP, 10.25024 ms at 50 GFLOP/s; 2 layers. The LM head of
  // each request's last token: 2 · 2 · 128 · 256 FLOP at the row's 5 GFLOP/s = 26.2144 us.
  const double lm_head = 26.2144e-6;
  EXPECT_NEAR(path("cp = 1").attention_s, 20.50048e-3, 1e-12);
  EXPECT_NEAR(path("cp = 1").rows_s, 2 * 1000 * 30e-6 + lm_head, 1e-12);
  EXPECT_NEAR(path("cp = 1").ttft_s, 20.50048e-3 + 60e-3 + lm_head, 1e-12);
  // ulysses: half the heads a rank (the links too fast to add a nanosecond), half the tokens'
  // rows; ring (contiguous chunks): the last rank's diagonal (500 · 501 / 2 pairs) and the full
  // block before it (500²): 375250 pairs, 15.37024 ms.
  EXPECT_NEAR(path("ulysses").attention_s, 10.25024e-3, 1e-9);
  EXPECT_NEAR(path("ulysses").rows_s, 2 * 500 * 30e-6 + lm_head, 1e-12);
  EXPECT_NEAR(path("ring").attention_s, 15.37024e-3, 1e-9);
  EXPECT_NEAR(path("ring").ttft_s, 15.37024e-3 + 30e-3 + lm_head, 1e-9);
  // Uncalibrated rows: the layers' products, 856064 − 65536 (the LM head) = 790528 FLOP a token
  // at 5 GFLOP/s = 158.1056 us.
  m.prefill_token_s = 0;
  EXPECT_NEAR(prefill_token_seconds(in, m), 158.1056e-6, 1e-15);
}

// Under full attention the ring's chunks are contiguous already, so the table lists no
// --no-zigzag twin: the ring prefill is the p2p row itself, not an invalid path.
TEST(PlanInference, FullAttentionsRingPrefillIsThePlannersP2pRow) {
  PlanInput in = counted_input();
  in.causal = false;
  const DecodePlan p = plan_decode(in, DecodeModel{128, 344, 256, 5e9});
  const PrefillRow& ring = test_util::row_where(p.prefill, &PrefillRow::prefill, std::string("ring"));
  ASSERT_TRUE(ring.valid) << ring.reason;
  PlanInput prefill = in;
  prefill.mode = PlanMode::prefill;
  const Plan plan = make_plan(prefill);
  const PlanRow& p2p = test_util::row_where(plan.rows, &PlanRow::name, std::string("p2p"));
  EXPECT_EQ(ring.attention_s, p2p.predicted_step_s);
  for (const PlanRow& r : plan.rows) EXPECT_NE(r.name, "p2p --no-zigzag");
}

TEST(PlanInference, PrefillFiguresRefuseNegativeAndNotANumber) {
  const PlanInput in = counted_input();
  for (double bad : {-1.0, std::nan("")}) {
    DecodeModel m{128, 344, 256, 5e9};
    m.prefill_token_s = bad;
    EXPECT_THROW(plan_decode(in, m), Error);
    m = {128, 344, 256, 5e9};
    m.prefill_flops = bad;
    EXPECT_THROW(plan_decode(in, m), Error);
  }
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
  // seq + cached wrapped: the context came out negative, its bytes too.
  try {
    plan_turn(in, std::numeric_limits<std::int64_t>::max() - 1000);
    ADD_FAILURE() << "a context past int64 was planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the turn is too large to plan"), std::string::npos) << e.what();
  }
  const TurnPlan big = plan_turn(in, std::int64_t(1) << 40);  // a trillion cached tokens: priced
  EXPECT_GT(big.pass_kv_bytes, 0);
  EXPECT_TRUE(std::isfinite(big.pass_kv_s) && big.pass_kv_s > 0);
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
