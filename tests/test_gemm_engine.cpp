// The GemmEngine contract (src/kernels/engine.hpp), one typed suite over every engine: the
// portable (OpenBLAS), AVX2 and AVX-512 float32 engines and the AVX512_BF16 and AMX bfloat16
// engines, each natively where the CPU runs it (skipped where it cannot) and the AVX-512 and
// AMX sources also compiled without ISA flags (namespace `emulated`: VDPBF16PS in plain
// vector code, AMX on the software tile model of tests/emulation/amx_emulation.hpp), so
// every engine's code is checked on any CPU.
//
// Every op against a double-precision reference computed from the same (dtype-rounded)
// inputs, so the only expected difference is float32 accumulation. Caller buffers are
// allocated to their exact extent (the last row ends at its last element), so a run under
// AddressSanitizer also checks that no vector or tile load or store reaches past the
// caller's matrices; stride gaps hold a sentinel NaN that must survive. White-box suites
// below check what the register-blocked engines and the AMX tiles skip past a causal diagonal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "amx_emulation.hpp"
#include "engine_test_util.hpp"
#include "kernels/engines.hpp"
#include "kernels/isa.hpp"

namespace {

using namespace engine_test;
using ulysses::kernels::GemmEngine;
using ulysses::kernels::Isa;
using ulysses::kernels::kKeyAlign;
using ulysses::kernels::kNoDiagonal;
namespace native = ulysses::kernels::native;
namespace emulated = ulysses::kernels::emulated;

bool cpu_runs(Isa isa) { return ulysses::kernels::best_supported_isa() >= isa; }

// ---- the engines and their documented packed layouts -------------------------------------
// Each names its operand type, how head_dim is padded in the images, and the byte of
// element (key j, channel e) in the pack_bt and pack_b images (dp: the padded head_dim).

struct RowsF32 {  // both images dense rows [n][d]
  using Elem = float;
  static constexpr i64 kPadD = 1;
  static i64 bt_byte(i64 j, i64 e, i64 dp) { return (j * dp + e) * 4; }
  static i64 b_byte(i64 j, i64 e, i64 dp) { return (j * dp + e) * 4; }
};

// The register-blocked engines (simd_engine.hpp, engine_bf16_avx512.cpp): blocks of kRows
// rows; scores computed kScoreCols keys at a time; pt_b skips rows in steps of kRowStep.
template <i64 Cols, i64 RowStep>
struct Blocked {
  static constexpr i64 kRows = 6, kScoreCols = Cols, kRowStep = RowStep;
};

template <i64 NR>  // pack_bt: panels of NR keys, each [d][NR]; pack_b: dense rows
struct PanelsF32 : RowsF32, Blocked<NR, 1> {
  static i64 bt_byte(i64 j, i64 e, i64 dp) { return ((j / NR) * NR * dp + e * NR + j % NR) * 4; }
};

struct PairsBf16 : Blocked<16, 2> {
  using Elem = bf16;
  static constexpr i64 kPadD = 16;
  // pack_bt: panels of 64 keys [dp/2 pairs][64 keys] of (K[j][2t], K[j][2t + 1]).
  static i64 bt_byte(i64 j, i64 e, i64 dp) {
    return 4 * ((j / 64) * 64 * (dp / 2) + (e / 2) * 64 + j % 64) + 2 * (e % 2);
  }
  // pack_b: [key pairs][dp] of (V[2q][c], V[2q + 1][c]).
  static i64 b_byte(i64 j, i64 e, i64 dp) { return 4 * ((j / 2) * dp + e) + 2 * (j % 2); }
};

struct AmxTiles {
  using Elem = bf16;
  static constexpr i64 kPadD = 32;
  static i64 bt_byte(i64 j, i64 e, i64 dp) {
    return (j / 16) * 32 * dp + (e / 32) * 1024 + (e % 32 / 2) * 64 + (j % 16) * 4 + (e % 2) * 2;
  }
  static i64 b_byte(i64 j, i64 e, i64 dp) {
    return (j / 32) * 64 * dp + (e / 16) * 1024 + (j % 32 / 2) * 64 + (e % 16) * 4 + (j % 2) * 2;
  }
};

#define ULYSSES_ENGINE(Type, Layout, test_name, engine_name, object, runs) \
  struct Type : Layout {                                                   \
    static constexpr const char* kTestName = test_name;                    \
    static constexpr const char* kEngineName = engine_name;                \
    static const GemmEngine& engine() { return object; }                   \
    static bool available() { return runs; }                               \
  }

ULYSSES_ENGINE(PortableF32, RowsF32, "portable_f32", "blas-f32", native::blas_f32, true);
ULYSSES_ENGINE(Avx2F32, PanelsF32<16>, "avx2_f32", "avx2-f32", native::avx2_f32, cpu_runs(Isa::avx2));
ULYSSES_ENGINE(Avx512F32, PanelsF32<64>, "avx512_f32", "avx512-f32", native::avx512_f32, cpu_runs(Isa::avx512));
ULYSSES_ENGINE(EmulatedAvx512F32, PanelsF32<64>, "emulated_avx512_f32", "avx512-f32", emulated::avx512_f32, true);
ULYSSES_ENGINE(Avx512Bf16, PairsBf16, "avx512_bf16", "avx512bf16-bf16", native::avx512_bf16,
               ulysses::kernels::cpu_has_avx512_bf16());
ULYSSES_ENGINE(EmulatedAvx512Bf16, PairsBf16, "emulated_avx512_bf16", "avx512bf16-bf16", emulated::avx512_bf16, true);
ULYSSES_ENGINE(AmxBf16, AmxTiles, "amx_bf16", "amx-bf16", native::amx_bf16, cpu_runs(Isa::amx));
ULYSSES_ENGINE(EmulatedAmxBf16, AmxTiles, "emulated_amx_bf16", "amx-bf16", emulated::amx_bf16, true);
#undef ULYSSES_ENGINE

// Test names end in the engine's name (…/emulated_amx_bf16.Scores): ctest runs one engine a test.
struct EngineNames {
  template <class E>
  static std::string GetName(int) {
    return E::kTestName;
  }
};

// An engine the CPU cannot run is skipped, by name, never failed.
template <class E>
class EngineTest : public ::testing::Test {
 protected:
  using T = typename E::Elem;
  void SetUp() override {
    if (!E::available()) GTEST_SKIP() << "this CPU cannot run " << E::kTestName;
  }
  static const GemmEngine& engine() { return E::engine(); }
  // The pack_bt (pack_b) image of rows [n][d] (stride ld), packed over garbage so that
  // unwritten padding shows.
  static std::vector<std::uint8_t> packed_bt(const std::vector<T>& rows, i64 ld, i64 n, i64 d) {
    std::vector<std::uint8_t> image(engine().packed_bytes(n, d), 0xab);
    engine().pack_bt(rows.data(), ld, n, d, image.data());
    return image;
  }
  static std::vector<std::uint8_t> packed_b(const std::vector<T>& rows, i64 ld, i64 n, i64 d) {
    std::vector<std::uint8_t> image(engine().packed_bytes(n, d), 0xab);
    engine().pack_b(rows.data(), ld, n, d, image.data());
    return image;
  }
};

template <class E>
class GemmEngineTest : public EngineTest<E> {};
using AllEngines = ::testing::Types<PortableF32, Avx2F32, Avx512F32, EmulatedAvx512F32, Avx512Bf16, EmulatedAvx512Bf16,
                                    AmxBf16, EmulatedAmxBf16>;
TYPED_TEST_SUITE(GemmEngineTest, AllEngines, EngineNames);

// The shapes of the op tests: rows m, keys n (or k), head dims d, diagonals.
const i64 kMs[] = {1, 5, 16, 33, 64};
const i64 kNs[] = {1, 31, 32, 64, 100, 256};
const i64 kDs[] = {8, 16, 24, 40, 64, 128};
const i64 kDiags[] = {kNoDiagonal, 0, -5, 17};

template <class T>
T image_elem(const std::vector<std::uint8_t>& img, i64 byte) {
  T v;
  std::memcpy(&v, img.data() + byte, sizeof v);
  return v;
}

// ---- packing ----------------------------------------------------------------------------

TYPED_TEST(GemmEngineTest, NameAndDtype) {
  EXPECT_STREQ(this->engine().name, TypeParam::kEngineName);
  EXPECT_EQ(this->engine().dtype, sizeof(typename TypeParam::Elem) == 2 ? ulysses::DType::bf16 : ulysses::DType::f32);
}

TYPED_TEST(GemmEngineTest, PackedSizesAndOffsets) {
  const i64 bytes = sizeof(typename TypeParam::Elem);
  for (i64 d : {1, 8, 15, 16, 24, 32, 33, 40, 64, 100, 128, 256}) {
    const i64 dp = round_up(d, TypeParam::kPadD);
    for (i64 n : {1, 31, 32, 33, 64, 65, 100, 256, 1000})
      EXPECT_EQ(this->engine().packed_bytes(n, d), round_up(n, kKeyAlign) * dp * bytes);
    for (i64 j0 : {i64(0), kKeyAlign, 2 * kKeyAlign, 15 * kKeyAlign})
      EXPECT_EQ(this->engine().packed_offset(j0, d), j0 * dp * bytes);
  }
}

// The documented layouts, element by element, padding included.
TYPED_TEST(GemmEngineTest, PackLayouts) {
  using T = typename TypeParam::Elem;
  Rng rng(1);
  for (i64 d : {1, 7, 8, 16, 24, 33, 40, 64, 128}) {
    for (i64 n : {1, 15, 31, 32, 64, 100, 256}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 ld = d + 3, dp = round_up(d, TypeParam::kPadD), np = round_up(n, kKeyAlign);
      const auto k = rng.matrix<T>(n, d, ld);
      const auto bt = this->packed_bt(k, ld, n, d), b = this->packed_b(k, ld, n, d);
      int bad_bt = 0, bad_b = 0;
      for (i64 j = 0; j < np; ++j) {
        for (i64 e = 0; e < dp; ++e) {
          const T want = j < n && e < d ? k[j * ld + e] : to_elem<T>(0.0f);
          bad_bt += image_elem<T>(bt, TypeParam::bt_byte(j, e, dp)) != want;
          bad_b += image_elem<T>(b, TypeParam::b_byte(j, e, dp)) != want;
        }
      }
      EXPECT_EQ(bad_bt, 0);
      EXPECT_EQ(bad_b, 0);
    }
  }
}

// ---- the three ops --------------------------------------------------------------------------

TYPED_TEST(GemmEngineTest, Scores) {
  using T = typename TypeParam::Elem;
  Rng rng(2);
  const i64 j0 = kKeyAlign;  // the key block starts inside the image: checks packed_offset
  for (i64 d : kDs) {
    for (i64 n : kNs) {
      const i64 n_total = j0 + n + 7, ldk = d + 3;
      const auto k = rng.matrix<T>(n_total, d, ldk);
      const auto bt = this->packed_bt(k, ldk, n_total, d);
      const void* block = bt.data() + this->engine().packed_offset(j0, d);
      for (i64 m : kMs) {
        const i64 lda = d + 5, lds = n + 3;
        const auto a = rng.matrix<T>(m, d, lda);
        const Expected ref = ref_scores(m, n, d, a, lda, k, ldk, j0, lds);
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "n", n, d, diag));
          std::vector<float> s(extent(m, n, lds), sentinel());
          this->engine().scores(m, n, d, a.data(), lda, block, s.data(), lds, diag);
          // Scores at or before the diagonal must be written; past it they may be anything.
          EXPECT_TRUE(ref.compare(s, 1e-5, [&](i64 i, i64 j) { return visible(i, j, diag); }));
        }
      }
    }
  }
}

