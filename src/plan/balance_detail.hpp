// The balancer's internals shared by its policies (balancer.cpp) and the dynamic search
// (balance_dynamic.cpp): memoised costs, the execution model, where groups may go.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ulysses/plan/balancer.hpp"

namespace ulysses {

// The memo behind CostTable (balancer.hpp says who shares one): the numbers the search ranks by
// for every (length, size) it asks, the whole cost for those a plan ends up using. Only sizes
// inside the world are kept, the one way a cost depends on the world. Calls sharing one may run
// at once: every access holds `lock` (a CostTable reads it once a pair and call, in front of its
// own memo, so the lock is taken ~10^5 times a plan, not at every one of the search's ~10^8 asks).
class BalanceCosts {
 public:
  struct Cost {
    bool valid = false;
    double seconds = 0;
  };
  // Hashed: every sequence asks at each step of every policy (10^6 sequences, ~10^5 pairs).
  struct Hash {
    std::size_t operator()(const std::pair<std::int64_t, int>& k) const {
      return std::hash<std::int64_t>()(k.first * 131071 + k.second);
    }
  };
  template <class V>
  using Map = std::unordered_map<std::pair<std::int64_t, int>, V, Hash>;
  std::mutex lock;
  Map<Cost> cost;
  Map<SequenceCost> full;
  // pow2's groups by (world, max_tokens_per_rank, lengths), each made once: the CLI plans pow2
  // beside dynamic, which makes pow2's groups again as a candidate (a sort and a placement of
  // every sequence). The first call makes them; one asking meanwhile waits for them.
  struct Pow2 {
    int world = 0;
    std::int64_t max_tokens_per_rank = 0;
    std::vector<std::int64_t> lengths;
    std::shared_future<std::vector<BalanceGroup>> groups;
  };
  std::vector<Pow2> pow2;
  // What the first input's costs depend on (balancer.cpp's cost_fingerprint): an input whose
  // fingerprint differs was given a memo made for another model.
  std::string fingerprint;
};

}  // namespace ulysses

namespace ulysses::balance_detail {

// The sizes validate_cp_config refuses at every length, by their error (cp_heads_error; "" where
// the heads allow the size), asked once a size: a2a with h heads refuses every size above h,
// most of a large world's size ladder, and formatting and throwing that error for each of
// thousands of lengths was a tenth of a plan. Calls may come from several threads at once.
class HeadsErrors {
 public:
  explicit HeadsErrors(const BalanceInput& in);
  const std::string& of(int size);  // stays valid: entries are only added

 private:
  const BalanceInput& in_;
  std::mutex lock_;
  std::unordered_map<int, std::string> by_size_;
};

// The fields of `in` a cost reads (not the step's lengths): all sequence_cost needs of it.
BalanceInput pricing_input(const BalanceInput& in);
// sequence_cost, the refusals every length shares read from `heads` (null: validated each time).
SequenceCost sequence_cost(const BalanceInput& in, std::int64_t length, int size, HeadsErrors* heads);

// sequence_cost memoised per (length, size): steps repeat lengths, and every policy asks often.
// The search asks every length at ~8 sizes an octave, so it keeps only the numbers it ranks by
// (a full SequenceCost, with its config and reason, is 10x larger); `full` memoises the whole
// cost for the (length, size) pairs a plan ends up using. A call's own memo answers every ask;
// one it lacks comes from in.costs when the caller shares one across worlds and policies (sizes
// inside the world only), else is priced, outside the lock: a cost is pure, so two calls pricing
// one pair at once keep equal numbers.
class CostTable {
 public:
  using Cost = BalanceCosts::Cost;
  explicit CostTable(const BalanceInput& in) : in_(in), shared_(in.costs), heads_(in) {}
  const Cost& at(std::int64_t length, int size) {
    auto [it, fresh] = own_.cost.try_emplace({length, size});
    if (fresh)
      it->second = through_shared(&BalanceCosts::cost, length, size, [&] { return fresh_cost(in_, length, size); });
    return it->second;
  }
  const Cost& of(std::size_t i, int size) { return at(in_.lengths[i], size); }
  // The table as one of several threads pricing at once reads it: its memo (which nobody writes
  // meanwhile), else the shared one or a fresh price, kept here until the table takes it (absorb).
  class Batch {
   public:
    // Its own copy of the inputs a cost reads: a memory_per_rank may keep state between calls
    // (the CLI's does), so no two threads may call one (balancer.hpp: an input a thread).
    explicit Batch(CostTable& table) : table_(table), in_(pricing_input(table.in_)) {}
    Cost at(std::int64_t length, int size) {
      if (const auto found = table_.own_.cost.find({length, size}); found != table_.own_.cost.end())
        return found->second;
      const Cost c = table_.through_shared(&BalanceCosts::cost, length, size,
                                           [&] { return table_.fresh_cost(in_, length, size); });
      fresh_.push_back({{length, size}, c});
      return c;
    }

