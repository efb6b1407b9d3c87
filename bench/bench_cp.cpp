// Every strategy end to end on the same shape, side by side in one MPI job:
//
//   mpirun -n 2 --bind-to none build/bench_cp [--seq 16384] [--heads 8] [--kv-heads 8]
//                                             [--head-dim 64] [--reps 3] [--quick] [--json FILE]
//
// First rank 0 alone runs the whole attention with every core (the other ranks sleep-wait,
// so they do not steal a core), then all ranks run each strategy (and a2a+p2p at every
// factorisation) with cores/ranks threads each. For each: forward and backward time (median,
// slowest rank), compute time, exposed communication (blocked waiting), the same
// communication replayed alone (so hidden = alone − exposed), bytes per rank against the
// formula, and the library's peak working memory per rank against local Q+K+V.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <vector>

#include "ulysses/comm_volume.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/threads.hpp"

using namespace ulysses;

namespace {

struct Options {
  std::int64_t seq = 16384, heads = 8, kv_heads = 0, head_dim = 64;
  int reps = 3;
  bool quick = false, causal = true;
  std::string json;
};

struct Result {
  std::string name;
  int ranks = 1, threads = 1;
  double fwd = 0, bwd = 0, compute = 0, exposed = 0, alone = 0;
  std::int64_t bytes = 0, expected = 0, peak = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double slowest(Comm& comm, double x) {
  comm.allreduce_max(&x, 1);
  return x;
}

// Sleep (not spin) until every rank of `comm` arrives: idle ranks must not steal a core.
void idle_barrier(MPI_Comm comm) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  int done = 0;
  while (!done) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(1000);
  }
}

// The same communication as one forward + backward, without the compute: what it costs alone.
double replay(Comm& comm, Comm* inner, Comm* outer, const CommVolume& v) {
  std::vector<char> a, b;
  auto buffers = [&](std::size_t n) {
    if (a.size() < n) {
      a.assign(n, 1);
      b.assign(n, 0);
    }
  };
  comm.barrier();
  const double t0 = MPI_Wtime();
  for (const auto* bytes : {&v.forward_bytes, &v.backward_bytes})
    for (const auto& [op, n] : *bytes) {
      Comm& c = op.starts_with("inner.") ? *inner : op.starts_with("outer.") ? *outer : comm;
      const int R = c.size();
      if (R == 1 || n == 0) continue;
      if (op.ends_with("seq_to_head") || op.ends_with("head_to_seq")) {
        const std::size_t block = std::size_t(n / (R - 1));
        buffers(block * std::size_t(R));
        c.alltoall(a.data(), b.data(), block, "replay");
      } else if (op.ends_with("p2p_kv") || op.ends_with("p2p_dkv")) {
        const int steps = op.ends_with("p2p_kv") ? R - 1 : R;
        const std::size_t block = std::size_t(n / steps);
        buffers(block);
        for (int s = 0; s < steps; ++s) {
          Request rr = c.irecv(b.data(), block, (c.rank() - 1 + R) % R, 7);
          c.isend(a.data(), block, (c.rank() + 1) % R, 7, "replay").wait();
          rr.wait();
        }
      } else if (op == "all_gather_kv") {
        const std::size_t block = std::size_t(n / (R - 1));
        buffers(block * std::size_t(R));
        c.allgather(a.data(), b.data(), block, "replay");
      } else if (op == "all_gather_dkv") {
        const std::size_t count = std::size_t(n / (R - 1)) / 4;
        std::vector<float> send(count * std::size_t(R), 1.0f), recv(count);
        c.reduce_scatter_sum(send.data(), recv.data(), count, "replay");
      }
    }
  return slowest(comm, MPI_Wtime() - t0);
}

