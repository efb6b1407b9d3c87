#include "attention_command.hpp"

#include <fmt/format.h>
#include "ulysses/mpi_communicator.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <optional>

#include "report.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/reference.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/threads.hpp"

namespace ulysses::cli {

void add_attention_command(CLI::App& app, AttentionOptions& o) {
  CLI::App* c = app.add_subcommand(
      "attention",
      "Run one distributed attention forward (and backward) over all ranks, optionally check it "
      "against a float64 reference, time it and report bytes and memory per rank.");
  c->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // the last one wins
  c->add_option("--q", o.q, "global query, .npy float32 [b, s, h, d]");
  c->add_option("--k", o.k, "global key, .npy float32 [b, s, h_kv, d]");
  c->add_option("--v", o.v, "global value, .npy float32 [b, s, h_kv, d]");
  c->add_option("--dout", o.dout, "global output gradient, .npy [b, s, h, d]; runs the backward");
  c->add_option("--out", o.out, "write the global output here (.npy, rank 0)");
  c->add_option("--dq", o.dq, "write the global dq here (.npy; needs a backward)");
  c->add_option("--dk", o.dk, "write the global dk here (.npy; needs a backward)");
  c->add_option("--dv", o.dv, "write the global dv here (.npy; needs a backward)");
  c->add_option("--strategy", o.strategy, "cp_comm_type: " + strategy_names(" | "))
      ->capture_default_str();
  c->add_option("--cp-sizes", o.cp_sizes, "hierarchical_context_parallel_sizes INNER,OUTER (a2a+p2p)");
  c->add_flag("--causal", o.causal, "causal (lower-triangular) mask");
  c->add_option("--scale", o.scale, "softmax scale (default 1/sqrt(head_dim))");
  c->add_option("--batch", o.batch, "random inputs: batch size")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--seq", o.seq, "random inputs: global sequence length")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--heads", o.heads, "random inputs: query heads")->capture_default_str()->check(CLI::PositiveNumber);
  c->add_option("--kv-heads", o.kv_heads, "random inputs: key/value heads (default: --heads)")->check(CLI::PositiveNumber);
  c->add_option("--head-dim", o.head_dim, "random inputs: head dim")->capture_default_str()->check(CLI::Range(1, 1024));
  c->add_option("--seed", o.seed, "random inputs: seed")->capture_default_str();
  c->add_flag("--backward", o.backward, "random inputs: draw a dout too and run the backward");
  c->add_option("--dtype", o.dtype, "storage and wire dtype: f32 | bf16 (bf16 computes on the CPU's bf16 engine, AMX, where it has one: "
                 "a2a and cp = 1; otherwise in float32)")
      ->capture_default_str()->check(CLI::IsMember({"f32", "bf16"}));
  c->add_option("--layout", o.layout, "per-rank tensor layout: bshd | sbhd")
      ->capture_default_str()->check(CLI::IsMember({"bshd", "sbhd"}));
  c->add_flag("--check", o.check, "compare with a float64 single-process reference; exit 1 above tolerance");
  c->add_option("--repeat", o.repeat, "time N runs after one warm-up and report medians")->check(CLI::NonNegativeNumber);
  c->add_option("--threads", o.threads, "threads per rank (default: cores / ranks on the node)")->check(CLI::NonNegativeNumber);
  c->add_option("--json", o.json, "write a JSON report here (rank 0)");
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
    throw Error(fmt::format("{} ({}) must be 4-D [b, s, heads, head_dim], got {} dimensions", name, path,
                            a.shape.size()));
  return {a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
}

// Reads and checks the global inputs. Throws Error; the caller agrees it across ranks.
Problem load_problem(const AttentionOptions& o) {
  Problem p;
  const bool any_file = !o.q.empty() || !o.k.empty() || !o.v.empty();
  if (any_file) {
    if (o.q.empty() || o.k.empty() || o.v.empty()) throw Error("--q, --k and --v must be given together");
    p.fq = read_npy(o.q);
    p.fk = read_npy(o.k);
    p.fv = read_npy(o.v);
    p.q = shape_of(*p.fq, o.q, "q");
    p.kv = shape_of(*p.fk, o.k, "k");
    if (p.kv.b != p.q.b || p.kv.s != p.q.s || p.kv.d != p.q.d)
      throw Error(fmt::format("k {} must be [b, s, h_kv, d] with q's b, s and d; q is {}", p.kv.str(), p.q.str()));
    const Shape v = shape_of(*p.fv, o.v, "v");
    if (!(v == p.kv)) throw Error(fmt::format("v {} must have k's shape {}", v.str(), p.kv.str()));
    if (!o.dout.empty()) {
      p.fdout = read_npy(o.dout);
      const Shape g = shape_of(*p.fdout, o.dout, "dout");
      if (!(g == p.q)) throw Error(fmt::format("dout {} must have q's shape {}", g.str(), p.q.str()));
    }
    p.backward = p.fdout.has_value();
  } else {
    if (!o.dout.empty()) throw Error("--dout needs --q, --k and --v (or use --backward with random inputs)");
    const std::int64_t kvh = o.kv_heads > 0 ? o.kv_heads : o.heads;
    p.q = {o.batch, o.seq, o.heads, o.head_dim};
    p.kv = {o.batch, o.seq, kvh, o.head_dim};
    p.backward = o.backward;
  }
  if (p.q.numel() == 0 || p.kv.numel() == 0) throw Error(fmt::format("empty inputs: q {} k {}", p.q.str(), p.kv.str()));
  if ((!o.dq.empty() || !o.dk.empty() || !o.dv.empty()) && !p.backward)
    throw Error("--dq/--dk/--dv need a backward: give --dout (or --backward with random inputs)");
  return p;
}

// Tensor `which` (0 q, 1 k, 2 v, 3 dout) holding the global rows `chunks`, in dtype/layout.
Tensor make_input(const Problem& p, int which, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout,
                  std::uint64_t seed);

// The --check of a bf16 run, repeated with float32 compute: the global bf16 inputs widened
// to float32, one process's flash kernels, outputs rounded to bf16 like the real run's.
std::vector<std::pair<const char*, double>> float32_compute_errors(const Problem& p, const CpConfig& cfg,
                                                                   std::uint64_t seed, const RefTensor& rout,
                                                                   const RefTensor& rdq, const RefTensor& rdk,
                                                                   const RefTensor& rdv) {
  auto input = [&](int which) {
    const Shape g = (which == 1 || which == 2) ? p.kv : p.q;
    Tensor t(g);
    copy(make_input(p, which, {{0, g.s}}, DType::bf16, Layout::bshd, seed).view(), t.view());
    return t;
  };
  const Tensor q = input(0), k = input(1), v = input(2);
  const AttentionParams ap{cfg.causal, cfg.scale, 0, 0};
  Tensor out(p.q), out16(p.q, DType::bf16);
  std::vector<float> lse(std::size_t(p.q.b * p.q.h * p.q.s));
  flash_attention_forward(out.view(), lse.data(), q.view(), k.view(), v.view(), ap);
  copy(out.view(), out16.view());
  std::vector<std::pair<const char*, double>> errs{{"out", relative_error(out16.view(), rout)}};
  if (!p.backward) return errs;
  const Tensor dout = input(3);
  Tensor dq(p.q, DType::bf16), dk(p.kv, DType::bf16), dv(p.kv, DType::bf16);
  flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                           lse.data(), ap);
  errs.insert(errs.end(), {{"dq", relative_error(dq.view(), rdq)},
                           {"dk", relative_error(dk.view(), rdk)},
                           {"dv", relative_error(dv.view(), rdv)}});
  return errs;
}

