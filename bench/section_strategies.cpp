// Section 3: every strategy end to end on the same shape, beside one rank using every core.
//
// First rank 0 alone runs the whole attention with all cores (the other ranks sleep), then all
// ranks run each strategy (and a2a+p2p at every factorisation). For each: forward and backward
// time (median, slowest rank), compute time, exposed communication (blocked waiting), the same
// communication replayed alone (hidden = alone − exposed), bytes per rank against the formula,
// and the library's peak working memory per rank against local Q+K+V.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "bench.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/threads.hpp"

namespace ulysses::bench {

namespace {

struct Result {
  std::string name;
  int ranks = 1, threads = 1;
  double fwd = 0, bwd = 0, compute = 0, exposed = 0, alone = 0;
  std::int64_t bytes = 0, expected = 0, peak = 0;
};

// The same communication as one forward + backward, without the compute: what it costs alone.
// An overlapped a2a's transposes go as `chunks` all-to-alls of 1/chunks of the bytes each.
double replay(Communicator& comm, Communicator* inner, Communicator* outer, const CommVolume& v, int chunks) {
  std::vector<char> a, b;
  auto buffers = [&](std::size_t n) {
    if (a.size() < n) {
      a.assign(n, 1);
      b.assign(n, 0);
    }
  };
  comm.barrier();
  const double t0 = comm.now();
  for (const auto* bytes : {&v.forward_bytes, &v.backward_bytes})
    for (const auto& [op, n] : *bytes) {
      Communicator& c = op.starts_with("inner.") ? *inner : op.starts_with("outer.") ? *outer : comm;
      const int R = c.size();
      if (R == 1 || n == 0) continue;
      if (op.ends_with("seq_to_head") || op.ends_with("head_to_seq")) {
        const std::size_t block = std::size_t(n / (R - 1) / chunks);
        buffers(block * std::size_t(R));
        for (int i = 0; i < chunks; ++i) c.alltoall(a.data(), b.data(), block, "replay");
      } else if (op.ends_with("p2p_kv") || op.ends_with("p2p_dkv")) {
        // The busiest rank's messages (ring: R − 1 K/V steps, R dK/dV steps; a window's halo
        // exchange: one per neighbour), each rank to the next: the same count on every rank.
        const auto& messages = bytes == &v.forward_bytes ? v.forward_messages : v.backward_messages;
        const int steps = int(messages.at(op));
        if (steps == 0) continue;
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
  return slowest(comm, comm.now() - t0);
}

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
  std::unique_ptr<Communicator> inner, outer;
  if (find_strategy(cfg.cp_comm_type).hierarchical()) {
    const int I = cfg.hierarchical_context_parallel_sizes[0];
    inner = comm.split(comm.rank() / I, comm.rank());
    outer = comm.split(comm.rank() % I, comm.rank());
  }
  std::vector<double> alone;
  const int pieces = ulysses_overlap_chunks(cfg.overlap_chunks, cp, kvh);
  for (int i = 0; i < o.reps; ++i) alone.push_back(replay(comm, inner.get(), outer.get(), vol, pieces));
  r.alone = median(alone);
  return r;
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
    results.push_back(run(self, CpConfig{"a2a", {}, true, std::nullopt}, o, "1 rank (no CP)", o.cores));
  }
  idle_barrier(MPI_COMM_WORLD);
  set_threads(o.threads_per_rank);
  std::vector<std::pair<std::string, CpConfig>> configs;
  for (const Strategy* strategy : strategies())
    for (const CpConfig& cfg : strategy->plan_configs(cp, true)) configs.emplace_back(strategy->config_name(cfg), cfg);
  for (int chunks : {2, 4})  // overlapped Ulysses, beside plain a2a
    if (ulysses_overlap_chunks(chunks, cp, kKvHeads) == chunks) {
      CpConfig cfg{"a2a", {}, true, std::nullopt};
      cfg.overlap_chunks = chunks;
      configs.emplace_back(fmt::format("a2a overlap {}", chunks), cfg);
    }
  // The ring under a causal sliding window of s/16 (its halo exchange), zigzag and
  // contiguous ("c"), beside the plain ring above.
  for (bool zigzag : {true, false})
    configs.emplace_back(fmt::format("p2p W={}{}", o.seq / 16, zigzag ? "" : " c"),
                         CpConfig{"p2p", {}, true, std::nullopt, zigzag, {}, o.seq / 16, -1});
  for (const auto& [name, cfg] : configs) {
    try {
      results.push_back(run(world, cfg, o, name, o.threads_per_rank));
    } catch (const Error& e) {  // agreed on every rank: e.g. heads not divisible
      if (world.rank() == 0) fmt::print("{}: skipped: {}\n", name, e.what());
    }
  }
  nlohmann::json rows = nlohmann::json::array();
  if (world.rank() != 0) return nlohmann::json();
  const double base = results[0].fwd + results[0].bwd;
  const double local_qkv = double(o.seq / cp) * double(kHeads + 2 * kKvHeads) * double(kHeadDim) * 4;
  fmt::print("\n[3] causal attention fwd+bwd, s = {}, heads {}, kv heads {}, d {}; {} ranks x {} threads{}\n", o.seq,
             kHeads, kKvHeads, kHeadDim, cp, o.threads_per_rank,
             cp > o.cores ? " (OVERSUBSCRIBED: more ranks than cores)" : "");
  fmt::print("{:<16} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>9} {:>5} {:>8} {:>6} {:>6} {:>7}\n", "strategy", "fwd ms",
             "bwd ms", "compute", "exposed", "comm", "hidden", "MB/rank", "=form", "peak MB", "/qkv", "model",
             "vs 1rk");
  for (const Result& r : results) {
    const double hidden = r.alone > 0 ? std::max(0.0, 1.0 - r.exposed / r.alone) : 0.0;
    const double ratio = double(r.peak) / (local_qkv * (r.ranks == 1 ? double(cp) : 1.0));
    // Memory model, in units of local q+k+v: all_gather holds the full K and V (and dK, dV):
    // grows with cp; the others hold a constant multiple of their 1/cp share.
    const std::string model = r.name == "all_gather" ? fmt::format(">{:.1f}", 2.0 * 2.0 * cp / 3.0) : "O(1)";
    fmt::print(
        "{:<16} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>6.0f}% {:>9.2f} {:>5} {:>8.1f} {:>6.2f} {:>6} "
        "{:>7.2f}\n",
        r.name, r.fwd * 1e3, r.bwd * 1e3, r.compute * 1e3, r.exposed * 1e3, r.alone * 1e3, hidden * 100,
        double(r.bytes) / 1e6, r.bytes == r.expected ? "yes" : "NO", double(r.peak) / 1e6, ratio, model,
        base / (r.fwd + r.bwd));
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
                    {"throughput_vs_one_rank", base / (r.fwd + r.bwd)}});
  }
  const auto plain = std::find_if(results.begin(), results.end(), [](const Result& r) { return r.name == "a2a"; });
  for (const Result& r : results)
    if (r.name.starts_with("a2a overlap") && plain != results.end())
      fmt::print("{}: exposed communication {:.1f} ms vs plain a2a {:.1f} ms ({:.2f}x), fwd+bwd {:.2f}x plain a2a's\n",
                 r.name, r.exposed * 1e3, plain->exposed * 1e3, r.exposed / plain->exposed,
                 (r.fwd + r.bwd) / (plain->fwd + plain->bwd));
  fmt::print(
      "compute/exposed/comm: ms per fwd+bwd (slowest rank); comm = the same transfers replayed alone;\n"
      "hidden = 1 - exposed/comm; peak MB = library working memory per rank; /qkv = peak / local q+k+v;\n"
      "model = that ratio's model; vs 1rk = throughput relative to one rank using every core.\n");
  return rows;
}

}  // namespace ulysses::bench
