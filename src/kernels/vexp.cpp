#include "vexp.hpp"

#include <cmath>
#include <cstring>

namespace ulysses::kernels {

namespace {
Isa detect() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::avx2 : Isa::portable; }
Isa g_isa = detect();
}  // namespace

Isa active_isa() { return g_isa; }
void force_isa(Isa isa) { g_isa = (isa == Isa::avx2 && detect() != Isa::avx2) ? Isa::portable : isa; }
const char* to_string(Isa isa) { return isa == Isa::avx2 ? "avx2" : "portable"; }

float exp_shifted_sum(const float* x, float* out, std::int64_t n, float shift) {
  return g_isa == Isa::avx2 ? exp_shifted_sum_avx2(x, out, n, shift)
                            : exp_shifted_sum_portable(x, out, n, shift);
}

float row_max(const float* x, std::int64_t n, float init) {
  return g_isa == Isa::avx2 ? row_max_avx2(x, n, init) : row_max_portable(x, n, init);
}

float row_max_portable(const float* x, std::int64_t n, float init) {
  for (std::int64_t i = 0; i < n; ++i) init = x[i] > init ? x[i] : init;
  return init;
}

// The scalar twin of the AVX2 code (plain multiply-adds: a CPU without AVX2 has no FMA unit,
// and std::fma would fall back to a slow software routine).
static inline float exp_one(float x) {
  if (!(x >= -87.0f)) return 0.0f;  // also catches NaN-free -inf
  x = std::fmin(x, 88.3f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.0f);
  std::int32_t bits = (std::int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

float exp_shifted_sum_portable(const float* x, float* out, std::int64_t n, float shift) {
  float sum = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = exp_one(x[i] - shift);
    sum += out[i];
  }
  return sum;
}

}  // namespace ulysses::kernels
