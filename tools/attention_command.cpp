#include "attention_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include "ulysses/comm/communicator_factory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agreement.hpp"
#include "guard.hpp"
#include "rank_errors.hpp"
#include "options.hpp"
#include "report.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/npy.hpp"
#include "ulysses/io/output_file.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/threads.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses::cli {

namespace {

// Global tensors read from and written to .npy files.
void add_file_options(CLI::App* c, AttentionOptions& o) {
  input_path(c->add_option("--q", o.q, "global query, .npy float32 [b, s, h, d]"), "file");
  input_path(c->add_option("--k", o.k, "global key, .npy float32 [b, s, h_kv, d]"), "file");
  input_path(c->add_option("--v", o.v, "global value, .npy float32 [b, s, h_kv, d]"), "file");
  input_path(c->add_option("--dout", o.dout, "global output gradient, .npy [b, s, h, d]; runs the backward"), "file");
  c->add_option("--out", o.out, "write the global output here (.npy, rank 0)");
  c->add_option("--dq", o.dq, "write the global dq here (.npy; needs a backward)");
  c->add_option("--dk", o.dk, "write the global dk here (.npy; needs a backward)");
  c->add_option("--dv", o.dv, "write the global dv here (.npy; needs a backward)");
}

// The random inputs drawn when no --q is given.
void add_random_input_options(CLI::App* c, AttentionOptions& o) {
  c->add_option("--batch", o.batch, "random inputs: batch size")->capture_default_str()->check(positive_number());
  c->add_option("--seq", o.seq, "random inputs: global sequence length")
      ->capture_default_str()
      ->check(positive_number());
  c->add_option("--heads", o.heads, "random inputs: query heads")->capture_default_str()->check(positive_number());
  c->add_option("--kv-heads", o.kv_heads, "random inputs: key/value heads (default: --heads)")
      ->check(positive_number());
  c->add_option("--head-dim", o.head_dim, "random inputs: head dim")->capture_default_str()->check(CLI::Range(1, 1024));
  c->add_option("--seed", o.seed, "random inputs: seed")->capture_default_str();
  c->add_flag("--backward", o.backward, "random inputs: draw a dout too and run the backward");
}

}  // namespace

