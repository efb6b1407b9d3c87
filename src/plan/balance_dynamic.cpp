// The dynamic policy's search (balancer.cpp's top comment says what and why).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "balance_detail.hpp"

#include <fmt/format.h>

#include "ulysses/core/error.hpp"

namespace ulysses::balance_detail {

namespace {

struct Option {
  BalanceGroup group;
  double seconds = 0;
};

// A length's options: each size it may use, at each placement of that size. Placements depend
// only on the size, so a list keeps (size, seconds) pairs and reads the placements from a table
// shared by all lengths: a few hundred bytes a length instead of 16 a placement (hundreds of
// placements a size at large worlds).
struct SizeOption {
  int size = 0;
  double seconds = 0;
  std::uint32_t end = 0;  // options up to and including this size's
};
using Placements = std::vector<std::vector<int>>;  // by size: placements(cluster, world, size)

class OptionList {
 public:
  class Iter {
   public:
    Iter(const OptionList* l, std::size_t s) : l_(l), s_(s) {}
    Option operator*() const { return l_->at(s_, p_); }
    Iter& operator++() {
      if (++p_ == (*l_->firsts_)[std::size_t((*l_->sizes_)[s_].size)].size()) ++s_, p_ = 0;
      return *this;
    }
    bool operator!=(const Iter& o) const { return s_ != o.s_ || p_ != o.p_; }

   private:
    const OptionList* l_;
    std::size_t s_, p_ = 0;
  };
  OptionList(const std::vector<SizeOption>& sizes, const Placements& firsts) : sizes_(&sizes), firsts_(&firsts) {}
  std::size_t size() const { return sizes_->empty() ? 0 : sizes_->back().end; }
  bool empty() const { return sizes_->empty(); }
  Iter begin() const { return {this, 0}; }
  Iter end() const { return {this, sizes_->size()}; }
  Option back() const { return at(sizes_->size() - 1, (*firsts_)[std::size_t(sizes_->back().size)].size() - 1); }
  // f(first option index, size, seconds, placements) for each size, in option order.
  template <class F>
  void for_each_size(F f) const {
    std::size_t k = 0;
    for (const SizeOption& o : *sizes_) {
      f(k, o.size, o.seconds, (*firsts_)[std::size_t(o.size)]);
      k = o.end;
    }
  }
  Option operator[](std::size_t k) const {
    const auto s = std::upper_bound(sizes_->begin(), sizes_->end(), k,
                                    [](std::size_t k, const SizeOption& o) { return k < o.end; });
    return at(std::size_t(s - sizes_->begin()), k - (s == sizes_->begin() ? 0 : std::prev(s)->end));
  }

 private:
  Option at(std::size_t s, std::size_t p) const {
    const SizeOption& o = (*sizes_)[s];
    return {{(*firsts_)[std::size_t(o.size)][p], o.size}, o.seconds};
  }
  const std::vector<SizeOption>* sizes_;
  const Placements* firsts_;
};

// Each sequence's options. They depend only on its length, so each distinct length's list is
// kept once (real steps repeat a few thousand lengths over up to millions of sequences), read
// through the step's LengthIds.
class Options {
 public:
  Options(const Placements& firsts, const std::vector<std::uint32_t>& list_of,
          std::vector<std::vector<SizeOption>> lists)
      : firsts_(&firsts), list_of_(&list_of), lists_(std::move(lists)) {}
  OptionList operator[](std::size_t i) const { return {lists_[(*list_of_)[i]], *firsts_}; }
  std::size_t size() const { return list_of_->size(); }

