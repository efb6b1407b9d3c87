// The AVX512_BF16 engine (src/kernels/engine_bf16_avx512.cpp) compiled without ISA flags
// (-DULYSSES_KERNEL_NS=emulated -DULYSSES_BF16_EMULATION: VDPBF16PS in plain vector code):
// every op against a double-precision reference computed from the same bf16-rounded inputs,
// so the only expected difference is float32 accumulation. Caller buffers are allocated to
// their exact extent (the last row ends at its last element), so a run under
// AddressSanitizer also checks that no vector load or store reaches past the caller's
// matrices; stride gaps hold a sentinel NaN that must survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_util.hpp"
#include "kernels/engines.hpp"
#include "ulysses/bf16.hpp"

namespace {

using namespace engine_test;
using ulysses::bf16_to_float;
using ulysses::float_to_bf16;
using ulysses::kernels::GemmEngine;
using ulysses::kernels::kKeyAlign;
using ulysses::kernels::kNoDiagonal;
using i64 = std::int64_t;
using bf16 = std::uint16_t;

const GemmEngine& engine() { return ulysses::kernels::emulated::avx512_bf16; }

const i64 kMs[] = {1, 5, 16, 33, 64};
const i64 kNs[] = {1, 31, 64, 100, 256};
const i64 kDs[] = {8, 16, 24, 40, 64, 128};
const i64 kDiags[] = {kNoDiagonal, 0, -5, 17};

// The engine's register block (white-box tests of what it skips past a causal diagonal).
constexpr i64 kMR = 6, kW = 16;

i64 clamp(i64 x, i64 lo, i64 hi) { return x < lo ? lo : x > hi ? hi : x; }

std::string shape(const char* a, i64 x, const char* b, i64 y, i64 d, i64 diag) {
  return std::string(a) + "=" + std::to_string(x) + " " + b + "=" + std::to_string(y) + " d=" + std::to_string(d) +
         " diag=" + diag_str(diag);
}

double rounded(float p) { return bf16_to_float(float_to_bf16(p)); }

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

auto everywhere = [](i64, i64) { return true; };

// ---- references ---------------------------------------------------------------------------

// s = a · kᵀ over keys [j0, j0 + n) of k.
Expected ref_scores(i64 m, i64 n, i64 d, const std::vector<bf16>& a, i64 lda, const std::vector<bf16>& k, i64 ldk,
                    i64 j0, i64 lds) {
  Expected e(m, n, lds);
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < n; ++j)
      for (i64 x = 0; x < d; ++x)
        e.add(i, j, double(bf16_to_float(a[i * lda + x])) * bf16_to_float(k[(j0 + j) * ldk + x]));
  return e;
}

// o + bf16(p) · v over keys [j0, j0 + k) of v.
Expected ref_pv(i64 m, i64 d, i64 k, const std::vector<float>& p, i64 ldp, const std::vector<bf16>& v, i64 ldv, i64 j0,
                const std::vector<float>& o, i64 ldo) {
  Expected e(m, d, ldo);
  for (i64 i = 0; i < m; ++i)
    for (i64 c = 0; c < d; ++c) {
      e.add(i, c, o[i * ldo + c]);
      for (i64 j = 0; j < k; ++j) {
        const float pij = p[i * ldp + j];
        if (std::isnan(pij)) continue;  // P past the diagonal the engine must not read
        e.add(i, c, rounded(pij) * bf16_to_float(v[(j0 + j) * ldv + c]));
      }
    }
  return e;
}

// c + bf16(p)ᵀ · b.
Expected ref_pt_b(i64 k, i64 d, i64 m, const std::vector<float>& p, i64 ldp, const std::vector<bf16>& b, i64 ldb,
                  const std::vector<float>& c, i64 ldc) {
  Expected e(k, d, ldc);
  for (i64 j = 0; j < k; ++j)
    for (i64 col = 0; col < d; ++col) {
      e.add(j, col, c[j * ldc + col]);
      for (i64 i = 0; i < m; ++i) {
        const float pij = p[i * ldp + j];
        if (std::isnan(pij)) continue;
        e.add(j, col, rounded(pij) * bf16_to_float(b[i * ldb + col]));
      }
    }
  return e;
}

