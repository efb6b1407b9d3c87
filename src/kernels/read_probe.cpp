#include "ulysses/kernels/read_probe.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "ulysses/core/cpu_clock.hpp"

namespace ulysses::kernels {

double probe_clock() {
  if (omp_get_max_threads() == 1) return thread_cpu_seconds();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double read_pass_seconds(const float* data, std::size_t n, std::size_t ahead) {
  constexpr std::size_t kLanes = 32;
  const double t0 = probe_clock();
  float total = 0;
#pragma omp parallel reduction(+ : total)
  {
    float lanes[kLanes] = {};
#pragma omp for schedule(static)
    for (std::size_t i = 0; i < n / kLanes; ++i) {
      if (ahead > 0)
        for (std::size_t j = 0; j < kLanes; j += 64 / sizeof(float))
          __builtin_prefetch(data + i * kLanes + ahead + j, 0, 3);
#pragma omp simd
      for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += data[i * kLanes + j];
    }
    for (const float x : lanes) total += x;
  }
  const double t = probe_clock() - t0;
  return total == 12345.0f ? t * 1.0000001 : t;  // the sum is used: the loop stays
}

double read_seconds(const float* data, std::size_t n) {
  return std::min(read_pass_seconds(data, n, 0), read_pass_seconds(data, n, 512));
}

}  // namespace ulysses::kernels
