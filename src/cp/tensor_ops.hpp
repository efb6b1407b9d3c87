// Small float32 view operations the strategies share, through the views' device table
// (device_ops.hpp).
#pragma once

#include "ulysses/core/tensor.hpp"

namespace ulysses {

// An uninitialised dense float32 bshd tensor of t's shape on t's device.
Tensor f32_like(const TensorView& t);

// K (which = 0) or V (which = 1) of a fused [2b, s, h_kv, d] buffer.
TensorView kv_half(const TensorView& kv, int which);

// t = 0 / t = value (any dtype).
void zero(const TensorView& t);
void fill(const TensorView& t, float value);

// dst += src (float32 views of one shape).
void accumulate(const TensorView& dst, const TensorView& src);

// What a strategy that sums partial results (p2p, all_gather) keeps of its forward: q in the
// storage dtype (which its kernels compute in) and the float32 output, rounded once by the
// caller after the last merge.
struct SavedForward {
  Tensor q, out;
  SavedForward() = default;
  explicit SavedForward(const TensorView& q_in);
};
// The float32 gradient buffers of a strategy that sums partial gradients (p2p, all_gather:
// over ring steps or query chunks, in float32 whatever the storage dtype); store() writes them
// in the caller's dtype, rounding once.
struct Float32Backward {
  Tensor dq, dk, dv;
  Float32Backward(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out);
  void store(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out) const;
};

}  // namespace ulysses
