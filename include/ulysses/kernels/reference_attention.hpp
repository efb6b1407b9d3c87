// Float64 reference attention: the independent oracle every test and `--check` compares to.
//
// Deliberately naive (one query row at a time, scores in a length-sk double vector, exact
// std::exp), single process, O(s) memory per row. Dense bshd tensors of doubles.
#pragma once

#include <cstdint>
#include <vector>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

struct RefTensor {
  Shape shape;
  std::vector<double> data;  // bshd, dense

  RefTensor() = default;
  explicit RefTensor(Shape s) : shape(s), data(std::size_t(s.numel()), 0.0) {}
  double& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
    return data[std::size_t(((b * shape.s + s) * shape.h + h) * shape.d + d)];
  }
  double at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return data[std::size_t(((b * shape.s + s) * shape.h + h) * shape.d + d)];
  }
  static RefTensor from(const TensorView& view);  // any dtype / layout
};

// lse: [b, h, sq].
void reference_attention_forward(RefTensor& out, std::vector<double>& lse, const RefTensor& q, const RefTensor& k,
                                 const RefTensor& v, const AttentionParams& params);

void reference_attention_backward(RefTensor& dq, RefTensor& dk, RefTensor& dv, const RefTensor& dout,
                                  const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                  const AttentionParams& params);

// ‖x − ref‖₂ / ‖ref‖₂ (0 when both are zero).
double relative_error(const TensorView& x, const RefTensor& ref);

}  // namespace ulysses
