// Section 1: the local flash kernels against their ceiling and against the naive baseline.
//
// Ceiling = the faster of two OpenBLAS measurements, both on all cores:
//   full  S = Q·Kᵀ ([s×d]·[d×s]) and O = P·V ([s×s]·[s×d]) for one head, OpenBLAS threads;
//   tile  the flash kernel's own tile GEMMs (64×256×d and 64×d×256), one per core in parallel.
// Naive = what a user writes first: per head, scores = Q·Kᵀ with BLAS, mask, softmax with
// std::exp, P·V with BLAS; P is kept for the backward (as autograd would), so its memory
// grows with s². FLOP rates use FlashAttention's count for both (causal halves it), so the
// ratio of rates is the ratio of times.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <limits>

#include "bench.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/threads.hpp"

namespace ulysses::bench {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// OpenBLAS's own threads spin for a while after multi-threaded work; give them time to sleep
// so they do not steal cores from the next measurement.
void let_blas_threads_sleep() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

double sgemm_full_gflops(std::int64_t s, std::int64_t d, int threads, int reps) {
  Tensor a({1, s, 1, d}), b({1, s, 1, d}), p({1, s, 1, s}), o({1, s, 1, d});
  fill_uniform(a.view(), 1);
  fill_uniform(b.view(), 2);
  openblas_set_num_threads(threads);
  const double t = time_median(reps, [&] {
    sgemm(false, true, s, s, d, 1.0f, a.f32(), d, b.f32(), d, 0.0f, p.f32(), s);
    sgemm(false, false, s, d, s, 1.0f, p.f32(), s, b.f32(), d, 0.0f, o.f32(), d);
  });
  openblas_set_num_threads(1);
  let_blas_threads_sleep();
  return 4.0 * double(s) * double(s) * double(d) / t * 1e-9;
}

double sgemm_tile_gflops(std::int64_t d, int threads, int reps) {
  const std::int64_t bq = 64, bk = d <= 64 ? 256 : 128, iters = 200;
  double t = 0;
  t = time_median(reps, [&] {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> q(std::size_t(bq * d), 0.5f), k(std::size_t(bk * d), 0.25f), s(std::size_t(bq * bk));
      std::vector<float> o(std::size_t(bq * d));
      for (std::int64_t i = 0; i < iters; ++i) {
        sgemm(false, true, bq, bk, d, 1.0f, q.data(), d, k.data(), d, 0.0f, s.data(), bk);
        sgemm(false, false, bq, d, bk, 1.0f, s.data(), bk, k.data(), d, 1.0f, o.data(), d);
      }
    }
  });
  return 4.0 * double(bq * bk * d) * double(iters) * threads / t * 1e-9;
}

// Naive attention on [1, s, h, d] tensors; P [h, s, s] is kept for the backward.
struct Naive {
  Tensor p;
  void forward(const TensorView& o, const TensorView& q, const TensorView& k, const TensorView& v, bool causal) {
    const std::int64_t s = q.shape.s, h = q.shape.h, d = q.shape.d;
    const float scale = 1.0f / std::sqrt(float(d));
    p = Tensor::uninitialized({1, h * s, 1, s});
    for (std::int64_t hh = 0; hh < h; ++hh) {
      float* P = p.f32() + hh * s * s;
      sgemm(false, true, s, s, d, scale, q.f32(0, 0, hh), q.stride_s, k.f32(0, 0, hh), k.stride_s, 0.0f, P, s);
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < s; ++i) {
        float* row = P + i * s;
        if (causal)
          for (std::int64_t j = i + 1; j < s; ++j) row[j] = kNegInf;
        float mx = kNegInf, sum = 0;
        for (std::int64_t j = 0; j < s; ++j) mx = std::max(mx, row[j]);
        for (std::int64_t j = 0; j < s; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (std::int64_t j = 0; j < s; ++j) row[j] /= sum;
      }
      sgemm(false, false, s, d, s, 1.0f, P, s, v.f32(0, 0, hh), v.stride_s, 0.0f, o.f32(0, 0, hh), o.stride_s);
    }
  }
  void backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                const TensorView& q, const TensorView& k, const TensorView& v) {
    const std::int64_t s = q.shape.s, h = q.shape.h, d = q.shape.d;
    const float scale = 1.0f / std::sqrt(float(d));
    Tensor dp = Tensor::uninitialized({1, s, 1, s});
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const float* P = p.f32() + hh * s * s;
      float* dP = dp.f32();
      sgemm(true, false, s, d, s, 1.0f, P, s, dout.f32(0, 0, hh), dout.stride_s, 0.0f, dv.f32(0, 0, hh), dv.stride_s);
      sgemm(false, true, s, s, d, 1.0f, dout.f32(0, 0, hh), dout.stride_s, v.f32(0, 0, hh), v.stride_s, 0.0f, dP, s);
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < s; ++i) {
        const float* pr = P + i * s;
        float* r = dP + i * s;
        float D = 0;
        for (std::int64_t j = 0; j < s; ++j) D += pr[j] * r[j];
        for (std::int64_t j = 0; j < s; ++j) r[j] = pr[j] * (r[j] - D);
      }
      sgemm(false, false, s, d, s, scale, dP, s, k.f32(0, 0, hh), k.stride_s, 0.0f, dq.f32(0, 0, hh), dq.stride_s);
      sgemm(true, false, s, d, s, scale, dP, s, q.f32(0, 0, hh), q.stride_s, 0.0f, dk.f32(0, 0, hh), dk.stride_s);
    }
  }
};

}  // namespace

