// Section 4 ("seed"): the seed's ring-vs-Ulysses comparison (shared/seeds/, section 3), every
// row measured on our kernels and communicator (docs/seed_claims.md reads it).
//
//   claims 1, 2, 6  real runs on sub-communicators of cp = 2, 4, 8 ranks (as many as the job
//                   has): counted operations, messages and bytes against the formulas, and the
//                   peak working memory per rank; bytes against cp up to 64 from the formulas
//   claim 3         a2a, p2p (zigzag and contiguous) and all_gather on 2 ranks: compute and
//                   exposed communication per rank, and a Chrome trace of one fwd+bwd each
//   claims 4, 5     rank 0 alone (seed_kernels.cpp): per-rank kernel time under causal
//                   masks, and GFLOP/s per call shape
//   claim 7         the valid-cp table of common models from the library's validation
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "bench.hpp"
#include "seed.hpp"
#include "seed_kernels.hpp"
#include "svg.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/core/threads.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::bench {

namespace {

using nlohmann::json;

// This rank's shards of a causal layer with global q and kv_heads KV heads.
struct Layer {
  Tensor q, k, v, out, dout, dq, dk, dv;
  Layer(const CpConfig& cfg, int cp, int rank, const Shape& g, std::int64_t kv_heads) {
    const auto chunks = rank_chunks(cfg, cp, rank, g.s);
    const Shape qs{g.b, total_tokens(chunks), g.h, g.d}, ks{g.b, qs.s, kv_heads, g.d};
    q = Tensor(qs), out = Tensor(qs), dout = Tensor(qs), dq = Tensor(qs);
    k = Tensor(ks), v = Tensor(ks), dk = Tensor(ks), dv = Tensor(ks);
    for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) fill_uniform_shard(t->view(), seed, chunks);
  }
  CpStats run(ContextParallelAttention& attn) const {
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    CpStats s = attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
    return s += ctx.stats();
  }
};

json traffic_json(const seed::Traffic& t) { return {{"calls", t.calls}, {"messages", t.messages}, {"bytes", t.bytes}}; }

// Claims 1, 2, 6 for one configuration: counters of one forward and one backward against the
// formulas on every rank, and the peak working memory over local q+k+v (busiest rank).
json counted_run(Communicator& comm, const CpConfig& cfg, const seed::PlotShape& shape) {
  const int cp = comm.size();
  const Layer l(cfg, cp, comm.rank(), shape.q, shape.kv_heads);
  ContextParallelAttention attn(comm, cfg);
  comm.reset_counters();
  reset_tensor_bytes_peak();
  const std::int64_t base = tensor_bytes_in_use();
  const CpContext ctx = attn.forward(l.out.view(), l.q.view(), l.k.view(), l.v.view());
  const seed::Traffic fwd = seed::counted_traffic(comm.counters());
  comm.reset_counters();
  attn.backward(ctx, l.dq.view(), l.dk.view(), l.dv.view(), l.dout.view());
  const seed::Traffic bwd = seed::counted_traffic(comm.counters());
  std::int64_t peak = tensor_bytes_peak() - base;
  const auto formula = [&](bool backward) {
    return seed::formula_traffic(cfg, cp, comm.rank(), shape.q, shape.kv_heads, DType::f32, backward);
  };
  std::int64_t match = fwd == formula(false) && bwd == formula(true);
  comm.allreduce_min(&match, 1);
  comm.allreduce_max(&peak, 1);
  const double local_qkv = double(l.q.shape().numel() + 2 * l.k.shape().numel()) * 4;
  return {{"strategy", cfg.cp_comm_type},
          {"shape", shape.name},
          {"cp", cp},
          {"forward", traffic_json(fwd)},
          {"backward", traffic_json(bwd)},
          {"forward_formula", traffic_json(formula(false))},
          {"backward_formula", traffic_json(formula(true))},
          {"all_ranks_match_formula", match == 1},
          {"seed_forward_calls", seed::seed_forward_calls(cfg.cp_comm_type, cp)},
          {"peak_over_local_qkv", double(peak) / local_qkv}};
}

