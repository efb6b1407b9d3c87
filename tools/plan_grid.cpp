// `ulysses plan --calibrate --grid quick|full`: the planner's choice against every strategy run
// for real, over a grid of shapes on this machine. One calibration per head dim; then rounds of
// one run of every valid row of every shape, interleaved so that a change of load reaches every
// row alike, each row keeping its fastest run (best of --grid-runs).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include "guard.hpp"
#include "plan_command.hpp"
#include "rank_errors.hpp"
#include "report.hpp"
#include "ulysses/core/cpu_clock.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/plan/calibrate_kernel.hpp"
#include "ulysses/cp/kernel_model.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/output_file.hpp"

namespace ulysses::cli {

namespace {

struct GridShape {
  std::int64_t seq, heads, kv_heads, head_dim;
  bool causal;
};

// The shapes of a grid: sequence 2k-32k, 4-32 heads, head dim 64 and 128, full and causal, GQA.
// Sized so that a shape's slowest row runs in seconds on a few CPU cores: the longest sequences
// with the fewest heads. quick: four small shapes, for the tests.
std::vector<GridShape> grid_shapes(const std::string& name) {
  if (name == "quick")
    return {{512, 4, 4, 16, true}, {512, 4, 2, 16, false}, {1024, 2, 2, 32, true}, {256, 8, 8, 16, true}};
  if (name != "full") throw Error(fmt::format("unknown --grid '{}' (use quick or full)", name));
  return {{2048, 4, 4, 64, true},    {2048, 8, 8, 64, true},  {2048, 16, 4, 64, true},   {2048, 32, 8, 64, true},
          {2048, 32, 32, 64, false}, {2048, 8, 2, 128, true}, {2048, 16, 16, 128, true}, {2048, 8, 8, 128, false},
          {4096, 4, 4, 64, true},    {4096, 8, 2, 64, true},  {4096, 16, 4, 64, true},   {4096, 8, 8, 64, false},
          {4096, 4, 4, 128, true},   {4096, 8, 8, 128, true}, {4096, 4, 1, 128, false},  {8192, 4, 4, 64, true},
          {8192, 8, 2, 64, true},    {8192, 4, 4, 64, false}, {8192, 4, 4, 128, true},   {8192, 8, 8, 128, true},
          {16384, 4, 4, 64, true},   {16384, 4, 1, 64, true}, {16384, 4, 4, 128, true},  {32768, 4, 4, 64, true}};
}

std::string shape_name(const GridShape& g) {
  return fmt::format("s {} h {} (kv {}) d {} {}", g.seq, g.heads, g.kv_heads, g.head_dim, g.causal ? "causal" : "full");
}

struct GridCase {
  GridShape shape;
  PlanInput in;
  Plan plan;
  std::vector<double> best;  // per row: the fastest run (-1: invalid row)
  TieBand tie;               // the band the shape is planned with (plan_with_measured_bands)
  KernelModel cache;         // the calibrated kernel with its cache term, priced only by plan_with_cache
};

// Every shape's checked input, with the options' mode, layers, batch and timeout.
std::vector<GridCase> grid_cases(const PlanOptions& o, int ranks) {
  std::vector<GridCase> cases;
  for (const GridShape& g : grid_shapes(o.grid)) {
    PlanOptions s = o;
    s.seq = g.seq, s.heads = g.heads, s.kv_heads = g.kv_heads, s.head_dim = g.head_dim, s.no_causal = !g.causal;
    cases.push_back({g, plan_request(s, ranks).in, {}, {}, {}, {}});
  }
  return cases;
}

}  // namespace

AttentionRates cpu_attention_rates(Communicator& comm, std::int64_t d) {
  const AttentionRates r = attention_rates(d, DType::f32, process_cpu_seconds);
  double per_flop[2] = {1.0 / r.forward, r.backward_ratio / r.forward};  // the slowest rank's
  comm.allreduce_max(per_flop, 2);
  return {1.0 / per_flop[0], per_flop[1] / per_flop[0]};
}

double cpu_prefill_rate(Communicator& comm, std::int64_t d, std::int64_t heads, std::int64_t keys,
                        double pack_s_per_byte) {
  const std::int64_t n = std::min(kPrefillProbeQueries, keys);
  Tensor q({1, n, heads, d}), k({1, keys, heads, d}), v(k.shape()), o(q.shape());
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
  const Tensor lse = lse_tensor(q.shape());
  const AttentionParams p{.causal = true, .q_offset = keys - n};
  std::vector<double> t;
  for (int i = 0; i < 4; ++i) {
    const double t0 = process_cpu_seconds();
    flash_attention_forward(o.view(), lse.view(), q.view(), k.view(), v.view(), p);
    if (i > 0) t.push_back(process_cpu_seconds() - t0);
  }
  // The call's pack of its K and V (once a call, however many queries: a prompt's call amortises
  // it, this probe's would not), priced apart as the planner prices it.
  const double pack = pack_s_per_byte * 2 * double(keys * heads * d) * 4;
  double seconds = median(t) - pack;
  comm.allreduce_max(&seconds, 1);
  // Query i (at keys − n + i) sees keys − n + i + 1 keys.
  const double pairs = double(n) * double(keys - n) + double(n) * double(n + 1) / 2;
  return 4 * double(heads) * double(d) * pairs / seconds;
}

// A calibrated cluster in CPU seconds: the attention rate measured so, and the links scaled by
// the same factor (wall rate over CPU rate): inside one machine a transfer is a copy the CPUs
// make, slowed by the load as the kernel is.
void cpu_time_cluster(Communicator& comm, PlanInput& in) {
  Cluster& c = in.cluster;
  const double es = double(dtype_size(DType::f32));  // cpu_attention_rates' dtype
  const double wall = rate_of_kernel_peak(c.kernel, c.peak_flops, in.head_dim, es);
  const AttentionRates cpu = cpu_attention_rates(comm, in.head_dim);
  const double load = std::max(1.0, cpu.forward / wall);
  calibrate_stream(comm, in.head_dim, in.dtype, process_cpu_seconds, 5, c.kernel);
  c.peak_flops = kernel_peak_of_rate(c.kernel, cpu.forward, in.head_dim, es);
  c.kernel.backward_ratio = cpu.backward_ratio;
  for (Link* l : {&c.intra, &c.inter, &c.alltoall_intra, &c.inter_concurrent}) {
    l->bandwidth *= load;
    l->latency /= load;
  }
  c.kernel.call_s /= load;  // the fixed cost per call is the CPUs' work too
  // The merge and the copy timed again in CPU seconds, as the steps are: scaled by a load
  // measured at another moment, the merge's rate moved 3-8x between calibrations.
  calibrate_merge(comm, in.head_dim, process_cpu_seconds, 15, c.kernel);
  calibrate_pack(comm, in.head_dim, in.dtype, process_cpu_seconds, 7, c.kernel);
}

namespace {

// One calibration of every head dim of the grid (the attention rate and kernel curve depend on
// it; the links do not), keeping per head dim the fastest attention rate of the rounds so far:
// the best of N, as each row keeps its fastest run.
// With the CPU clock the attention rate is measured in CPU seconds too (the links and the
// kernel curve keep calibrate()'s).
void calibrate_round(Communicator& comm, std::vector<GridCase>& cases, std::map<std::int64_t, Cluster>& best,
                     StepClock clock) {
  std::map<std::int64_t, bool> done;
  for (GridCase& c : cases) {
    if (done[c.in.head_dim]) continue;
    done[c.in.head_dim] = true;
    calibrate_cluster(comm, c.in);
    if (clock == StepClock::cpu) cpu_time_cluster(comm, c.in);
    // The causal diagonal's extra, reported beside the plan, not in it (perf.md v46: priced, it
    // scaled every block off the diagonal up by the rate's 2048-token diagonal and the rows
    // within 20 % fell from 140 to 129 of 158 on the same runs); after the rate's scaling.
    calibrate_causal_half(comm, c.in.head_dim, c.in.dtype, process_cpu_seconds, 15, c.in.cluster.kernel);
    // The cache term, reported beside the plan (plan_with_cache), timed as the steps are.
    calibrate_cache(
        comm, c.in.head_dim, c.in.dtype,
        clock == StepClock::cpu ? std::function<double()>(process_cpu_seconds) : [&] { return comm.now(); }, 5,
        c.in.cluster.kernel);
    auto it = best.find(c.in.head_dim);
    if (it == best.end() || c.in.cluster.peak_flops > it->second.peak_flops) best[c.in.head_dim] = c.in.cluster;
  }
}

// Each valid row's predicted and measured seconds (invalid rows: measured 0, not run).
std::vector<ValidatedRow> validated_rows(const GridCase& c) {
  std::vector<ValidatedRow> rows;
  for (std::size_t i = 0; i < c.plan.rows.size(); ++i)
    rows.push_back({c.plan.rows[i].predicted_step_s, c.plan.rows[i].valid ? c.best[i] : 0.0});
  return rows;
}

// Plans every shape again with the tie band measured on the other shapes (the model's error
// between strategies on this machine, none of it from the shape itself); memory decides a tie
// only under --max-memory.
void plan_with_measured_bands(std::vector<GridCase>& cases) {
  std::vector<std::vector<ValidatedRow>> all;
  for (const GridCase& c : cases) all.push_back(validated_rows(c));
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::vector<ValidatedRow>> others = all;
    others.erase(others.begin() + std::ptrdiff_t(i));
    const MeasuredBand m = measured_tie_band(others);
    cases[i].tie = calibrated_tie_band(m, fmt::format("on the grid's other {} shapes", others.size()),
                                       cases[i].in.max_memory_bytes > 0);
    cases[i].plan = make_plan(cases[i].in, cases[i].tie);
  }
}

// Rounds of one calibration and one run of every valid row of every shape, interleaved; each row
// keeps its fastest run. Then every shape is planned with its head dim's best calibration.
void measure_grid(Communicator& comm, std::vector<GridCase>& cases, int rounds, StepClock clock) {
  std::map<std::int64_t, Cluster> clusters;
  for (GridCase& c : cases) {
    c.plan = make_plan(c.in);  // the rows to run; planned again below for this machine
    for (const PlanRow& r : c.plan.rows) c.best.push_back(r.valid ? INFINITY : -1);
  }
  for (int round = 0; round < rounds; ++round) {
    const double t0 = comm.now();
    calibrate_round(comm, cases, clusters, clock);
    for (GridCase& c : cases) {
      c.in.cluster = clusters.at(c.in.head_dim);
      c.plan = make_plan(c.in);
      for (std::size_t i = 0; i < c.plan.rows.size(); ++i) {
        if (!c.plan.rows[i].valid) continue;
        // A strategy's first call sets up its groups and buffers: a row predicted at a second or
        // less runs twice and keeps the second (warm) run, as the plain --calibrate does.
        const int runs = c.plan.rows[i].predicted_step_s < 1 ? 2 : 1;
        const double t = measure_runs(comm, c.in, c.plan.rows[i].config, runs, clock).back();
        c.best[i] = std::min(c.best[i], t * double(c.in.layers));
      }
    }
    if (comm.rank() == 0)
      fmt::print(stderr, "grid: round {} of {} took {:.0f} s\n", round + 1, rounds, comm.now() - t0);
  }
  for (GridCase& c : cases) {
    c.in.cluster = clusters.at(c.in.head_dim);
    // The cache term is reported beside the plan, not in it: on a quiet machine it moved the
    // pick away from a2a where a2a measured fastest (docs/perf.md).
    c.cache = c.in.cluster.kernel;
    c.in.cluster.kernel.cache_bytes = 0;
    c.in.cluster.kernel.past_cache_extra = 0;
    c.in.cluster.kernel.causal_half = 0;
    c.plan = make_plan(c.in);
  }
  plan_with_measured_bands(cases);
  if (comm.rank() == 0)
    for (const auto& [d, k] : clusters)
      fmt::print(
          "calibrated head dim {} (best of {}): attention {:.2f} GFLOP/s per rank (the forward; the backward "
          "{:.2f}x its seconds), kernel half rate at {:.0f} "
          "keys, causal diagonal's extra {:.0f} keys, {:.1f} us per call, merge {:.1f} passes at {:.2f} GB/s, K/V pack "
          "{:.3f} ns per byte, a call's working set past {:.1f} MiB {:.3f} ns per byte, past the {:.0f} "
          "KiB cache "
          "{:.2f}x the time; send/recv "
          "{:.2f} GB/s, {:.1f} us, a ring step's transfer hidden {:.2f} (between nodes {:.2f}); all-to-all {:.2f} "
          "GB/s\n",
          d, rounds, k.peak_flops / 1e9, k.kernel.backward_ratio, k.kernel.kv_half, k.kernel.causal_half,
          k.kernel.call_s * 1e6, k.kernel.merge_passes, k.kernel.memory_bandwidth / 1e9,
          k.kernel.kv_pack_s_per_byte * 1e9, k.kernel.stream_cache_bytes / (1 << 20), k.kernel.stream_s_per_byte * 1e9,
          k.kernel.cache_bytes / 1024, 1 + k.kernel.past_cache_extra, k.intra.bandwidth / 1e9, k.intra.latency * 1e6,
          k.intra.overlap, k.inter.overlap, k.alltoall_intra.bandwidth / 1e9);
}

// This machine's load (/proc/loadavg's 1, 5 and 15 minute averages; "?" where there is none):
// the grid's timings are only as steady as the machine is quiet.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  return f >> a >> b >> c ? a + " " + b + " " + c : "?";
}

