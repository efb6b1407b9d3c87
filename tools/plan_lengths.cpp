// `ulysses plan --lengths`: which ranks compute which sequence of a variable-length step under
// each balance policy, and what each predicts, for a GPU cluster model or this machine.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <numeric>
#include <thread>

#include "guard.hpp"
#include "plan_command.hpp"
#include "rank_errors.hpp"
#include "report.hpp"
#include "train/layers.hpp"
#include "train/memory.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/plan/balancer.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"
#include "ulysses/core/threads.hpp"

namespace ulysses::cli {

namespace {

constexpr BalancePolicy kPolicies[] = {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic};

// The balancer keeps a few hundred bytes a sequence and, once per distinct length, its costs and
// options at ~8 group sizes an octave. Measured peak RSS of rank 0 at world 1024: 10^5 sequences
// of 3 lengths 84 MB, a pareto tail of 10^5 (~50 000 lengths) 163 MB; at world 256, 20 000
// pareto sequences 63 MB. Its time grows with sequences x ranks, so the limit is 2^27 pairs: at it a
// plan takes 0.2-1.8 s on 2 cores here (2^20 Pareto sequences on 128 ranks the longest).
constexpr double kPlanBytesPerSequence = 1024, kPlanBytesPerLength = 4096, kPlanBaseBytes = 64 << 20;
// Beside the plans, the memo they share keeps pow2's groups of every world planned (a length and
// a group a sequence) until the last plan ends.
constexpr double kPow2MemoBytesPerSequence = 16;
constexpr std::int64_t kMaxPlanPairs = std::int64_t(1) << 27;

// The bytes one plan of the step at `world` ranks may take (the measurements above).
double plan_bytes(const std::vector<std::int64_t>& lengths, int world) {
  std::vector<std::int64_t> distinct = lengths;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  return kPlanBaseBytes + kPlanBytesPerSequence * double(lengths.size()) +
         kPlanBytesPerLength * double(distinct.size()) * std::log2(double(world) + 1);
}

double memo_bytes(const std::vector<std::int64_t>& lengths, const std::vector<int>& worlds) {
  return kPow2MemoBytesPerSequence * double(lengths.size()) * double(worlds.size());
}

// Not collective. Refuses a step the planner could not hold in memory (or plan in seconds); the
// bytes one plan may take.
double admit_plan(const std::vector<std::int64_t>& lengths, const std::vector<int>& worlds) {
  const int largest_world = *std::max_element(worlds.begin(), worlds.end());
  const std::int64_t pairs = std::int64_t(lengths.size()) * largest_world;
  if (pairs > kMaxPlanPairs)
    throw Error(
        fmt::format("--lengths: {} sequences at world {} are {} sequence x rank pairs, more than the "
                    "planner's limit of {} (2^27; its time grows with both): fewer "
                    "sequences or a smaller --world",
                    lengths.size(), largest_world, pairs, kMaxPlanPairs));
  const double bytes = plan_bytes(lengths, largest_world);
  check_memory("ulysses plan --lengths", bytes + memo_bytes(lengths, worlds), 0, 1);
  return bytes;
}

// Not collective. What the balancer would otherwise meet inside its plans, after the first table
// printed: an unknown strategy, or a sequence whose work on one rank (every length is priced on
// one rank among its sizes) does not fit the planner's 64-bit counts and would be priced wrong.
void check_lengths_input(const BalanceInput& in) {
  (void)find_strategy(in.cp_comm_type);
  PlanInput probe = in.model;  // the model's sizes and the longest sequence, checked once
  probe.seq = *std::max_element(in.lengths.begin(), in.lengths.end());
  probe.cp = 1;
  const std::string e = plan_input_error(probe);
  if (e.find("too large to plan") != std::string::npos)  // its advice names --seq, which --lengths has not
    throw Error(
        fmt::format("--lengths: the longest sequence ({} tokens) on one rank: the problem is too large to "
                    "plan: its work does not fit 64 bits (shorter sequences, or fewer heads)",
                    probe.seq));
  if (!e.empty()) throw Error(e);
}

// How many plans may run at once: one a hardware thread, as many as the memory left beside the
// shared memo holds (admit_plan checked that one fits).
std::size_t plans_at_once(double plan_bytes, double memo) {
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::int64_t available = available_memory_bytes();
  if (available < 0) return hardware;
  const double room = std::max(0.0, double(available) - memo);
  return std::clamp<std::size_t>(std::size_t(room / plan_bytes), 1, hardware);
}

train::GptConfig model_of(const PlanOptions& o) {
  const std::int64_t width = o.width > 0 ? o.width : o.heads * o.head_dim;
  const std::int64_t hidden = o.hidden > 0 ? o.hidden : train::GptConfig::swiglu_hidden(width);
  train::GptConfig m{256, o.layers, width, o.heads, o.kv_heads > 0 ? o.kv_heads : o.heads, o.head_dim, hidden};
  if (const std::string e = m.error(); !e.empty()) throw Error(e);
  return m;
}

// The balancer's input for `world` ranks (checked: throws Error).
// a2a+p2p's memory depends on its split [inner, outer] of the group, which the balancer picks
// by speed after the cap is checked: a group is priced at the most any valid split needs, so a
// group that fits the cap fits whichever split runs (0 when none is valid: the planner's rows
// then refuse the group with their own reason).
double most_memory_of_splits(train::TrainConfig cfg, int cp) {
  if (cp == 1) return train::predict_memory(cfg, cp).total();
  double most = 0;
  const Shape q{cfg.batch, cfg.seq, cfg.model.heads, cfg.model.head_dim};
  for (int inner = 1; inner <= cp; ++inner) {
    if (cp % inner != 0) continue;
    cfg.cp.hierarchical_context_parallel_sizes = {inner, cp / inner};
    try {
      validate_cp_config(cfg.cp, cp, q, cfg.model.kv_heads);
    } catch (const Error&) {
      continue;
    }
    most = std::max(most, train::predict_memory(cfg, cp).total());
  }
  return most;
}

BalanceInput balance_input(const PlanOptions& o, int world) {
  BalanceInput in;
  in.lengths = parse_lengths(o.lengths);
  in.world = world;
  in.dp = o.dp;
  in.cp_comm_type = o.cp_comm_type;
  in.max_tokens_per_rank = o.max_tokens_per_rank;
  const train::GptConfig m = model_of(o);
  in.model.heads = m.heads;
  in.model.kv_heads = m.kv_heads;
  in.model.head_dim = m.head_dim;
  in.model.layers = m.layers;
  in.model.causal = true;
  in.model.dtype = o.calibrate ? DType::f32 : parse_dtype(o.dtype);
  in.model.cluster.ranks_per_node = o.ranks_per_node;
  in.model.cluster.intra = {parse_bandwidth(o.intra_bw), parse_latency(o.intra_lat)};
  in.model.cluster.inter = {parse_bandwidth(o.inter_bw), parse_latency(o.inter_lat)};
  in.model.cluster.peak_flops = o.tflops * 1e12;
  in.model.cluster.efficiency = o.efficiency;
  in.gemm_flops_per_token = 6.0 * double(m.num_params());  // dense: forward 2, backward 4 per weight
  if (o.max_memory_given) {
    in.max_memory = train::parse_bytes(o.max_memory);
    train::TrainConfig cfg;
    cfg.model = m;
    cfg.batch = 1;
    cfg.dtype = in.model.dtype;
    cfg.cp.cp_comm_type = o.cp_comm_type;
    in.memory_per_rank = [cfg](std::int64_t len, int cp) mutable {
      cfg.seq = len;
      return find_strategy(cfg.cp.cp_comm_type).hierarchical() ? most_memory_of_splits(cfg, cp)
                                                               : train::predict_memory(cfg, cp).total();
    };
  }
  return in;
}

// "1x30 2x2 8x1": group size x how many sequences use it.
std::string size_summary(const BalancePlan& p) {
  std::map<int, int> used;
  for (const BalanceGroup& g : p.groups) ++used[g.size];
  std::string s;
  for (const auto& [size, n] : used) s += fmt::format("{}{}x{}", s.empty() ? "" : " ", size, n);
  return s;
}

double busiest_over_mean(const BalancePlan& p) {
  const double most = *std::max_element(p.rank_busy_seconds.begin(), p.rank_busy_seconds.end());
  const double mean =
      std::accumulate(p.rank_busy_seconds.begin(), p.rank_busy_seconds.end(), 0.0) / double(p.rank_busy_seconds.size());
  return mean > 0 ? most / mean : 1.0;
}

double largest(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// max_memory_per_rank is null where no memory model priced the plan (no --max-memory).
nlohmann::json plan_json(const BalancePlan& p, bool memory_priced) {
  nlohmann::json groups = nlohmann::json::array();
  for (const BalanceGroup& g : p.groups) groups.push_back({g.first_rank, g.size});
  return {{"policy", policy_name(p.policy)},
          {"step_seconds", p.step_seconds},
          {"group_sizes", size_summary(p)},
          {"busiest_over_mean_work", busiest_over_mean(p)},
          {"max_bytes_per_rank", largest(p.rank_bytes)},
          {"max_memory_per_rank", memory_priced ? nlohmann::json(largest(p.rank_memory)) : nlohmann::json()},
          {"groups", groups},
          {"rank_seconds", p.rank_seconds},
          {"rank_busy_seconds", p.rank_busy_seconds},
          {"sequence_seconds", p.sequence_seconds}};
}

// One policy's plan at one world, as its table row and --json object need it (the plan itself,
// with a config a sequence, is dropped once these are read).
struct PolicyRow {
  double step = 0, busy_over_mean = 0, bytes = 0, memory = -1;  // memory: -1 where no model priced it
  std::string sizes, error;                                     // error: why a policy but dynamic cannot place the step
  nlohmann::json json;                                          // only when --json is asked
  std::exception_ptr fatal;  // dynamic's Error (the step cannot be planned), or any other exception
};

PolicyRow plan_row(const BalanceInput& in, BalancePolicy policy, bool json) {
  PolicyRow r;
  try {
    const BalancePlan p = balance(in, policy);
    r.step = p.step_seconds;
    r.busy_over_mean = busiest_over_mean(p);
    r.bytes = largest(p.rank_bytes);
    if (in.memory_per_rank) r.memory = largest(p.rank_memory);
    r.sizes = size_summary(p);
    if (json) r.json = plan_json(p, bool(in.memory_per_rank));
  } catch (const Error& e) {
    if (policy == BalancePolicy::dynamic) r.fatal = std::current_exception();  // the most permissive
    r.error = e.what();
    if (json) r.json = {{"policy", policy_name(policy)}, {"error", e.what()}};
  } catch (...) {
    r.fatal = std::current_exception();
  }
  return r;
}

// rows[k][p]: the plan of worlds[k] under kPolicies[p], the pairs planned at once (each plan is
// pure; they share `in.costs`, which is safe to) on `at_once` threads, the
// largest worlds' dynamic plans (the longest) first. A world after one whose dynamic plan failed
// is not planned: the output stops there, as it did when the worlds were planned in turn.
std::vector<std::array<PolicyRow, 3>> plan_rows(const BalanceInput& in, const std::vector<int>& worlds, bool json,
                                                std::size_t at_once) {
  std::vector<std::array<PolicyRow, 3>> rows(worlds.size());
  std::vector<std::pair<std::size_t, std::size_t>> tasks;  // (world, policy), longest first
  for (std::size_t p = 3; p-- > 0;)
    for (std::size_t k = worlds.size(); k-- > 0;) tasks.emplace_back(k, p);
  std::stable_sort(tasks.begin(), tasks.end(),
                   [&](const auto& a, const auto& b) { return worlds[a.first] > worlds[b.first]; });
  // A dynamic plan builds its candidates on threads of its own: all `at_once` for one world, none
  // where the worlds' plans fill them.
  const int inner = int(std::max<std::size_t>(1, at_once / worlds.size()));
  std::atomic<std::size_t> next{0}, failed{worlds.size()};  // failed: the first world whose dynamic plan threw
  auto work = [&] {
    for (std::size_t t; (t = next++) < tasks.size();) {
      const std::size_t k = tasks[t].first, p = tasks[t].second;
      if (k > failed.load()) continue;
      BalanceInput x = in;  // its own memory_per_rank, which keeps state between calls
      x.world = worlds[k];
      x.threads = inner;
      rows[k][p] = plan_row(x, kPolicies[p], json);
      if (rows[k][p].fatal)
        for (std::size_t f = failed.load(); k < f && !failed.compare_exchange_weak(f, k);) {
        }
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < std::min(at_once, tasks.size()); ++i) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  return rows;
}

// One world's table; a policy that cannot place the step prints (and records) why.
nlohmann::json print_world(const BalanceInput& in, const std::array<PolicyRow, 3>& rows, bool json) {
  fmt::print("world {} ({} per node), dp {} for static:\n", in.world, in.model.cluster.ranks_per_node, in.dp);
  fmt::print("  {:<8} {:>12} {:>10} {:>10} {:>12} {:>12}  {}\n", "policy", "step s", "vs static", "busy/mean",
             "MB sent/rk", "mem MB/rk", "group sizes (size x sequences)");
  nlohmann::json out;
  if (json) out = {{"world", in.world}, {"dp", in.dp}, {"policies", nlohmann::json::array()}};
  double static_s = 0;
  for (std::size_t p = 0; p < 3; ++p) {
    const PolicyRow& r = rows[p];
    if (r.fatal) std::rethrow_exception(r.fatal);
    if (!r.error.empty()) {
      fmt::print("  {:<8} cannot place the step: {}\n", policy_name(kPolicies[p]), r.error);
    } else {
      if (kPolicies[p] == BalancePolicy::static_) static_s = r.step;
      fmt::print("  {:<8} {:>12.5g} {:>10} {:>10.3f} {:>12.2f} {:>12}  {}\n", policy_name(kPolicies[p]), r.step,
                 static_s > 0 ? fmt::format("{:.2f}x", static_s / r.step) : "-", r.busy_over_mean, r.bytes / 1e6,
                 r.memory < 0 ? "-" : fmt::format("{:.1f}", r.memory / 1e6), r.sizes);
    }
    if (json) out["policies"].push_back(r.json);
  }
  return out;
}

}  // namespace

void check_plan_option_effects(const PlanOptions& o, int ranks) {
  auto given = [&](const char* flag) { return std::find(o.given.begin(), o.given.end(), flag) != o.given.end(); };
  const bool lengths = !o.lengths.empty(), plain = !o.train && !lengths;
  const char* mode = o.train ? "--train" : "--lengths";
  auto refuse = [](const char* flag, const std::string& why, const char* advice = "drop it") {
    throw Error(fmt::format("{} has no effect {}: {}", flag, why, advice));
  };
  for (const char* flag : {"--world", "--dp", "--cp-comm-type", "--max-tokens-per-rank"})
    if (given(flag) && !lengths) refuse(flag, "without --lengths");
  if (given("--tile-rows") && !o.train) refuse("--tile-rows", "without --train");
  const bool decode = plain && o.mode == "decode";  // the row around the attention (plan_inference.hpp)
  for (const char* flag : {"--width", "--hidden"})
    if (given(flag) && plain && !decode) refuse(flag, "without --train, --lengths or --mode decode");
  if (given("--vocab") && !(decode && given("--width"))) refuse("--vocab", "without --mode decode --width");
  if (given("--hidden") && decode && !given("--width")) refuse("--hidden", "with --mode decode but no --width");
  for (const char* flag :
       {"--seq", "--docs", "--window", "--kv-seq", "--q-offset", "--scaling", "--svg", "--no-causal"})
    if (given(flag) && !plain) refuse(flag, fmt::format("with {} (it plans no --seq)", mode));
  // The offset places queries against the causal mask (and a window): with neither, every query
  // sees every key wherever it sits.
  if (given("--q-offset") && o.no_causal && o.window.empty())
    refuse("--q-offset", "with --no-causal and no --window (every query sees every key)");
  for (const char* flag : {"--intra-bw", "--intra-lat", "--inter-bw", "--inter-lat", "--tflops", "--efficiency",
                           "--ranks-per-node", "--json"})
    if (given(flag) && o.train) refuse(flag, "with --train (it sizes memory, not time)");
  // Presets and modes price one attention call; --train sizes memory and --lengths balances
  // training steps from the rates given as flags.
  for (const char* flag :
       {"--gpu", "--kernel", "--intra-fabric", "--inter-fabric", "--mode", "--memory-bw", "--cached"})
    if (given(flag) && !plain) refuse(flag, fmt::format("with {} (presets and modes are for a plan of --seq)", mode));
  for (const char* flag : {"--grid-runs", "--grid-clock"})
    if (given(flag) && o.grid.empty()) refuse(flag, "without --grid");
  if (!o.grid.empty() && !o.calibrate) refuse("--grid", "without --calibrate (it runs every strategy here)", "add it");
  if (!o.grid.empty())
    for (const char* flag : {"--seq", "--heads", "--kv-heads", "--head-dim", "--no-causal", "--docs", "--window",
                             "--kv-seq", "--q-offset", "--scaling", "--svg", "--cached", "--train", "--lengths"})
      if (given(flag)) refuse(flag, "with --grid (the grid sets the shapes)");
  if (o.heads <= 0 && o.grid.empty()) throw Error("--heads is required (unless --grid)");
  if (given("--batch") && lengths) refuse("--batch", "with --lengths (the step is its sequences)");
  if (given("--cp") && lengths) refuse("--cp", "with --lengths (every group's size is planned)");
  if (!o.calibrate) return;
  if (o.train) refuse("--calibrate", "with --train (it sizes memory, not time)");
  for (const char* flag :
       {"--world", "--cp", "--ranks-per-node", "--dtype", "--intra-bw", "--intra-lat", "--inter-bw", "--inter-lat",
        "--tflops", "--efficiency", "--gpu", "--kernel", "--intra-fabric", "--inter-fabric"})
    if (given(flag))
      refuse(flag,
             fmt::format("with --calibrate, which measures this machine and plans for the {} rank(s) it runs on "
                         "(in float32)",
                         ranks),
             "run on the ranks you mean, or drop it");
}

namespace {

// Rank 0's first lines: the step, the model and the machine it is planned for.
void print_lengths_header(const PlanOptions& o, const BalanceInput& in) {
  const train::GptConfig m = model_of(o);
  fmt::print(
      "ulysses plan --lengths: {} sequences ({} tokens; {}), {} parameters ({} layers, width {}, {} heads / {} "
      "KV heads of {}), cp_comm_type {}, {}{}\n",
      in.lengths.size(), std::accumulate(in.lengths.begin(), in.lengths.end(), std::int64_t(0)),
      describe_lengths(in.lengths).substr(0, 120), m.num_params(), m.layers, m.width, m.heads, m.kv_heads, m.head_dim,
      in.cp_comm_type, to_string(in.model.dtype),
      in.max_memory > 0 ? fmt::format(", at most {} per rank", train::format_bytes(in.max_memory)) : "");
  const Cluster& c = in.model.cluster;
  fmt::print(
      "  {}: intra {:.3g} GB/s, {:.3g} us; inter {:.3g} GB/s, {:.3g} us; attention {:.3g} TFLOP/s x {:.2f}; "
      "GEMMs {:.3g} TFLOP/s\n",
      o.calibrate ? "this machine (calibrated)" : "cluster model", c.intra.bandwidth / 1e9, c.intra.latency * 1e6,
      c.inter.bandwidth / 1e9, c.inter.latency * 1e6, c.peak_flops / 1e12, c.efficiency,
      (in.gemm_flops_rate > 0 ? in.gemm_flops_rate : c.peak_flops * c.efficiency) / 1e12);
}

}  // namespace

int run_plan_lengths(const PlanOptions& o) {
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  BalanceInput in;
  std::vector<int> worlds;
  double one_plan_bytes = 0;
  on_every_rank(comm, [&] {
    check_plan_option_effects(o, comm.size());
    if (o.calibrate)
      worlds = {comm.size()};
    else if (o.world > 0)
      worlds = {o.world};
    else
      for (int w = 2; w <= 1024; w *= 2) worlds.push_back(w);
    for (int w : worlds)
      if (w % o.dp != 0) throw Error(fmt::format("--dp {} does not divide the world size {}", o.dp, w));
    if (comm.rank() == 0) check_outputs({{"--json", o.json, true}});  // before any work
    in = balance_input(o, worlds.front());
    one_plan_bytes = admit_plan(in.lengths, worlds);
    if (o.calibrate) in.model.cluster.ranks_per_node = comm.size();
    check_lengths_input(in);
  });
  if (o.calibrate) {
    set_threads(default_threads(comm));
    const train::GptConfig m = model_of(o);
    const Calibration c = calibrate(comm, m.head_dim, in.model.dtype, m.width, m.hidden);
    in.model.cluster = c.cluster;
    in.gemm_flops_rate = c.gemm_flops;
  }
  on_root(comm, [&] {
    print_lengths_header(o, in);
    const Cluster& c = in.model.cluster;
    const bool json = !o.json.empty();
    nlohmann::json j;
    if (json)
      j = {{"lengths", in.lengths},
           {"cp_comm_type", in.cp_comm_type},
           {"gemm_flops_per_token", in.gemm_flops_per_token},
           {"max_memory", in.max_memory},
           {"peak_flops", c.peak_flops},
           {"efficiency", c.efficiency},
           {"calibrated", o.calibrate},
           {"gemm_flops_rate", in.gemm_flops_rate},
           {"worlds", nlohmann::json::array()}};
    // Each (length, size) priced once for all the worlds and policies, not once a world and
    // policy: a smaller world asks the sizes a larger one asked.
    in.costs = make_balance_costs();
    const auto rows = plan_rows(in, worlds, json, plans_at_once(one_plan_bytes, memo_bytes(in.lengths, worlds)));
    for (std::size_t k = 0; k < worlds.size(); ++k) {
      in.world = worlds[k];
      const nlohmann::json w = print_world(in, rows[k], json);
      if (json) j["worlds"].push_back(w);
    }
    if (json) write_file_atomic(o.json, j.dump(2) + "\n");
  });
  return 0;
}

}  // namespace ulysses::cli