// A packed image, prefilled with garbage so unwritten padding shows.
std::vector<std::uint8_t> garbage_image(i64 n, i64 d) {
  return std::vector<std::uint8_t>(engine().packed_bytes(n, d), 0xab);
}

bf16 image_at(const std::vector<std::uint8_t>& img, i64 byte) {
  bf16 v;
  std::memcpy(&v, img.data() + byte, 2);
  return v;
}

// ---- packing ----------------------------------------------------------------------------

TEST(Avx512Bf16Engine, NameAndDtype) {
  EXPECT_STREQ(engine().name, "avx512bf16-bf16");
  EXPECT_EQ(engine().dtype, ulysses::DType::bf16);
}

TEST(Avx512Bf16Engine, PackedSizesAndOffsets) {
  for (i64 d : {1, 8, 15, 16, 24, 33, 40, 64, 100, 128, 256}) {
    const i64 dp = round_up(d, 16);
    for (i64 n : {1, 31, 64, 65, 100, 256, 1000})
      EXPECT_EQ(engine().packed_bytes(n, d), round_up(n, kKeyAlign) * dp * 2);
    for (i64 j0 : {i64(0), kKeyAlign, 2 * kKeyAlign, 15 * kKeyAlign})
      EXPECT_EQ(engine().packed_offset(j0, d), j0 * dp * 2);
  }
}

// The documented layouts, element by element, padding included.
TEST(Avx512Bf16Engine, PackLayouts) {
  Rng rng(1);
  for (i64 d : {1, 7, 8, 16, 24, 33, 40, 64, 128}) {
    for (i64 n : {1, 15, 31, 64, 100, 256}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 ld = d + 3, dp = round_up(d, 16), np = round_up(n, kKeyAlign);
      const auto k = rng.bf16_matrix(n, d, ld);
      auto bt = garbage_image(n, d), b = garbage_image(n, d);
      engine().pack_bt(k.data(), ld, n, d, bt.data());
      engine().pack_b(k.data(), ld, n, d, b.data());
      int bad_bt = 0, bad_b = 0;
      for (i64 j = 0; j < np; ++j) {
        for (i64 e = 0; e < dp; ++e) {
          const bf16 want = j < n && e < d ? k[j * ld + e] : 0;
          // pack_bt: panels of 64 keys [dp/2 pairs][64 keys] of (K[j][2t], K[j][2t + 1]).
          const i64 word_bt = (j / 64) * 64 * (dp / 2) + (e / 2) * 64 + j % 64;
          // pack_b: [key pairs][dp] of (V[2q][c], V[2q + 1][c]).
          const i64 word_b = (j / 2) * dp + e;
          bad_bt += image_at(bt, 4 * word_bt + 2 * (e % 2)) != want;
          bad_b += image_at(b, 4 * word_b + 2 * (j % 2)) != want;
        }
      }
      EXPECT_EQ(bad_bt, 0);
      EXPECT_EQ(bad_b, 0);
    }
  }
}

// ---- scores -----------------------------------------------------------------------------

TEST(Avx512Bf16Engine, Scores) {
  Rng rng(2);
  const i64 j0 = kKeyAlign;  // the key block starts inside the image: checks packed_offset
  for (i64 d : kDs) {
    for (i64 n : kNs) {
      const i64 n_total = j0 + n + 7, ldk = d + 3;
      const auto k = rng.bf16_matrix(n_total, d, ldk);
      auto bt = garbage_image(n_total, d);
      engine().pack_bt(k.data(), ldk, n_total, d, bt.data());
      const void* block = bt.data() + engine().packed_offset(j0, d);
      for (i64 m : kMs) {
        const i64 lda = d + 5, lds = n + 3;
        const auto a = rng.bf16_matrix(m, d, lda);
        const Expected ref = ref_scores(m, n, d, a, lda, k, ldk, j0, lds);
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "n", n, d, diag));
          std::vector<float> s(extent(m, n, lds), sentinel());
          engine().scores(m, n, d, a.data(), lda, block, s.data(), lds, diag);
          // Scores at or before the diagonal must be written; past it they may be anything.
          EXPECT_TRUE(ref.compare(s, 1e-5, [&](i64 i, i64 j) { return visible(i, j, diag); }));
        }
      }
    }
  }
}