// The valid row of least predicted time (the first on a tie).
int predicted_fastest(const Plan& p) {
  int best = -1;
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].valid && (best < 0 || p.rows[i].predicted_step_s < p.rows[std::size_t(best)].predicted_step_s))
      best = int(i);
  return best;
}

struct GridTally {
  int shapes = 0, recommended_within = 0, fastest_within = 0, rows = 0, rows_within = 0;
};

// The index of the measured fastest row (valid rows only).
std::size_t measured_fastest(const std::vector<double>& best) {
  return std::size_t(
      std::min_element(best.begin(), best.end(), [](double a, double b) { return b < 0 || (a >= 0 && a < b); }) -
      best.begin());
}

// Adds plan `p` of one shape to `t`: its picks against the measured fastest (within 5 %) and its
// rows predicted within 20 % of their measurement.
void tally(const Plan& p, const std::vector<double>& best, GridTally& t) {
  const double fastest = best[measured_fastest(best)];
  t.shapes += 1;
  t.recommended_within += best[std::size_t(p.best)] / fastest <= 1.05;
  t.fastest_within += best[std::size_t(predicted_fastest(p))] / fastest <= 1.05;
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].valid) t.rows += 1, t.rows_within += std::abs(best[i] / p.rows[i].predicted_step_s - 1) <= 0.2;
}

