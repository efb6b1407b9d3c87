#include "generate_requests.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string>
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
#include "train/serve.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::cli {
namespace {

struct Batch {
  train::Checkpoint model;
  std::vector<train::ServedRequest> requests;
  std::vector<train::GenerateConfig> configs;
  std::vector<std::vector<std::size_t>> held;  // the requests whose caches are held at once (train::held_together)
  train::MemoryEstimate memory;                // predicted per rank, admitted
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

// One number of a --requests-arrive term (`what`: "count" or "step"): a decimal integer, at
// least 1 for a count and 0 for a step.
std::int64_t arrival_number(const std::string& spec, const std::string& text, const std::string& what) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || stop != end)
    throw Error(fmt::format("--requests-arrive '{}': '{}' is not a {} (terms S, or NxS: N requests at decode step S)",
                            spec, text, what));
  if (what == "step" && v < 0)
    throw Error(
        fmt::format("--requests-arrive '{}': step {} is negative (0: at the start; S: after S decode steps)", spec, v));
  if (what == "count" && v < 1)
    throw Error(fmt::format("--requests-arrive '{}': a count of {} requests (NxS needs N >= 1)", spec, v));
  return v;
}

// The decode step each of `n` requests arrives at: --requests-arrive, terms S or NxS (N requests
// at step S), one step a request; all 0 without it.
std::vector<std::int64_t> arrival_steps(const GenerateOptions& o, std::size_t n) {
  if (o.requests_arrive.empty()) return std::vector<std::int64_t>(n, 0);
  const std::string& spec = o.requests_arrive;
  constexpr std::size_t npos = std::string::npos;
  std::vector<std::int64_t> steps;
  for (std::size_t at = 0, comma = 0; comma != npos; at = comma + 1) {
    comma = spec.find(',', at);
    const std::string term = spec.substr(at, comma == npos ? npos : comma - at);
    const std::size_t x = term.find('x');
    const std::int64_t count = x == npos ? 1 : arrival_number(spec, term.substr(0, x), "count");
    const std::int64_t step = arrival_number(spec, x == npos ? term : term.substr(x + 1), "step");
    // Past n + 1 it is too many however many: the count is not allocated.
    steps.resize(steps.size() + std::size_t(std::min<std::int64_t>(count, std::int64_t(n + 1 - steps.size()))), step);
  }
  if (steps.size() != n)
    throw Error(fmt::format("--requests-arrive '{}' gives {} steps for {} requests (give one a request)", spec,
                            steps.size() > n ? "more" : std::to_string(steps.size()), n));
  return steps;
}

// Collective. Reads, checks and agrees on every request before any data moves. Request i is
// the training task's sequence of its length drawn from --seed + i, sampled from --seed + i: the
// same as `generate --prompt-tokens L --seed S+i` alone; it arrives at its --requests-arrive step.
Batch load_batch(Communicator& comm, const GenerateOptions& o) {
  on_root(comm, [&] {
    check_outputs({{"--json", o.json, true}, {"--trace", o.trace}},
                  {{"--checkpoint", o.checkpoint + "/checkpoint.bin"}});
  });
  Batch b;
  on_every_rank(comm, [&] {
    if (o.turn_tokens != 0 || !o.turn.empty())
      throw Error("--turn and --turn-tokens run a second turn of one request, not with --requests");
    b.model = train::read_checkpoint(o.checkpoint);
    const std::vector<std::int64_t> lengths = parse_lengths(o.requests);
    const std::vector<std::int64_t> new_tokens = new_token_counts(o, lengths.size()),
                                    arrivals = arrival_steps(o, lengths.size());
    const train::TrainConfig& t = b.model.config;
    const std::int64_t positions = t.lengths.empty() ? t.seq : *std::max_element(t.lengths.begin(), t.lengths.end());
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::int64_t P = lengths[i], N = new_tokens[i];
      b.configs.push_back({parse_kv_layout(o.kv_layout), parse_prefill(o.prefill), o.capacity > 0 ? o.capacity : P + N,
                           o.temperature, o.seed + i});
      std::string e = P < 64 ? fmt::format("a synthetic sequence has at least 64 tokens, got {}", P)
                             : train::generate_error(t.model, b.configs.back(), comm.size(), P, N, positions);
      if (!e.empty()) throw Error(fmt::format("--requests: request {} of {}: {}", i, lengths.size(), e));
    }
    const train::DataSource task = train::DataSource::synthetic();
    for (std::size_t i = 0; i < lengths.size(); ++i)
      b.requests.push_back({task.held_out_batch(1, lengths[i], o.seed + i, 0).tokens, new_tokens[i], arrivals[i]});
    if (const std::string e = train::serve_error(b.requests); !e.empty()) throw Error("--requests: " + e);
    if (const std::string e = train::prefill_chunk_error(o.prefill_chunk, comm.size()); !e.empty())
      throw Error(fmt::format("--prefill-chunk {}: {}", o.prefill_chunk, e));
    b.held = train::held_together(b.requests, o.prefill_chunk, comm.size());
  });
  std::int64_t longest = 0;
  for (const auto& r : b.requests) longest = std::max(longest, std::int64_t(r.prompt.size()));
  b.memory = admit_generate_memory(comm, b.model.config.model, b.configs, b.held, longest, 0, o.max_memory);
  return b;
}