// White box: a block of 6 rows computes the 16-key vectors its last row sees, no more; the
// scores past them stay unwritten.
TEST(Avx512Bf16Engine, ScoresSkipVectorsPastTheDiagonal) {
  Rng rng(3);
  const i64 m = 64, n = 256, d = 64;
  const auto k = rng.bf16_matrix(n, d, d), a = rng.bf16_matrix(m, d, d);
  auto bt = garbage_image(n, d);
  engine().pack_bt(k.data(), d, n, d, bt.data());
  for (i64 diag : {i64(0), i64(40), i64(-20), i64(200)}) {
    std::vector<float> s(m * n, sentinel());
    engine().scores(m, n, d, a.data(), d, bt.data(), s.data(), n, diag);
    int written_past = 0, missing = 0;
    for (i64 i = 0; i < m; ++i) {
      const i64 i0 = i / kMR * kMR, mr = std::min(kMR, m - i0);
      const i64 computed = std::min(n, round_up(clamp(diag + i0 + mr, 0, n), kW));
      for (i64 j = 0; j < n; ++j) {
        if (j >= computed)
          written_past += !is_sentinel(s[i * n + j]);
        else
          missing += is_sentinel(s[i * n + j]);
      }
    }
    EXPECT_EQ(written_past, 0) << "diag=" << diag;
    EXPECT_EQ(missing, 0) << "diag=" << diag;
  }
}

// ---- pv ---------------------------------------------------------------------------------

TEST(Avx512Bf16Engine, Pv) {
  Rng rng(4);
  const i64 j0 = 2 * kKeyAlign;
  for (i64 d : kDs) {
    for (i64 k : kNs) {
      const i64 n_total = j0 + k + 9, ldv = d + 1;
      const auto v = rng.bf16_matrix(n_total, d, ldv);
      auto img = garbage_image(n_total, d);
      engine().pack_b(v.data(), ldv, n_total, d, img.data());
      const void* block = img.data() + engine().packed_offset(j0, d);
      for (i64 m : kMs) {
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "k", k, d, diag));
          const i64 ldp = k + 3, ldo = d + 5;
          const auto p = rng.p_matrix(m, k, ldp, diag);
          auto o = rng.c_matrix(m, d, ldo);  // pv accumulates
          const Expected ref = ref_pv(m, d, k, p, ldp, v, ldv, j0, o, ldo);
          engine().pv(m, d, k, p.data(), ldp, block, o.data(), ldo, diag);
          EXPECT_TRUE(ref.compare(o, 2e-5, everywhere));
        }
      }
    }
  }
}

// White box: a block of 6 rows reads P only up to its last row's diagonal (NaN past it
// would otherwise poison the sums).
TEST(Avx512Bf16Engine, PvReadsNoPPastTheBlockDiagonal) {
  Rng rng(5);
  const i64 m = 64, k = 256, d = 40, ldp = k + 1;
  const auto v = rng.bf16_matrix(k, d, d);
  auto img = garbage_image(k, d);
  engine().pack_b(v.data(), d, k, d, img.data());
  for (i64 diag : {i64(0), i64(-3), i64(31)}) {
    SCOPED_TRACE("diag=" + std::to_string(diag));
    auto p = rng.p_matrix(m, k, ldp, diag);
    for (i64 i = 0; i < m; ++i)
      for (i64 j = std::max<i64>(0, diag + i / kMR * kMR + kMR); j < k; ++j)
        p[i * ldp + j] = std::numeric_limits<float>::quiet_NaN();
    auto o = rng.c_matrix(m, d, d);
    const Expected ref = ref_pv(m, d, k, p, ldp, v, d, 0, o, d);
    engine().pv(m, d, k, p.data(), ldp, img.data(), o.data(), d, diag);
    EXPECT_TRUE(ref.compare(o, 2e-5, everywhere));
  }
}

// ---- pt_b -------------------------------------------------------------------------------