// The plan of `in` with the calibrated cache term (a call's K/V past the core's cache) priced,
// the same tie band: on the same measurements, what the term would change.
Plan plan_with_cache(PlanInput in, const TieBand& tie, const KernelModel& calibrated) {
  in.cluster.kernel.cache_bytes = calibrated.cache_bytes;
  in.cluster.kernel.past_cache_extra = calibrated.past_cache_extra;
  return make_plan(in, tie);
}

// The plan of `in` as the model stood before it counted the ring's calls per visible chunk pair:
// one call per ring step. On the same measurements, what the count changes.
Plan plan_before_ring_pairs(PlanInput in, const TieBand& tie) {
  in.cluster.kernel.ring_pair_calls = false;
  return make_plan(in, tie);
}

// The plan of `in` without the stream term (a call's working set past the cache), its rate
// scaled again from the same measured rate: on the same measurements, what the term changes.
Plan plan_without_stream(PlanInput in, const TieBand& tie) {
  KernelModel& k = in.cluster.kernel;
  const double es = double(dtype_size(DType::f32));  // cpu_attention_rates' dtype
  const double rate = rate_of_kernel_peak(k, in.cluster.peak_flops, in.head_dim, es);
  k.stream_s_per_byte = 0;
  in.cluster.peak_flops = kernel_peak_of_rate(k, rate, in.head_dim, es);
  return make_plan(in, tie);
}