// Collective over world: `fn(sub)` on the first cp ranks while the others sleep.
template <class Fn>
void on_first_ranks(Communicator& world, int cp, Fn&& fn) {
  const std::unique_ptr<Communicator> sub = world.split(world.rank() < cp ? 0 : 1, world.rank());
  if (world.rank() < cp) fn(*sub);
  idle_barrier(MPI_COMM_WORLD);
}

json counted_runs(Communicator& world) {
  json rows = json::array();
  for (int cp : seed::run_cps()) {
    if (cp > world.size()) continue;
    on_first_ranks(world, cp, [&](Communicator& sub) {
      for (const seed::PlotShape& shape : seed::run_shapes())
        for (const char* strategy : {"a2a", "p2p", "all_gather"}) {
          const json row = counted_run(sub, CpConfig{strategy, {}, true}, shape);
          if (sub.rank() == 0) rows.push_back(row);
        }
    });
  }
  return rows;
}

// Claim 2: forward bytes per rank against cp from the library's formulas (busiest rank).
json formula_curves(std::vector<svg::Series>& plot) {
  json rows = json::array();
  for (const seed::PlotShape& shape : seed::plot_shapes())
    for (const char* strategy : {"a2a", "p2p"}) {
      svg::Series line{fmt::format("{} {}", strategy, shape.name), {}, {}};
      for (int cp = 2; cp <= 64; cp *= 2) {
        const std::int64_t bytes =
            predicted_comm_volume({strategy, {}, true}, cp, shape.q, shape.kv_heads, DType::bf16).total_forward_bytes();
        line.x.push_back(cp);
        line.y.push_back(double(bytes) / 1e6);
        rows.push_back({{"strategy", strategy}, {"shape", shape.name}, {"cp", cp}, {"forward_bytes", bytes}});
      }
      plot.push_back(line);
    }
  return rows;
}

// Claim 3 (and claim 4 on real ranks): compute and exposed communication per rank, medians.
json overlap_run(Communicator& comm, const CpConfig& cfg, const std::string& name, const Shape& g, int reps) {
  const Layer l(cfg, comm.size(), comm.rank(), g, g.h);
  ContextParallelAttention attn(comm, cfg);
  l.run(attn);  // warm-up
  std::vector<double> compute, exposed, total;
  for (int i = 0; i < reps; ++i) {
    comm.barrier();
    const double t0 = comm.now();
    const CpStats s = l.run(attn);
    total.push_back(slowest(comm, comm.now() - t0));
    compute.push_back(s.compute_s);
    exposed.push_back(s.comm_exposed_s);
  }
  const std::vector<std::int64_t> ms = comm.allgather_value(std::int64_t(median(compute) * 1e6), "report");
  const std::vector<std::int64_t> ex = comm.allgather_value(std::int64_t(median(exposed) * 1e6), "report");
  json ranks = json::array();
  for (std::size_t r = 0; r < ms.size(); ++r)
    ranks.push_back({{"compute_s", double(ms[r]) * 1e-6}, {"exposed_s", double(ex[r]) * 1e-6}});
  // A rank that computes slower (a busier core) makes the others wait: the least exposed rank's
  // best run is the communication no skew explains.
  std::int64_t least = std::int64_t(*std::min_element(exposed.begin(), exposed.end()) * 1e6);
  comm.allreduce_min(&least, 1);
  return {{"strategy", name},
          {"fwd_bwd_s", median(total)},
          {"ranks", ranks},
          {"least_exposed_s", double(least) * 1e-6}};
}

std::vector<std::pair<std::string, CpConfig>> overlap_configs() {
  return {{"a2a", {"a2a", {}, true}},
          {"p2p zigzag", {"p2p", {}, true}},
          {"p2p contiguous", {"p2p", {}, true, std::nullopt, false}},
          {"all_gather", {"all_gather", {}, true}}};
}

std::int64_t overlap_seq(const Options& o) { return o.quick ? 1024 : 4096; }

