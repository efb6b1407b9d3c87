// The planner against published GPU measurements: every number of docs/planner.md's "published
// vs predicted" table, the kernel model against the FlashAttention-3 paper's curve, the presets
// and modes with their bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/plan/calibrate_kernel.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/kernel_model.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/cp/token_layout.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/plan/presets.hpp"

using namespace ulysses;
using test_util::error_of;

namespace {

struct Measured {
  std::string row;      // the planner's row name
  double iter_per_s;    // published
  double predicted_ms;  // what the planner predicts (this table is docs/planner.md's)
};

struct Published {
  std::string source, gpu, kernel;
  PlanInput in;  // the shape, the ranks and the mode; the cluster is the gpu's and the kernel's
  std::vector<Measured> rows;
  std::string intra_fabric = "";  // "": the GPU's own
  // Packed documents the benchmark rotates through, one pattern an iteration: the published time
  // is their mean, and so is the prediction (empty: one plan of `in`).
  std::vector<std::vector<std::int64_t>> rotation = {};
};

// ring-flash-attention README (batch API, Llama-3.1-8B attention: 32 heads, 8 KV, d 128, 8k
// tokens per GPU, causal, bf16, flash_attn 2) and long-context-attention README (8xA100-SXM4-80GB
// NVLink, forward only, batch 2, causal, zigzag qkvpacked; ulysses_degree 8/4/2/1 = a2a,
// a2a+p2p [4,2], [2,4], p2p).

// A ring-flash-attention case: Llama-3.1-8B attention, batch 1, 8k tokens per GPU.
Published ring_flash(const char* gpu, PlanMode mode, std::int64_t seq, std::vector<Measured> rows) {
  const PlanInput in{.seq = seq, .heads = 32, .kv_heads = 8, .head_dim = 128, .cp = int(seq / 8192), .mode = mode};
  return {"ring-flash-attention", gpu, "fa2", in, std::move(rows)};
}

// A long-context-attention case: 8xA100, forward, batch 2, as many KV heads as heads; its rows
// by ulysses_degree as the README lists them (8, 4, 2, 1: a2a, a2a+p2p [4,2], [2,4], p2p).
struct ByDegree {
  int ulysses_degree;
  double iter_per_s, predicted_ms;
};
Published long_context(std::int64_t seq, std::int64_t heads, std::int64_t head_dim, const std::vector<ByDegree>& rows) {
  const PlanInput in{.seq = seq,
                     .batch = 2,
                     .heads = heads,
                     .kv_heads = heads,
                     .head_dim = head_dim,
                     .cp = 8,
                     .mode = PlanMode::forward};
  Published c{"long-context-attention", "A100", "fa2", in, {}};
  static const std::map<int, std::string> row_of_degree{{8, "a2a"},
                                                        {4, "a2a+p2p [4,2]"},
                                                        {2, "a2a+p2p [2,4]"},
                                                        {1, "p2p"}};
  for (const ByDegree& r : rows) c.rows.push_back({row_of_degree.at(r.ulysses_degree), r.iter_per_s, r.predicted_ms});
  return c;
}

// long-context-attention's 8xL20 PCIe table (media/pcie_machine.jpg): forward, causal, fp16,
// zigzag, not packed; the contiguous ("basic") ring as p2p --no-zigzag. kv heads = heads / group_num.
Published l20(std::int64_t seq, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
              const std::vector<ByDegree>& zigzag, double basic_p2p, double basic_predicted_ms) {
  Published c = long_context(seq, 32, head_dim, zigzag);
  c.gpu = "L20";
  c.in.batch = batch;
  c.in.kv_heads = kv_heads;
  c.rows.push_back({"p2p --no-zigzag", basic_p2p, basic_predicted_ms});
  return c;
}

const std::vector<Published>& published() {
  static const std::vector<Published> all{
      ring_flash("H800", PlanMode::forward, 65536, {{"p2p", 63.0, 14.483}, {"p2p --no-zigzag", 38.5, 24.810}}),
      ring_flash("H800", PlanMode::train, 65536, {{"p2p", 17.4, 52.405}, {"p2p --no-zigzag", 10.4, 92.682}}),
      ring_flash("A100", PlanMode::forward, 65536, {{"p2p", 38.2, 25.856}, {"p2p --no-zigzag", 24.0, 44.793}}),
      ring_flash("A100", PlanMode::train, 65536, {{"p2p", 10.6, 94.300}, {"p2p --no-zigzag", 6.2, 168.153}}),
      ring_flash("H800", PlanMode::forward, 8192, {{"a2a", 591.5, 1.590}}),
      ring_flash("H800", PlanMode::train, 8192, {{"a2a", 154.7, 6.104}}),
      ring_flash("A100", PlanMode::forward, 8192, {{"a2a", 373.4, 2.873}}),
      ring_flash("A100", PlanMode::train, 8192, {{"a2a", 94.7, 11.110}}),
      long_context(8192, 32, 32, {{8, 237.874, 0.375}, {4, 581.26, 0.460}, {2, 417.267, 0.600}, {1, 245.756, 0.890}}),
      long_context(32768, 32, 32, {{8, 87.997, 4.123}, {4, 89.286, 4.361}, {2, 78.662, 4.642}, {1, 59.774, 5.215}}),
      long_context(131072, 32, 32,
                   {{8, 15.895, 61.974}, {4, 16.027, 62.826}, {2, 15.305, 63.671}, {1, 13.169, 65.372}}),
      long_context(131072, 8, 32, {{8, 58.629, 15.552}, {4, 59.483, 15.791}, {2, 58.277, 16.071}, {1, 51.83, 16.643}}),
      long_context(131072, 4, 32, {{4, 102.432, 7.951}, {2, 101.666, 8.137}, {1, 100.156, 8.521}}),
      long_context(131072, 2, 32, {{2, 174.567, 4.171}, {1, 168.255, 4.461}}),
      long_context(131072, 8, 128,
                   {{8, 20.992, 44.345}, {4, 21.916, 45.157}, {2, 21.383, 45.948}, {1, 18.211, 47.541}}),
      l20(131072, 2, 32, 32, {{8, 3.947, 283.187}, {4, 6.667, 173.503}, {2, 8.471, 136.336}, {1, 7.408, 151.226}},
          5.005, 246.058),
      l20(32768, 1, 8, 128, {{8, 14.262, 60.39}, {4, 32.818, 26.483}, {2, 62.754, 15.29}, {1, 58.377, 18.81}}, 40.478,
          25.758),
      l20(131072, 1, 8, 128, {{8, 2.586, 375.845}, {4, 4.235, 240.185}, {2, 5.476, 195.172}, {1, 5.186, 197.362}},
          3.131, 354.292),
      l20(8192, 1, 8, 128, {{8, 57.098, 13.084}, {4, 152.189, 4.674}, {2, 454.93, 2.597}, {1, 361.969, 4.504}}, 358.595,
          4.579),
  };
  return all;
}

// Published measurements the model was not fitted on: every constant above was set before these
// rows were read, and none was changed after (docs/planner.md, "Not fitted on").
// USP technical report (Fang and Zhao 2024; long-context-attention's
// media/unified_seq_parallel_tech_report.pdf), Table 3: 8xA100-SXM4 NVLink, forward, 32 heads of
// which 8 KV, d 128, batch 1; the "lb-ring" (zigzag) columns by ulysses_degree, the basic ring at
// degree 1 as p2p --no-zigzag.
Published usp_a100(std::int64_t seq, const std::vector<ByDegree>& zigzag, double basic_p2p, double basic_ms) {
  Published c = long_context(seq, 32, 128, zigzag);
  c.source = "USP report";
  c.in.batch = 1;
  c.in.kv_heads = 8;
  c.rows.push_back({"p2p --no-zigzag", basic_p2p, basic_ms});
  return c;
}

// long-context-attention's media/pcie_machine.jpg, its 4xA100 PCIe half: forward, 32 heads, d 32,
// batch 2, zigzag not packed by ulysses_degree 4 / 2 / 1 (a2a, a2a+p2p [2,2], p2p), the basic
// ring at degree 1 as p2p --no-zigzag; planned on PCIe 4 with the node's 4 ranks.
Published a100_pcie(std::int64_t seq, const std::array<double, 4>& its, const std::array<double, 4>& ms) {
  PlanInput in{.seq = seq, .batch = 2, .heads = 32, .kv_heads = 32, .head_dim = 32, .cp = 4, .mode = PlanMode::forward};
  in.cluster.ranks_per_node = 4;
  return {"long-context-attention",
          "A100",
          "fa2",
          in,
          {{"a2a", its[0], ms[0]},
           {"a2a+p2p [2,2]", its[1], ms[1]},
           {"p2p", its[2], ms[2]},
           {"p2p --no-zigzag", its[3], ms[3]}},
          "pcie4"};
}

// long-context-attention's README of April 2024 (commit e337723): 8xA100 NVLink, bf16, causal,
// batch 2, d 128, its sequence 8 ranks x the per-rank length; "8x1" (ring x ulysses) is p2p,
// "4x2" a2a+p2p [2,4], "2x4" [4,2], "1x8" a2a; the basic ring at 8x1 (or ring-flash-attention's
// ring_flash_attn, in gqa.png) as p2p --no-zigzag.
Published lca_april(std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, PlanMode mode,
                    const std::vector<ByDegree>& zigzag, double basic_p2p, double basic_ms) {
  Published c = long_context(seq, heads, 128, zigzag);
  c.in.kv_heads = kv_heads;
  c.in.mode = mode;
  c.rows.push_back({"p2p --no-zigzag", basic_p2p, basic_ms});
  return c;
}

// ring-flash-attention README, varlen API: Llama-3.1-8B attention (32 heads, 8 KV, d 128), 8k
// tokens per GPU on 8, causal, bf16; each iteration one of four cu_seqlens (x 8 GPUs): one
// document, three, two, five. zigzag_ring zigzags every document (p2p); llama3_attn all-gathers
// K/V over the packed sequence cut in 8 contiguous parts (all_gather --no-zigzag).
Published ring_flash_varlen(const char* gpu, PlanMode mode, double zigzag, double zigzag_ms, double llama3,
                            double llama3_ms) {
  Published c =
      ring_flash(gpu, mode, 65536, {{"p2p", zigzag, zigzag_ms}, {"all_gather --no-zigzag", llama3, llama3_ms}});
  c.rotation = {{65536}, {2048, 59136, 4352}, {32768, 32768}, {24832, 25600, 12800, 1280, 1024}};
  return c;
}

// ring-flash-attention README of February 2024 (commit 129ef58; benchmark/benchmark_qkvpacked_func.py):
// 8xH800 / 8xA100, packed qkv of 5 heads x 128 (as many KV heads), batch 1, 8k tokens per GPU,
// causal, bf16, flash_attn 2; zigzag_ring is p2p, ring_attn p2p --no-zigzag, "theoretic
// flash_attn" one GPU at 8k (cp 1, a2a).
Published ring_flash_feb2024(const char* gpu, PlanMode mode, std::int64_t seq, std::vector<Measured> rows) {
  Published c = ring_flash(gpu, mode, seq, std::move(rows));
  c.in.heads = 5;
  c.in.kv_heads = 5;
  return c;
}

// ring-flash-attention's own ring (p2p --no-zigzag) and zigzag_ring (p2p) in long-context-attention's
// media/long_ctx_h8.png (9b81b51) and long_ctx_h2.png (8aaf163): 8xA100, heads x 128, batch 2,
// 8k tokens per GPU (the script's 8 x 8192), causal, bf16.
Published ring_flash_in_lca(std::int64_t heads, PlanMode mode, double zigzag, double zigzag_ms, double ring,
                            double ring_ms) {
  Published c = lca_april(65536, heads, heads, mode, {{1, zigzag, zigzag_ms}}, ring, ring_ms);
  c.source = "ring-flash-attention in long-context-attention";
  return c;
}

const std::vector<Published>& not_fitted() {
  static const std::vector<Published> all{
      usp_a100(32768, {{8, 136.375, 5.800}, {4, 132.979, 6.244}, {2, 132.979, 6.728}, {1, 113.79, 7.707}}, 81.985,
               12.431),
      usp_a100(131072, {{8, 2.785, 88.026}, {4, 2.771, 89.699}, {2, 2.89, 91.356}, {1, 2.91, 94.683}}, 1.628, 170.509),
      a100_pcie(65536, {8.483, 8.292, 9.738, 6.705}, {75.454, 36.918, 32.741, 55.539}),
      a100_pcie(16384, {41.443, 30.166, 24.176, 31.096}, {13.209, 3.775, 4.603, 4.956}),
      a100_pcie(4096, {227.163, 177.013, 123.142, 126.459}, {3.005, 0.814, 1.110, 1.132}),
      lca_april(65536, 8, 8, PlanMode::train,
                {{8, 10.679, 43.445}, {4, 12.864, 44.835}, {2, 11.024, 45.844}, {1, 8.211, 47.886}}, 8.161, 84.813),
      lca_april(65536, 2, 2, PlanMode::forward, {{2, 149.973, 3.211}, {1, 113.71, 3.582}}, 112.083, 5.949),
      lca_april(65536, 2, 2, PlanMode::train, {{2, 38.337, 11.768}, {1, 32.095, 12.573}}, 32.11, 21.805),
      lca_april(32768, 64, 8, PlanMode::forward,
                {{8, 40.436, 22.868}, {4, 41.053, 24.556}, {2, 39.275, 26.243}, {1, 34.063, 29.629}}, 23.138, 48.524),
      lca_april(32768, 64, 8, PlanMode::train,
                {{8, 11.428, 87.365}, {4, 11.299, 91.346}, {2, 10.638, 95.226}, {1, 9.64, 103.011}}, 5.967, 176.704),
      ring_flash_varlen("H800", PlanMode::forward, 74.8, 10.393, 60.8, 15.887),
      ring_flash_varlen("H800", PlanMode::train, 21.4, 36.455, 16.4, 60.760),
      ring_flash_varlen("A100", PlanMode::forward, 47.9, 18.356, 34.3, 27.702),
      ring_flash_varlen("A100", PlanMode::train, 13.4, 65.052, 9.7, 107.183),
      ring_flash_feb2024("H800", PlanMode::forward, 65536, {{"p2p", 283.0, 2.600}, {"p2p --no-zigzag", 208.0, 4.214}}),
      ring_flash_feb2024("H800", PlanMode::train, 65536, {{"p2p", 75.7, 9.022}, {"p2p --no-zigzag", 54.3, 15.316}}),
      ring_flash_feb2024("A100", PlanMode::forward, 65536, {{"p2p", 179.0, 4.377}, {"p2p --no-zigzag", 124.4, 7.336}}),
      ring_flash_feb2024("A100", PlanMode::train, 65536, {{"p2p", 49.5, 15.516}, {"p2p --no-zigzag", 33.3, 27.055}}),
      ring_flash_feb2024("H800", PlanMode::forward, 8192, {{"a2a", 2418.4, 0.2906}}),
      ring_flash_feb2024("H800", PlanMode::train, 8192, {{"a2a", 705.2, 1.038}}),
      ring_flash_feb2024("A100", PlanMode::forward, 8192, {{"a2a", 1545.9, 0.4911}}),
      ring_flash_feb2024("A100", PlanMode::train, 8192, {{"a2a", 470.6, 1.820}}),
      ring_flash_in_lca(8, PlanMode::forward, 25.95, 13.128, 31.49, 22.596),
      ring_flash_in_lca(8, PlanMode::train, 7.16, 47.886, 8.47, 84.813),
      ring_flash_in_lca(2, PlanMode::forward, 98.5, 3.582, 114.04, 5.949),
      ring_flash_in_lca(2, PlanMode::train, 28.60, 12.573, 32.57, 21.805),
  };
  return all;
}

// Rows of long-context-attention's media/benchmark_results.png that the fitted-on set left unread
// (no constant was fitted on them; the A100's efficiency was fitted on their table): the basic
// qkvpacked ring at ulysses_degree 1 (p2p --no-zigzag) beside the zigzag one, and the not-packed
// GQA shape (64 heads of which 8 KV, x 32, 128k) by ulysses_degree, its basic ring at degree 1.
Published benchmark_results_unread(std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                                   const std::vector<ByDegree>& zigzag, double basic, double basic_ms) {
  Published c = long_context(seq, heads, head_dim, zigzag);
  c.in.kv_heads = kv_heads;
  c.rows.push_back({"p2p --no-zigzag", basic, basic_ms});
  return c;
}

const std::vector<Published>& left_unread() {
  static const std::vector<Published> all{
      benchmark_results_unread(8192, 32, 32, 32, {{1, 245.756, 0.890}}, 253.157, 1.095),
      benchmark_results_unread(32768, 32, 32, 32, {{1, 59.774, 5.215}}, 51.304, 8.534),
      benchmark_results_unread(131072, 8, 8, 32, {{1, 51.83, 16.643}}, 32.825, 29.964),
      benchmark_results_unread(131072, 4, 4, 32, {{1, 100.156, 8.521}}, 63.913, 15.182),
      benchmark_results_unread(131072, 2, 2, 32, {{1, 168.255, 4.461}}, 119.196, 7.791),
      benchmark_results_unread(131072, 8, 8, 128, {{1, 18.211, 47.541}}, 7.769, 85.454),
      benchmark_results_unread(131072, 64, 8, 32,
                               {{8, 8.37, 123.185}, {4, 8.054, 124.953}, {2, 8.038, 126.746}, {1, 7.819, 130.344}},
                               4.38, 236.910),
  };
  return all;
}

PlanInput input_of(const Published& c) {
  PlanInput in = c.in;
  const GpuPreset& g = find_gpu_preset(c.gpu);
  apply_gpu(in.cluster, g, find_kernel_preset(c.kernel), DType::bf16);
  apply_intra_fabric(in.cluster, find_fabric_preset(c.intra_fabric.empty() ? g.intra : c.intra_fabric));
  return in;
}

const PlanRow& row_of(const Plan& p, const std::string& name) {
  return test_util::row_where(p.rows, &PlanRow::name, name);
}

// How often the predicted fastest of the measured rows is the measured fastest (and within 5 % of
// its rate), over configurations with more than one row; how many step times are within 1.5x.
struct Agreement {
  int cases = 0, matched = 0, within = 0, rows = 0, close = 0;
};

// The plans of a published case: one, or one per document pattern it rotates through.
std::vector<Plan> plans_of(const Published& c) {
  std::vector<Plan> plans;
  for (std::size_t i = 0; i < std::max<std::size_t>(c.rotation.size(), 1); ++i) {
    PlanInput in = input_of(c);
    if (!c.rotation.empty()) in.documents = c.rotation[i];
    plans.push_back(make_plan(in));
  }
  return plans;
}

// A row's predicted milliseconds: its mean over the case's plans (-1 when one is invalid).
double predicted_ms(const std::vector<Plan>& plans, const std::string& name) {
  double sum = 0;
  for (const Plan& p : plans) {
    const PlanRow& r = row_of(p, name);
    if (!r.valid) return -1;
    sum += r.predicted_step_s * 1e3;
  }
  return sum / double(plans.size());
}

Agreement agreement_of(const std::vector<Published>& all) {
  int cases = 0, matched = 0, within = 0, rows = 0, close = 0;
  for (const Published& c : all) {
    const std::vector<Plan> plans = plans_of(c);
    const Measured* fastest_measured = nullptr;
    const Measured* fastest_predicted = nullptr;
    for (const Measured& m : c.rows) {
      EXPECT_NEAR(predicted_ms(plans, m.row), m.predicted_ms, 0.002 * m.predicted_ms) << c.source << " " << m.row;
      const double ratio = 1e3 / m.iter_per_s / m.predicted_ms;  // published / predicted
      ++rows;
      close += ratio < 1.5 && ratio > 1 / 1.5;
      if (!fastest_measured || m.iter_per_s > fastest_measured->iter_per_s) fastest_measured = &m;
      if (!fastest_predicted || m.predicted_ms < fastest_predicted->predicted_ms) fastest_predicted = &m;
    }
    if (c.rows.size() < 2) continue;
    ++cases;
    matched += fastest_measured == fastest_predicted;
    within += fastest_predicted->iter_per_s >= 0.95 * fastest_measured->iter_per_s;
  }
  return {cases, matched, within, rows, close};
}

}  // namespace

