// Local kernels against independent references: the vector exp against std::exp, bf16
// rounding against hand-computed values, flash attention against the float64 oracle.
#include <cblas.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/blas_core.hpp"
#include "kernels/engines.hpp"
#include "kernels/flash_common.hpp"
#include "kernels/isa.hpp"
#include "kernels/peak.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/bf16.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "test_util.hpp"

using namespace ulysses;

namespace {

std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<std::int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<std::int32_t>::min() - ib;
  return std::llabs(std::int64_t(ia) - std::int64_t(ib));
}

// Every kernel level this test binary can run: the native ones the CPU supports, then the
// AVX-512 and AMX sources compiled without ISA flags (tests/emulation) so their code is
// checked on any CPU.
std::vector<const kernels::KernelLevel*> all_levels() {
  static const kernels::KernelLevel emulated_avx512{"emulated-avx512", &kernels::emulated::avx512_f32, nullptr,
                                                    kernels::emulated::avx512_vec};
  static const kernels::KernelLevel emulated_amx{"emulated-amx", &kernels::emulated::avx512_f32,
                                                 &kernels::emulated::amx_bf16, kernels::emulated::avx512_vec};
  static const kernels::KernelLevel emulated_avx512bf16{"emulated-avx512bf16", &kernels::emulated::avx512_f32,
                                                        &kernels::emulated::avx512_bf16, kernels::emulated::avx512_vec};
  std::vector<const kernels::KernelLevel*> v;
  for (kernels::Isa isa : kernels::supported_isas()) v.push_back(&kernels::level(isa));
  if (kernels::best_supported_isa() < kernels::Isa::avx512) v.push_back(&emulated_avx512);
  if (kernels::best_supported_isa() < kernels::Isa::avx512 || !kernels::level(kernels::Isa::avx512).bf16)
    v.push_back(&emulated_avx512bf16);
  if (kernels::best_supported_isa() < kernels::Isa::amx) v.push_back(&emulated_amx);
  return v;
}

std::vector<std::string> level_names() {
  std::vector<std::string> v;
  for (const auto* l : all_levels()) v.push_back(l->name);
  return v;
}

const kernels::KernelLevel& level_named(const std::string& name) {
  for (const auto* l : all_levels())
    if (name == l->name) return *l;
  throw Error("no level " + name);
}

class VexpTest : public ::testing::TestWithParam<std::string> {
 protected:
  const kernels::VectorOps& vec() const { return level_named(GetParam()).vec; }
};

TEST_P(VexpTest, WithinTwoUlpOfStdExp) {
  std::vector<float> x;  // the softmax's range: arguments <= 0
  for (float v = -87.0f; v <= 0.0f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, -1e-8f, -0.5f, -1.0f, -86.9f}) x.push_back(v);
  std::vector<float> out(x.size());
  vec().exp_shifted_sum(x.data(), out.data(), std::int64_t(x.size()), 1.0f, 0.0f);
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulp_distance(out[i], std::exp(x[i])));
  EXPECT_LE(worst, 2);
  EXPECT_EQ(out[x.size() - 6], 1.0f);  // exp(0) is exactly 1
  // The returned sum, on the softmax's range (x - max <= 0).
  std::vector<float> y;
  for (float v = -20.0f; v <= 0.0f; v += 0.01f) y.push_back(v);
  std::vector<float> e(y.size());
  const float s = vec().exp_shifted_sum(y.data(), e.data(), std::int64_t(y.size()), 1.0f, 0.0f);
  double ref = 0;
  for (float v : y) ref += std::exp(double(v));
  EXPECT_NEAR(s, ref, 1e-5 * ref);
}

TEST_P(VexpTest, MaskedAndTinyInputsGiveExactZero) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -1e30f, -87.5f, -100.0f, -inf, -inf, -inf, -inf, -inf, 0.0f};
  std::vector<float> out(x.size(), 123.0f);
  const float sum = vec().exp_shifted_sum(x.data(), out.data(), std::int64_t(x.size()), 1.0f, 0.0f);
  for (std::size_t i = 0; i + 1 < x.size(); ++i) EXPECT_EQ(out[i], 0.0f) << "x = " << x[i];
  EXPECT_EQ(out.back(), 1.0f);
  EXPECT_EQ(sum, 1.0f);
  // The shift is subtracted: exp(x - m) with x = m is exactly 1.
  float y = 3.5f, e = 0;
  vec().exp_shifted_sum(&y, &e, 1, 1.0f, 3.5f);
  EXPECT_EQ(e, 1.0f);
}