// The plan with every ring transfer hidden up to its step's compute (Link::overlap 1), the model
// before the overlap was measured: its counts on the same runs.
Plan plan_full_overlap(PlanInput in, const TieBand& tie) {
  for (Link* l : {&in.cluster.intra, &in.cluster.inter, &in.cluster.cross_socket}) l->overlap = 1, l->overlap_calls = 0;
  return make_plan(in, tie);
}

// The counts of the plan and of the variants priced beside it, over the same runs.
struct GridTallies {
  GridTally plan, cached, before, unstreamed, full_overlap;
};

// One shape's line and JSON; adds it to the tallies (cached: plan_with_cache's; before:
// plan_before_ring_pairs'; unstreamed: plan_without_stream's; full_overlap: plan_full_overlap's).
nlohmann::json report_case(const GridCase& c, GridTallies& all) {
  GridTally& t = all.plan;
  const Plan& p = c.plan;
  const std::size_t fastest = measured_fastest(c.best), rec = std::size_t(p.best),
                    pred = std::size_t(predicted_fastest(p));
  const Plan old = plan_with_cache(c.in, c.tie, c.cache);
  const int close = t.rows_within;
  tally(p, c.best, t);
  tally(old, c.best, all.cached);
  const Plan steps = plan_before_ring_pairs(c.in, c.tie), full = plan_full_overlap(c.in, c.tie),
             unstreamed = plan_without_stream(c.in, c.tie);
  tally(steps, c.best, all.before);
  tally(unstreamed, c.best, all.unstreamed);
  tally(full, c.best, all.full_overlap);
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].valid)
      rows.push_back({{"name", p.rows[i].name},
                      {"predicted_s", p.rows[i].predicted_step_s},
                      {"predicted_with_cache_s", old.rows[i].predicted_step_s},
                      {"predicted_before_ring_pairs_s", steps.rows[i].predicted_step_s},
                      {"predicted_without_stream_s", unstreamed.rows[i].predicted_step_s},
                      {"predicted_full_overlap_s", full.rows[i].predicted_step_s},
                      {"measured_s", c.best[i]}});
  fmt::print("{:<34} {:<16} {:>6.2f} {:<16} {:>6.2f} {:<16} {:>9.4f} {:>9.2f} {:>5}/{} {}\n", shape_name(c.shape),
             p.rows[rec].name, c.best[rec] / c.best[fastest], p.rows[pred].name, c.best[pred] / c.best[fastest],
             p.rows[fastest].name, c.best[fastest], c.best[rec] / p.rows[rec].predicted_step_s, t.rows_within - close,
             rows.size(), old.rows[std::size_t(old.best)].name);
  return {{"seq", c.shape.seq},
          {"heads", c.shape.heads},
          {"kv_heads", c.shape.kv_heads},
          {"head_dim", c.shape.head_dim},
          {"causal", c.shape.causal},
          {"recommended", p.rows[rec].name},
          {"recommended_with_cache", old.rows[std::size_t(old.best)].name},
          {"predicted_fastest", p.rows[pred].name},
          {"predicted_fastest_full_overlap", full.rows[std::size_t(predicted_fastest(full))].name},
          {"measured_fastest", p.rows[fastest].name},
          {"tie_band", c.tie.band},
          {"recommendation", p.recommendation},
          {"rows", rows}};
}

