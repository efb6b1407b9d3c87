#include "tensor_ops.hpp"

#include <vector>

namespace ulysses {

TensorView rows(const TensorView& v, std::int64_t row, std::int64_t n) {
  TensorView r = v;
  r.data = v.row(0, row, 0);
  r.shape.s = n;
  return r;
}

TensorView kv_half(const TensorView& kv, int which) {
  TensorView v = kv;
  v.shape.b /= 2;
  v.data = kv.row(which * v.shape.b, 0, 0);
  return v;
}

void zero(const TensorView& t) {
  const std::vector<float> z(static_cast<std::size_t>(t.shape.d), 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < t.shape.b; ++b)
    for (std::int64_t s = 0; s < t.shape.s; ++s)
      for (std::int64_t h = 0; h < t.shape.h; ++h) store_row(t, b, s, h, z.data());
}

void accumulate(const TensorView& dst, const TensorView& src) {
  const Shape& s = dst.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t i = 0; i < s.s; ++i)
      for (std::int64_t h = 0; h < s.h; ++h) {
        float* o = dst.f32(b, i, h);
        const float* x = src.f32(b, i, h);
        for (std::int64_t c = 0; c < s.d; ++c) o[c] += x[c];
      }
}

}  // namespace ulysses
