// The balancer's policies (balancer.hpp).
//
// Cost: sequence_cost(len, c) is the planner's row for the strategy at seq = len, cp = c plus the
// sequence-sharded GEMMs; a rank's predicted time comes from simulating the execution model
// (sequences in increasing index; a group starts when all its members are free), so waiting is
// counted, not only work.
//
// Placements: a group of c <= ranks_per_node ranks lies inside one node (any offset there); a
// larger one starts on a node boundary. Both match the planner's contiguous placement, so the
// cost of a sequence is the same wherever it goes.
//
// static   fixed groups of world / dp ranks, sequence i on group i % dp.
// pow2     Megatron's hybrid CP: c = the next power of two of ceil(len / max_tokens_per_rank),
//          at most the largest power of two <= world (raised to the next power of two the
//          strategy and the memory cap accept); groups are aligned blocks [k·c, (k+1)·c),
//          sequences placed longest first on the block whose busiest member has the least work
//          (Megatron's scheduler fills its DP×CP ranks by workload in the same order).
// dynamic  ours, minimising the simulated step time (the slowest rank's finish):
//          1. sizes: for each sequence the candidate sizes (every size up to 16, then those with
//             at most 4 significant bits, and world) that the strategy and the cap accept and
//             that are faster than every smaller candidate; above 16 ranks the list stops once
//             parallel efficiency against the smallest falls below 1/5 (bigger groups only burn
//             ranks). Above 16 ranks steps 2-3 also run on lists cut once a sequence takes a
//             tenth of the step's lower bound (a narrower search the beam explores deeper;
//             neither list wins on every step).
//          2. beam search in index order (the execution order, so each partial schedule is
//             exact): a state is the ranks' free times, a child places the next sequence on one
//             of its options, states rank by a lower bound on their final step time (the busiest
//             rank, or all ranks' time plus the least rank·seconds still to place, over world);
//             the beam is as wide as a budget allows (up to 256 on small steps, 1 — greedy
//             earliest-bound list scheduling — on thousands of sequences over 1024 ranks);
//          3. LPT for malleable jobs: sequences in decreasing cost, each on the (size, placement)
//             that ends earliest on the ranks' accumulated work, ties to less rank·seconds; and
//             the same sizes placed again in index order where the members are free earliest;
//          4. the best of 2, 3, static and pow2 (when feasible) by simulated step time, so
//             dynamic is never predicted slower than either baseline;
//          5. local improvement: passes over the sequences (the slowest rank's first, then by
//             decreasing cost) moving each to its best option while the step time (then the sum
//             of finish times) strictly drops, within a budget of simulated rank-steps.
//          Why: waiting for group members is what sinks order-blind packing (LPT alone was up to
//          1.9x the brute-force optimum on the tests' instances); searching in execution order
//          prices it exactly, and LPT, the baselines and the local search cover what a narrow
//          beam misses (worst 1.035x the optimum in the tests). Complexity, n sequences, W
//          ranks, S candidate sizes (S <= 16 + 8·log2(W/16)), P <= W placements per size:
//          O(n·S) planner rows (memoised per (len, c)); the beam O(n·B·S·P·W) with B chosen so
//          that stays under kBeamBudget; LPT O(n log n + n·S·P·W); the search <= kSearchBudget.
// Every choice breaks ties by index, ranks and sizes ascending: the plan is a pure function.
#include "ulysses/balancer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "ulysses/context_parallel.hpp"
#include "ulysses/error.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses {

const char* policy_name(BalancePolicy p) {
  switch (p) {
    case BalancePolicy::static_: return "static";
    case BalancePolicy::pow2: return "pow2";
    case BalancePolicy::dynamic: return "dynamic";
  }
  return "?";
}

BalancePolicy parse_policy(const std::string& text) {
  for (BalancePolicy p : {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic})
    if (text == policy_name(p)) return p;
  throw Error(fmt::format("balance policy '{}': expected static, pow2 or dynamic", text));
}

std::vector<int> BalancePlan::sequences_of(int rank) const {
  std::vector<int> mine;
  for (int i = 0; i < int(groups.size()); ++i)
    if (groups[std::size_t(i)].contains(rank)) mine.push_back(i);
  return mine;
}

