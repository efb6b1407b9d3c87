// Shared by the GemmEngine contract tests (test_gemm_engine.cpp): operands in either engine
// dtype, matrices with exact extents (so a read or write past the last element is caught
// under ASan), a sentinel NaN for elements an op must not touch, seeded random operands, and
// the double-precision references of the three ops.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/engine.hpp"
#include "ulysses/core/bf16.hpp"

namespace engine_test {

using i64 = std::int64_t;
using bf16 = std::uint16_t;

inline i64 round_up(i64 x, i64 y) { return (x + y - 1) / y * y; }

// Elements of a row-major [rows][cols] matrix with row stride ld, ending at its last element.
inline i64 extent(i64 rows, i64 cols, i64 ld) { return rows == 0 ? 0 : (rows - 1) * ld + cols; }

inline bool visible(i64 i, i64 j, i64 diag) { return diag == ulysses::kernels::kNoDiagonal || j <= diag + i; }

inline std::string diag_str(i64 diag) { return diag == ulysses::kernels::kNoDiagonal ? "none" : std::to_string(diag); }

inline std::string shape(const char* a, i64 x, const char* b, i64 y, i64 d, i64 diag) {
  return std::string(a) + "=" + std::to_string(x) + " " + b + "=" + std::to_string(y) + " d=" + std::to_string(d) +
         " diag=" + diag_str(diag);
}

// An operand element (bf16 bits or float32) and its value.
template <class T>
T to_elem(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return ulysses::float_to_bf16(x);
  else
    return x;
}
inline double value(bf16 x) { return ulysses::bf16_to_float(x); }
inline double value(float x) { return x; }

// P as an engine of operand type T multiplies it: bf16 engines round it (FlashAttention's
// contract), float32 engines use it as is.
template <class T>
double rounded(float p) {
  return value(to_elem<T>(p));
}

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
  // An operand matrix [rows][cols] (stride ld, exact extent) of values in [-1, 1); gaps hold
  // values too, which the engine must ignore.
  template <class T>
  std::vector<T> matrix(i64 rows, i64 cols, i64 ld) {
    std::vector<T> x(extent(rows, cols, ld));
    for (auto& v : x) v = to_elem<T>(uniform(-1.0f, 1.0f));
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

// One op's expected float32 output over a [rows][cols] window (stride ld): want and the sum
// of magnitudes (the scale of the float32 rounding error) per element.
struct Expected {
  i64 rows, cols, ld;
  std::vector<double> want, scale;
  Expected(i64 r, i64 c, i64 l) : rows(r), cols(c), ld(l), want(r * c, 0.0), scale(r * c, 0.0) {}

  void add(i64 i, i64 j, double x) {
    want[i * cols + j] += x;
    scale[i * cols + j] += std::abs(x);
  }

  // |got − want| <= tol · scale where check(i, j); the stride gaps must hold the sentinel.
  template <class Check>
  ::testing::AssertionResult compare(const std::vector<float>& got, double tol, Check check) const {
    int bad = 0;
    std::ostringstream msg;
    for (i64 i = 0; i < rows; ++i) {
      for (i64 j = 0; j < ld && i * ld + j < i64(got.size()); ++j) {
        const float g = got[i * ld + j];
        if (j >= cols) {
          if (!is_sentinel(g) && bad++ < 5) msg << " wrote the gap at [" << i << "][" << j << "];";
          continue;
        }
        if (!check(i, j)) continue;
        const double w = want[i * cols + j], err = std::abs(double(g) - w);
        if (!(err <= tol * scale[i * cols + j] + 1e-30) && bad++ < 5)
          msg << " [" << i << "][" << j << "] got " << g << " want " << w << " (err " << err << ");";
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " bad elements:" << msg.str();
  }
};

inline bool everywhere(i64, i64) { return true; }

// s = a · kᵀ over keys [j0, j0 + n) of k.
template <class T>
Expected ref_scores(i64 m, i64 n, i64 d, const std::vector<T>& a, i64 lda, const std::vector<T>& k, i64 ldk, i64 j0,
                    i64 lds) {
  Expected e(m, n, lds);
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j)
      for (i64 x = 0; x < d; ++x) e.add(i, j, value(a[i * lda + x]) * value(k[(j0 + j) * ldk + x]));
  return e;
}

// acc + P-products, out[r][c] = acc[r][c] + Σ_x P(r, x) · B(x, c) with P rounded as the
// engine rounds it; NaN in P marks an element the engine must not read (past a block's
// diagonal) and is skipped.
template <class T, class P, class B>
Expected ref_product(i64 rows, i64 cols, i64 inner, const std::vector<float>& acc, i64 ld, P p_at, B b_at) {
  Expected e(rows, cols, ld);
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) {
      e.add(r, c, acc[r * ld + c]);
      for (i64 x = 0; x < inner; ++x)
        if (const float p = p_at(r, x); !std::isnan(p)) e.add(r, c, rounded<T>(p) * b_at(x, c));
    }
  return e;
}

// o + P · v over keys [j0, j0 + k) of v.
template <class T>
Expected ref_pv(i64 m, i64 d, i64 k, const std::vector<float>& p, i64 ldp, const std::vector<T>& v, i64 ldv, i64 j0,
                const std::vector<float>& o, i64 ldo) {
  return ref_product<T>(
      m, d, k, o, ldo, [&](i64 i, i64 j) { return p[i * ldp + j]; },
      [&](i64 j, i64 c) { return value(v[(j0 + j) * ldv + c]); });
}

// c + Pᵀ · b.
template <class T>
Expected ref_pt_b(i64 k, i64 d, i64 m, const std::vector<float>& p, i64 ldp, const std::vector<T>& b, i64 ldb,
                  const std::vector<float>& c, i64 ldc) {
  return ref_product<T>(
      k, d, m, c, ldc, [&](i64 j, i64 i) { return p[i * ldp + j]; },
      [&](i64 i, i64 col) { return value(b[i * ldb + col]); });
}

// An identity-like [n][d] operand: 1 on the diagonal.
template <class T>
std::vector<T> identity(i64 n, i64 d) {
  std::vector<T> eye(n * d, to_elem<T>(0.0f));
  for (i64 j = 0; j < std::min(n, d); ++j) eye[j * d + j] = to_elem<T>(1.0f);
  return eye;
}

}  // namespace engine_test
