// Local kernels against independent references: the vector exp against std::exp, bf16
// rounding against hand-computed values, flash attention against the float64 oracle.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/vexp.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/bf16.hpp"
#include "ulysses/error.hpp"
#include "ulysses/reference.hpp"

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

class VexpTest : public ::testing::TestWithParam<kernels::Isa> {
 protected:
  void SetUp() override { kernels::force_isa(GetParam()); }
  void TearDown() override { kernels::force_isa(kernels::Isa::avx2); }
};

TEST_P(VexpTest, WithinTwoUlpOfStdExp) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.0137f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 1.0f, -1.0f, 88.0f}) x.push_back(v);
  std::vector<float> out(x.size());
  float sum = kernels::exp_shifted_sum(x.data(), out.data(), std::int64_t(x.size()), 0.0f);
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float ref = std::exp(x[i]);
    worst = std::max(worst, ulp_distance(out[i], ref));
  }
  EXPECT_LE(worst, 2) << "isa " << kernels::to_string(kernels::active_isa());
  (void)sum;
  // The returned sum, on the softmax's range (x - max <= 0).
  std::vector<float> y;
  for (float v = -20.0f; v <= 0.0f; v += 0.01f) y.push_back(v);
  std::vector<float> e(y.size());
  const float s = kernels::exp_shifted_sum(y.data(), e.data(), std::int64_t(y.size()), 0.0f);
  double ref = 0;
  for (float v : y) ref += std::exp(double(v));
  EXPECT_NEAR(s, ref, 1e-5 * ref);
}

TEST_P(VexpTest, MaskedAndTinyInputsGiveExactZero) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -1e30f, -87.5f, -100.0f, -inf, -inf, -inf, -inf, -inf, 0.0f};
  std::vector<float> out(x.size(), 123.0f);
  const float sum = kernels::exp_shifted_sum(x.data(), out.data(), std::int64_t(x.size()), 0.0f);
  for (std::size_t i = 0; i + 1 < x.size(); ++i) EXPECT_EQ(out[i], 0.0f) << "x = " << x[i];
  EXPECT_EQ(out.back(), 1.0f);
  EXPECT_EQ(sum, 1.0f);
  // The shift is subtracted: exp(x - m) with x = m is exactly 1.
  float y = 3.5f, e = 0;
  kernels::exp_shifted_sum(&y, &e, 1, 3.5f);
  EXPECT_EQ(e, 1.0f);
}

TEST_P(VexpTest, RowMaxEqualsStdMaxElement) {
  std::vector<float> x(37);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 1.7f) * 10.0f;
  for (std::int64_t n : {0, 1, 7, 8, 9, 16, 37}) {
    const float init = -std::numeric_limits<float>::infinity();
    const float expect = n == 0 ? init : *std::max_element(x.begin(), x.begin() + n);
    EXPECT_EQ(kernels::row_max(x.data(), n, init), expect) << n;
  }
  EXPECT_EQ(kernels::row_max(x.data(), 37, 100.0f), 100.0f);  // the running max carries over
}

INSTANTIATE_TEST_SUITE_P(Isa, VexpTest, ::testing::Values(kernels::Isa::portable, kernels::Isa::avx2),
                         [](const auto& info) { return std::string(kernels::to_string(info.param)); });

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

struct FlashCase {
  std::int64_t b, sq, sk, h, hkv, d;
  bool causal;
  std::int64_t q_offset = 0, k_offset = 0;
  int threads = 2;
};

std::string name_of(const FlashCase& c) {
  return "b" + std::to_string(c.b) + "_sq" + std::to_string(c.sq) + "_sk" + std::to_string(c.sk) + "_h" +
         std::to_string(c.h) + "_kv" + std::to_string(c.hkv) + "_d" + std::to_string(c.d) +
         (c.causal ? "_causal" : "_full") + "_qo" + std::to_string(c.q_offset) + "_ko" +
         std::to_string(c.k_offset) + "_t" + std::to_string(c.threads);
}

class FlashTest : public ::testing::TestWithParam<FlashCase> {};

