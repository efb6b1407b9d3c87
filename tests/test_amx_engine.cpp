// The AMX bf16 engine (src/kernels/engine_bf16_amx.cpp) compiled against the software tile
// model (tests/emulation/amx_emulation.hpp): every op against a double-precision reference
// computed from the same bf16-rounded inputs, so the only expected difference is float32
// accumulation. Caller buffers are allocated to their exact extent (the last row ends at
// its last element), so a run under AddressSanitizer also checks that no tile load or store
// reaches past the caller's matrices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "amx_emulation.hpp"
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

const GemmEngine& engine() { return ulysses::kernels::emulated::amx_bf16; }

const i64 kMs[] = {1, 5, 16, 33, 64};
const i64 kNs[] = {1, 31, 32, 100, 256};
const i64 kDs[] = {8, 16, 24, 64, 128};
const i64 kDiags[] = {kNoDiagonal, 0, -5, 17};

// Compares one op's float32 output against the double reference over a [rows][cols] window
// (stride ld): |got − want| <= tol · scale per element; elements where `check` is false are
// skipped. Also requires every element in the stride gaps to still hold the sentinel.
struct Checker {
  i64 rows, cols, ld;
  std::vector<double> want, scale;
  Checker(i64 r, i64 c, i64 l) : rows(r), cols(c), ld(l), want(r * c, 0.0), scale(r * c, 0.0) {}

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

// A packed image, prefilled with garbage so unwritten padding shows.
std::vector<std::uint8_t> garbage_image(i64 n, i64 d) {
  return std::vector<std::uint8_t>(engine().packed_bytes(n, d), 0xab);
}

std::uint16_t image_at(const std::vector<std::uint8_t>& img, i64 byte) {
  std::uint16_t v;
  std::memcpy(&v, img.data() + byte, 2);
  return v;
}

// ---- packing ----------------------------------------------------------------------------

TEST(AmxEngine, PackedSizesAndOffsets) {
  for (i64 d : {1, 8, 16, 24, 32, 33, 64, 100, 128, 256}) {
    const i64 dp = round_up(d, 32);
    for (i64 n : {1, 31, 32, 33, 100, 256, 1000})
      EXPECT_EQ(engine().packed_bytes(n, d), round_up(n, kKeyAlign) * dp * 2);
    for (i64 j0 : {i64(0), kKeyAlign, 2 * kKeyAlign, 15 * kKeyAlign})
      EXPECT_EQ(engine().packed_offset(j0, d), j0 * dp * 2);
  }
}

// The documented layouts, element by element, padding included.
TEST(AmxEngine, PackLayouts) {
  Rng rng(1);
  for (i64 d : {1, 7, 8, 16, 24, 33, 64, 128}) {
    for (i64 n : {1, 15, 31, 32, 100, 256}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 ld = d + 3, dp = round_up(d, 32), np = round_up(n, kKeyAlign);
      const auto k = rng.bf16_matrix(n, d, ld);
      auto bt = garbage_image(n, d), b = garbage_image(n, d);
      engine().pack_bt(k.data(), ld, n, d, bt.data());
      engine().pack_b(k.data(), ld, n, d, b.data());
      int bad_bt = 0, bad_b = 0;
      for (i64 j = 0; j < np; ++j) {
        for (i64 e = 0; e < dp; ++e) {
          const std::uint16_t want = j < n && e < d ? k[j * ld + e] : 0;
          const i64 at_bt = (j / 16) * 32 * dp + (e / 32) * 1024 + (e % 32 / 2) * 64 + (j % 16) * 4 + (e % 2) * 2;
          const i64 at_b = (j / 32) * 64 * dp + (e / 16) * 1024 + (j % 32 / 2) * 64 + (e % 16) * 4 + (j % 2) * 2;
          bad_bt += image_at(bt, at_bt) != want;
          bad_b += image_at(b, at_b) != want;
        }
      }
      EXPECT_EQ(bad_bt, 0);
      EXPECT_EQ(bad_b, 0);
    }
  }
}

// ---- scores -----------------------------------------------------------------------------

TEST(AmxEngine, Scores) {
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
        Checker ref(m, n, lds);
        for (i64 i = 0; i < m; ++i)
          for (i64 j = 0; j < n; ++j) {
            double sum = 0, mag = 0;
            for (i64 e = 0; e < d; ++e) {
              const double x = double(bf16_to_float(a[i * lda + e])) * bf16_to_float(k[(j0 + j) * ldk + e]);
              sum += x;
              mag += std::abs(x);
            }
            ref.want[i * n + j] = sum;
            ref.scale[i * n + j] = mag;
          }
        for (i64 diag : kDiags) {
          SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " d=" + std::to_string(d) +
                       " diag=" + diag_str(diag));
          std::vector<float> s(extent(m, n, lds), sentinel());
          engine().scores(m, n, d, a.data(), lda, block, s.data(), lds, diag);
          // Scores at or before the diagonal must be written; past it they may be anything.
          EXPECT_TRUE(ref.compare(s, 1e-5, [&](i64 i, i64 j) { return visible(i, j, diag); }));
        }
      }
    }
  }
}

