#include "merge.hpp"

#include "ulysses/device_ops.hpp"

namespace ulysses {

void merge_attention(const TensorView& acc, float* acc_lse, const TensorView& part, const float* part_lse) {
  const Shape& s = acc.shape;
  auto lse = [&](const float* p) {
    return TensorView::dense(const_cast<float*>(p), DType::f32, {s.b, s.s, s.h, 1}, Layout::bhsd, acc.device);
  };
  ops_for({&acc, &part}).merge(acc, lse(acc_lse), part, lse(part_lse));
}

}  // namespace ulysses