 private:
  const Placements* firsts_;
  const std::vector<std::uint32_t>* list_of_;
  std::vector<std::vector<SizeOption>> lists_;
};

// f(option, k, count) for the options k.. k + count − 1 of `list`, the first standing for all:
// placements of one size whose windows lie in one run of equal free times (`run_end`, see
// run_ends) end at the same time and add the same total, whatever their place. Free times are
// runs (ranks no sequence has reached yet, groups filled at once), so a list of every placement
// (hundreds of thousands at large worlds) is read as a few classes.
template <class F>
void for_each_class(const OptionList& list, const std::vector<std::uint32_t>& run_end, F f) {
  list.for_each_size([&](std::size_t k0, int size, double seconds, const std::vector<int>& firsts) {
    for (std::size_t p = 0; p < firsts.size();) {
      const std::size_t q = same_window_end(firsts, p, size, run_end);
      f(Option{{firsts[p], size}, seconds}, k0 + p, q - p);
      p = q;
    }
  });
}

// Every size up to 16, then sizes with at most 4 significant bits, then world: ~8 per octave.
std::vector<int> size_ladder(int world) {
  std::vector<int> sizes;
  for (int c = 1; c <= world; ++c)
    if (c <= 16 || (c >> __builtin_ctz(unsigned(c))) < 16 || c == world) sizes.push_back(c);
  return sizes;
}

// A length's candidate (size, placement) options, price(c) its cost on c ranks: see the top of
// the file. Above 16 ranks the sizes also stop once the sequence takes at most `enough` seconds
// (half a lower bound of the step: faster only burns ranks).
template <class Price>
std::vector<SizeOption> options_of(const BalanceInput& in, Price price, const std::vector<int>& ladder,
                                   const Placements& firsts, double enough) {
  std::vector<SizeOption> out;
  double base_area = 0, fastest = 0;
  for (int c : ladder) {
    const CostTable::Cost cost = price(c);
    if (!cost.valid || (!out.empty() && cost.seconds >= fastest)) continue;
    if (out.empty()) base_area = cost.seconds * c;
    fastest = cost.seconds;
    const std::size_t placed = firsts[std::size_t(c)].size();
    if (placed > 0) out.push_back({c, cost.seconds, std::uint32_t((out.empty() ? 0 : out.back().end) + placed)});
    if (in.world > 16 && (base_area < 0.2 * cost.seconds * c || cost.seconds <= enough)) break;
  }
  return out;
}

// A lower bound of any plan's step: every sequence's work on its smallest runnable group, over
// world (the smallest group has the least rank·seconds up to communication, which only adds).
double area_bound(const BalanceInput& in, CostTable& costs, const LengthIds& ids, const std::vector<int>& ladder) {
  std::vector<double> least(ids.lengths.size(), 0.0);  // by length: rank·seconds on its smallest group
  for (std::size_t d = 0; d < ids.lengths.size(); ++d)
    for (int c : ladder)
      if (const CostTable::Cost& cost = costs.at(ids.lengths[d], c); cost.valid) {
        least[d] = cost.seconds * c;
        break;
      }
  double area = 0;
  for (const std::uint32_t d : ids.of) area += least[d];  // in index order, as the sum always was
  return area / double(in.world);
}

// LPT's choice for one sequence: the option ending earliest on `load`, ties to less rank·seconds,
// then to the first. Sizes are read fastest first, so that the best end is low early: no
// window's busiest member is below `least` (the least load), so a size whose seconds end past the
// best even there is skipped (on nearly level loads, the many placements of the small sizes),
// a window as soon as a member ends past the best, and a size's scan at its first window whose
// busiest member is `least`: no later one of that size ends earlier.
struct LptSize {
  std::size_t k0;
  int size;
  double seconds;
  const std::vector<int>* firsts;
};
using LptSizes = std::array<LptSize, 128>;  // size_ladder has at most 113 sizes (world 65536)

// `list`'s sizes into `sizes`, fastest first (in option order on ties), and their count.
std::size_t fastest_first(const OptionList& list, LptSizes& sizes) {
  std::size_t count = 0;
  list.for_each_size([&](std::size_t k0, int size, double seconds, const std::vector<int>& firsts) {
    sizes[count++] = {k0, size, seconds, &firsts};
  });
  for (std::size_t z = 1; z < count; ++z)  // a stable insertion sort: a few sizes, no buffer to allocate
    for (std::size_t y = z; y > 0 && sizes[y].seconds < sizes[y - 1].seconds; --y) std::swap(sizes[y], sizes[y - 1]);
  return count;
}

// The times of the one-rank placements p.. q − 1 (in one block): read in place where they are
// consecutive ranks, else gathered into `gathered`.
const double* block_times(const std::vector<double>& times, const std::vector<int>& firsts, std::size_t p,
                          std::size_t q, double* gathered) {
  if (std::size_t(firsts[q - 1] - firsts[p]) == q - 1 - p) return times.data() + firsts[p];
  for (std::size_t j = p; j < q; ++j) gathered[j - p] = times[std::size_t(firsts[j])];
  return gathered;
}

Option lpt_choice(const OptionList& list, const Ranks& ranks, double least) {
  LptSizes sizes;
  const std::size_t count = fastest_first(list, sizes);
  Option best;
  double best_end = -1, best_area = 0;
  std::size_t best_k = 0;
  // The option order's key: (end, rank·seconds, index in the list).
  auto before = [&](double end, double area, std::size_t k) {
    return best_end < 0 || end < best_end ||
           (end == best_end && (area < best_area || (area == best_area && k < best_k)));
  };
  const std::vector<double>& load = ranks.times();
  for (std::size_t z = 0; z < count; ++z) {
    // Named copies, not structured bindings: clang before 16 cannot capture those in a lambda.
    const std::size_t k0 = sizes[z].k0;
    const int size = sizes[z].size;
    const double seconds = sizes[z].seconds;
    const auto* const firsts = sizes[z].firsts;
    const double area = seconds * size;
    if (!before(least + seconds, area, k0)) continue;
    auto visit = [&](std::size_t p) {
      const double* x = load.data() + (*firsts)[p];
      double m = x[0];
      bool lost = false;
      for (int r = 1; r < size && !lost; ++r) m = std::max(m, x[r]), lost = best_end >= 0 && m + seconds > best_end;
      if (!lost && before(m + seconds, area, k0 + p))
        best = {{(*firsts)[p], size}, seconds}, best_end = m + seconds, best_area = area, best_k = k0 + p;
      return m == least;
    };
    // A window whose first rank's block's least load ends past the best, or at it with more
    // rank·seconds, is no better choice.
    auto cannot_win = [&](double x) {
      return best_end >= 0 && (x + seconds > best_end || (x + seconds == best_end && area > best_area));
    };
    if (size > 1) {
      ranks.scan(*firsts, size, cannot_win, visit);
      continue;
    }
    // One rank: a block's ranks read at once (least_end), the same pick as visit's in turn (the
    // ranks after the least one end no earlier, and come later).
    ranks.scan(*firsts, size, cannot_win, visit, [&](std::size_t p, std::size_t q) {
      double gathered[kLeastBlock];
      const EndPick e = least_end(block_times(load, *firsts, p, q, gathered), q - p, seconds, least);
      if (before(e.end, area, k0 + p + e.at))
        best = {{(*firsts)[p + e.at], 1}, seconds}, best_end = e.end, best_area = area, best_k = k0 + p + e.at;
      return e.holds_least;
    });
  }
  return best;
}

std::vector<BalanceGroup> lpt_groups(const BalanceInput& in, const Options& options) {
  const std::size_t n = options.size();
  std::vector<double> fastest(n);
  for (std::size_t i = 0; i < n; ++i) fastest[i] = options[i].back().seconds;
  Ranks load(in.world);
  // The least load, kept by blocks of 64 ranks: LPT fills the least-loaded ranks at almost every
  // step, and a pass over all ranks for the new least cost as much as the choice.
  const std::vector<double>& t = load.times();
  std::vector<double> block_least((t.size() + 63) / 64, 0.0);
  std::vector<BalanceGroup> groups(n);
  double least = 0;
  for (std::size_t i : decreasing(fastest)) {
    const Option best = lpt_choice(options[i], load, least);
    groups[i] = best.group;
    const auto first = t.begin() + best.group.first_rank, last = first + best.group.size;
    load.fill(best.group.first_rank, best.group.size, *std::max_element(first, last) + best.seconds);
    for (std::size_t b = std::size_t(best.group.first_rank) / 64; b * 64 < std::size_t(last - t.begin()); ++b)
      block_least[b] = *std::min_element(t.begin() + std::ptrdiff_t(b * 64),
                                         t.begin() + std::ptrdiff_t(std::min(t.size(), b * 64 + 64)));
    least = *std::min_element(block_least.begin(), block_least.end());
  }
  return groups;
}

// `groups`' sizes placed again in index order, each where its members are free earliest.
std::vector<BalanceGroup> index_order_groups(const BalanceInput& in, const Placements& firsts,
                                             const std::vector<BalanceGroup>& sized,
                                             const std::vector<double>& seconds) {
  std::vector<double> free(std::size_t(in.world), 0.0);
  std::vector<double> least((free.size() + kLeastBlock - 1) / kLeastBlock, 0.0);
  std::vector<BalanceGroup> groups;
  for (std::size_t i = 0; i < sized.size(); ++i) {
    const int size = sized[i].size;
    const std::vector<int>& at = firsts[std::size_t(size)];
    double start = 0;
    if (size == 1 && at.size() == free.size()) {  // every rank a placement: the first least
      const std::size_t rank = first_least(free, least);
      groups.push_back({int(rank), 1});
      start = free[rank];
    } else {
      groups.push_back(least_loaded(free, at, size, &start));
    }
    const std::size_t lo = std::size_t(groups[i].first_rank), hi = lo + std::size_t(size);
    std::fill(free.begin() + std::ptrdiff_t(lo), free.begin() + std::ptrdiff_t(hi), start + seconds[i]);
    fill_least(free, least, lo, hi, start + seconds[i]);
  }
  return groups;
}

std::vector<double> seconds_of(const std::vector<BalanceGroup>& groups, CostTable& costs) {
  std::vector<double> s;
  for (std::size_t i = 0; i < groups.size(); ++i) s.push_back(costs.of(i, groups[i].size).seconds);
  return s;
}

// The most rank-steps (option × member evaluations) the beam search may spend, and its widest beam.
constexpr double kBeamBudget = 2e7;
constexpr std::size_t kMaxBeam = 1024;

// Beam search over the sequences in index order (the execution order, so every partial schedule
// is exact): each state is the ranks' free times; a child places the next sequence on one of its
// options; states rank by a lower bound on their final step time (the busiest rank, or all ranks'
// time plus the least rank·seconds the remaining sequences need, over world), then by total free
// time. Identical states are kept once: a state's hash is a sum over ranks, so a child's is its
// parent's updated on the group's ranks, not read from a world of free times.
std::uint64_t rank_hash(std::size_t rank, double x) {
  std::uint64_t z = 0;
  std::memcpy(&z, &x, sizeof z);
  z += 0x9e3779b97f4a7c15ull * (rank + 1);  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
std::uint64_t hash_of(const std::vector<double>& v) {
  std::uint64_t h = 0;
  for (std::size_t r = 0; r < v.size(); ++r) h += rank_hash(r, v[r]);
  return h;
}

// The (up to) 4 longest of sequences i.. n-1, longest first, in a fixed array: no allocation
// per sequence.
struct Longest {
  std::array<std::uint32_t, 5> at{};
  std::uint32_t count = 0;
};

// What the beam search is sized by, computed once from the options: the least rank·seconds the
// remaining sequences need, the few longest sequences still to come (the look-ahead bound's),
// whether that bound is affordable, and the beam's width under the budget.
struct BeamShape {
  std::vector<double> rest;  // least rank·seconds of sequences i.. n-1
  std::vector<Longest> longest_after;
  bool look_ahead = false;
  std::size_t width = 1;
};

BeamShape beam_shape(const BalanceInput& in, const Options& options) {
  const std::size_t n = options.size(), world = std::size_t(in.world);
  BeamShape shape;
  std::vector<double>& rest = shape.rest;
  rest.assign(n + 1, 0.0);
  double work = 0;
  for (std::size_t i = n; i-- > 0;) {
    double least = -1;  // placements of a size cost alike: one a size
    options[i].for_each_size([&](std::size_t, int size, double seconds, const std::vector<int>&) {
      least = least < 0 ? seconds * size : std::min(least, seconds * size);
    });
    rest[i] = rest[i + 1] + least;
    work += double(options[i].size()) * (double(options[i].back().group.size) + 8) + double(world);
  }
  // On small steps the bound also looks ahead: a later sequence j cannot start on c ranks before
  // the c-th earliest free time, so the step lasts at least min over c of that plus t_j(c); the
  // few longest sequences still to come are checked. It costs a sort of the free times and a
  // scan of those sequences' options per child, so it is used only while it leaves a wide beam.
  double ahead_work = 0;  // per beam state, over all levels
  for (std::size_t i = 0; i < n; ++i)
    ahead_work +=
        double(options[i].size()) * (double(world) * std::log2(double(world) + 1) + 4.0 * double(options[i].size()));
  shape.look_ahead = kBeamBudget / (work + ahead_work) >= 16;
  shape.width =
      std::clamp<std::size_t>(std::size_t(kBeamBudget / std::max(1.0, shape.look_ahead ? work + ahead_work : work)), 1,
                              kMaxBeam);
  shape.longest_after.resize(n + 1);
  for (std::size_t i = n; i-- > 0;) {
    // i goes after every sequence at least as long (a stable insertion); a fifth drops out.
    Longest l = shape.longest_after[i + 1];
    const auto end = l.at.begin() + l.count;
    const auto at = std::upper_bound(l.at.begin(), end, std::uint32_t(i), [&](std::uint32_t a, std::uint32_t b) {
      return options[a].back().seconds > options[b].back().seconds;
    });
    std::copy_backward(at, end, end + 1);
    *at = std::uint32_t(i);
    l.count = std::min<std::uint32_t>(l.count + 1, 4);
    shape.longest_after[i] = l;
  }
  return shape;
}

// The look-ahead bound of a state whose ranks are free at `free`: no sequence from `from` on can
// end before its best option's start on the earliest free ranks plus its time there.
double ahead(const BeamShape& shape, const Options& options, std::vector<double> free, std::size_t from) {
  std::sort(free.begin(), free.end());
  double lb = 0;
  const Longest& l = shape.longest_after[from];
  for (std::uint32_t k = 0; k < l.count; ++k) {
    double least = -1;
    options[l.at[k]].for_each_size([&](std::size_t, int size, double seconds, const std::vector<int>&) {
      const double t = free[std::size_t(size - 1)] + seconds;
      least = least < 0 ? t : std::min(least, t);
    });
    lb = std::max(lb, least);
  }
  return lb;
}

// The groups of the best final state (the first kept), walked back through the trail.
template <class Step>
std::vector<BalanceGroup> groups_of(const Options& options, const std::vector<std::vector<Step>>& trail) {
  std::vector<BalanceGroup> groups(options.size());
  std::size_t at = 0;
  for (std::size_t i = options.size(); i-- > 0;) {
    groups[i] = options[i][trail[i][at].option].group;
    at = trail[i][at].parent;
  }
  return groups;
}

// A state of the beam: when each rank is free, the latest of those, and the sum of their times.
struct BeamState {
  std::vector<double> free;
  double most = 0, total = 0;
  std::uint64_t hash = 0;  // hash_of(free)
};
// States not yet made: options option.. option + count − 1 of a parent (one class, see
// for_each_class: the same bound and total), scored from the parent without copying it.
struct BeamChild {
  double bound, total;
  std::size_t parent, option, count;
};
// How a kept state was reached: its parent in the level before and the option taken.
struct BeamStep {
  std::size_t parent, option;
};

// Every child of the beam at sequence i: each state extended by each of i's options, scored by
// the bound the search ranks by.
std::vector<BeamChild> beam_children(const BeamShape& shape, const Options& options, const std::vector<BeamState>& beam,
                                     std::size_t i, bool area_bound) {
  const std::size_t n = options.size(), world = beam[0].free.size();
  std::vector<BeamChild> children;
  std::vector<std::uint32_t> run_end;
  for (std::size_t b = 0; b < beam.size(); ++b) {
    run_ends(beam[b].free, run_end);
    for_each_class(options[i], run_end, [&](const Option& o, std::size_t k, std::size_t count) {
      const auto first = beam[b].free.begin() + o.group.first_rank, last = first + o.group.size;
      const double end = *std::max_element(first, last) + o.seconds;
      const double total = beam[b].total + end * o.group.size - std::accumulate(first, last, 0.0);
      const double most = std::max(beam[b].most, end);
      double bound = area_bound ? std::max(most, (total + shape.rest[i + 1]) / double(world)) : most;
      if (area_bound && shape.look_ahead && i + 1 < n) {  // the class's free times sort alike
        std::vector<double> free = beam[b].free;
        std::fill(free.begin() + o.group.first_rank, free.begin() + o.group.first_rank + o.group.size, end);
        bound = std::max(bound, ahead(shape, options, std::move(free), i + 1));
      }
      children.push_back({bound, total, b, k, count});
    });
  }
  return children;
}

// The next level: the best `width` distinct states among the children, made in order; how each
// was reached goes to `steps`. States reuse the storage of those in `spare` (a world of free times
// each: fresh ones would be page-faulted afresh at every level).
std::vector<BeamState> beam_level(std::vector<BeamChild>& children, const std::vector<BeamState>& beam,
                                  const OptionList& level, std::size_t width, std::vector<BeamStep>& steps,
                                  std::vector<BeamState>& spare) {
  // By bound, then total, then as made (a total order: the stable sort's), sorted only as far
  // as the beam reads: a level keeps `width` states of many children, on large steps one.
  auto before = [](const BeamChild& a, const BeamChild& b) {
    if (a.bound != b.bound) return a.bound < b.bound;
    if (a.total != b.total) return a.total < b.total;
    return a.parent != b.parent ? a.parent < b.parent : a.option < b.option;
  };
  std::size_t sorted = std::min(children.size(), 2 * width);
  std::partial_sort(children.begin(), children.begin() + std::ptrdiff_t(sorted), children.end(), before);
  std::vector<BeamState> next;
  std::map<std::uint64_t, std::vector<std::size_t>> kept;  // hash of free times -> states in next
  for (std::size_t at = 0; at < children.size() && next.size() < width; ++at) {
    if (at == sorted)
      std::sort(children.begin() + std::ptrdiff_t(at), children.end(), before), sorted = children.size();
    const BeamChild& c = children[at];
    for (std::size_t k = c.option; k < c.option + c.count && next.size() < width; ++k) {
      const Option& o = level[k];
      BeamState s;
      if (!spare.empty()) s = std::move(spare.back()), spare.pop_back();
      s.free.assign(beam[c.parent].free.begin(), beam[c.parent].free.end());
      s.total = c.total;
      s.hash = beam[c.parent].hash;
      const std::size_t lo = std::size_t(o.group.first_rank), hi = lo + std::size_t(o.group.size);
      const double end =
          *std::max_element(s.free.begin() + std::ptrdiff_t(lo), s.free.begin() + std::ptrdiff_t(hi)) + o.seconds;
      for (std::size_t r = lo; r < hi; ++r) s.hash += rank_hash(r, end) - rank_hash(r, s.free[r]), s.free[r] = end;
      s.most = std::max(beam[c.parent].most, end);  // only the group's times move, up to `end`
      std::vector<std::size_t>& same = kept[s.hash];
      if (std::any_of(same.begin(), same.end(), [&](std::size_t j) { return next[j].free == s.free; })) {
        spare.push_back(std::move(s));
        continue;
      }
      same.push_back(next.size());
      steps.push_back({c.parent, k});
      next.push_back(std::move(s));
    }
  }
  return next;
}

// The beam of width 1 (large steps: most of the search's time at the planner's limits) without
// the children: the one state's best child by the beam's order (bound, then total, then the
// first option), the same choice beam_level makes, found by reading each option's window
// directly and skipping what cannot win. A size is skipped when a lower bound of its every
// child already loses: its options' totals are at least total + size·seconds (the idle time
// inside a window only adds), less a margin far above the rounding of the expression; a
// placement, as soon as its window's latest member puts its end past the best bound; and while
// runs of equal free times are few, every window of a class after its first (see Ranks).
struct GreedyBest {
  double bound = 0, total = 0, end = 0;
  BalanceGroup group;
  bool any = false;
  bool by_area = false;  // bound is the area term of total: a child of no less total has no less bound
  bool beats(double b, double t) const { return !any || b < bound || (b == bound && t < total); }
};

// The best child of the state (free, most, total) at sequence i, into `best`.
void greedy_child(const BeamShape& shape, const OptionList& list, const Ranks& ranks, double most, double total,
                  std::size_t i, bool area_bound, GreedyBest& best) {
  const std::vector<double>& free = ranks.times();
  const double world = double(free.size()), rest = shape.rest[i + 1];
  list.for_each_size([&](std::size_t, int size, double seconds, const std::vector<int>& firsts) {
    const double c = double(size);
    const double least_total = total + c * seconds - 1e-12 * (c + 4) * (total + 2 * c * (most + seconds) + 1);
    const double least_most = std::max(most, seconds);
    const double least = area_bound ? std::max(least_most, (least_total + rest) / world) : least_most;
    if (best.any && (least > best.bound || (least >= best.bound && least_total > best.total))) return;
    auto visit = [&](std::size_t p) {
      const double* x = free.data() + firsts[p];
      double m = x[0];
      bool lost = false;
      for (int r = 1; r < size && !lost; ++r) m = std::max(m, x[r]), lost = best.any && m + seconds > best.bound;
      const double end = m + seconds, next_most = std::max(most, end);
      if (lost || (best.any && next_most > best.bound)) return;
      const double t = total + end * size - std::accumulate(x, x + size, 0.0);
      if (best.by_area && t >= best.total) return;  // its area term, so its bound, is no less: no division
      const double area = area_bound ? (t + rest) / world : 0.0;
      const double bound = area_bound ? std::max(next_most, area) : next_most;
      if (best.beats(bound, t)) best = {bound, t, end, {firsts[p], size}, true, area_bound && bound == area};
    };
    // A window's bound is at least its end's, so at least its first rank's block's least time
    // plus seconds; for one rank, also at least the floor total's (least_single_total, −1 where
    // unknown or for more ranks), its total at least that floor: a block whose least time gives
    // no more than a tie with the best cannot win (a tie goes to the first).
    const double floor_total = size == 1 ? least_single_total(total, most, seconds) : -1.0;
    const double floor_area = (floor_total + rest) / world;
    auto cannot_win = [&](double x) {
      const double b = std::max(most, x + seconds);
      const double lb = area_bound && floor_total >= 0 ? std::max(b, floor_area) : b;
      return best.any && (lb > best.bound || (lb == best.bound && floor_total >= best.total));
    };
    auto one = [&](std::size_t p) { return visit(p), false; };
    if (size > 1) return ranks.scan(firsts, size, cannot_win, one);
    // One rank: a block's ranks scored at once (least_single), the same pick as visit's in turn.
    ranks.scan(firsts, size, cannot_win, one, [&](std::size_t p, std::size_t q) {
      double gathered[kLeastBlock];
      const double* x = block_times(free, firsts, p, q, gathered);
      const SinglePick s = least_single(x, q - p, most, total, seconds, rest, world, area_bound);
      if (best.beats(s.bound, s.total))
        best = {s.bound, s.total, s.end, {firsts[p + s.at], 1}, true, area_bound && s.bound == s.area};
      return false;
    });
  });
}

std::vector<BalanceGroup> greedy_groups(const BeamShape& shape, const Options& options, int world, bool area_bound) {
  Ranks free(world);
  double most = 0, total = 0;
  std::vector<BalanceGroup> groups(options.size());
  for (std::size_t i = 0; i < options.size(); ++i) {
    GreedyBest best;
    greedy_child(shape, options[i], free, most, total, i, area_bound, best);
    groups[i] = best.group;
    free.fill(best.group.first_rank, best.group.size, best.end);
    most = std::max(most, best.end);
    total = best.total;
  }
  return groups;
}

std::vector<BalanceGroup> beam_groups(const BalanceInput& in, const Options& options, bool area_bound) {
  const BeamShape shape = beam_shape(in, options);
  if (shape.width == 1 && !(area_bound && shape.look_ahead)) return greedy_groups(shape, options, in.world, area_bound);
  std::vector<BeamState> beam(1), spare;
  beam[0].free.assign(std::size_t(in.world), 0.0);
  beam[0].hash = hash_of(beam[0].free);
  std::vector<std::vector<BeamStep>> trail(options.size());
  for (std::size_t i = 0; i < options.size(); ++i) {
    std::vector<BeamChild> children = beam_children(shape, options, beam, i, area_bound);
    std::vector<BeamState> next = beam_level(children, beam, options[i], shape.width, trail[i], spare);
    for (BeamState& s : beam) spare.push_back(std::move(s));
    beam = std::move(next);
  }
  return groups_of(options, trail);
}

// The most simulated rank-steps (sequence × member updates) the local search may spend.
constexpr double kSearchBudget = 4e7;

// Sequences from.. to − 1 of `groups` run on ranks free at `finish`, as simulate runs them: the
// local search moves one sequence at a time, so what runs before it is run once for all its moves.
void run_sequences(std::vector<double>& finish, const std::vector<BalanceGroup>& groups,
                   const std::vector<double>& seconds, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    const auto first = finish.begin() + groups[i].first_rank, last = first + groups[i].size;
    std::fill(first, last, *std::max_element(first, last) + seconds[i]);
  }
}

// simulate's step and finish sum (the local search ranks by nothing else) for `groups` whose
// sequences before `from` leave the ranks free at `before`.
void simulate_after(const std::vector<double>& before, const std::vector<BalanceGroup>& groups,
                    const std::vector<double>& seconds, std::size_t from, Schedule& s) {
  s.finish.assign(before.begin(), before.end());
  run_sequences(s.finish, groups, seconds, from, groups.size());
  s.step = *std::max_element(s.finish.begin(), s.finish.end());
  s.finish_sum = std::accumulate(s.finish.begin(), s.finish.end(), 0.0);
}

// The local search's state: the plan, its schedule, the budget spent, and scratch reused by
// every move tried.
struct Search {
  std::vector<BalanceGroup>& groups;
  std::vector<double>& seconds;
  Schedule cur, s, best;
  std::vector<double> before;  // the ranks' free times once sequences 0.. i − 1 ran
  double spent = 0, cost = 0;  // rank-steps spent, and those of one simulation
};

// Moves sequence i to its option that makes the schedule strictly better, if any (and budget
// remains): whether it moved. The best schedule is copied only when an option beats it (a world
// of free times each sequence otherwise: 2 GB at 2^20 sequences over 128 ranks).
bool move_one(const BalanceInput& in, const OptionList& list, std::size_t i, Search& x) {
  const BalanceGroup was = x.groups[i];
  const double was_s = x.seconds[i];
  BalanceGroup best = was;
  double best_s = was_s;
  bool ran_before = false, found = false;
  for (const Option& o : list) {
    if (o.group == was) continue;
    if (x.spent >= kSearchBudget) break;
    if (!ran_before) x.before.assign(std::size_t(in.world), 0.0), run_sequences(x.before, x.groups, x.seconds, 0, i);
    ran_before = true;
    x.groups[i] = o.group;
    x.seconds[i] = o.seconds;
    simulate_after(x.before, x.groups, x.seconds, i, x.s);
    x.spent += x.cost;
    if (x.s.better_than(found ? x.best : x.cur))
      best = o.group, best_s = o.seconds, std::swap(x.best, x.s), found = true;
  }
  x.groups[i] = best;
  x.seconds[i] = best_s;
  if (found) std::swap(x.cur, x.best);
  return found;
}

void improve(const BalanceInput& in, const Options& options, std::vector<BalanceGroup>& groups,
             std::vector<double>& seconds) {
  const std::size_t n = groups.size();
  Search x{groups, seconds, simulate(in.world, groups, seconds), {}, {}, {}, 0, double(in.world)};
  for (const BalanceGroup& g : groups) x.cost += g.size;
  std::vector<double> key(n);
  for (bool moved = true; moved && x.spent < kSearchBudget;) {
    moved = false;
    const auto critical =
        std::size_t(std::max_element(x.cur.finish.begin(), x.cur.finish.end()) - x.cur.finish.begin());
    for (std::size_t i = 0; i < n; ++i) key[i] = seconds[i] + (groups[i].contains(int(critical)) ? x.cur.step : 0);
    LazyDecreasing order(key);
    // Once the budget is spent no sequence moves: the pass ends there.
    for (std::size_t at = 0; at < n && x.spent < kSearchBudget; ++at)
      if (move_one(in, options[order[at]], order[at], x)) moved = true;
  }
}

// Each sequence's options with sizes up to `enough` seconds (see options_of). The distinct
// lengths' lists are pure, so they are made at once on in.threads threads, each pricing through
// its own Batch of the table, which takes what they priced after; a failure is that of the first
// sequence to meet it, as when the sequences were read in turn.
Options all_options(const BalanceInput& in, CostTable& costs, const LengthIds& ids, const std::vector<int>& ladder,
                    const Placements& firsts, double enough) {
  const std::size_t n = ids.lengths.size();
  std::vector<std::vector<SizeOption>> lists(n);
  std::vector<std::exception_ptr> failed(n);
  const std::size_t parts = in.threads > 1 ? std::min(n, 4 * std::size_t(in.threads)) : 1;
  std::vector<CostTable::Batch> batches(parts, CostTable::Batch(costs));
  std::vector<std::function<void()>> jobs;
  for (std::size_t p = 0; p < parts; ++p)
    jobs.push_back([&, p] {
      for (std::size_t d = p; d < n; d += parts) {  // strided: lengths come in no order of cost
        try {
          const std::int64_t length = ids.lengths[d];
          lists[d] = options_of(
              in, [&](int c) { return batches[p].at(length, c); }, ladder, firsts, enough);
        } catch (...) {
          failed[d] = std::current_exception();
        }
      }
    });
  run_jobs(jobs, in.threads);
  for (const CostTable::Batch& b : batches) costs.absorb(b);
  for (std::size_t d = 0; d < n; ++d) {
    if (failed[d]) std::rethrow_exception(failed[d]);
    if (lists[d].empty())
      throw_unplaceable(in, std::size_t(std::find(ids.of.begin(), ids.of.end(), d) - ids.of.begin()), costs, "");
  }
  return {firsts, ids.of, std::move(lists)};
}

}  // namespace

void run_jobs(const std::vector<std::function<void()>>& jobs, int threads) {
  std::vector<std::exception_ptr> failed(jobs.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t j; (j = next++) < jobs.size();) {
      try {
        jobs[j]();
      } catch (...) {
        failed[j] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < std::min(jobs.size(), std::size_t(std::max(threads, 1))); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
}

LengthIds length_ids(const std::vector<std::int64_t>& lengths) {
  LengthIds ids;
  ids.of.reserve(lengths.size());
  std::unordered_map<std::int64_t, std::uint32_t> index;
  for (const std::int64_t len : lengths) {
    const auto [it, fresh] = index.try_emplace(len, std::uint32_t(ids.lengths.size()));
    if (fresh) ids.lengths.push_back(len);
    ids.of.push_back(it->second);
  }
  return ids;
}

double least_single_total(double total, double most, double seconds) {
  int e = 0;
  std::frexp(total, &e);  // total's binade is [lo, 2 lo), its ulp u
  const double lo = std::ldexp(1.0, e - 1), u = std::ldexp(1.0, e - 53);
  const double slack = (most + seconds) * 0x1p-51;  // 4x the rounding of x + seconds, x <= most
  const bool one_binade = total >= 0x1p-900 && total >= lo + 4 * u && seconds > slack && most >= 0 &&
                          total + (most + seconds) * 1.001 + 8 * u < 2 * lo;
  if (!one_binade || !std::isfinite(total + seconds)) return -1.0;
  return total + (std::ceil((seconds - slack) / u) - 1) * u;
}

namespace {

// A candidate plan: its groups and its simulated schedule (its seconds are read again only for
// the winner: ten of them a sequence would be 80 MB at 2^20 sequences).
struct Candidate {
  std::vector<BalanceGroup> groups;
  Schedule schedule;
};

// Each sequence's seconds on its group, read from its option list (the costs the list was made
// from, so the same bits as CostTable::of): a few sizes a sequence, no hashing, and safe on the
// candidate jobs' threads, where the CostTable is not.
std::vector<double> option_seconds(const Options& options, const std::vector<BalanceGroup>& groups) {
  std::vector<double> s(groups.size(), -1.0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    options[i].for_each_size([&](std::size_t, int size, double seconds, const std::vector<int>&) {
      if (size == groups[i].size) s[i] = seconds;
    });
    if (s[i] < 0)
      throw Error(fmt::format("balance: sequence {}'s group of {} ranks is none of its options", i, groups[i].size));
  }
  return s;
}

Candidate simulated(int world, std::vector<BalanceGroup> groups, const std::vector<double>& seconds) {
  Candidate c{std::move(groups), {}};
  simulate(world, c.groups, seconds, c.schedule);
  return c;
}

// Set `options`' candidates into made[0..3], as jobs: the two beams, LPT, and LPT's sizes placed
// again in index order (whose seconds are LPT's: the same sizes). LPT's job (the longest at 10^5
// sequences and more) and the beam without the area term go into `first`, the beam with it (the
// shortest) into `last`: run_jobs hands jobs out in order, so the long ones start first and the
// short ones fill the ends.
void candidate_jobs(const BalanceInput& in, const Options& options, const Placements& firsts, Candidate* made,
                    std::vector<std::function<void()>>& first, std::vector<std::function<void()>>& last) {
  first.push_back([&in, &options, &firsts, made] {
    std::vector<BalanceGroup> lpt = lpt_groups(in, options);
    const std::vector<double> seconds = option_seconds(options, lpt);
    made[3] = simulated(in.world, index_order_groups(in, firsts, lpt, seconds), seconds);
    made[2] = simulated(in.world, std::move(lpt), seconds);
  });
  for (bool area : {false, true})
    (area ? last : first).push_back([&in, &options, made, area] {
      std::vector<BalanceGroup> g = beam_groups(in, options, area);
      const std::vector<double> seconds = option_seconds(options, g);
      made[area ? 0 : 1] = simulated(in.world, std::move(g), seconds);
    });
}

// The baselines' candidates, priced on `costs`.
std::vector<Candidate> baseline_candidates(const BalanceInput& in, CostTable& costs, const Baselines& baselines) {
  std::vector<Candidate> out;
  for (std::vector<BalanceGroup>& g : baselines(in, costs)) {
    const std::vector<double> seconds = seconds_of(g, costs);
    out.push_back(simulated(in.world, std::move(g), seconds));
  }
  return out;
}

}  // namespace

std::vector<BalanceGroup> dynamic_groups(const BalanceInput& in, CostTable& costs, const Baselines& baselines) {
  const std::vector<int> ladder = size_ladder(in.world);
  // The full size lists, and (on large worlds) lists cut at a tenth of the step's lower bound:
  // a narrower search the beam explores deeper. Neither wins everywhere; both are cheap.
  Placements firsts(std::size_t(in.world) + 1);
  for (int c : ladder) firsts[std::size_t(c)] = placements(in.model.cluster, in.world, c);
  const LengthIds ids = length_ids(in.lengths);
  std::vector<Options> option_sets;
  std::vector<Candidate> base;
  auto make_sets = [&] {
    option_sets.push_back(all_options(in, costs, ids, ladder, firsts, 0.0));
    if (in.world > 16)
      option_sets.push_back(all_options(in, costs, ids, ladder, firsts, 0.1 * area_bound(in, costs, ids, ladder)));
  };
  if (in.threads > 1 && in.costs) {  // the baselines beside the options, on a table of their own
    // and an input of their own: a memory_per_rank may keep state between its calls (the CLI's
    // does), so two threads must not call one. The copy's 8 bytes a length cost ~1 ms at 10^6.
    const BalanceInput mine = in;
    CostTable own(mine);  // over the shared memo: safe beside `costs`
    run_jobs({make_sets, [&] { base = baseline_candidates(mine, own, baselines); }}, in.threads);
  } else {
    base = baseline_candidates(in, costs, baselines);
    make_sets();
  }
  // Four candidates a set, pure and independent of one another (built at once on in.threads).
  std::vector<Candidate> candidates(4 * option_sets.size());
  std::vector<std::function<void()>> jobs, last;
  for (std::size_t o = 0; o < option_sets.size(); ++o)
    candidate_jobs(in, option_sets[o], firsts, &candidates[4 * o], jobs, last);
  jobs.insert(jobs.end(), last.begin(), last.end());
  run_jobs(jobs, in.threads);
  const std::size_t made = candidates.size();
  std::move(base.begin(), base.end(), std::back_inserter(candidates));
  std::size_t best = 0;
  for (std::size_t k = 1; k < candidates.size(); ++k)
    if (candidates[k].schedule.better_than(candidates[best].schedule)) best = k;
  std::vector<BalanceGroup> groups = std::move(candidates[best].groups);
  const Options& options = option_sets[best < made ? best / 4 : 0];
  std::vector<double> seconds = best < made ? option_seconds(options, groups) : seconds_of(groups, costs);
  improve(in, options, groups, seconds);
  return groups;
}

}  // namespace ulysses::balance_detail