// Claim 3 on the first two ranks: the measured runs, then one traced fwd+bwd of a2a and p2p.
json overlap_runs(Communicator& world, const Options& o, std::string& trace) {
  json rows = json::array();
  const Shape g{1, overlap_seq(o), 8, 64};
  on_first_ranks(world, 2, [&](Communicator& sub) {
    for (const auto& [name, cfg] : overlap_configs()) rows.push_back(overlap_run(sub, cfg, name, g, o.reps));
    const CpConfig& ulysses = overlap_configs()[0].second;
    const CpConfig& zigzag = overlap_configs()[1].second;
    const Layer a(ulysses, 2, sub.rank(), g, g.h), p(zigzag, 2, sub.rank(), g, g.h);
    ContextParallelAttention a2a(sub, ulysses), ring(sub, zigzag);
    Tracer tracer(sub);
    a.run(a2a);
    p.run(ring);
    trace = chrome_trace_json(sub, tracer.events());
  });
  return rows;
}

// Claim 7: the valid-cp table.
json cp_table() {
  json rows = json::array();
  for (const seed::Model& m : seed::common_models())
    for (int cp : seed::table_cps()) {
      const seed::CpValidity v = seed::cp_validity(m.heads, m.kv_heads, cp);
      rows.push_back({{"model", m.name},
                      {"heads", m.heads},
                      {"kv_heads", m.kv_heads},
                      {"cp", cp},
                      {"seed_rule", v.seed_rule},
                      {"seed_rule_without_kv_replication", v.seed_kv_rule},
                      {"library_a2a", v.library_a2a},
                      {"library_a2a_even", v.library_even},
                      {"a2a_p2p_factorisations", v.hierarchical}});
    }
  return rows;
}

void print_counted(const json& rows) {
  fmt::print("\n[seed 1, 2] operations, messages and bytes per rank per layer, counted vs formula (f32; {})\n",
             "causal; s = 512, d = 16");
  fmt::print("{:<11} {:<22} {:>3} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>10} {:>7} {:>9}\n", "strategy", "shape",
             "cp", "seed fwd", "fwd ops", "fwd msgs", "fwd KB", "bwd ops", "bwd msgs", "bwd KB", "=form", "peak/qkv");
  for (const json& r : rows)
    fmt::print("{:<11} {:<22} {:>3} {:>10} {:>9} {:>9} {:>10.1f} {:>9} {:>9} {:>10.1f} {:>7} {:>9.2f}\n",
               std::string(r["strategy"]), std::string(r["shape"]), int(r["cp"]), int(r["seed_forward_calls"]),
               int(r["forward"]["calls"]), int(r["forward"]["messages"]), double(r["forward"]["bytes"]) / 1e3,
               int(r["backward"]["calls"]), int(r["backward"]["messages"]), double(r["backward"]["bytes"]) / 1e3,
               r["all_ranks_match_formula"] ? "yes" : "NO", double(r["peak_over_local_qkv"]));
}

void print_curves(const json& rows) {
  fmt::print("\n[seed 2] forward MB per rank per layer by formula, s = 128k, h = 64, d = 128, bf16\n");
  fmt::print("{:>4} {:>12} {:>12} {:>9} {:>12} {:>12} {:>9}\n", "cp", "a2a MHA", "p2p MHA", "a2a/p2p", "a2a GQA",
             "p2p GQA", "a2a/p2p");
  for (std::size_t i = 0; i < rows.size() / 4; ++i) {
    const auto mb = [&](std::size_t k) { return double(rows[k * (rows.size() / 4) + i]["forward_bytes"]) / 1e6; };
    fmt::print("{:>4} {:>12.1f} {:>12.1f} {:>9.3f} {:>12.1f} {:>12.1f} {:>9.3f}\n", int(rows[i]["cp"]), mb(0), mb(1),
               mb(0) / mb(1), mb(2), mb(3), mb(2) / mb(3));
  }
}

void print_overlap(const json& rows, std::int64_t seq) {
  fmt::print("\n[seed 3] causal fwd+bwd on 2 ranks, s = {}, h = 8, d = 64: ms per rank (compute / exposed comm)\n",
             seq);
  for (const json& r : rows) {
    std::string line = fmt::format("{:<15} total {:8.1f}  least exposed {:6.1f}", std::string(r["strategy"]),
                                   double(r["fwd_bwd_s"]) * 1e3, double(r["least_exposed_s"]) * 1e3);
    for (const json& k : r["ranks"])
      line += fmt::format("   {:8.1f} / {:6.1f}", double(k["compute_s"]) * 1e3, double(k["exposed_s"]) * 1e3);
    fmt::print("{}\n", line);
  }
}