TEST(PlannerPublished, PredictionsAreTheDocumentedOnes) {
  const auto [cases, matched, within, rows, close] = agreement_of(published());
  // docs/planner.md: the fastest of the measured strategies predicted in 10 of 15 configurations
  // (4 of 4 on the L20's PCIe), one within 5 % of the fastest in 14 of 15; 47 of 57 step times
  // within 1.5x (18 of 20 on the L20).
  EXPECT_EQ(cases, 15);
  EXPECT_EQ(matched, 10);
  EXPECT_EQ(within, 14);
  EXPECT_EQ(rows, 57);
  EXPECT_EQ(close, 47);
}

TEST(PlannerPublished, NotFittedOnArePredictedAsDocumented) {
  const auto [cases, matched, within, rows, close] = agreement_of(not_fitted());
  // docs/planner.md, "Not fitted on": the measured fastest predicted in 13 of 22 configurations
  // (4 of 4 of ring-flash-attention's varlen rows, 4 of 4 of its February 2024 table, 0 of 4 of
  // its rings in long-context-attention's April 2024 figures), within 5 % of it in 15; 43 of 71
  // step times within 1.5x (8 of 8 varlen, 12 of 12 February 2024).
  EXPECT_EQ(cases, 22);
  EXPECT_EQ(matched, 13);
  EXPECT_EQ(within, 15);
  EXPECT_EQ(rows, 71);
  EXPECT_EQ(close, 43);
}