void add_attention_command(CLI::App& app, AttentionOptions& o) {
  CLI::App* c = add_command(app, "attention",
                            "Run one distributed attention forward (and backward) over all ranks, optionally check it "
                            "against a float64 reference, time it and report bytes and memory per rank.");
  add_file_options(c, o);
  c->add_option("--strategy", o.strategy, "cp_comm_type: " + strategy_names(" | "))->capture_default_str();
  add_strategy_options(c, o.strategy_options);  // a2a+p2p's --cp-sizes, a2a's --overlap-chunks, ...
  c->add_flag("--causal", o.causal, "causal (lower-triangular) mask");
  input_path(
      c->add_option("--cu-seqlens", o.cu_seqlens,
                    "packed documents (FlashAttention varlen): cumulative lengths 0,N1,...,S over the global sequence, "
                    "or a file of them (.npy or text); no token attends across a document boundary; batch 1"),
      "file-or-list");
  c->add_option("--window", o.window,
                "sliding window L[,R] (FlashAttention's window_size; L alone means L,0; -1: unbounded): query i sees "
                "keys i-L..i+R; p2p and a2a+p2p then send only the halo the band reaches");
  c->add_option("--scale", o.scale, "softmax scale (default 1/sqrt(head_dim))");
  add_random_input_options(c, o);
  c->add_option("--dtype", o.dtype,
                "storage and wire dtype: f32 | bf16 (bf16 computes on the CPU's bf16 unit where it outruns the "
                "float32 FMA: AMX, AMD's AVX512_BF16; otherwise converted to float32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  c->add_option("--layout", o.layout, "per-rank tensor layout: bshd | sbhd")
      ->capture_default_str()
      ->check(CLI::IsMember({"bshd", "sbhd"}));
  c->add_flag("--allow-nonfinite", o.allow_nonfinite,
              "compute with NaN/Inf in the input files instead of refusing them");
  c->add_flag("--check", o.check, "compare with a float64 single-process reference; exit 1 above tolerance");
  c->add_option("--repeat", o.repeat, "time N runs after one warm-up and report medians")->check(non_negative_number());
  c->add_option("--threads", o.threads, "threads per rank (default: cores / ranks on the node)")
      ->check(CLI::Range(0, 1024));
  c->add_option("--json", o.json, "write a JSON report here (rank 0; - for standard output, after the text)");
  c->add_option("--trace", o.trace,
                "write a Chrome trace (chrome://tracing, ui.perfetto.dev) of the runs here "
                "(rank 0): one track per rank, compute and every communication operation with its bytes");
  c->add_flag("--no-zigzag", o.no_zigzag,
              "causal p2p/all_gather/a2a+p2p: contiguous chunks instead of zigzag "
              "(shows the imbalance zigzag fixes)");
  c->add_option("--kv-seq", o.kv_seq,
                "random inputs: cross-attention, k/v of this many tokens (default: --seq; "
                "--k/--v files may have another length than --q too); every built-in strategy")
      ->check(positive_number());
  c->add_option("--q-offset", o.q_offset,
                "cross-attention with --causal: query i sees keys j <= q_offset + i "
                "(required when the k/v length differs from q's)");
  add_timeout_option(c, o.timeout);
  add_backend_options(c, o.backend);
  c->final_callback([c, &o] {
    for (const CLI::Option* opt : c->get_options())
      if (opt->count() > 0) o.given.push_back(opt->get_name());
  });
}

namespace {

// Global (unsharded) problem, known identically on every rank.
struct Problem {
  Shape q, kv;  // global shapes
  bool backward = false;
  // Global inputs from files (empty when random).
  std::optional<NpyArray> fq, fk, fv, fdout;
};

Shape shape_of(const NpyArray& a, const std::string& path, const char* name) {
  if (a.shape.size() != 4)
    throw Error(
        fmt::format("{} ({}) must be 4-D [b, s, heads, head_dim], got {} dimensions", name, path, a.shape.size()));
  return {a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
}

// Throws Error unless `a` is 4-D and (unless allowed) finite.
void check_shape_and_finite(const NpyArray& a, const std::string& path, const char* name, bool allow_nonfinite) {
  shape_of(a, path, name);
  if (!allow_nonfinite) check_finite(a, name, path);
}

// Reads and checks the global inputs. Throws Error; the caller agrees it across ranks.
Problem load_problem(const AttentionOptions& o) {
  Problem p;
  const bool any_file = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (any_file) {
    if (o.q.empty() || o.k.empty() || o.v.empty()) throw Error("--q, --k and --v must be given together");
    // The files are the shapes and values: the random inputs' flags would change nothing.
    for (const char* flag :
         {"--batch", "--seq", "--heads", "--kv-heads", "--head-dim", "--seed", "--backward", "--kv-seq"})
      if (std::find(o.given.begin(), o.given.end(), flag) != o.given.end())
        throw Error(
            fmt::format("{} has no effect with --q/--k/--v, whose files give the shapes and values (it is "
                        "for random inputs): drop it{}",
                        flag, std::string(flag) == "--backward" ? " (--dout runs the backward)" : ""));
    p.fq = read_npy(o.q);
    p.fk = read_npy(o.k);
    p.fv = read_npy(o.v);
    p.q = shape_of(*p.fq, o.q, "q");
    check_shape_and_finite(*p.fk, o.k, "k", o.allow_nonfinite);
    check_shape_and_finite(*p.fv, o.v, "v", o.allow_nonfinite);
    check_shape_and_finite(*p.fq, o.q, "q", o.allow_nonfinite);
    p.kv = shape_of(*p.fk, o.k, "k");
    if (p.kv.b != p.q.b || p.kv.d != p.q.d)
      throw Error(fmt::format("k {} must be [b, s_k, h_kv, d] with q's b and d; q is {}", p.kv.str(), p.q.str()));
    const Shape v = shape_of(*p.fv, o.v, "v");
    if (!(v == p.kv)) throw Error(fmt::format("v {} must have k's shape {}", v.str(), p.kv.str()));
    if (!o.dout.empty()) {
      p.fdout = read_npy(o.dout);
      const Shape g = shape_of(*p.fdout, o.dout, "dout");
      check_shape_and_finite(*p.fdout, o.dout, "dout", o.allow_nonfinite);
      if (!(g == p.q)) throw Error(fmt::format("dout {} must have q's shape {}", g.str(), p.q.str()));
    }
    p.backward = p.fdout.has_value();
  } else {
    if (!o.dout.empty()) throw Error("--dout needs --q, --k and --v (or use --backward with random inputs)");
    const std::int64_t kvh = o.kv_heads > 0 ? o.kv_heads : o.heads;
    p.q = {o.batch, o.seq, o.heads, o.head_dim};
    p.kv = {o.batch, o.kv_seq > 0 ? o.kv_seq : o.seq, kvh, o.head_dim};
    p.backward = o.backward;
  }
  if (p.q.numel() == 0 || p.kv.numel() == 0) throw Error(fmt::format("empty inputs: q {} k {}", p.q.str(), p.kv.str()));
  if ((!o.dq.empty() || !o.dk.empty() || !o.dv.empty()) && !p.backward)
    throw Error("--dq/--dk/--dv need a backward: give --dout (or --backward with random inputs)");
  return p;
}

// The global shape of input `which` (0 q, 1 k, 2 v, 3 dout).
Shape global_shape(const Problem& p, int which) { return which == 1 || which == 2 ? p.kv : p.q; }

// Input `which` holding the global rows `chunks`, in dtype/layout: cut from its file, or
// drawn so that its values depend on global positions only (the same problem at every cp).
Tensor make_input(const Problem& p, int which, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout,
                  std::uint64_t seed) {
  const Shape g = global_shape(p, which);
  const std::optional<NpyArray>* files[] = {&p.fq, &p.fk, &p.fv, &p.fdout};
  const std::optional<NpyArray>& f = *files[which];
  if (f)
    return shard_of(TensorView::dense(const_cast<float*>(f->data.data()), DType::f32, g, Layout::bshd), chunks, dtype,
                    layout);
  Tensor t({g.b, total_tokens(chunks), g.h, g.d}, dtype, layout);  // all the chunks' tokens
  fill_uniform_shard(t.view(), seed * 4 + std::uint64_t(which), chunks);
  return t;
}

// The whole of input `which`, dense bshd: what the single-process checks compute on.
Tensor global_input(const Problem& p, int which, DType dtype, std::uint64_t seed) {
  return make_input(p, which, {{0, global_shape(p, which).s}}, dtype, Layout::bshd, seed);
}

// Everything every rank agrees on before any work: the problem and how it is split.
struct Setup {
  Problem p;
  CpConfig cfg;
  DType dtype = DType::f32;
  Layout layout = Layout::bshd;
  std::vector<std::vector<SeqChunk>> chunks;     // the tokens of each rank
  std::vector<std::vector<SeqChunk>> kv_chunks;  // the k/v tokens of each rank (cross-attention: its own)
  int cp = 1, threads = 1;
};

// The planner's view of this run: one node of cp ranks, the default cluster's links.
PlanInput plan_input_of(const Setup& s) {
  const Problem& p = s.p;
  PlanInput in;
  in.seq = p.q.s, in.batch = p.q.b, in.heads = p.q.h, in.kv_heads = p.kv.h, in.head_dim = p.q.d, in.cp = s.cp;
  in.causal = s.cfg.causal, in.dtype = s.dtype, in.cluster.ranks_per_node = s.cp;
  return in;
}

// Bytes per rank (input files, shards, the strategy's working set) and on rank 0 besides
// (gathered outputs, --check's float64 reference): what the memory check compares.
std::pair<double, double> memory_need(const Setup& s, const AttentionOptions& o) {
  const Problem& p = s.p;
  const double q = double(p.q.numel()), kv = double(p.kv.numel()), grads = p.backward ? 2 : 1;
  const double files = p.fq ? 4 * (q * grads + 2 * kv) : 0;
  const double shards = double(dtype_size(s.dtype)) * grads * (2 * q + 2 * kv) / s.cp;
  const double working = planned_memory_bytes(find_strategy(s.cfg.cp_comm_type), plan_input_of(s), s.cfg);
  const bool outputs = !o.out.empty() || !o.dq.empty() || !o.dk.empty() || !o.dv.empty();
  const double gathered = o.check || outputs ? 4 * grads * (q + kv) : 0;
  return {files + shards + grads * working, gathered + (o.check ? 12 * grads * (2 * q + 2 * kv) : 0)};
}

// Not collective. Every file the command writes, against each other and the files it reads,
// before any work (ulysses/io/output_file.hpp's rules).
void check_files(const AttentionOptions& o) {
  check_outputs(
      {{"--out", o.out},
       {"--dq", o.dq},
       {"--dk", o.dk},
       {"--dv", o.dv},
       {"--json", o.json, true},
       {"--trace", o.trace}},
      {{"--q", o.q}, {"--k", o.k}, {"--v", o.v}, {"--dout", o.dout}, {"--cu-seqlens", cu_seqlens_file(o.cu_seqlens)}});
}

// Collective. Parses the options and reads the inputs on every rank, then agrees: a file may be
// unreadable on one rank only.
Setup setup(Communicator& comm, const AttentionOptions& o) {
  Setup s;
  const int cp = s.cp = comm.size();
  const int fallback = default_threads(comm);  // collective: on every rank, --threads given or not
  s.threads = o.threads > 0 ? o.threads : fallback;
  set_threads(s.threads);
  const int node_ranks = comm.ranks_on_this_node();
  on_every_rank(comm, [&] {
    if (comm.rank() == 0) check_files(o);
    s.dtype = parse_dtype(o.dtype);
    s.layout = parse_layout(o.layout);
    s.cfg = parse_strategy(o.strategy, o.strategy_options, cp);
    s.cfg.causal = o.causal;
    s.cfg.zigzag = !o.no_zigzag;
    if (o.scale && !(std::isfinite(*o.scale) && *o.scale > 0.0f))
      throw Error(fmt::format("--scale must be finite and > 0 (absent: 1/sqrt(head_dim)), got {}", *o.scale));
    s.cfg.scale = o.scale;
    s.cfg.q_offset = o.q_offset;
    s.p = load_problem(o);
    const bool cross = is_cross(s.cfg, s.p.q.s, s.p.kv.s);
    if (cross) validate_cp_config(s.cfg, cp, s.p.q, s.p.kv.h, s.p.kv.s);  // its rules before the planner's
    if (!o.cu_seqlens.empty()) s.cfg.cu_seqlens = parse_cu_seqlens(o.cu_seqlens);
    if (!o.window.empty()) std::tie(s.cfg.window_left, s.cfg.window_right) = parse_window(o.window, o.causal);
    if (!o.cu_seqlens.empty() || !o.window.empty()) validate_cp_config(s.cfg, cp, s.p.q, s.p.kv.h, s.p.kv.s);
    const Strategy& strategy = find_strategy(s.cfg.cp_comm_type);
    if (no_option_given(s.cfg, o.strategy_options) && cp > 1 && !cross &&
        !strategy.tunings(s.cfg, cp, s.p.kv.h).empty()) {  // the planner's choice (a2a's overlap_chunks)
      validate_cp_config(s.cfg, cp, s.p.q, s.p.kv.h);      // the strategy's own message before the planner's
      s.cfg = plan_tuning(plan_input_of(s), s.cfg);
    }
    s.chunks = all_rank_chunks(s.cfg, cp, s.p.q.s);
    s.kv_chunks = all_rank_chunks(s.cfg, cp, s.p.kv.s);
    const auto [per_rank, root] = memory_need(s, o);
    check_memory("ulysses attention", per_rank, root, node_ranks);
  });
  if (s.p.fq) agree_same_inputs(comm, {&*s.p.fq, &*s.p.fk, &*s.p.fv, s.p.fdout ? &*s.p.fdout : &*s.p.fq});
  return s;
}

void print_header(const Setup& s) {
  const Problem& p = s.p;
  const CpConfig& cfg = s.cfg;
  std::printf("ulysses attention: cp_comm_type %s, cp = %d ranks x %d thread(s)\n", cfg.cp_comm_type.c_str(), s.cp,
              s.threads);
  std::printf("%s", find_strategy(cfg.cp_comm_type).describe(cfg, s.cp, p.kv.h).c_str());
  std::printf("  kernels: isa %s, engine %s; OpenBLAS core %s\n", kernel_isa(), kernel_engine(s.dtype).c_str(),
              blas_core().c_str());
  std::printf("  global q %s, k/v %s, %s, %s%s, scale %.4g\n", p.q.str().c_str(), p.kv.str().c_str(),
              to_string(s.dtype), to_string(s.layout), cfg.causal ? ", causal" : "",
              effective_scale(attention_params(cfg), p.q.d));
  std::string where;
  constexpr std::size_t kShown = 4;  // per-document zigzag: two chunks per document
  for (std::size_t i = 0; i < std::min(s.chunks[0].size(), kShown); ++i)
    where += fmt::format(" [{}, {})", s.chunks[0][i].begin, s.chunks[0][i].begin + s.chunks[0][i].length);
  if (s.chunks[0].size() > kShown) where += fmt::format(" ... ({} chunks)", s.chunks[0].size());
  std::vector<std::int64_t> tokens;
  std::vector<std::string> heads;
  for (int r = 0; r < s.cp; ++r) {
    tokens.push_back(total_tokens(s.chunks[std::size_t(r)]));
    const RankHeads h = find_strategy(cfg.cp_comm_type).heads_of(cfg, s.cp, r, p.q.h, p.kv.h);
    heads.push_back(fmt::format("{}/{}", h.q.count, h.kv.count));
  }
  std::printf("  tokens per rank: %s; rank 0 holds tokens%s%s\n", fmt::format("{}", fmt::join(tokens, ", ")).c_str(),
              where.c_str(), uses_zigzag(cfg) ? fmt::format(" ({})", layout_name(token_layout(cfg))).c_str() : "");
  std::printf("  query/KV heads per rank: %s\n", fmt::format("{}", fmt::join(heads, ", ")).c_str());
  if (cfg.window_left >= 0 || cfg.window_right >= 0)
    std::printf("  sliding window (%lld, %lld): query i sees keys i-%lld..i+%lld%s\n", (long long)cfg.window_left,
                (long long)cfg.window_right, (long long)cfg.window_left, (long long)cfg.window_right,
                cfg.window_left < 0 || cfg.window_right < 0 ? " (-1: unbounded)" : "");
  if (const auto& cu = cfg.cu_seqlens; !cu.empty()) {
    std::vector<std::int64_t> len;
    for (std::size_t i = 1; i < cu.size(); ++i) len.push_back(cu[i] - cu[i - 1]);
    std::sort(len.begin(), len.end());
    std::printf("  packed documents: %zu (lengths %lld .. %lld, median %lld); none attends across a boundary\n",
                len.size(), (long long)len.front(), (long long)len.back(), (long long)len[len.size() / 2]);
  }
  std::fflush(stdout);
}

// This rank's shards of the inputs and outputs, in the run's dtype and layout (dout and the
// gradients only with a backward).
struct Shards {
  Tensor q, k, v, out, dout, dq, dk, dv;
};

Shards make_shards(const Setup& s, int rank, std::uint64_t seed) {
  auto input = [&](int which) {
    const auto& chunks = which == 1 || which == 2 ? s.kv_chunks : s.chunks;
    return make_input(s.p, which, chunks[std::size_t(rank)], s.dtype, s.layout, seed);
  };
  Shards t;
  t.q = input(0);
  t.k = input(1);
  t.v = input(2);
  t.out = Tensor(t.q.shape(), s.dtype, s.layout);
  if (s.p.backward) {
    t.dout = input(3);
    t.dq = Tensor(t.q.shape(), s.dtype, s.layout);
    t.dk = Tensor(t.k.shape(), s.dtype, s.layout);
    t.dv = Tensor(t.k.shape(), s.dtype, s.layout);
  }
  return t;
}

double max_over_ranks(Communicator& comm, double x) {
  comm.allreduce_max(&x, 1);
  return x;
}

// Collective. Seconds the slowest rank spends in fn, all ranks starting together.
double timed(Communicator& comm, const std::function<void()>& fn) {
  comm.barrier();
  const double t0 = comm.now();
  fn();
  return max_over_ranks(comm, comm.now() - t0);
}

// The slowest rank's times: medians over the timed runs, and the last run's split into
// compute and the communication that compute did not hide.
struct Timing {
  std::vector<std::int64_t> work;  // visible (query, key) pairs each rank computed in the forward (this
                                   // rank's alone until run_attention gathers them)
  double forward_s = 0, backward_s = 0;
  double forward_compute_s = 0, forward_exposed_s = 0, backward_compute_s = 0, backward_exposed_s = 0;
};

// Collective. One untimed warm-up when timing, then `repeat` timed runs; the counters hold the
// bytes of exactly the last run.
Timing run_timed(Communicator& comm, ContextParallelAttention& attn, const Shards& t, bool backward, int repeat) {
  std::vector<double> fwd, bwd;
  CpContext ctx;
  CpStats bs;
  const int runs = repeat > 0 ? repeat + 1 : 1;
  for (int i = 0; i < runs; ++i) {
    if (i == runs - 1) comm.reset_counters();
    ctx = CpContext();  // the previous run's memory goes before the next forward
    const double tf = timed(comm, [&] { ctx = attn.forward(t.out.view(), t.q.view(), t.k.view(), t.v.view()); });
    const double tb =
        backward ? timed(comm, [&] { bs = attn.backward(ctx, t.dq.view(), t.dk.view(), t.dv.view(), t.dout.view()); })
                 : 0;
    if (repeat == 0 || i > 0) {
      fwd.push_back(tf);
      bwd.push_back(tb);
    }
  }
  const CpStats& fs = ctx.stats();
  return {{fs.score_pairs},
          median(fwd),
          median(bwd),
          max_over_ranks(comm, fs.compute_s),
          max_over_ranks(comm, fs.comm_exposed_s),
          max_over_ranks(comm, bs.compute_s),
          max_over_ranks(comm, bs.comm_exposed_s)};
}

// Collective: the counter names of rank 0 and those of the formula (a window's halo exchange
// has ranks that never use some operation: rank 0 of a contiguous ring gets no halo).
std::vector<std::string> counter_names(Communicator& comm, const Setup& s) {
  std::string joined;
  for (const auto& [op, c] : comm.counters())
    if (!op.ends_with("validate")) joined += op + "\n";
  std::int64_t n = std::int64_t(joined.size());
  comm.broadcast(&n, sizeof(n), 0);
  joined.resize(std::size_t(n));
  comm.broadcast(joined.data(), joined.size(), 0);
  std::vector<std::string> names;
  for (std::size_t pos = 0; pos < joined.size();) {
    const std::size_t end = joined.find('\n', pos);
    names.push_back(joined.substr(pos, end - pos));
    pos = end + 1;
  }
  const CommVolume v = predicted_comm_volume(s.cfg, s.cp, s.p.q, s.p.kv.h, s.dtype);
  for (const auto* bytes : {&v.forward_bytes, &v.backward_bytes})
    for (const auto& [op, n] : *bytes)
      if (std::find(names.begin(), names.end(), op) == names.end()) names.push_back(op);
  std::sort(names.begin(), names.end());
  return names;
}

// The global outputs on rank 0, those an option needs (empty elsewhere).
struct Results {
  Tensor out, dq, dk, dv;
};

// Collective.
Results gather_results(Communicator& comm, const Setup& s, const Shards& t, const AttentionOptions& o) {
  const bool need_out = o.check || !o.out.empty();
  const bool need_grads = s.p.backward && (o.check || !o.dq.empty() || !o.dk.empty() || !o.dv.empty());
  Results g;
  if (need_out) g.out = gather_global(comm, t.out.view(), s.chunks);
  if (need_grads) {
    g.dq = gather_global(comm, t.dq.view(), s.chunks);
    g.dk = gather_global(comm, t.dk.view(), s.kv_chunks);
    g.dv = gather_global(comm, t.dv.view(), s.kv_chunks);
  }
  return g;
}

// Bytes per operation for one forward (and backward) of `volume`.
std::map<std::string, std::int64_t> expected_bytes(const Setup& s, const CommVolume& volume) {
  std::map<std::string, std::int64_t> expected = volume.forward_bytes;
  if (s.p.backward)
    for (const auto& [op, n] : volume.backward_bytes) expected[op] += n;
  return expected;
}

// Each rank's record with the bytes its formula says it sends ("expected_bytes_sent"): ranks
// differ when the tokens or heads do not split evenly.
nlohmann::json with_expected_bytes(const Setup& s, nlohmann::json ranks) {
  for (auto& r : ranks)
    r["expected_bytes_sent"] =
        expected_bytes(s, predicted_comm_volume(s.cfg, s.cp, int(r["rank"]), s.p.q, s.p.kv.h, s.dtype, s.p.kv.s));
  return ranks;
}

// FlashAttention's count; with documents, a window or cross-attention, exactly 4·d per visible
// (query, key) pair.
double forward_flops(const Setup& s) {
  const Shape& q = s.p.q;
  const std::int64_t sk = s.p.kv.s;
  if (s.cfg.cu_seqlens.empty() && s.cfg.window_left < 0 && s.cfg.window_right < 0 && !is_cross(s.cfg, q.s, sk))
    return attention_forward_flops(q.b, q.s, q.s, q.h, q.d, s.cfg.causal);
  return 4.0 * double(q.b * q.h * q.d) *
         double(visible_pairs(attention_params(s.cfg), {s.cfg.q_offset.value_or(0), q.s}, {0, sk}));
}

// The busiest rank's attention work over the mean: what load imbalance costs in time.
double work_imbalance(const std::vector<std::int64_t>& work) {
  const double total = double(std::accumulate(work.begin(), work.end(), std::int64_t(0)));
  return total > 0 ? double(*std::max_element(work.begin(), work.end())) * double(work.size()) / total : 1.0;
}

void print_times(const Setup& s, const Timing& t, int repeat) {
  const double fflops = forward_flops(s);
  std::printf("time (slowest rank%s):\n", repeat > 0 ? fmt::format(", median of {} runs", repeat).c_str() : "");
  std::printf("  forward  %10.3f ms  %8.2f GFLOP/s   compute %.3f ms, exposed communication %.3f ms\n",
              t.forward_s * 1e3, fflops / t.forward_s * 1e-9, t.forward_compute_s * 1e3, t.forward_exposed_s * 1e3);
  if (s.p.backward)
    std::printf("  backward %10.3f ms  %8.2f GFLOP/s   compute %.3f ms, exposed communication %.3f ms\n",
                t.backward_s * 1e3, 2.5 * fflops / t.backward_s * 1e-9, t.backward_compute_s * 1e3,
                t.backward_exposed_s * 1e3);
  std::printf("attention work per rank (visible query-key pairs, forward): %s; busiest / mean %.3f\n",
              fmt::format("{}", fmt::join(t.work, ", ")).c_str(), work_imbalance(t.work));
}

// Bytes each rank sent, per operation, against its formula (one forward [+ backward]).
void print_traffic(const nlohmann::json& ranks, const std::vector<std::string>& ops) {
  std::printf("bytes each rank sent, per operation (formula in brackets):\n");
  for (const auto& r : ranks) {
    std::string line = fmt::format("  rank {}:", int(r["rank"]));
    const nlohmann::json& expected = r["expected_bytes_sent"];
    for (const std::string& op : ops)
      line += fmt::format(" {} {} [{}]", op, human_bytes(double(r["bytes_sent"][op])),
                          expected.contains(op) ? human_bytes(double(expected[op])) : "?");
    std::printf("%s; peak memory %s\n", line.c_str(), human_bytes(double(r["peak_rss_bytes"])).c_str());
  }
}

// The JSON report; check_against_reference adds its "check". Its "expected_bytes_sent" are each
// counter's busiest rank (every rank's when the tokens and heads split evenly); each rank's own
// are in its record.
nlohmann::json make_report(const Setup& s, const AttentionOptions& o, const Timing& t, const nlohmann::json& ranks,
                           const std::map<std::string, std::int64_t>& expected) {
  const Problem& p = s.p;
  const CpConfig& cfg = s.cfg;
  const double fflops = forward_flops(s);
  nlohmann::json report{{"command", "attention"},
                        {"strategy", cfg.cp_comm_type},
                        {"cp", s.cp},
                        {"cp_sizes", cfg.hierarchical_context_parallel_sizes},
                        {"threads_per_rank", s.threads},
                        {"kernel_isa", kernel_isa()},
                        {"kernel_engine", kernel_engine(s.dtype)},
                        {"dtype", to_string(s.dtype)},
                        {"layout", to_string(s.layout)},
                        {"causal", cfg.causal},
                        {"scale", effective_scale(attention_params(cfg), p.q.d)},
                        {"q_shape", {p.q.b, p.q.s, p.q.h, p.q.d}},
                        {"kv_shape", {p.kv.b, p.kv.s, p.kv.h, p.kv.d}},
                        {"repeat", o.repeat},
                        {"forward_s", t.forward_s},
                        {"backward_s", p.backward ? t.backward_s : 0.0},
                        {"forward_gflops", fflops / t.forward_s * 1e-9},
                        {"forward_compute_s", t.forward_compute_s},
                        {"forward_comm_exposed_s", t.forward_exposed_s},
                        {"expected_bytes_sent", expected},
                        {"ranks", ranks},
                        {"work_pairs_per_rank", t.work},
                        {"work_imbalance", work_imbalance(t.work)},
                        {"cu_seqlens", cfg.cu_seqlens},
                        {"window", {cfg.window_left, cfg.window_right}},
                        {"overlap_chunks", ulysses_overlap_chunks(cfg.overlap_chunks, s.cp, p.kv.h)}};
  if (p.backward) {
    report["backward_gflops"] = 2.5 * fflops / t.backward_s * 1e-9;
    report["backward_compute_s"] = t.backward_compute_s;
    report["backward_comm_exposed_s"] = t.backward_exposed_s;
  }
  return report;
}

// The float64 single-process reference outputs (the gradients only with a backward).
struct Reference {
  RefTensor out, dq, dk, dv;
};

Reference reference(const Setup& s, std::uint64_t seed) {
  auto global_ref = [&](int which) { return RefTensor::from(global_input(s.p, which, s.dtype, seed).view()); };
  const RefTensor rq = global_ref(0), rk = global_ref(1), rv = global_ref(2);
  const AttentionParams ap = attention_params(s.cfg);
  Reference r;
  std::vector<double> lse;
  reference_attention_forward(r.out, lse, rq, rk, rv, ap);
  if (s.p.backward) reference_attention_backward(r.dq, r.dk, r.dv, global_ref(3), rq, rk, rv, ap);
  return r;
}

using Errors = std::vector<std::pair<const char*, double>>;  // relative error of each output

// The --check of a bf16 run, repeated with float32 compute: the global bf16 inputs widened
// to float32, one process's flash kernels, outputs rounded to bf16 like the real run's.
Errors float32_compute_errors(const Setup& s, std::uint64_t seed, const Reference& ref) {
  const Problem& p = s.p;
  auto input = [&](int which) { return copy_of(global_input(p, which, DType::bf16, seed).view(), DType::f32); };
  const Tensor q = input(0), k = input(1), v = input(2);
  const AttentionParams ap = attention_params(s.cfg);
  Tensor out(p.q), out16(p.q, DType::bf16);
  const Tensor lse = lse_tensor(p.q);
  flash_attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), ap);
  copy(out.view(), out16.view());
  Errors errs{{"out", relative_error(out16.view(), ref.out)}};
  if (!p.backward) return errs;
  const Tensor dout = input(3);
  Tensor dq(p.q, DType::bf16), dk(p.kv, DType::bf16), dv(p.kv, DType::bf16);
  flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                           lse.view(), ap);
  errs.insert(errs.end(), {{"dq", relative_error(dq.view(), ref.dq)},
                           {"dk", relative_error(dk.view(), ref.dk)},
                           {"dv", relative_error(dv.view(), ref.dv)}});
  return errs;
}