double max_over_mean(const std::vector<double>& v) {
  double sum = 0, hi = 0;
  for (double x : v) sum += x, hi = std::max(hi, x);
  return hi * double(v.size()) / sum;
}

json print_balance(const std::vector<seed::BalanceRow>& rows) {
  fmt::print(
      "\n[seed 4] causal per-rank kernel time (fwd+bwd, replayed one rank at a time, 1 thread, best of "
      "rounds): max/mean\n");
  json out = json::array();
  for (const seed::BalanceRow& r : rows) {
    const std::vector<double> pairs(r.pairs.begin(), r.pairs.end());
    std::string ms;
    for (double s : r.seconds) ms += fmt::format(" {:.0f}", s * 1e3);
    fmt::print("{:<15} cp {:>2}: time max/mean {:.3f}, work max/mean {:.3f}; ms per rank:{}\n", r.layout, r.cp,
               max_over_mean(r.seconds), max_over_mean(pairs), ms);
    out.push_back({{"layout", r.layout},
                   {"cp", r.cp},
                   {"seconds", r.seconds},
                   {"pairs", r.pairs},
                   {"time_max_over_mean", max_over_mean(r.seconds)},
                   {"work_max_over_mean", max_over_mean(pairs)}});
  }
  return out;
}

json print_kernels(const std::vector<seed::KernelRow>& rows, const Shape& g) {
  fmt::print(
      "\n[seed 5] forward GFLOP/s (1 thread) of the call each strategy makes, global s = {}, h = {}, d = {}, "
      "non-causal\n",
      g.s, g.h, g.d);
  fmt::print("{:>4} {:>22} {:>22} {:>24}\n", "cp", "a2a [s, h/cp]", "ring [s/cp]x[s/cp]", "zigzag [s/2cp]x[s/2cp]");
  json out = json::array();
  for (const seed::KernelRow& r : rows) {
    fmt::print("{:>4} {:>22.1f} {:>22.1f} {:>24.1f}\n", r.cp, r.ulysses_gflops, r.ring_gflops, r.zigzag_gflops);
    out.push_back({{"cp", r.cp},
                   {"ulysses_gflops", r.ulysses_gflops},
                   {"ring_gflops", r.ring_gflops},
                   {"zigzag_gflops", r.zigzag_gflops}});
  }
  return out;
}

void print_cp_table(const json& rows) {
  fmt::print("\n[seed 7] valid cp for a2a (library: KV heads replicated when cp > h_kv; a2a+p2p [inner, outer])\n");
  for (const seed::Model& m : seed::common_models()) {
    std::string seed_rule, no_rep, lib, even, hier;
    for (const json& r : rows) {
      if (r["model"] != m.name) continue;
      const std::string cp = fmt::format(" {}", int(r["cp"]));
      if (r["seed_rule"]) seed_rule += cp;
      if (r["seed_rule_without_kv_replication"]) no_rep += cp;
      if (r["library_a2a"]) lib += cp;
      if (r["library_a2a_even"]) even += cp;
      if (!r["library_a2a"] && !r["a2a_p2p_factorisations"].empty())
        hier += fmt::format("{} {}", cp, r["a2a_p2p_factorisations"].back().dump());
    }
    fmt::print(
        "{:<12} h {:>2}/{}: seed{}; seed without KV replication{}; library{} (h/cp each:{}); beyond h: "
        "a2a+p2p{}\n",
        m.name, m.heads, m.kv_heads, seed_rule, no_rep, lib, even, hier);
  }
}

// Claim 6's plot: peak working memory over local q+k+v against cp, MHA shape.
svg::Series memory_series(const json& counted, const std::string& strategy) {
  svg::Series s{strategy, {}, {}};
  for (const json& r : counted)
    if (r["strategy"] == strategy && r["shape"] == seed::run_shapes()[0].name) {
      s.x.push_back(double(r["cp"]));
      s.y.push_back(double(r["peak_over_local_qkv"]));
    }
  return s;
}