   private:
    friend CostTable;
    CostTable& table_;
    BalanceInput in_;
    std::vector<std::pair<std::pair<std::int64_t, int>, Cost>> fresh_;
  };
  // Into the memo, once the batch's threads are done.
  void absorb(const Batch& b) {
    for (const auto& [key, cost] : b.fresh_) own_.cost.try_emplace(key, cost);
  }
  const SequenceCost& full(std::size_t i, int size) {
    const std::int64_t length = in_.lengths[i];
    auto [it, fresh] = own_.full.try_emplace({length, size});
    if (fresh)
      it->second =
          through_shared(&BalanceCosts::full, length, size, [&] { return sequence_cost(in_, length, size, &heads_); });
    return it->second;
  }

 private:
  Cost fresh_cost(const BalanceInput& in, std::int64_t length, int size) {  // heads_ is thread-safe
    const SequenceCost c = sequence_cost(in, length, size, &heads_);
    return {c.valid, c.seconds};
  }
  template <class V, class Price>
  V through_shared(BalanceCosts::Map<V> BalanceCosts::*map, std::int64_t length, int size, Price price) {
    if (!shared_ || size < 1 || size > in_.world) return price();
    {
      const std::lock_guard<std::mutex> hold(shared_->lock);
      const auto& m = (*shared_).*map;
      if (const auto found = m.find({length, size}); found != m.end()) return found->second;
    }
    V v = price();
    const std::lock_guard<std::mutex> hold(shared_->lock);
    return ((*shared_).*map).try_emplace({length, size}, std::move(v)).first->second;
  }
  const BalanceInput& in_;
  std::shared_ptr<BalanceCosts> shared_;
  BalanceCosts own_;
  HeadsErrors heads_;
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
// Loads of `world` ranks that grow by blocks, and for each power-of-two size c the aligned block
// [k·c, (k + 1)·c) inside the world whose busiest member's load is least, the lowest on ties:
// least_loaded over pow2's blocks, read from a tree (a max tree over the ranks, and over each
// level's nodes a tournament by (max, index)) in O(1), kept in O(c log world) an add.
class AlignedLoads {
 public:
  explicit AlignedLoads(int world);
  // load[r] += seconds for r in [first, first + size): an aligned block of a power-of-two size.
  void add(int first, int size, double seconds);
  // The least-loaded block of `size` (a power of two <= world), its busiest load in `busiest`.
  BalanceGroup least(int size, double* busiest) const;
  double load(int rank) const { return max_[leaves_ + std::size_t(rank)]; }

 private:
  // Of nodes j, k of the level of n nodes, the less loaded (the lower on ties).
  std::uint32_t pick(std::size_t n, std::uint32_t j, std::uint32_t k) const {
    return max_[n + k] < max_[n + j] ? k : j;
  }
  std::size_t world_, leaves_ = 1;
  std::vector<double> max_;                        // heap order: node v's children 2v, 2v + 1; the ranks at leaves_..
  std::vector<std::vector<std::uint32_t>> least_;  // by level (c = 2^level): tournament over its nodes
};
// Sequence indices by decreasing key, ties by index (keys not NaN). From kRadixFrom keys a radix
// sort, below a merge sort: the same order.
constexpr std::size_t kRadixFrom = 4096;
std::vector<std::size_t> decreasing(const std::vector<double>& key);
// Sequence indices by decreasing key, ties by index (decreasing's order), sorted a chunk at a
// time as they are read: the local search (balance_dynamic.cpp) reads the first few of 10^6
// before its budget ends.
class LazyDecreasing {
 public:
  explicit LazyDecreasing(const std::vector<double>& key) : keyed_(key.size()) {
    for (std::size_t i = 0; i < key.size(); ++i) keyed_[i] = {key[i], i};
  }
  // The index at place `at` of the order; places are read in increasing order.
  std::size_t operator[](std::size_t at) {
    if (at == sorted_) {
      auto before = [](const std::pair<double, std::size_t>& a, const std::pair<double, std::size_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      };
      const std::size_t upto = std::min(keyed_.size(), sorted_ + std::max<std::size_t>(1024, sorted_));
      const auto from = keyed_.begin() + std::ptrdiff_t(sorted_), to = keyed_.begin() + std::ptrdiff_t(upto);
      std::nth_element(from, to, keyed_.end(), before);
      std::sort(from, to, before);
      sorted_ = upto;
    }
    return keyed_[at].second;
  }