TEST_P(VexpTest, RowMaxEqualsStdMaxElement) {
  std::vector<float> x(37);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 1.7f) * 10.0f;
  for (std::int64_t n : {0, 1, 7, 8, 9, 16, 37}) {
    const float init = -std::numeric_limits<float>::infinity();
    const float expect = n == 0 ? init : *std::max_element(x.begin(), x.begin() + n);
    EXPECT_EQ(vec().row_max(x.data(), n, init, 1.0f), expect) << n;
  }
  EXPECT_EQ(vec().row_max(x.data(), 37, 100.0f, 1.0f), 100.0f);  // the running max carries over
  // The softmax scale is applied before the max, whatever its sign.
  for (float scale : {0.125f, -0.5f})
    for (std::int64_t n : {1, 9, 37}) {
      float expect = -std::numeric_limits<float>::infinity();
      for (std::int64_t i = 0; i < n; ++i) expect = std::max(expect, x[std::size_t(i)] * scale);
      EXPECT_EQ(vec().row_max(x.data(), n, -std::numeric_limits<float>::infinity(), scale), expect);
    }
}

// Above the shift the argument is clamped at 0: exp never overflows, whatever the magnitudes
// (scores of 1e30, a shift rounded below them), and the row max gives exactly 1.
TEST_P(VexpTest, ArgumentAboveTheShiftGivesOneNeverOverflows) {
  const float big = std::numeric_limits<float>::max();
  std::vector<float> x = {1.0f,  88.0f, 1e4f,  1e30f, big,  std::numeric_limits<float>::infinity(),
                          0.0f,  -1.0f, 2.0f,  3.0f,  5.0f, 7.0f,
                          11.0f, 13.0f, 17.0f, 19.0f, 23.0f};
  std::vector<float> out(x.size(), -1.0f);
  const float sum = vec().exp_shifted_sum(x.data(), out.data(), std::int64_t(x.size()), 1.0f, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i] >= 0)
      EXPECT_EQ(out[i], 1.0f) << x[i];
    else
      EXPECT_LE(ulp_distance(out[i], std::exp(x[i])), 2) << x[i];
  EXPECT_NEAR(sum, float(x.size() - 1) + std::exp(-1.0f), 1e-5f);
  // scale·x rounded as row_max rounds it: at 4.4e9 (ulp 512) the max's argument is exactly 0,
  // where the fused product minus the rounded max could be +256 (exp = inf).
  const float q = 3e4f, scale = 1.0f / std::sqrt(24.0f);
  std::vector<float> s = {24 * q * q, 23 * q * q, 24 * q * q + 1e3f, -24 * q * q, 24 * q * q - 1e3f};
  for (std::size_t n : {std::size_t(1), s.size()}) {
    std::vector<float> p(n);
    const float m = vec().row_max(s.data(), std::int64_t(n), -std::numeric_limits<float>::infinity(), scale);
    const float l = vec().exp_shifted_sum(s.data(), p.data(), std::int64_t(n), scale, m);
    EXPECT_GE(l, 1.0f);
    EXPECT_LE(l, float(n));
    for (float e : p) EXPECT_TRUE(e >= 0.0f && e <= 1.0f) << e;
  }
}

TEST_P(VexpTest, ScaleAndShiftFuse) {
  // exp(scale·x − shift) for both signs of the scale and every tail length (arguments <= 0).
  std::vector<float> x(41);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i) * 0.9f) * 30.0f;
  for (float scale : {0.125f, -0.5f})
    for (std::int64_t n : {1, 7, 8, 17, 41}) {
      const float shift = 40.0f;
      std::vector<float> out(std::size_t(n), -1.0f);
      const float sum = vec().exp_shifted_sum(x.data(), out.data(), n, scale, shift);
      double ref_sum = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double arg = double(x[std::size_t(i)]) * scale - shift, ref = std::exp(arg);
        ref_sum += ref;
        // scale·x is rounded to float, then the argument (half an ulp of each becomes that much
        // relative error in exp), then the exp's own 2 ulp.
        const double err = (std::abs(arg) + std::abs(double(x[std::size_t(i)]) * scale)) * 6e-8 + 3e-7;
        EXPECT_NEAR(out[std::size_t(i)], ref, err * ref) << "scale " << scale << " i " << i;
      }
      EXPECT_NEAR(sum, ref_sum, 5e-6 * ref_sum) << "scale " << scale << " n " << n;
    }
}

// dS = (scale·P)·(dP − D), each product rounded in that order, for every tail length.
TEST_P(VexpTest, SoftmaxGradIsTheRoundedProducts) {
  for (std::int64_t n : {1, 7, 16, 17, 41}) {
    const auto size = static_cast<std::size_t>(n);
    std::vector<float> p(size), dp(size), want(size);
    const float scale = 0.125f, delta = 0.3f;
    for (std::size_t i = 0; i < size; ++i) {
      p[i] = std::sin(float(i) * 1.3f) * 0.5f + 0.5f;
      dp[i] = std::cos(float(i) * 0.7f) * 3.0f;
      const volatile float sp = scale * p[i];  // volatile: no fused multiply-add in the reference
      want[i] = sp * (dp[i] - delta);
    }
    vec().softmax_grad(p.data(), dp.data(), n, scale, delta);
    for (std::size_t i = 0; i < size; ++i) EXPECT_EQ(dp[i], want[i]) << "n " << n << " i " << i;
  }
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Level, VexpTest, ::testing::ValuesIn(level_names()), param_name);

