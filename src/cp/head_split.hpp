// The head rules of an all-to-all over heads (Ulysses, and the inner group of a2a+p2p).
#pragma once

#include <cstdint>
#include <string_view>

namespace ulysses {

// Throws Error unless heads % kv_heads == 0 (whole GQA groups).
void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads);

// How many times each KV head is sent by an all-to-all over `group` ranks: 1 when the KV
// heads split (kv_heads % group == 0), group / kv_heads when they are replicated
// (group % kv_heads == 0). Throws Error otherwise, or when the query heads do not split
// (heads % group != 0), naming the group ("cp", "the inner (a2a) size") and the strategy.
int kv_replicas_for(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                    std::string_view strategy);

}  // namespace ulysses
