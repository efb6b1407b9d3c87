// Dealing a step's sequences out to their CP groups: each sequence is loaded by one rank (its
// loader, sequence i on rank i % world) and one all-to-all(v) over the world gives every member
// of the sequence's group exactly its shard, sized by the layouts every rank knows.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "train/data.hpp"
#include "ulysses/balancer.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses::train {

// A rank's part of one sequence: token, label, scored (0/1) per token, interleaved, in the
// order of token_positions(chunks) of its place in the group.
using Shard = std::vector<std::int32_t>;

inline int loader_of(int sequence, int world) { return sequence % world; }

// Collective over `world`. `chunks(i, j)`: the chunks of member j (0-based in its group) of
// sequence i; `load(i)`: the tokens of sequence i, called only on its loader. Returns this
// rank's shard of every sequence its groups compute, by sequence index. Counted as "deal".
std::map<int, Shard> deal_sequences(Communicator& world, const BalancePlan& plan,
                                    const std::function<std::vector<SeqChunk>(int, int)>& chunks,
                                    const std::function<Batch(int)>& load);

}  // namespace ulysses::train
