// Section 6: the decode kernel (one query row against a whole cache) against this core's read
// rate, on rank 0 alone with one thread. The cache is synthetic float32, two layers (each is read
// once a token, as `generate` reads them), larger than the last-level cache; the read probes are
// timed in the same rounds as the kernel, interleaved, so both see the same load.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "bench.hpp"
#include "kernels/isa.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/kernels/read_probe.hpp"

namespace ulysses::bench {
namespace {

using nlohmann::json;

struct DecodeShape {
  const char* name;
  std::int64_t h, h_kv, d;
};

constexpr DecodeShape kShapes[] = {{"MHA d 32", 8, 8, 32},       {"MHA d 64", 8, 8, 64},
                                   {"MHA d 128", 8, 8, 128},     {"GQA 8/4 d 128", 8, 4, 128},
                                   {"GQA 8/2 d 128", 8, 2, 128}, {"GQA 16/2 d 128", 16, 2, 128}};
constexpr int kLayers = 2;
// The prefetching probe asks for the line 2 KiB on, as kernels::read_seconds's does.
constexpr std::size_t kProbeAhead = 512;

// Best seconds of each, over `rounds` rounds of: the kernel over every layer, the plain read, the
// prefetching read.
struct DecodeTimes {
  double kernel = 1e30, plain = 1e30, prefetch = 1e30;
  double cache_bytes = 0, probe_bytes = 0;
};

DecodeTimes time_decode(const DecodeShape& sh, std::int64_t seq, int rounds) {
  std::vector<Tensor> ks, vs;
  for (int l = 0; l < kLayers; ++l) {
    ks.emplace_back(Shape{1, seq, sh.h_kv, sh.d}, DType::f32, Layout::bhsd);
    vs.emplace_back(Shape{1, seq, sh.h_kv, sh.d}, DType::f32, Layout::bhsd);
    fill_uniform(ks.back().view(), std::uint64_t(2 * l + 1));
    fill_uniform(vs.back().view(), std::uint64_t(2 * l + 2));
  }
  Tensor q({1, 1, sh.h, sh.d}, DType::f32), out({1, 1, sh.h, sh.d}, DType::f32),
      lse({1, 1, sh.h, 1}, DType::f32, Layout::bhsd);
  fill_uniform(q.view(), 7);
  const DecodeParams params{.q_first = 0, .kv_first = 0, .group = sh.h / sh.h_kv};
  DecodeTimes t;
  t.cache_bytes = 2.0 * kLayers * double(seq * sh.h_kv * sh.d) * 4;
  // The probe reads as many bytes as the cache (at least 64 MiB), from the same allocator.
  const std::size_t n = (std::max<std::size_t>(std::size_t(16) << 20, std::size_t(t.cache_bytes / 4)) + 31) / 32 * 32;
  Tensor buffer({1, 1, 1, std::int64_t(n)}, DType::f32);
  std::fill(buffer.f32(), buffer.f32() + n, 1.0f);
  t.probe_bytes = double(n) * 4;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = kernels::probe_clock();
    for (int l = 0; l < kLayers; ++l)
      decode_attention_forward(out.view(), lse.view(), q.view(), ks[std::size_t(l)].view(), vs[std::size_t(l)].view(),
                               params);
    t.kernel = std::min(t.kernel, kernels::probe_clock() - t0);
    t.plain = std::min(t.plain, kernels::read_pass_seconds(buffer.f32(), n, 0));
    t.prefetch = std::min(t.prefetch, kernels::read_pass_seconds(buffer.f32(), n, kProbeAhead));
  }
  return t;
}

json decode_row(const DecodeShape& sh, std::int64_t seq, const DecodeTimes& t) {
  const double kernel = t.cache_bytes / t.kernel * 1e-9, plain = t.probe_bytes / t.plain * 1e-9,
               pref = t.probe_bytes / t.prefetch * 1e-9, fraction = kernel / std::max(plain, pref),
               ns_row = t.kernel * 1e9 / double(kLayers * seq * sh.h_kv);
  const char* ahead = kernels::decode_prefetches_block(sh.h / sh.h_kv) ? "block" : "kilobyte";
  fmt::print("{:>15} {:>8} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.3f} {:>11.2f} {:>9}\n", sh.name, seq, kernel, plain, pref,
             fraction, ns_row, ahead);
  return {{"shape", sh.name},
          {"h", sh.h},
          {"h_kv", sh.h_kv},
          {"d", sh.d},
          {"seq", seq},
          {"layers", kLayers},
          {"kernel_gbs", kernel},
          {"plain_read_gbs", plain},
          {"prefetch_read_gbs", pref},
          {"fraction", fraction},
          {"ns_per_row_per_kv_head", ns_row},
          {"prefetch", ahead}};
}

json decode_rows(const Options& o) {
  const int rounds = o.quick ? 1 : std::max(o.reps, 7);
  const std::vector<std::int64_t> seqs =
      o.quick ? std::vector<std::int64_t>{2048} : std::vector<std::int64_t>{32768, 131072};
  fmt::print(
      "\n[6] decode: one query row against a float32 cache of {} layers, rank 0, 1 thread, kernel level {}; "
      "best of {} interleaved rounds (GB/s; fraction: the kernel over the faster read probe; prefetch: how far "
      "ahead the kernel asked)\n{:>15} {:>8} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}\n",
      kLayers, kernels::to_string(kernels::active_isa()), rounds, "shape", "S", "kernel", "read", "read+pf", "fraction",
      "ns/row/kvh", "prefetch");
  json rows = json::array();
  for (const std::int64_t seq : seqs)
    for (const DecodeShape& sh : kShapes) rows.push_back(decode_row(sh, seq, time_decode(sh, seq, rounds)));
  return {{"isa", kernels::to_string(kernels::active_isa())}, {"threads", 1}, {"rounds", rounds}, {"rows", rows}};
}

}  // namespace

json decode_section(Communicator& world, const Options& o) {
  idle_barrier(MPI_COMM_WORLD);  // the other ranks sleep: rank 0 measures on one core
  json out;
  if (world.rank() == 0) {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);  // and probe_clock counts this thread's CPU time, kernel and probes alike
    out = decode_rows(o);
    omp_set_num_threads(threads);
  }
  idle_barrier(MPI_COMM_WORLD);
  return world.rank() == 0 ? out : json(nullptr);
}

}  // namespace ulysses::bench