// bf16 inputs run on the dot product only where it outruns the FMA (isa.hpp), and the unit the
// MFU and the trainer's GEMMs go by is the one the level's kernels use.
TEST(Isa, Bf16RunsOnTheFasterUnit) {
  const kernels::Isa before = kernels::active_isa();
  if (kernels::bf16_dot_outruns_fma()) EXPECT_TRUE(kernels::cpu_has_avx512_bf16());
  if (kernels::best_supported_isa() >= kernels::Isa::avx512)
    EXPECT_EQ(kernels::level(kernels::Isa::avx512).bf16 != nullptr, kernels::bf16_dot_outruns_fma());
  for (kernels::Isa isa : kernels::supported_isas()) {
    kernels::force_isa(isa);
    const bool dot = kernels::compute_unit(DType::bf16) == kernels::PeakUnit::bf16_dot;
    EXPECT_EQ(dot, kernels::level(isa).bf16 != nullptr) << kernels::to_string(isa);
    EXPECT_EQ(kernel_engine(DType::bf16).find("converted") == std::string::npos, dot) << kernel_engine(DType::bf16);
    EXPECT_EQ(kernels::compute_unit(DType::f32), kernels::PeakUnit::f32_fma);
  }
  kernels::force_isa(before);
}

TEST(Isa, DispatchFollowsForceAndNamesTheLevel) {
  const kernels::Isa before = kernels::active_isa();
  for (kernels::Isa isa : kernels::supported_isas()) {
    EXPECT_EQ(kernels::force_isa(isa), isa);
    EXPECT_STREQ(kernel_isa(), kernels::to_string(isa));
    EXPECT_EQ(kernel_engine(DType::f32), std::string(kernels::level(isa).f32->name));
  }
  // A level above the CPU's is clamped to the best it has.
  EXPECT_EQ(kernels::force_isa(kernels::Isa::amx), kernels::best_supported_isa());
  kernels::Isa parsed;
  EXPECT_TRUE(kernels::parse_isa("avx512", &parsed));
  EXPECT_EQ(parsed, kernels::Isa::avx512);
  EXPECT_FALSE(kernels::parse_isa("sse9", &parsed));
  kernels::force_isa(kernels::Isa::portable);
  EXPECT_EQ(kernel_engine(DType::bf16), "blas-f32 (bf16 converted)");
  kernels::force_isa(before);
}

// OpenBLAS's core can be re-selected inside the process (how blas_core.cpp corrects, at load,
// a core chosen by an OpenBLAS that does not know the CPU), and each core the CPU runs computes
// the same product: integers small enough that every sum is exact in float32.
TEST(Isa, OpenBlasCoreIsReselectedAndEveryCoreComputesTheSameProduct) {
  const std::string original = openblas_get_corename();
  EXPECT_EQ(blas_core().rfind(original, 0), 0u) << blas_core();  // the core in use leads the description
  const int m = 67, n = 45, k = 53;
  std::vector<float> a(m * k), b(k * n);
  for (int i = 0; i < m * k; ++i) a[i] = float((i * 7) % 13 - 6);
  for (int i = 0; i < k * n; ++i) b[i] = float((i * 5) % 11 - 5);
  std::vector<float> want(m * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) want[i * n + j] += a[i * k + p] * b[p * n + j];
  std::vector<const char*> cores = {"Prescott"};
  if (kernels::best_supported_isa() >= kernels::Isa::avx2) cores.push_back("Haswell");
  if (kernels::best_supported_isa() >= kernels::Isa::avx512) cores.push_back("SkylakeX");
  cores.push_back(original.c_str());
  for (const char* core : cores) {
    EXPECT_STRCASEEQ(kernels::reselect_blas_core(core).c_str(), core);
    std::vector<float> c(m * n, -1.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    EXPECT_EQ(c, want) << "core " << core;
  }
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);  // child processes choose for themselves
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly half-way between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3·2^-8 is half-way between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
}

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

struct FlashCase {
  std::int64_t b, sq, sk, h, hkv, d;
  bool causal;
  std::int64_t q_offset = 0, k_offset = 0;
  int threads = 2;
  std::vector<std::int64_t> cu_seqlens = {};         // packed documents over global positions
  std::int64_t window_left = -1, window_right = -1;  // sliding window over global positions
};

std::string plus_one(std::int64_t w) {
  return w == std::numeric_limits<std::int64_t>::max() ? "max" : std::to_string(w + 1);
}

std::string name_of(const FlashCase& c) {
  return "b" + std::to_string(c.b) + "_sq" + std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_h" +
         std::to_string(c.h) + "_kv" + std::to_string(c.hkv) + "_d" + std::to_string(c.d) +
         (c.causal ? "_causal" : "_full") + "_qo" + std::to_string(c.q_offset) + "_ko" + std::to_string(c.k_offset) +
         "_t" + std::to_string(c.threads) +
         (c.cu_seqlens.empty() ? "" : "_docs" + std::to_string(c.cu_seqlens.size() - 1)) +
         (c.window_left < 0 && c.window_right < 0 ? ""
                                                  : "_win" + plus_one(c.window_left) + "_" + plus_one(c.window_right));
}