nlohmann::json tally_json(const GridTally& t) {
  return {{"recommended_within_5_percent", t.recommended_within},
          {"predicted_fastest_within_5_percent", t.fastest_within},
          {"rows_within_20_percent", t.rows_within},
          {"rows", t.rows}};
}

// Prints the shapes' tie bands (plan_with_measured_bands) and returns their median.
double print_tie_bands(const std::vector<GridCase>& cases) {
  if (cases.empty()) return 0;
  std::vector<double> bands;
  for (const GridCase& c : cases) bands.push_back(c.tie.band);
  const auto [lo, hi] = std::minmax_element(bands.begin(), bands.end());
  fmt::print(
      "grid: tie band {:.1f}% (median; {:.1f}-{:.1f}% by shape), each shape's measured on the other shapes: the "
      "median over their pairs of strategies of how far the predicted ratio is from the measured one; memory "
      "decides {}\n",
      100 * median(bands), 100 * *lo, 100 * *hi, cases.front().tie.memory_decides ? "a tie (--max-memory)" : "no tie");
  return median(bands);
}

// Rank 0: the table, the counts (and plan_with_cache's), and the JSON of every
// shape.
nlohmann::json report_grid(const std::vector<GridCase>& cases, int rounds) {
  fmt::print("{:<34} {:<16} {:>6} {:<16} {:>6} {:<16} {:>9} {:>9} {:>7} {}\n", "shape", "recommended", "x best",
             "predicted best", "x best", "measured best", "best s", "rec m/p", "rows20%", "with cache");
  GridTallies all;
  const GridTally &t = all.plan, &cached = all.cached, &before = all.before, &unstreamed = all.unstreamed,
                  &full = all.full_overlap;
  nlohmann::json shapes = nlohmann::json::array();
  for (const GridCase& c : cases) shapes.push_back(report_case(c, all));
  fmt::print(
      "grid: the recommendation measures within 5% of the fastest in {} of {} shapes, the predicted fastest in {} of "
      "{}; predicted step times within 20% of measured in {} of {} rows (best of {} interleaved runs)\n",
      t.recommended_within, t.shapes, t.fastest_within, t.shapes, t.rows_within, t.rows, rounds);
  fmt::print(
      "grid with the cache term (a call's K/V past the core's cache), the same runs: the recommendation within "
      "5% in {} of {}, the predicted fastest in {}; rows within 20% in {} of {}\n",
      cached.recommended_within, cached.shapes, cached.fastest_within, cached.rows_within, cached.rows);
  fmt::print(
      "grid with one call per ring step (the model before it counted the ring's calls per chunk pair), the "
      "same runs: the recommendation within 5% in {} of {}, the predicted fastest in "
      "{}; rows within 20% in {} of {}\n",
      before.recommended_within, before.shapes, before.fastest_within, before.rows_within, before.rows);
  fmt::print(
      "grid without the stream term (a call's working set past the cache), the same runs: the recommendation "
      "within 5% in {} of {}, the predicted fastest in {}; rows within 20% in {} of {}\n",
      unstreamed.recommended_within, unstreamed.shapes, unstreamed.fastest_within, unstreamed.rows_within,
      unstreamed.rows);
  fmt::print(
      "grid with the ring's transfers hidden in full (the model before it measured the overlap), the same runs: the "
      "recommendation within 5% in {} of {}, the predicted fastest in {}; rows within 20% in {} of {}\n",
      full.recommended_within, full.shapes, full.fastest_within, full.rows_within, full.rows);
  nlohmann::json j = tally_json(t);
  j["tie_band"] = print_tie_bands(cases);
  j["shapes"] = shapes;
  j["runs"] = rounds;
  j["with_cache"] = tally_json(cached);
  j["before_ring_pairs"] = tally_json(before);
  j["without_stream"] = tally_json(unstreamed);
  j["full_overlap"] = tally_json(full);
  return j;
}

}  // namespace