TEST(PlannerPublished, LeftUnreadRowsArePredictedAsDocumented) {
  const auto [cases, matched, within, rows, close] = agreement_of(left_unread());
  // docs/planner.md, "Left unread in a fitted-on table": the measured fastest predicted in 6 of 7
  // configurations, within 5 % of it in 7; 12 of 17 step times within 1.5x.
  EXPECT_EQ(cases, 7);
  EXPECT_EQ(matched, 6);
  EXPECT_EQ(within, 7);
  EXPECT_EQ(rows, 17);
  EXPECT_EQ(close, 12);
}

TEST(PlannerPublished, KernelModelFollowsFlashAttention3Curve) {
  // FlashAttention-3 paper, H100 SXM5 BF16 forward, head dim 128: TFLOP/s at 512 .. 16k tokens.
  const KernelPreset& fa3 = find_kernel_preset("fa3");
  const double lens[] = {512, 1024, 2048, 4096, 8192, 16384};
  const double full[] = {467, 565, 625, 638, 646, 648}, causal[] = {292, 423, 521, 579, 602, 616};
  for (int i = 0; i < 6; ++i) {
    const double rate = 989 * fa3.efficiency;
    EXPECT_NEAR(rate * block_efficiency(fa3.kernel, 128, lens[i], lens[i], false) / full[i], 1.0, 0.06) << lens[i];
    EXPECT_NEAR(rate * block_efficiency(fa3.kernel, 128, lens[i], lens[i], true) / causal[i], 1.0, 0.10) << lens[i];
  }
  // Head dim 64 and 256 at 16k: 497 and 756.
  EXPECT_NEAR(989 * fa3.efficiency * block_efficiency(fa3.kernel, 64, 16384, 16384, false) / 497, 1.0, 0.03);
  EXPECT_NEAR(989 * fa3.efficiency * block_efficiency(fa3.kernel, 256, 16384, 16384, false) / 756, 1.0, 0.03);
}

