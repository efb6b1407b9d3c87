// The seed's claims (shared/seeds/, section 3: ring vs Ulysses), measured: the tables of the
// benchmark's seed section (tests/test_trace.cpp checks the same claims against the library).
// Pure functions over the library's rules and formulas; nothing here times anything.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses::seed {

// ---- claim 7: the cp values a model's heads allow ----------------------------------------
struct Model {
  std::string name;
  std::int64_t heads = 0, kv_heads = 0;
};
std::vector<Model> common_models();  // Llama-3-8B 32/8, Llama-3-70B 64/8, Mistral-7B 32/8, Qwen2-7B 28/4
std::vector<int> table_cps();        // the table's columns

struct CpValidity {
  bool seed_rule = false;                        // the seed's rule for a2a: cp <= h and h % cp == 0
  bool seed_kv_rule = false;                     // ...and its GQA rule without KV replication: h_kv % cp == 0
  bool library_a2a = false;                      // validate_cp_config accepts a2a (KV heads replicated when cp > h_kv)
  bool library_even = false;                     // ...and every rank gets exactly h/cp query heads
  std::vector<std::array<int, 2>> hierarchical;  // a2a+p2p [inner, outer], both > 1, the library accepts
};
CpValidity cp_validity(std::int64_t heads, std::int64_t kv_heads, int cp);
// Whether validate_cp_config accepts `config` on cp ranks for these heads (a long sequence).
bool library_accepts(const CpConfig& config, int cp, std::int64_t heads, std::int64_t kv_heads);

// ---- claims 1 and 2: operations, messages and bytes per rank per layer ---------------------
struct Traffic {
  std::int64_t calls = 0, messages = 0, bytes = 0;
  bool operator==(const Traffic&) const = default;
};
// The seed's number of communication operations per layer forward: a2a 2 all-to-alls (Q, K, V
// fused into one), p2p cp − 1 ring steps.
std::int64_t seed_forward_calls(const std::string& strategy, int cp);
// Rank `rank`'s forward (backward) messages and bytes by the library's formula
// (predicted_comm_volume); calls by the strategy's structure (a2a: 2 each way; p2p: cp − 1
// forward, 2·cp − 1 backward: K/V again and dK/dV home).
Traffic formula_traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads, DType dtype,
                        bool backward);
// What the counters hold, without the validation's small all-gathers.
Traffic counted_traffic(const std::map<std::string, CommCounter>& counters);

// The shapes of the bytes plot (Llama-3-70B-like: h = 64, d = 128, s = 128k, bf16), MHA and
// GQA (h_kv = h/8), and the real-run shapes checked against the counters (same heads,
// smaller s and d).
struct PlotShape {
  std::string name;
  Shape q;
  std::int64_t kv_heads = 0;
};
std::vector<PlotShape> plot_shapes();
std::vector<PlotShape> run_shapes();
std::vector<int> run_cps();  // 2, 4, 8: the cps measured against the counters

}  // namespace ulysses::seed
