// The dynamic policy's search (balancer.cpp's top comment says what and why).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "balance_detail.hpp"

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
// kept once: real steps repeat a few thousand lengths over up to millions of sequences.
class Options {
 public:
  explicit Options(const Placements& firsts) : firsts_(&firsts) {}
  OptionList operator[](std::size_t i) const { return {lists_[list_of_[i]], *firsts_}; }
  std::size_t size() const { return list_of_.size(); }
  // Sequence i's list: `make()` runs only for a length not seen before.
  template <class Make>
  OptionList add(std::int64_t length, Make make) {
    auto [it, fresh] = index_.try_emplace(length, std::uint32_t(lists_.size()));
    if (fresh) lists_.push_back(make());
    list_of_.push_back(it->second);
    return {lists_[it->second], *firsts_};
  }

 private:
  const Placements* firsts_;
  std::vector<std::vector<SizeOption>> lists_;
  std::vector<std::uint32_t> list_of_;
  std::map<std::int64_t, std::uint32_t> index_;
};

// Every size up to 16, then sizes with at most 4 significant bits, then world: ~8 per octave.
std::vector<int> size_ladder(int world) {
  std::vector<int> sizes;
  for (int c = 1; c <= world; ++c)
    if (c <= 16 || (c >> __builtin_ctz(unsigned(c))) < 16 || c == world) sizes.push_back(c);
  return sizes;
}

