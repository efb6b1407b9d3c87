// Local flash attention GFLOP/s beside OpenBLAS sgemm on the GEMM shapes of the same
// attention, measured in the same run with the same thread count (medians of --reps runs).
//
//   build/bench_flash [--quick] [--threads N] [--reps R]
//
// Attention FLOPs (FlashAttention's count): forward 4·b·s²·h·d, half when causal; backward
// 2.5× forward. The sgemm ceiling runs S = Q·Kᵀ ([s×d]·[d×s]) and O = P·V ([s×s]·[s×d]) for
// one head, multi-threaded by OpenBLAS itself.
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/format.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "ulysses/attention.hpp"
#include "ulysses/threads.hpp"

using namespace ulysses;

namespace {

template <class Fn>
double median_seconds(int reps, Fn&& fn) {
  fn();  // warm-up: first touch of buffers, thread pools
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double sgemm_gflops(std::int64_t s, std::int64_t d, int threads, int reps) {
  std::vector<float> a(std::size_t(s * d), 0.5f), b(std::size_t(s * d), 0.25f), c(std::size_t(s * s));
  std::vector<float> o(std::size_t(s * d));
  openblas_set_num_threads(threads);
  const double sec = median_seconds(reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s), int(s), int(d), 1.0f, a.data(), int(d),
                b.data(), int(d), 0.0f, c.data(), int(s));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s), int(d), int(s), 1.0f, c.data(), int(s),
                b.data(), int(d), 0.0f, o.data(), int(d));
  });
  openblas_set_num_threads(1);
  return 4.0 * double(s) * double(s) * double(d) / sec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  CLI::App app{"Local flash attention vs OpenBLAS sgemm, same run, same threads"};
  bool quick = false;
  int threads = 0, reps = 5;
  app.add_flag("--quick", quick, "one small shape, few repetitions (seconds; for CI)");
  app.add_option("--threads", threads, "threads (default: all cores of this process)");
  app.add_option("--reps", reps, "timed repetitions per measurement (median reported)");
  CLI11_PARSE(app, argc, argv);
  if (threads <= 0) threads = default_threads(MPI_COMM_WORLD);
  if (quick) reps = std::min(reps, 3);
  set_threads(threads);

  const std::vector<std::int64_t> seqs = quick ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{1024, 4096};
  const std::vector<std::int64_t> dims = quick ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{64, 128};
  const std::int64_t b = 1, h = 2 * threads;
  fmt::print("threads {}  batch {}  heads {}  (median of {} runs)\n", threads, b, h, reps);
  fmt::print("{:>6} {:>4} {:>7} | {:>10} {:>10} | {:>10} | {:>8} {:>8}\n", "s", "d", "mask", "fwd GF/s",
             "bwd GF/s", "sgemm GF/s", "fwd/gemm", "bwd/gemm");
  for (std::int64_t s : seqs)
    for (std::int64_t d : dims) {
      const double gemm = sgemm_gflops(s, d, threads, reps);
      Tensor q({b, s, h, d}), k(q.shape()), v(q.shape()), out(q.shape()), dout(q.shape());
      Tensor dq(q.shape()), dk(q.shape()), dv(q.shape());
      for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) fill_uniform(t->view(), std::uint64_t(seed));
      std::vector<float> lse(std::size_t(b * h * s));
      for (bool causal : {false, true}) {
        const AttentionParams p{causal, 0.0f, 0, 0};
        const double flops = attention_forward_flops(b, s, s, h, d, causal);
        const double tf = median_seconds(reps, [&] {
          flash_attention_forward(out.view(), lse.data(), q.view(), k.view(), v.view(), p);
        });
        const double tb = median_seconds(reps, [&] {
          flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(),
                                   out.view(), lse.data(), p);
        });
        const double fg = flops / tf * 1e-9, bg = 2.5 * flops / tb * 1e-9;
        fmt::print("{:>6} {:>4} {:>7} | {:>10.1f} {:>10.1f} | {:>10.1f} | {:>8.2f} {:>8.2f}\n", s, d,
                   causal ? "causal" : "full", fg, bg, gemm, fg / gemm, bg / gemm);
      }
    }
  MPI_Finalize();
  return 0;
}