TEST_P(FlashTest, ForwardAndBackwardMatchFloat64Reference) {
  const FlashCase c = GetParam();
  omp_set_num_threads(c.threads);
  Tensor q({c.b, c.sq, c.h, c.d}), k({c.b, c.sk, c.hkv, c.d}), v({c.b, c.sk, c.hkv, c.d});
  Tensor dout({c.b, c.sq, c.h, c.d});
  fill_uniform(q.view(), 1);
  fill_uniform(k.view(), 2);
  fill_uniform(v.view(), 3);
  fill_uniform(dout.view(), 4);
  AttentionParams p{c.causal, 0.0f, c.q_offset, c.k_offset};
  RefTensor rq = RefTensor::from(q.view()), rk = RefTensor::from(k.view()), rv = RefTensor::from(v.view());
  RefTensor rout, rdq, rdk, rdv;
  std::vector<double> rlse;
  reference_attention_forward(rout, rlse, rq, rk, rv, p);
  reference_attention_backward(rdq, rdk, rdv, RefTensor::from(dout.view()), rq, rk, rv, p);
  // Both code paths: the AVX2 micro-kernels and the portable one (BLAS + scalar exp).
  for (kernels::Isa isa : {kernels::Isa::avx2, kernels::Isa::portable}) {
    kernels::force_isa(isa);
    SCOPED_TRACE(kernels::to_string(kernels::active_isa()));
    Tensor out({c.b, c.sq, c.h, c.d});
    std::vector<float> lse(std::size_t(c.b * c.h * c.sq));
    flash_attention_forward(out.view(), lse.data(), q.view(), k.view(), v.view(), p);
    Tensor dq({c.b, c.sq, c.h, c.d}), dk({c.b, c.sk, c.hkv, c.d}), dv({c.b, c.sk, c.hkv, c.d});
    flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(),
                             out.view(), lse.data(), p);
    EXPECT_LT(relative_error(out.view(), rout), 2e-6);
    EXPECT_LT(relative_error(dq.view(), rdq), 2e-5);
    EXPECT_LT(relative_error(dk.view(), rdk), 2e-5);
    EXPECT_LT(relative_error(dv.view(), rdv), 2e-5);
    for (std::size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(rlse[i])) EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i;
      else EXPECT_NEAR(lse[i], rlse[i], 2e-5 * std::max(1.0, std::abs(rlse[i]))) << "row " << i;
    }
    for (const Tensor* t : {&out, &dq, &dk, &dv})
      for (std::int64_t i = 0; i < t->shape().numel(); ++i) ASSERT_TRUE(std::isfinite(t->f32()[i]));
  }
  kernels::force_isa(kernels::Isa::avx2);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashTest,
    ::testing::Values(
        FlashCase{1, 1, 1, 1, 1, 8, false}, FlashCase{1, 1, 1, 1, 1, 8, true},
        FlashCase{2, 67, 67, 2, 2, 8, false}, FlashCase{2, 67, 67, 2, 2, 8, true},
        FlashCase{1, 130, 130, 4, 1, 16, true},                 // MQA, s not a block multiple
        FlashCase{1, 300, 300, 4, 2, 64, false}, FlashCase{1, 300, 300, 4, 2, 64, true},  // GQA
        FlashCase{1, 200, 200, 2, 2, 128, true}, FlashCase{1, 200, 200, 2, 2, 128, false},
        FlashCase{2, 70, 290, 3, 3, 16, false},                 // sq != sk
        FlashCase{1, 64, 128, 2, 1, 16, true, 64, 0},           // query chunk after the keys
        FlashCase{1, 64, 96, 2, 2, 16, true, 0, 32},            // first 32 rows see no key
        FlashCase{1, 64, 64, 2, 2, 16, true, 0, 1000},          // no row sees any key
        FlashCase{3, 150, 150, 4, 2, 16, true, 0, 0, 1},        // one thread
        FlashCase{8, 100, 100, 2, 2, 16, true, 0, 0, 2},        // many pairs: direct dQ path
        FlashCase{1, 77, 300, 2, 2, 24, true, 230, 0},          // d = 24: micro-kernel column tail
        FlashCase{2, 13, 40, 3, 1, 32, false, 0, 0, 1}),        // rows not a multiple of 6
    [](const auto& info) { return name_of(info.param); });

TEST(Flash, RejectsBadShapesWithNamedValues) {
  Tensor q({1, 4, 3, 8}), k({1, 4, 2, 8}), v({1, 4, 2, 8}), out({1, 4, 3, 8});
  std::vector<float> lse(12);
  try {
    flash_attention_forward(out.view(), lse.data(), q.view(), k.view(), v.view(), {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_heads (3) must be divisible by num_kv_heads (2)"),
              std::string::npos) << e.what();
  }
  Tensor k2({1, 4, 3, 16});
  EXPECT_THROW(flash_attention_forward(out.view(), lse.data(), q.view(), k2.view(), k2.view(), {}), Error);
}

}  // namespace