TEST(PlannerPublished, FlatModelIsTheOldOne) {
  // Nothing set: the old planner's numbers (peak × efficiency, backward 2.5×).
  KernelModel flat;
  const KernelSeconds t = kernel_seconds(flat, {8, 512, 256, 32, 8, 0.125, true}, 128, 2, 1.0);
  EXPECT_DOUBLE_EQ(t.fwd, 1.0);
  EXPECT_DOUBLE_EQ(t.bwd, 2.5);
}

TEST(PlannerPublished, ShortBlocksAndMergesCost) {
  const KernelModel m = find_kernel_preset("fa2").kernel;
  EXPECT_LT(block_efficiency(m, 128, 1024, 1024, true), block_efficiency(m, 128, 8192, 8192, true));
  EXPECT_LT(block_efficiency(m, 64, 8192, 8192, false), block_efficiency(m, 128, 8192, 8192, false));
  KernelModel mem = m;
  mem.memory_bandwidth = 2e12;
  // Decode: one query row against 128k keys reads the cache: memory-bound, not FLOP-bound.
  const KernelSeconds d = kernel_seconds(mem, {1, 1, 131072, 32, 8, 1, false}, 128, 2, 1e-9);
  EXPECT_NEAR(d.fwd, 50e-6 + (2.0 * 32 + 2.0 * 131072 * 8) * 128 * 2 / 2e12, 1e-9);
}

TEST(PlannerPublished, CalibrationFitsTheFixedCostPerCall) {
  // Times made by the model itself (20 us per call, kv_half 300, 10 GFLOP/s) come back exactly,
  // whatever the shapes; calibrate_kernel's four shapes among them.
  auto seconds = [](double flops, double kv) { return 20e-6 + flops / 10e9 * (1 + 300 / kv); };
  std::vector<KernelTiming> t;
  for (auto [q, kv, h] : {std::tuple{256.0, 128.0, 2.0}, {256.0, 2048.0, 2.0}, {64.0, 64.0, 1.0}, {16.0, 16.0, 1.0}}) {
    const double flops = 4 * q * kv * h * 64;
    t.push_back({seconds(flops, kv), flops, kv});
  }
  const KernelFit f = fit_kernel_times(t);
  EXPECT_NEAR(f.call_s, 20e-6, 1e-9);
  EXPECT_NEAR(f.kv_half, 300, 1e-6);
  // The fixed cost decides a short call, not a long one: the short ring steps' penalty.
  KernelModel m;
  m.call_s = f.call_s;
  EXPECT_GT(kernel_seconds(m, {8, 64, 64, 1, 1, 0, true}, 64, 4, 1e-4).fwd, 2.5e-4);
  EXPECT_LT(kernel_seconds(m, {1, 4096, 4096, 1, 1, 0, false}, 64, 4, 1.0).fwd, 1.0001);
}

TEST(PlannerPublished, HierarchicalWithoutARingPaysItsPairs) {
  // a2a+p2p [cp,1] moves a2a's bytes but runs the ring over one member: at cp 2, zigzag, causal,
  // 4 chunks and 10 calls (4 on the diagonal), each merged, where a2a makes one call. Flat: equal.
  PlanInput in{.seq = 8192, .heads = 8, .kv_heads = 8, .head_dim = 64, .cp = 2, .mode = PlanMode::forward};
  in.cluster.ranks_per_node = 2;
  const Plan flat = make_plan(in);
  EXPECT_DOUBLE_EQ(row_of(flat, "a2a+p2p [2,1]").compute_s, row_of(flat, "a2a").compute_s);
  in.cluster.kernel.call_s = 1e-3;
  const Plan p = make_plan(in);
  EXPECT_NEAR(row_of(p, "a2a+p2p [2,1]").compute_s - row_of(p, "a2a").compute_s, 9e-3, 1e-9);
  in.cluster.kernel.memory_bandwidth = 1e14;  // the reads' floor out of the way
  in.cluster.kernel.merge_passes = 1e5;
  // + 10 merges of a 2048-token chunk's float32 output on 4 heads of 64
  const Plan m = make_plan(in);
  EXPECT_NEAR(row_of(m, "a2a+p2p [2,1]").compute_s - row_of(m, "a2a").compute_s,
              9e-3 + 10 * 1e5 * 2048 * 4 * 64 * 4 / 1e14, 1e-9);
}

TEST(PlannerPublished, CalibrationFitRefusesWhatItCannotFit) {
  // Bad input gives the flat model, never a negative or non-finite figure.
  EXPECT_EQ(fit_kernel_times({}).call_s, 0);
  EXPECT_EQ(fit_kernel_times({{1e-3, 1e6, 128}, {2e-3, 2e6, 128}}).kv_half, 0);  // two rows: three unknowns
  const std::vector<KernelTiming> junk = {
      {-1, 1e6, 128}, {NAN, 1e6, 128}, {1e-3, 0, 128}, {1e-3, 1e6, 0}, {INFINITY, 1e6, 128}};
  EXPECT_EQ(fit_kernel_times(junk).call_s, 0);
  // The same shape three times: singular, flat.
  EXPECT_EQ(fit_kernel_times({{1e-3, 1e6, 128}, {1e-3, 1e6, 128}, {1e-3, 1e6, 128}}).kv_half, 0);
  // Short blocks measured faster than long ones: a negative half length, clamped to flat.
  const KernelFit f = fit_kernel_times({{1e-4, 1e6, 128}, {3e-3, 1e7, 2048}, {1e-5, 1e4, 16}});
  EXPECT_GE(f.kv_half, 0);
  EXPECT_GE(f.call_s, 0);
  EXPECT_TRUE(std::isfinite(f.kv_half) && std::isfinite(f.call_s));
}

