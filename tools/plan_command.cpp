#include "plan_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <future>
#include <cmath>
#include <memory>
#include <tuple>

#include "guard.hpp"
#include "options.hpp"
#include "rank_errors.hpp"
#include "report.hpp"
#include "svg.hpp"
#include "train/generate.hpp"
#include "train/gpt.hpp"
#include "train/memory.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/plan/calibrate_kernel.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/cpu_clock.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/plan/presets.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/threads.hpp"

namespace ulysses::cli {

namespace {

// The attention planned and the machine it runs on.
void add_shape_and_machine_options(CLI::App* c, PlanOptions& o) {
  c->add_option("--seq", o.seq, "sequence length (global; required unless --train)")->check(positive_number());
  c->add_option("--heads", o.heads, "query heads (required unless --grid)")->check(positive_number());
  c->add_option("--kv-heads", o.kv_heads, "key/value heads (default: --heads)")->check(positive_number());
  c->add_option("--head-dim", o.head_dim, "head dim")->capture_default_str()->check(positive_number());
  c->add_option("--batch", o.batch, "sequences per step")->capture_default_str()->check(positive_number());
  c->add_option("--layers", o.layers, "attention layers")->capture_default_str()->check(positive_number());
  c->add_option("--cp", o.cp, "context-parallel size (ranks)")->capture_default_str()->check(positive_number());
  c->add_option("--ranks-per-node", o.ranks_per_node, "ranks per node (NVLink domain)")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--intra-bw", o.intra_bw, "bandwidth inside a node, per rank per direction (GB/s, Gb/s, TB/s, MB/s)")
      ->capture_default_str();
  c->add_option("--intra-lat", o.intra_lat, "latency inside a node (us, ms, ns)")->capture_default_str();
  c->add_option("--inter-bw", o.inter_bw, "bandwidth between nodes, per rank per direction")->capture_default_str();
  c->add_option("--inter-lat", o.inter_lat, "latency between nodes")->capture_default_str();
  c->add_option("--tflops", o.tflops, "peak compute per rank, TFLOP/s")->capture_default_str();
  c->add_option("--efficiency", o.efficiency, "achieved fraction of peak in attention")->capture_default_str();
  c->add_option("--dtype", o.dtype, "element type on the wire: bf16 | f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
}

// The mask, packed documents, windows, cross-attention, and where the plan is written.
void add_attention_and_report_options(CLI::App* c, PlanOptions& o) {
  c->add_flag("--no-causal", o.no_causal, "full (non-causal) attention");
  c->add_flag("--calibrate", o.calibrate,
              "measure this machine (attention rate, an alpha-beta fit of MPI send/recv; across hosts also with every "
              "rank sending at once), plan for it at cp = the number of ranks, then run every strategy for real and "
              "print measured / predicted");
  c->add_option("--grid", o.grid,
                "with --calibrate: plan and run every strategy over a grid of shapes (quick: 4 small ones; full: 24 "
                "of 2k-32k tokens, 4-32 heads, head dim 64 and 128, full and causal, GQA) and count how often the "
                "predicted fastest measures fastest");
  c->add_option("--grid-runs", o.grid_runs, "with --grid: interleaved runs of each row, the fastest kept")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--grid-clock", o.grid_clock,
                "with --grid: cpu (each rank's CPU seconds, the attention rate calibrated the same way: a machine "
                "shared with other work) or wall (elapsed seconds: across hosts, where the wire takes time)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "wall"}));
  c->add_flag("--scaling", o.scaling, "also print per-GPU communication of Ulysses vs Megatron-SP from 8 to 1024 GPUs");
  c->add_option("--docs", o.docs,
                "packed documents (batch 1): their lengths, e.g. 1000,5000,2192 or 16x1024 (COUNTxLENGTH), adding up "
                "to --seq; the compute per rank and its balance follow them");
  c->add_option("--window", o.window,
                "sliding window L[,R] (FlashAttention's window_size; L alone means L,0; -1: unbounded): work per rank "
                "follows the band, p2p and a2a+p2p move only the halo it reaches");
  c->add_option("--kv-seq", o.kv_seq,
                "cross-attention: k/v of this many tokens (default: --seq); bytes and work "
                "follow it, strategies without cross-attention are listed as invalid")
      ->check(positive_number());
  c->add_option("--q-offset", o.q_offset,
                "cross-attention, causal: query i sees keys j <= q_offset + i "
                "(required when --kv-seq differs from --seq)");
  c->add_option("--json", o.json, "write the plan here (- for standard output, after the table)");
  c->add_option("--svg", o.svg, "plot predicted step time against sequence length per strategy");
}

// plan --train (memory per rank for `ulysses train`) and plan --lengths (variable-length steps).
void add_train_and_lengths_options(CLI::App* c, PlanOptions& o) {
  c->add_flag("--train", o.train,
              "for `ulysses train` (a2a; --dtype f32 unless given): the longest sequence whose predicted memory per "
              "rank fits in --max-memory, at cp = 1, 2, 4, ... --cp, without and with the memory techniques");
  c->add_option("--width", o.width,
                "with --train: model width (default heads x head-dim); with --mode decode: the model around the "
                "attention, whose row every rank runs per token (default: none, the attention alone)")
      ->check(positive_number());
  c->add_option("--hidden", o.hidden,
                "with --train or --mode decode --width: SwiGLU hidden size (default as train's: 8/3 width, rounded up "
                "to a multiple of 4)")
      ->check(positive_number());
  c->add_option("--vocab", o.vocab, "with --mode decode --width: the LM head's vocabulary")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--max-memory", o.max_memory,
                "with --train: memory per rank (default 2GiB); with --lengths: the cap per rank (default: none); "
                "a plan of --seq: a row whose working set (decode: KV cache) is over it is refused (default: none)");
  c->add_option("--lengths", o.lengths,
                "a variable-length step (NxL terms, or pareto:N:MIN:MAX:ALPHA[:SEED]): plan "
                "which ranks compute which sequence under each --balance policy (static, pow2, dynamic) and print "
                "their predicted step times; --world N (default: 2, 4, ... 1024), --calibrate: this machine");
  c->add_option("--world", o.world, "with --lengths: ranks in all (default: every power of two from 2 to 1024)")
      ->check(positive_number());
  c->add_option("--dp", o.dp, "with --lengths: static's data-parallel replicas (groups of world / dp ranks)")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--cp-comm-type", o.cp_comm_type, "with --lengths: the strategy every group runs")
      ->capture_default_str();
  c->add_option("--max-tokens-per-rank", o.max_tokens_per_rank,
                "with --lengths: pow2's tokens per rank (Megatron's "
                "max_seqlen_per_dp_cp_rank; default: the longest sequence over world)")
      ->check(positive_number());
  c->add_option("--tile-rows", o.tile_rows, "with --train: rows of a tile (train --tile-rows)")
      ->capture_default_str()
      ->check(positive_number());
}

}  // namespace

void add_plan_command(CLI::App& app, PlanOptions& o) {
  CLI::App* c =
      add_command(app, "plan",
                  "Choose a context-parallel strategy and predict its cost per rank: bytes, messages, compute, "
                  "communication (and how much of it hides), memory, step time; for this machine (--calibrate) or a "
                  "GPU cluster (defaults: 8-GPU NVLink nodes joined by InfiniBand).");
  add_shape_and_machine_options(c, o);
  add_attention_and_report_options(c, o);
  add_train_and_lengths_options(c, o);
  c->add_option("--gpu", o.gpu,
                "a GPU preset: its peak for --dtype, memory bandwidth and attention-kernel curve (A100, A800, H100, "
                "H800, H20, H200, B200, L20, L40S); --tflops / --efficiency given too win");
  c->add_option("--kernel", o.kernel,
                "the attention kernel's curve with --gpu: fa2 | fa3 (default: the GPU's; fa3 on the Hopper and B200 "
                "presets only)");
  c->add_option(
      "--intra-fabric", o.intra_fabric,
      "the links inside a node: nvlink3, nvlink3-a800, nvlink4, nvlink4-h800, nvlink5, pcie4, pcie5 (default: the "
      "GPU's); --intra-bw / --intra-lat given too win");
  c->add_option("--inter-fabric", o.inter_fabric,
                "the links between nodes: ib-hdr, ib-ndr, ib-xdr, roce-100, roce-200, roce-400; --inter-bw / "
                "--inter-lat given too win");
  c->add_option("--mode", o.mode,
                "what a step computes: train (forward + backward), forward, prefill (a prompt's forward), decode (one "
                "token per sequence, --batch sequences, against a cache of --seq tokens)")
      ->capture_default_str();
  c->add_option("--memory-bw", o.memory_bw,
                "memory bandwidth per rank (GB/s, TB/s): a decode step reads the cache at it (default: the GPU "
                "preset's, else H100's 3.35TB/s; on this machine, `generate`'s read rate)");
  c->add_option("--cached", o.cached,
                "with --mode prefill: tokens already cached under the --seq new ones (a conversation's next turn): "
                "pass-KV vs pass-Q")
      ->check(CLI::NonNegativeNumber);
  add_backend_options(c, o.backend);
  add_timeout_option(c, o.timeout);
  // --train plans `ulysses train`, whose attention is float32 unless --dtype says otherwise.
  c->parse_complete_callback([&o, c] {
    if (o.train && c->count("--dtype") == 0) o.dtype = "f32";
    o.max_memory_given = c->count("--max-memory") > 0;
    for (const CLI::Option* opt : c->get_options())
      if (opt->count() > 0) o.given.insert(opt->get_name());
  });
}

namespace {

const char* mode_name(PlanMode m) {
  switch (m) {
    case PlanMode::train: return "train";
    case PlanMode::forward: return "forward";
    case PlanMode::prefill: return "prefill";
    case PlanMode::decode: return "decode";
  }
  return "?";
}

// The header's preset lines as one line for JSON: "presets: ...; flags over presets: ...".
std::string one_line(std::string text) {
  for (std::size_t i; (i = text.find("\n")) != std::string::npos;) text.replace(i, 1, "; ");
  while (!text.empty() && (text.back() == ' ' || text.back() == ';')) text.pop_back();
  for (std::size_t i; (i = text.find("  ")) != std::string::npos;) text.erase(i, 1);
  return text.empty() || text[0] != ' ' ? text : text.substr(1);
}

}  // namespace

// Runs one strategy for real on every rank `runs` times: each run's seconds on the slowest rank.
std::vector<double> measure_runs(Communicator& comm, const PlanInput& in, const CpConfig& cfg, int runs,
                                 StepClock clock) {
  auto now = [&] { return clock == StepClock::cpu ? process_cpu_seconds() : comm.now(); };
  const int cp = comm.size();
  const std::int64_t n = total_tokens(rank_chunks(cfg, cp, comm.rank(), in.seq));
  const std::int64_t nk = total_tokens(rank_chunks(cfg, cp, comm.rank(), kv_seq_of(in)));
  Tensor q({in.batch, n, in.heads, in.head_dim}), k({in.batch, nk, in.kv_heads, in.head_dim}), v(k.shape());
  Tensor o(q.shape()), g(q.shape()), dq(q.shape()), dk(k.shape()), dv(k.shape());
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&g, 4}}) fill_uniform(t->view(), std::uint64_t(seed));
  ContextParallelAttention attn(comm, cfg);
  const bool backward = in.mode == PlanMode::train;  // forward and prefill time the forward alone
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    comm.barrier();
    const double t0 = now();
    const CpContext ctx = attn.forward(o.view(), q.view(), k.view(), v.view());
    if (backward) attn.backward(ctx, dq.view(), dk.view(), dv.view(), g.view());
    double dt = now() - t0;
    comm.allreduce_max(&dt, 1);
    t.push_back(dt);
  }
  return t;
}