// Tensor `which` (0 q, 1 k, 2 v, 3 dout) holding the global rows `chunks`, in dtype/layout.
Tensor make_input(const Problem& p, int which, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout,
                  std::uint64_t seed) {
  const Shape g = (which == 1 || which == 2) ? p.kv : p.q;
  std::int64_t n = 0;
  for (const SeqChunk& c : chunks) n += c.length;
  Tensor t({g.b, n, g.h, g.d}, dtype, layout);
  const std::optional<NpyArray>* files[] = {&p.fq, &p.fk, &p.fv, &p.fdout};
  const std::optional<NpyArray>& f = *files[which];
  if (f) {
    shard_sequence(TensorView::dense(const_cast<float*>(f->data.data()), DType::f32, g, Layout::bshd), t.view(), chunks);
    return t;
  }
  std::int64_t row = 0;
  for (const SeqChunk& c : chunks) {  // values depend on global positions only
    TensorView part = t.view();
    part.data = t.view().row(0, row, 0);
    part.shape.s = c.length;
    fill_uniform(part, seed * 4 + std::uint64_t(which), c.begin);
    row += c.length;
  }
  return t;
}

// Collective: rank 0 receives the global [b, s, h, d] float32 tensor assembled from shards.
std::vector<float> gather_global(Communicator& comm, const TensorView& shard, const CpConfig& cfg, std::int64_t seq) {
  const Shape& sh = shard.shape;
  Tensor mine(sh);
  copy(shard, mine.view());
  std::vector<float> all(comm.rank() == 0 ? std::size_t(sh.numel() * comm.size()) : 0);
  comm.gather(mine.data(), all.data(), mine.nbytes(), 0, "report");
  if (comm.rank() != 0) return {};
  std::vector<float> global(all.size());
  const TensorView g = TensorView::dense(global.data(), DType::f32, {sh.b, seq, sh.h, sh.d}, Layout::bshd);
  for (int r = 0; r < comm.size(); ++r)
    unshard_sequence(TensorView::dense(&all[std::size_t(r * sh.numel())], DType::f32, sh, Layout::bshd), g,
                     rank_chunks(cfg, comm.size(), r, seq));
  return global;
}