TYPED_TEST(GemmEngineTest, Pv) {
  using T = typename TypeParam::Elem;
  Rng rng(4);
  const i64 j0 = 2 * kKeyAlign;
  for (i64 d : kDs) {
    for (i64 k : kNs) {
      const i64 n_total = j0 + k + 9, ldv = d + 1, ldp = k + 3, ldo = d + 5;
      const auto v = rng.matrix<T>(n_total, d, ldv);
      const auto img = this->packed_b(v, ldv, n_total, d);
      const void* block = img.data() + this->engine().packed_offset(j0, d);
      for (i64 m : kMs) {
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "k", k, d, diag));
          const auto p = rng.p_matrix(m, k, ldp, diag);
          auto o = rng.c_matrix(m, d, ldo);  // pv accumulates
          const Expected ref = ref_pv(m, d, k, p, ldp, v, ldv, j0, o, ldo);
          this->engine().pv(m, d, k, p.data(), ldp, block, o.data(), ldo, diag);
          EXPECT_TRUE(ref.compare(o, 2e-5, everywhere));
        }
      }
    }
  }
}

TYPED_TEST(GemmEngineTest, PtB) {
  using T = typename TypeParam::Elem;
  Rng rng(6);
  for (i64 d : kDs) {
    for (i64 k : kNs) {
      for (i64 m : kMs) {
        const i64 ldb = d + 5, ldp = k + 3, ldc = d + 1;
        const auto b = rng.matrix<T>(m, d, ldb);
        for (i64 diag : kDiags) {
          SCOPED_TRACE(shape("m", m, "k", k, d, diag));
          const auto p = rng.p_matrix(m, k, ldp, diag);
          auto c = rng.c_matrix(k, d, ldc);  // pt_b accumulates
          const Expected ref = ref_pt_b(k, d, m, p, ldp, b, ldb, c, ldc);
          this->engine().pt_b(k, d, m, p.data(), ldp, b.data(), ldb, c.data(), ldc, diag);
          EXPECT_TRUE(ref.compare(c, 2e-5, everywhere));
        }
      }
    }
  }
}

