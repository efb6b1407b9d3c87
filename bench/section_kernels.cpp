// Section 1: the local flash kernels against the ceilings of this CPU, against a naive
// baseline, across the instruction-set levels, and against PyTorch's SDPA.
//
// [1a] Ceilings, measured in this run with the section's thread count:
//   peak        the register-resident peak of each unit (kernels/peak.hpp): the float32 FMA,
//               and the bf16 dot product where the CPU has one; the ceiling c of each dtype
//               is the peak of the unit its kernels run on here (kernels::compute_unit: bf16
//               inputs run on the FMA where the dot product is slower or missing)
//   sgemm full  S = Q·Kᵀ ([s×d]·[d×s]) and O = P·V ([s×s]·[s×d]) for one head, OpenBLAS threads;
//   sgemm tile  the flash kernel's own tile GEMMs (64×bk×d and 64×d×bk), one per core;
//               (what a library reaches on the same shapes, below the peak)
//   AMX bf16    only on the amx level: packed tile GEMMs of the flash tile shape (Q·Kᵀ-like
//               64×bk×d, P·V-like 64×d×bk, B in VNNI pairs; ceiling_amx.cpp), beside the
//               TDPBF16PS peak above, which is the bf16 ceiling c there.
// [1b] Flash forward/backward with float32 inputs and with bfloat16 inputs (outputs float32),
//   each over its ceiling; the naive baseline (what a user writes first: per head, scores =
//   Q·Kᵀ with BLAS, mask, softmax with std::exp, P·V with BLAS, P kept for the backward as
//   autograd would, so its memory grows with s²), float32 only; peak working memory.
// [1c] Every level the CPU supports, forced in turn, at one shape: the gain of each level.
// [1d] PyTorch SDPA (bench/sdpa_anchor.py, in a Python with torch >= 2.0) on the anchor table's shape.
// [1e] Packed documents: 1, 16 and 64 documents in the same s; time against counted work.
// FLOP rates use FlashAttention's count for everything (backward 2.5× forward, causal halves
// it), so a ratio of rates is a ratio of times.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "bench.hpp"
#include "ceiling_amx.hpp"
#include "kernels/peak.hpp"
#include "kernels/flash_common.hpp"
#include "kernels/isa.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/threads.hpp"

