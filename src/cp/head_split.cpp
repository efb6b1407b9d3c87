#include "head_split.hpp"

#include <fmt/format.h>

#include "ulysses/error.hpp"

namespace ulysses {

void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads) {
  if (heads % kv_heads != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({}) (GQA groups)", heads, kv_heads));
}

void check_ulysses_heads(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                         std::string_view strategy) {
  check_gqa_groups(heads, kv_heads);
  if (heads < group)
    throw Error(
        fmt::format("num_heads ({}) must be at least {} ({}) for cp_comm_type {}: Ulysses gives every rank "
                    "of the all-to-all at least one whole head. cp_comm_type p2p (ring attention) has no "
                    "head constraint",
                    heads, group_name, group, strategy));
}

}  // namespace ulysses
