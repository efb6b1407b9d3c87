#include "peak.hpp"

#include <algorithm>
#include <chrono>

#include "isa.hpp"
#include "peak_loops.hpp"

namespace ulysses::kernels {

namespace {

struct Probe {
  const char* name = "";
  float (*loop)(std::int64_t) = nullptr;
  double flops_per_iter = 0;
};

// The unit's probe at the active level; the bf16 unit is the one the bf16 engine uses.
Probe probe(PeakUnit unit) {
  using namespace peak_loops;
  const Isa isa = active_isa();
  if (unit == PeakUnit::f32_fma) {
    if (isa >= Isa::avx512) return {"avx512 vfmadd231ps", fma_avx512, kChains * 16.0 * 2};
    if (isa == Isa::avx2) return {"avx2 vfmadd231ps", fma_avx2, kChains * 8.0 * 2};
    return {};
  }
  if (isa == Isa::amx) return {"amx tdpbf16ps", tdpbf16_amx, 4 * 16.0 * 16 * 32 * 2};
  if (isa == Isa::avx512 && cpu_has_avx512_bf16()) return {"avx512_bf16 vdpbf16ps", dpbf16_avx512, kChains * 16.0 * 4};
  return {};
}

double seconds_of(const Probe& p, std::int64_t iters) {
  const auto t0 = std::chrono::steady_clock::now();
  volatile float sink = p.loop(iters);
  (void)sink;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string peak_unit_name(PeakUnit unit) { return probe(unit).name; }

PeakUnit compute_unit(DType dtype) {
  return dtype == DType::bf16 && active_level().bf16 != nullptr ? PeakUnit::bf16_dot : PeakUnit::f32_fma;
}

double peak_gflops(PeakUnit unit, double seconds) {
  const Probe p = probe(unit);
  if (!p.loop) return 0;
  // Many short windows, the best kept: on a loaded machine one of them finds the core alone.
  constexpr int kWindows = 7;
  std::int64_t iters = 1 << 12;  // grow until one call takes a tenth of a window
  while (seconds_of(p, iters) < seconds / kWindows / 10 && iters < (std::int64_t(1) << 40)) iters *= 4;
  const double t = seconds_of(p, iters);
  iters = std::max<std::int64_t>(iters, std::int64_t(double(iters) * seconds / kWindows / t));
  double best = 1e300;
  for (int rep = 0; rep < kWindows; ++rep) best = std::min(best, seconds_of(p, iters));
  return p.flops_per_iter * double(iters) / best * 1e-9;
}

}  // namespace ulysses::kernels