TEST(Avx512Bf16Engine, PtB) {
  Rng rng(6);
  for (i64 d : kDs) {
    for (i64 k : kNs) {
      for (i64 m : kMs) {
        const i64 ldb = d + 5;
        const auto b = rng.bf16_matrix(m, d, ldb);
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "k", k, d, diag));
          const i64 ldp = k + 3, ldc = d + 1;
          const auto p = rng.p_matrix(m, k, ldp, diag);
          auto c = rng.c_matrix(k, d, ldc);  // pt_b accumulates
          const Expected ref = ref_pt_b(k, d, m, p, ldp, b, ldb, c, ldc);
          engine().pt_b(k, d, m, p.data(), ldp, b.data(), ldb, c.data(), ldc, diag);
          EXPECT_TRUE(ref.compare(c, 2e-5, everywhere));
        }
      }
    }
  }
}

// White box: for the block of 6 keys at c0, the rows before c0 − diag (rounded down to a
// pair) are not multiplied.
TEST(Avx512Bf16Engine, PtBSkipsRowsBeforeTheDiagonal) {
  Rng rng(7);
  const i64 m = 64, k = 256, d = 24, ldp = k + 2;
  const auto b = rng.bf16_matrix(m, d, d);
  for (i64 diag : {i64(0), i64(-3), i64(7)}) {
    SCOPED_TRACE("diag=" + std::to_string(diag));
    auto p = rng.p_matrix(m, k, ldp, diag);
    for (i64 j = 0; j < k; ++j) {
      const i64 skipped = clamp(j / kMR * kMR - diag, 0, m) / 2 * 2;
      for (i64 i = 0; i < skipped; ++i) p[i * ldp + j] = std::numeric_limits<float>::quiet_NaN();
    }
    auto c = rng.c_matrix(k, d, d);
    const Expected ref = ref_pt_b(k, d, m, p, ldp, b, d, c, d);
    engine().pt_b(k, d, m, p.data(), ldp, b.data(), d, c.data(), d, diag);
    EXPECT_TRUE(ref.compare(c, 2e-5, everywhere));
  }
}

// ---- rounding of P to bf16 ------------------------------------------------------------

// Float32 values around bf16 rounding points: ties (to even, both ways), just below and
// above, positive and negative, normal magnitudes (the hardware reads bf16 denormals as 0).
float tricky_value(Rng& rng, int kind) {
  static const std::uint32_t low_bits[] = {0x8000, 0x7fff, 0x8001, 0x0001, 0xffff, 0x0000, 0x4000, 0xc000};
  const float base = rng.uniform(0.01f, 4.0f) * (kind & 8 ? -1.0f : 1.0f);
  std::uint32_t u;
  std::memcpy(&u, &base, 4);
  u = (u & 0xffff0000u) | low_bits[kind % 8];
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<bf16> identity(i64 n, i64 d) {
  std::vector<bf16> eye(n * d, 0);
  for (i64 j = 0; j < std::min(n, d); ++j) eye[j * d + j] = float_to_bf16(1.0f);
  return eye;
}

// pv with V = I: O[i][c] = bf16(P[i][c]) exactly, and the same for pt_b with B = I.
TEST(Avx512Bf16Engine, RoundsPToNearestEven) {
  Rng rng(8);
  const i64 m = 50, k = 100, d = 100;
  const i64 ldp = k + 1;
  std::vector<float> p(extent(m, k, ldp));
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < k; ++j) p[i * ldp + j] = tricky_value(rng, int(i * k + j) % 16);
  const auto eye = identity(k, d);
  auto img = garbage_image(k, d);
  engine().pack_b(eye.data(), d, k, d, img.data());
  std::vector<float> o(m * d, 0.0f);
  engine().pv(m, d, k, p.data(), ldp, img.data(), o.data(), d, kNoDiagonal);
  int bad = 0;
  for (i64 i = 0; i < m; ++i)
    for (i64 c = 0; c < d; ++c)
      if (o[i * d + c] != float(rounded(p[i * ldp + c])) && bad++ < 5)
        ADD_FAILURE() << "pv: P[" << i << "][" << c << "] = " << p[i * ldp + c] << " gave " << o[i * d + c];
  EXPECT_EQ(bad, 0);

  // pt_b: C[j][c] = Σ_i bf16(P[i][j]) · I[i][c] = bf16(P[c][j]), m = d = 50 query rows.
  const auto eye_m = identity(m, m);
  std::vector<float> c(k * m, 0.0f);
  engine().pt_b(k, m, m, p.data(), ldp, eye_m.data(), m, c.data(), m, kNoDiagonal);
  bad = 0;
  for (i64 j = 0; j < k; ++j)
    for (i64 col = 0; col < m; ++col)
      if (c[j * m + col] != float(rounded(p[col * ldp + j])) && bad++ < 5)
        ADD_FAILURE() << "pt_b: P[" << col << "][" << j << "] = " << p[col * ldp + j] << " gave " << c[j * m + col];
  EXPECT_EQ(bad, 0);
}

