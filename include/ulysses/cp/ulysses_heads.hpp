// Which heads each rank of a Ulysses all-to-all holds (Ulysses, and the inner group of
// a2a+p2p): whole GQA groups, or KV heads shared by the ranks splitting their group; the checks
// that the heads split; and the chunks of heads overlapped Ulysses pipelines.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ulysses/core/ranges.hpp"

namespace ulysses {

// A Ulysses all-to-all over `group` ranks gives rank `rank` these query and KV heads of `heads`
// query heads in GQA groups over `kv_heads` KV heads (parts cut by even_part, as tokens are):
//   kv_heads >= group: whole GQA groups: the KV heads cut into `group` parts, each rank with
//                      all the query heads of its KV heads (h = 6 on 4 ranks: 2, 2, 1, 1);
//   kv_heads <  group: each KV head shared by one part of the ranks cut into kv_heads parts,
//                      which split its group's query heads; each rank holds that KV head.
// A query head always lands on a rank holding its KV head, so the local attention is plain
// GQA, and an even split (heads % group == 0 with kv_heads % group == 0 or group % kv_heads ==
// 0) is the seed's h/group heads per rank. Precondition: heads % kv_heads == 0 and heads >=
// group (Strategy::validate's rule: every rank of the all-to-all gets a head).
RankHeads ulysses_heads(int group, int rank, std::int64_t heads, std::int64_t kv_heads);

// The KV heads all ranks of the group hold together: kv_heads when whole groups split,
// `group` when the KV heads are shared (each rank holds one).
std::int64_t ulysses_kv_heads_held(int group, std::int64_t kv_heads);

// Every rank's ulysses_heads, as the all-to-all takes them (SeqShard::heads).
HeadSplit ulysses_head_split(int group, std::int64_t heads, std::int64_t kv_heads);
// The most heads any rank gets in `ranges` (the busiest rank's share).
std::int64_t most_heads(const std::vector<HeadRange>& ranges);

// Overlapped Ulysses (CpConfig::overlap_chunks): how many chunks the pipeline cuts every
// rank's heads into. A chunk is whole GQA groups (it needs its KV head), so `requested` is
// clamped to the fewest KV heads a rank holds: 1 when KV heads are shared (kv_heads < group).
int ulysses_overlap_chunks(int requested, int group, std::int64_t kv_heads);
// Chunk i of `chunks` of every rank's heads in `split` (ulysses_head_split; chunks no more than
// ulysses_overlap_chunks): each rank's KV heads cut like tokens, with their query heads.
HeadSplit ulysses_head_chunk(const HeadSplit& split, int chunks, int i);

// Throws Error unless heads % kv_heads == 0 (whole GQA groups).
void check_gqa_groups(std::int64_t heads, std::int64_t kv_heads);
// Throws Error unless ulysses_heads can split the heads over `group` ranks: whole GQA groups,
// and at least one query head per rank (heads >= group), naming the group ("cp", "the inner
// (a2a) size") and the strategy. Any head count at or above the group size splits, evenly or not.
void check_ulysses_heads(int group, std::int64_t heads, std::int64_t kv_heads, std::string_view group_name,
                         std::string_view strategy);

}  // namespace ulysses