nlohmann::json kernels_section(Comm& world, const Options& o) {
  nlohmann::json rows = nlohmann::json::array();
  if (world.rank() == 0) {
    const int T = o.cores;
    set_threads(T);
    const std::vector<std::int64_t> seqs = o.quick ? std::vector<std::int64_t>{512} : std::vector<std::int64_t>{1024, 4096, 16384};
    const std::vector<std::int64_t> dims = o.quick ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{64, 128};
    const std::int64_t h = 2 * T;
    fmt::print("\n[1] local attention, {} threads, batch 1, {} heads; GFLOP/s (FlashAttention's count), medians\n", T, h);
    fmt::print("{:>6} {:>4} {:>6} | {:>7} {:>7} | {:>7} {:>7} | {:>5} {:>5} {:>6} | {:>7} {:>7} {:>6} | {:>8} {:>8}\n", "s",
               "d", "mask", "fwd", "bwd", "gemm", "tile", "fwd/c", "bwd/c", "caus/f", "naive f", "naive b", "x", "flash MB",
               "naive MB");
    for (std::int64_t s : seqs)
      for (std::int64_t d : dims) {
        // Calls at s = 1k take milliseconds and the machine is shared: more repetitions there.
        const int reps = s >= 16384 ? 1 : (s <= 1024 && !o.quick ? std::max(o.reps, 15) : o.reps);
        const double full = sgemm_full_gflops(s, d, T, reps), tile = sgemm_tile_gflops(d, T, o.reps);
        const double ceiling = std::max(full, tile);
        Tensor q({1, s, h, d}), k(q.shape()), v(q.shape()), out(q.shape()), dout(q.shape());
        Tensor dq(q.shape()), dk(q.shape()), dv(q.shape());
        for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) fill_uniform(t->view(), std::uint64_t(seed));
        std::vector<float> lse(std::size_t(h * s));
        double full_fwd_s = 0;
        for (bool causal : {false, true}) {
          const AttentionParams p{causal, 0.0f, 0, 0};
          const double flops = attention_forward_flops(1, s, s, h, d, causal);
          reset_tensor_bytes_peak();
          std::int64_t base = tensor_bytes_in_use();
          const double tf = time_median(reps, [&] {
            flash_attention_forward(out.view(), lse.data(), q.view(), k.view(), v.view(), p);
          });
          const double tb = time_median(reps, [&] {
            flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(),
                                     out.view(), lse.data(), p);
          });
          const double flash_mb = double(tensor_bytes_peak() - base + std::int64_t(lse.size() * 4)) / 1e6;
          if (!causal) full_fwd_s = tf;
          // Naive, BLAS on all cores.
          openblas_set_num_threads(T);
          Naive naive;
          reset_tensor_bytes_peak();
          base = tensor_bytes_in_use();
          const double nf = time_median(reps, [&] { naive.forward(out.view(), q.view(), k.view(), v.view(), causal); });
          const double nb = time_median(reps, [&] {
            naive.backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view());
          });
          const double naive_mb = double(tensor_bytes_peak() - base) / 1e6;
          naive.p = Tensor();
          openblas_set_num_threads(1);
          let_blas_threads_sleep();
          const double fg = flops / tf * 1e-9, bg = 2.5 * flops / tb * 1e-9;
          const double nfg = flops / nf * 1e-9, nbg = 2.5 * flops / nb * 1e-9;
          const double speedup = (nf + nb) / (tf + tb), causal_ratio = causal ? tf / full_fwd_s : 1.0;
          fmt::print("{:>6} {:>4} {:>6} | {:>7.1f} {:>7.1f} | {:>7.1f} {:>7.1f} | {:>5.2f} {:>5.2f} {:>6} | {:>7.1f} {:>7.1f} "
                     "{:>5.1f}x | {:>8.1f} {:>8.1f}\n",
                     s, d, causal ? "causal" : "full", fg, bg, full, tile, fg / ceiling, bg / ceiling,
                     causal ? fmt::format("{:.2f}", causal_ratio) : std::string("-"), nfg, nbg, speedup, flash_mb, naive_mb);
          rows.push_back({{"s", s}, {"d", d}, {"causal", causal}, {"flash_fwd_gflops", fg}, {"flash_bwd_gflops", bg},
                          {"sgemm_full_gflops", full}, {"sgemm_tile_gflops", tile}, {"fwd_over_ceiling", fg / ceiling},
                          {"bwd_over_ceiling", bg / ceiling}, {"causal_over_full_fwd_time", causal_ratio},
                          {"naive_fwd_gflops", nfg}, {"naive_bwd_gflops", nbg}, {"flash_over_naive", speedup},
                          {"flash_peak_mb", flash_mb}, {"naive_peak_mb", naive_mb}});
        }
      }
    fmt::print("gemm/tile: sgemm ceilings (c = the larger); caus/f: causal forward time over full; x: naive time "
               "over flash time (fwd+bwd); MB: peak working memory\n");
    set_threads(o.threads_per_rank);
  }
  idle_barrier(world.native());
  return world.rank() == 0 ? rows : nlohmann::json();
}

}  // namespace ulysses::bench