std::vector<svg::BarGroup> balance_bars(const std::vector<seed::BalanceRow>& rows) {
  std::vector<svg::BarGroup> groups;
  for (const seed::BalanceRow& r : rows) {
    svg::BarGroup g{fmt::format("{} cp {}", r.layout, r.cp), {}};
    for (double s : r.seconds) g.values.push_back(s * 1e3);
    groups.push_back(g);
  }
  return groups;
}

svg::Series kernel_series(const std::vector<seed::KernelRow>& rows, const std::string& name,
                          double seed::KernelRow::*field) {
  svg::Series s{name, {}, {}};
  for (const seed::KernelRow& r : rows) s.x.push_back(r.cp), s.y.push_back(r.*field);
  return s;
}

void write_plots(const std::string& dir, const json& report, const std::vector<svg::Series>& bytes,
                 const std::vector<seed::BalanceRow>& balance, const std::vector<seed::KernelRow>& kernels,
                 const std::string& trace) {
  std::filesystem::create_directories(dir);
  const auto put = [&](const char* name, const std::string& text) { write_file_atomic(dir + "/" + name, text); };
  put("claim2_bytes.svg",
      svg::lines("forward MB per rank per layer (s = 128k, h = 64, d = 128, bf16)", "cp", "MB", bytes, true));
  put("claim3_trace.json", trace);
  put("claim3_timeline.svg",
      svg::timeline("one causal fwd+bwd on 2 ranks: a2a, then p2p (zigzag)", json::parse(trace)));
  put("claim4_balance.svg",
      svg::bars("causal: each rank's fwd+bwd kernel time (bars: ranks)", "ms", balance_bars(balance)));
  put("claim5_kernel.svg", svg::lines("forward GFLOP/s per call shape", "cp", "GFLOP/s",
                                      {kernel_series(kernels, "a2a [s, h/cp]", &seed::KernelRow::ulysses_gflops),
                                       kernel_series(kernels, "ring [s/cp]", &seed::KernelRow::ring_gflops),
                                       kernel_series(kernels, "zigzag [s/2cp]", &seed::KernelRow::zigzag_gflops)},
                                      false));
  const json& counted = report["counted"];
  put("claim6_memory.svg",
      svg::lines("peak working memory per rank / local q+k+v", "cp", "x local qkv",
                 {memory_series(counted, "a2a"), memory_series(counted, "p2p"), memory_series(counted, "all_gather")},
                 false));
}

}  // namespace

nlohmann::json seed_section(Communicator& world, const Options& o) {
  set_threads(o.threads_per_rank);
  json report;
  const bool root = world.rank() == 0;
  report["counted"] = counted_runs(world);
  if (root) print_counted(report["counted"]), std::fflush(stdout);  // progress: each part as it ends
  std::string trace;
  report["overlap"] = overlap_runs(world, o, trace);
  if (root) print_overlap(report["overlap"], overlap_seq(o)), std::fflush(stdout);
  std::vector<seed::BalanceRow> balance;
  std::vector<seed::KernelRow> kernels;
  const Shape bs{1, o.quick ? 256 : 2048, 8, 64}, ks{1, o.quick ? 256 : 1024, 32, 64};
  if (root) {  // alone, one thread: a thread held up by other work would stall its kernel's others
    set_threads(1);
    balance = seed::measure_balance(bs, seed::run_cps(), std::max(o.quick ? 1 : 5, o.reps));
    report["balance"] = print_balance(balance);
    std::fflush(stdout);
    kernels = seed::measure_kernel_efficiency(ks, {1, 2, 4, 8, 16, 32}, o.quick ? 0.005 : 0.05);
    report["kernels"] = print_kernels(kernels, ks);
    set_threads(o.threads_per_rank);
  }
  idle_barrier(MPI_COMM_WORLD);
  if (!root) return json();
  std::vector<svg::Series> bytes;
  report["bytes_formula"] = formula_curves(bytes);
  print_curves(report["bytes_formula"]);
  report["cp_table"] = cp_table();
  print_cp_table(report["cp_table"]);
  if (!o.plots.empty()) write_plots(o.plots, report, bytes, balance, kernels, trace);
  return report;
}

}  // namespace ulysses::bench
