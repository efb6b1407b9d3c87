#include "tensor_ops.hpp"

#include "ulysses/core/device_ops.hpp"

namespace ulysses {

Tensor f32_like(const TensorView& t) { return Tensor::uninitialized(t.shape, DType::f32, Layout::bshd, t.device); }

TensorView kv_half(const TensorView& kv, int which) {
  TensorView v = kv;
  v.shape.b /= 2;
  v.data = kv.row(which * v.shape.b, 0, 0);
  return v;
}

void zero(const TensorView& t) { fill(t, 0.0f); }

void fill(const TensorView& t, float value) { ops_for({&t}).fill(t, value); }

void accumulate(const TensorView& dst, const TensorView& src) { ops_for({&dst, &src}).accumulate(dst, src); }

SavedForward::SavedForward(const TensorView& q_in) : q(copy_of(q_in, q_in.dtype)), out(f32_like(q_in)) {}

Float32Backward::Float32Backward(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out)
    : dq(f32_like(dq_out)), dk(f32_like(dk_out)), dv(f32_like(dv_out)) {}

void Float32Backward::store(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out) const {
  copy(dq.view(), dq_out);
  copy(dk.view(), dk_out);
  copy(dv.view(), dv_out);
}

}  // namespace ulysses
