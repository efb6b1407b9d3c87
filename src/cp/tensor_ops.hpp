// Small float32 view operations the strategies share, through the views' device table
// (device_ops.hpp).
#pragma once

#include "ulysses/tensor.hpp"

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

// Strategies that compute in float32 whatever the storage dtype (p2p, all_gather).
// The forward's float32 q and output, kept for the backward.
struct Float32Forward {
  Tensor q, out;
  Float32Forward() = default;
  explicit Float32Forward(const TensorView& q_in);
};
// The backward's float32 dout and gradient buffers; store() writes them in the caller's dtype.
struct Float32Backward {
  Tensor dout, dq, dk, dv;
  Float32Backward(const TensorView& dout_in, const TensorView& dq_out, const TensorView& dk_out,
                  const TensorView& dv_out);
  void store(const TensorView& dq_out, const TensorView& dk_out, const TensorView& dv_out) const;
};

}  // namespace ulysses