int run_plan_grid(const PlanOptions& o) {
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  std::vector<GridCase> cases;
  const int node_ranks = comm.ranks_on_this_node();  // collective: outside the checks
  on_every_rank(comm, [&] {
    check_plan_option_effects(o, comm.size());
    if (comm.rank() == 0) check_outputs({{"--json", o.json, true}});  // before any work
    cases = grid_cases(o, comm.size());
    double most = 0;
    for (const GridCase& c : cases) most = std::max(most, measured_memory(c.in));
    check_memory("ulysses plan --grid (every strategy of every shape run for real)", most, 0, node_ranks);
  });
  const std::string load = load_average();
  const StepClock clock = o.grid_clock == "wall" ? StepClock::wall : StepClock::cpu;
  measure_grid(comm, cases, o.grid_runs, clock);
  on_root(comm, [&] {
    nlohmann::json j = report_grid(cases, o.grid_runs);
    j["load_average"] = {load, load_average()};
    j["clock"] = o.grid_clock;
    fmt::print("timed in {} seconds; load average (1, 5, 15 min) at the start: {}; at the end: {}\n", o.grid_clock,
               load, load_average());
    if (!o.json.empty()) write_files_atomic({{o.json, j.dump(2) + "\n"}});
  });
  return 0;
}

}  // namespace ulysses::cli