// A whole 16 × 16 tile past the diagonal is not multiplied.
TEST(AmxEngine, ScoresSkipTilesPastTheDiagonal) {
  Rng rng(3);
  const i64 m = 64, n = 256, d = 64;
  const auto k = rng.bf16_matrix(n, d, d), a = rng.bf16_matrix(m, d, d);
  auto bt = garbage_image(n, d);
  engine().pack_bt(k.data(), d, n, d, bt.data());
  std::vector<float> s(m * n);
  for (i64 diag : {kNoDiagonal, i64(0), i64(40), i64(-20)}) {
    i64 tiles = 0;
    for (i64 r = 0; r < m / 16; ++r)
      for (i64 t = 0; t < n / 16; ++t) tiles += 16 * t <= diag + 16 * r + 15;
    const i64 before = amx_emu::state().dp_count;
    engine().scores(m, n, d, a.data(), d, bt.data(), s.data(), n, diag);
    EXPECT_EQ(amx_emu::state().dp_count - before, tiles * (d / 32)) << "diag=" << diag_str(diag);
  }
}

// ---- pv ---------------------------------------------------------------------------------

TEST(AmxEngine, Pv) {
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
          SCOPED_TRACE("m=" + std::to_string(m) + " k=" + std::to_string(k) + " d=" + std::to_string(d) +
                       " diag=" + diag_str(diag));
          const i64 ldp = k + 3, ldo = d + 5;
          const auto p = rng.p_matrix(m, k, ldp, diag);
          std::vector<float> o(extent(m, d, ldo), sentinel());
          Checker ref(m, d, ldo);
          for (i64 i = 0; i < m; ++i)
            for (i64 c = 0; c < d; ++c) {
              o[i * ldo + c] = rng.uniform(-1.0f, 1.0f);  // pv accumulates
              double sum = o[i * ldo + c], mag = std::abs(sum);
              for (i64 j = 0; j < k; ++j) {
                const double x =
                    double(bf16_to_float(float_to_bf16(p[i * ldp + j]))) * bf16_to_float(v[(j0 + j) * ldv + c]);
                sum += x;
                mag += std::abs(x);
              }
              ref.want[i * d + c] = sum;
              ref.scale[i * d + c] = mag;
            }
          engine().pv(m, d, k, p.data(), ldp, block, o.data(), ldo, diag);
          EXPECT_TRUE(ref.compare(o, 2e-5, [](i64, i64) { return true; }));
        }
      }
    }
  }
}

TEST(AmxEngine, PvSkipsKeysPastTheDiagonal) {
  Rng rng(5);
  const i64 m = 64, k = 256, d = 64;
  const auto v = rng.bf16_matrix(k, d, d);
  auto img = garbage_image(k, d);
  engine().pack_b(v.data(), d, k, d, img.data());
  std::vector<float> o(m * d, 0.0f);
  const auto p_full = rng.p_matrix(m, k, k, kNoDiagonal), p_causal = rng.p_matrix(m, k, k, 0);
  i64 before = amx_emu::state().dp_count;
  engine().pv(m, d, k, p_full.data(), k, img.data(), o.data(), d, kNoDiagonal);
  const i64 full = amx_emu::state().dp_count - before;
  before = amx_emu::state().dp_count;
  engine().pv(m, d, k, p_causal.data(), k, img.data(), o.data(), d, 0);
  const i64 causal = amx_emu::state().dp_count - before;
  EXPECT_EQ(full, (m / 16) * (d / 16) * (k / 32));
  // Rows 0..31 need key chunk 0, rows 32..63 chunks 0..1.
  EXPECT_EQ(causal, 2 * (d / 16) * 1 + 2 * (d / 16) * 2);
}

// ---- pt_b -------------------------------------------------------------------------------

