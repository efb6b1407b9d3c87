#include "train/groups.hpp"

#include <fmt/format.h>

#include "ulysses/core/error.hpp"

namespace ulysses::train {

void GroupCache::ensure(const std::vector<BalanceGroup>& groups) {
  std::set<Key> wanted;
  for (const BalanceGroup& g : groups)
    if (!split_.count({g.first_rank, g.size})) wanted.insert({g.first_rank, g.size});
  for (const Key& k : wanted) {
    const BalanceGroup g{k.first, k.second};
    const bool member = g.contains(world_.rank());
    std::unique_ptr<Communicator> sub = world_.split(member ? 0 : 1, world_.rank());
    if (member) {
      sub->trace_through(world_, fmt::format("ranks {}-{}", g.first_rank, g.first_rank + g.size - 1));
      mine_[k] = std::move(sub);
    }
    split_.insert(k);
  }
}

Communicator& GroupCache::get(const BalanceGroup& g) {
  const auto it = mine_.find({g.first_rank, g.size});
  if (it == mine_.end())  // only a bug gets here: the trainer asks for its own groups, ensured first
    throw Error(fmt::format("internal: rank {} has no communicator for ranks {}-{}", world_.rank(), g.first_rank,
                            g.first_rank + g.size - 1));
  return *it->second;
}

}  // namespace ulysses::train