Result run(Comm& comm, const CpConfig& cfg, const Options& o, const std::string& name, int threads) {
  const int cp = comm.size();
  const std::int64_t s = o.seq, sl = s / cp, kvh = o.kv_heads > 0 ? o.kv_heads : o.heads;
  const auto chunks = rank_chunks(cfg, cp, comm.rank(), s);
  Tensor q({1, sl, o.heads, o.head_dim}), k({1, sl, kvh, o.head_dim}), v(k.shape()), dout(q.shape());
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
  attn.forward(out.view(), q.view(), k.view(), v.view());  // warm-up (and sub-communicators)
  attn.backward(dq.view(), dk.view(), dv.view(), dout.view());
  std::vector<double> f, b, comp, exp;
  Result r{name, cp, threads};
  for (int i = 0; i < o.reps; ++i) {
    comm.reset_counters();
    reset_tensor_bytes_peak();
    const std::int64_t base = tensor_bytes_in_use();
    comm.barrier();
    double t0 = MPI_Wtime();
    attn.forward(out.view(), q.view(), k.view(), v.view());
    f.push_back(slowest(comm, MPI_Wtime() - t0));
    comm.barrier();
    t0 = MPI_Wtime();
    attn.backward(dq.view(), dk.view(), dv.view(), dout.view());
    b.push_back(slowest(comm, MPI_Wtime() - t0));
    comp.push_back(slowest(comm, attn.forward_stats().compute_s + attn.backward_stats().compute_s));
    exp.push_back(slowest(comm, attn.forward_stats().comm_exposed_s + attn.backward_stats().comm_exposed_s));
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
  const CommVolume vol = predicted_comm_volume(cfg, cp, {1, s, o.heads, o.head_dim}, kvh, DType::f32);
  r.expected = vol.total_forward_bytes() + vol.total_backward_bytes();
  std::optional<Comm> inner, outer;
  if (cfg.cp_comm_type == CpCommType::a2a_p2p) {
    const int I = cfg.hierarchical_context_parallel_sizes[0];
    inner.emplace(comm.split(comm.rank() / I, comm.rank()));
    outer.emplace(comm.split(comm.rank() % I, comm.rank()));
  }
  std::vector<double> alone;
  for (int i = 0; i < o.reps; ++i) alone.push_back(replay(comm, inner ? &*inner : nullptr, outer ? &*outer : nullptr, vol));
  r.alone = median(alone);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"All context-parallel strategies side by side, one MPI job"};
  Options o;
  app.add_option("--seq", o.seq, "global sequence length")->capture_default_str();
  app.add_option("--heads", o.heads, "query heads")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "key/value heads (default: heads)");
  app.add_option("--head-dim", o.head_dim, "head dim")->capture_default_str();
  app.add_option("--reps", o.reps, "timed repetitions (median)")->capture_default_str();
  app.add_flag("--quick", o.quick, "s = 2048, 1 repetition (seconds; for CI)");
  app.add_option("--json", o.json, "write the results here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  if (o.quick) {
    o.seq = std::min<std::int64_t>(o.seq, 2048);
    o.reps = 1;
  }
  {
  Comm world;
  const int cp = world.size(), cores = std::max(1, default_threads(MPI_COMM_SELF));
  const int per_rank = default_threads(world.native());
  std::vector<Result> results;

  // 1 rank × all cores: rank 0 alone, the others asleep.
  if (world.rank() == 0) {
    Comm self(MPI_COMM_SELF);
    set_threads(cores);
    results.push_back(run(self, CpConfig{CpCommType::a2a, {}, o.causal, 0.0f}, o, "1 rank (no CP)", cores));
  }
  idle_barrier(world.native());
  set_threads(per_rank);
  std::vector<std::pair<std::string, CpConfig>> configs = {
      {"a2a", {CpCommType::a2a, {}, o.causal, 0.0f}},
      {"p2p", {CpCommType::p2p, {}, o.causal, 0.0f}},
      {"all_gather", {CpCommType::all_gather, {}, o.causal, 0.0f}}};
  for (int inner = 1; inner <= cp; ++inner)
    if (cp % inner == 0 && cp > 1)
      configs.push_back({fmt::format("a2a+p2p [{},{}]", inner, cp / inner),
                         {CpCommType::a2a_p2p, {inner, cp / inner}, o.causal, 0.0f}});
  for (const auto& [name, cfg] : configs) {
    try {
      results.push_back(run(world, cfg, o, name, per_rank));
    } catch (const Error& e) {  // agreed on every rank: e.g. heads not divisible
      if (world.rank() == 0) fmt::print("{}: skipped: {}\n", name, e.what());
    }
  }

  if (world.rank() == 0) {
    const double base = results[0].fwd + results[0].bwd;
    const std::int64_t kvh = o.kv_heads > 0 ? o.kv_heads : o.heads;
    const double local_qkv = double(o.seq / cp) * double(o.heads + 2 * kvh) * double(o.head_dim) * 4;
    fmt::print("\ncausal attention fwd+bwd, s = {}, heads {}, kv heads {}, d {}; {} ranks x {} threads{}\n", o.seq,
               o.heads, kvh, o.head_dim, cp, per_rank,
               cp * per_rank > cores * 1 && cp > cores ? " (OVERSUBSCRIBED: more ranks than cores)" : "");
    fmt::print("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>6} {:>9} {:>7} {:>7}\n", "strategy", "fwd ms",
               "bwd ms", "compute", "exposed", "comm", "hidden", "MB/rank", "=form", "peak MB", "/qkv", "vs 1rk");
    for (const Result& r : results) {
      const double hidden = r.alone > 0 ? std::max(0.0, 1.0 - r.exposed / r.alone) : 0.0;
      fmt::print("{:<16} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.0f}% {:>10.2f} {:>6} {:>9.1f} {:>7.2f} {:>7.2f}\n",
                 r.name, r.fwd * 1e3, r.bwd * 1e3, r.compute * 1e3, r.exposed * 1e3, r.alone * 1e3, hidden * 100,
                 double(r.bytes) / 1e6, r.bytes == r.expected ? "yes" : "NO", double(r.peak) / 1e6,
                 double(r.peak) / (local_qkv * (r.ranks == 1 ? double(cp) : 1.0)), base / (r.fwd + r.bwd));
    }
    fmt::print("compute/exposed/comm: ms per fwd+bwd (slowest rank); comm = the same transfers replayed alone;\n"
               "hidden = 1 - exposed/comm; peak MB = library working memory per rank; /qkv = peak / local q+k+v;\n"
               "vs 1rk = throughput relative to one rank using every core.\n");
    if (!o.json.empty()) {
      std::ofstream out(o.json);
      out << "[\n";
      for (std::size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        out << fmt::format(
            "  {{\"strategy\": \"{}\", \"ranks\": {}, \"threads\": {}, \"forward_s\": {}, \"backward_s\": {}, "
            "\"compute_s\": {}, \"comm_exposed_s\": {}, \"comm_alone_s\": {}, \"bytes_sent\": {}, "
            "\"expected_bytes\": {}, \"peak_tensor_bytes\": {}}}{}\n",
            r.name, r.ranks, r.threads, r.fwd, r.bwd, r.compute, r.exposed, r.alone, r.bytes, r.expected, r.peak,
            i + 1 < results.size() ? "," : "");
      }
      out << "]\n";
    }
  }
  }  // Comm objects are freed before MPI_Finalize
  MPI_Finalize();
  return 0;
}