TEST(AmxEngine, PtB) {
  Rng rng(6);
  for (i64 d : kDs) {
    for (i64 k : kNs) {
      for (i64 m : kMs) {
        const i64 ldb = d + 5;
        const auto b = rng.bf16_matrix(m, d, ldb);
        for (i64 diag : kDiags) {
          SCOPED_TRACE("m=" + std::to_string(m) + " k=" + std::to_string(k) + " d=" + std::to_string(d) +
                       " diag=" + diag_str(diag));
          const i64 ldp = k + 3, ldc = d + 1;
          const auto p = rng.p_matrix(m, k, ldp, diag);
          std::vector<float> c(extent(k, d, ldc), sentinel());
          Checker ref(k, d, ldc);
          for (i64 j = 0; j < k; ++j)
            for (i64 col = 0; col < d; ++col) {
              c[j * ldc + col] = rng.uniform(-1.0f, 1.0f);  // pt_b accumulates
              double sum = c[j * ldc + col], mag = std::abs(sum);
              for (i64 i = 0; i < m; ++i) {
                const double x = double(bf16_to_float(float_to_bf16(p[i * ldp + j]))) * bf16_to_float(b[i * ldb + col]);
                sum += x;
                mag += std::abs(x);
              }
              ref.want[j * d + col] = sum;
              ref.scale[j * d + col] = mag;
            }
          engine().pt_b(k, d, m, p.data(), ldp, b.data(), ldb, c.data(), ldc, diag);
          EXPECT_TRUE(ref.compare(c, 2e-5, [](i64, i64) { return true; }));
        }
      }
    }
  }
}

TEST(AmxEngine, PtBSkipsRowsBeforeTheDiagonal) {
  Rng rng(7);
  const i64 m = 64, k = 256, d = 64;
  const auto b = rng.bf16_matrix(m, d, d);
  std::vector<float> c(k * d, 0.0f);
  const auto p = rng.p_matrix(m, k, k, 0);
  const i64 before = amx_emu::state().dp_count;
  engine().pt_b(k, d, m, p.data(), k, b.data(), d, c.data(), d, 0);
  // Keys 0..31 take row chunks 0..1, keys 32..63 chunk 1, later keys none.
  EXPECT_EQ(amx_emu::state().dp_count - before, 4 * (d / 32) * 2 + 4 * (d / 32) * 1);
}

// ---- rounding of P to bf16 ------------------------------------------------------------

// Float32 values around bf16 rounding points: ties (to even, both ways), just below and
// above, positive and negative, normal magnitudes (the tile unit reads bf16 denormals as 0).
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

// pv with V = I: O[i][c] = bf16(P[i][c]) exactly, and the same for pt_b with B = I.
TEST(AmxEngine, RoundsPToNearestEven) {
  Rng rng(8);
  const i64 m = 50, k = 100, d = 100;
  const i64 ldp = k + 1;
  std::vector<float> p(extent(m, k, ldp));
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < k; ++j) p[i * ldp + j] = tricky_value(rng, int(i * k + j) % 16);
  std::vector<std::uint16_t> eye(k * d, 0);
  for (i64 j = 0; j < k; ++j) eye[j * d + j] = float_to_bf16(1.0f);
  auto img = garbage_image(k, d);
  engine().pack_b(eye.data(), d, k, d, img.data());
  std::vector<float> o(m * d, 0.0f);
  engine().pv(m, d, k, p.data(), ldp, img.data(), o.data(), d, kNoDiagonal);
  int bad = 0;
  for (i64 i = 0; i < m; ++i)
    for (i64 c = 0; c < d; ++c)
      if (o[i * d + c] != bf16_to_float(float_to_bf16(p[i * ldp + c])) && bad++ < 5)
        ADD_FAILURE() << "pv: P[" << i << "][" << c << "] = " << p[i * ldp + c] << " gave " << o[i * d + c];
  EXPECT_EQ(bad, 0);

  // pt_b: C[j][c] = Σ_i bf16(P[i][j]) · I[i][c] = bf16(P[c][j]), m = d = 50 query rows.
  const i64 dm = m;
  std::vector<std::uint16_t> eye_m(m * dm, 0);
  for (i64 i = 0; i < m; ++i) eye_m[i * dm + i] = float_to_bf16(1.0f);
  std::vector<float> c(k * dm, 0.0f);
  engine().pt_b(k, dm, m, p.data(), ldp, eye_m.data(), dm, c.data(), dm, kNoDiagonal);
  bad = 0;
  for (i64 j = 0; j < k; ++j)
    for (i64 col = 0; col < dm; ++col)
      if (c[j * dm + col] != bf16_to_float(float_to_bf16(p[col * ldp + j])) && bad++ < 5)
        ADD_FAILURE() << "pt_b: P[" << col << "][" << j << "] = " << p[col * ldp + j] << " gave " << c[j * dm + col];
  EXPECT_EQ(bad, 0);
}