class FlashTest : public ::testing::TestWithParam<FlashCase> {};

// Forward and backward of one case on one level, in `dtype`, against the float64 reference of
// the same (dtype-rounded) inputs. Outputs are float32 so the error measured is the kernel's.
void check_level(const FlashCase& c, const kernels::KernelLevel& level, DType dtype) {
  SCOPED_TRACE(std::string(level.name) + " " + to_string(dtype));
  Tensor q({c.b, c.sq, c.h, c.d}, dtype), k({c.b, c.sk, c.hkv, c.d}, dtype), v({c.b, c.sk, c.hkv, c.d}, dtype);
  Tensor dout({c.b, c.sq, c.h, c.d}, dtype);
  fill_uniform(q.view(), 1);
  fill_uniform(k.view(), 2);
  fill_uniform(v.view(), 3);
  fill_uniform(dout.view(), 4);
  const AttentionParams p{c.causal, std::nullopt, c.q_offset, c.k_offset, c.cu_seqlens, c.window_left, c.window_right};
  RefTensor rq = RefTensor::from(q.view()), rk = RefTensor::from(k.view()), rv = RefTensor::from(v.view());
  RefTensor rout, rdq, rdk, rdv;
  std::vector<double> rlse;
  reference_attention_forward(rout, rlse, rq, rk, rv, p);
  reference_attention_backward(rdq, rdk, rdv, RefTensor::from(dout.view()), rq, rk, rv, p);
  Tensor out({c.b, c.sq, c.h, c.d});
  std::vector<float> lse(std::size_t(c.b * c.h * c.sq));
  check_attention_shapes(q.view(), k.view(), v.view(), out.view());
  kernels::flash_forward(level, out.view(), lse.data(), q.view(), k.view(), v.view(), p);
  Tensor dq({c.b, c.sq, c.h, c.d}), dk({c.b, c.sk, c.hkv, c.d}), dv({c.b, c.sk, c.hkv, c.d});
  kernels::flash_backward(level, dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                          lse.data(), p);
  // bf16 engines round P and dS to bf16 (8 significant bits) for their GEMMs.
  const bool bf16_compute = kernels::engine_for(level, dtype) != nullptr && dtype == DType::bf16;
  const double tol_out = bf16_compute ? 1e-2 : 2e-6, tol_grad = bf16_compute ? 2e-2 : 2e-5;
  EXPECT_LT(relative_error(out.view(), rout), tol_out);
  EXPECT_LT(relative_error(dq.view(), rdq), tol_grad);
  EXPECT_LT(relative_error(dk.view(), rdk), tol_grad);
  EXPECT_LT(relative_error(dv.view(), rdv), tol_grad);
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(rlse[i]))
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i;
    else
      EXPECT_NEAR(lse[i], rlse[i], (bf16_compute ? 2e-3 : 2e-5) * std::max(1.0, std::abs(rlse[i]))) << "row " << i;
  }
  for (const Tensor* t : {&out, &dq, &dk, &dv})
    for (std::int64_t i = 0; i < t->shape().numel(); ++i) ASSERT_TRUE(std::isfinite(t->f32()[i]));
}

TEST_P(FlashTest, EveryLevelMatchesFloat64Reference) {
  const FlashCase c = GetParam();
  omp_set_num_threads(c.threads);
  for (const kernels::KernelLevel* level : all_levels()) check_level(c, *level, DType::f32);
}

TEST_P(FlashTest, Bf16InputsOnEveryLevel) {
  const FlashCase c = GetParam();
  omp_set_num_threads(c.threads);
  for (const kernels::KernelLevel* level : all_levels()) check_level(c, *level, DType::bf16);
}

// Finite in, finite out at the largest magnitudes (flash_forward.cpp's bound), on every level,
// forward and backward, against the float64 reference. q = k (self-attention of one tensor), so
// every row's max is its own key by a wide margin and the softmax is one-hot: out = v, and the
// float32 lse (whose rounding exceeds 1 here) is still exact enough for the backward's P.
struct BoundCase {
  const char* name;
  float magnitude;  // q = k elements ±magnitude·(1 − u/8), mixed signs; 0: fill_uniform's [-1, 1)
  std::int64_t d;
  std::optional<float> scale;
  bool within_bound;  // |scale·q·k| < FLT_MAX: compared to the reference; past it only finite
};

Tensor bound_tensor(const Shape& shape, float magnitude, std::uint64_t seed, DType dtype) {
  Tensor t(shape);
  fill_uniform(t.view(), seed);
  if (magnitude > 0)
    for (std::int64_t i = 0; i < shape.numel(); ++i) {
      const float u = t.f32()[i];  // in [-1, 1): its sign and its size
      t.f32()[i] = std::copysign(magnitude * (1.0f - std::abs(u) / 8), u);
    }
  return copy_of(t.view(), dtype);
}

