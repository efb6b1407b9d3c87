// Small float32 view operations the strategies share.
#pragma once

#include "ulysses/tensor.hpp"

namespace ulysses {

// Rows [row, row + n) of a [b, s, h, d] view.
TensorView rows(const TensorView& v, std::int64_t row, std::int64_t n);

// K (which = 0) or V (which = 1) of a fused [2b, s, h_kv, d] buffer.
TensorView kv_half(const TensorView& kv, int which);

// t = 0 (any dtype).
void zero(const TensorView& t);

// dst += src (float32 views of one shape).
void accumulate(const TensorView& dst, const TensorView& src);

}  // namespace ulysses