namespace {

// Median seconds of a strategy's step after one warm-up run.
double measure(Communicator& comm, const PlanInput& in, const CpConfig& cfg) {
  std::vector<double> t = measure_runs(comm, in, cfg, 4);
  t.erase(t.begin());
  return median(t);
}

// ---- output ---------------------------------------------------------------------------------

nlohmann::json kernel_json(const KernelModel& k) {
  return {{"kv_half", k.kv_half},
          {"causal_half", k.causal_half},
          {"head_dim_half", k.head_dim_half},
          {"backward_ratio", k.backward_ratio},
          {"call_s", k.call_s},
          {"merge_passes", k.merge_passes},
          {"kv_pack_s_per_byte", k.kv_pack_s_per_byte},
          {"cache_bytes", k.cache_bytes},
          {"past_cache_extra", k.past_cache_extra},
          {"stream_s_per_byte", k.stream_s_per_byte},
          {"stream_cache_bytes", k.stream_cache_bytes},
          {"memory_bandwidth", k.memory_bandwidth},
          {"ring_pair_calls", k.ring_pair_calls}};
}

nlohmann::json to_json(const PlanRequest& req, const Plan& p, const std::vector<double>& measured) {
  const PlanInput& in = req.in;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    nlohmann::json j{{"strategy", r.config.cp_comm_type},
                     {"name", r.name},
                     {"cp_sizes", r.config.hierarchical_context_parallel_sizes},
                     {"valid", r.valid},
                     {"reason", r.reason},
                     {"forward_bytes_per_rank", r.forward_bytes_per_rank},
                     {"backward_bytes_per_rank", r.backward_bytes_per_rank},
                     {"forward_messages", r.forward_messages},
                     {"backward_messages", r.backward_messages},
                     {"head_imbalance", r.head_imbalance},
                     {"work_imbalance", r.work_imbalance},
                     {"compute_s", r.compute_s},
                     {"comm_s", r.comm_s},
                     {"hidden_comm_s", r.hidden_s},
                     {"memory_bytes_per_rank", r.memory_bytes},
                     {"predicted_step_s", r.predicted_step_s}};
    if (i < measured.size() && measured[i] > 0) j["measured_step_s"] = measured[i];
    rows.push_back(j);
  }
  return {{"input",
           {{"seq", in.seq},
            {"batch", in.batch},
            {"heads", in.heads},
            {"kv_heads", in.kv_heads},
            {"head_dim", in.head_dim},
            {"layers", in.layers},
            {"cp", in.cp},
            {"causal", in.causal},
            {"dtype", to_string(in.dtype)},
            {"ranks_per_node", in.cluster.ranks_per_node},
            {"intra_bandwidth", in.cluster.intra.bandwidth},
            {"intra_latency", in.cluster.intra.latency},
            {"inter_bandwidth", in.cluster.inter.bandwidth},
            {"inter_latency", in.cluster.inter.latency},
            {"inter_concurrent_bandwidth", in.cluster.inter_concurrent.bandwidth},
            {"intra_overlap", in.cluster.intra.overlap},
            {"inter_overlap", in.cluster.inter.overlap},
            {"overlap_calls", in.cluster.inter.overlap_calls},
            {"peak_flops", in.cluster.peak_flops},
            {"efficiency", in.cluster.efficiency},
            {"mode", mode_name(in.mode)},
            {"kernel", kernel_json(in.cluster.kernel)},
            {"presets", one_line(req.presets)},
            {"documents", in.documents},
            {"window", {in.window_left, in.window_right}},
            {"kv_seq", kv_seq_of(in)},
            {"q_offset", in.q_offset ? nlohmann::json(*in.q_offset) : nlohmann::json()}}},
          {"strategies", rows},
          {"best", p.best >= 0 ? p.rows[std::size_t(p.best)].name : ""},
          {"recommendation", p.recommendation}};
}