// `title`, then "  name error" for each error, which also go into `record`.
std::string error_line(std::string title, const Errors& errs, nlohmann::json& record) {
  for (auto [name, e] : errs) {
    title += fmt::format("  {} {:.2e}", name, e);
    record[name] = e;
  }
  return title;
}

// Compares the gathered outputs with the reference, prints the errors and records them in
// report["check"]. True when one is above the tolerance (or NaN).
bool check_against_reference(const Setup& s, const Results& g, std::uint64_t seed, nlohmann::json& report) {
  std::printf("checking against the float64 reference (one process)...\n");
  std::fflush(stdout);
  const Reference ref = reference(s, seed);
  const double tol = s.dtype == DType::f32 ? 1e-4 : 3e-2;
  Errors errs{{"out", relative_error(g.out.view(), ref.out)}};
  if (s.p.backward)
    errs.insert(errs.end(), {{"dq", relative_error(g.dq.view(), ref.dq)},
                             {"dk", relative_error(g.dk.view(), ref.dk)},
                             {"dv", relative_error(g.dv.view(), ref.dv)}});
  nlohmann::json& check = report["check"];
  const std::string line = error_line("relative error |x-ref|/|ref|:", errs, check);
  const bool failed = std::any_of(errs.begin(), errs.end(), [&](const auto& e) { return !(e.second <= tol); });
  check["tolerance"] = tol;
  check["passed"] = !failed;
  std::printf("%s  (tolerance %.0e) %s\n", line.c_str(), tol, failed ? "FAILED" : "OK");
  if (s.dtype == DType::bf16)  // what the bf16 engine costs: the same inputs, float32 compute
    std::printf("%s\n", error_line("  same bf16 inputs, float32 compute (one process):",
                                   float32_compute_errors(s, seed, ref), check["float32_compute"])
                            .c_str());
  return failed;
}

