// Section 3: every strategy end to end on the same shape, beside one rank using every core.
//
// First rank 0 alone runs the whole attention with all cores (the other ranks sleep), then all
// ranks run each strategy (and a2a+p2p at every factorisation). For each: forward and backward
// time (median, slowest rank), compute time, exposed communication (blocked waiting), the same
// communication replayed alone (hidden = alone − exposed), bytes per rank against the formula,
// and the library's peak working memory per rank against local Q+K+V.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "bench.hpp"
#include "replay.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/core/threads.hpp"

namespace ulysses::bench {

namespace {

struct Result {
  std::string name;
  int ranks = 1, threads = 1;
  double fwd = 0, bwd = 0, compute = 0, exposed = 0, alone = 0;
  std::int64_t bytes = 0, expected = 0, peak = 0;
  double model = 0;     // the strategy's memory model of that peak (Strategy::memory)
  std::string untuned;  // a tuning's row: the name of the row it varies ("" otherwise)
};

// One configuration the section runs: its row's name and, for a tuning, the row it varies.
struct Run {
  std::string name;
  CpConfig cfg;
  std::string untuned;
};

constexpr std::int64_t kHeads = 8, kKvHeads = 8, kHeadDim = 64;

Result run(Communicator& comm, const CpConfig& cfg, const Options& o, const std::string& name, int threads) {
  const int cp = comm.size();
  const std::int64_t s = o.seq, sl = tokens_held(cfg, cp, comm.rank(), 1, s), kvh = kKvHeads;
  const auto chunks = rank_chunks(cfg, cp, comm.rank(), s);
  Tensor q({1, sl, kHeads, kHeadDim}), k({1, sl, kvh, kHeadDim}), v(k.shape()), dout(q.shape());
  Tensor out(q.shape()), dq(q.shape()), dk(k.shape()), dv(k.shape());
  std::int64_t row = 0;
  for (const SeqChunk& c : chunks) {
    for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) {
      TensorView part = t->view();
      part.data = t->view().row(0, row, 0);
      part.shape.s = c.length;
      fill_uniform(part, std::uint64_t(seed), c.begin);
    }
    row += c.length;
  }
  ContextParallelAttention attn(comm, cfg);
  {  // warm-up (and sub-communicators)
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
  }
  std::vector<double> f, b, comp, exp;
  Result r{name, cp, threads};
  for (int i = 0; i < o.reps; ++i) {
    comm.reset_counters();
    reset_tensor_bytes_peak();
    const std::int64_t base = tensor_bytes_in_use();
    comm.barrier();
    double t0 = comm.now();
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    f.push_back(slowest(comm, comm.now() - t0));
    comm.barrier();
    t0 = comm.now();
    CpStats stats = attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
    b.push_back(slowest(comm, comm.now() - t0));
    stats += ctx.stats();
    comp.push_back(slowest(comm, stats.compute_s));
    exp.push_back(slowest(comm, stats.comm_exposed_s));
    std::int64_t peak = tensor_bytes_peak() - base;
    comm.allreduce_max(&peak, 1);
    r.peak = peak;
    r.bytes = 0;
    for (const auto& [op, c] : comm.counters())
      if (!op.ends_with("validate")) r.bytes += c.bytes_sent;
  }
  std::int64_t bytes_max = r.bytes;
  comm.allreduce_max(&bytes_max, 1);
  r.bytes = bytes_max;
  r.fwd = median(f);
  r.bwd = median(b);
  r.compute = median(comp);
  r.exposed = median(exp);
  // The busiest rank's formula total (the busiest of each counter may be different ranks: a
  // window's halo goes forward from one end of the ring, its dK/dV back from the other).
  const CommVolume mine = predicted_comm_volume(cfg, cp, comm.rank(), {1, s, kHeads, kHeadDim}, kvh, DType::f32);
  r.expected = mine.total_forward_bytes() + mine.total_backward_bytes();
  comm.allreduce_max(&r.expected, 1);
  const CommVolume vol = predicted_comm_volume(cfg, cp, {1, s, kHeads, kHeadDim}, kvh, DType::f32);
  if (cp > 1) {  // one rank runs plain flash attention, whatever the strategy
    const StrategyMemory m =
        find_strategy(cfg.cp_comm_type).memory(cfg, cp, {1, s, kHeads, kHeadDim}, s, kvh, DType::f32);
    r.model = std::max(m.forward, m.kept + m.backward);
  }
  Replay replay(comm, vol);  // the same transfers without the compute
  std::vector<double> alone;
  for (int i = 0; i < o.reps; ++i) alone.push_back(slowest(comm, replay.run()));
  r.alone = median(alone);
  return r;
}

// What a tuning sets that its strategy's plain configuration does not: "--overlap-chunks 2".
std::string tuned_options(const Strategy& strategy, const CpConfig& plain, const CpConfig& tuned) {
  std::string out;
  for (const StrategyOption& option : strategy.options())
    if (const auto v = option_value(option, tuned); v != option_value(option, plain))
      out += fmt::format(" --{} {}", option.flag, fmt::join(v, ","));
  return out;
}

// Every registered strategy at each configuration the planner compares, then each one's
// tunings beside its plain configuration (a2a's overlap), then, for the strategies a causal
// sliding window of s/16 spares traffic (the ring's halo exchange), that window, zigzag and
// contiguous ("c").
std::vector<Run> runs(int cp, std::int64_t seq) {
  std::vector<Run> out;
  const Shape q{1, seq, kHeads, kHeadDim};
  for (const Strategy* strategy : strategies())
    for (const CpConfig& cfg : strategy->plan_configs(cp, true)) out.push_back({strategy->config_name(cfg), cfg, ""});
  for (const Strategy* strategy : strategies()) {
    const CpConfig plain = strategy->plan_configs(cp, true).front();
    for (const CpConfig& tuned : strategy->tunings(plain, cp, kKvHeads))
      if (const std::string options = tuned_options(*strategy, plain, tuned); !options.empty())
        out.push_back({strategy->config_name(tuned) + options, tuned, strategy->config_name(plain)});
  }
  for (const Strategy* strategy : strategies()) {
    CpConfig windowed = strategy->plan_configs(cp, true).front();
    windowed.window_left = seq / 16;
    auto bytes = [&](const CpConfig& c) {
      return predicted_comm_volume(c, cp, q, kKvHeads, DType::f32).total_forward_bytes();
    };
    if (!strategy->supports_window() || bytes(windowed) >= bytes(strategy->plan_configs(cp, true).front())) continue;
    for (bool zigzag : {true, false}) {
      windowed.zigzag = zigzag;
      out.push_back(
          {fmt::format("{} W={}{}", strategy->config_name(windowed), seq / 16, zigzag ? "" : " c"), windowed, ""});
    }
  }
  return out;
}

}  // namespace