namespace ulysses::bench {

namespace {

using i64 = std::int64_t;
using nlohmann::json;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The anchor table: s = 4096, h = 8, batch 1. [1c] uses the same shape at d = 64,
// so [1d] reuses its measurements of the active level.
constexpr i64 kAnchorSeq = 4096, kAnchorHeads = 8;
constexpr const char* kAnchorHowTo =
    "to enable: python3 -m venv /tmp/anchors && /tmp/anchors/bin/pip install torch numpy, or set "
    "ULYSSES_ANCHOR_PYTHON to a Python with torch >= 2.0";

const char* mask_name(bool causal) { return causal ? "causal" : "full"; }

void sgemm(bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda, const float* b, i64 ldb,
           float beta, float* c, i64 ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// OpenBLAS's own threads spin for a while after multi-threaded work; give them time to sleep
// so they do not steal cores from the next measurement.
void let_blas_threads_sleep() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// Calls at s = 1k take milliseconds and the machine may be shared: more repetitions there.
int reps_for(i64 s, const Options& o) {
  return s >= 16384 ? 1 : (s <= 1024 && !o.quick ? std::max(o.reps, 15) : o.reps);
}

// ---- [1a] ceilings ---------------------------------------------------------------------

double sgemm_full_gflops(i64 s, i64 d, int threads, int reps) {
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

double sgemm_tile_gflops(i64 d, int threads, int reps) {
  const i64 bq = kernels::kBlockQ, bk = kernels::block_k(d), iters = 200;
  const double t = time_median(reps, [&] {
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> q(std::size_t(bq * d), 0.5f), k(std::size_t(bk * d), 0.25f), s(std::size_t(bq * bk));
      std::vector<float> o(std::size_t(bq * d));
      for (i64 i = 0; i < iters; ++i) {
        sgemm(false, true, bq, bk, d, 1.0f, q.data(), d, k.data(), d, 0.0f, s.data(), bk);
        sgemm(false, false, bq, d, bk, 1.0f, s.data(), bk, k.data(), d, 1.0f, o.data(), d);
      }
    }
  });
  return 4.0 * double(bq * bk * d) * double(iters) * threads / t * 1e-9;
}

// GFLOP/s of c[m×n] = a[m×k] · b[k×n] (b pre-packed) repeated on every thread.
double amx_gemm_gflops(i64 m, i64 n, i64 k, int threads, int reps) {
  constexpr i64 iters = 4000;
  constexpr std::uint16_t kOne = 0x3f80;  // bf16 1.0
  const double t = time_median(reps, [&] {
#pragma omp parallel num_threads(threads)
    {
      std::vector<std::uint16_t> a(std::size_t(m * k), kOne), rows(std::size_t(k * n), kOne), b(rows.size());
      std::vector<float> c(std::size_t(m * n));
      amx::pack_vnni(k, n, rows.data(), b.data());  // microseconds next to the GEMMs
      amx::tile_gemm(iters, m, n, k, a.data(), k, b.data(), c.data(), n);
    }
  });
  return 2.0 * double(m * n * k) * double(iters) * threads / t * 1e-9;
}

struct AmxTile {
  double qk = 0, pv = 0;
  // Both GEMMs do the same FLOPs, so the pair's rate is the harmonic mean.
  double both() const { return 2.0 / (1.0 / qk + 1.0 / pv); }
};

struct Ceilings {
  double fma_peak = 0, dot_peak = 0;                 // register-resident, all T threads
  std::map<i64, double> sgemm_tile;                  // by d
  std::map<std::pair<i64, i64>, double> sgemm_full;  // by (s, d)
  bool amx = false;                                  // measured (amx level active)
  std::map<i64, AmxTile> amx_tile;                   // by d
  double f32() const { return fma_peak; }
  double bf16() const {
    return kernels::compute_unit(DType::bf16) == kernels::PeakUnit::bf16_dot ? dot_peak : fma_peak;
  }
};

// The peak of `unit` over T threads, each probing its own core at once.
double threads_peak(kernels::PeakUnit unit, int T) {
  double total = 0;
#pragma omp parallel num_threads(T) reduction(+ : total)
  total += kernels::peak_gflops(unit, 0.1);
  return total;
}

Ceilings measure_ceilings(const std::vector<i64>& seqs, const std::vector<i64>& dims, int T, const Options& o) {
  Ceilings c;
  c.fma_peak = threads_peak(kernels::PeakUnit::f32_fma, T);
  c.dot_peak = threads_peak(kernels::PeakUnit::bf16_dot, T);
  for (i64 d : dims) {
    c.sgemm_tile[d] = sgemm_tile_gflops(d, T, o.reps);
    for (i64 s : seqs) c.sgemm_full[{s, d}] = sgemm_full_gflops(s, d, T, reps_for(s, o));
  }
  // The library requests the tile permission when it detects AMX; asking again is harmless.
  c.amx = kernels::active_isa() == kernels::Isa::amx && amx::request_tiles();
  if (!c.amx) return c;
  for (i64 d : dims) {
    const i64 bq = kernels::kBlockQ, bk = kernels::block_k(d);
    c.amx_tile[d] = {amx_gemm_gflops(bq, bk, d, T, o.reps), amx_gemm_gflops(bq, d, bk, T, o.reps)};
  }
  return c;
}

json print_ceilings(const Ceilings& c, const std::vector<i64>& seqs, const std::vector<i64>& dims, int T) {
  fmt::print("[1a] ceilings of this CPU, {} threads, measured in this run (GFLOP/s)\n", T);
  const std::string dot = kernels::peak_unit_name(kernels::PeakUnit::bf16_dot);
  fmt::print("  peak (register-resident) f32 {} {:.1f}; bf16 {}; bf16 inputs run on the {}\n",
             kernels::peak_unit_name(kernels::PeakUnit::f32_fma), c.fma_peak,
             dot.empty() ? std::string("no dot product") : fmt::format("{} {:.1f}", dot, c.dot_peak),
             kernels::compute_unit(DType::bf16) == kernels::PeakUnit::bf16_dot ? "dot product" : "f32 FMA (converted)");
  json j{{"peak", {{"f32_fma_gflops", c.fma_peak}, {"bf16_dot_gflops", c.dot_peak}, {"bf16_ceiling_gflops", c.bf16()}}},
         {"sgemm", json::array()},
         {"amx", nullptr}};
  for (i64 d : dims) {
    const i64 bk = kernels::block_k(d);
    std::string full;
    json fj = json::array();
    for (i64 s : seqs) {
      full += fmt::format("  s={} {:.1f}", s, c.sgemm_full.at({s, d}));
      fj.push_back({{"s", s}, {"gflops", c.sgemm_full.at({s, d})}});
    }
    fmt::print("  f32 sgemm (OpenBLAS)  d={:<4} tile 64×{}×{} + 64×{}×{} {:.1f} | full s×s×d + s×d×s:{}\n", d, bk, d, d,
               bk, c.sgemm_tile.at(d), full);
    j["sgemm"].push_back({{"d", d}, {"tile_gflops", c.sgemm_tile.at(d)}, {"full", fj}});
  }
  if (!c.amx) {
    fmt::print("  bf16 AMX tiles        not measured: the active level is {}, not amx\n", kernel_isa());
    return j;
  }
  fmt::print("  bf16 AMX tiles        register-resident TDPBF16PS peak (2×2 tile blocking) {:.1f}\n", c.dot_peak);
  j["amx"] = {{"peak_gflops", c.dot_peak}, {"tiles", json::array()}};
  for (i64 d : dims) {
    const i64 bk = kernels::block_k(d);
    const AmxTile& t = c.amx_tile.at(d);
    fmt::print("                        d={:<4} packed Q·Kᵀ 64×{}×{} {:.1f}, P·V 64×{}×{} {:.1f}, pair {:.1f}\n", d, bk,
               d, t.qk, d, bk, t.pv, t.both());
    j["amx"]["tiles"].push_back({{"d", d}, {"qk_gflops", t.qk}, {"pv_gflops", t.pv}, {"pair_gflops", t.both()}});
  }
  return j;
}

// ---- flash timing ----------------------------------------------------------------------

struct Inputs {
  Tensor q, k, v, dout;
};

Inputs make_inputs(i64 s, i64 h, i64 d, DType dtype) {
  const Shape sh{1, s, h, d};
  Inputs in{Tensor(sh, dtype), Tensor(sh, dtype), Tensor(sh, dtype), Tensor(sh, dtype)};
  fill_uniform(in.q.view(), 1);
  fill_uniform(in.k.view(), 2);
  fill_uniform(in.v.view(), 3);
  fill_uniform(in.dout.view(), 4);
  return in;
}

struct Times {
  double fwd = 0, bwd = 0, peak_mb = 0;  // seconds (medians); peak working memory
};

struct Rates {
  double fwd = 0, bwd = 0;  // GFLOP/s
};

Rates rates(const Times& t, i64 s, i64 h, i64 d, bool causal) {
  const double flops = attention_forward_flops(1, s, s, h, d, causal);
  return {flops / t.fwd * 1e-9, 2.5 * flops / t.bwd * 1e-9};
}

// Forward then backward on `in`, outputs float32 whatever the input dtype.
Times time_flash(const Inputs& in, const AttentionParams& p, int reps) {
  const Shape sh = in.q.shape();
  Tensor out(sh), dq(sh), dk(sh), dv(sh);
  const Tensor lse = lse_tensor(sh);
  reset_tensor_bytes_peak();
  const i64 base = tensor_bytes_in_use();
  Times t;
  t.fwd = time_median(reps, [&] {
    flash_attention_forward(out.view(), lse.view(), in.q.view(), in.k.view(), in.v.view(), p);
  });
  t.bwd = time_median(reps, [&] {
    flash_attention_backward(dq.view(), dk.view(), dv.view(), in.dout.view(), in.q.view(), in.k.view(), in.v.view(),
                             out.view(), lse.view(), p);
  });
  t.peak_mb = double(tensor_bytes_peak() - base + i64(lse.nbytes())) / 1e6;
  return t;
}

// Flash times at the active level, kept so that [1d] reuses what [1c] measured.
class FlashRuns {
 public:
  Times get(i64 s, i64 h, i64 d, DType dtype, bool causal, int reps) {
    const auto key = std::tuple{int(kernels::active_isa()), s, h, d, int(dtype), causal, reps};
    if (auto it = done_.find(key); it != done_.end()) return it->second;
    return done_[key] = time_flash(make_inputs(s, h, d, dtype), {.causal = causal}, reps);
  }

 private:
  std::map<std::tuple<int, i64, i64, i64, int, bool, int>, Times> done_;
};

// ---- [1b] flash vs ceilings vs naive ---------------------------------------------------

// Naive attention on [1, s, h, d] tensors; P [h, s, s] is kept for the backward.
struct Naive {
  Tensor p;
  void forward(const TensorView& o, const TensorView& q, const TensorView& k, const TensorView& v, bool causal) {
    const i64 s = q.shape.s, h = q.shape.h, d = q.shape.d;
    const float scale = 1.0f / std::sqrt(float(d));
    p = Tensor::uninitialized({1, h * s, 1, s});
    for (i64 hh = 0; hh < h; ++hh) {
      float* P = p.f32() + hh * s * s;
      sgemm(false, true, s, s, d, scale, q.f32(0, 0, hh), q.stride_s, k.f32(0, 0, hh), k.stride_s, 0.0f, P, s);
#pragma omp parallel for schedule(static)
      for (i64 i = 0; i < s; ++i) {
        float* row = P + i * s;
        if (causal)
          for (i64 j = i + 1; j < s; ++j) row[j] = kNegInf;
        float mx = kNegInf, sum = 0;
        for (i64 j = 0; j < s; ++j) mx = std::max(mx, row[j]);
        for (i64 j = 0; j < s; ++j) sum += (row[j] = std::exp(row[j] - mx));
        for (i64 j = 0; j < s; ++j) row[j] /= sum;
      }
      sgemm(false, false, s, d, s, 1.0f, P, s, v.f32(0, 0, hh), v.stride_s, 0.0f, o.f32(0, 0, hh), o.stride_s);
    }
  }
  void backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                const TensorView& q, const TensorView& k, const TensorView& v) {
    const i64 s = q.shape.s, h = q.shape.h, d = q.shape.d;
    const float scale = 1.0f / std::sqrt(float(d));
    Tensor dp = Tensor::uninitialized({1, s, 1, s});
    for (i64 hh = 0; hh < h; ++hh) {
      const float* P = p.f32() + hh * s * s;
      float* dP = dp.f32();
      sgemm(true, false, s, d, s, 1.0f, P, s, dout.f32(0, 0, hh), dout.stride_s, 0.0f, dv.f32(0, 0, hh), dv.stride_s);
      sgemm(false, true, s, s, d, 1.0f, dout.f32(0, 0, hh), dout.stride_s, v.f32(0, 0, hh), v.stride_s, 0.0f, dP, s);
#pragma omp parallel for schedule(static)
      for (i64 i = 0; i < s; ++i) {
        const float* pr = P + i * s;
        float* r = dP + i * s;
        float D = 0;
        for (i64 j = 0; j < s; ++j) D += pr[j] * r[j];
        for (i64 j = 0; j < s; ++j) r[j] = pr[j] * (r[j] - D);
      }
      sgemm(false, false, s, d, s, scale, dP, s, k.f32(0, 0, hh), k.stride_s, 0.0f, dq.f32(0, 0, hh), dq.stride_s);
      sgemm(true, false, s, d, s, scale, dP, s, q.f32(0, 0, hh), q.stride_s, 0.0f, dk.f32(0, 0, hh), dk.stride_s);
    }
  }
};

// The naive baseline, BLAS on all cores.
Times time_naive(const Inputs& in, bool causal, int threads, int reps) {
  const Shape sh = in.q.shape();
  Tensor out(sh), dq(sh), dk(sh), dv(sh);
  openblas_set_num_threads(threads);
  Naive naive;
  reset_tensor_bytes_peak();
  const i64 base = tensor_bytes_in_use();
  Times t;
  t.fwd = time_median(reps, [&] { naive.forward(out.view(), in.q.view(), in.k.view(), in.v.view(), causal); });
  t.bwd = time_median(reps, [&] {
    naive.backward(dq.view(), dk.view(), dv.view(), in.dout.view(), in.q.view(), in.k.view(), in.v.view());
  });
  t.peak_mb = double(tensor_bytes_peak() - base) / 1e6;
  naive.p = Tensor();
  openblas_set_num_threads(1);
  let_blas_threads_sleep();
  return t;
}

// "0.42", or "-" where there is no ceiling.
std::string fraction(double x, double ceiling) { return ceiling > 0 ? fmt::format("{:.2f}", x / ceiling) : "-"; }

void print_flash_header(i64 h, int T) {
  fmt::print(
      "[1b] flash attention, {} threads, batch 1, {} heads; f32 and bf16 inputs (outputs f32); /c: over the "
      "register-resident peak of the unit the dtype runs on ([1a])\n",
      T, h);
  fmt::print(
      "{:>6} {:>4} {:>6} | {:>7} {:>7} {:>5} {:>5} {:>6} | {:>7} {:>7} {:>5} {:>5} | {:>7} {:>7} {:>6} | {:>8} "
      "{:>8}\n",
      "s", "d", "mask", "f32 fwd", "bwd", "fwd/c", "bwd/c", "caus/f", "bf16 f", "bwd", "fwd/c", "bwd/c", "naive f",
      "naive b", "x", "flash MB", "naive MB");
}

// One (s, d): both masks, f32 and bf16 flash, the naive baseline.
void flash_rows(i64 s, i64 d, i64 h, int T, const Options& o, const Ceilings& c, json& rows) {
  const int reps = reps_for(s, o);
  const Inputs f32 = make_inputs(s, h, d, DType::f32), bf16 = make_inputs(s, h, d, DType::bf16);
  double full_fwd_s = 0;
  for (bool causal : {false, true}) {
    const Times tf = time_flash(f32, {.causal = causal}, reps), tb = time_flash(bf16, {.causal = causal}, reps);
    const Times tn = time_naive(f32, causal, T, reps);
    const Rates rf = rates(tf, s, h, d, causal), rb = rates(tb, s, h, d, causal), rn = rates(tn, s, h, d, causal);
    if (!causal) full_fwd_s = tf.fwd;
    const double cf = c.f32(), cb = c.bf16();
    const double speedup = (tn.fwd + tn.bwd) / (tf.fwd + tf.bwd), causal_ratio = causal ? tf.fwd / full_fwd_s : 1.0;
    fmt::print(
        "{:>6} {:>4} {:>6} | {:>7.1f} {:>7.1f} {:>5.2f} {:>5.2f} {:>6} | {:>7.1f} {:>7.1f} {:>5} {:>5} | {:>7.1f} "
        "{:>7.1f} {:>5.1f}x | {:>8.1f} {:>8.1f}\n",
        s, d, mask_name(causal), rf.fwd, rf.bwd, rf.fwd / cf, rf.bwd / cf,
        causal ? fmt::format("{:.2f}", causal_ratio) : std::string("-"), rb.fwd, rb.bwd, fraction(rb.fwd, cb),
        fraction(rb.bwd, cb), rn.fwd, rn.bwd, speedup, tf.peak_mb, tn.peak_mb);
    rows.push_back({{"s", s},
                    {"d", d},
                    {"h", h},
                    {"causal", causal},
                    {"flash_fwd_gflops", rf.fwd},
                    {"flash_bwd_gflops", rf.bwd},
                    {"f32_ceiling_gflops", cf},
                    {"fwd_over_ceiling", rf.fwd / cf},
                    {"bwd_over_ceiling", rf.bwd / cf},
                    {"causal_over_full_fwd_time", causal_ratio},
                    {"bf16_fwd_gflops", rb.fwd},
                    {"bf16_bwd_gflops", rb.bwd},
                    {"bf16_ceiling_gflops", cb > 0 ? json(cb) : json(nullptr)},
                    {"bf16_fwd_over_ceiling", cb > 0 ? json(rb.fwd / cb) : json(nullptr)},
                    {"bf16_bwd_over_ceiling", cb > 0 ? json(rb.bwd / cb) : json(nullptr)},
                    {"naive_fwd_gflops", rn.fwd},
                    {"naive_bwd_gflops", rn.bwd},
                    {"flash_over_naive", speedup},
                    {"flash_peak_mb", tf.peak_mb},
                    {"bf16_flash_peak_mb", tb.peak_mb},
                    {"naive_peak_mb", tn.peak_mb}});
  }
}

json flash_table(const std::vector<i64>& seqs, const std::vector<i64>& dims, i64 h, int T, const Options& o,
                 const Ceilings& c) {
  print_flash_header(h, T);
  json rows = json::array();
  for (i64 s : seqs)
    for (i64 d : dims) flash_rows(s, d, h, T, o, c, rows);
  fmt::print(
      "caus/f: causal forward time over full; x: naive time over flash time (f32, fwd+bwd); MB: peak working "
      "memory (f32)\n");
  return rows;
}

// ---- [1c] levels -----------------------------------------------------------------------

// fwd and bwd GFLOP/s of both masks for one dtype at the active level; appends to j.
std::vector<Rates> level_rates(FlashRuns& runs, i64 s, i64 h, i64 d, DType dtype, int reps, json& j) {
  std::vector<Rates> r;
  for (bool causal : {false, true}) {
    r.push_back(rates(runs.get(s, h, d, dtype, causal, reps), s, h, d, causal));
    j[to_string(dtype)][mask_name(causal)] = {{"fwd_gflops", r.back().fwd}, {"bwd_gflops", r.back().bwd}};
  }
  return r;
}

// Time of one fwd+bwd per mask, summed, from the rates (the FLOPs are the same for every level).
double total_time(const std::vector<Rates>& r) {
  return 1.0 / r[0].fwd + 2.5 / r[0].bwd + 0.5 / r[1].fwd + 1.25 / r[1].bwd;
}

json levels_table(FlashRuns& runs, int T, const Options& o) {
  const i64 s = o.quick ? 512 : kAnchorSeq, h = kAnchorHeads, d = 64;
  fmt::print(
      "[1c] levels: every level this CPU supports, forced in turn; s={}, h={}, d={}, {} threads; fwd/bwd "
      "GFLOP/s; gain: speed over portable (fwd+bwd, both masks)\n",
      s, h, d, T);
  fmt::print("{:<8} | {:<10} {:>13} {:>13} {:>5} | {:<26} {:>13} {:>13} {:>5}\n", "level", "f32 engine", "full",
             "causal", "gain", "bf16 engine", "full", "causal", "gain");
  const std::vector<kernels::Isa> supported = kernels::supported_isas();
  const kernels::Isa saved = kernels::active_isa();
  json levels = json::array();
  double base_f32 = 0, base_bf16 = 0;
  for (kernels::Isa isa : {kernels::Isa::portable, kernels::Isa::avx2, kernels::Isa::avx512, kernels::Isa::amx}) {
    json j{{"level", kernels::to_string(isa)}, {"supported", false}};
    if (std::find(supported.begin(), supported.end(), isa) == supported.end()) {
      fmt::print("{:<8} | not on this CPU\n", kernels::to_string(isa));
      levels.push_back(j);
      continue;
    }
    kernels::force_isa(isa);
    j = {{"level", kernel_isa()},
         {"supported", true},
         {"engine_f32", kernel_engine(DType::f32)},
         {"engine_bf16", kernel_engine(DType::bf16)}};
    const auto rf = level_rates(runs, s, h, d, DType::f32, o.reps, j);
    const auto rb = level_rates(runs, s, h, d, DType::bf16, o.reps, j);
    if (isa == kernels::Isa::portable) {
      base_f32 = total_time(rf);
      base_bf16 = total_time(rb);
    }
    const double gf = base_f32 / total_time(rf), gb = base_bf16 / total_time(rb);
    j["gain_f32"] = gf;
    j["gain_bf16"] = gb;
    fmt::print(
        "{:<8} | {:<10} {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} {:>4.2f}x | {:<26} {:>6.1f} {:>6.1f} {:>6.1f} {:>6.1f} "
        "{:>4.2f}x\n",
        kernel_isa(), kernel_engine(DType::f32), rf[0].fwd, rf[0].bwd, rf[1].fwd, rf[1].bwd, gf,
        kernel_engine(DType::bf16), rb[0].fwd, rb[0].bwd, rb[1].fwd, rb[1].bwd, gb);
    levels.push_back(j);
  }
  kernels::force_isa(saved);
  return {{"s", s}, {"h", h}, {"d", d}, {"threads", T}, {"levels", levels}};
}

// ---- [1d] PyTorch SDPA anchor ----------------------------------------------------------

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// $ULYSSES_ANCHOR_PYTHON, else /tmp/anchors/bin/python; "" if neither. Never installs anything.
std::string anchor_python() {
  if (const char* env = std::getenv("ULYSSES_ANCHOR_PYTHON"); env && *env) return env;
  const char* venv = "/tmp/anchors/bin/python";
  return access(venv, X_OK) == 0 ? venv : "";
}

std::string anchor_script() { return std::string(ULYSSES_SOURCE_DIR) + "/bench/sdpa_anchor.py"; }

// Runs the script for one head dim (its progress and errors go to our stderr); its JSON, or
// null with *why set.
json run_sdpa(const std::string& python, i64 d, int threads, int reps, std::string* why) {
  const std::string cmd = fmt::format(
      "{} {} --seq {} --heads {} --head-dim {} --batch 1 --dtype f32,bf16 --masks "
      "full,causal --threads {} --reps {}",
      shell_quoted(python), shell_quoted(anchor_script()), kAnchorSeq, kAnchorHeads, d, threads, reps);
  auto fail = [&](std::string reason) {
    *why = std::move(reason);
    return json();
  };
  std::fflush(stdout);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return fail("cannot start " + python);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
  const int status = pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 3) return fail(python + " has no torch >= 2.0 with numpy");  // the script's exit code for it
  if (code != 0) return fail(fmt::format("`{}` failed (exit status {})", cmd, code));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("cases")) return fail("no JSON from " + anchor_script());
  return j;
}

