// Merging partial attention results by their log-sum-exp (ring / chunked attention).
//
// Two partial results over disjoint key sets, (O, L) and (O_i, L_i), combine exactly into
//   L' = logaddexp(L, L_i),   O' = e^{L−L'}·O + e^{L_i−L'}·O_i
// written in the stable form O' = O − σ(L_i − L)·(O − O_i), L' = L − log σ(L − L_i), with
// σ the logistic function (it never exponentiates a large positive number). A row with
// L = −∞ (no key seen yet) takes (O_i, L_i) as is; L_i = −∞ leaves the row unchanged.
#pragma once

#include "ulysses/core/tensor.hpp"

namespace ulysses {

// acc [b, n, h, d] float32 view and acc_lse (lse_tensor's dense float32 bhsd [b, n, h, 1]) are
// updated in place with part [b, n, h, d] and part_lse, all on one device, by its table
// (device_ops.hpp; the loop is the CPU's there).
void merge_attention(const TensorView& acc, const TensorView& acc_lse, const TensorView& part,
                     const TensorView& part_lse);

}  // namespace ulysses
