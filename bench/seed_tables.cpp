// The seed's claims: the tables computed from the library's rules and formulas (seed.hpp).
#include "seed.hpp"

#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses::seed {

std::vector<Model> common_models() {
  return {{"Llama-3-8B", 32, 8}, {"Llama-3-70B", 64, 8}, {"Mistral-7B", 32, 8}, {"Qwen2-7B", 28, 4}};
}

std::vector<int> table_cps() { return {2, 4, 7, 8, 14, 16, 28, 32, 64}; }

bool library_accepts(const CpConfig& config, int cp, std::int64_t heads, std::int64_t kv_heads) {
  try {
    validate_cp_config(config, cp, {1, std::int64_t(1) << 20, heads, 128}, kv_heads);
    return true;
  } catch (const Error&) {
    return false;
  }
}

CpValidity cp_validity(std::int64_t heads, std::int64_t kv_heads, int cp) {
  CpValidity v;
  v.seed_rule = cp <= heads && heads % cp == 0;
  v.seed_kv_rule = v.seed_rule && kv_heads % cp == 0;
  v.library_a2a = library_accepts({"a2a"}, cp, heads, kv_heads);
  v.library_even = v.library_a2a && heads % cp == 0;
  for (int inner = 2; inner < cp; ++inner)
    if (cp % inner == 0 && library_accepts({"a2a+p2p", {inner, cp / inner}}, cp, heads, kv_heads))
      v.hierarchical.push_back({inner, cp / inner});
  return v;
}

std::int64_t seed_forward_calls(const std::string& strategy, int cp) { return strategy == "a2a" ? 2 : cp - 1; }

Traffic formula_traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_heads, DType dtype,
                        bool backward) {
  const CommVolume v = predicted_comm_volume(config, cp, rank, q, kv_heads, dtype);
  const auto& bytes = backward ? v.backward_bytes : v.forward_bytes;
  const auto& messages = backward ? v.backward_messages : v.forward_messages;
  Traffic t;
  for (const auto& [op, n] : bytes) t.bytes += n;
  for (const auto& [op, n] : messages) {
    t.messages += n;
    const Transfer& transfer = v.transfers.at(op);
    t.calls += transfer.calls(n, v.members(transfer, cp));  // a ring step is one isend
  }
  return t;
}

Traffic counted_traffic(const std::map<std::string, CommCounter>& counters) {
  Traffic t;
  for (const auto& [op, c] : counters)
    if (!op.ends_with("validate")) {
      t.calls += c.calls;
      t.messages += c.messages;
      t.bytes += c.bytes_sent;
    }
  return t;
}

std::vector<PlotShape> plot_shapes() {
  return {{"MHA h = h_kv = 64", {1, 131072, 64, 128}, 64}, {"GQA h = 64, h_kv = 8", {1, 131072, 64, 128}, 8}};
}

std::vector<PlotShape> run_shapes() {
  return {{"MHA h = h_kv = 64", {1, 512, 64, 16}, 64}, {"GQA h = 64, h_kv = 8", {1, 512, 64, 16}, 8}};
}

std::vector<int> run_cps() { return {2, 4, 8}; }

}  // namespace ulysses::seed