// A JSON field as text: strings unquoted, null and missing as "?".
std::string field(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "?";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

void print_anchor_header(const json& sdpa, const std::string& python, int T, int reps) {
  fmt::print(
      "[1d] PyTorch SDPA anchor: torch {} (cpu capability {}, {}), s={}, h={}, batch 1, {} threads, medians of "
      "{}; GFLOP/s; speed: ulysses over SDPA\n",
      field(sdpa, "torch_version"), field(sdpa, "cpu_capability"), python, kAnchorSeq, kAnchorHeads, T, reps);
  fmt::print("{:>4} {:>5} {:>6} | {:>8} {:>8} | {:>11} {:>8} | {:>9} {:>6} | {}\n", "d", "dtype", "mask", "SDPA fwd",
             "bwd", "ulysses fwd", "bwd", "speed fwd", "bwd", "SDPA backend");
}

// The rows of one head dim: each case of the script beside ulysses on the same inputs.
void anchor_rows(const json& sdpa, i64 d, int reps, FlashRuns& runs, json& cases) {
  for (const json& c : sdpa["cases"]) {
    const std::string dt = c.value("dtype", "f32");
    const bool causal = c.value("causal", false);
    const Rates u = rates(runs.get(kAnchorSeq, kAnchorHeads, d, parse_dtype(dt), causal, reps), kAnchorSeq,
                          kAnchorHeads, d, causal);
    const double sf = c.value("fwd_gflops", 0.0), sb = c.value("bwd_gflops", 0.0);
    fmt::print("{:>4} {:>5} {:>6} | {:>8.1f} {:>8.1f} | {:>11.1f} {:>8.1f} | {:>8.2f}x {:>5.2f}x | {}\n", d, dt,
               mask_name(causal), sf, sb, u.fwd, u.bwd, u.fwd / sf, u.bwd / sb, field(c, "sdp_backend"));
    cases.push_back({{"d", d},
                     {"dtype", dt},
                     {"causal", causal},
                     {"sdpa_fwd_gflops", sf},
                     {"sdpa_bwd_gflops", sb},
                     {"ulysses_fwd_gflops", u.fwd},
                     {"ulysses_bwd_gflops", u.bwd},
                     {"fwd_speed_over_sdpa", u.fwd / sf},
                     {"bwd_speed_over_sdpa", u.bwd / sb},
                     {"sdpa", c}});
  }
}

json anchor_table(FlashRuns& runs, int T, const Options& o) {
  if (o.quick) {
    fmt::print("[1d] PyTorch SDPA anchor: skipped in --quick\n");
    return {{"skipped", "--quick"}};
  }
  const std::string python = anchor_python();
  std::string why = python.empty() ? "no Python with torch found" : "";
  if (why.empty() && access(anchor_script().c_str(), R_OK) != 0) why = anchor_script() + " not found";
  json out{{"python", python}, {"seq", kAnchorSeq}, {"heads", kAnchorHeads},
           {"threads", T},     {"reps", o.reps},    {"cases", json::array()}};
  for (i64 d : {64, 128}) {
    if (!why.empty()) break;
    let_blas_threads_sleep();  // leave the cores to the subprocess
    const json sdpa = run_sdpa(python, d, T, o.reps, &why);
    if (sdpa.is_null()) break;
    if (d == 64) {
      print_anchor_header(sdpa, python, T, o.reps);
      out["torch_version"] = sdpa.value("torch_version", "");
    }
    anchor_rows(sdpa, d, o.reps, runs, out["cases"]);
  }
  if (why.empty()) return out;
  fmt::print("[1d] PyTorch SDPA anchor: not run ({}); {}\n", why, kAnchorHowTo);
  return {{"skipped", why}, {"cases", out["cases"]}};
}

// [1e] Packed documents: the same s split into more and shorter documents, causal. The work
// is counted exactly (visible pairs, documents.hpp); the kernel skips the tiles outside every
// document, so its time should follow the work, not s².
json documents_table(int T, const Options& o) {
  const i64 s = o.quick ? 2048 : 16384, h = 2 * T, d = 64;
  const int reps = reps_for(s, o);
  fmt::print(
      "\n[1e] packed documents (cu_seqlens), s = {}, h = {}, d = {}, causal, f32: time follows the counted work\n", s,
      h, d);
  fmt::print("{:>14} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}\n", "documents", "work (pairs)", "work/1doc",
             "fwd ms", "bwd ms", "time/1doc", "fwd GF/s", "bwd GF/s");
  const Inputs in = make_inputs(s, h, d, DType::f32);
  json rows = json::array();
  double work1 = 0, time1 = 0;
  for (const i64 n : {i64(1), i64(16), i64(64)}) {
    const std::vector<i64> cu = cu_seqlens_of(std::vector<i64>(std::size_t(n), s / n));
    const Times t = time_flash(in, {.causal = true, .cu_seqlens = cu}, reps);
    const double work = double(visible_pairs(cu, true, {0, s}, {0, s})), flops = 4.0 * double(h * d) * work;
    if (n == 1) work1 = work, time1 = t.fwd + t.bwd;
    fmt::print("{:>9} x {:<4} {:>12.4g} {:>10.4f} {:>10.2f} {:>10.2f} {:>10.4f} {:>9.2f} {:>9.2f}\n", n, s / n, work,
               work / work1, t.fwd * 1e3, t.bwd * 1e3, (t.fwd + t.bwd) / time1, flops / t.fwd * 1e-9,
               2.5 * flops / t.bwd * 1e-9);
    rows.push_back({{"documents", n},
                    {"length", s / n},
                    {"work_pairs", work},
                    {"forward_s", t.fwd},
                    {"backward_s", t.bwd},
                    {"work_ratio", work / work1},
                    {"time_ratio", (t.fwd + t.bwd) / time1}});
  }
  fmt::print("GF/s by the exact count (4·d per visible pair); time/1doc should track work/1doc\n");
  return rows;
}

void print_header(int T) {
  fmt::print(
      "\n[1] local attention kernels: level {} (f32 on {}, bf16 on {}), {} threads; GFLOP/s by FlashAttention's "
      "count (bwd 2.5× fwd, causal half), medians; OpenBLAS core {}\n",
      kernel_isa(), kernel_engine(DType::f32), kernel_engine(DType::bf16), T, blas_core());
}

}  // namespace