// The rounding differs from truncation: ties to even and carries.
TEST(Avx512Bf16Engine, RoundingIsNotTruncation) {
  const float cases[][2] = {
      {1.00390625f, 1.0f},               // 1 + 2⁻⁸: a tie, rounds down to even
      {1.01171875f, 1.015625f},          // 1 + 3·2⁻⁸: a tie, rounds up to even
      {1.0078125f - 1e-7f, 1.0078125f},  // just below 1 + 2⁻⁷: rounds up
  };
  const i64 n = 3, d = 16, k = 16;
  std::vector<float> p(n * k, 0.0f);
  for (i64 i = 0; i < n; ++i) p[i * k + i] = cases[i][0];
  const auto eye = identity(k, d);
  auto img = garbage_image(k, d);
  engine().pack_b(eye.data(), d, k, d, img.data());
  std::vector<float> o(n * d, 0.0f);
  engine().pv(n, d, k, p.data(), k, img.data(), o.data(), d, kNoDiagonal);
  for (i64 i = 0; i < n; ++i) EXPECT_EQ(o[i * d + i], cases[i][1]) << "case " << i;
}

// NaN stays NaN, ±inf stays inf, FLT_MAX rounds up to inf. One special per row (it spreads
// through its row: inf · 0 is NaN), on the diagonal of an identity V / B.
TEST(Avx512Bf16Engine, RoundsSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf,
      std::numeric_limits<float>::max(),       -std::numeric_limits<float>::max()};
  // A NaN whose rounding carry would otherwise reach the exponent, and signalling NaNs
  // whose payload is all in the low half (truncated they would be ±inf).
  for (const std::uint32_t nan_bits : {0x7fffffffu, 0x7f800001u, 0xff800001u}) {
    float nan;
    std::memcpy(&nan, &nan_bits, 4);
    values.push_back(nan);
  }
  // Each value at P[i][off + i]: off = 0 goes through the vector rounding, off = 16 through
  // the scalar tail (k = 31 keys).
  const i64 n = i64(values.size()), d = 32, k = 31;
  for (i64 off : {0, 16}) {
    SCOPED_TRACE("off=" + std::to_string(off));
    std::vector<float> p(n * k, 0.5f);
    for (i64 i = 0; i < n; ++i) p[i * k + off + i] = values[i];
    const auto eye = identity(k, d);
    auto img = garbage_image(k, d);
    engine().pack_b(eye.data(), d, k, d, img.data());
    std::vector<float> o(n * d, 0.0f);
    engine().pv(n, d, k, p.data(), k, img.data(), o.data(), d, kNoDiagonal);
    std::vector<float> c(k * n, 0.0f);  // pt_b with B = I [n][n]: C[j][c] = bf16(P[c][j])
    const auto eye_n = identity(n, n);
    engine().pt_b(k, n, n, p.data(), k, eye_n.data(), n, c.data(), n, kNoDiagonal);
    for (i64 i = 0; i < n; ++i) {
      const float want = float(rounded(values[i]));
      for (float got : {o[i * d + off + i], c[(off + i) * n + i]}) {
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "value " << i;
        } else {
          EXPECT_EQ(got, want) << "value " << i;
        }
      }
    }
  }
}

// ---- odd sizes and strides ------------------------------------------------------------

