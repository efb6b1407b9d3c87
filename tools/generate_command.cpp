#include "generate_command.hpp"

#include <fmt/format.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>
#include <vector>

#include "agreement.hpp"
#include "generate_memory.hpp"
#include "generate_requests.hpp"
#include "rank_errors.hpp"
#include "report.hpp"
#include "ulysses/kernels/read_probe.hpp"
#include "train/checkpoint.hpp"
#include "train/data.hpp"
#include "train/generate.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/core/cpu_clock.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/core/threads.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::cli {

namespace {

// --requests and what only it takes: concurrent requests instead of one prompt (`prompts`).
void add_requests_options(CLI::App* c, GenerateOptions& o, const std::vector<CLI::Option*>& prompts) {
  auto* requests =
      c->add_option("--requests", o.requests,
                    "concurrent requests: their synthetic prompts' lengths (e.g. 4x8192 or 1x32768,3x4096; "
                    "request i drawn from --seed + i), decoded together, one collective per layer a step");
  for (CLI::Option* p : prompts) requests->excludes(p);
  c->add_option("--requests-new-tokens", o.requests_new_tokens,
                "with --requests: each request's new tokens (one count for all, or one a request, e.g. 8,32,16; "
                "default --max-new-tokens): they finish at different steps")
      ->needs(requests);
  c->add_option("--requests-arrive", o.requests_arrive,
                "with --requests: the decode step each request arrives at, one a request (e.g. 0,0,4,9; NxS: N "
                "requests at step S; default: all at 0): it is prefilled then and joins the next step")
      ->needs(requests);
  c->add_option("--prefill-chunk", o.prefill_chunk,
                "with --requests: prefill an arriving prompt N tokens at a time, one piece before each decode "
                "step, so the running requests wait for a piece, not a whole prompt, between two tokens (at least "
                "one token a rank; default 0: each prompt whole)")
      ->needs(requests);
}

}  // namespace

