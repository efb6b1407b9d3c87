// Shared by the bf16 engines' op-by-op tests (test_amx_engine.cpp, test_bf16_avx512_engine.cpp):
// matrices with exact extents (so a read or write past the last element is caught under
// ASan), a sentinel NaN for elements an op must not touch, and seeded random operands.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/engine.hpp"
#include "ulysses/bf16.hpp"

namespace engine_test {

using i64 = std::int64_t;

inline i64 round_up(i64 x, i64 y) { return (x + y - 1) / y * y; }

// Elements of a row-major [rows][cols] matrix with row stride ld, ending at its last element.
inline i64 extent(i64 rows, i64 cols, i64 ld) { return rows == 0 ? 0 : (rows - 1) * ld + cols; }

inline bool visible(i64 i, i64 j, i64 diag) { return diag == ulysses::kernels::kNoDiagonal || j <= diag + i; }

inline std::string diag_str(i64 diag) { return diag == ulysses::kernels::kNoDiagonal ? "none" : std::to_string(diag); }

// A sentinel NaN bit pattern for the elements an op must not touch.
constexpr std::uint32_t kSentinel = 0x7fc0dead;
inline float sentinel() {
  float f;
  std::memcpy(&f, &kSentinel, 4);
  return f;
}
inline bool is_sentinel(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u == kSentinel;
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(std::uint64_t seed) : gen(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  // A bf16 matrix [rows][cols] (stride ld, exact extent) of values in [-1, 1); gaps hold
  // values too, which the engine must ignore.
  std::vector<std::uint16_t> bf16_matrix(i64 rows, i64 cols, i64 ld) {
    std::vector<std::uint16_t> x(extent(rows, cols, ld));
    for (auto& v : x) v = ulysses::float_to_bf16(uniform(-1.0f, 1.0f));
    return x;
  }
  // Probabilities in [0, 1) with P = 0 past the diagonal (the contract of pv and pt_b),
  // float32 values that are not bf16 (so rounding matters); gaps hold the sentinel.
  std::vector<float> p_matrix(i64 rows, i64 cols, i64 ld, i64 diag) {
    std::vector<float> p(extent(rows, cols, ld), sentinel());
    for (i64 i = 0; i < rows; ++i)
      for (i64 j = 0; j < cols; ++j) p[i * ld + j] = visible(i, j, diag) ? uniform(0.0f, 1.0f) : 0.0f;
    return p;
  }
  // A float32 output matrix to accumulate onto: values in [-1, 1), sentinel in the gaps.
  std::vector<float> c_matrix(i64 rows, i64 cols, i64 ld) {
    std::vector<float> c(extent(rows, cols, ld), sentinel());
    for (i64 i = 0; i < rows; ++i)
      for (i64 j = 0; j < cols; ++j) c[i * ld + j] = uniform(-1.0f, 1.0f);
    return c;
  }
};

}  // namespace engine_test
