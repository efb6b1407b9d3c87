// Checks the commands make before they compute: memory enough, inputs finite and identical on
// every rank (outputs: ulysses/io/output_file.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/io/npy.hpp"

namespace ulysses::cli {

// CLI11's PositiveNumber and NonNegativeNumber, but with short messages ("--seq: must be
// positive, got -5"; CLI11's print the largest double in full).
CLI::Validator positive_number();
CLI::Validator non_negative_number();

// Not collective. Throws Error when `ranks_on_node` ranks of `per_rank` bytes each, plus
// `root_extra` bytes (rank 0's gathers and checks, counted on every node), need more than this
// node has available: "<what> needs about X ..., only Y available".
void check_memory(const std::string& what, double per_rank, double root_extra, int ranks_on_node);

// What each rank of a run may count on: 90 % of what its node has (MemAvailable, or what the
// cgroup's limit still allows) over the node's ranks, the least over the nodes. The model of a
// run's memory errs by up to about 10 %, and MemAvailable moves while a run goes on.
struct MemoryRoom {
  bool known = false;          // false when no node could tell
  double per_rank = 0;         // the 90 %, per rank
  std::int64_t available = 0;  // this node's (for the message)
  int on_node = 1;             // ranks on this node
  // Not collective. The refusal when `need` bytes (`described`) are more than per_rank: "<what>
  // needs a predicted <described> per rank, more than this machine has: …: <remedy>"; "" when
  // they fit or nothing is known.
  std::string refusal(const std::string& what, double need, const std::string& described,
                      const std::string& remedy) const;
};

// Collective (one small all-reduce).
MemoryRoom memory_room(Communicator& comm);

// Not collective. Throws Error "<name> (<path>) has a non-finite value ..." for the first NaN or
// Inf in `a` (a 4-D float32 array), with how to allow it.
void check_finite(const NpyArray& a, const char* name, const std::string& path);

// Collective. Every rank hashes the arrays it read (contents and shapes, not paths); unless all
// ranks hold the same, every rank throws the same Error naming the first rank that differs.
void agree_same_inputs(Communicator& comm, const std::vector<const NpyArray*>& arrays);

}  // namespace ulysses::cli
