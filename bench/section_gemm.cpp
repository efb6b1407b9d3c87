// Section 5: the trainer's GEMMs on every library this machine has, against the register-
// resident peak of the unit they run on (src/kernels/peak.hpp), one thread (one rank's share).
//
//   shapes   tokens N × the layer's [IC, OC]: the projections (512 → 512), the MLP's up
//            (512 → 1376) and down (1376 → 512) at width 512; each as the forward
//            out = inp · w, and the backward's two: dinp += dout · wᵀ and dw += inpᵀ · dout
//   f32      OpenBLAS cblas_sgemm, BLIS bli_sgemm (loaded with dlopen: its cblas symbols
//            would clash with OpenBLAS's), oneDNN matmul f32
//   bf16     oneDNN matmul bf16 → f32 (bf16 inputs, float32 accumulation and output);
//            OpenBLAS cblas_sbgemm where the OpenBLAS in use exports it (Debian's 0.3.21 does not)
//
// Best of `reps` rounds, the libraries interleaved within each round, so a burst of load from
// another process hits all of them alike; rates over the peak measured in the same run.
#include <cblas.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <functional>
#include <random>

#include "bench.hpp"
#include "kernels/onednn_gemm.hpp"
#include "kernels/peak.hpp"
#include "ulysses/core/bf16.hpp"

namespace ulysses::bench {

namespace {

using json = nlohmann::json;
using i64 = std::int64_t;

// A GEMM of one library: (ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate), f32 or bf16 inputs.
using F32Gemm = std::function<void(bool, bool, i64, i64, i64, const float*, i64, const float*, i64, float*, i64, bool)>;
using Bf16Gemm = std::function<void(bool, bool, i64, i64, i64, const std::uint16_t*, i64, const std::uint16_t*, i64,
                                    float*, i64, bool)>;

void openblas_sgemm(bool ta, bool tb, i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, float* c,
                    i64 ldc, bool acc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.0f, a, int(lda), b, int(ldb), acc ? 1.0f : 0.0f, c, int(ldc));
}

// BLIS's typed API with explicit strides (row-major op(A) [m, k]: strides (lda, 1), or (1, lda)
// transposed); dim_t and inc_t are 64-bit in Debian's build.
struct Blis {
  using Sgemm = void (*)(int, int, i64, i64, i64, const float*, const float*, i64, i64, const float*, i64, i64,
                         const float*, float*, i64, i64);
  Sgemm sgemm = nullptr;
  std::string arch;
  Blis() {
    void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) return;
    sgemm = reinterpret_cast<Sgemm>(dlsym(h, "bli_sgemm"));
    auto threads = reinterpret_cast<void (*)(i64)>(dlsym(h, "bli_thread_set_num_threads"));
    auto id = reinterpret_cast<int (*)()>(dlsym(h, "bli_arch_query_id"));
    auto name = reinterpret_cast<const char* (*)(int)>(dlsym(h, "bli_arch_string"));
    if (threads) threads(1);
    if (id && name) arch = name(id());
  }
  void operator()(bool ta, bool tb, i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, float* c,
                  i64 ldc, bool acc) const {
    const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
    sgemm(0, 0, m, n, k, &one, a, ta ? 1 : lda, ta ? lda : 1, b, tb ? 1 : ldb, tb ? ldb : 1, &beta, c, ldc, 1);
  }
};

struct Shape {
  const char* what;  // "fwd", "dinp", "dw"
  bool ta, tb;
  i64 m, n, k, lda, ldb;
};

// The three GEMMs of a layer [IC → OC] over N rows (matmul_forward / matmul_backward).
std::vector<Shape> layer_gemms(i64 N, i64 IC, i64 OC) {
  return {{"fwd", false, false, N, OC, IC, IC, OC},
          {"dinp", false, true, N, IC, OC, OC, OC},
          {"dw", true, false, IC, OC, N, IC, OC}};
}

struct Operands {
  std::vector<float> a, b, c;
  std::vector<std::uint16_t> a16, b16;
  explicit Operands(const Shape& s) {
    std::mt19937 g(1);
    std::uniform_real_distribution<float> u(-1, 1);
    a.resize(std::size_t(s.ta ? s.k * s.lda : s.m * s.lda));
    b.resize(std::size_t(s.tb ? s.n * s.ldb : s.k * s.ldb));
    c.resize(std::size_t(s.m * s.n));
    for (float& x : a) x = u(g);
    for (float& x : b) x = u(g);
    for (float x : a) a16.push_back(float_to_bf16(x));
    for (float x : b) b16.push_back(float_to_bf16(x));
  }
};

struct Library {
  std::string name;
  bool bf16;
  std::function<void(const Shape&, Operands&)> call;
};

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

