// The CP groups of variable-length steps: the sub-communicators a balancer plan puts sequences
// on, split once and kept for every later step that uses the same ranks.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "ulysses/plan/balancer.hpp"
#include "ulysses/comm/communicator.hpp"

namespace ulysses::train {

class GroupCache {
 public:
  explicit GroupCache(Communicator& world) : world_(world) {}
  // Collective over the world (Communicator::split is): splits every group of `groups` that no
  // earlier call split, in sorted (first_rank, size) order. Every rank sees the same plans, so
  // every rank makes the same splits in the same order.
  void ensure(const std::vector<BalanceGroup>& groups);
  // Not collective. The communicator of `group`, which this rank must be in (ensured before).
  Communicator& get(const BalanceGroup& group);

 private:
  using Key = std::pair<int, int>;  // (first_rank, size)
  Communicator& world_;
  std::set<Key> split_;                                // every group split so far (all ranks)
  std::map<Key, std::unique_ptr<Communicator>> mine_;  // those this rank is in
};

}  // namespace ulysses::train
