#include "merge.hpp"

#include <algorithm>
#include <cmath>

namespace ulysses {

void merge_attention(const TensorView& acc, float* acc_lse, const TensorView& part, const float* part_lse) {
  const Shape& s = acc.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.s; ++i) {
        float& L = acc_lse[(b * s.h + h) * s.s + i];
        const float Li = part_lse[(b * s.h + h) * s.s + i];
        if (std::isinf(Li) && Li < 0) continue;  // the part saw no key for this row
        float* o = acc.f32(b, i, h);
        const float* oi = part.f32(b, i, h);
        if (std::isinf(L) && L < 0) {  // first contribution
          for (std::int64_t x = 0; x < s.d; ++x) o[x] = oi[x];
          L = Li;
          continue;
        }
        // σ(Li − L) = weight of the new part; log σ(L − Li) = −softplus(Li − L).
        const float w = 1.0f / (1.0f + std::exp(L - Li));
        for (std::int64_t x = 0; x < s.d; ++x) o[x] -= w * (o[x] - oi[x]);
        // max(L, Li) + softplus(−|Li − L|): never below either lse (the backward's exp relies on
        // lse >= every scaled score, flash_backward.cpp), finite for finite L, Li.
        L = std::max(L, Li) + std::log1p(std::exp(-std::abs(Li - L)));
      }
}

}  // namespace ulysses