double max_abs(const RefTensor& r) {
  double m = 0;
  for (double x : r.data) m = std::max(m, std::abs(x));
  return m;
}

double max_abs_error(const TensorView& x, const RefTensor& ref) {
  const RefTensor got = RefTensor::from(x);
  double m = 0;
  for (std::size_t i = 0; i < ref.data.size(); ++i) m = std::max(m, std::abs(got.data[i] - ref.data[i]));
  return m;
}

void check_bound(const BoundCase& c, bool causal, const kernels::KernelLevel& level, DType dtype) {
  SCOPED_TRACE(fmt::format("{} {} {} {}", c.name, causal ? "causal" : "full", level.name, to_string(dtype)));
  const std::int64_t s = 70, h = 2;
  const Shape shape{1, s, h, c.d};
  const Tensor q = bound_tensor(shape, c.magnitude, 1, dtype), v = bound_tensor(shape, 0, 3, dtype);
  const Tensor dout = bound_tensor(shape, 0, 4, dtype);
  const AttentionParams p{.causal = causal, .scale = c.scale};
  RefTensor rq = RefTensor::from(q.view()), rv = RefTensor::from(v.view()), rout, rdq, rdk, rdv;
  std::vector<double> rlse;
  reference_attention_forward(rout, rlse, rq, rq, rv, p);
  reference_attention_backward(rdq, rdk, rdv, RefTensor::from(dout.view()), rq, rq, rv, p);
  Tensor out(shape), dq(shape), dk(shape), dv(shape);
  std::vector<float> lse(std::size_t(h * s));
  kernels::flash_forward(level, out.view(), lse.data(), q.view(), q.view(), v.view(), p);
  kernels::flash_backward(level, dq.view(), dk.view(), dv.view(), dout.view(), q.view(), q.view(), v.view(), out.view(),
                          lse.data(), p);
  for (const Tensor* t : {&out, &dq, &dk, &dv})
    for (std::int64_t i = 0; i < t->shape().numel(); ++i) ASSERT_TRUE(std::isfinite(t->f32()[i])) << i;
  for (float x : lse) ASSERT_TRUE(std::isfinite(x));
  if (!c.within_bound) return;  // finite is all that is promised past it
  const bool bf16_compute = kernels::engine_for(level, dtype) != nullptr && dtype == DType::bf16;
  EXPECT_LT(relative_error(out.view(), rout), bf16_compute ? 1e-2 : 2e-6);
  EXPECT_LT(relative_error(dv.view(), rdv), bf16_compute ? 2e-2 : 2e-5);
  // dQ and dK are 0 in exact arithmetic (dS = scale·P∘(dP − D) with dP = D on the one key seen);
  // in float32 they are the rounding of dP − D, amplified by the scale and by |k|.
  const double scale = c.scale.value_or(1.0f / std::sqrt(float(c.d)));
  const double grad_bound = scale * max_abs(RefTensor::from(dout.view())) * max_abs(rv) * max_abs(rq) * double(c.d) *
                            (bf16_compute ? 3e-2 : 3e-5);
  EXPECT_LE(max_abs_error(dq.view(), rdq), grad_bound);
  EXPECT_LE(max_abs_error(dk.view(), rdk), grad_bound);
  for (std::size_t i = 0; i < lse.size(); ++i)
    EXPECT_NEAR(lse[i], rlse[i], (bf16_compute ? 2e-3 : 2e-5) * std::abs(rlse[i])) << "row " << i;
}

TEST(FlashBound, LargestFiniteMagnitudesStayFiniteAndMatchFloat64OnEveryLevel) {
  omp_set_num_threads(2);
  const BoundCase cases[] = {
      {"q,k ~3e4 d24", 3e4f, 24, std::nullopt, true},     // scaled scores ~3.5e9: ulp 256
      {"scale 2e8 d64", 0.0f, 64, 2e8f, true},            // ~4e9
      {"near FLT_MAX", 2.3e18f, 24, 1.0f, true},          // ~1e38
      {"scaled past FLT_MAX", 2.3e18f, 24, 8.0f, false},  // scaled scores overflow to +inf
  };
  for (const BoundCase& c : cases)
    for (bool causal : {false, true})
      for (const kernels::KernelLevel* level : all_levels())
        for (DType dtype : {DType::f32, DType::bf16}) check_bound(c, causal, *level, dtype);
}