SequenceCost sequence_cost(const BalanceInput& in, std::int64_t length, int size) {
  SequenceCost c;
  if (size < 1 || size > in.world) {
    c.reason = fmt::format("a group of {} ranks is not in [1, world = {}]", size, in.world);
    return c;
  }
  if (in.memory_per_rank) c.memory = in.memory_per_rank(length, size);
  if (size > length) {
    c.reason = fmt::format("a group of {} ranks is larger than the sequence's {} tokens", size, length);
    return c;
  }
  if (in.max_memory > 0 && c.memory > in.max_memory) {
    c.reason = fmt::format("needs {:.0f} bytes per rank on {} ranks, over the cap of {:.0f}", c.memory, size, in.max_memory);
    return c;
  }
  const Strategy& strategy = find_strategy(in.cp_comm_type);
  if (!strategy.hierarchical()) {  // refused sizes cost no planner rows (a2a+p2p's depend on its factorisation)
    CpConfig cfg{in.cp_comm_type, {}, in.model.causal, 0.0f};
    cfg.window_left = in.model.window_left;
    cfg.window_right = in.model.window_right;
    try {
      validate_cp_config(cfg, size, {in.model.batch, length, in.model.heads, in.model.head_dim}, in.model.kv_heads);
    } catch (const Error& e) {
      c.reason = e.what();
      return c;
    }
  }
  PlanInput m = in.model;
  m.seq = length;
  m.cp = size;
  m.documents.clear();
  const Plan plan = make_plan(m);
  const PlanRow* best = nullptr;
  const PlanRow* first = nullptr;
  for (const PlanRow& r : plan.rows) {
    if (r.config.cp_comm_type != in.cp_comm_type) continue;
    if (first == nullptr) first = &r;
    if (r.valid && (best == nullptr || r.predicted_step_s < best->predicted_step_s)) best = &r;
  }
  if (first == nullptr) throw Error(fmt::format("balance: cp_comm_type '{}' is not a registered strategy", in.cp_comm_type));
  if (best == nullptr) {
    c.reason = first->reason;
    return c;
  }
  const double rate = in.gemm_flops_rate > 0 ? in.gemm_flops_rate : in.model.cluster.peak_flops * in.model.cluster.efficiency;
  const std::int64_t tokens = (length + size - 1) / size;
  c.valid = true;
  c.config = best->config;
  c.seconds = best->predicted_step_s + in.gemm_flops_per_token * double(tokens) / rate;
  c.bytes = double(in.model.layers) * double(best->forward_bytes_per_rank + best->backward_bytes_per_rank);
  return c;
}

namespace {

void check_input(const BalanceInput& in) {
  if (in.lengths.empty()) throw Error("balance: the step has no sequences");
  if (in.world < 1 || in.world > kMaxPlanRanks)
    throw Error(fmt::format("balance: world must be in [1, {}], got {}", kMaxPlanRanks, in.world));
  if (in.dp < 1 || in.world % in.dp != 0)
    throw Error(fmt::format("balance: dp {} does not divide the world size {}", in.dp, in.world));
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    if (in.lengths[i] < 1) throw Error(fmt::format("balance: sequence {} has length {} (must be >= 1)", i, in.lengths[i]));
  if (in.max_memory < 0) throw Error(fmt::format("balance: max_memory must be >= 0 (0: no cap), got {}", in.max_memory));
  if (!(in.gemm_flops_rate >= 0))
    throw Error(fmt::format("balance: gemm_flops_rate must be >= 0 (0: the cluster's rate), got {}", in.gemm_flops_rate));
  if (in.gemm_flops_per_token < 0)
    throw Error(fmt::format("balance: gemm_flops_per_token must be >= 0, got {}", in.gemm_flops_per_token));
  if (in.max_tokens_per_rank < 0)
    throw Error(fmt::format("balance: max_tokens_per_rank must be >= 0 (0: longest / world), got {}", in.max_tokens_per_rank));
  find_strategy(in.cp_comm_type);
}

// sequence_cost memoised per (length, size): steps repeat lengths, and every policy asks often.
class CostTable {
 public:
  explicit CostTable(const BalanceInput& in) : in_(in) {}
  const SequenceCost& at(std::int64_t length, int size) {
    auto [it, fresh] = cache_.try_emplace({length, size});
    if (fresh) it->second = sequence_cost(in_, length, size);
    return it->second;
  }
  const SequenceCost& of(std::size_t i, int size) { return at(in_.lengths[i], size); }