json gemm_section(Communicator& world, const Options& o) {
  idle_barrier(MPI_COMM_WORLD);  // the other ranks sleep: rank 0 measures on one core
  json out;
  if (world.rank() == 0) {
    openblas_set_num_threads(1);
    // The peaks are measured again in every round (best of all), so they see the same load.
    double f32_peak = 0, bf16_peak = 0;
    auto probe_peaks = [&] {
      f32_peak = std::max(f32_peak, kernels::peak_gflops(kernels::PeakUnit::f32_fma));
      bf16_peak = std::max(bf16_peak, kernels::peak_gflops(kernels::PeakUnit::bf16_dot));
    };
    const int rounds = o.quick ? 1 : std::max(o.reps, 3);
    fmt::print(
        "\n[5] the trainer's GEMMs by library, 1 thread, best of {} interleaved rounds (GFLOP/s; "
        "fraction of the peak of the dtype's unit)\n",
        rounds);
    static const Blis blis;
    auto* sbgemm = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    fmt::print("  OpenBLAS core {}; BLIS {}; oneDNN bf16: {}; OpenBLAS cblas_sbgemm: {}\n", openblas_get_corename(),
               blis.sgemm ? "arch " + blis.arch : std::string("not installed"),
               kernels::onednn_bf16_implementation(1024, 512, 512),
               sbgemm ? "exported (not measured)" : "not exported");
    std::vector<Library> libs{{"openblas", false, [](const Shape& s, Operands& x) {
                                 openblas_sgemm(s.ta, s.tb, s.m, s.n, s.k, x.a.data(), s.lda, x.b.data(), s.ldb,
                                                x.c.data(), s.n, true);
                               }}};
    if (blis.sgemm)
      libs.push_back({"blis", false, [](const Shape& s, Operands& x) {
                        blis(s.ta, s.tb, s.m, s.n, s.k, x.a.data(), s.lda, x.b.data(), s.ldb, x.c.data(), s.n, true);
                      }});
    libs.push_back({"onednn", false, [](const Shape& s, Operands& x) {
                      kernels::onednn_gemm_f32(s.ta, s.tb, s.m, s.n, s.k, x.a.data(), s.lda, x.b.data(), s.ldb,
                                               x.c.data(), s.n, true);
                    }});
    libs.push_back({"onednn-bf16", true, [](const Shape& s, Operands& x) {
                      kernels::onednn_gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, x.a16.data(), s.lda, x.b16.data(), s.ldb,
                                                x.c.data(), s.n, true);
                    }});

    const std::vector<i64> tokens = o.quick ? std::vector<i64>{512} : std::vector<i64>{4096, 8192};
    const std::vector<std::pair<i64, i64>> layers{{512, 512}, {512, 1376}, {1376, 512}};
    struct Row {
      i64 N, IC, OC;
      const char* what;
      std::vector<double> gflops;  // by library
    };
    std::vector<Row> rows;
    for (i64 N : tokens)
      for (auto [IC, OC] : layers)
        for (const Shape& s : layer_gemms(N, IC, OC)) {
          Operands x(s);
          std::vector<double> best(libs.size(), 1e300);
          for (const Library& l : libs) l.call(s, x);  // warm-up: primitives created, pages touched
          for (int r = 0; r < rounds; ++r) {
            probe_peaks();
            for (std::size_t i = 0; i < libs.size(); ++i)
              best[i] = std::min(best[i], seconds([&] { libs[i].call(s, x); }));
          }
          Row row{N, IC, OC, s.what, {}};
          for (double t : best) row.gflops.push_back(2.0 * double(s.m) * double(s.n) * double(s.k) / t * 1e-9);
          rows.push_back(row);
        }

    const std::string f32_unit = kernels::peak_unit_name(kernels::PeakUnit::f32_fma),
                      bf16_unit = kernels::peak_unit_name(kernels::PeakUnit::bf16_dot);
    fmt::print(
        "  peaks (register-resident, 12 chains; best over the rounds): f32 {} {:.1f}, bf16 {} {:.1f} "
        "GFLOP/s per core\n",
        f32_unit, f32_peak, bf16_peak > 0 ? bf16_unit : "none", bf16_peak);
    out["peak"] = {{"f32_gflops", f32_peak},
                   {"f32_unit", f32_unit},
                   {"bf16_gflops", bf16_peak},
                   {"bf16_unit", bf16_unit}};
    std::string head = fmt::format("  {:>5} {:>11} {:>4}", "N", "IC -> OC", "gemm");
    for (const Library& l : libs) head += fmt::format(" {:>18}", l.name);
    fmt::print("{}\n", head);
    json table = json::array();
    for (const Row& r : rows) {
      std::string line = fmt::format("  {:>5} {:>4} -> {:<4} {:>4}", r.N, r.IC, r.OC, r.what);
      json j{{"tokens", r.N}, {"ic", r.IC}, {"oc", r.OC}, {"gemm", r.what}};
      for (std::size_t i = 0; i < libs.size(); ++i) {
        const double peak = libs[i].bf16 ? bf16_peak : f32_peak, frac = peak > 0 ? r.gflops[i] / peak : 0.0;
        line += fmt::format(" {:>10.1f} ({:.2f})", r.gflops[i], frac);
        j[libs[i].name] = {{"gflops", r.gflops[i]}, {"over_peak", frac}};
      }
      fmt::print("{}\n", line);
      table.push_back(j);
    }
    out["rows"] = table;
  }
  idle_barrier(MPI_COMM_WORLD);
  return world.rank() == 0 ? out : json(nullptr);
}

}  // namespace ulysses::bench