TEST(PlannerPublished, PresetsAndTheirBadInput) {
  EXPECT_EQ(find_gpu_preset("h100").name, "H100");
  for (const char* name : {"A100", "A800", "H100", "H800", "H20", "H200", "B200", "L20", "L40S"}) {
    const GpuPreset& g = find_gpu_preset(name);
    EXPECT_GT(g.bf16_flops, 1e14) << name;
    EXPECT_FALSE(g.source.empty()) << name;
    EXPECT_NO_THROW(find_fabric_preset(g.intra)) << name;
  }
  EXPECT_EQ(error_of([] { find_gpu_preset("X100"); }),
            "unknown GPU 'X100' (known: A100, A800, H100, H800, H20, H200, B200, L20, L40S)");
  // A800 is A100 with its NVLink cut to 400 GB/s both ways, as H800 is H100.
  EXPECT_EQ(find_gpu_preset("A800").bf16_flops, find_gpu_preset("A100").bf16_flops);
  EXPECT_EQ(find_fabric_preset(find_gpu_preset("A800").intra).link.bandwidth,
            find_fabric_preset(find_gpu_preset("H800").intra).link.bandwidth);
  EXPECT_EQ(find_gpu_preset("H20").bf16_flops, 148e12);
  EXPECT_NE(error_of([] { find_fabric_preset("nvlink9"); }).find("known: nvlink3, nvlink3-a800, nvlink4"),
            std::string::npos);
  EXPECT_NE(error_of([] { find_kernel_preset("fa9"); }).find("known: fa3, fa2"), std::string::npos);
  EXPECT_EQ(error_of([] { parse_plan_mode("infer"); }),
            "unknown mode 'infer' (use one of train, forward, prefill, decode)");
}

TEST(PlannerPublished, SharedPcieSwitchSlowsTheWideAllToAll) {
  Cluster c;
  apply_intra_fabric(c, find_fabric_preset("pcie4"));
  // Two ranks on one switch: point to point; four in a socket: through its root complex; eight
  // over the node: across the sockets. Each peer pays one latency; bytes are per rank.
  EXPECT_NEAR(all_to_all_seconds(c, 2, 1e8), 5e-6 + 1e8 / 25.6e9, 1e-12);
  EXPECT_NEAR(all_to_all_seconds(c, 4, 3e8), 3 * 5e-6 + 3e8 / 4.5e9, 1e-12);
  EXPECT_NEAR(all_to_all_seconds(c, 8, 7e8), 7 * 5e-6 + 7e8 / 1.5e9, 1e-12);
  // A ring inside a socket moves at the link's rate, one spanning both sockets at the hop between.
  EXPECT_EQ(ring_link(c, 4, 1).bandwidth, 25.6e9);
  EXPECT_EQ(ring_link(c, 8, 1).bandwidth, 7e9);
  EXPECT_EQ(ring_link(c, 4, 2).bandwidth, 7e9);
  EXPECT_EQ(ring_link(c, 2, 8).bandwidth, c.inter.bandwidth);  // leaves the node: the NIC's
  // NVLink has no tiers: every all-to-all at the link's rate.
  Cluster nv;
  apply_intra_fabric(nv, find_fabric_preset("nvlink4"));
  EXPECT_EQ(alltoall_link(nv, 8).bandwidth, 450e9);
  EXPECT_EQ(ring_link(nv, 8, 1).bandwidth, 450e9);
}

TEST(PlannerPublished, ModesPriceWhatTheyRun) {
  PlanInput in = input_of(published().front());
  in.mode = PlanMode::train;
  const Plan train = make_plan(in);
  in.mode = PlanMode::forward;
  const Plan fwd = make_plan(in);
  in.mode = PlanMode::prefill;
  const Plan prefill = make_plan(in);
  for (std::size_t i = 0; i < fwd.rows.size(); ++i) {
    if (!fwd.rows[i].valid) continue;
    EXPECT_EQ(fwd.rows[i].backward_bytes_per_rank, 0) << fwd.rows[i].name;
    EXPECT_LT(fwd.rows[i].predicted_step_s, train.rows[i].predicted_step_s / 3) << fwd.rows[i].name;
    EXPECT_DOUBLE_EQ(prefill.rows[i].predicted_step_s, fwd.rows[i].predicted_step_s);
  }
  // Decode: one token per sequence; a layout that cannot shard one token is invalid, with why.
  in.mode = PlanMode::decode;
  in.batch = 16;
  const Plan decode = make_plan(in);
  int invalid = 0;
  for (const PlanRow& r : decode.rows) {
    if (!r.valid) {
      ++invalid;
      EXPECT_FALSE(r.reason.empty()) << r.name;
      continue;
    }
    EXPECT_TRUE(std::isfinite(r.predicted_step_s) && r.predicted_step_s > 0) << r.name;
  }
  EXPECT_GT(invalid, 0);
}

TEST(PlannerPublished, RecommendationSaysWhatDecides) {
  PlanInput in = input_of(published()[10]);  // 128k, 32 heads: Ulysses and the ring differ by the ring's steps
  in.cp = 8;
  const Plan p = make_plan(in);
  EXPECT_NE(p.recommendation.find("the model's error"), std::string::npos) << p.recommendation;
  in.heads = in.kv_heads = 2;
  in.seq = 8192;
  const Plan q = make_plan(in);
  EXPECT_NE(q.recommendation.find("decided by"), std::string::npos) << q.recommendation;
}

TEST(PlannerPublished, EveryFigureFiniteOnEveryPresetAndMode) {
  for (const GpuPreset& g : gpu_presets())
    for (PlanMode mode : {PlanMode::train, PlanMode::forward, PlanMode::prefill, PlanMode::decode})
      for (auto [seq, cp, d, causal] : {std::tuple{1, 1, 1, true}, {7, 3, 64, false}, {65536, 64, 256, true}}) {
        PlanInput in;
        in.seq = seq;
        in.heads = in.kv_heads = 8;
        in.head_dim = d;
        in.cp = cp;
        in.causal = causal;
        in.mode = mode;
        apply_gpu(in.cluster, g, find_kernel_preset(g.kernel), DType::bf16);
        apply_intra_fabric(in.cluster, find_fabric_preset(g.intra));
        for (const PlanRow& r : make_plan(in).rows)
          if (r.valid)
            EXPECT_TRUE(std::isfinite(r.predicted_step_s) && r.predicted_step_s >= 0 && std::isfinite(r.compute_s))
                << g.name << " " << r.name << " seq " << seq;
      }
}