nlohmann::json kernels_section(Communicator& world, const Options& o) {
  json result;
  if (world.rank() == 0) {
    const int T = o.cores;
    set_threads(T);
    const std::vector<i64> seqs = o.quick ? std::vector<i64>{512} : std::vector<i64>{1024, 4096, 16384};
    const std::vector<i64> dims = o.quick ? std::vector<i64>{64} : std::vector<i64>{64, 128};
    const i64 h = 2 * T;  // every thread gets whole heads
    print_header(T);
    const Ceilings ceilings = measure_ceilings(seqs, dims, T, o);
    FlashRuns runs;
    result = {{"level", kernel_isa()},
              {"engine_f32", kernel_engine(DType::f32)},
              {"engine_bf16", kernel_engine(DType::bf16)},
              {"threads", T},
              {"heads", h}};
    result["ceilings"] = print_ceilings(ceilings, seqs, dims, T);
    result["rows"] = flash_table(seqs, dims, h, T, o, ceilings);
    result["levels"] = levels_table(runs, T, o);
    result["anchor"] = anchor_table(runs, T, o);
    result["documents"] = documents_table(T, o);
    set_threads(o.threads_per_rank);
  }
  idle_barrier(MPI_COMM_WORLD);
  return result;
}

}  // namespace ulysses::bench