// Each request: its prompt, arrival and tokens, and the decode steps it ran in (first_step null:
// it had its tokens from its prefill).
nlohmann::json requests_report(const Batch& b, const train::ServedRun& run) {
  nlohmann::json requests = nlohmann::json::array();
  for (std::size_t i = 0; i < b.requests.size(); ++i) {
    nlohmann::json first = nullptr, last = nullptr;
    for (const train::ServedStep& s : run.steps)
      if (std::find(s.running.begin(), s.running.end(), i) != s.running.end()) {
        if (first.is_null()) first = s.step;
        last = s.step;
      }
    requests.push_back({{"prompt_tokens", b.requests[i].prompt.size()},
                        {"arrival_step", b.requests[i].arrival_step},
                        {"arrival_s", run.arrival_s[i]},
                        {"time_to_first_token_s", run.ttft_s[i]},
                        {"prefill_collectives", run.prefill_collectives[i]},
                        {"prefill_pieces", run.prefill_pieces[i]},
                        {"first_step", first},
                        {"last_step", last},
                        {"new_tokens", run.tokens[i].size()},
                        {"tokens", run.tokens[i]}});
  }
  return requests;
}

// The longest a request already running waited between two of its tokens: a step's prefill work
// before it and the step itself (a step whose requests all join it has no such request).
nlohmann::json longest_token_gap(const train::ServedRun& run) {
  nlohmann::json worst = nullptr;
  for (const train::ServedStep& s : run.steps)
    if (s.running.size() > s.joined.size() &&
        (worst.is_null() || s.prefill_s + s.seconds > worst["seconds"].get<double>()))
      worst = {{"step", s.step}, {"seconds", s.prefill_s + s.seconds}, {"prefill_s", s.prefill_s}};
  return worst;
}

nlohmann::json batch_report(const Communicator& comm, const GenerateOptions& o, const Batch& b,
                            const train::ServedRun& run, const std::vector<std::int64_t>& kv_bytes, double peak_rss) {
  nlohmann::json steps = nlohmann::json::array(), kv = nlohmann::json::array();
  double decode_s = 0, decode_cpu_s = 0;
  std::int64_t decoded = 0, collectives = 0;
  for (const train::ServedStep& s : run.steps) {
    const double n = double(s.running.size());
    steps.push_back({{"step", s.step},
                     {"requests", s.running.size()},
                     {"running", s.running},
                     {"joined", s.joined},
                     {"prefill_s", s.prefill_s},
                     {"prefill_tokens", s.prefill_tokens},
                     {"seconds", s.seconds},
                     {"cpu_s", s.cpu_s},
                     {"tokens_per_s", n / s.seconds},
                     {"collectives", s.collectives},
                     {"comm_s", s.comm_s}});
    decode_s += s.seconds;
    decode_cpu_s += s.cpu_s;
    decoded += std::int64_t(s.running.size());
    collectives = std::max(collectives, s.collectives);
  }
  // Each rank's caches at their busiest: the bytes held (measured as they were allocated) against
  // the formula's sum over the requests the schedule holds at once then.
  for (int rank = 0; rank < comm.size(); ++rank) {
    const train::KvPeak peak = train::peak_kv(b.model.config.model, b.configs, b.held, comm.size(), rank);
    kv.push_back({{"rank", rank},
                  {"bytes", kv_bytes[std::size_t(rank)]},
                  {"formula_bytes", peak.bytes},
                  {"requests", peak.requests}});
  }
  return {{"command", "generate"},
          {"cp", comm.size()},
          {"backend", comm.backend()},
          {"kv_layout", o.kv_layout},
          {"prefill", o.prefill},
          {"prefill_chunk", o.prefill_chunk},
          {"requests", requests_report(b, run)},
          {"longest_token_gap", longest_token_gap(run)},
          {"steps", steps},
          {"collectives_per_step", collectives},
          {"decode_tokens_per_s", decode_s > 0 ? double(decoded) / decode_s : 0.0},
          {"decode_tokens_per_cpu_s", decode_cpu_s > 0 ? double(decoded) / decode_cpu_s : 0.0},
          {"kv_cache_at", "peak"},  // the caches held at once at the busiest moment, not every request's
          {"kv_cache", kv},
          {"memory", memory_report(b.memory, peak_rss)}};
}

// "0, 2, 3" from a JSON array of request indices.
std::string ids(const nlohmann::json& list) {
  std::string text;
  for (const auto& i : list) text += (text.empty() ? "" : ", ") + std::to_string(i.get<std::int64_t>());
  return text;
}