TEST(PlannerPublished, EveryCallPacksTheKvItIsHanded) {
  // 2 calls, each handed 1000 keys on 2 KV heads of 64 (float32): 2 x 2 x 1000 x 2 x 64 x 4 bytes
  // packed forward, 1.5x that backward (K twice, V once).
  KernelModel m;
  m.kv_pack_s_per_byte = 1e-10;
  const double bytes = 2.0 * 2 * 1000 * 2 * 64 * 4;
  const KernelSeconds t = kernel_seconds(m, {2, 100, 1000, 4, 2, 0, false}, 64, 4, 1.0);
  EXPECT_NEAR(t.fwd, 1.0 + 1e-10 * bytes, 1e-15);
  EXPECT_NEAR(t.bwd, 2.5 + 1.5e-10 * bytes, 1e-15);
  // kv_read, when given, is what a call packs (a zigzag step's two chunks).
  EXPECT_NEAR(kernel_seconds(m, {2, 100, 500, 4, 2, 0, false, 1000}, 64, 4, 1.0).fwd, 1.0 + 1e-10 * bytes, 1e-15);
  // At cp 2, causal, zigzag: a2a packs its h_kv / 2 heads of all s tokens once; all_gather every
  // head of all s tokens in each of its two calls (one per zigzag chunk): 4x a2a's bytes.
  PlanInput in{.seq = 8192, .heads = 8, .kv_heads = 4, .head_dim = 64, .cp = 2, .mode = PlanMode::forward};
  in.dtype = DType::f32;
  in.cluster.ranks_per_node = 2;
  const Plan flat = make_plan(in);
  in.cluster.kernel.kv_pack_s_per_byte = 1e-10;
  const Plan packed = make_plan(in);
  const double a2a_bytes = 2.0 * 8192 * 2 * 64 * 4;
  for (auto [name, b] : {std::pair{"a2a", a2a_bytes}, {"all_gather", 4 * a2a_bytes}})
    EXPECT_NEAR(row_of(packed, name).compute_s - row_of(flat, name).compute_s, 1e-10 * b, 1e-12) << name;
}

TEST(PlannerPublished, AKvStreamPastTheCacheRunsSlower) {
  // d 64, float32: a key's K and V of one head are 512 bytes; a 1 MiB cache holds 2048 keys.
  KernelModel m;
  m.cache_bytes = 1024 * 1024;
  m.past_cache_extra = 0.5;
  EXPECT_EQ(block_cache_factor(m, 64, 4, 2048, false), 1.0);  // fits exactly
  EXPECT_EQ(block_cache_factor(m, 64, 4, 1000, true), 1.0);
  // 8192 keys: 3/4 of a full block's stream is past the cache; a causal diagonal's query at p
  // streams p keys, averaged over its work: (3/4)^2.
  EXPECT_DOUBLE_EQ(block_cache_factor(m, 64, 4, 8192, false), 1 + 0.5 * 0.75);
  EXPECT_DOUBLE_EQ(block_cache_factor(m, 64, 4, 8192, true), 1 + 0.5 * 0.5625);
  // bf16 halves the bytes: 4096 keys fit.
  EXPECT_EQ(block_cache_factor(m, 64, 2, 4096, false), 1.0);
  EXPECT_DOUBLE_EQ(block_cache_factor(m, 64, 2, 8192, false), 1.25);
  // In kernel_seconds: the work (not the pack or the per-call cost) scales, forward and backward.
  const KernelSeconds t = kernel_seconds(m, {1, 512, 8192, 1, 1, 0.5, false}, 64, 4, 1.0);
  EXPECT_DOUBLE_EQ(t.fwd, 0.5 * 1.375 + 0.5 * 1.28125);
  EXPECT_DOUBLE_EQ(t.bwd, 2.5 * t.fwd);
  // Off on the GPU presets and for bad values: the flat model.
  EXPECT_EQ(find_kernel_preset("fa3").kernel.cache_bytes, 0);
  for (auto [c, e] : {std::pair{0.0, 0.5},
                      {1e6, 0.0},
                      {-1e6, 0.5},
                      {1e6, -0.5},
                      {std::nan(""), 0.5},
                      {1e6, std::numeric_limits<double>::infinity()}}) {
    KernelModel b;
    b.cache_bytes = c, b.past_cache_extra = e;
    EXPECT_EQ(block_cache_factor(b, 64, 4, 1e6, false), 1.0) << c << " " << e;
  }
}

TEST(PlannerPublished, TheCacheTermIsFittedFromTwoCalls) {
  // Flat curve; 2 MiB cache, d 64 float32 (4096 keys fit). 2048 keys at 1 ns per FLOP, 32768
  // keys (7/8 of the stream past) at 1.35 ns: extra = 0.35 / (7/8) = 0.4.
  const KernelModel flat;
  const double cache = 2.0 * 1024 * 1024;
  const KernelTiming fits{1e-9 * 1e6, 1e6, 2048}, past{1.35e-9 * 4e6, 4e6, 32768};
  const CacheFit f = fit_cache_term(flat, 64, 4, cache, fits, past);
  EXPECT_EQ(f.cache_bytes, cache);
  EXPECT_NEAR(f.past_cache_extra, 0.4, 1e-12);
  // With a kernel curve its efficiency is divided out: kv_half 2048 makes the short call run at
  // half the rate, so the same times say the long call is slower than the curve alone predicts.
  KernelModel curve;
  curve.kv_half = 2048;
  const double e_fits = 0.5, e_past = 32768.0 / (32768 + 2048);
  EXPECT_NEAR(fit_cache_term(curve, 64, 4, cache, fits, past).past_cache_extra, (1.35 * e_past / e_fits - 1) / 0.875,
              1e-12);
  // Bad input gives the flat model: a faster long call, non-finite or negative times, a `fits`
  // that does not fit, a `past` that is not past, no cache.
  const KernelTiming faster{0.9e-9 * 4e6, 4e6, 32768}, nan{std::nan(""), 4e6, 32768}, neg{-1, 4e6, 32768};
  for (const CacheFit& b :
       {fit_cache_term(flat, 64, 4, cache, fits, faster), fit_cache_term(flat, 64, 4, cache, fits, nan),
        fit_cache_term(flat, 64, 4, cache, neg, past), fit_cache_term(flat, 64, 4, cache, past, past),
        fit_cache_term(flat, 64, 4, cache, fits, fits), fit_cache_term(flat, 64, 4, 0, fits, past),
        fit_cache_term(flat, 64, 4, std::numeric_limits<double>::infinity(), fits, past)}) {
    EXPECT_EQ(b.cache_bytes, 0);
    EXPECT_EQ(b.past_cache_extra, 0);
  }
  // At most 4x the in-cache time.
  EXPECT_EQ(fit_cache_term(flat, 64, 4, cache, fits, {100e-9 * 4e6, 4e6, 32768}).past_cache_extra, 4.0);
}