// ---- rounding of P to the engine's dtype ------------------------------------------------------

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

// pv with V = I: O[i][c] = P[i][c] in the engine's dtype exactly (bf16: to nearest even), and
// the same for pt_b with B = I.
TYPED_TEST(GemmEngineTest, RoundsPToNearestEven) {
  using T = typename TypeParam::Elem;
  Rng rng(8);
  const i64 m = 50, k = 100, d = 100;
  const i64 ldp = k + 1;
  std::vector<float> p(extent(m, k, ldp));
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < k; ++j) p[i * ldp + j] = tricky_value(rng, int(i * k + j) % 16);
  const auto eye = identity<T>(k, d);
  const auto img = this->packed_b(eye, d, k, d);
  std::vector<float> o(m * d, 0.0f);
  this->engine().pv(m, d, k, p.data(), ldp, img.data(), o.data(), d, kNoDiagonal);
  int bad = 0;
  for (i64 i = 0; i < m; ++i)
    for (i64 c = 0; c < d; ++c)
      if (o[i * d + c] != float(rounded<T>(p[i * ldp + c])) && bad++ < 5)
        ADD_FAILURE() << "pv: P[" << i << "][" << c << "] = " << p[i * ldp + c] << " gave " << o[i * d + c];
  EXPECT_EQ(bad, 0);

  // pt_b: C[j][c] = Σ_i P[i][j] · I[i][c] = P[c][j], m = d = 50 query rows.
  const auto eye_m = identity<T>(m, m);
  std::vector<float> c(k * m, 0.0f);
  this->engine().pt_b(k, m, m, p.data(), ldp, eye_m.data(), m, c.data(), m, kNoDiagonal);
  bad = 0;
  for (i64 j = 0; j < k; ++j)
    for (i64 col = 0; col < m; ++col)
      if (c[j * m + col] != float(rounded<T>(p[col * ldp + j])) && bad++ < 5)
        ADD_FAILURE() << "pt_b: P[" << col << "][" << j << "] = " << p[col * ldp + j] << " gave " << c[j * m + col];
  EXPECT_EQ(bad, 0);
}