// Sequence i's candidate (size, placement) options: see the top of the file. Above 16 ranks the
// sizes also stop once the sequence takes at most `enough` seconds (half a lower bound of the
// step: faster only burns ranks).
std::vector<SizeOption> options_of(const BalanceInput& in, CostTable& costs, std::size_t i,
                                   const std::vector<int>& ladder, const Placements& firsts, double enough) {
  std::vector<SizeOption> out;
  double base_area = 0, fastest = 0;
  for (int c : ladder) {
    const CostTable::Cost& cost = costs.of(i, c);
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
double area_bound(const BalanceInput& in, CostTable& costs, const std::vector<int>& ladder) {
  double area = 0;
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    for (int c : ladder)
      if (const CostTable::Cost& cost = costs.of(i, c); cost.valid) {
        area += cost.seconds * c;
        break;
      }
  return area / double(in.world);
}

std::vector<BalanceGroup> lpt_groups(const BalanceInput& in, const Options& options) {
  const std::size_t n = options.size();
  std::vector<double> fastest(n);
  for (std::size_t i = 0; i < n; ++i) fastest[i] = options[i].back().seconds;
  std::vector<double> load(std::size_t(in.world), 0.0);
  std::vector<BalanceGroup> groups(n);
  for (std::size_t i : decreasing(fastest)) {
    Option best;
    double best_end = -1;
    for (const Option& o : options[i]) {
      const auto first = load.begin() + o.group.first_rank;
      const double end = *std::max_element(first, first + o.group.size) + o.seconds;
      if (best_end < 0 || end < best_end ||
          (end == best_end && o.seconds * o.group.size < best.seconds * best.group.size))
        best = o, best_end = end;
    }
    groups[i] = best.group;
    std::fill(load.begin() + best.group.first_rank, load.begin() + best.group.first_rank + best.group.size, best_end);
  }
  return groups;
}

// `groups`' sizes placed again in index order, each where its members are free earliest.
std::vector<BalanceGroup> index_order_groups(const BalanceInput& in, const std::vector<BalanceGroup>& sized,
                                             const std::vector<double>& seconds) {
  std::vector<double> free(std::size_t(in.world), 0.0);
  std::vector<BalanceGroup> groups;
  for (std::size_t i = 0; i < sized.size(); ++i) {
    double start = 0;
    groups.push_back(least_loaded(free, placements(in.model.cluster, in.world, sized[i].size), sized[i].size, &start));
    std::fill(free.begin() + groups[i].first_rank, free.begin() + groups[i].first_rank + groups[i].size,
              start + seconds[i]);
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
// time. Identical states are kept once.
std::uint64_t hash_of(const std::vector<double>& v) {
  std::uint64_t h = 1469598103934665603ull;
  for (double x : v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 1099511628211ull;
  }
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
    double least = -1;
    for (const Option& o : options[i])
      least = least < 0 ? o.seconds * o.group.size : std::min(least, o.seconds * o.group.size);
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
    Longest l = shape.longest_after[i + 1];
    l.at[l.count++] = std::uint32_t(i);
    std::stable_sort(l.at.begin(), l.at.begin() + l.count, [&](std::uint32_t a, std::uint32_t b) {
      return options[a].back().seconds > options[b].back().seconds;
    });
    l.count = std::min<std::uint32_t>(l.count, 4);
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
    for (const Option& o : options[l.at[k]]) {
      const double t = free[std::size_t(o.group.size - 1)] + o.seconds;
      least = least < 0 ? t : std::min(least, t);
    }
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

// The beam's states: each rank's free time, the latest and their sum; a child is a state not yet
// made, scored from its parent without copying it; a step is how a kept state was made.
struct BeamState {
  std::vector<double> free;
  double most = 0, total = 0;
};
struct BeamChild {
  double bound, total;
  std::size_t parent, option;
};
struct BeamStep {
  std::size_t parent, option;
};

std::vector<BalanceGroup> beam_groups(const BalanceInput& in, const Options& options, bool area_bound) {
  const std::size_t n = options.size(), world = std::size_t(in.world);
  const BeamShape shape = beam_shape(in, options);
  using State = BeamState;
  using Child = BeamChild;
  using Step = BeamStep;
  std::vector<State> beam(1);
  beam[0].free.assign(world, 0.0);
  std::vector<std::vector<Step>> trail;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Child> children;
    for (std::size_t b = 0; b < beam.size(); ++b)
      for (std::size_t k = 0; const Option& o : options[i]) {
        const auto first = beam[b].free.begin() + o.group.first_rank, last = first + o.group.size;
        const double end = *std::max_element(first, last) + o.seconds;
        const double total = beam[b].total + end * o.group.size - std::accumulate(first, last, 0.0);
        const double most = std::max(beam[b].most, end);
        double bound = area_bound ? std::max(most, (total + shape.rest[i + 1]) / double(world)) : most;
        if (area_bound && shape.look_ahead && i + 1 < n) {
          std::vector<double> free = beam[b].free;
          std::fill(free.begin() + o.group.first_rank, free.begin() + o.group.first_rank + o.group.size, end);
          bound = std::max(bound, ahead(shape, options, std::move(free), i + 1));
        }
        children.push_back({bound, total, b, k++});
      }
    // By bound, then total, then as made (a total order: the stable sort's), sorted only as far
    // as the beam reads: a level keeps `width` states of many children, on large steps one.
    auto before = [](const Child& a, const Child& b) {
      if (a.bound != b.bound) return a.bound < b.bound;
      if (a.total != b.total) return a.total < b.total;
      return a.parent != b.parent ? a.parent < b.parent : a.option < b.option;
    };
    std::size_t sorted = std::min(children.size(), 2 * shape.width);
    std::partial_sort(children.begin(), children.begin() + std::ptrdiff_t(sorted), children.end(), before);
    std::vector<State> next;
    std::map<std::uint64_t, std::vector<std::size_t>> kept;  // hash of free times -> states in next
    trail.emplace_back();
    for (std::size_t at = 0; at < children.size() && next.size() < shape.width; ++at) {
      if (at == sorted)
        std::sort(children.begin() + std::ptrdiff_t(at), children.end(), before), sorted = children.size();
      const Child& c = children[at];
      const Option& o = options[i][c.option];
      State s{beam[c.parent].free, 0, c.total};
      const auto first = s.free.begin() + o.group.first_rank, last = first + o.group.size;
      std::fill(first, last, *std::max_element(first, last) + o.seconds);
      s.most = *std::max_element(s.free.begin(), s.free.end());
      std::vector<std::size_t>& same = kept[hash_of(s.free)];
      if (std::any_of(same.begin(), same.end(), [&](std::size_t k) { return next[k].free == s.free; })) continue;
      same.push_back(next.size());
      trail.back().push_back({c.parent, c.option});
      next.push_back(std::move(s));
    }
    beam = std::move(next);
  }
  return groups_of(options, trail);
}

// The most simulated rank-steps (sequence × member updates) the local search may spend.
constexpr double kSearchBudget = 4e7;

void improve(const BalanceInput& in, const Options& options, std::vector<BalanceGroup>& groups,
             std::vector<double>& seconds) {
  const std::size_t n = groups.size();
  Schedule cur = simulate(in.world, groups, seconds);
  double spent = 0, cost = double(in.world);  // rank-steps of one simulation
  for (const BalanceGroup& g : groups) cost += g.size;
  for (bool moved = true; moved && spent < kSearchBudget;) {
    moved = false;
    const auto critical = std::size_t(std::max_element(cur.finish.begin(), cur.finish.end()) - cur.finish.begin());
    std::vector<double> key(n);
    for (std::size_t i = 0; i < n; ++i) key[i] = seconds[i] + (groups[i].contains(int(critical)) ? cur.step : 0);
    for (std::size_t i : decreasing(key)) {
      const BalanceGroup was = groups[i];
      const double was_s = seconds[i];
      BalanceGroup best = was;
      double best_s = was_s;
      Schedule best_sched = cur;
      for (const Option& o : options[i]) {
        if (o.group == was) continue;
        if (spent >= kSearchBudget) break;
        groups[i] = o.group;
        seconds[i] = o.seconds;
        const Schedule s = simulate(in.world, groups, seconds);
        spent += cost;
        if (s.better_than(best_sched)) best = o.group, best_s = o.seconds, best_sched = s;
      }
      groups[i] = best;
      seconds[i] = best_s;
      if (!(best == was)) {
        cur = best_sched;
        moved = true;
      }
    }
  }
}

// Each sequence's options with sizes up to `enough` seconds (see options_of).
Options all_options(const BalanceInput& in, CostTable& costs, const std::vector<int>& ladder, const Placements& firsts,
                    double enough) {
  Options options(firsts);
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    if (options.add(in.lengths[i], [&] { return options_of(in, costs, i, ladder, firsts, enough); }).empty())
      throw_unplaceable(in, i, costs, "");
  return options;
}

}  // namespace

std::vector<BalanceGroup> dynamic_groups(const BalanceInput& in, CostTable& costs,
                                         const std::vector<std::vector<BalanceGroup>>& baselines) {
  const std::vector<int> ladder = size_ladder(in.world);
  // The full size lists, and (on large worlds) lists cut at a tenth of the step's lower bound:
  // a narrower search the beam explores deeper. Neither wins everywhere; both are cheap.
  Placements firsts(std::size_t(in.world) + 1);
  for (int c : ladder) firsts[std::size_t(c)] = placements(in.model.cluster, in.world, c);
  std::vector<Options> option_sets{all_options(in, costs, ladder, firsts, 0.0)};
  if (in.world > 16) option_sets.push_back(all_options(in, costs, ladder, firsts, 0.1 * area_bound(in, costs, ladder)));
  std::vector<std::vector<BalanceGroup>> candidates;
  std::vector<std::size_t> set_of;  // which option set made candidate k
  for (std::size_t o = 0; o < option_sets.size(); ++o) {
    const auto& options = option_sets[o];
    candidates.push_back(beam_groups(in, options, true));
    candidates.push_back(beam_groups(in, options, false));
    candidates.push_back(lpt_groups(in, options));
    candidates.push_back(index_order_groups(in, candidates.back(), seconds_of(candidates.back(), costs)));
    set_of.resize(candidates.size(), o);
  }
  candidates.insert(candidates.end(), baselines.begin(), baselines.end());
  set_of.resize(candidates.size(), 0);
  std::size_t best = 0;
  Schedule best_sched;
  for (std::size_t k = 0; k < candidates.size(); ++k) {
    const Schedule s = simulate(in.world, candidates[k], seconds_of(candidates[k], costs));
    if (k == 0 || s.better_than(best_sched)) best = k, best_sched = s;
  }
  std::vector<BalanceGroup> groups = candidates[best];
  std::vector<double> seconds = seconds_of(groups, costs);
  improve(in, option_sets[set_of[best]], groups, seconds);
  return groups;
}

}  // namespace ulysses::balance_detail
