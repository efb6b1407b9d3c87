#include "tensor_ops.hpp"

#include <vector>

namespace ulysses {

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

SavedForward::SavedForward(const TensorView& q_in)
    : q(copy_of(q_in, q_in.dtype)), out(Tensor::uninitialized(q_in.shape)) {}

Float32Backward::Float32Backward(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out)
    : dq(Tensor::uninitialized(dq_out.shape)), dk(Tensor::uninitialized(dk_out.shape)),
      dv(Tensor::uninitialized(dv_out.shape)) {}

void Float32Backward::store(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out) const {
  copy(dq.view(), dq_out);
  copy(dk.view(), dk_out);
  copy(dv.view(), dv_out);
}

}  // namespace ulysses