// A PCIe node's tiers, which decide its all-to-alls and rings (cost_model.hpp's Cluster).
void print_shared_links(const Cluster& c) {
  if (c.switch_ranks <= 0 && c.socket_ranks <= 0) return;
  const Link wide = alltoall_link(c, c.ranks_per_node);
  fmt::print("  all-to-all per rank: {:.3g} GB/s under a switch of {}", c.intra.bandwidth / 1e9, c.switch_ranks);
  if (c.socket_ranks > 0)
    fmt::print(", {:.3g} GB/s in a socket of {}", alltoall_link(c, c.socket_ranks).bandwidth / 1e9, c.socket_ranks);
  fmt::print(", {:.3g} GB/s over the node", wide.bandwidth / 1e9);
  if (c.cross_socket.bandwidth > 0) fmt::print("; a ring across sockets {:.3g} GB/s", c.cross_socket.bandwidth / 1e9);
  fmt::print("\n");
}

void print_plan(const PlanRequest& req, const Plan& p, const std::vector<double>& measured) {
  const PlanInput& in = req.in;
  fmt::print("ulysses plan: seq {}, batch {}, heads {} (kv {}), head_dim {}, {} layer(s), cp {}, {}{}\n", in.seq,
             in.batch, in.heads, in.kv_heads, in.head_dim, in.layers, in.cp, to_string(in.dtype),
             in.causal ? ", causal" : "");
  if (!in.documents.empty())
    fmt::print("packed documents: {} (lengths {} .. {}); work = visible (query, key) pairs per rank\n",
               in.documents.size(), *std::min_element(in.documents.begin(), in.documents.end()),
               *std::max_element(in.documents.begin(), in.documents.end()));
  if (in.window_left >= 0 || in.window_right >= 0)
    fmt::print("sliding window ({}, {}); work = visible (query, key) pairs per rank\n", in.window_left,
               in.window_right);
  if (kv_seq_of(in) != in.seq || in.q_offset)
    fmt::print("cross-attention: k/v of {} tokens, q_offset {}; work = visible (query, key) pairs per rank\n",
               kv_seq_of(in), in.q_offset ? std::to_string(*in.q_offset) : "unset");
  fmt::print(
      "  {} ranks per node; intra {:.3g} GB/s, {:.3g} us; inter {:.3g} GB/s, {:.3g} us; {:.3g} TFLOP/s x {:.2f}\n",
      in.cluster.ranks_per_node, in.cluster.intra.bandwidth / 1e9, in.cluster.intra.latency * 1e6,
      in.cluster.inter.bandwidth / 1e9, in.cluster.inter.latency * 1e6, in.cluster.peak_flops / 1e12,
      in.cluster.efficiency);
  print_shared_links(in.cluster);
  if (in.mode != PlanMode::train)
    fmt::print("  mode {}: forward only{}\n", mode_name(in.mode),
               in.mode == PlanMode::decode
                   ? fmt::format(", {} new token(s) against a cache of {} tokens", in.batch, in.seq)
                   : "");
  fmt::print("{}", req.presets);
  if (in.mode == PlanMode::decode && in.cp > 1)  // one query token: the strategies' shards would be empty
    return fmt::print("decode: the KV cache's layouts below, not the training strategies, share the step\n");
  fmt::print("{:<22} {:>11} {:>11} {:>6} {:>10} {:>10} {:>7} {:>10} {:>11}{}\n", "strategy", "fwd MB/rk", "bwd MB/rk",
             "msgs", "compute ms", "comm ms", "hidden", "mem MB/rk", "step s",
             measured.empty() ? "" : "   measured s  meas/pred");
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    if (!r.valid) {
      fmt::print("{:<22} invalid: {}\n", r.name, r.reason);
      continue;
    }
    std::string m;
    if (i < measured.size() && measured[i] > 0)
      m = fmt::format("   {:>10.4f} {:>10.2f}", measured[i], measured[i] / r.predicted_step_s);
    // An uneven head split: the busiest rank's compute over an even split's.
    std::string uneven = r.head_imbalance > 1 ? fmt::format("  (heads x{:.2f})", r.head_imbalance) : "";
    if (r.work_imbalance > 1.005) uneven += fmt::format("  (work x{:.2f})", r.work_imbalance);
    fmt::print("{:<22} {:>11.3f} {:>11.3f} {:>6} {:>10.3f} {:>10.3f} {:>6.0f}% {:>10.1f} {:>11.4g}{}{}{}\n", r.name,
               double(r.forward_bytes_per_rank) / 1e6, double(r.backward_bytes_per_rank) / 1e6,
               r.forward_messages + r.backward_messages, r.compute_s * 1e3, r.comm_s * 1e3,
               r.comm_s > 0 ? 100 * r.hidden_s / r.comm_s : 100.0, r.memory_bytes / 1e6, r.predicted_step_s, m, uneven,
               int(i) == p.best ? "  <- recommended" : "");
  }
  fmt::print("recommendation: {}\n", p.recommendation);
  for (const TuningPlan& t : plan_tunings(in))
    if (t.plain_exposed_s > 0)
      fmt::print("{} tuned{}: {:.3g} ms exposed communication per layer against {:.3g} ms untuned\n",
                 t.config.cp_comm_type, option_flags(t.config), t.exposed_s * 1e3, t.plain_exposed_s * 1e3);
}

