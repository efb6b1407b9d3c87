#include "merge.hpp"

#include "ulysses/core/device_ops.hpp"

namespace ulysses {

void merge_attention(const TensorView& acc, const TensorView& acc_lse, const TensorView& part,
                     const TensorView& part_lse) {
  ops_for({&acc, &acc_lse, &part, &part_lse}).merge(acc, acc_lse, part, part_lse);
}

}  // namespace ulysses