// bf16 outputs are the float32 results rounded once (the public entry points, active level).
TEST(Flash, Bf16OutputsAreRoundedFloat32Outputs) {
  const std::int64_t b = 1, s = 70, h = 2, d = 16;
  Tensor q({b, s, h, d}, DType::bf16), k({b, s, h, d}, DType::bf16), v({b, s, h, d}, DType::bf16);
  fill_uniform(q.view(), 5);
  fill_uniform(k.view(), 6);
  fill_uniform(v.view(), 7);
  Tensor o32({b, s, h, d}), o16({b, s, h, d}, DType::bf16);
  const Tensor l32 = lse_tensor(q.shape()), l16 = lse_tensor(q.shape());
  flash_attention_forward(o32.view(), l32.view(), q.view(), k.view(), v.view(), {true});
  flash_attention_forward(o16.view(), l16.view(), q.view(), k.view(), v.view(), {true});
  EXPECT_EQ(0, std::memcmp(l32.data(), l16.data(), l32.nbytes()));
  const auto* h16 = static_cast<const std::uint16_t*>(o16.data());
  for (std::int64_t i = 0; i < o32.shape().numel(); ++i) ASSERT_EQ(h16[i], float_to_bf16(o32.f32()[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashTest,
    ::testing::Values(FlashCase{1, 1, 1, 1, 1, 8, false}, FlashCase{1, 1, 1, 1, 1, 8, true},
                      FlashCase{2, 67, 67, 2, 2, 8, false}, FlashCase{2, 67, 67, 2, 2, 8, true},
                      FlashCase{1, 130, 130, 4, 1, 16, true},  // MQA, s not a block multiple
                      FlashCase{1, 300, 300, 4, 2, 64, false}, FlashCase{1, 300, 300, 4, 2, 64, true},  // GQA
                      FlashCase{1, 200, 200, 2, 2, 128, true}, FlashCase{1, 200, 200, 2, 2, 128, false},
                      FlashCase{2, 70, 290, 3, 3, 16, false},           // sq != sk
                      FlashCase{1, 64, 128, 2, 1, 16, true, 64, 0},     // query chunk after the keys
                      FlashCase{1, 64, 96, 2, 2, 16, true, 0, 32},      // first 32 rows see no key
                      FlashCase{1, 64, 64, 2, 2, 16, true, 0, 1000},    // no row sees any key
                      FlashCase{3, 150, 150, 4, 2, 16, true, 0, 0, 1},  // one thread
                      FlashCase{8, 100, 100, 2, 2, 16, true, 0, 0, 2},  // many pairs: direct dQ path
                      FlashCase{1, 77, 300, 2, 2, 24, true, 230, 0},    // d = 24: micro-kernel column tail
                      FlashCase{2, 13, 40, 3, 1, 32, false, 0, 0, 1},   // rows not a multiple of 6
                      FlashCase{1, 100, 100, 2, 1, 40, true, 0, 0, 1},  // d = 40: AVX-512 block + vector tail
                      FlashCase{1, 33, 70, 1, 1, 200, false, 0, 0, 1},  // d = 200: several column blocks
                      // Packed documents: lengths 1, 1, 5, 57, an empty one, 136 and 100 (several per block).
                      FlashCase{1, 300, 300, 4, 2, 16, true, 0, 0, 2, {0, 1, 2, 7, 64, 64, 200, 300}},
                      FlashCase{1, 300, 300, 4, 2, 16, false, 0, 0, 2, {0, 1, 2, 7, 64, 64, 200, 300}},
                      // Prime lengths; a document longer than a key tile; tiles before it skipped.
                      FlashCase{1, 620, 620, 2, 1, 64, true, 0, 0, 2, {0, 13, 110, 601, 620}},
                      FlashCase{1, 620, 620, 2, 1, 64, false, 0, 0, 1, {0, 13, 110, 601, 620}},
                      // A query chunk and a key chunk of a larger sequence (as the ring calls it), bf16 dq path.
                      FlashCase{1, 64, 200, 2, 2, 16, true, 100, 0, 2, {0, 50, 130, 170, 300}},
                      FlashCase{1, 64, 200, 2, 2, 16, false, 200, 50, 2, {0, 50, 130, 170, 300}},
                      FlashCase{1, 40, 40, 2, 2, 16, false, 10, 200, 2, {0, 50, 130, 170, 300}},  // no key visible
                      // Sliding windows (name: _win<left+1>_<right+1>): 0 (the diagonal only), 1, a band
                      // across several key tiles, wider than s, a right window alone, with offsets, documents.
                      FlashCase{1, 300, 300, 2, 1, 16, true, 0, 0, 2, {}, 0, -1},
                      FlashCase{1, 300, 300, 2, 1, 16, false, 0, 0, 2, {}, 1, 1},
                      FlashCase{2, 620, 620, 4, 2, 32, true, 0, 0, 2, {}, 100, -1},
                      FlashCase{1, 620, 620, 2, 2, 64, false, 0, 0, 1, {}, 130, 70},
                      FlashCase{1, 130, 130, 2, 1, 16, true, 0, 0, 2, {}, 500, -1},
                      FlashCase{1, 130, 130, 2, 1, 16, false, 0, 0, 2, {}, -1, 3},
                      FlashCase{1, 64, 300, 2, 2, 16, true, 400, 100, 2, {}, 150, -1},  // chunks of a larger sequence
                      FlashCase{1, 64, 300, 2, 2, 16, false, 100, 300, 2, {}, 20, 40},  // band ends inside the keys
                      FlashCase{1, 64, 64, 2, 2, 16, true, 500, 0, 2, {}, 100, -1},  // keys left of the band: none seen
                      FlashCase{1, 300, 300, 4, 2, 16, true, 0, 0, 2, {0, 1, 2, 7, 64, 64, 200, 300}, 40, -1},
                      FlashCase{1, 620, 620, 2, 1, 64, false, 0, 0, 2, {0, 13, 110, 601, 620}, 60, 5},
                      // Windows and offsets near INT64_MAX (saturated bounds, exact; UBSan checks no overflow):
                      // unbounded in effect; the band's left edge inside the keys; keys just before the queries.
                      FlashCase{1, 64, 64, 2, 2, 16, true, 0, 0, 2, {}, kMax, -1},
                      FlashCase{1, 64, 64, 2, 2, 16, false, 0, 0, 2, {}, kMax - 1, kMax},
                      FlashCase{1, 64, 100, 2, 2, 16, true, kMax - 64, 0, 2, {}, kMax - 120, -1},
                      FlashCase{1, 64, 100, 2, 2, 16, false, kMax - 64, 0, 2, {}, kMax - 120, kMax},
                      FlashCase{1, 64, 64, 2, 1, 16, true, kMax - 64, kMax - 100, 2, {}, 50, -1},
                      FlashCase{1, 70, 64, 2, 1, 16, false, kMax - 70, kMax - 64, 2, {}, 5, kMax}),
    [](const auto& info) { return name_of(info.param); });

// Changing one document's inputs changes nothing outside it, bit for bit: no value and no
// gradient leaks across a boundary.
TEST(Flash, DocumentsAreIsolatedBitForBit) {
  const std::int64_t s = 200, h = 2, d = 16;
  const std::vector<std::int64_t> cu{0, 37, 90, 91, 200};
  auto run = [&](std::uint64_t seed_doc1) {
    Tensor q({1, s, h, d}), k({1, s, h, d}), v({1, s, h, d}), dout({1, s, h, d});
    fill_uniform(q.view(), 1);
    fill_uniform(k.view(), 2);
    fill_uniform(v.view(), 3);
    fill_uniform(dout.view(), 4);
    Tensor noise({1, s, h, d});
    fill_uniform(noise.view(), seed_doc1);
    for (Tensor* t : {&q, &k, &v, &dout})  // document 1: positions [37, 90)
      for (std::int64_t i = 37 * h * d; i < 90 * h * d; ++i) t->f32()[i] += noise.f32()[i];
    std::vector<Tensor> r;
    for (int i = 0; i < 4; ++i) r.emplace_back(Shape{1, s, h, d});
    const Tensor lse = lse_tensor(q.shape());
    const AttentionParams p{true, std::nullopt, 0, 0, cu};
    flash_attention_forward(r[0].view(), lse.view(), q.view(), k.view(), v.view(), p);
    flash_attention_backward(r[1].view(), r[2].view(), r[3].view(), dout.view(), q.view(), k.view(), v.view(),
                             r[0].view(), lse.view(), p);
    return r;
  };
  const std::vector<Tensor> a = run(11), b = run(12);
  for (std::size_t t = 0; t < a.size(); ++t)
    for (std::int64_t i = 0; i < s * h * d; ++i) {
      const bool inside = i >= 37 * h * d && i < 90 * h * d;
      if (!inside) ASSERT_EQ(a[t].f32()[i], b[t].f32()[i]) << "tensor " << t << " element " << i;
    }
  EXPECT_NE(a[0].f32()[50 * h * d], b[0].f32()[50 * h * d]);  // the changed document did change
}

// In place (dk over k, dv over v, dq over out) gives the gradients bit for bit, on both
// schedules (KV pairs per thread; key blocks with private dQ copies) and in bf16.
TEST(Flash, BackwardInPlaceGivesTheSameGradientsBitForBit) {
  struct S {
    std::int64_t b, s, h, hkv;
    DType dtype;
  };
  for (const S& c : {S{4, 300, 4, 2, DType::f32}, S{1, 300, 4, 1, DType::f32}, S{2, 200, 4, 2, DType::bf16}}) {
    SCOPED_TRACE(fmt::format("b {} h {} h_kv {} {}", c.b, c.h, c.hkv, to_string(c.dtype)));
    const Shape qs{c.b, c.s, c.h, 16}, ks{c.b, c.s, c.hkv, 16};
    Tensor q(qs, c.dtype), k(ks, c.dtype), v(ks, c.dtype), dout(qs, c.dtype), out(qs, c.dtype);
    Tensor dq(qs, c.dtype), dk(ks, c.dtype), dv(ks, c.dtype);
    for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}})
      fill_uniform(t->view(), std::uint64_t(seed));
    const Tensor lse = lse_tensor(qs);
    const AttentionParams p{.causal = true};
    flash_attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), p);
    flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                             lse.view(), p);
    flash_attention_backward(out.view(), k.view(), v.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                             lse.view(), p);
    for (auto [a, b] : {std::pair{&dq, &out}, {&dk, &k}, {&dv, &v}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0);
  }
}

