// The head rules of an all-to-all over heads (Ulysses, and the inner group of a2a+p2p).
#pragma once

#include <cstdint>
#include <string_view>

namespace ulysses {

// Throws Error unless heads % kv_heads == 0 (whole GQA groups).
void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads);

// Throws Error unless ulysses_heads (sharding.hpp) can split the heads over `group` ranks:
// whole GQA groups, and at least one query head per rank (heads >= group), naming the group
// ("cp", "the inner (a2a) size") and the strategy. Any head count at or above the group size
// splits, evenly or not.
void check_ulysses_heads(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                         std::string_view strategy);

}  // namespace ulysses
