// The balancer's internals shared by its policies (balancer.cpp) and the dynamic search
// (balance_dynamic.cpp): memoised costs, the execution model, where groups may go.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ulysses/plan/balancer.hpp"

namespace ulysses::balance_detail {

// sequence_cost memoised per (length, size): steps repeat lengths, and every policy asks often.
// The search asks every length at ~8 sizes an octave, so it keeps only the numbers it ranks by
// (a full SequenceCost, with its config and reason, is 10x larger); `full` memoises the whole
// cost for the (length, size) pairs a plan ends up using.
class CostTable {
 public:
  struct Cost {
    bool valid = false;
    double seconds = 0;
  };
  explicit CostTable(const BalanceInput& in) : in_(in) {}
  const Cost& at(std::int64_t length, int size) {
    auto [it, fresh] = cache_.try_emplace({length, size});
    if (fresh) {
      const SequenceCost c = sequence_cost(in_, length, size);
      it->second = {c.valid, c.seconds};
    }
    return it->second;
  }
  const Cost& of(std::size_t i, int size) { return at(in_.lengths[i], size); }
  const SequenceCost& full(std::size_t i, int size) {
    auto [it, fresh] = full_.try_emplace({in_.lengths[i], size});
    if (fresh) it->second = sequence_cost(in_, in_.lengths[i], size);
    return it->second;
  }

 private:
  const BalanceInput& in_;
  std::map<std::pair<std::int64_t, int>, Cost> cache_;
  std::map<std::pair<std::int64_t, int>, SequenceCost> full_;
};

struct Schedule {
  std::vector<double> finish, busy;
  double step = 0, finish_sum = 0;
  // Strictly better: a shorter step, or (within rounding) the same step with less finish time in all.
  bool better_than(const Schedule& o) const {
    const double tol = 1e-12 * std::max(1.0, o.step);
    if (step < o.step - tol) return true;
    return step <= o.step + tol && finish_sum < o.finish_sum - 1e-12 * std::max(1.0, o.finish_sum);
  }
};

// The execution model: in increasing index, a sequence starts when all its group is free.
Schedule simulate(int world, const std::vector<BalanceGroup>& groups, const std::vector<double>& seconds);
// The same into `s`, reusing its storage: a search simulating hundreds of times at a large world
// would otherwise page-fault two fresh vectors of the world each time.
void simulate(int world, const std::vector<BalanceGroup>& groups, const std::vector<double>& seconds, Schedule& s);
// Where a group of `size` ranks may start (balancer.cpp's top comment), ascending.
std::vector<int> placements(const Cluster& cluster, int world, int size);
// Throws the Error for sequence i fitting no group (`where`: " of a power-of-two size" or "").
[[noreturn]] void throw_unplaceable(const BalanceInput& in, std::size_t i, CostTable& costs, const std::string& where);
// Of `firsts`, the group of `size` whose busiest member's `load` is least (the lowest on ties).
BalanceGroup least_loaded(const std::vector<double>& load, const std::vector<int>& firsts, int size, double* busiest);
// Sequence indices by decreasing key, ties by index.
std::vector<std::size_t> decreasing(const std::vector<double>& key);
// Runs of bit-identical times: end[x] is the first rank after x whose time differs (or the size).
// Into `end`, whose storage is reused: at large worlds a fresh vector a state is a page-faulted mmap.
void run_ends(const std::vector<double>& times, std::vector<std::uint32_t>& end);
// The placements p.. q − 1 of `firsts` (ascending) whose windows of `size` ranks all lie in the
// run holding firsts[p]'s window, q returned (p + 1 when that window crosses runs): each of them
// reads the same values in the same order, so its busiest member and its sum are the same bits.
std::size_t same_window_end(const std::vector<int>& firsts, std::size_t p, int size,
                            const std::vector<std::uint32_t>& run_end);
// The dynamic policy's groups; `baselines` (static's, pow2's when feasible) are candidates too.
std::vector<BalanceGroup> dynamic_groups(const BalanceInput& in, CostTable& costs,
                                         const std::vector<std::vector<BalanceGroup>>& baselines);

}  // namespace ulysses::balance_detail