// Odd inner dimensions (d for scores, k for pv, m for pt_b), odd leading dimensions, head
// dims that are not a multiple of 16, and key blocks at the end of an image.
TEST(Avx512Bf16Engine, OddShapes) {
  Rng rng(9);
  for (i64 d : {1, 3, 17, 33, 100, 256}) {
    for (i64 n : {7, 47, 200}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 m = 37, ld = d + 2, lds = n + 1;
      const auto kv = rng.bf16_matrix(n, d, ld), a = rng.bf16_matrix(m, d, ld);
      auto bt = garbage_image(n, d), b = garbage_image(n, d);
      engine().pack_bt(kv.data(), ld, n, d, bt.data());
      engine().pack_b(kv.data(), ld, n, d, b.data());
      for (i64 diag : {kNoDiagonal, i64(-2), i64(9)}) {
        SCOPED_TRACE("diag=" + diag_str(diag));
        std::vector<float> s(extent(m, n, lds), sentinel());
        engine().scores(m, n, d, a.data(), ld, bt.data(), s.data(), lds, diag);
        EXPECT_TRUE(ref_scores(m, n, d, a, ld, kv, ld, 0, lds).compare(s, 1e-5, [&](i64 i, i64 j) {
          return visible(i, j, diag);
        }));

        const i64 ldp = n + 1, ldo = d + 3;
        const auto p = rng.p_matrix(m, n, ldp, diag);
        auto o = rng.c_matrix(m, d, ldo);
        const Expected ro = ref_pv(m, d, n, p, ldp, kv, ld, 0, o, ldo);
        engine().pv(m, d, n, p.data(), ldp, b.data(), o.data(), ldo, diag);
        EXPECT_TRUE(ro.compare(o, 2e-5, everywhere));

        auto c = rng.c_matrix(n, d, ldo);
        const Expected rc = ref_pt_b(n, d, m, p, ldp, a, ld, c, ldo);
        engine().pt_b(n, d, m, p.data(), ldp, a.data(), ld, c.data(), ldo, diag);
        EXPECT_TRUE(rc.compare(c, 2e-5, everywhere));
      }
    }
  }
}

// Empty shapes do nothing; d = 0 scores are 0.
TEST(Avx512Bf16Engine, EmptyShapes) {
  std::vector<float> s(4 * 5, sentinel());
  const bf16 dummy[1] = {0};
  engine().scores(4, 5, 0, dummy, 0, dummy, s.data(), 5, kNoDiagonal);
  for (float x : s) EXPECT_EQ(x, 0.0f);
  std::vector<float> c(4, 1.0f);
  engine().pv(0, 4, 8, nullptr, 8, nullptr, c.data(), 4, kNoDiagonal);
  engine().pt_b(4, 4, 0, nullptr, 8, nullptr, 4, c.data(), 4, kNoDiagonal);
  const std::vector<float> p(3, 0.5f);
  engine().pt_b(1, 4, 3, p.data(), 1, dummy, 0, c.data(), 4, -5);  // every row before the diagonal
  for (float x : c) EXPECT_EQ(x, 1.0f);
}

// The scratch is per thread: concurrent calls of different shapes give the serial results.
TEST(Avx512Bf16Engine, ThreadsUseTheirOwnScratch) {
  Rng rng(10);
  const i64 d = 40, k = 100;
  const i64 ms[] = {5, 33, 64, 17};
  std::vector<std::vector<float>> p, want, got;
  std::vector<std::vector<bf16>> b;
  for (i64 m : ms) {
    p.push_back(rng.p_matrix(m, k, k, kNoDiagonal));
    b.push_back(rng.bf16_matrix(m, d, d));
    want.emplace_back(k * d, 0.0f);
    engine().pt_b(k, d, m, p.back().data(), k, b.back().data(), d, want.back().data(), d, kNoDiagonal);
  }
  got.assign(4, {});
  std::vector<int> differing(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> c(k * d, 0.0f);
        engine().pt_b(k, d, ms[t], p[t].data(), k, b[t].data(), d, c.data(), d, kNoDiagonal);
        if (rep == 0)
          got[t] = c;
        else
          differing[t] += c != got[t];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(got[t], want[t]) << "thread " << t;
    EXPECT_EQ(differing[t], 0) << "thread " << t;
  }
}

}  // namespace