TEST(PlannerPublished, AWorkingSetPastTheCacheStreamsAtItsRate) {
  // 4 MiB stay near the core; 0.1 ns per byte past it.
  KernelModel m;
  m.stream_s_per_byte = 1e-10;
  m.stream_cache_bytes = 4.0 * 1024 * 1024;
  EXPECT_EQ(stream_seconds(m, 4.0 * 1024 * 1024), 0.0);  // fits exactly
  EXPECT_EQ(stream_seconds(m, 1000), 0.0);
  EXPECT_DOUBLE_EQ(stream_seconds(m, 16.0 * 1024 * 1024), 1e-10 * 12 * 1024 * 1024);
  // A call of 512 queries against 512 keys on 16 heads of 128, float32: q, out, K and V are
  // 4 x 512 x 16 x 128 x 4 = 16 MiB, 12 MiB past; 3 such calls add 3 x 1.2582912 ms to the
  // forward's work, and the backward backward_ratio times it.
  const double past = 1e-10 * 12 * 1024 * 1024;
  const KernelSeconds t = kernel_seconds(m, {3, 512, 512, 16, 16, 0, false}, 128, 4, 1.0);
  EXPECT_DOUBLE_EQ(t.fwd, 1.0 + 3 * past);
  EXPECT_DOUBLE_EQ(t.bwd, 2.5 * (1.0 + 3 * past));
  // bf16 halves the bytes: 8 MiB, 4 past.
  EXPECT_DOUBLE_EQ(kernel_seconds(m, {1, 512, 512, 16, 16, 0, false}, 128, 2, 1.0).fwd, 1.0 + 1e-10 * 4 * 1024 * 1024);
  // Off on the GPU presets and for bad values: nothing added, finite.
  EXPECT_EQ(find_kernel_preset("fa3").kernel.stream_s_per_byte, 0);
  for (auto [r, c] : {std::pair{0.0, 1e6},
                      {-1e-10, 1e6},
                      {std::nan(""), 1e6},
                      {std::numeric_limits<double>::infinity(), 1e6},
                      {1e-10, std::nan("")},
                      {1e-10, std::numeric_limits<double>::infinity()}}) {
    KernelModel b;
    b.stream_s_per_byte = r, b.stream_cache_bytes = c;
    EXPECT_EQ(stream_seconds(b, 1e9), 0.0) << r << " " << c;
  }
  // A negative cache counts as none: every byte streams.
  KernelModel none = m;
  none.stream_cache_bytes = -1;
  EXPECT_NEAR(stream_seconds(none, 1e6), 1e-4, 1e-15);
  // Only ever slower than the flat model (efficiency <= 1), and finite, for any positive shape.
  for (double len : {1.0, 64.0, 512.0, 1e5, 1e9})
    for (double heads : {1.0, 16.0, 1e4}) {
      const KernelSeconds k = kernel_seconds(m, {7, len, len, heads, heads, 0.5, true}, 128, 4, 1.0);
      EXPECT_TRUE(std::isfinite(k.fwd) && k.fwd >= 1.0 && std::isfinite(k.bwd)) << len << " " << heads;
    }
}

TEST(PlannerPublished, TheStreamTermIsFittedFromThreeHeadCounts) {
  // 1 MiB a head; 2 heads at 1 ms. 8 and 32 heads on excess = 1e-10 x (bytes - 3 MiB): 5 MiB and
  // 29 MiB past the cache.
  const double mib = 1024.0 * 1024, r = 1e-10, c = 3 * mib;
  const double t8 = 4e-3 + r * (8 * mib - c), t32 = 16e-3 + r * (32 * mib - c);
  const StreamFit f = fit_stream_term(mib, 2, 1e-3, 8, t8, 32, t32);
  EXPECT_NEAR(f.s_per_byte, r, 1e-22);
  EXPECT_NEAR(f.cache_bytes, c, 1e-3);
  // The reference is assumed to fit: a line whose cache falls below its 2 MiB is held there, the
  // rate through the 32-head point.
  const double low = 1 * mib, l8 = 4e-3 + r * (8 * mib - low), l32 = 16e-3 + r * (32 * mib - low);
  const StreamFit held = fit_stream_term(mib, 2, 1e-3, 8, l8, 32, l32);
  EXPECT_EQ(held.cache_bytes, 2 * mib);
  EXPECT_NEAR(held.s_per_byte, (l32 - 16e-3) / (30 * mib), 1e-22);
  // No growth, less growth at 32 heads, heads not increasing, bad times: off.
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (const StreamFit& b :
       {fit_stream_term(mib, 2, 1e-3, 8, 4e-3, 32, 16e-3), fit_stream_term(mib, 2, 1e-3, 8, t8, 32, 16e-3),
        fit_stream_term(mib, 8, 4e-3, 2, 1e-3, 32, t32), fit_stream_term(mib, 2, 1e-3, 8, nan, 32, t32),
        fit_stream_term(mib, 2, 1e-3, 8, t8, 32, inf), fit_stream_term(0, 2, 1e-3, 8, t8, 32, t32),
        fit_stream_term(mib, 2, -1e-3, 8, t8, 32, t32)}) {
    EXPECT_EQ(b.s_per_byte, 0);
    EXPECT_EQ(b.cache_bytes, 0);
  }
}

// The rate calibrate() measures on its 2048-token causal block (2 heads) holds that block's
// stream: the model's peak has it taken out, and predicts the measured rate back.
TEST(Calibrate, TheRatesOwnStreamIsTakenOut) {
  KernelModel k;
  k.stream_s_per_byte = 1e-10;
  k.stream_cache_bytes = 1024 * 1024;
  // d 128 float32: 4 x 2048 x 2 x 128 x 4 = 8 MiB, 7 MiB past: 0.734 ms of the block's
  // 2^31 FLOPs at 1e11 FLOP/s (21.5 ms).
  const double flops = attention_forward_flops(1, 2048, 2048, 2, 128, true), t = flops / 1e11;
  const double stream = 1e-10 * 7 * 1024 * 1024;
  EXPECT_NEAR(kernel_peak_of_rate(k, 1e11, 128, 4), flops / (t - stream), 1e-3);
  EXPECT_NEAR(rate_of_kernel_peak(k, kernel_peak_of_rate(k, 1e11, 128, 4), 128, 4), 1e11, 1e-3);
  Cluster c;
  c.peak_flops = 1e11;
  apply_calibrated_kernel(c, k, 128, 4);
  EXPECT_NEAR(c.peak_flops, flops / (t - stream), 1e-3);
  // Without the term the peak is the rate (a flat curve); a stream past half the block's time is
  // held at half: finite.
  EXPECT_EQ(kernel_peak_of_rate(KernelModel{}, 1e11, 128, 4), 1e11);
  k.stream_s_per_byte = 1;
  EXPECT_NEAR(kernel_peak_of_rate(k, 1e11, 128, 4), 2e11, 1e-3);
  EXPECT_TRUE(std::isfinite(rate_of_kernel_peak(k, 1e11, 128, 4)));
}

TEST(PlannerPublished, CacheSizesParseAsSysfsWritesThem) {
  EXPECT_EQ(parse_cache_size("2048K", 1), 2048.0 * 1024);
  EXPECT_EQ(parse_cache_size("32M", 1), 32.0 * 1024 * 1024);
  EXPECT_EQ(parse_cache_size("512", 1), 512.0);
  for (const char* bad : {"", "K", "-1K", "0", "2048Q", "nan", "inf", "abc"})
    EXPECT_EQ(parse_cache_size(bad, 7.0), 7.0) << bad;
}

// The forward and the backward are timed apart: a clock that makes every forward 1 s and every
// backward 2.2 s gives the forward's FLOPs over 1 s and a ratio of 2.2, where one rate over
// 3.5 forwards' FLOPs would price a forward at 3.2 / 3.5 of its seconds.
TEST(Calibrate, TheForwardsRateAndTheBackwardsRatioAreMeasuredApart) {
  int calls = 0;
  const auto clock = [&] {
    const int n = calls++;
    const double step[3] = {0, 1, 3.2};  // before the forward, after it, after the backward
    return 10.0 * (n / 3) + step[n % 3];
  };
  const AttentionRates r = attention_rates(8, DType::f32, clock);
  EXPECT_DOUBLE_EQ(r.forward, attention_forward_flops(1, 2048, 2048, 2, 8, true));
  EXPECT_NEAR(r.backward_ratio, 2.2, 1e-12);
  EXPECT_THROW(attention_rates(0, DType::f32, clock), Error);
  EXPECT_THROW(attention_rates(8, DType::f32, {}), Error);
}