void add_generate_command(CLI::App& app, GenerateOptions& o) {
  CLI::App* c =
      add_command(app, "generate",
                  "Generate from a `train --save` checkpoint over a KV cache sharded across the ranks: the prompt "
                  "prefilled into the cache, then one token per step with one collective per layer.");
  c->add_option("--checkpoint", o.checkpoint, "the folder `ulysses train --save` wrote")->required();
  auto* file =
      input_path(c->add_option("--prompt", o.prompt, "the prompt: a file's bytes (byte-level tokens)"), "file");
  auto* synthetic = c->add_option("--prompt-tokens", o.prompt_tokens,
                                  "a synthetic prompt of N tokens: a sequence of the training task "
                                  "(retrieval queries answered from anywhere before them)");
  file->excludes(synthetic);
  add_requests_options(c, o, {file, synthetic});
  c->add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")->capture_default_str();
  auto* turn = input_path(c->add_option("--turn", o.turn,
                                        "then a second turn over the filled cache: a file's bytes (Ulysses over it "
                                        "under heads, pass-Q under interleaved), and --max-new-tokens more"),
                          "file");
  c->add_option("--turn-tokens", o.turn_tokens, "or a second turn of N synthetic tokens (the training task's)")
      ->excludes(turn);
  c->add_option("--kv-layout", o.kv_layout,
                "heads (each rank its KV heads of every token) | interleaved (token i on rank i mod cp, all heads)")
      ->capture_default_str()
      ->check(CLI::IsMember({"heads", "interleaved"}));
  c->add_option("--prefill", o.prefill,
                "how the prompt fills the cache: ulysses (the a2a strategy's all-to-alls) | ring (the p2p "
                "strategy's pass-KV ring, then one all-to-all into the KV layout)")
      ->capture_default_str()
      ->check(CLI::IsMember({"ulysses", "ring"}));
  c->add_option("--capacity", o.capacity, "KV cache tokens (default: prompt + new tokens)");
  c->add_option("--temperature", o.temperature, "0: greedy; else sampled from softmax(logits / T)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  c->add_option("--seed", o.seed, "the synthetic prompt's and the sampler's seed")->capture_default_str();
  c->add_option("--json", o.json, "write a JSON report here (rank 0; - for standard output, after the text)");
  c->add_option("--threads", o.threads, "threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Range(0, 1024));
  c->add_option("--trace", o.trace,
                "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the prefill and the decode steps here "
                "(rank 0), every rank's collectives on its own track");
  c->add_option("--max-memory", o.max_memory,
                "refuse a run predicted to need more than this per rank (e.g. 2GiB); always refused past 90 % of "
                "what the machine has");
  add_timeout_option(c, o.timeout);
  add_backend_options(c, o.backend);
}

namespace {

// `n` tokens of the training task (a held-out sequence of `seed`): Error below its 64.
std::vector<int> synthetic_tokens(const char* flag, std::int64_t n, std::uint64_t seed) {
  const train::DataSource task = train::DataSource::synthetic();
  if (n < 64)
    throw Error(fmt::format("{} {}: a synthetic sequence has at least 64 tokens (a needle and {} queries)", flag, n,
                            train::DataSource::kQueries));
  return task.held_out_batch(1, n, seed, 0).tokens;
}

// A file's bytes as tokens (byte-level), each inside the model's vocabulary.
std::vector<int> file_tokens(const char* flag, const std::string& path, std::int64_t vocab) {
  std::vector<int> tokens;
  for (unsigned char ch : read_input_within_memory(flag, path)) tokens.push_back(int(ch));
  for (int t : tokens)
    if (t >= vocab) throw Error(fmt::format("{} holds byte {}, outside the model's vocabulary of {}", flag, t, vocab));
  return tokens;
}

// The prompt's tokens: the file's bytes, or the training task's sequence (the same on every rank).
std::vector<int> load_prompt(const GenerateOptions& o, std::int64_t vocab) {
  if (o.prompt.empty() && o.prompt_tokens <= 0)
    throw Error(o.prompt_tokens < 0 ? fmt::format("--prompt-tokens must be positive, got {}", o.prompt_tokens)
                                    : "the prompt is empty: give --prompt FILE or --prompt-tokens N");
  return o.prompt.empty() ? synthetic_tokens("--prompt-tokens", o.prompt_tokens, o.seed)
                          : file_tokens("--prompt", o.prompt, vocab);
}

// The second turn's tokens (none without --turn or --turn-tokens): the file's bytes, or the
// training task's sequence of --seed + 1. Error for a turn with fewer tokens than ranks.
std::vector<int> load_turn(const GenerateOptions& o, std::int64_t vocab, int cp) {
  if (o.turn_tokens < 0) throw Error(fmt::format("--turn-tokens must be positive, got {}", o.turn_tokens));
  std::vector<int> turn;
  if (!o.turn.empty()) turn = file_tokens("--turn", o.turn, vocab);
  if (o.turn_tokens > 0) turn = synthetic_tokens("--turn-tokens", o.turn_tokens, o.seed + 1);
  if ((!o.turn.empty() || o.turn_tokens > 0) && std::int64_t(turn.size()) < cp)
    throw Error(fmt::format("{}: a turn of {} tokens; it needs at least one token a rank ({})",
                            o.turn.empty() ? "--turn-tokens" : "--turn " + o.turn, turn.size(), cp));
  return turn;
}

struct Request {
  train::Checkpoint model;
  std::vector<int> prompt, turn;
  train::GenerateConfig config;
  train::MemoryEstimate memory;  // predicted per rank, admitted
};

// Collective. Reads, checks and agrees on everything before any data moves: one error, every rank.
Request load_request(Communicator& comm, const GenerateOptions& o) {
  on_root(comm, [&] {
    check_outputs({{"--json", o.json, true}, {"--trace", o.trace}},
                  {{"--checkpoint", o.checkpoint + "/checkpoint.bin"}, {"--prompt", o.prompt}, {"--turn", o.turn}});
  });
  Request r;
  on_every_rank(comm, [&] {
    r.model = train::read_checkpoint(o.checkpoint);
    r.prompt = load_prompt(o, r.model.config.model.vocab);
    r.turn = load_turn(o, r.model.config.model.vocab, comm.size());
    const std::int64_t P = std::int64_t(r.prompt.size()), T = std::int64_t(r.turn.size()),
                       tokens = P + o.max_new_tokens + (T > 0 ? T + o.max_new_tokens : 0);
    r.config = {parse_kv_layout(o.kv_layout), parse_prefill(o.prefill), o.capacity > 0 ? o.capacity : tokens,
                o.temperature, o.seed};
    const train::TrainConfig& t = r.model.config;
    const std::int64_t positions = t.lengths.empty() ? t.seq : *std::max_element(t.lengths.begin(), t.lengths.end());
    const std::string e = train::generate_error(t.model, r.config, comm.size(), P, o.max_new_tokens, positions);
    if (!e.empty()) throw Error(e);
    if (tokens > r.config.capacity)
      throw Error(
          fmt::format("the prompt's {} tokens, the turn's {} and 2 x {} new ones do not fit in the KV cache's "
                      "capacity of {} tokens",
                      P, T, o.max_new_tokens, r.config.capacity));
  });
  // The cache is allocated whole and zeroed at the prefill; the bandwidth probe then reads a buffer of at least
  // 64 MiB and at least the cache's filled rows (measure_bandwidth).
  const train::GptConfig& m = r.model.config.model;
  const std::int64_t P = std::int64_t(r.prompt.size()), T = std::int64_t(r.turn.size()),
                     used = P + o.max_new_tokens + (T > 0 ? T + o.max_new_tokens : 0);
  const double filled =
      double(kv_bytes_formula(r.config.layout, {m.layers, m.heads, m.kv_heads, m.head_dim, used}, comm.size(), 0));
  r.memory = admit_generate_memory(comm, m, {r.config}, {{0}}, std::max(P, T), std::max(double(64 << 20), filled),
                                   o.max_memory);
  return r;
}

struct Bandwidth {
  double cache_bytes = 0, kernel_bytes_s = 0, read_bytes_s = 0;
};

// Not collective (every rank at once: they share the memory as decode does). The decode kernel
// over this rank's whole cache (every layer) against this machine's read (kernels::read_seconds) of a
// buffer as large or larger.
Bandwidth measure_bandwidth(const KvCache& cache) {
  const KvCacheShape& s = cache.shape();
  const RankHeads& h = cache.heads();
  std::vector<float> q(static_cast<std::size_t>(h.q.count * s.head_dim), 0.5f), out(q.size()),
      lse(static_cast<std::size_t>(h.q.count));
  const Shape rows{1, 1, h.q.count, s.head_dim};
  const TensorView qv = TensorView::dense(q.data(), DType::f32, rows, Layout::bshd),
                   ov = TensorView::dense(out.data(), DType::f32, rows, Layout::bshd),
                   lv = TensorView::dense(lse.data(), DType::f32, {1, 1, h.q.count, 1}, Layout::bhsd);
  const DecodeParams params{.q_first = h.q.first, .kv_first = h.kv.first, .group = s.heads / s.kv_heads};
  Bandwidth b;
  for (std::int64_t l = 0; l < s.layers; ++l)
    b.cache_bytes += 2.0 * double(cache.keys(l).shape.numel()) * sizeof(float);
  const std::size_t floats = std::max<std::size_t>(std::size_t(64) << 18, std::size_t(b.cache_bytes / 4));
  // From the allocator the cache's rows come from, so that both are on the same kind of pages
  // (huge ones for large blocks, tensor.cpp): the fraction compares reads, not page sizes.
  const std::size_t n = (floats + 31) / 32 * 32;  // whole lanes of the read
  const Tensor buffer({1, 1, 1, std::int64_t(n)}, DType::f32, Layout::bshd);
  std::fill(buffer.f32(), buffer.f32() + n, 1.0f);
  double kernel = 1e30, read = 1e30;
  for (int rep = 0; rep < 7; ++rep) {  // alternated, best of each: a loaded machine's slow spells hit both
    const double t0 = kernels::probe_clock();
    for (std::int64_t l = 0; l < s.layers; ++l)
      decode_attention_forward(ov, lv, qv, cache.keys(l), cache.values(l), params);
    kernel = std::min(kernel, kernels::probe_clock() - t0);
    read = std::min(read, kernels::read_seconds(buffer.f32(), n));
  }
  b.kernel_bytes_s = b.cache_bytes / kernel;
  b.read_bytes_s = double(n * sizeof(float)) / read;
  return b;
}

}  // namespace

namespace {

struct Timing {
  std::vector<int> tokens;
  double ttft_s = 0, decode_s = 0, step_comm_s = 0;
  // The same in this process's CPU seconds: on a shared host wall time counts the spells other
  // processes held the cores; a rank waiting for its peer spins, so it still counts the wait.
  double ttft_cpu_s = 0, decode_cpu_s = 0;
  // The slowest rank's ttft_cpu_s: a rank that waits for a peer does not always spin (the ring
  // prefill's first ranks finish their chunks and wait for the last), so rank 0's is not the step's.
  double ttft_cpu_max_s = 0;
  std::int64_t prefill_collectives = 0, step_collectives = 0, steps = 0;
  double prefill_comm_s = 0;
};

// Collective. The prompt (prefilled into an empty cache, else over it) and the decode steps,
// timed (rank-local clocks; the collectives keep the ranks in step).
Timing run_turn(Communicator& comm, train::Generator& gen, const std::vector<int>& prompt, std::int64_t new_tokens,
                bool first) {
  Timing t;
  comm.barrier();
  double t0 = comm.now(), c0 = process_cpu_seconds();
  std::vector<float> logits = first ? gen.prefill(prompt) : gen.extend(prompt);
  t.tokens.push_back(gen.next_token(logits));
  t.ttft_s = comm.now() - t0;
  t.ttft_cpu_s = process_cpu_seconds() - c0;
  comm.trace(first ? "prefill" : "next turn", t0, comm.now(), "phase");
  t.prefill_collectives = gen.stats().collectives;
  t.prefill_comm_s = gen.stats().comm_s;
  t0 = comm.now();
  c0 = process_cpu_seconds();
  for (std::int64_t i = 1; i < new_tokens; ++i) {
    const double s0 = comm.now();
    logits = gen.decode(t.tokens.back());
    comm.trace(fmt::format("decode step {}", i), s0, comm.now(), "phase");
    t.tokens.push_back(gen.next_token(logits));
    t.step_collectives = gen.stats().collectives;
    t.step_comm_s += gen.stats().comm_s;
    ++t.steps;
  }
  t.decode_s = comm.now() - t0;
  t.decode_cpu_s = process_cpu_seconds() - c0;
  t.ttft_cpu_max_s = t.ttft_cpu_s;
  comm.allreduce_max(&t.ttft_cpu_max_s, 1);  // after the timed steps
  return t;
}

// The generated bytes, printable as they are, the rest as \xNN.
std::string shown(const std::vector<int>& tokens) {
  std::string s;
  for (int t : tokens) s += (t >= 32 && t < 127) ? std::string(1, char(t)) : fmt::format("\\x{:02x}", t);
  return s;
}

nlohmann::json make_report(const Communicator& comm, const Request& r, const Timing& t, const Bandwidth& b,
                           const std::vector<std::int64_t>& kv_bytes, double peak_rss) {
  const std::int64_t tpot_steps = std::max<std::int64_t>(t.steps, 1);
  nlohmann::json kv = nlohmann::json::array();
  const KvCacheShape shape{r.model.config.model.layers, r.model.config.model.heads, r.model.config.model.kv_heads,
                           r.model.config.model.head_dim, r.config.capacity};
  for (int rank = 0; rank < comm.size(); ++rank)
    kv.push_back({{"rank", rank},
                  {"bytes", kv_bytes[std::size_t(rank)]},
                  {"formula_bytes", kv_bytes_formula(r.config.layout, shape, comm.size(), rank)}});
  return {{"command", "generate"},
          {"cp", comm.size()},
          {"backend", comm.backend()},
          {"kv_layout", to_string(r.config.layout)},
          {"prefill", to_string(r.config.prefill)},
          {"prompt_tokens", r.prompt.size()},
          {"new_tokens", t.tokens.size()},
          {"tokens", t.tokens},
          {"time_to_first_token_s", t.ttft_s},
          {"time_per_output_token_s", t.decode_s / double(tpot_steps)},
          {"time_to_first_token_cpu_s", t.ttft_cpu_s},
          {"time_to_first_token_cpu_max_s", t.ttft_cpu_max_s},
          {"cpu_per_output_token_s", t.decode_cpu_s / double(tpot_steps)},
          {"decode_tokens_per_s", t.steps > 0 ? double(t.steps) / t.decode_s : 0.0},
          {"prefill_collectives", t.prefill_collectives},
          {"prefill_comm_s", t.prefill_comm_s},
          {"collectives_per_step", t.step_collectives},
          {"comm_s_per_step", t.step_comm_s / double(tpot_steps)},
          {"kv_cache_at", "request"},  // the one request's cache
          {"kv_cache", kv},
          {"memory", memory_report(r.memory, peak_rss)},
          {"decode_kernel",
           {{"cache_bytes", b.cache_bytes},
            {"bytes_per_s", b.kernel_bytes_s},
            {"read_bandwidth_bytes_per_s", b.read_bytes_s},
            {"fraction", b.kernel_bytes_s / b.read_bytes_s}}}};
}

nlohmann::json turn_report(const Request& r, const Timing& t) {
  return {{"tokens_over_cache", r.turn.size()},
          {"new_tokens", t.tokens.size()},
          {"tokens", t.tokens},
          {"time_to_first_token_s", t.ttft_s},
          {"collectives", t.prefill_collectives},
          {"comm_s", t.prefill_comm_s},
          {"time_per_output_token_s", t.decode_s / double(std::max<std::int64_t>(t.steps, 1))}};
}

void print_report(const nlohmann::json& j, std::int64_t replication, const std::string& text) {
  fmt::print("ulysses generate: cp = {} ({}), KV layout {} (each KV head on {} rank(s)), prefill {}\n",
             j["cp"].get<int>(), j["backend"].get<std::string>(), j["kv_layout"].get<std::string>(), replication,
             j["prefill"].get<std::string>());
  print_memory(j["memory"]);
  fmt::print("  prompt {} tokens, {} new\n", j["prompt_tokens"].get<std::int64_t>(),
             j["new_tokens"].get<std::int64_t>());
  fmt::print("  time to first token {:.2f} ms ({} collectives, {:.2f} ms)\n",
             1e3 * j["time_to_first_token_s"].get<double>(), j["prefill_collectives"].get<std::int64_t>(),
             1e3 * j["prefill_comm_s"].get<double>());
  fmt::print("  time per output token {:.3f} ms, {:.0f} tokens/s; per step {} collectives, {:.3f} ms in them\n",
             1e3 * j["time_per_output_token_s"].get<double>(), j["decode_tokens_per_s"].get<double>(),
             j["collectives_per_step"].get<std::int64_t>(), 1e3 * j["comm_s_per_step"].get<double>());
  fmt::print(
      "  in this process's CPU seconds (rank 0): first token {:.2f} ms (the slowest rank's {:.2f} ms), a token {:.3f} "
      "ms\n",
      1e3 * j["time_to_first_token_cpu_s"].get<double>(), 1e3 * j["time_to_first_token_cpu_max_s"].get<double>(),
      1e3 * j["cpu_per_output_token_s"].get<double>());
  for (const auto& k : j["kv_cache"])
    fmt::print("  KV cache rank {}: {} bytes held, formula {} bytes{}\n", k["rank"].get<int>(),
               k["bytes"].get<std::int64_t>(), k["formula_bytes"].get<std::int64_t>(),
               k["bytes"] == k["formula_bytes"] ? " (equal)" : " (DIFFERENT)");
  const auto& d = j["decode_kernel"];
  fmt::print("  decode kernel (rank 0): {} of cache at {:.2f} GB/s; this machine reads {:.2f} GB/s: fraction {:.2f}\n",
             human_bytes(d["cache_bytes"].get<double>()), 1e-9 * d["bytes_per_s"].get<double>(),
             1e-9 * d["read_bandwidth_bytes_per_s"].get<double>(), d["fraction"].get<double>());
  fmt::print("  generated: {}\n", text);
  if (!j.contains("turn")) return;
  const auto& t = j["turn"];
  fmt::print(
      "  second turn: {} tokens over the cache ({}): time to first token {:.2f} ms ({} collectives, {:.2f} ms), "
      "time per output token {:.3f} ms\n",
      t["tokens_over_cache"].get<std::int64_t>(), j["kv_layout"] == "heads" ? "Ulysses over the cache" : "pass-Q",
      1e3 * t["time_to_first_token_s"].get<double>(), t["collectives"].get<std::int64_t>(),
      1e3 * t["comm_s"].get<double>(), 1e3 * t["time_per_output_token_s"].get<double>());
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  const int fallback = default_threads(comm);  // collective: on every rank, --threads given or not
  set_threads(o.threads > 0 ? o.threads : fallback);
  if (!o.requests.empty()) return run_generate_requests(comm, o);
  const Request r = load_request(comm, o);
  train::Generator gen(comm, r.model.config.model, r.model.params, r.config);
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) tracer.emplace(comm);
  show_prefill_progress(comm, gen, std::int64_t(r.prompt.size()));
  const Timing t = run_turn(comm, gen, r.prompt, o.max_new_tokens, true);
  show_prefill_progress(comm, gen, std::int64_t(r.turn.size()));
  const Timing turn = r.turn.empty() ? Timing{} : run_turn(comm, gen, r.turn, o.max_new_tokens, false);
  const std::vector<TraceEvent> events = tracer ? tracer->events() : std::vector<TraceEvent>();
  tracer.reset();  // the runs only, not the probe's or the reports' traffic
  if (!o.trace.empty()) write_chrome_trace(comm, events, o.trace);
  // The heap's freed blocks go back before the probe's buffer arrives: without it glibc kept up
  // to 13 MiB of the prefill's (8192 tokens, one rank, run to run), and the peak is what is in
  // use, which the memory model counts.
  malloc_trim(0);
  const Bandwidth b = measure_bandwidth(gen.cache());
  const std::vector<std::int64_t> kv_bytes = comm.allgather_value(gen.cache().bytes());
  const double peak_rss = largest_peak_rss(comm);
  on_root(comm, [&] {
    nlohmann::json report = make_report(comm, r, t, b, kv_bytes, peak_rss);
    if (!r.turn.empty()) report["turn"] = turn_report(r, turn);
    if (o.json != "-") print_report(report, gen.cache().replication(), shown(t.tokens));
    if (!o.json.empty()) write_file_atomic(o.json, report.dump(2) + "\n");
  });
  return 0;
}

}  // namespace ulysses::cli
