// Dealing a step's sequences out to their CP groups: each sequence is loaded by one rank (its
// loader, sequence i on rank i % world) and one all-to-all(v) over the world gives every member
// of the sequence's group exactly its shard, sized by the placements every rank knows.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "train/data.hpp"
#include "ulysses/plan/balancer.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses::train {

// A rank's part of one sequence: token, label, scored (0/1) per token, interleaved, in the
// order of token_positions(chunks) of its place in the group.
using Shard = std::vector<std::int32_t>;

// Where one sequence goes, as the step plan resolved it once: its group and every member's
// chunks (member j is rank group.first_rank + j).
struct Placement {
  BalanceGroup group;
  std::vector<std::vector<SeqChunk>> chunks;
  const std::vector<SeqChunk>& of(int rank) const { return chunks[std::size_t(rank - group.first_rank)]; }
};

inline int loader_of(int sequence, int world) { return sequence % world; }

// Collective over `world`. `placements[i]`: sequence i's group and chunks; `loaded`: the
// sequences this rank loads (every i with loader_of(i, world) == rank), by index. Returns this
// rank's shard of every sequence its groups compute, by sequence index. Counted as "deal".
std::map<int, Shard> deal_sequences(Communicator& world, const std::vector<Placement>& placements,
                                    const std::map<int, Batch>& loaded);

}  // namespace ulysses::train
