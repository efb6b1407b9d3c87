// The LSE merge (merge.hpp): split the keys in two, attend to each half, merge: equals
// attending to all; empty parts change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "cp/merge.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/kernels/reference_attention.hpp"

using namespace ulysses;

namespace {

TEST(Merge, TwoHalvesOfTheKeysEqualTheWhole) {
  const std::int64_t b = 2, s = 40, h = 3, d = 16, sk = 90;
  Tensor q({b, s, h, d}), k({b, sk, h, d}), v({b, sk, h, d});
  fill_uniform(q.view(), 1);
  fill_uniform(k.view(), 2);
  fill_uniform(v.view(), 3);
  for (std::optional<float> scale :
       {std::optional<float>(), std::optional<float>(30.0f)}) {  // 30: large logits, where a naive merge overflows
    // Queries at positions 50..89 against keys 0..89, causal; split the keys at 37.
    AttentionParams all{true, scale, 50, 0};
    Tensor o_all({b, s, h, d});
    std::vector<float> lse_all(std::size_t(b * h * s));
    flash_attention_forward(o_all.view(), TensorView::dense(lse_all.data(), DType::f32, {b, s, h, 1}, Layout::bhsd),
                            q.view(), k.view(), v.view(), all);
    auto part = [&](std::int64_t k0, std::int64_t n, Tensor& o, std::vector<float>& lse) {
      TensorView kk = k.view(), vv = v.view();
      kk.data = k.view().row(0, k0, 0);
      vv.data = v.view().row(0, k0, 0);
      kk.shape.s = vv.shape.s = n;
      const TensorView l = TensorView::dense(lse.data(), DType::f32, {b, s, h, 1}, Layout::bhsd);
      flash_attention_forward(o.view(), l, q.view(), kk, vv, {true, scale, 50, k0});
    };
    Tensor o1({b, s, h, d}), o2({b, s, h, d});
    std::vector<float> l1(lse_all.size()), l2(lse_all.size());
    part(0, 37, o1, l1);
    part(37, sk - 37, o2, l2);  // rows before position 37 see none of these keys: lse -inf
    auto lse_view = [&](std::vector<float>& l) {
      return TensorView::dense(l.data(), DType::f32, {b, s, h, 1}, Layout::bhsd);
    };
    merge_attention(o1.view(), lse_view(l1), o2.view(), lse_view(l2));
    double worst = 0;
    for (std::int64_t i = 0; i < o_all.shape().numel(); ++i)
      worst = std::max(worst, double(std::abs(o1.f32()[i] - o_all.f32()[i])));
    EXPECT_LT(worst, 1e-5) << "scale " << scale.value_or(0.0f);
    for (std::size_t i = 0; i < l1.size(); ++i)
      EXPECT_NEAR(l1[i], lse_all[i], 1e-4 * std::max(1.0f, std::abs(lse_all[i])));
  }
}

TEST(Merge, EmptyRowsStayEmptyAndNeverNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor acc({1, 3, 1, 2}), part({1, 3, 1, 2});
  float* a = acc.f32();
  float* p = part.f32();
  for (int i = 0; i < 6; ++i) p[i] = float(i + 1);
  std::vector<float> la = {-inf, -inf, 2.0f}, lp = {-inf, 1.0f, -inf};
  a[4] = 7.0f;
  a[5] = 8.0f;
  merge_attention(acc.view(), TensorView::dense(la.data(), DType::f32, {1, 3, 1, 1}, Layout::bhsd), part.view(),
                  TensorView::dense(lp.data(), DType::f32, {1, 3, 1, 1}, Layout::bhsd));
  EXPECT_EQ(la[0], -inf);  // both empty
  EXPECT_EQ(a[0], 0.0f);
  EXPECT_EQ(la[1], 1.0f);  // first contribution is taken as is
  EXPECT_EQ(a[2], 3.0f);
  EXPECT_EQ(la[2], 2.0f);  // an empty part changes nothing
  EXPECT_EQ(a[4], 7.0f);
}

}  // namespace