nlohmann::json strategies_section(Communicator& world, const Options& o) {
  const int cp = world.size();
  std::vector<Result> results;
  // 1 rank × all cores: rank 0 alone, the others asleep.
  if (world.rank() == 0) {
    const std::unique_ptr<Communicator> alone = make_self_communicator(world);
    Communicator& self = *alone;
    set_threads(o.cores);
    CpConfig plain;  // any strategy: one rank runs plain flash attention
    plain.causal = true;
    results.push_back(run(self, plain, o, "1 rank (no CP)", o.cores));
  }
  idle_barrier(MPI_COMM_WORLD);
  set_threads(o.threads_per_rank);
  for (const Run& c : runs(cp, o.seq)) {
    try {
      results.push_back(run(world, c.cfg, o, c.name, o.threads_per_rank));
      results.back().untuned = c.untuned;
    } catch (const Error& e) {  // agreed on every rank: e.g. heads not divisible
      if (world.rank() == 0) fmt::print("{}: skipped: {}\n", c.name, e.what());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  if (world.rank() != 0) return nlohmann::json();
  const double base = results[0].fwd + results[0].bwd;
  const double local_qkv = double(o.seq / cp) * double(kHeads + 2 * kKvHeads) * double(kHeadDim) * 4;
  fmt::print("\n[3] causal attention fwd+bwd, s = {}, heads {}, kv heads {}, d {}; {} ranks x {} threads{}\n", o.seq,
             kHeads, kKvHeads, kHeadDim, cp, o.threads_per_rank,
             cp > o.cores ? " (OVERSUBSCRIBED: more ranks than cores)" : "");
  fmt::print("{:<24} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>5} {:>8} {:>6} {:>8} {:>7}\n", "strategy", "fwd ms",
             "bwd ms", "compute", "exposed", "comm", "hidden", "MB/rank", "=form", "peak MB", "/qkv", "model MB",
             "vs 1rk");
  for (const Result& r : results) {
    const double hidden = r.alone > 0 ? std::max(0.0, 1.0 - r.exposed / r.alone) : 0.0;
    const double ratio = double(r.peak) / (local_qkv * (r.ranks == 1 ? double(cp) : 1.0));
    fmt::print(
        "{:<24} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>6.0f}% {:>9.2f} {:>5} {:>8.1f} {:>6.2f} {:>8} "
        "{:>7.2f}\n",
        r.name, r.fwd * 1e3, r.bwd * 1e3, r.compute * 1e3, r.exposed * 1e3, r.alone * 1e3, hidden * 100,
        double(r.bytes) / 1e6, r.bytes == r.expected ? "yes" : "NO", double(r.peak) / 1e6, ratio,
        r.model > 0 ? fmt::format("{:.1f}", r.model / 1e6) : "-", base / (r.fwd + r.bwd));
    rows.push_back({{"strategy", r.name},
                    {"ranks", r.ranks},
                    {"threads", r.threads},
                    {"forward_s", r.fwd},
                    {"backward_s", r.bwd},
                    {"compute_s", r.compute},
                    {"comm_exposed_s", r.exposed},
                    {"comm_alone_s", r.alone},
                    {"bytes_sent", r.bytes},
                    {"expected_bytes", r.expected},
                    {"peak_tensor_bytes", r.peak},
                    {"peak_over_local_qkv", ratio},
                    {"model_peak_bytes", r.model},
                    {"throughput_vs_one_rank", base / (r.fwd + r.bwd)}});
  }
  for (const Result& r : results) {
    const auto plain =
        std::find_if(results.begin(), results.end(), [&](const Result& p) { return p.name == r.untuned; });
    if (!r.untuned.empty() && plain != results.end())
      fmt::print("{}: exposed communication {:.1f} ms vs plain {} {:.1f} ms ({:.2f}x), fwd+bwd {:.2f}x plain's\n",
                 r.name, r.exposed * 1e3, plain->name, plain->exposed * 1e3, r.exposed / plain->exposed,
                 (r.fwd + r.bwd) / (plain->fwd + plain->bwd));
  }
  fmt::print(
      "compute/exposed/comm: ms per fwd+bwd (slowest rank); comm = the same transfers replayed alone;\n"
      "hidden = 1 - exposed/comm; peak MB = library working memory per rank; /qkv = peak / local q+k+v;\n"
      "model MB = the strategy's memory model of that peak (Strategy::memory: its forward's, or what it keeps\n"
      "and its backward's buffers); vs 1rk = throughput relative to one rank using every core.\n");
  return rows;
}

}  // namespace ulysses::bench