// Per-GPU communication of one layer as GPUs and sequence grow together (the paper's claim).
nlohmann::json scaling_table(const PlanInput& in) {
  nlohmann::json rows = nlohmann::json::array();
  const double es = double(dtype_size(in.dtype)), hidden = double(in.heads * in.head_dim);
  fmt::print("\nper-GPU communication of one layer's forward, sequence growing with GPUs (N = {} x P/8):\n", in.seq);
  fmt::print("{:>6} {:>12} {:>18} {:>22} {:>8}\n", "GPUs", "seq N", "Ulysses (a2a) MB", "Megatron-SP (AG+RS) MB",
             "ratio");
  for (int P = 8; P <= 1024; P *= 2) {
    const double N = double(in.seq) * P / 8;
    // Ulysses: Q, K, V in and O out, (N/P)·h·(P−1)/P each (kv = heads here): ≈ 4Nh/P.
    const double ulysses = 4 * (N / P) * hidden * (P - 1) / P * es * in.batch;
    // Megatron-SP: two all-gathers and two reduce-scatters of [N, h] per layer: ≈ 4Nh.
    const double sp = 4 * N * hidden * (P - 1) / P * es * in.batch;
    fmt::print("{:>6} {:>12.0f} {:>18.2f} {:>22.2f} {:>8.0f}\n", P, N, ulysses / 1e6, sp / 1e6, sp / ulysses);
    rows.push_back({{"gpus", P}, {"seq", N}, {"ulysses_bytes", ulysses}, {"megatron_sp_bytes", sp}});
  }
  return rows;
}

// Powers of two from in.seq / 16 to in.seq * 16, as far as the planner accepts them.
std::vector<std::int64_t> plot_seqs(const PlanInput& in) {
  std::vector<std::int64_t> seqs;
  for (std::int64_t s = std::max<std::int64_t>(2 * std::int64_t(in.cp), in.seq / 16); s / 16 <= in.seq; s *= 2) {
    PlanInput x = in;
    x.seq = s;
    x.documents.clear();  // as svg_plot plans it: one document
    if (!plan_input_error(x).empty()) break;
    seqs.push_back(s);
  }
  return seqs;
}