// Collective: the counter names of rank 0 (every rank runs the same operations).
std::vector<std::string> counter_names(Communicator& comm) {
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
  return names;
}

struct Timing {
  std::vector<double> forward, backward;
};

double max_over_ranks(Communicator& comm, double x) {
  comm.allreduce_max(&x, 1);
  return x;
}

// Bytes each rank sent, per operation, against the formula (one forward [+ backward]).
void print_traffic(const nlohmann::json& ranks, const std::vector<std::string>& ops,
                   const std::map<std::string, std::int64_t>& expected) {
  std::printf("bytes each rank sent, per operation (formula in brackets):\n");
  for (const auto& r : ranks) {
    std::string line = fmt::format("  rank {}:", int(r["rank"]));
    for (const std::string& op : ops) {
      auto it = expected.find(op);
      line += fmt::format(" {} {} [{}]", op, human_bytes(double(r["bytes_sent"][op])),
                          it == expected.end() ? "?" : human_bytes(double(it->second)));
    }
    std::printf("%s; peak memory %s\n", line.c_str(), human_bytes(double(r["peak_rss_bytes"])).c_str());
  }
}

}  // namespace

int run_attention(const AttentionOptions& o) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int cp = comm.size(), rank = comm.rank();
  const int threads = o.threads > 0 ? o.threads : default_threads(comm);
  set_threads(threads);

  // ---- inputs: read and check locally, then agree (a file may be unreadable on one rank) --
  Problem p;
  CpConfig cfg;
  DType dtype = DType::f32;
  Layout layout = Layout::bshd;
  std::vector<SeqChunk> chunks;
  std::string err;
  try {
    dtype = parse_dtype(o.dtype);
    layout = parse_layout(o.layout);
    cfg = parse_strategy(o.strategy, o.cp_sizes, cp);
    cfg.causal = o.causal;
    cfg.scale = o.scale;
    if (o.scale < 0 || !std::isfinite(o.scale)) throw Error(fmt::format("--scale must be positive, got {}", o.scale));
    p = load_problem(o);
    chunks = rank_chunks(cfg, cp, rank, p.q.s);
  } catch (const Error& e) {
    err = e.what();
  }
  comm.agree(err);

  const std::int64_t sl = p.q.s / cp;
  if (rank == 0) {
    std::printf("ulysses attention: cp_comm_type %s, cp = %d ranks x %d thread(s)\n", cfg.cp_comm_type.c_str(), cp,
                threads);
    const auto& hs = cfg.hierarchical_context_parallel_sizes;
    if (!hs.empty())
      std::printf("  hierarchical_context_parallel_sizes [%d, %d]: Ulysses in groups of %d contiguous ranks, ring over %d%s\n",
                  hs[0], hs[1], hs[0], hs[1],
                  hs[0] == 1 ? " (inner 1: this is plain p2p)" : hs[1] == 1 ? " (outer 1: this is plain a2a)" : "");
    std::printf("  kernels: isa %s, engine %s\n", kernel_isa(), kernel_engine(dtype).c_str());
    std::printf("  global q %s, k/v %s, %s, %s%s, scale %.4g\n", p.q.str().c_str(), p.kv.str().c_str(),
                to_string(dtype), to_string(layout), cfg.causal ? ", causal" : "",
                effective_scale({cfg.causal, cfg.scale, 0, 0}, p.q.d));
    std::string where;
    for (const SeqChunk& c : chunks) where += fmt::format(" [{}, {})", c.begin, c.begin + c.length);
    std::printf("  each rank holds q %s; rank 0 holds tokens%s%s\n", Shape{p.q.b, sl, p.q.h, p.q.d}.str().c_str(),
                where.c_str(), uses_zigzag(cfg) ? " (zigzag)" : "");
    std::fflush(stdout);
  }
  Tensor q = make_input(p, 0, chunks, dtype, layout, o.seed), k = make_input(p, 1, chunks, dtype, layout, o.seed),
         v = make_input(p, 2, chunks, dtype, layout, o.seed);
  Tensor out({p.q.b, sl, p.q.h, p.q.d}, dtype, layout);
  Tensor dout, dq, dk, dv;
  if (p.backward) {
    dout = make_input(p, 3, chunks, dtype, layout, o.seed);
    dq = Tensor(out.shape(), dtype, layout);
    dk = Tensor(k.shape(), dtype, layout);
    dv = Tensor(k.shape(), dtype, layout);
  }

  // ---- run: one untimed warm-up when timing, then `repeat` timed runs -----------------------
  ContextParallelAttention attn(comm, cfg);
  CpContext ctx;
  CpStats bs;
  Timing t;
  const int runs = o.repeat > 0 ? o.repeat + 1 : 1;
  for (int i = 0; i < runs; ++i) {
    if (i == runs - 1) comm.reset_counters();  // report the bytes of exactly one run
    comm.barrier();
    double t0 = comm.now();
    ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    const double tf = max_over_ranks(comm, comm.now() - t0);
    double tb = 0;
    if (p.backward) {
      comm.barrier();
      t0 = comm.now();
      bs = attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
      tb = max_over_ranks(comm, comm.now() - t0);
    }
    if (o.repeat == 0 || i > 0) {
      t.forward.push_back(tf);
      t.backward.push_back(tb);
    }
  }
  const double fwd_s = median(t.forward), bwd_s = median(t.backward);
  const CpStats fs = ctx.stats();
  const double split[4] = {max_over_ranks(comm, fs.compute_s), max_over_ranks(comm, fs.comm_exposed_s),
                           max_over_ranks(comm, bs.compute_s), max_over_ranks(comm, bs.comm_exposed_s)};
  const std::vector<std::string> ops = counter_names(comm);
  const nlohmann::json ranks = gather_rank_stats(comm, ops);

  // ---- results: gather, check, write (rank 0), then agree on any failure -------------------
  const bool need_out = o.check || !o.out.empty();
  const bool need_grads = p.backward && (o.check || !o.dq.empty() || !o.dk.empty() || !o.dv.empty());
  std::vector<float> g_out, g_dq, g_dk, g_dv;
  if (need_out) g_out = gather_global(comm, out.view(), cfg, p.q.s);
  if (need_grads) {
    g_dq = gather_global(comm, dq.view(), cfg, p.q.s);
    g_dk = gather_global(comm, dk.view(), cfg, p.q.s);
    g_dv = gather_global(comm, dv.view(), cfg, p.q.s);
  }
  const CommVolume volume = predicted_comm_volume(cfg, cp, p.q, p.kv.h, dtype);
  std::map<std::string, std::int64_t> expected = volume.forward_bytes;
  if (p.backward)
    for (const auto& [op, n] : volume.backward_bytes) expected[op] += n;
  const double fflops = attention_forward_flops(p.q.b, p.q.s, p.q.s, p.q.h, p.q.d, cfg.causal);
  nlohmann::json report{{"command", "attention"}, {"strategy", cfg.cp_comm_type}, {"cp", cp},
                        {"cp_sizes", cfg.hierarchical_context_parallel_sizes},
                        {"threads_per_rank", threads}, {"kernel_isa", kernel_isa()},
                        {"kernel_engine", kernel_engine(dtype)}, {"dtype", to_string(dtype)}, {"layout", to_string(layout)},
                        {"causal", cfg.causal}, {"scale", effective_scale({cfg.causal, cfg.scale, 0, 0}, p.q.d)},
                        {"q_shape", {p.q.b, p.q.s, p.q.h, p.q.d}}, {"kv_shape", {p.kv.b, p.kv.s, p.kv.h, p.kv.d}},
                        {"repeat", o.repeat}, {"forward_s", fwd_s}, {"backward_s", p.backward ? bwd_s : 0.0},
                        {"forward_gflops", fflops / fwd_s * 1e-9},
                        {"forward_compute_s", split[0]}, {"forward_comm_exposed_s", split[1]},
                        {"expected_bytes_sent", expected}, {"ranks", ranks}};
  if (p.backward) {
    report["backward_gflops"] = 2.5 * fflops / bwd_s * 1e-9;
    report["backward_compute_s"] = split[2];
    report["backward_comm_exposed_s"] = split[3];
  }

  int failed = 0;
  err.clear();
  if (rank == 0) {
    try {
      std::printf("time (slowest rank%s):\n", o.repeat > 0 ? fmt::format(", median of {} runs", o.repeat).c_str() : "");
      std::printf("  forward  %10.3f ms  %8.2f GFLOP/s   compute %.3f ms, exposed communication %.3f ms\n",
                  fwd_s * 1e3, fflops / fwd_s * 1e-9, split[0] * 1e3, split[1] * 1e3);
      if (p.backward)
        std::printf("  backward %10.3f ms  %8.2f GFLOP/s   compute %.3f ms, exposed communication %.3f ms\n",
                    bwd_s * 1e3, 2.5 * fflops / bwd_s * 1e-9, split[2] * 1e3, split[3] * 1e3);
      print_traffic(ranks, ops, expected);
      if (o.check) {
        std::printf("checking against the float64 reference (one process)...\n");
        std::fflush(stdout);
        auto global_ref = [&](int which) {
          const Shape g = (which == 1 || which == 2) ? p.kv : p.q;
          return RefTensor::from(make_input(p, which, {{0, g.s}}, dtype, Layout::bshd, o.seed).view());
        };
        const RefTensor rq = global_ref(0), rk = global_ref(1), rv = global_ref(2);
        const AttentionParams ap{cfg.causal, cfg.scale, 0, 0};
        RefTensor rout, rdq, rdk, rdv;
        std::vector<double> lse;
        reference_attention_forward(rout, lse, rq, rk, rv, ap);
        const double tol = dtype == DType::f32 ? 1e-4 : 3e-2;
        auto rel = [](const std::vector<float>& x, const RefTensor& ref) {
          return relative_error(TensorView::dense(const_cast<float*>(x.data()), DType::f32, ref.shape, Layout::bshd), ref);
        };
        std::vector<std::pair<const char*, double>> errs{{"out", rel(g_out, rout)}};
        if (p.backward) {
          reference_attention_backward(rdq, rdk, rdv, global_ref(3), rq, rk, rv, ap);
          errs.insert(errs.end(), {{"dq", rel(g_dq, rdq)}, {"dk", rel(g_dk, rdk)}, {"dv", rel(g_dv, rdv)}});
        }
        std::string line = "relative error |x-ref|/|ref|:";
        for (auto [name, e] : errs) {
          line += fmt::format("  {} {:.2e}", name, e);
          report["check"][name] = e;
          failed |= !(e <= tol);
        }
        report["check"]["tolerance"] = tol;
        report["check"]["passed"] = !failed;
        std::printf("%s  (tolerance %.0e) %s\n", line.c_str(), tol, failed ? "FAILED" : "OK");
        if (dtype == DType::bf16) {  // what the bf16 engine costs: the same inputs, float32 compute
          const auto f32 = float32_compute_errors(p, cfg, o.seed, rout, rdq, rdk, rdv);
          line = "  same bf16 inputs, float32 compute (one process):";
          for (auto [name, e] : f32) {
            line += fmt::format("  {} {:.2e}", name, e);
            report["check"]["float32_compute"][name] = e;
          }
          std::printf("%s\n", line.c_str());
        }
      }
      if (!o.out.empty()) write_npy(o.out, g_out.data(), {p.q.b, p.q.s, p.q.h, p.q.d});
      if (!o.dq.empty()) write_npy(o.dq, g_dq.data(), {p.q.b, p.q.s, p.q.h, p.q.d});
      if (!o.dk.empty()) write_npy(o.dk, g_dk.data(), {p.kv.b, p.kv.s, p.kv.h, p.kv.d});
      if (!o.dv.empty()) write_npy(o.dv, g_dv.data(), {p.kv.b, p.kv.s, p.kv.h, p.kv.d});
      if (!o.json.empty()) write_file_atomic(o.json, report.dump(2) + "\n");
    } catch (const Error& e) {
      err = e.what();
    }
  }
  comm.agree(err);
  comm.broadcast(&failed, sizeof(failed), 0);
  return failed ? 1 : 0;
}

}  // namespace ulysses::cli
