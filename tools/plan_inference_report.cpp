// `ulysses plan --mode decode` and `--mode prefill --cached P`: the inference tables
// (ulysses/plan/plan_inference.hpp) beside the strategies' table.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plan_command.hpp"
#include "ulysses/plan/plan_inference.hpp"

namespace ulysses::cli {

namespace {

// The time to first token of each prefill path (PrefillRow), printed and as JSON.
nlohmann::json report_prefill(const PlanInput& in, const DecodeModel& row, const DecodePlan& p) {
  fmt::print(
      "\ntime to first token: a prompt of {} tokens; the prompt's rows {:.3g} us a token a rank, the attention's "
      "forward at {:.4g} GFLOP/s\n",
      in.seq, prefill_token_seconds(in, row) * 1e6,
      (row.prefill_flops > 0 ? row.prefill_flops : in.cluster.peak_flops * in.cluster.efficiency) / 1e9);
  fmt::print("{:<10} {:>4} {:>14} {:>10} {:>10}\n", "prefill", "cp", "attention s", "rows s", "TTFT s");
  nlohmann::json rows = nlohmann::json::array();
  for (const PrefillRow& r : p.prefill) {
    rows.push_back({{"prefill", r.prefill},
                    {"cp", r.cp},
                    {"valid", r.valid},
                    {"reason", r.reason},
                    {"attention_s", r.attention_s},
                    {"rows_s", r.rows_s},
                    {"ttft_s", r.ttft_s}});
    if (r.valid)
      fmt::print("{:<10} {:>4} {:>14.4g} {:>10.4g} {:>10.4g}\n", r.prefill, r.cp, r.attention_s, r.rows_s, r.ttft_s);
    else
      fmt::print("{:<10} {:>4} invalid: {}\n", r.prefill, r.cp, r.reason);
  }
  return rows;
}

}  // namespace

nlohmann::json report_decode(const PlanInput& in, const DecodeModel& row) {
  const DecodePlan p = plan_decode(in, row);
  fmt::print(
      "\ndecode over a sharded KV cache: {} request(s) per step, {} tokens of context each, memory {:.4g} GB/s\n",
      in.batch, in.seq, in.cluster.kernel.memory_bandwidth / 1e9);
  if (row.width > 0)
    fmt::print(
        "the row around the attention (every rank, every step): width {}, hidden {}, vocab {}: {:.4g} MFLOP a "
        "token at {:.4g} GFLOP/s, {:.4g} MB of weights\n",
        row.width, row.hidden, row.vocab, row_flops(in, row) / 1e6,
        (row.flops_per_s > 0 ? row.flops_per_s : in.cluster.peak_flops * in.cluster.efficiency) / 1e9,
        row_weights(in, row) * double(dtype_size(in.dtype)) / 1e6);
  fmt::print("{:<13} {:>4} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>12} {:>12} {:>12} {:>12}\n", "layout",
             "cp", "KV MB/rank", "read ms", "compute ms", "comm ms", "calls ms", "row ms", "colls", "ms/token",
             "tokens/s", "x cp=1", "crossover");
  const double base = p.rows.front().valid ? p.rows.front().step_s : 0;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const DecodeRow& r = p.rows[i];
    rows.push_back({{"layout", r.layout},
                    {"cp", r.cp},
                    {"valid", r.valid},
                    {"reason", r.reason},
                    {"replication", r.replication},
                    {"kv_bytes_per_rank", r.kv_bytes},
                    {"read_s", r.read_s},
                    {"compute_s", r.compute_s},
                    {"comm_s", r.comm_s},
                    {"row_s", r.row_s},
                    {"calls_s", r.calls_s},
                    {"collectives", r.collectives},
                    {"step_s", r.step_s},
                    {"tokens_per_s", r.tokens_per_s},
                    {"crossover_batch", r.crossover_batch},
                    {"crossover_context", r.crossover_context}});
    if (!r.valid) {
      fmt::print("{:<13} {:>4} invalid: {}\n", r.layout, r.cp, r.reason);
      continue;
    }
    const std::string cross = r.cp == 1 ? "" : fmt::format("b>={} s>={}", r.crossover_batch, r.crossover_context);
    fmt::print(
        "{:<13} {:>4} {:>12.3f} {:>10.4f} {:>10.4f} {:>10.4f} {:>10.4f} {:>10.4f} {:>6} {:>12.4f} {:>12.4g} {:>12.2f} "
        "{:>12}{}{}\n",
        r.layout, r.cp, r.kv_bytes / 1e6, r.read_s * 1e3, r.compute_s * 1e3, r.comm_s * 1e3, r.calls_s * 1e3,
        r.row_s * 1e3, r.collectives, r.step_s * 1e3, r.tokens_per_s, base > 0 && r.step_s > 0 ? base / r.step_s : 0.0,
        cross, r.replication > 1 ? fmt::format("  (each KV head on {} ranks)", r.replication) : "",
        int(i) == p.best ? "  <- recommended" : "");
  }
  fmt::print("decode recommendation: {}\n", p.recommendation);
  return {{"rows", rows},
          {"prefill", report_prefill(in, row, p)},
          {"best", p.best >= 0 ? p.rows[std::size_t(p.best)].layout : ""},
          {"recommendation", p.recommendation}};
}

nlohmann::json report_turn(const PlanInput& in, std::int64_t cached) {
  const TurnPlan t = plan_turn(in, cached);
  fmt::print("\na turn of {} new tokens over {} cached: pass-KV {:.4g} ms, pass-Q {:.4g} ms (all layers)\n", t.turn,
             t.cached, t.pass_kv_s * 1e3, t.pass_q_s * 1e3);
  fmt::print("turn recommendation: {}\n", t.choice);
  return {{"turn", t.turn},
          {"cached", t.cached},
          {"pass_kv_bytes_per_rank", t.pass_kv_bytes},
          {"pass_q_bytes_per_rank", t.pass_q_bytes},
          {"pass_kv_s", t.pass_kv_s},
          {"pass_q_s", t.pass_q_s},
          {"rule_prefers_pass_q", t.rule_prefers_pass_q},
          {"choice", t.choice}};
}

}  // namespace ulysses::cli