std::string svg_plot(const PlanInput& in) {
  const std::vector<std::int64_t> seqs = plot_seqs(in);
  // One plan a length, each read for every row, the lengths planned at once (each plan is pure):
  // at cp 65536 a plan takes 0.05-0.3 s, and the plot plans nine.
  std::vector<std::future<Plan>> futures;
  for (std::int64_t s : seqs) {
    PlanInput x = in;
    x.seq = s;
    x.documents.clear();  // the sweep changes s: one document each
    futures.push_back(std::async(std::launch::async, [x] { return make_plan(x); }));
  }
  std::vector<Plan> plans;
  for (std::future<Plan>& f : futures) plans.push_back(f.get());
  std::vector<std::vector<double>> series;
  std::vector<std::string> names;
  double lo = 1e300, hi = 0;
  // A line per row any length lists, matched by name: a row one length lacks is a gap in its line.
  // The sweep has no documents, so its rows, not the documents' plan's, name the lines.
  std::vector<std::string> rows;
  for (const Plan& p : plans)
    for (const PlanRow& r : p.rows)
      if (std::find(rows.begin(), rows.end(), r.name) == rows.end()) rows.push_back(r.name);
  for (const std::string& row : rows) {
    std::vector<double> ys;
    bool any = false;
    for (const Plan& p : plans) {
      const auto r = std::find_if(p.rows.begin(), p.rows.end(), [&](const PlanRow& x) { return x.name == row; });
      const double y = r != p.rows.end() && r->valid ? r->predicted_step_s : -1;
      ys.push_back(y);
      if (y > 0) lo = std::min(lo, y), hi = std::max(hi, y), any = true;
    }
    if (any) series.push_back(ys), names.push_back(row);
  }
  const double W = 720, H = 420, L = 70, R = 170, T = 40, B = 50;
  auto X = [&](std::size_t i) {
    return L + (W - L - R) * double(i) / double(std::max<std::size_t>(1, seqs.size() - 1));
  };
  const svg::Axis Y{lo, hi, H - B, T, true};
  std::string s = svg::open(W, H, fmt::format("predicted step time vs sequence length (cp {}, log-log)", in.cp), L);
  for (std::size_t i = 0; i < seqs.size(); ++i)
    s += fmt::format("<text x=\"{:.0f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", X(i), H - B + 16, seqs[i]);
  if (series.empty())  // every row invalid at every length (a memory cap): no time axis, not one at y = inf
    s += fmt::format("<text x=\"{}\" y=\"{}\">no strategy is valid at any of these lengths</text>\n", L, T + 16);
  else
    s += fmt::format(
        "<text x=\"{}\" y=\"{:.0f}\" text-anchor=\"end\">{:.3g} s</text>\n<text x=\"{}\" y=\"{:.0f}\" "
        "text-anchor=\"end\">{:.3g} s</text>\n",
        L - 4, Y(hi) + 4, hi, L - 4, Y(lo) + 4, lo);
  for (std::size_t k = 0; k < series.size(); ++k) {
    std::string pts;
    for (std::size_t i = 0; i < seqs.size(); ++i)
      if (series[k][i] > 0) pts += fmt::format("{:.1f},{:.1f} ", X(i), Y(series[k][i]));
    s += svg::polyline(pts, svg::color(k), 1.5);
    s += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", W - R + 10, T + 16 * double(k), svg::color(k),
                     names[k]);
  }
  return s + "</svg>\n";
}

// "1000,5000" or "16x1024,1x512" → document lengths.
std::vector<std::int64_t> parse_documents(const std::string& text) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    const std::size_t x = item.find('x');
    std::int64_t count = 1, length = -1;
    const bool ok = x == std::string::npos
                        ? parse_int64(item, length)
                        : parse_int64(item.substr(0, x), count) && parse_int64(item.substr(x + 1), length);
    if (!ok) throw Error(fmt::format("--docs: '{}' is neither a length nor COUNTxLENGTH", item.substr(0, 40)));
    if (count < 1 || count > (1 << 24) || length < 0)
      throw Error(fmt::format("--docs: '{}' needs a count in [1, 2^24] and a length >= 0", item.substr(0, 40)));
    out.insert(out.end(), std::size_t(count), length);
    pos = end + 1;
  }
  return out;
}

}  // namespace

double measured_memory(const PlanInput& in) {
  const double tokens = double(in.batch) * double((std::max(in.seq, kv_seq_of(in)) + in.cp - 1) / in.cp);
  double working = 0;
  for (const PlanRow& r : make_plan(in).rows)
    if (r.valid) working = std::max(working, r.memory_bytes);
  return 4 * tokens * double(in.head_dim) * double(4 * in.heads + 4 * in.kv_heads) + working;
}

namespace {

// FlashAttention-2 runs on every preset's GPU; another kernel (FlashAttention-3: Hopper's) only
// on the GPUs whose own kernel it is: --gpu A100 --kernel fa3 priced a kernel that cannot run.
void check_kernel_runs(const GpuPreset& g, const KernelPreset& k) {
  if (k.name == "fa2" || k.name == g.kernel) return;
  std::vector<std::string> runs_on;
  for (const GpuPreset& p : gpu_presets())
    if (p.kernel == k.name) runs_on.push_back(p.name);
  throw Error(fmt::format("--kernel {} does not run on {} (the presets it runs on: {}): use fa2, or drop --kernel",
                          k.name, g.name, fmt::join(runs_on, ", ")));
}

// --gpu, --kernel, --intra-fabric, --inter-fabric over the defaults, then the explicit flags
// over the presets. Returns the header's lines naming each preset and each flag that won ("":
// no preset).
std::string apply_presets(const PlanOptions& o, PlanInput& in) {
  std::vector<std::string> used, won;
  const Cluster flags = in.cluster;
  if (!o.kernel.empty() && o.gpu.empty()) throw Error("--kernel needs --gpu (the kernel's curve is per GPU)");
  if (!o.gpu.empty()) {
    const GpuPreset& g = find_gpu_preset(o.gpu);
    const KernelPreset& k = find_kernel_preset(o.kernel.empty() ? g.kernel : o.kernel);
    check_kernel_runs(g, k);
    apply_gpu(in.cluster, g, k, in.dtype);
    used.push_back(fmt::format("GPU {} ({:.4g} TFLOP/s {}, kernel {} at {:.3f} of peak, memory {:.3g} TB/s)", g.name,
                               in.cluster.peak_flops / 1e12, to_string(in.dtype), k.name, in.cluster.efficiency,
                               g.memory_bandwidth / 1e12));
    if (o.intra_fabric.empty()) apply_intra_fabric(in.cluster, find_fabric_preset(g.intra));
    if (o.intra_fabric.empty()) used.push_back("intra " + g.intra + " (the GPU's)");
  }
  if (!o.intra_fabric.empty()) {
    apply_intra_fabric(in.cluster, find_fabric_preset(o.intra_fabric));
    used.push_back("intra " + o.intra_fabric);
  }
  if (!o.inter_fabric.empty()) {
    in.cluster.inter = find_fabric_preset(o.inter_fabric).link;
    used.push_back("inter " + o.inter_fabric);
  }
  if (used.empty()) return "";
  auto keep = [&](const char* flag, double& field, double value, double unit, const char* what) {
    if (!o.given.count(flag)) return;
    won.push_back(fmt::format("{} {:.4g}{} (preset: {:.4g})", flag, value / unit, what, field / unit));
    field = value;
  };
  keep("--tflops", in.cluster.peak_flops, flags.peak_flops, 1e12, " TFLOP/s");
  keep("--efficiency", in.cluster.efficiency, flags.efficiency, 1, "");
  keep("--intra-bw", in.cluster.intra.bandwidth, flags.intra.bandwidth, 1e9, " GB/s");
  keep("--intra-lat", in.cluster.intra.latency, flags.intra.latency, 1e-6, " us");
  keep("--inter-bw", in.cluster.inter.bandwidth, flags.inter.bandwidth, 1e9, " GB/s");
  keep("--inter-lat", in.cluster.inter.latency, flags.inter.latency, 1e-6, " us");
  if (!o.gpu.empty() && o.given.count("--memory-bw"))  // applied again by apply_inference_options
    keep("--memory-bw", in.cluster.kernel.memory_bandwidth, parse_bandwidth(o.memory_bw), 1e12, " TB/s");
  std::string note = "  presets: " + fmt::format("{}", fmt::join(used, "; ")) + "\n";
  if (!won.empty()) note += "  flags over presets: " + fmt::format("{}", fmt::join(won, "; ")) + "\n";
  return note;
}

// --memory-bw over the GPU preset's (H100's without one: the other defaults are an H100's) and
// --max-memory as the cap a row must fit; --cached only with a prefill.
void apply_inference_options(const PlanOptions& o, PlanInput& in) {
  if (!o.memory_bw.empty()) in.cluster.kernel.memory_bandwidth = parse_bandwidth(o.memory_bw);
  // --calibrate measures the decode kernel's rate here (calibrate_decode).
  if (in.mode == PlanMode::decode && !(in.cluster.kernel.memory_bandwidth > 0) && !o.calibrate)
    in.cluster.kernel.memory_bandwidth = 3.35e12;
  if (o.max_memory_given) in.max_memory_bytes = train::parse_bytes(o.max_memory);
  if (o.cached >= 0 && in.mode != PlanMode::prefill) throw Error("--cached has no effect without --mode prefill");
  // The decode table prices `generate`'s cache, every one of --seq tokens read each step: these
  // would change only the time to first token below it and leave the decode rows priced without them.
  if (in.mode == PlanMode::decode && o.given.count("--svg"))
    throw Error(
        "--svg is not drawn for --mode decode: it plots the strategies' step time by sequence length, and a decode "
        "step runs the KV cache's layouts (the table printed) instead: drop it");
  if (in.mode == PlanMode::decode)
    for (const char* flag : {"--window", "--docs", "--kv-seq", "--q-offset"})
      if (o.given.count(flag))
        throw Error(fmt::format(
            "{} is not priced by --mode decode, whose layouts read a whole cache of --seq tokens a sequence each "
            "step (as `ulysses generate` does; it would change only the time to first token): drop it, or plan the "
            "prompt with --mode prefill",
            flag));
}

}  // namespace