// NaN stays NaN, ±inf stays inf, FLT_MAX rounds up to inf. One special per row (it spreads
// through its row: inf · 0 is NaN), on the diagonal of an identity V / B.
TEST(AmxEngine, RoundsSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf,
      std::numeric_limits<float>::max(),       -std::numeric_limits<float>::max()};
  // Signalling-style NaN whose rounding carry would otherwise reach the exponent.
  std::uint32_t nan_bits = 0x7fffffff;
  float big_nan;
  std::memcpy(&big_nan, &nan_bits, 4);
  std::vector<float> values(std::begin(specials), std::end(specials));
  values.push_back(big_nan);
  const i64 n = i64(values.size()), d = 16, k = 32;
  std::vector<float> p(n * k, 0.5f);
  for (i64 i = 0; i < n; ++i) p[i * k + i] = values[i];
  std::vector<std::uint16_t> eye(k * d, 0);
  for (i64 j = 0; j < d; ++j) eye[j * d + j] = float_to_bf16(1.0f);
  auto img = garbage_image(k, d);
  engine().pack_b(eye.data(), d, k, d, img.data());
  std::vector<float> o(n * d, 0.0f);
  engine().pv(n, d, k, p.data(), k, img.data(), o.data(), d, kNoDiagonal);
  std::vector<float> c(k * n, 0.0f);  // pt_b with B = I [n][n]: C[j][c] = bf16(P[c][j])
  std::vector<std::uint16_t> eye_n(n * n, 0);
  for (i64 i = 0; i < n; ++i) eye_n[i * n + i] = float_to_bf16(1.0f);
  engine().pt_b(k, n, n, p.data(), k, eye_n.data(), n, c.data(), n, kNoDiagonal);
  for (i64 i = 0; i < n; ++i) {
    const float want = bf16_to_float(float_to_bf16(values[i]));
    for (float got : {o[i * d + i], c[i * n + i]}) {
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "value " << i;
      } else {
        EXPECT_EQ(got, want) << "value " << i;
      }
    }
  }
}

// ---- odd sizes and strides ------------------------------------------------------------

// Inner dimensions that are not multiples of the tile: odd d, odd leading dimensions, and the
// key block at the end of an image whose keys are not a multiple of 32.
TEST(AmxEngine, OddShapes) {
  Rng rng(9);
  for (i64 d : {1, 3, 17, 33, 100, 256}) {
    for (i64 n : {7, 47, 200}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 m = 37, ld = d + 2, lds = n + 1;
      const auto kv = rng.bf16_matrix(n, d, ld), a = rng.bf16_matrix(m, d, ld);
      auto bt = garbage_image(n, d), b = garbage_image(n, d);
      engine().pack_bt(kv.data(), ld, n, d, bt.data());
      engine().pack_b(kv.data(), ld, n, d, b.data());
      // scores
      std::vector<float> s(extent(m, n, lds), sentinel());
      engine().scores(m, n, d, a.data(), ld, bt.data(), s.data(), lds, kNoDiagonal);
      Checker rs(m, n, lds);
      for (i64 i = 0; i < m; ++i)
        for (i64 j = 0; j < n; ++j)
          for (i64 e = 0; e < d; ++e) {
            const double x = double(bf16_to_float(a[i * ld + e])) * bf16_to_float(kv[j * ld + e]);
            rs.want[i * n + j] += x;
            rs.scale[i * n + j] += std::abs(x);
          }
      EXPECT_TRUE(rs.compare(s, 1e-5, [](i64, i64) { return true; }));
      // pv
      const i64 ldp = n + 1, ldo = d + 3;
      const auto p = rng.p_matrix(m, n, ldp, kNoDiagonal);
      std::vector<float> o(extent(m, d, ldo), sentinel());
      Checker ro(m, d, ldo);
      for (i64 i = 0; i < m; ++i)
        for (i64 c = 0; c < d; ++c) {
          o[i * ldo + c] = 1.0f;
          ro.want[i * d + c] = 1.0;
          ro.scale[i * d + c] = 1.0;
          for (i64 j = 0; j < n; ++j) {
            const double x = double(bf16_to_float(float_to_bf16(p[i * ldp + j]))) * bf16_to_float(kv[j * ld + c]);
            ro.want[i * d + c] += x;
            ro.scale[i * d + c] += std::abs(x);
          }
        }
      engine().pv(m, d, n, p.data(), ldp, b.data(), o.data(), ldo, kNoDiagonal);
      EXPECT_TRUE(ro.compare(o, 2e-5, [](i64, i64) { return true; }));
    }
  }
}

// ---- the tile model itself ----------------------------------------------------------------

namespace amx_model {

struct alignas(64) Config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

void use_before_config() {
  _tile_release();
  alignas(64) float buf[256] = {};
  _tile_loadd(0, buf, 64);
}

void mismatched_shapes() {
  Config c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  c.rows[4] = 8;  // A with 8 rows, C with 16
  _tile_loadconfig(&c);
  _tile_dpbf16ps(0, 4, 6);
}

}  // namespace amx_model

TEST(AmxEmulationDeathTest, FailsLoudlyOnMisuse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(amx_model::use_before_config(), "before _tile_loadconfig");
  EXPECT_DEATH(amx_model::mismatched_shapes(), "rows of A differ");
}

}  // namespace