 private:
  std::vector<std::pair<double, std::size_t>> keyed_;
  std::size_t sorted_ = 0;
};

// Runs of bit-identical times: end[x] is the first rank after x whose time differs (or the size).
// Into `end`, whose storage is reused: at large worlds a fresh vector a state is a page-faulted mmap.
void run_ends(const std::vector<double>& times, std::vector<std::uint32_t>& end);
// The placements p.. q − 1 of `firsts` (ascending) whose windows of `size` ranks all lie in the
// run holding firsts[p]'s window, q returned (p + 1 when that window crosses runs): each of them
// reads the same values in the same order, so its busiest member and its sum are the same bits.
std::size_t same_window_end(const std::vector<int>& firsts, std::size_t p, int size,
                            const std::vector<std::uint32_t>& run_end);
// The least time of each block of kLeastBlock ranks, kept as ranks lo.. hi − 1 of `times` are
// set to `value` (a block inside them holds it; the others, at most two, are read again): scans
// pass over the blocks whose least time rules all their ranks out.
constexpr std::size_t kLeastBlock = 32;
inline void fill_least(const std::vector<double>& times, std::vector<double>& least, std::size_t lo, std::size_t hi,
                       double value) {
  for (std::size_t b = lo / kLeastBlock; b * kLeastBlock < hi; ++b) {
    const std::size_t from = b * kLeastBlock, to = std::min(times.size(), from + kLeastBlock);
    least[b] = from >= lo && to <= hi
                   ? value
                   : *std::min_element(times.begin() + std::ptrdiff_t(from), times.begin() + std::ptrdiff_t(to));
  }
}
// The first rank holding the least of `times`, through its blocks' least times.
inline std::size_t first_least(const std::vector<double>& times, const std::vector<double>& least) {
  const auto block = std::min_element(least.begin(), least.end());
  const auto from = times.begin() + (block - least.begin()) * std::ptrdiff_t(kLeastBlock);
  return std::size_t(std::find(from, times.end(), *block) - times.begin());
}

// The ranks' free times (or loads) as the dynamic policy's greedy scans read them, with the runs
// of equal times kept as groups fill them. While runs are few (steps of equal lengths, the first
// levels) a scan reads one window a class (balance_dynamic.cpp's for_each_class), the runs'
// starts kept in an ordered set (a fill erases those inside it and sets its two ends: no pass
// over the ranks a level, which at 65536 ranks would cost more than the scan); while most ranks
// differ, classes are single windows and a scan steps window by window, only the number of runs
// kept.
class Ranks {
 public:
  static constexpr std::size_t kBlock = kLeastBlock;
  explicit Ranks(int world) : times_(std::size_t(world), 0.0), least_((times_.size() + kBlock - 1) / kBlock, 0.0) {}
  const std::vector<double>& times() const { return times_; }
  void fill(int first, int size, double value) {
    const std::size_t lo = std::size_t(first), hi = lo + std::size_t(size);
    starts_count_ -= count_starts(lo, hi);
    std::fill(times_.begin() + std::ptrdiff_t(lo), times_.begin() + std::ptrdiff_t(hi), value);
    starts_count_ += count_starts(lo, hi);
    fill_least(times_, least_, lo, hi, value);
    if (classes_) {
      starts_.erase(starts_.upper_bound(std::uint32_t(lo)), starts_.lower_bound(std::uint32_t(hi)));
      for (std::size_t r : {lo, hi}) mark_start(r);
    }
    // Classes pay while runs are long (a set lookup a class against a window read a placement);
    // a margin keeps the mode from flapping.
    if (classes_ && 32 * starts_count_ > times_.size()) classes_ = false, starts_.clear();
    if (!classes_ && 64 * starts_count_ <= times_.size()) {
      classes_ = true;
      for (std::size_t r = 1; r < times_.size(); ++r) mark_start(r);
    }
  }
  // f(p) for each placement p of `firsts` a scan reads (one a class while classes are kept) until
  // f returns true; the mode is read once, not a placement.
  template <class F>
  void scan(const std::vector<int>& firsts, int size, F f) const {
    if (!classes_) {
      for (std::size_t p = 0; p < firsts.size(); ++p)
        if (f(p)) return;
      return;
    }
    for (std::size_t p = 0; p < firsts.size(); p = next(firsts, p, size))
      if (f(p)) return;
  }
  // The same, but while the times mostly differ (no classes) the placements whose first rank lies
  // in a block of kBlock ranks with a least time `skip` rules out are passed over (a window's
  // busiest member is at least its first rank's block's least time).
  template <class Skip, class F>
  void scan(const std::vector<int>& firsts, int size, Skip skip, F f) const {
    scan(firsts, size, skip, f, [&](std::size_t p, std::size_t q) {
      for (; p < q; ++p)
        if (f(p)) return true;
      return false;
    });
  }
  // The same, but while the times mostly differ a block's placements p.. q − 1 that the skip
  // leaves are read at once, by block(p, q) (true: stop): a caller may score them without a
  // branch a placement.
  template <class Skip, class F, class Block>
  void scan(const std::vector<int>& firsts, int size, Skip skip, F f, Block block) const {
    if (classes_) return scan(firsts, size, f);
    for (std::size_t p = 0; p < firsts.size();) {
      const std::size_t b = std::size_t(firsts[p]) / kBlock;
      const int next = int((b + 1) * kBlock);
      // Placements are distinct ranks: the block's are at most next − firsts[p].
      std::size_t q = std::min(firsts.size(), p + std::size_t(next - firsts[p]));
      if (firsts[q - 1] >= next)
        q = std::size_t(std::lower_bound(firsts.begin() + std::ptrdiff_t(p), firsts.begin() + std::ptrdiff_t(q), next) -
                        firsts.begin());
      if (!skip(least_[b]) && block(p, q)) return;
      p = q;
    }
  }
  std::size_t first_least() const { return balance_detail::first_least(times_, least_); }