PlanRequest plan_request(const PlanOptions& o, int ranks) {
  if (o.seq <= 0) throw Error("--seq is required (or --train)");
  PlanRequest req;
  PlanInput& in = req.in;
  in.seq = o.seq;
  in.batch = o.batch;
  in.heads = o.heads;
  in.kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  in.head_dim = o.head_dim;
  in.layers = o.layers;
  in.cp = o.calibrate ? ranks : o.cp;
  in.causal = !o.no_causal;
  in.dtype = o.calibrate ? DType::f32 : parse_dtype(o.dtype);
  in.cluster.ranks_per_node = o.calibrate ? ranks : o.ranks_per_node;
  in.cluster.intra = {parse_bandwidth(o.intra_bw), parse_latency(o.intra_lat)};
  in.cluster.inter = {parse_bandwidth(o.inter_bw), parse_latency(o.inter_lat)};
  in.cluster.peak_flops = o.tflops * 1e12;
  in.cluster.efficiency = o.efficiency;
  in.mode = parse_plan_mode(o.mode);
  req.presets = apply_presets(o, in);
  if (!o.docs.empty()) in.documents = parse_documents(o.docs);
  if (!o.window.empty()) std::tie(in.window_left, in.window_right) = parse_window(o.window, in.causal);
  in.kv_seq = o.kv_seq;
  in.q_offset = o.q_offset;
  apply_inference_options(o, in);
  if (o.width > 0 && in.mode == PlanMode::decode) {
    req.row.width = o.width;
    req.row.hidden = o.hidden > 0 ? o.hidden : train::GptConfig::swiglu_hidden(o.width);
    req.row.vocab = o.vocab;
  }
  check_plan_input(in);
  if (o.cached >= 0) (void)plan_turn(in, o.cached);  // its errors before the plan is printed
  return req;
}

void calibrate_cluster(Communicator& comm, PlanInput& in) {
  set_threads(default_threads(comm));
  in.cluster = calibrate(comm, in.head_dim, in.dtype).cluster;
  apply_calibrated_kernel(in.cluster, calibrate_kernel(comm, in.head_dim, in.dtype), in.head_dim,
                          double(dtype_size(in.dtype)));
}