// Every output asked for, all or none (write_files_atomic).
void write_outputs(const AttentionOptions& o, const Setup& s, const Results& g, const nlohmann::json& report,
                   const std::string& trace) {
  const Shape& q = s.p.q;
  const Shape& kv = s.p.kv;
  std::vector<std::pair<std::string, std::string>> files;
  if (!o.out.empty()) files.emplace_back(o.out, npy_bytes(g.out.f32(), {q.b, q.s, q.h, q.d}));
  if (!o.dq.empty()) files.emplace_back(o.dq, npy_bytes(g.dq.f32(), {q.b, q.s, q.h, q.d}));
  if (!o.dk.empty()) files.emplace_back(o.dk, npy_bytes(g.dk.f32(), {kv.b, kv.s, kv.h, kv.d}));
  if (!o.dv.empty()) files.emplace_back(o.dv, npy_bytes(g.dv.f32(), {kv.b, kv.s, kv.h, kv.d}));
  if (!o.json.empty()) files.emplace_back(o.json, report.dump(2) + "\n");
  if (!o.trace.empty()) files.emplace_back(o.trace, trace);
  write_files_atomic(files);
}

}  // namespace

int run_attention(const AttentionOptions& o) {
  const std::unique_ptr<Communicator> world = make_communicator(o.backend.comm);
  Communicator& comm = *world;
  comm.set_timeout(o.timeout);
  const Setup s = setup(comm, o);
  if (comm.rank() == 0) print_header(s);
  const Shards t = make_shards(s, comm.rank(), o.seed);
  ContextParallelAttention attn(comm, s.cfg);
  std::optional<Tracer> tracer;
  if (!o.trace.empty()) tracer.emplace(comm);
  Timing timing = run_timed(comm, attn, t, s.p.backward, o.repeat);
  const std::vector<TraceEvent> events = tracer ? tracer->events() : std::vector<TraceEvent>();
  tracer.reset();  // the runs only, not the reports' traffic
  const std::vector<std::string> ops = counter_names(comm, s);
  const nlohmann::json ranks = gather_rank_stats(comm, ops);
  timing.work = comm.allgather_value(timing.work[0], "report");  // after the counters were read
  const Results g = gather_results(comm, s, t, o);
  const std::string trace = o.trace.empty() ? "" : chrome_trace_json(comm, events);  // after the reports' counters
  int failed = 0;  // rank 0's verdict, sent to every rank: all of them exit with the same code
  on_root(comm, [&] {
    const nlohmann::json checked = with_expected_bytes(s, ranks);
    const auto busiest = expected_bytes(s, predicted_comm_volume(s.cfg, s.cp, s.p.q, s.p.kv.h, s.dtype, s.p.kv.s));
    nlohmann::json report = make_report(s, o, timing, checked, busiest);
    print_times(s, timing, o.repeat);
    print_traffic(checked, ops);
    if (o.check) failed = check_against_reference(s, g, o.seed, report);
    if (!failed) write_outputs(o, s, g, report, trace);  // a failed --check writes nothing
  });
  comm.broadcast(&failed, sizeof(failed), 0);
  return failed ? 1 : 0;
}

}  // namespace ulysses::cli