 private:
  const BalanceInput& in_;
  std::map<std::pair<std::int64_t, int>, SequenceCost> cache_;
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
Schedule simulate(int world, const std::vector<BalanceGroup>& groups, const std::vector<double>& seconds) {
  Schedule s;
  s.finish.assign(std::size_t(world), 0.0);
  s.busy.assign(std::size_t(world), 0.0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto first = s.finish.begin() + groups[i].first_rank, last = first + groups[i].size;
    const double end = *std::max_element(first, last) + seconds[i];
    std::fill(first, last, end);
    for (int r = groups[i].first_rank; r < groups[i].first_rank + groups[i].size; ++r) s.busy[std::size_t(r)] += seconds[i];
  }
  s.step = *std::max_element(s.finish.begin(), s.finish.end());
  s.finish_sum = std::accumulate(s.finish.begin(), s.finish.end(), 0.0);
  return s;
}

// Where a group of `size` ranks may start (see the top of the file), ascending.
std::vector<int> placements(const Cluster& cluster, int world, int size) {
  const int per_node = cluster.ranks_per_node;
  std::vector<int> firsts;
  if (size <= per_node) {
    for (int node = 0; node < world; node += per_node)
      for (int f = node; f + size <= std::min(world, node + per_node); ++f) firsts.push_back(f);
  } else {
    for (int f = 0; f + size <= world; f += per_node) firsts.push_back(f);
  }
  return firsts;
}

[[noreturn]] void throw_unplaceable(const BalanceInput& in, std::size_t i, CostTable& costs, const std::string& where) {
  const std::int64_t len = in.lengths[i];
  if (in.max_memory > 0 && in.memory_per_rank) {
    int smallest = 1;
    for (int c = 2; c <= in.world && c <= len; ++c)
      if (in.memory_per_rank(len, c) < in.memory_per_rank(len, smallest)) smallest = c;
    const double need = in.memory_per_rank(len, smallest);
    if (need > in.max_memory)
      throw Error(fmt::format("balance: sequence {} ({} tokens) fits no group under the memory cap of {:.0f} bytes per "
                              "rank{}: it needs {:.0f} bytes per rank even on {} rank(s)",
                              i, len, in.max_memory, where, need, smallest));
  }
  throw Error(fmt::format("balance: sequence {} ({} tokens) fits no group{}: on 1 rank, {}", i, len, where,
                          costs.of(i, 1).reason));
}

// A plan's predictions for its groups (and the checks that every sequence can run there).
BalancePlan finish_plan(const BalanceInput& in, CostTable& costs, BalancePolicy policy, std::vector<BalanceGroup> groups) {
  BalancePlan p;
  p.policy = policy;
  const std::size_t world = std::size_t(in.world);
  p.rank_memory.assign(world, 0.0);
  p.rank_bytes.assign(world, 0.0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const BalanceGroup g = groups[i];
    if (g.size < 1 || g.first_rank < 0 || g.first_rank > in.world - g.size)
      throw Error(fmt::format("balance: sequence {}'s group [{}, {}) is not inside the world of {} ranks", i, g.first_rank,
                              g.first_rank + g.size, in.world));
    const SequenceCost& c = costs.of(i, g.size);
    if (!c.valid)
      throw Error(fmt::format("balance: sequence {} ({} tokens) cannot run on its group of {} ranks: {}", i,
                              in.lengths[i], g.size, c.reason));
    p.sequence_seconds.push_back(c.seconds);
    p.configs.push_back(c.config);
    for (int r = g.first_rank; r < g.first_rank + g.size; ++r) {
      p.rank_memory[std::size_t(r)] = std::max(p.rank_memory[std::size_t(r)], c.memory);
      p.rank_bytes[std::size_t(r)] += c.bytes;
    }
  }
  const Schedule s = simulate(in.world, groups, p.sequence_seconds);
  p.groups = std::move(groups);
  p.rank_seconds = s.finish;
  p.rank_busy_seconds = s.busy;
  p.step_seconds = s.step;
  return p;
}

std::vector<BalanceGroup> static_groups(const BalanceInput& in, CostTable& costs) {
  const int cp = in.world / in.dp;
  std::vector<BalanceGroup> groups;
  for (std::size_t i = 0; i < in.lengths.size(); ++i) {
    if (!costs.of(i, cp).valid)
      throw Error(fmt::format("balance: sequence {} ({} tokens) fits no static group of {} ranks (world {} / dp {}): {}",
                              i, in.lengths[i], cp, in.world, in.dp, costs.of(i, cp).reason));
    groups.push_back({int(i % std::size_t(in.dp)) * cp, cp});
  }
  return groups;
}

// Of `firsts`, the group of `size` whose busiest member's `load` is least (the lowest on ties).
BalanceGroup least_loaded(const std::vector<double>& load, const std::vector<int>& firsts, int size, double* busiest) {
  BalanceGroup best{firsts.front(), size};
  *busiest = -1;
  for (int f : firsts) {
    const double m = *std::max_element(load.begin() + f, load.begin() + f + size);
    if (*busiest < 0 || m < *busiest) *busiest = m, best.first_rank = f;
  }
  return best;
}

// Sequence indices by decreasing key, ties by index.
std::vector<std::size_t> decreasing(const std::vector<double>& key) {
  std::vector<std::size_t> order(key.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key[a] > key[b]; });
  return order;
}

std::vector<BalanceGroup> pow2_groups(const BalanceInput& in, CostTable& costs) {
  const std::int64_t longest = *std::max_element(in.lengths.begin(), in.lengths.end());
  const std::int64_t per_rank = in.max_tokens_per_rank > 0 ? in.max_tokens_per_rank : (longest + in.world - 1) / in.world;
  int top = 1;
  while (2 * top <= in.world) top *= 2;
  const std::size_t n = in.lengths.size();
  std::vector<int> size(n);
  std::vector<double> length(n);
  for (std::size_t i = 0; i < n; ++i) {
    // The smallest runnable power of two >= need, else the largest runnable one (a strategy's
    // head limit, or the world, caps it).
    const std::int64_t need = (in.lengths[i] + per_rank - 1) / per_rank;
    int chosen = 0;
    for (int c = 1; c <= top; c *= 2) {
      if (!costs.of(i, c).valid) continue;
      if (chosen == 0 || chosen < need) chosen = c;
      if (c >= need) break;
    }
    if (chosen == 0) throw_unplaceable(in, i, costs, " of a power-of-two size");
    size[i] = chosen;
    length[i] = double(in.lengths[i]);
  }
  std::vector<double> load(std::size_t(in.world), 0.0);
  std::vector<BalanceGroup> groups(n);
  for (std::size_t i : decreasing(length)) {
    std::vector<int> blocks;
    for (int f = 0; f + size[i] <= in.world; f += size[i]) blocks.push_back(f);
    double busiest = 0;
    groups[i] = least_loaded(load, blocks, size[i], &busiest);
    for (int r = groups[i].first_rank; r < groups[i].first_rank + size[i]; ++r) load[std::size_t(r)] += costs.of(i, size[i]).seconds;
  }
  return groups;
}

// ---- dynamic ----------------------------------------------------------------------------------

struct Option {
  BalanceGroup group;
  double seconds = 0;
};

// Every size up to 16, then sizes with at most 4 significant bits, then world: ~8 per octave.
std::vector<int> size_ladder(int world) {
  std::vector<int> sizes;
  for (int c = 1; c <= world; ++c)
    if (c <= 16 || (c >> __builtin_ctz(unsigned(c))) < 16 || c == world) sizes.push_back(c);
  return sizes;
}

// Sequence i's candidate (size, placement) options: see the top of the file.
// Sequence i's candidate (size, placement) options: see the top of the file. Above 16 ranks the
// sizes also stop once the sequence takes at most `enough` seconds (half a lower bound of the
// step: faster only burns ranks).
std::vector<Option> options_of(const BalanceInput& in, CostTable& costs, std::size_t i, const std::vector<int>& ladder,
                               double enough) {
  std::vector<Option> out;
  double base_area = 0, fastest = 0;
  for (int c : ladder) {
    const SequenceCost& cost = costs.of(i, c);
    if (!cost.valid || (!out.empty() && cost.seconds >= fastest)) continue;
    if (out.empty()) base_area = cost.seconds * c;
    fastest = cost.seconds;
    for (int f : placements(in.model.cluster, in.world, c)) out.push_back({{f, c}, cost.seconds});
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
      if (const SequenceCost& cost = costs.of(i, c); cost.valid) {
        area += cost.seconds * c;
        break;
      }
  return area / double(in.world);
}

std::vector<BalanceGroup> lpt_groups(const BalanceInput& in, const std::vector<std::vector<Option>>& options) {
  const std::size_t n = options.size();
  std::vector<double> fastest(n);
  for (std::size_t i = 0; i < n; ++i) fastest[i] = options[i].back().seconds;
  std::vector<double> load(std::size_t(in.world), 0.0);
  std::vector<BalanceGroup> groups(n);
  for (std::size_t i : decreasing(fastest)) {
    const Option* best = nullptr;
    double best_end = 0;
    for (const Option& o : options[i]) {
      const auto first = load.begin() + o.group.first_rank;
      const double end = *std::max_element(first, first + o.group.size) + o.seconds;
      if (best == nullptr || end < best_end ||
          (end == best_end && o.seconds * o.group.size < best->seconds * best->group.size))
        best = &o, best_end = end;
    }
    groups[i] = best->group;
    std::fill(load.begin() + best->group.first_rank, load.begin() + best->group.first_rank + best->group.size, best_end);
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
    std::fill(free.begin() + groups[i].first_rank, free.begin() + groups[i].first_rank + groups[i].size, start + seconds[i]);
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

std::vector<BalanceGroup> beam_groups(const BalanceInput& in, const std::vector<std::vector<Option>>& options,
                                      bool area_bound) {
  const std::size_t n = options.size(), world = std::size_t(in.world);
  std::vector<double> rest(n + 1, 0.0);  // least rank·seconds of sequences i.. n-1
  double work = 0;
  for (std::size_t i = n; i-- > 0;) {
    double least = -1;
    for (const Option& o : options[i]) least = least < 0 ? o.seconds * o.group.size : std::min(least, o.seconds * o.group.size);
    rest[i] = rest[i + 1] + least;
    work += double(options[i].size()) * (double(options[i].back().group.size) + 8) + double(world);
  }
  // On small steps the bound also looks ahead: a later sequence j cannot start on c ranks before
  // the c-th earliest free time, so the step lasts at least min over c of that plus t_j(c); the
  // few longest sequences still to come are checked. It costs a sort of the free times and a
  // scan of those sequences' options per child, so it is used only while it leaves a wide beam.
  double ahead_work = 0;  // per beam state, over all levels
  for (std::size_t i = 0; i < n; ++i)
    ahead_work += double(options[i].size()) * (double(world) * std::log2(double(world) + 1) + 4.0 * double(options[i].size()));
  const bool look_ahead = kBeamBudget / (work + ahead_work) >= 16;
  const std::size_t width = std::clamp<std::size_t>(
      std::size_t(kBeamBudget / std::max(1.0, look_ahead ? work + ahead_work : work)), 1, kMaxBeam);
  std::vector<std::vector<std::size_t>> longest_after(n + 1);
  for (std::size_t i = n; i-- > 0;) {
    std::vector<std::size_t>& l = longest_after[i];
    l = longest_after[i + 1];
    l.push_back(i);
    std::stable_sort(l.begin(), l.end(), [&](std::size_t a, std::size_t b) {
      return options[a].back().seconds > options[b].back().seconds;
    });
    if (l.size() > 4) l.resize(4);
  }
  auto ahead = [&](std::vector<double> free, std::size_t from) {
    std::sort(free.begin(), free.end());
    double lb = 0;
    for (std::size_t j : longest_after[from]) {
      double least = -1;
      for (const Option& o : options[j]) {
        const double t = free[std::size_t(o.group.size - 1)] + o.seconds;
        least = least < 0 ? t : std::min(least, t);
      }
      lb = std::max(lb, least);
    }
    return lb;
  };
  struct State {
    std::vector<double> free;
    double most = 0, total = 0;
  };
  struct Child {  // a state not yet made: scored from its parent without copying it
    double bound, total;
    std::size_t parent, option;
  };
  struct Step {
    std::size_t parent, option;
  };
  std::vector<State> beam(1);
  beam[0].free.assign(world, 0.0);
  std::vector<std::vector<Step>> trail;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<Child> children;
    for (std::size_t b = 0; b < beam.size(); ++b)
      for (std::size_t k = 0; k < options[i].size(); ++k) {
        const Option& o = options[i][k];
        const auto first = beam[b].free.begin() + o.group.first_rank, last = first + o.group.size;
        const double end = *std::max_element(first, last) + o.seconds;
        const double total = beam[b].total + end * o.group.size - std::accumulate(first, last, 0.0);
        const double most = std::max(beam[b].most, end);
        double bound = area_bound ? std::max(most, (total + rest[i + 1]) / double(world)) : most;
        if (area_bound && look_ahead && i + 1 < n) {
          std::vector<double> free = beam[b].free;
          std::fill(free.begin() + o.group.first_rank, free.begin() + o.group.first_rank + o.group.size, end);
          bound = std::max(bound, ahead(std::move(free), i + 1));
        }
        children.push_back({bound, total, b, k});
      }
    std::stable_sort(children.begin(), children.end(), [](const Child& a, const Child& b) {
      return a.bound < b.bound || (a.bound == b.bound && a.total < b.total);
    });
    std::vector<State> next;
    std::map<std::uint64_t, std::vector<std::size_t>> kept;  // hash of free times -> states in next
    trail.emplace_back();
    for (const Child& c : children) {
      if (next.size() == width) break;
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
  std::vector<BalanceGroup> groups(n);
  std::size_t at = 0;  // the best final state: the first kept
  for (std::size_t i = n; i-- > 0;) {
    groups[i] = options[i][trail[i][at].option].group;
    at = trail[i][at].parent;
  }
  return groups;
}

// The most simulated rank-steps (sequence × member updates) the local search may spend.
constexpr double kSearchBudget = 4e7;

void improve(const BalanceInput& in, const std::vector<std::vector<Option>>& options, std::vector<BalanceGroup>& groups,
             std::vector<double>& seconds) {
  const std::size_t n = groups.size();
  Schedule cur = simulate(in.world, groups, seconds);
  double spent = 0;
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
      double cost = double(in.world);
      for (const BalanceGroup& g : groups) cost += g.size;
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
std::vector<std::vector<Option>> all_options(const BalanceInput& in, CostTable& costs, const std::vector<int>& ladder,
                                             double enough) {
  std::vector<std::vector<Option>> options;
  for (std::size_t i = 0; i < in.lengths.size(); ++i) {
    options.push_back(options_of(in, costs, i, ladder, enough));
    if (options.back().empty()) throw_unplaceable(in, i, costs, "");
  }
  return options;
}

std::vector<BalanceGroup> dynamic_groups(const BalanceInput& in, CostTable& costs) {
  const std::vector<int> ladder = size_ladder(in.world);
  // The full size lists, and (on large worlds) lists cut at a tenth of the step's lower bound:
  // a narrower search the beam explores deeper. Neither wins everywhere; both are cheap.
  std::vector<std::vector<std::vector<Option>>> option_sets{all_options(in, costs, ladder, 0.0)};
  if (in.world > 16) option_sets.push_back(all_options(in, costs, ladder, 0.1 * area_bound(in, costs, ladder)));
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
  for (auto baseline : {static_groups, pow2_groups}) {
    try {
      candidates.push_back(baseline(in, costs));
    } catch (const Error&) {  // infeasible baselines are simply not candidates
    }
  }
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

}  // namespace

BalancePlan predict_plan(const BalanceInput& in, const std::vector<BalanceGroup>& groups) {
  check_input(in);
  if (groups.size() != in.lengths.size())
    throw Error(fmt::format("balance: {} groups for {} sequences", groups.size(), in.lengths.size()));
  CostTable costs(in);
  return finish_plan(in, costs, BalancePolicy::dynamic, groups);
}

BalancePlan balance(const BalanceInput& in, BalancePolicy policy) {
  check_input(in);
  CostTable costs(in);
  switch (policy) {
    case BalancePolicy::static_: return finish_plan(in, costs, policy, static_groups(in, costs));
    case BalancePolicy::pow2: return finish_plan(in, costs, policy, pow2_groups(in, costs));
    case BalancePolicy::dynamic: return finish_plan(in, costs, policy, dynamic_groups(in, costs));
  }
  throw Error("balance: unknown policy");
}

}  // namespace ulysses