namespace {

// `plan`, calibrated and run, planned again with the tie band its own rows measured (the model's
// error between strategies at this shape on this machine); memory decides a tie only under
// --max-memory. Every rank the same (the measurements are the slowest rank's).
Plan plan_with_measured_band(const PlanInput& in, const Plan& plan, const std::vector<double>& measured) {
  std::vector<ValidatedRow> rows;
  for (std::size_t i = 0; i < plan.rows.size(); ++i)
    rows.push_back({plan.rows[i].predicted_step_s, i < measured.size() && measured[i] > 0 ? measured[i] : 0.0});
  return make_plan(in, calibrated_tie_band(measured_tie_band({rows}), "at this shape", in.max_memory_bytes > 0));
}

// Collective. The decode kernel's rate over caches of 2 to 64 MiB a rank (steps of sqrt 2) and 256 MiB,
// every rank at once, the slowest rank's: the last-level cache is the largest size, from the
// smallest up, still read at 1.5x the 256 MiB rate or more (its bytes on the node: that size times
// the ranks here), read at that size's rate.
void calibrate_llc(Communicator& comm, const PlanInput& in, double memory_bw, DecodeModel& m, std::string& curve) {
  const double ranks_here = double(comm.ranks_on_this_node());
  bool fits = true;
  for (int k = 2; k <= 12 && fits; ++k) {
    const double bytes = double(1 << 20) * std::pow(2.0, k / 2.0);
    double per_byte = 1 / decode_rate(in.heads, in.kv_heads, in.head_dim, bytes).kernel_bytes_s;
    comm.allreduce_max(&per_byte, 1);
    curve += fmt::format(" {:.1f} MiB {:.1f},", bytes / double(1 << 20), 1e-9 / per_byte);
    fits = 1 / per_byte >= 1.5 * memory_bw;
    if (fits) m.llc_bytes = bytes * ranks_here, m.llc_bandwidth = 1 / per_byte;
  }
}

// The model `generate` runs for this plan's shape and row.
train::GptConfig gpt_of(const PlanInput& in, const DecodeModel& row) {
  train::GptConfig g;
  g.vocab = row.vocab, g.layers = in.layers, g.width = row.width, g.hidden = row.hidden;
  g.heads = in.heads, g.kv_heads = in.kv_heads, g.head_dim = in.head_dim;
  return g;
}

// The decode step's rows at the batch asked: the model's own layers on in.batch rows at once (at
// most 16384), seconds a token, the slowest rank's.
std::string calibrate_batch_rows(Communicator& comm, const PlanInput& in, DecodeModel& row) {
  if (row.width <= 0) return "";
  row.batch_rows = std::min<std::int64_t>(in.batch, 16384);
  double s = train::prefill_row_seconds(gpt_of(in, row), row.batch_rows);
  comm.allreduce_max(&s, 1);
  row.batch_token_s = s;
  return fmt::format(
      "decode rows calibrated (CPU seconds): {:.2f} us a token at {} rows a step (all layers, the "
      "LM head apart)\n",
      s * 1e6, row.batch_rows);
}

}  // namespace

std::string calibrate_decode(Communicator& comm, PlanInput& in, DecodeModel& row) {
  const DecodeRate d = decode_rate(in.heads, in.kv_heads, in.head_dim, double(256 << 20));
  // Seconds per byte and per FLOP, so the all-reduce's max is the slowest rank's rate.
  const auto products = row_products(in, row);
  double per[2] = {1 / d.kernel_bytes_s, products.empty() ? 0.0 : 1 / row_rate(products)};
  comm.allreduce_max(per, 2);
  in.cluster.kernel.memory_bandwidth = 1 / per[0];
  row.kernel_measured = true;
  if (!products.empty()) row.flops_per_s = 1 / per[1];
  std::string curve;
  calibrate_llc(comm, in, in.cluster.kernel.memory_bandwidth, row, curve);
  if (comm.size() > 1) row.collective_s = decode_gather_seconds(comm, in.heads, in.kv_heads, in.head_dim);
  row.request_s = decode_request_seconds(comm, in.heads, in.kv_heads, in.head_dim);
  const std::string prefill_line = calibrate_prefill(comm, in, row) + calibrate_batch_rows(comm, in, row);
  return fmt::format(
             "decode calibrated (CPU seconds): the kernel reads {:.2f} GB/s over {:.0f} MiB a rank (rank 0: {:.2f} "
             "GB/s, a "
             "plain read "
             "{:.2f} GB/s, fraction {:.2f}); a cache of at most {:.1f} MiB a node at {:.2f} GB/s (GB/s by MiB a "
             "rank:{}); a "
             "step's gather {:.1f} us; a request adds {:.2f} us a layer (cp = 1; heads {:.2f}, interleaved {:.2f}){}\n",
             in.cluster.kernel.memory_bandwidth / 1e9, d.bytes / double(1 << 20), d.kernel_bytes_s / 1e9,
             d.read_bytes_s / 1e9, d.kernel_bytes_s / d.read_bytes_s, row.llc_bytes / double(1 << 20),
             row.llc_bandwidth / 1e9, curve.substr(0, curve.size() - 1), row.collective_s * 1e6,
             row.request_s.unsharded * 1e6, row.request_s.heads * 1e6, row.request_s.interleaved * 1e6,
             products.empty()
                 ? std::string()
                 : fmt::format("; the row {:.3g} MFLOP a token at {:.2f} GFLOP/s one thread, weights {:.3g} MB",
                               row_flops(in, row) / 1e6, row.flops_per_s / 1e9,
                               row_weights(in, row) * double(dtype_size(in.dtype)) / 1e6)) +
         prefill_line;
}

std::string calibrate_prefill(Communicator& comm, const PlanInput& in, DecodeModel& row) {
  // The busiest rank's heads (Ulysses) streaming the prompt's keys: most of a causal prefill's
  // work is queries late in the prompt, each streaming nearly all of it (past the core's cache).
  const std::int64_t keys = in.seq, heads = (in.heads + in.cp - 1) / in.cp;
  const double block =
      block_efficiency(in.cluster.kernel, in.head_dim, double(kPrefillProbeQueries), double(keys), false);
  double per[2] = {block / cpu_prefill_rate(comm, in.head_dim, heads, keys, in.cluster.kernel.kv_pack_s_per_byte), 0.0};
  std::int64_t rows = 0;
  if (row.width > 0) {
    rows = std::min<std::int64_t>((in.seq + in.cp - 1) / in.cp, 16384);
    per[1] = train::prefill_row_seconds(gpt_of(in, row), rows);
  }
  comm.allreduce_max(per, 2);
  row.prefill_flops = 1 / per[0];
  row.prefill_token_s = per[1];
  return fmt::format(
      "prefill calibrated (CPU seconds): the forward at {:.1f} GFLOP/s a rank ({} queries of {} heads against {} "
      "keys); the prompt's rows {:.2f} us a token (all layers, {} rows a rank)\n",
      row.prefill_flops * block / 1e9, kPrefillProbeQueries, heads, keys, row.prefill_token_s * 1e6, rows);
}