// The calibrated kernel installs its fits but keeps the backward ratio calibrate() measured.
TEST(Calibrate, TheKernelFitKeepsTheMeasuredBackwardRatio) {
  Cluster c;
  c.peak_flops = 1e11;
  c.kernel.backward_ratio = 2.2;
  KernelModel k;
  k.call_s = 5e-6;
  apply_calibrated_kernel(c, k, 64);
  EXPECT_EQ(c.kernel.backward_ratio, 2.2);
  EXPECT_EQ(c.kernel.call_s, 5e-6);
}

namespace {

// The ring's calls as forward_pairs makes them, counted from the layout: the busiest member's
// (query chunk, key chunk) pairs with a visible key, over every member's key chunks, and the
// diagonal ones (a chunk against itself). `inner` ranks' chunks make one member.
RingPairs counted_ring_pairs(int cp, int inner, bool zigzag, bool causal) {
  const CpConfig cfg{"p2p", {}, causal, std::nullopt, zigzag};
  const AttentionParams params = attention_params(cfg);
  const std::int64_t s = 64 * cp;
  std::vector<SeqChunk> all;
  for (int r = 0; r < cp; ++r)
    for (const SeqChunk& c : rank_chunks(cfg, cp, r, s)) all.push_back(c);
  RingPairs busiest;
  for (int first = 0; first < cp; first += inner) {
    RingPairs m;
    for (int r = first; r < first + inner; ++r)
      for (const SeqChunk& q : rank_chunks(cfg, cp, r, s))
        for (const SeqChunk& k : all)
          if (visible_pairs(params, q, k) > 0) m.pairs += 1, m.diagonal += causal && q.begin == k.begin ? 1 : 0;
    if (m.pairs > busiest.pairs) busiest = m;
  }
  return busiest;
}

}  // namespace

TEST(PlannerPublished, RingPairsAreTheCallsTheRingMakes) {
  // cp 2, zigzag: chunks {0, 3} and {1, 2} of 4; causal, 0:0 3:0 3:3 at the first step, 3:1 3:2
  // at the second: 5 calls, 2 of them diagonal; 2 x 4 without a mask, were the chunks zigzagged
  // (a full mask keeps contiguous chunks: a call per step).
  EXPECT_EQ(ring_visible_pairs(2, 2, true, true).pairs, 5);
  EXPECT_EQ(ring_visible_pairs(2, 2, true, true).diagonal, 2);
  EXPECT_EQ(ring_visible_pairs(2, 2, true, false).pairs, 8);
  EXPECT_EQ(ring_visible_pairs(2, 2, true, false).diagonal, 0);
  EXPECT_EQ(ring_visible_pairs(2, 1, false, true).pairs, 2);  // the last rank: its diagonal and rank 0's chunk
  // Every cp and grouping against the layout itself (a2a+p2p's member holds `inner` ranks' chunks).
  for (int cp : {2, 3, 4, 6, 8})
    for (int inner : {1, 2})
      for (bool zigzag : {true, false})
        for (bool causal : {true, false}) {
          if (cp % inner != 0) continue;
          const RingPairs want = counted_ring_pairs(cp, inner, zigzag, causal);
          const bool zz = zigzag && causal;  // the layout's: zigzag only under a causal mask
          const RingPairs got = ring_visible_pairs(cp / inner, inner * (zz ? 2 : 1), zz, causal);
          EXPECT_EQ(got.pairs, want.pairs) << cp << " " << inner << " " << zigzag << " " << causal;
          EXPECT_EQ(got.diagonal, want.diagonal) << cp << " " << inner << " " << zigzag << " " << causal;
        }
  // Bad input: no members, no chunks, an odd zigzag count.
  for (auto [m, c, z] : {std::tuple{0, 2, true}, {2, 0, false}, {-1, 2, true}, {2, 3, true}})
    EXPECT_EQ(ring_visible_pairs(m, c, z, true).pairs, 0) << m << " " << c << " " << z;
}

TEST(PlannerPublished, ThisLibrarysRingPaysEveryPairsCall) {
  // cp 2, causal, zigzag, 8192 tokens on 8 heads (4 KV) of 64, float32, a forward: the ring's 5
  // calls of 2048 x 2048 against 2 calls of 4096 queries; each call's fixed cost, its pack of
  // its key chunk and its merge of its query chunk.
  PlanInput in{.seq = 8192, .heads = 8, .kv_heads = 4, .head_dim = 64, .cp = 2, .mode = PlanMode::forward};
  in.dtype = DType::f32;
  in.cluster.ranks_per_node = 2;
  in.cluster.peak_flops = 1e9;  // the work far above the memory floor of every call
  in.cluster.kernel.call_s = 1e-3;
  in.cluster.kernel.kv_pack_s_per_byte = 1e-10;
  in.cluster.kernel.merge_passes = 4;
  in.cluster.kernel.memory_bandwidth = 1e10;
  const Plan steps = make_plan(in);
  in.cluster.kernel.ring_pair_calls = true;
  const Plan pairs = make_plan(in);
  const double pack = 1e-10 * 2 * 4 * 64 * 4, merge = 4.0 * 8 * 64 * 4 / 1e10;  // per key, per query token
  const double want = (5 - 2) * 1e-3 + (5 * 2048 - 2 * 4096) * pack + (5 * 2048 - 2 * 4096) * merge;
  for (const char* name : {"p2p", "a2a+p2p [1,2]"})
    EXPECT_NEAR(row_of(pairs, name).compute_s - row_of(steps, name).compute_s, want, 1e-9) << name;
  // Rows without a ring, and the ring over contiguous chunks (its busiest rank's 2 calls are the
  // steps), are unchanged.
  for (const char* name : {"a2a", "all_gather", "p2p --no-zigzag", "a2a+p2p [2,1]"})
    EXPECT_NEAR(row_of(pairs, name).compute_s, row_of(steps, name).compute_s, 1e-12 * row_of(steps, name).compute_s)
        << name;
  // The GPU presets keep one call per step.
  EXPECT_FALSE(find_kernel_preset("fa3").kernel.ring_pair_calls);
}

TEST(PlannerPublished, TheCausalDiagonalsExtraIsFittedFromTwoCalls) {
  // 512 x 512: 1 ms of pack, 2 ns a pair on the full block; the diagonal's half at 512 / 597 of
  // the rate: causal_half 85.
  const double pack = 1e-3, full = pack + 2e-9 * 512 * 512, diag = pack + 2e-9 * 512 * 513 / 2 * 597 / 512;
  EXPECT_NEAR(fit_causal_half(512, full, diag, pack), 85, 1e-9);
  EXPECT_NEAR(fit_causal_half(512, full - pack, diag - pack, 0), 85, 1e-9);
  // Bad input, or a diagonal no slower than the full block: no extra.
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  for (auto [l, f, d, p] : {std::tuple{0.0, full, diag, pack},
                            {512.0, -full, diag, pack},
                            {512.0, full, nan, pack},
                            {512.0, full, diag, inf},
                            {512.0, full, diag, -1.0},
                            {512.0, full, diag, 2 * full},
                            {512.0, full, pack + 1.9e-9 * 512 * 513 / 2, pack}})
    EXPECT_EQ(fit_causal_half(l, f, d, p), 0) << l << " " << f << " " << d << " " << p;
  // At most 8192.
  EXPECT_EQ(fit_causal_half(512, full, pack + 1.0, pack), 8192);
}