// q = k = v [1, 10, 2, 8]: the Error the forward (backward) throws under `p`, or "".
struct SmallAttention {
  Tensor q{Shape{1, 10, 2, 8}}, out{Shape{1, 10, 2, 8}};
  Tensor lse = lse_tensor(q.shape());
  std::string forward_error(const AttentionParams& p) {
    return test_util::error_of(
        [&] { flash_attention_forward(out.view(), lse.view(), q.view(), q.view(), q.view(), p); });
  }
  std::string backward_error(const AttentionParams& p) {
    return test_util::error_of([&] {
      flash_attention_backward(out.view(), q.view(), q.view(), q.view(), q.view(), q.view(), q.view(), out.view(),
                               lse.view(), p);
    });
  }
};

TEST(Flash, RejectsBadWindows) {
  SmallAttention a;
  EXPECT_NE(a.forward_error({.causal = true, .window_left = -2, .window_right = 0})
                .find("window_left must be -1 (unbounded) or >= 0, got -2"),
            std::string::npos);
  EXPECT_NE(a.forward_error({.causal = true, .window_left = 0, .window_right = -5})
                .find("window_right must be -1 (unbounded) or >= 0, got -5"),
            std::string::npos);
}

// scale: unset is 1/sqrt(d); NaN, ±inf, 0 and negatives are refused by value, forward and
// backward. Positions past int64 (q_offset + sq) are refused too.
TEST(Flash, RejectsBadScalesAndOffsets) {
  SmallAttention a;
  auto error_of = [&](const AttentionParams& p) {
    const std::string forward = a.forward_error(p);
    if (!forward.empty()) EXPECT_EQ(a.backward_error(p), forward) << "the backward differs from the forward";
    return forward;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::nanf(""), inf, -inf, 0.0f, -0.0f, -1.0f})
    EXPECT_NE(error_of({.scale = bad})
                  .find(fmt::format("scale must be finite and > 0 (unset: 1/sqrt(head_dim)), got {}", bad)),
              std::string::npos)
        << bad;
  EXPECT_EQ(error_of({.scale = std::numeric_limits<float>::denorm_min()}), "");
  EXPECT_EQ(error_of({.scale = std::nullopt}), "");
  EXPECT_EQ(error_of({.q_offset = kMax - 10}), "");
  EXPECT_NE(error_of({.q_offset = kMax - 9}).find("q_offset 9223372036854775798 + 10 rows passes the largest position"),
            std::string::npos);
  EXPECT_NE(error_of({.k_offset = kMax}).find("k_offset"), std::string::npos);
}