namespace {

// --memory-bw over the calibrated memory rate; a ring step's merge keeps its measured seconds.
void keep_memory_bw(PlanInput& in, double memory_bw) {
  KernelModel& k = in.cluster.kernel;
  if (!(memory_bw > 0)) return;
  if (k.memory_bandwidth > 0) k.merge_passes *= memory_bw / k.memory_bandwidth;
  k.memory_bandwidth = memory_bw;
}

// What --calibrate measured, the figures the plan below is priced with.
void print_calibration(int ranks, const PlanInput& in) {
  fmt::print(
      "calibrated on {} ranks, {} per node: attention {:.1f} GFLOP/s per rank (the forward; the backward {:.2f}x its "
      "seconds); send/recv inside a node "
      "{:.2f} GB/s, {:.1f} us, between nodes {:.2f} GB/s, {:.1f} us ({:.3f} GB/s per rank with all sending "
      "across); a ring step's transfer hidden behind its compute {:.2f} inside a node, {:.2f} between nodes; "
      "all-to-all "
      "inside a node {:.2f} GB/s, {:.1f} us per peer; kernel half rate at key blocks of {:.0f} tokens (0: flat), "
      "{:.1f} us per call, a ring step's merge {:.1f} passes at {:.2f} GB/s, a call's K/V pack {:.3f} ns per "
      "byte, its working set past {:.1f} MiB {:.3f} ns per byte\n",
      ranks, in.cluster.ranks_per_node, in.cluster.peak_flops / 1e9, in.cluster.kernel.backward_ratio,
      in.cluster.intra.bandwidth / 1e9, in.cluster.intra.latency * 1e6, in.cluster.inter.bandwidth / 1e9,
      in.cluster.inter.latency * 1e6, in.cluster.inter_concurrent.bandwidth / 1e9, in.cluster.intra.overlap,
      in.cluster.inter.overlap, in.cluster.alltoall_intra.bandwidth / 1e9, in.cluster.alltoall_intra.latency * 1e6,
      in.cluster.kernel.kv_half, in.cluster.kernel.call_s * 1e6, in.cluster.kernel.merge_passes,
      in.cluster.kernel.memory_bandwidth / 1e9, in.cluster.kernel.kv_pack_s_per_byte * 1e9,
      in.cluster.kernel.stream_cache_bytes / (1 << 20), in.cluster.kernel.stream_s_per_byte * 1e9);
}

// An option given an empty value (--gpu "$GPU" with GPU unset) would read as one not given and
// change nothing: refused like an unknown value, naming what it takes.
void check_empty_values(const PlanOptions& o) {
  auto empty = [&](const char* flag, const std::string& v) { return o.given.count(flag) > 0 && v.empty(); };
  if (empty("--gpu", o.gpu)) (void)find_gpu_preset(o.gpu);  // unknown GPU '' (known: ...)
  if (empty("--kernel", o.kernel)) (void)find_kernel_preset(o.kernel);
  if (empty("--intra-fabric", o.intra_fabric)) (void)find_fabric_preset(o.intra_fabric);
  if (empty("--inter-fabric", o.inter_fabric)) (void)find_fabric_preset(o.inter_fabric);
  if (empty("--memory-bw", o.memory_bw)) (void)parse_bandwidth(o.memory_bw);
  const std::tuple<const char*, const std::string*, const char*> named[] = {
      {"--json", &o.json, "a file, or - for standard output"},
      {"--svg", &o.svg, "a file"},
      {"--docs", &o.docs, "the documents' lengths, e.g. 1000,5000,2192 or 16x1024"},
      {"--window", &o.window, "LEFT or LEFT,RIGHT, e.g. 4096 or 4096,0"},
      {"--lengths", &o.lengths, "NxL terms or pareto:N:MIN:MAX:ALPHA[:SEED]"},
      {"--grid", &o.grid, "quick or full"}};
  for (const auto& [flag, value, what] : named)
    if (empty(flag, *value)) throw Error(fmt::format("{} was given an empty value: name {}", flag, what));
}

}  // namespace

int run_plan(const PlanOptions& o) {
  check_empty_values(o);
  if (o.train) return run_plan_train(o);
  if (!o.grid.empty()) return run_plan_grid(o);
  if (!o.lengths.empty()) return run_plan_lengths(o);
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  PlanRequest req;
  PlanInput& in = req.in;
  const int node_ranks = o.calibrate ? comm.ranks_on_this_node() : 1;  // collective: outside the checks
  on_every_rank(comm, [&] {
    check_plan_option_effects(o, comm.size());
    if (comm.rank() == 0) check_outputs({{"--json", o.json, true}, {"--svg", o.svg}});  // before any work
    req = plan_request(o, comm.size());
    if (o.calibrate)
      check_memory("ulysses plan --calibrate (every strategy run for real)", measured_memory(in), 0, node_ranks);
  });
  std::vector<double> measured;
  std::string decode_line;
  if (o.calibrate) {
    const double memory_bw = in.cluster.kernel.memory_bandwidth;  // --memory-bw's, when given
    calibrate_cluster(comm, in);
    // Decode is timed in CPU seconds, as generate's one-thread ranks report it beside wall time.
    if (in.mode == PlanMode::decode) {
      cpu_time_cluster(comm, in);
      decode_line = calibrate_decode(comm, in, req.row);
    }
    keep_memory_bw(in, memory_bw);
  }
  Plan plan = make_plan(in);
  if (o.calibrate) {
    if (comm.rank() == 0) print_calibration(comm.size(), in);
    if (comm.rank() == 0) fmt::print("{}", decode_line);
    for (const PlanRow& r : plan.rows)
      measured.push_back(r.valid ? measure(comm, in, planned_config(in, r)) * double(in.layers) : -1);
    plan = plan_with_measured_band(in, plan, measured);
  }
  on_root(comm, [&] {
    print_plan(req, plan, measured);
    // Built only to be written: it lists every document (16M of them: 0.3 GB of JSON values).
    nlohmann::json j = o.json.empty() ? nlohmann::json::object() : to_json(req, plan, measured);
    if (in.mode == PlanMode::decode) j["decode"] = report_decode(in, req.row);
    if (o.cached >= 0) j["turn"] = report_turn(in, o.cached);
    if (o.scaling) j["scaling"] = scaling_table(in);
    std::vector<std::pair<std::string, std::string>> files;  // all or none
    if (!o.json.empty()) files.emplace_back(o.json, j.dump(2) + "\n");
    if (!o.svg.empty()) files.emplace_back(o.svg, svg_plot(in));
    write_files_atomic(files);
  });
  return 0;
}

}  // namespace ulysses::cli
