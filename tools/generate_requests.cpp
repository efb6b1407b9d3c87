#include "generate_requests.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <vector>

#include "generate_memory.hpp"
#include "rank_errors.hpp"
#include "train/checkpoint.hpp"
#include "train/data.hpp"
#include "train/generate.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::cli {
namespace {

struct Batch {
  train::Checkpoint model;
  std::vector<std::vector<int>> prompts;
  std::vector<std::int64_t> new_tokens;
  std::vector<train::GenerateConfig> configs;
  train::MemoryEstimate memory;  // predicted per rank, admitted
};

// The new tokens of each of `n` requests: --requests-new-tokens (one count for all, or one a
// request), else --max-new-tokens for each.
std::vector<std::int64_t> new_token_counts(const GenerateOptions& o, std::size_t n) {
  if (o.requests_new_tokens.empty()) return std::vector<std::int64_t>(n, o.max_new_tokens);
  std::vector<std::int64_t> counts = parse_lengths(o.requests_new_tokens);
  if (counts.size() == 1) counts.resize(n, counts[0]);
  if (counts.size() != n)
    throw Error(
        fmt::format("--requests-new-tokens gives {} counts for {} requests (give one for all, or one a request)",
                    counts.size(), n));
  return counts;
}

// Collective. Reads, checks and agrees on every request before any data moves. Request i is
// the training task's sequence of its length drawn from --seed + i, sampled from --seed + i: the
// same as `generate --prompt-tokens L --seed S+i` alone.
Batch load_batch(Communicator& comm, const GenerateOptions& o) {
  on_root(comm, [&] {
    check_outputs({{"--json", o.json, true}, {"--trace", o.trace}},
                  {{"--checkpoint", o.checkpoint + "/checkpoint.bin"}});
  });
  Batch b;
  on_every_rank(comm, [&] {
    if (o.turn_tokens != 0) throw Error("--turn-tokens runs a second turn of one request, not with --requests");
    b.model = train::read_checkpoint(o.checkpoint);
    const std::vector<std::int64_t> lengths = parse_lengths(o.requests);
    b.new_tokens = new_token_counts(o, lengths.size());
    const train::TrainConfig& t = b.model.config;
    const std::int64_t positions = t.lengths.empty() ? t.seq : *std::max_element(t.lengths.begin(), t.lengths.end());
    const train::DataSource task = train::DataSource::synthetic();
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::uint64_t seed = o.seed + i;
      const std::int64_t P = lengths[i], N = b.new_tokens[i];
      b.configs.push_back({parse_kv_layout(o.kv_layout), parse_prefill(o.prefill), o.capacity > 0 ? o.capacity : P + N,
                           o.temperature, seed});
      std::string e = P < 64 ? fmt::format("a synthetic sequence has at least 64 tokens, got {}", P)
                             : train::generate_error(t.model, b.configs.back(), comm.size(), P, N, positions);
      if (!e.empty()) throw Error(fmt::format("--requests: request {} of {}: {}", i, lengths.size(), e));
    }
    for (std::size_t i = 0; i < lengths.size(); ++i)
      b.prompts.push_back(task.held_out_batch(1, lengths[i], o.seed + i, 0).tokens);
  });
  std::int64_t longest = 0;
  for (const auto& p : b.prompts) longest = std::max(longest, std::int64_t(p.size()));
  b.memory = admit_generate_memory(comm, b.model.config.model, b.configs, longest, 0, o.max_memory);
  return b;
}

struct Step {
  std::int64_t running = 0, collectives = 0;
  double seconds = 0, comm_s = 0;
};

struct BatchTiming {
  std::vector<std::vector<int>> tokens;
  std::vector<double> ttft_s;  // from the start of the first prefill (they run one after another)
  std::vector<Step> steps;
};

// Collective. Every request prefilled in turn, then steps of every request still running.
BatchTiming run_batch(Communicator& comm, std::vector<std::unique_ptr<train::Generator>>& gens, const Batch& b) {
  BatchTiming t;
  comm.barrier();
  const double t0 = comm.now();
  for (std::size_t i = 0; i < gens.size(); ++i) {
    const double p0 = comm.now();
    show_prefill_progress(comm, *gens[i], std::int64_t(b.prompts[i].size()));
    t.tokens.push_back({gens[i]->next_token(gens[i]->prefill(b.prompts[i]))});
    t.ttft_s.push_back(comm.now() - t0);
    comm.trace(fmt::format("prefill request {}", i), p0, comm.now(), "phase");
  }
  for (;;) {
    std::vector<train::Generator*> running;
    std::vector<int> last;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < gens.size(); ++i)
      if (std::int64_t(t.tokens[i].size()) < b.new_tokens[i]) {
        running.push_back(gens[i].get());
        last.push_back(t.tokens[i].back());
        which.push_back(i);
      }
    if (running.empty()) return t;
    const double s0 = comm.now();
    const std::vector<std::vector<float>> logits = train::Generator::decode(running, last);
    for (std::size_t j = 0; j < which.size(); ++j) t.tokens[which[j]].push_back(running[j]->next_token(logits[j]));
    t.steps.push_back(
        {std::int64_t(running.size()), running[0]->stats().collectives, comm.now() - s0, running[0]->stats().comm_s});
    comm.trace(fmt::format("decode step {} ({} requests)", t.steps.size(), running.size()), s0, comm.now(), "phase");
  }
}