// The bf16 rounding differs from truncation: ties to even and carries (float32 engines
// return P as it is).
TYPED_TEST(GemmEngineTest, RoundingIsNotTruncation) {
  using T = typename TypeParam::Elem;
  const float cases[][2] = {
      {1.00390625f, 1.0f},               // 1 + 2⁻⁸: a tie, rounds down to even
      {1.01171875f, 1.015625f},          // 1 + 3·2⁻⁸: a tie, rounds up to even
      {1.0078125f - 1e-7f, 1.0078125f},  // just below 1 + 2⁻⁷: rounds up
  };
  const i64 n = 3, d = 16, k = 16;
  std::vector<float> p(n * k, 0.0f);
  for (i64 i = 0; i < n; ++i) p[i * k + i] = cases[i][0];
  const auto eye = identity<T>(k, d);
  const auto img = this->packed_b(eye, d, k, d);
  std::vector<float> o(n * d, 0.0f);
  this->engine().pv(n, d, k, p.data(), k, img.data(), o.data(), d, kNoDiagonal);
  const int rounds = std::is_same_v<T, bf16> ? 1 : 0;
  for (i64 i = 0; i < n; ++i) EXPECT_EQ(o[i * d + i], cases[i][rounds]) << "case " << i;
}

// NaN stays NaN, ±inf stays inf, FLT_MAX rounds up to inf in bf16. One special per row (it
// spreads through its row: inf · 0 is NaN), on the diagonal of an identity V / B.
TYPED_TEST(GemmEngineTest, RoundsSpecialValues) {
  using T = typename TypeParam::Elem;
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
  // Each value at P[i][off + i]: off = 0 goes through a vector rounding, off = 16 through a
  // scalar tail (k = 31 keys); on k = 32, d = 16 keys the AMX tiles take each whole.
  const i64 n = i64(values.size());
  for (auto [off, d, k] : {std::tuple<i64, i64, i64>{0, 32, 31}, {16, 32, 31}, {0, 16, 32}}) {
    SCOPED_TRACE("off=" + std::to_string(off) + " d=" + std::to_string(d) + " k=" + std::to_string(k));
    std::vector<float> p(n * k, 0.5f);
    for (i64 i = 0; i < n; ++i) p[i * k + off + i] = values[i];
    const auto eye = identity<T>(k, d);
    const auto img = this->packed_b(eye, d, k, d);
    std::vector<float> o(n * d, 0.0f);
    this->engine().pv(n, d, k, p.data(), k, img.data(), o.data(), d, kNoDiagonal);
    std::vector<float> c(k * n, 0.0f);  // pt_b with B = I [n][n]: C[j][c] = P[c][j]
    const auto eye_n = identity<T>(n, n);
    this->engine().pt_b(k, n, n, p.data(), k, eye_n.data(), n, c.data(), n, kNoDiagonal);
    for (i64 i = 0; i < n; ++i) {
      const float want = float(rounded<T>(values[i]));
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

// ---- odd sizes, empty shapes, threads ---------------------------------------------------

// Odd inner dimensions (d for scores, k for pv, m for pt_b), odd leading dimensions, head
// dims that are not a multiple of the vector or tile, and key blocks at the end of an image.
TYPED_TEST(GemmEngineTest, OddShapes) {
  using T = typename TypeParam::Elem;
  Rng rng(9);
  for (i64 d : {1, 3, 17, 33, 100, 256}) {
    for (i64 n : {7, 47, 200}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " n=" + std::to_string(n));
      const i64 m = 37, ld = d + 2, lds = n + 1;
      const auto kv = rng.matrix<T>(n, d, ld), a = rng.matrix<T>(m, d, ld);
      const auto bt = this->packed_bt(kv, ld, n, d), b = this->packed_b(kv, ld, n, d);
      for (i64 diag : {kNoDiagonal, i64(-2), i64(9)}) {
        SCOPED_TRACE("diag=" + diag_str(diag));
        std::vector<float> s(extent(m, n, lds), sentinel());
        this->engine().scores(m, n, d, a.data(), ld, bt.data(), s.data(), lds, diag);
        EXPECT_TRUE(ref_scores(m, n, d, a, ld, kv, ld, 0, lds).compare(s, 1e-5, [&](i64 i, i64 j) {
          return visible(i, j, diag);
        }));

        const i64 ldp = n + 1, ldo = d + 3;
        const auto p = rng.p_matrix(m, n, ldp, diag);
        auto o = rng.c_matrix(m, d, ldo);
        const Expected ro = ref_pv(m, d, n, p, ldp, kv, ld, 0, o, ldo);
        this->engine().pv(m, d, n, p.data(), ldp, b.data(), o.data(), ldo, diag);
        EXPECT_TRUE(ro.compare(o, 2e-5, everywhere));

        auto c = rng.c_matrix(n, d, ldo);
        const Expected rc = ref_pt_b(n, d, m, p, ldp, a, ld, c, ldo);
        this->engine().pt_b(n, d, m, p.data(), ldp, a.data(), ld, c.data(), ldo, diag);
        EXPECT_TRUE(rc.compare(c, 2e-5, everywhere));
      }
    }
  }
}

// Empty shapes do nothing; d = 0 scores are 0.
TYPED_TEST(GemmEngineTest, EmptyShapes) {
  using T = typename TypeParam::Elem;
  std::vector<float> s(4 * 5, sentinel());
  const T dummy[1] = {};
  this->engine().scores(4, 5, 0, dummy, 0, dummy, s.data(), 5, kNoDiagonal);
  for (float x : s) EXPECT_EQ(x, 0.0f);
  std::vector<float> c(4, 1.0f);
  this->engine().pv(0, 4, 8, nullptr, 8, nullptr, c.data(), 4, kNoDiagonal);
  this->engine().pt_b(4, 4, 0, nullptr, 8, nullptr, 4, c.data(), 4, kNoDiagonal);
  const std::vector<float> p(3, 0.5f);
  this->engine().pt_b(1, 4, 3, p.data(), 1, dummy, 0, c.data(), 4, -5);  // every row before the diagonal
  for (float x : c) EXPECT_EQ(x, 1.0f);
}

// Any scratch is per thread: concurrent calls of different shapes give the serial results.
TYPED_TEST(GemmEngineTest, ThreadsUseTheirOwnScratch) {
  using T = typename TypeParam::Elem;
  Rng rng(10);
  const i64 d = 40, k = 100;
  const i64 ms[] = {5, 33, 64, 17};
  std::vector<std::vector<float>> p, want, got;
  std::vector<std::vector<T>> b;
  for (i64 m : ms) {
    p.push_back(rng.p_matrix(m, k, k, kNoDiagonal));
    b.push_back(rng.matrix<T>(m, d, d));
    want.emplace_back(k * d, 0.0f);
    this->engine().pt_b(k, d, m, p.back().data(), k, b.back().data(), d, want.back().data(), d, kNoDiagonal);
  }
  got.assign(4, {});
  std::vector<int> differing(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<float> c(k * d, 0.0f);
        this->engine().pt_b(k, d, ms[t], p[t].data(), k, b[t].data(), d, c.data(), d, kNoDiagonal);
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

// ---- white box: what a register block skips past a causal diagonal ----------------------

template <class E>
class BlockedEngineTest : public EngineTest<E> {};
using BlockedEngines = ::testing::Types<Avx2F32, Avx512F32, EmulatedAvx512F32, Avx512Bf16, EmulatedAvx512Bf16>;
TYPED_TEST_SUITE(BlockedEngineTest, BlockedEngines, EngineNames);

i64 clamp(i64 x, i64 lo, i64 hi) { return x < lo ? lo : x > hi ? hi : x; }

// A block of kRows rows computes the kScoreCols-key groups its last row sees, no more; the
// scores past them stay unwritten.
TYPED_TEST(BlockedEngineTest, ScoresSkipVectorsPastTheDiagonal) {
  using T = typename TypeParam::Elem;
  constexpr i64 kMR = TypeParam::kRows, kW = TypeParam::kScoreCols;
  Rng rng(3);
  const i64 m = 64, n = 256, d = 64;
  const auto k = rng.matrix<T>(n, d, d), a = rng.matrix<T>(m, d, d);
  const auto bt = this->packed_bt(k, d, n, d);
  for (i64 diag : {i64(0), i64(40), i64(-20), i64(200)}) {
    std::vector<float> s(m * n, sentinel());
    this->engine().scores(m, n, d, a.data(), d, bt.data(), s.data(), n, diag);
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

// A block of kRows rows reads P only up to its last row's diagonal (NaN past it would
// otherwise poison the sums).
TYPED_TEST(BlockedEngineTest, PvReadsNoPPastTheBlockDiagonal) {
  using T = typename TypeParam::Elem;
  constexpr i64 kMR = TypeParam::kRows;
  Rng rng(5);
  const i64 m = 64, k = 256, d = 40, ldp = k + 1;
  const auto v = rng.matrix<T>(k, d, d);
  const auto img = this->packed_b(v, d, k, d);
  for (i64 diag : {i64(0), i64(-3), i64(31)}) {
    SCOPED_TRACE("diag=" + std::to_string(diag));
    auto p = rng.p_matrix(m, k, ldp, diag);
    for (i64 i = 0; i < m; ++i)
      for (i64 j = std::max<i64>(0, diag + i / kMR * kMR + kMR); j < k; ++j)
        p[i * ldp + j] = std::numeric_limits<float>::quiet_NaN();
    auto o = rng.c_matrix(m, d, d);
    const Expected ref = ref_pv(m, d, k, p, ldp, v, d, 0, o, d);
    this->engine().pv(m, d, k, p.data(), ldp, img.data(), o.data(), d, diag);
    EXPECT_TRUE(ref.compare(o, 2e-5, everywhere));
  }
}

// For the block of kRows keys at c0, the rows before c0 − diag (rounded down to kRowStep)
// are not multiplied.
TYPED_TEST(BlockedEngineTest, PtBSkipsRowsBeforeTheDiagonal) {
  using T = typename TypeParam::Elem;
  constexpr i64 kMR = TypeParam::kRows, kStep = TypeParam::kRowStep;
  Rng rng(7);
  const i64 m = 64, k = 256, d = 24, ldp = k + 2;
  const auto b = rng.matrix<T>(m, d, d);
  for (i64 diag : {i64(0), i64(-3), i64(7)}) {
    SCOPED_TRACE("diag=" + std::to_string(diag));
    auto p = rng.p_matrix(m, k, ldp, diag);
    for (i64 j = 0; j < k; ++j) {
      const i64 skipped = clamp(j / kMR * kMR - diag, 0, m) / kStep * kStep;
      for (i64 i = 0; i < skipped; ++i) p[i * ldp + j] = std::numeric_limits<float>::quiet_NaN();
    }
    auto c = rng.c_matrix(k, d, d);
    const Expected ref = ref_pt_b(k, d, m, p, ldp, b, d, c, d);
    this->engine().pt_b(k, d, m, p.data(), ldp, b.data(), d, c.data(), d, diag);
    EXPECT_TRUE(ref.compare(c, 2e-5, everywhere));
  }
}

// ---- white box: the AMX tiles skipped past a causal diagonal, counted by the tile model ---

template <class E>
class AmxTileTest : public EngineTest<E> {
 protected:
  static i64 dp_count() { return amx_emu::state().dp_count; }
};
TYPED_TEST_SUITE(AmxTileTest, ::testing::Types<EmulatedAmxBf16>, EngineNames);

// A whole 16 × 16 tile past the diagonal is not multiplied.
TYPED_TEST(AmxTileTest, ScoresSkipTilesPastTheDiagonal) {
  Rng rng(3);
  const i64 m = 64, n = 256, d = 64;
  const auto k = rng.matrix<bf16>(n, d, d), a = rng.matrix<bf16>(m, d, d);
  const auto bt = this->packed_bt(k, d, n, d);
  std::vector<float> s(m * n);
  for (i64 diag : {kNoDiagonal, i64(0), i64(40), i64(-20)}) {
    i64 tiles = 0;
    for (i64 r = 0; r < m / 16; ++r)
      for (i64 t = 0; t < n / 16; ++t) tiles += 16 * t <= diag + 16 * r + 15;
    const i64 before = this->dp_count();
    this->engine().scores(m, n, d, a.data(), d, bt.data(), s.data(), n, diag);
    EXPECT_EQ(this->dp_count() - before, tiles * (d / 32)) << "diag=" << diag_str(diag);
  }
}

TYPED_TEST(AmxTileTest, PvSkipsKeysPastTheDiagonal) {
  Rng rng(5);
  const i64 m = 64, k = 256, d = 64;
  const auto v = rng.matrix<bf16>(k, d, d);
  const auto img = this->packed_b(v, d, k, d);
  std::vector<float> o(m * d, 0.0f);
  const auto p_full = rng.p_matrix(m, k, k, kNoDiagonal), p_causal = rng.p_matrix(m, k, k, 0);
  i64 before = this->dp_count();
  this->engine().pv(m, d, k, p_full.data(), k, img.data(), o.data(), d, kNoDiagonal);
  const i64 full = this->dp_count() - before;
  before = this->dp_count();
  this->engine().pv(m, d, k, p_causal.data(), k, img.data(), o.data(), d, 0);
  const i64 causal = this->dp_count() - before;
  EXPECT_EQ(full, (m / 16) * (d / 16) * (k / 32));
  // Rows 0..31 need key chunk 0, rows 32..63 chunks 0..1.
  EXPECT_EQ(causal, 2 * (d / 16) * 1 + 2 * (d / 16) * 2);
}

TYPED_TEST(AmxTileTest, PtBSkipsRowsBeforeTheDiagonal) {
  Rng rng(7);
  const i64 m = 64, k = 256, d = 64;
  const auto b = rng.matrix<bf16>(m, d, d);
  std::vector<float> c(k * d, 0.0f);
  const auto p = rng.p_matrix(m, k, k, 0);
  const i64 before = this->dp_count();
  this->engine().pt_b(k, d, m, p.data(), k, b.data(), d, c.data(), d, 0);
  // Keys 0..31 take row chunks 0..1, keys 32..63 chunk 1, later keys none.
  EXPECT_EQ(this->dp_count() - before, 4 * (d / 32) * 2 + 4 * (d / 32) * 1);
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

template <class E>
class AmxEmulationDeathTest : public EngineTest<E> {};
TYPED_TEST_SUITE(AmxEmulationDeathTest, ::testing::Types<EmulatedAmxBf16>, EngineNames);

TYPED_TEST(AmxEmulationDeathTest, FailsLoudlyOnMisuse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(amx_model::use_before_config(), "before _tile_loadconfig");
  EXPECT_DEATH(amx_model::mismatched_shapes(), "rows of A differ");
}

}  // namespace
