#include "head_split.hpp"

#include <fmt/format.h>

#include "ulysses/error.hpp"

namespace ulysses {

void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads) {
  if (heads % kv_heads != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({}) (GQA groups)", heads, kv_heads));
}

int kv_replicas_for(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                    std::string_view strategy) {
  if (heads % group != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by {} ({}) for cp_comm_type {}: Ulysses gives "
                            "every rank of the all-to-all num_heads/{} whole heads. cp_comm_type p2p "
                            "(ring attention) has no head constraint",
                            heads, group_name, group, strategy, group));
  if (kv_heads % group == 0) return 1;
  if (group % kv_heads == 0) return int(group / kv_heads);
  throw Error(fmt::format("num_kv_heads ({}) does not fit {} ({}) for cp_comm_type {}: it needs "
                          "num_kv_heads % {} == 0 (split the KV heads) or {} % num_kv_heads == 0 "
                          "(replicate each KV head {}/num_kv_heads times). cp_comm_type p2p "
                          "(ring attention) has no head constraint",
                          kv_heads, group_name, group, strategy, group, group, group));
}

}  // namespace ulysses