nlohmann::json batch_report(const Communicator& comm, const GenerateOptions& o, const Batch& b, const BatchTiming& t,
                            const std::vector<std::int64_t>& kv_bytes, double peak_rss) {
  nlohmann::json requests = nlohmann::json::array(), steps = nlohmann::json::array(), kv = nlohmann::json::array();
  for (std::size_t i = 0; i < b.prompts.size(); ++i)
    requests.push_back({{"prompt_tokens", b.prompts[i].size()},
                        {"new_tokens", t.tokens[i].size()},
                        {"tokens", t.tokens[i]},
                        {"time_to_first_token_s", t.ttft_s[i]}});
  double decode_s = 0;
  std::int64_t decoded = 0, collectives = 0;
  for (const Step& s : t.steps) {
    steps.push_back({{"requests", s.running},
                     {"seconds", s.seconds},
                     {"tokens_per_s", double(s.running) / s.seconds},
                     {"collectives", s.collectives},
                     {"comm_s", s.comm_s}});
    decode_s += s.seconds;
    decoded += s.running;
    collectives = std::max(collectives, s.collectives);
  }
  const train::GptConfig& m = b.model.config.model;
  for (int rank = 0; rank < comm.size(); ++rank) {
    std::int64_t formula = 0;
    for (const train::GenerateConfig& c : b.configs)
      formula += kv_bytes_formula(c.layout, {m.layers, m.heads, m.kv_heads, m.head_dim, c.capacity}, comm.size(), rank);
    kv.push_back({{"rank", rank}, {"bytes", kv_bytes[std::size_t(rank)]}, {"formula_bytes", formula}});
  }
  return {{"command", "generate"},
          {"cp", comm.size()},
          {"backend", comm.backend()},
          {"kv_layout", o.kv_layout},
          {"prefill", o.prefill},
          {"requests", requests},
          {"steps", steps},
          {"collectives_per_step", collectives},
          {"decode_tokens_per_s", decode_s > 0 ? double(decoded) / decode_s : 0.0},
          {"kv_cache", kv},
          {"memory", memory_report(b.memory, peak_rss)}};
}

// Steps with the same requests running, as one line each: their count and tokens/s.
void print_batch(const nlohmann::json& j) {
  fmt::print("ulysses generate: cp = {} ({}), KV layout {}, prefill {}, {} concurrent requests\n", j["cp"].get<int>(),
             j["backend"].get<std::string>(), j["kv_layout"].get<std::string>(), j["prefill"].get<std::string>(),
             j["requests"].size());
  print_memory(j["memory"]);
  int i = 0;
  for (const auto& r : j["requests"])
    fmt::print("  request {}: prompt {} tokens, {} new, time to first token {:.2f} ms\n", i++,
               r["prompt_tokens"].get<std::int64_t>(), r["new_tokens"].get<std::int64_t>(),
               1e3 * r["time_to_first_token_s"].get<double>());
  const auto& steps = j["steps"];
  for (std::size_t a = 0, e = 0; a < steps.size(); a = e) {
    double s = 0;
    for (e = a; e < steps.size() && steps[e]["requests"] == steps[a]["requests"]; ++e)
      s += steps[e]["seconds"].get<double>();
    fmt::print("  steps {}-{}: {} request(s), {:.0f} tokens/s across them ({:.3f} ms a step, {} collectives)\n", a + 1,
               e, steps[a]["requests"].get<std::int64_t>(), steps[a]["requests"].get<double>() * double(e - a) / s,
               1e3 * s / double(e - a), steps[a]["collectives"].get<std::int64_t>());
  }
  fmt::print("  decode {:.0f} tokens/s across requests\n", j["decode_tokens_per_s"].get<double>());
  for (const auto& k : j["kv_cache"])
    fmt::print("  KV cache rank {}: {} bytes held, formula {} bytes{}\n", k["rank"].get<int>(),
               k["bytes"].get<std::int64_t>(), k["formula_bytes"].get<std::int64_t>(),
               k["bytes"] == k["formula_bytes"] ? " (equal)" : " (DIFFERENT)");
}

}  // namespace

int run_generate_requests(Communicator& comm, const GenerateOptions& o) {
  const Batch b = load_batch(comm, o);
  std::vector<std::unique_ptr<train::Generator>> gens;
  for (const train::GenerateConfig& c : b.configs)
    gens.push_back(std::make_unique<train::Generator>(comm, b.model.config.model, b.model.params, c));
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) tracer.emplace(comm);
  const BatchTiming t = run_batch(comm, gens, b);
  const std::vector<TraceEvent> events = tracer ? tracer->events() : std::vector<TraceEvent>();
  tracer.reset();  // the runs only, not the reports' traffic
  if (!o.trace.empty()) write_chrome_trace(comm, events, o.trace);
  std::int64_t held = 0;
  for (const auto& g : gens) held += g->cache().bytes();
  const std::vector<std::int64_t> kv_bytes = comm.allgather_value(held);
  const double peak_rss = largest_peak_rss(comm);
  on_root(comm, [&] {
    const nlohmann::json report = batch_report(comm, o, b, t, kv_bytes, peak_rss);
    if (o.json != "-") print_batch(report);
    if (!o.json.empty()) write_file_atomic(o.json, report.dump(2) + "\n");
  });
  return 0;
}

}  // namespace ulysses::cli