 private:
  // The first placement after p whose window may read other values than p's (same_window_end).
  std::size_t next(const std::vector<int>& firsts, std::size_t p, int size) const {
    if (!classes_) return p + 1;
    const auto after = starts_.upper_bound(std::uint32_t(firsts[p]));
    const std::int64_t run_end = after == starts_.end() ? std::int64_t(times_.size()) : std::int64_t(*after);
    if (firsts[p] > run_end - size) return p + 1;
    return std::size_t(std::upper_bound(firsts.begin() + std::ptrdiff_t(p), firsts.end(), run_end - size) -
                       firsts.begin());
  }
  bool starts_run(std::size_t r) const { return r > 0 && r < times_.size() && times_[r] != times_[r - 1]; }
  void mark_start(std::size_t r) {
    if (starts_run(r))
      starts_.insert(std::uint32_t(r));
    else
      starts_.erase(std::uint32_t(r));
  }
  // Ranks r in [lo, hi] that start a run (0 < r < world, a time other than rank r − 1's).
  std::size_t count_starts(std::size_t lo, std::size_t hi) const {
    std::size_t b = 0;
    for (std::size_t r = std::max<std::size_t>(lo, 1); r <= hi && r < times_.size(); ++r) b += starts_run(r);
    return b;
  }
  std::vector<double> times_;
  std::vector<double> least_;       // by block of kBlock ranks: the least time
  std::set<std::uint32_t> starts_;  // while classes_: every r that starts_run
  std::size_t starts_count_ = 0;
  bool classes_ = true;  // all ranks free at 0: one run
};

// greedy_child's key of a group of one rank free at x: its end x + seconds, the step's bound once
// it runs (the latest end, and with the area term the total plus the rest's least rank·seconds
// over world) and the total of free times, t = (total + end) − x, each rounded as greedy_child
// rounds them. Of n <= kLeastBlock ranks free at x[0.. n), the first whose (bound, total) is
// least: scored in passes without a branch a rank (vectorised), where a scan rank by rank
// mispredicts its early exits.
struct SinglePick {
  std::size_t at = 0;
  double bound = 0, total = 0, end = 0, area = 0;
};
inline SinglePick least_single(const double* x, std::size_t n, double most, double total, double seconds, double rest,
                               double world, bool area_bound) {
  double bound[kLeastBlock], tot[kLeastBlock];
  if (area_bound) {
    for (std::size_t j = 0; j < n; ++j) {
      const double end = x[j] + seconds;
      tot[j] = total + end - x[j];
      bound[j] = std::max(std::max(most, end), (tot[j] + rest) / world);
    }
  } else {
    for (std::size_t j = 0; j < n; ++j) {
      const double end = x[j] + seconds;
      tot[j] = total + end - x[j];
      bound[j] = std::max(most, end);
    }
  }
  // The least bound, then the least total at it, each over 4 lanes (no chain of dependent
  // compares; padded to a multiple of 4 with +inf, which is no rank's), then its first rank.
  constexpr double inf = std::numeric_limits<double>::infinity();
  const std::size_t n4 = (n + 3) & ~std::size_t(3);
  for (std::size_t j = n; j < n4; ++j) bound[j] = tot[j] = inf;
  double lane[4] = {inf, inf, inf, inf};
  for (std::size_t j = 0; j < n4; j += 4)
    for (std::size_t l = 0; l < 4; ++l) lane[l] = bound[j + l] < lane[l] ? bound[j + l] : lane[l];
  const double b = std::min(std::min(lane[0], lane[1]), std::min(lane[2], lane[3]));
  for (double& v : lane) v = inf;
  for (std::size_t j = 0; j < n4; j += 4)
    for (std::size_t l = 0; l < 4; ++l) lane[l] = ((bound[j + l] == b) & (tot[j + l] < lane[l])) ? tot[j + l] : lane[l];
  const double t = std::min(std::min(lane[0], lane[1]), std::min(lane[2], lane[3]));
  std::size_t at = 0;
  while (!(bound[at] == b && tot[at] == t)) ++at;
  const double end = x[at] + seconds;
  return {at, b, t, end, area_bound ? (t + rest) / world : 0.0};
}

// lpt_choice's key of a group of one rank free at x (its load): its end x + seconds, rounded.
// Of n <= kLeastBlock ranks at x[0.. n), the first whose end is least, and whether one holds
// `least` (lpt_choice's scan of the size stops there: no later rank ends earlier), in passes
// without a branch a rank, as least_single.
struct EndPick {
  std::size_t at = 0;
  double end = 0;
  bool holds_least = false;
};
inline EndPick least_end(const double* x, std::size_t n, double seconds, double least) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double end[kLeastBlock];
  bool hit = false;
  for (std::size_t j = 0; j < n; ++j) end[j] = x[j] + seconds, hit |= x[j] == least;
  const std::size_t n4 = (n + 3) & ~std::size_t(3);
  for (std::size_t j = n; j < n4; ++j) end[j] = inf;
  double lane[4] = {inf, inf, inf, inf};
  for (std::size_t j = 0; j < n4; j += 4)
    for (std::size_t l = 0; l < 4; ++l) lane[l] = end[j + l] < lane[l] ? end[j + l] : lane[l];
  const double e = std::min(std::min(lane[0], lane[1]), std::min(lane[2], lane[3]));
  std::size_t at = 0;
  while (end[at] != e) ++at;
  return {at, e, hit};
}

// A floor of the total greedy_child gives a group of one rank at free time x, for every x in
// [0, most]: t = (total + end) − x with end = x + seconds, each rounded to nearest. While
// total + most + seconds stays in total's binade (of ulp u), end is within (most + seconds)·2^-53
// of x + seconds and the two other roundings within u / 2 each, so t is a multiple of u no
// lower than total + seconds − u − that: the floor is the least such multiple (less a sliver), which
// the ranks whose rounding goes down reach. −1 (below every total) outside those conditions.
double least_single_total(double total, double most, double seconds);

// A step's distinct lengths, in order of first appearance, and each sequence's among them: work
// that depends only on the length (its options, its size under pow2) done once a length.
struct LengthIds {
  std::vector<std::int64_t> lengths;  // distinct
  std::vector<std::uint32_t> of;      // of[i]: the index of sequence i's length in `lengths`
};
LengthIds length_ids(const std::vector<std::int64_t>& lengths);

// Runs every job, on up to `threads` threads (this one among them), and rethrows the first
// failed job's exception (in job order) once all have run.
void run_jobs(const std::vector<std::function<void()>>& jobs, int threads);

// The baselines' groups (static's, pow2's when feasible) for the input given (the caller's, or on
// another thread a copy of it: its memory_per_rank may keep state), priced on the table given.
using Baselines = std::function<std::vector<std::vector<BalanceGroup>>(const BalanceInput&, CostTable&)>;
// The dynamic policy's groups; the baselines are candidates too. With in.threads > 1 and a shared
// memo (in.costs) the baselines are made beside the options, on an input and a CostTable of
// their own.
std::vector<BalanceGroup> dynamic_groups(const BalanceInput& in, CostTable& costs, const Baselines& baselines);

}  // namespace ulysses::balance_detail