TEST(Flash, RejectsBadDocuments) {
  SmallAttention a;
  EXPECT_NE(a.forward_error({false, 0, 0, 0, {1, 10}}).find("must start at 0, got 1"), std::string::npos);
  EXPECT_NE(a.forward_error({false, 0, 0, 0, {0, 6, 4, 10}}).find("cu_seqlens[2] = 4 after 6"), std::string::npos);
  EXPECT_NE(a.forward_error({false, 0, 0, 0, {0, 4, 8}}).find("must lie inside"), std::string::npos);
  Tensor q2({2, 10, 2, 8}), out2({2, 10, 2, 8});
  const Tensor lse2 = lse_tensor(q2.shape());
  EXPECT_THROW(flash_attention_forward(out2.view(), lse2.view(), q2.view(), q2.view(), q2.view(),
                                       {false, 0, 0, 0, {0, 10}}),
               Error);
}

TEST(Flash, RejectsBadShapesWithNamedValues) {
  Tensor q({1, 4, 3, 8}), k({1, 4, 2, 8}), v({1, 4, 2, 8}), out({1, 4, 3, 8});
  const Tensor lse = lse_tensor(q.shape());
  try {
    flash_attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads (3) must be divisible by num_kv_heads (2)"), std::string::npos)
        << e.what();
  }
  Tensor k2({1, 4, 3, 16});
  EXPECT_THROW(flash_attention_forward(out.view(), lse.view(), q.view(), k2.view(), k2.view(), {}), Error);
  const Tensor wrong = lse_tensor({1, 5, 3, 8});  // one row too many
  EXPECT_THROW(flash_attention_forward(out.view(), wrong.view(), q.view(), q.view(), q.view(), {}), Error);
}

}  // namespace

TEST(Flash, RefusesTensorsOffTheCpu) {
  Tensor q({1, 4, 1, 8}), out(q.shape());
  TensorView elsewhere = q.view();
  elsewhere.device = Device(1);  // a device this build has no kernels for
  const Tensor lse = lse_tensor(q.shape());
  EXPECT_THROW(flash_attention_forward(out.view(), lse.view(), elsewhere, q.view(), q.view(), {}), Error);
}