// Each run of consecutive steps with the same requests running as one line: which, who joined
// at its first step (after how long prefilling them), and their tokens/s.
void print_steps(const nlohmann::json& steps) {
  for (std::size_t a = 0, e = 0; a < steps.size(); a = e) {
    double s = 0, cpu = 0;
    for (e = a; e < steps.size() && steps[e]["running"] == steps[a]["running"] &&
                steps[e]["step"].get<std::int64_t>() - steps[a]["step"].get<std::int64_t>() == std::int64_t(e - a);
         ++e) {
      s += steps[e]["seconds"].get<double>();
      cpu += steps[e]["cpu_s"].get<double>();
    }
    const auto& first = steps[a];
    const std::int64_t from = first["step"].get<std::int64_t>(), to = steps[e - 1]["step"].get<std::int64_t>();
    const std::string joined = first["joined"].empty()
                                   ? ""
                                   : fmt::format(" ({} joined after {:.2f} ms of prefill)", ids(first["joined"]),
                                                 1e3 * first["prefill_s"].get<double>());
    fmt::print("  {}: request{} {}{}: {:.0f} tokens/s across them ({:.3f} ms a step, {:.3f} ms CPU, {} collectives)\n",
               from == to ? fmt::format("step {}", from) : fmt::format("steps {}-{}", from, to),
               first["requests"] == 1 ? "" : "s", ids(first["running"]), joined,
               first["requests"].get<double>() * double(e - a) / s, 1e3 * s / double(e - a), 1e3 * cpu / double(e - a),
               first["collectives"].get<std::int64_t>());
  }
}

void print_batch(const nlohmann::json& j) {
  fmt::print("ulysses generate: cp = {} ({}), KV layout {}, prefill {}, {} concurrent requests\n", j["cp"].get<int>(),
             j["backend"].get<std::string>(), j["kv_layout"].get<std::string>(), j["prefill"].get<std::string>(),
             j["requests"].size());
  print_memory(j["memory"]);
  int i = 0;
  for (const auto& r : j["requests"])
    fmt::print(
        "  request {}: prompt {} tokens, arrives at step {}, {} new ({}), time to first token {:.2f} ms from "
        "its arrival\n",
        i++, r["prompt_tokens"].get<std::int64_t>(), r["arrival_step"].get<std::int64_t>(),
        r["new_tokens"].get<std::int64_t>(),
        r["first_step"].is_null()
            ? std::string("all from its prefill")
            : fmt::format("steps {}-{}", r["first_step"].get<std::int64_t>(), r["last_step"].get<std::int64_t>()),
        1e3 * r["time_to_first_token_s"].get<double>());
  print_steps(j["steps"]);
  if (const auto& gap = j["longest_token_gap"]; !gap.is_null())
    fmt::print(
        "  a running request waited at most {:.3f} ms between two tokens (before step {}: {:.3f} ms of prefill{})\n",
        1e3 * gap["seconds"].get<double>(), gap["step"].get<std::int64_t>(), 1e3 * gap["prefill_s"].get<double>(),
        j["prefill_chunk"].get<std::int64_t>() > 0
            ? fmt::format(", prompts {} tokens at a time", j["prefill_chunk"].get<std::int64_t>())
            : std::string(", prompts whole"));
  fmt::print("  decode {:.0f} tokens/s across requests, {:.0f} a CPU second of this process\n",
             j["decode_tokens_per_s"].get<double>(), j["decode_tokens_per_cpu_s"].get<double>());
  for (const auto& k : j["kv_cache"])
    fmt::print("  KV cache rank {} at its peak ({}): {} bytes held, formula {} bytes{}\n", k["rank"].get<int>(),
               k["requests"].size() == 1 ? "request " + ids(k["requests"]) + " alone"
                                         : "requests " + ids(k["requests"]) + " held at once",
               k["bytes"].get<std::int64_t>(), k["formula_bytes"].get<std::int64_t>(),
               k["bytes"] == k["formula_bytes"] ? " (equal)" : " (DIFFERENT)");
}

}  // namespace

int run_generate_requests(Communicator& comm, const GenerateOptions& o) {
  const Batch b = load_batch(comm, o);
  std::vector<std::unique_ptr<train::Generator>> gens;
  for (const train::GenerateConfig& c : b.configs)
    gens.push_back(std::make_unique<train::Generator>(comm, b.model.config.model, b.model.params, c));
  std::vector<train::Generator*> served;
  for (const auto& g : gens) {
    show_prefill_progress(comm, *g, std::int64_t(b.requests[served.size()].prompt.size()));
    served.push_back(g.get());
  }
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) tracer.emplace(comm);
  const train::ServedRun run = train::serve(comm, served, b.requests, o.prefill_chunk);
  const std::vector<TraceEvent> events = tracer ? tracer->events() : std::vector<TraceEvent>();
  tracer.reset();  // the runs only, not the reports' traffic
  if (!o.trace.empty()) write_chrome_trace(comm, events, o.trace);
  const std::vector<std::int64_t> kv_bytes = comm.allgather_value(run.peak_kv_bytes);
  const double peak_rss = largest_peak_rss(comm);
  on_root(comm, [&] {
    const nlohmann::json report = batch_report(comm, o, b, run, kv_bytes, peak_rss);
    if (o.json != "-") print_batch(report);
    if (!o.json.empty()) write_file_atomic(o.json, report.dump(2) + "\n");
  });
  return 0;
}

}  // namespace ulysses::cli
