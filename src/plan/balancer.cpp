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
//             earliest-bound list scheduling — on thousands of sequences over 1024 ranks; one
//             state wide, the best child is found by scanning windows, skipping sizes, windows
//             and blocks of 32 ranks whose least free time (and, for one rank, the least total
//             its rounding allows) cannot win, not by making every child: the same pick);
//          3. LPT for malleable jobs: sequences in decreasing cost, each on the (size, placement)
//             that ends earliest on the ranks' accumulated work, ties to less rank·seconds; and
//             the same sizes placed again in index order where the members are free earliest;
//          4. the best of 2, 3, static and pow2 (when feasible) by simulated step time, so
//             dynamic is never predicted slower than either baseline (the baselines made while
//             step 1 prices the options, each candidate simulated on the thread that made it);
//          5. local improvement: passes over the sequences (the slowest rank's first, then by
//             decreasing cost) moving each to its best option while the step time (then the sum
//             of finish times) strictly drops, within a budget of simulated rank-steps.
//          Why: waiting for group members is what sinks order-blind packing (LPT alone was up to
//          1.9x the brute-force optimum on the tests' instances); searching in execution order
//          prices it exactly, and LPT, the baselines and the local search cover what a narrow
//          beam misses (worst 1.035x the optimum in the tests). Complexity, n sequences, W
//          ranks, S candidate sizes (S <= 16 + 8·log2(W/16)), P <= W placements per size:
//          O(n·S) planner rows (memoised per (len, c), across a caller's worlds and policies when
//          it shares BalanceInput::costs); the beam O(n·B·S·P·W) with B chosen so
//          that stays under kBeamBudget; LPT O(n log n + n·S·P·W); the search <= kSearchBudget.
// Every choice breaks ties by index, ranks and sizes ascending: the plan is a pure function.
#include "ulysses/plan/balancer.hpp"

#include "../core/enum_names.hpp"
#include "balance_detail.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <future>
#include <map>
#include <numeric>
#include <utility>

#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses {

constexpr EnumName<BalancePolicy> kPolicyNames[] = {{BalancePolicy::static_, "static"},
                                                    {BalancePolicy::pow2, "pow2"},
                                                    {BalancePolicy::dynamic, "dynamic"}};

const char* policy_name(BalancePolicy p) { return enum_name(kPolicyNames, p); }

BalancePolicy parse_policy(const std::string& text) { return parse_enum(kPolicyNames, text, "balance policy"); }

std::vector<int> BalancePlan::sequences_of(int rank) const {
  std::vector<int> mine;
  for (int i = 0; i < int(groups.size()); ++i)
    if (groups[std::size_t(i)].contains(rank)) mine.push_back(i);
  return mine;
}

namespace {

// The configuration sequence_cost validates a size with (the planner's rows price their own).
CpConfig validated_config(const BalanceInput& in) {
  CpConfig cfg{in.cp_comm_type, {}, in.model.causal, std::nullopt};
  cfg.window_left = in.model.window_left;
  cfg.window_right = in.model.window_right;
  return cfg;
}

}  // namespace

namespace balance_detail {

BalanceInput pricing_input(const BalanceInput& in) {
  BalanceInput p;
  p.world = in.world;
  p.model = in.model;
  p.cp_comm_type = in.cp_comm_type;
  p.gemm_flops_per_token = in.gemm_flops_per_token;
  p.gemm_flops_rate = in.gemm_flops_rate;
  p.memory_per_rank = in.memory_per_rank;
  p.max_memory = in.max_memory;
  return p;
}

HeadsErrors::HeadsErrors(const BalanceInput& in) : in_(in) {}

const std::string& HeadsErrors::of(int size) {
  {
    const std::lock_guard<std::mutex> hold(lock_);
    if (const auto found = by_size_.find(size); found != by_size_.end()) return found->second;
  }
  const PlanInput& m = in_.model;
  std::string e = cp_heads_error(validated_config(in_), size, m.batch, m.heads, m.head_dim, m.kv_heads);
  const std::lock_guard<std::mutex> hold(lock_);
  return by_size_.try_emplace(size, std::move(e)).first->second;
}

}  // namespace balance_detail

SequenceCost sequence_cost(const BalanceInput& in, std::int64_t length, int size) {
  return balance_detail::sequence_cost(in, length, size, nullptr);
}

SequenceCost balance_detail::sequence_cost(const BalanceInput& in, std::int64_t length, int size, HeadsErrors* heads) {
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
    c.reason =
        fmt::format("needs {:.0f} bytes per rank on {} ranks, over the cap of {:.0f}", c.memory, size, in.max_memory);
    return c;
  }
  const Strategy& strategy = find_strategy(in.cp_comm_type);
  if (!strategy.hierarchical()) {  // refused sizes cost no planner rows (a2a+p2p's depend on its factorisation)
    if (heads != nullptr)
      if (const std::string& e = heads->of(size); !e.empty()) {  // what validate_cp_config would throw
        c.reason = e;
        return c;
      }
    try {
      validate_cp_config(validated_config(in), size, {in.model.batch, length, in.model.heads, in.model.head_dim},
                         in.model.kv_heads);
    } catch (const Error& e) {
      c.reason = e.what();
      return c;
    }
  }
  PlanInput m = in.model;
  m.seq = length;
  m.cp = size;
  m.documents.clear();
  const std::vector<PlanRow> rows = strategy_rows(m, strategy, RowDetail::step);
  const PlanRow* best = nullptr;
  for (const PlanRow& r : rows)
    if (r.valid && (best == nullptr || r.predicted_step_s < best->predicted_step_s)) best = &r;
  if (rows.empty())
    throw Error(fmt::format("balance: cp_comm_type '{}' plans no configuration at {} ranks", in.cp_comm_type, size));
  if (best == nullptr) {
    c.reason = rows.front().reason;
    return c;
  }
  const double rate =
      in.gemm_flops_rate > 0 ? in.gemm_flops_rate : in.model.cluster.peak_flops * in.model.cluster.efficiency;
  const std::int64_t tokens = (length + size - 1) / size;
  c.valid = true;
  c.config = best->config;
  c.seconds = best->predicted_step_s + in.gemm_flops_per_token * double(tokens) / rate;
  c.bytes = double(in.model.layers) * double(best->forward_bytes_per_rank + best->backward_bytes_per_rank);
  return c;
}

std::shared_ptr<BalanceCosts> make_balance_costs() { return std::make_shared<BalanceCosts>(); }

namespace {

// What a shared memo's inputs must agree on, as text: the cost of one sequence on one rank (the
// model's shape, dtype, rates, GEMMs and memory model at cp 1; size 1 is one every plan asks, so
// the probe fails nowhere a plan would not) and the links and node size no such cost reads.
std::string cost_fingerprint(const BalanceInput& in) {
  const BalanceInput p = balance_detail::pricing_input(in);  // not the step (which may be 2^20 lengths)
  std::string text;
  try {
    const SequenceCost c = sequence_cost(p, 65536, 1);
    text = fmt::format("{} {} {} {} {}", c.valid, c.reason, c.seconds, c.bytes, c.memory);
  } catch (const Error& e) {
    text = e.what();
  }
  const Cluster& cl = in.model.cluster;
  return text + fmt::format(" | {} {} {} {} {} {}", in.cp_comm_type, cl.ranks_per_node, cl.intra.bandwidth,
                            cl.intra.latency, cl.inter.bandwidth, cl.inter.latency);
}

void check_shared_costs(const BalanceInput& in) {
  if (!in.costs) return;
  const std::string fingerprint = cost_fingerprint(in);
  const std::lock_guard<std::mutex> hold(in.costs->lock);
  if (in.costs->fingerprint.empty()) in.costs->fingerprint = fingerprint;
  if (fingerprint != in.costs->fingerprint)
    throw Error(
        "balance: the shared costs (BalanceInput::costs) were made for another model, strategy, cluster or "
        "memory cap: share one only between inputs that differ in lengths, world, dp and max_tokens_per_rank");
}

void check_input(const BalanceInput& in) {
  if (in.lengths.empty()) throw Error("balance: the step has no sequences");
  if (in.world < 1 || in.world > kMaxPlanRanks)
    throw Error(fmt::format("balance: world must be in [1, {}], got {}", kMaxPlanRanks, in.world));
  if (in.dp < 1 || in.world % in.dp != 0)
    throw Error(fmt::format("balance: dp {} does not divide the world size {}", in.dp, in.world));
  if (in.threads < 1) throw Error(fmt::format("balance: threads must be >= 1, got {}", in.threads));
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    if (in.lengths[i] < 1)
      throw Error(fmt::format("balance: sequence {} has length {} (must be >= 1)", i, in.lengths[i]));
  // Written `!(x >= 0) || !isfinite(x)`: a NaN fails every comparison, and would otherwise give a
  // plan of NaN seconds with every sequence on rank 0.
  auto bad = [](double x) { return !(x >= 0) || !std::isfinite(x); };
  if (bad(in.max_memory))
    throw Error(fmt::format("balance: max_memory must be finite and >= 0 (0: no cap), got {}", in.max_memory));
  if (bad(in.gemm_flops_rate))
    throw Error(fmt::format("balance: gemm_flops_rate must be finite and >= 0 (0: the cluster's rate), got {}",
                            in.gemm_flops_rate));
  if (bad(in.gemm_flops_per_token))
    throw Error(fmt::format("balance: gemm_flops_per_token must be finite and >= 0, got {}", in.gemm_flops_per_token));
  const Cluster& cl = in.model.cluster;
  if (!(cl.peak_flops > 0) || !std::isfinite(cl.peak_flops) || !(cl.efficiency > 0) || !(cl.efficiency <= 1))
    throw Error(
        fmt::format("balance: the cluster's peak FLOP/s must be finite and > 0 and its efficiency in (0, 1]; "
                    "got {} and {}",
                    cl.peak_flops, cl.efficiency));
  if (in.max_tokens_per_rank < 0)
    throw Error(
        fmt::format("balance: max_tokens_per_rank must be >= 0 (0: longest / world), got {}", in.max_tokens_per_rank));
  find_strategy(in.cp_comm_type);
  check_shared_costs(in);
}

}  // namespace

namespace balance_detail {

// The execution model: in increasing index, a sequence starts when all its group is free.
Schedule simulate(int world, const std::vector<BalanceGroup>& groups, const std::vector<double>& seconds) {
  Schedule s;
  simulate(world, groups, seconds, s);
  return s;
}

void simulate(int world, const std::vector<BalanceGroup>& groups, const std::vector<double>& seconds, Schedule& s) {
  s.finish.assign(std::size_t(world), 0.0);
  s.busy.assign(std::size_t(world), 0.0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto first = s.finish.begin() + groups[i].first_rank, last = first + groups[i].size;
    const double end = *std::max_element(first, last) + seconds[i];
    std::fill(first, last, end);
    for (int r = groups[i].first_rank; r < groups[i].first_rank + groups[i].size; ++r)
      s.busy[std::size_t(r)] += seconds[i];
  }
  s.step = *std::max_element(s.finish.begin(), s.finish.end());
  s.finish_sum = std::accumulate(s.finish.begin(), s.finish.end(), 0.0);
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
      throw Error(
          fmt::format("balance: sequence {} ({} tokens) fits no group under the memory cap of {:.0f} bytes per "
                      "rank{}: it needs {:.0f} bytes per rank even on {} rank(s)",
                      i, len, in.max_memory, where, need, smallest));
  }
  throw Error(fmt::format("balance: sequence {} ({} tokens) fits no group{}: on 1 rank, {}", i, len, where,
                          costs.full(i, 1).reason));
}

// Of `firsts`, the group of `size` whose busiest member's `load` is least (the lowest on ties).
BalanceGroup least_loaded(const std::vector<double>& load, const std::vector<int>& firsts, int size, double* busiest) {
  BalanceGroup best{firsts.front(), size};
  *busiest = -1;
  for (int f : firsts) {  // a window stops being read once it is no better than the best
    const double* x = load.data() + f;
    double m = x[0];
    for (int r = 1; r < size && (*busiest < 0 || m < *busiest); ++r) m = std::max(m, x[r]);
    if (*busiest < 0 || m < *busiest) *busiest = m, best.first_rank = f;
  }
  return best;
}

void run_ends(const std::vector<double>& times, std::vector<std::uint32_t>& end) {
  end.resize(times.size());
  for (std::size_t x = times.size(); x-- > 0;)
    end[x] = x + 1 < times.size() && std::memcmp(&times[x], &times[x + 1], sizeof(double)) == 0 ? end[x + 1]
                                                                                                : std::uint32_t(x + 1);
}

std::size_t same_window_end(const std::vector<int>& firsts, std::size_t p, int size,
                            const std::vector<std::uint32_t>& run_end) {
  const std::int64_t last_first = std::int64_t(run_end[std::size_t(firsts[p])]) - size;
  if (firsts[p] > last_first) return p + 1;
  return std::size_t(std::upper_bound(firsts.begin() + std::ptrdiff_t(p), firsts.end(), last_first) - firsts.begin());
}

// Sequence indices by decreasing key, ties by index.
std::vector<std::size_t> decreasing(const std::vector<double>& key) {
  const std::size_t n = key.size();
  if (n < kRadixFrom) {
    // Each key sorted beside its index: an index sort reads key[a] at random.
    std::vector<std::pair<double, std::size_t>> keyed(n);
    for (std::size_t i = 0; i < n; ++i) keyed[i] = {key[i], i};
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = keyed[i].second;
    return order;
  }
  // A least-significant-digit radix sort of the keys' bits, stable, so ties stay by index: half
  // the merge sort's time at 10^6 keys (LPT sorts them twice a plan, pow2 once). A double's bits
  // order like its value once the sign is folded in (every bit flipped for a negative, the sign
  // set for a positive), and −0 is made +0, which compares equal to it; then all are flipped, for
  // decreasing. Passes where every key has the same digit (most of the exponent) are skipped.
  std::vector<std::uint64_t> bits(n), bits2(n);
  std::vector<std::size_t> order(n), order2(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double x = key[i] == 0 ? 0.0 : key[i];
    std::uint64_t b = 0;
    std::memcpy(&b, &x, sizeof b);
    bits[i] = ~(b >> 63 ? ~b : b | (std::uint64_t(1) << 63));
    order[i] = i;
  }
  constexpr int kDigit = 11;
  constexpr std::uint64_t kMask = (std::uint64_t(1) << kDigit) - 1;
  std::vector<std::size_t> start(std::size_t(kMask) + 1);
  for (int shift = 0; shift < 64; shift += kDigit) {
    std::fill(start.begin(), start.end(), 0);
    for (std::size_t i = 0; i < n; ++i) ++start[(bits[i] >> shift) & kMask];
    if (start[(bits[0] >> shift) & kMask] == n) continue;
    for (std::size_t d = 0, sum = 0; d <= kMask; ++d) sum += std::exchange(start[d], sum);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t to = start[(bits[i] >> shift) & kMask]++;
      bits2[to] = bits[i], order2[to] = order[i];
    }
    bits.swap(bits2), order.swap(order2);
  }
  return order;
}

AlignedLoads::AlignedLoads(int world) : world_(std::size_t(world)) {
  while (leaves_ < world_) leaves_ *= 2;
  max_.assign(2 * leaves_, std::numeric_limits<double>::infinity());  // ranks past the world never win
  for (std::size_t r = 0; r < world_; ++r) max_[leaves_ + r] = 0;
  for (std::size_t v = leaves_; v-- > 1;) max_[v] = std::max(max_[2 * v], max_[2 * v + 1]);
  for (std::size_t n = leaves_; n >= 1; n /= 2) {  // level of n nodes: max_[n.. 2n − 1]
    std::vector<std::uint32_t> t(2 * n);
    for (std::size_t k = 0; k < n; ++k) t[n + k] = std::uint32_t(k);
    least_.push_back(std::move(t));
    for (std::size_t v = n; v-- > 1;) least_.back()[v] = pick(n, least_.back()[2 * v], least_.back()[2 * v + 1]);
  }
}

void AlignedLoads::add(int first, int size, double seconds) {
  const std::size_t lo = std::size_t(first), hi = lo + std::size_t(size);
  for (std::size_t r = lo; r < hi; ++r) max_[leaves_ + r] += seconds;
  std::size_t level = 0;
  for (std::size_t n = leaves_, a = lo, b = hi; n >= 1; n /= 2, a /= 2, b = (b + 1) / 2, ++level) {
    // The level's nodes a.. b − 1 changed: their maxima, then their tournament, a row at a time.
    for (std::size_t k = a; n < leaves_ && k < b; ++k) max_[n + k] = std::max(max_[2 * (n + k)], max_[2 * (n + k) + 1]);
    std::vector<std::uint32_t>& t = least_[level];
    for (std::size_t v = (n + a) / 2, w = (n + b - 1) / 2; v >= 1; v /= 2, w /= 2)
      for (std::size_t u = v; u <= w; ++u) t[u] = pick(n, t[2 * u], t[2 * u + 1]);
  }
}

BalanceGroup AlignedLoads::least(int size, double* busiest) const {
  std::size_t level = 0;
  while ((std::size_t(1) << level) < std::size_t(size)) ++level;
  const std::size_t n = leaves_ >> level, k = least_[level][1];  // the root (a lone node: its leaf)
  *busiest = max_[n + k];
  return {int(k) * size, size};
}

}  // namespace balance_detail

namespace {

using namespace balance_detail;

// A plan's predictions for its groups (and the checks that every sequence can run there).
BalancePlan finish_plan(const BalanceInput& in, CostTable& costs, BalancePolicy policy,
                        std::vector<BalanceGroup> groups) {
  BalancePlan p;
  p.policy = policy;
  const std::size_t world = std::size_t(in.world);
  p.rank_memory.assign(world, 0.0);
  p.rank_bytes.assign(world, 0.0);
  p.sequence_seconds.reserve(groups.size());  // not grown by doubling: 10^6 configs are ~100 MB
  p.configs.reserve(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const BalanceGroup g = groups[i];
    if (g.size < 1 || g.first_rank < 0 || g.first_rank > in.world - g.size)
      throw Error(fmt::format("balance: sequence {}'s group [{}, {}) is not inside the world of {} ranks", i,
                              g.first_rank, g.first_rank + g.size, in.world));
    const SequenceCost& c = costs.full(i, g.size);
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
      throw Error(
          fmt::format("balance: sequence {} ({} tokens) fits no static group of {} ranks (world {} / dp {}): {}", i,
                      in.lengths[i], cp, in.world, in.dp, costs.full(i, cp).reason));
    groups.push_back({int(i % std::size_t(in.dp)) * cp, cp});
  }
  return groups;
}

std::vector<BalanceGroup> pow2_groups(const BalanceInput& in, CostTable& costs) {
  const std::int64_t longest = *std::max_element(in.lengths.begin(), in.lengths.end());
  const std::int64_t per_rank =
      in.max_tokens_per_rank > 0 ? in.max_tokens_per_rank : (longest + in.world - 1) / in.world;
  int top = 1;
  while (2 * top <= in.world) top *= 2;
  const std::size_t n = in.lengths.size();
  struct Job {  // what the placement reads of sequence `index`
    double length, seconds;
    std::size_t index;
    int size;
  };
  // Each distinct length's size once (in order of first appearance, so the first sequence that
  // fails is the one named): the smallest runnable power of two >= need, else the largest
  // runnable one (a strategy's head limit, or the world, caps it).
  const LengthIds ids = length_ids(in.lengths);
  std::vector<std::pair<int, double>> pick(ids.lengths.size());  // by length: size, seconds
  for (std::size_t d = 0; d < ids.lengths.size(); ++d) {
    const std::int64_t length = ids.lengths[d], need = (length + per_rank - 1) / per_rank;
    int chosen = 0;
    for (int c = 1; c <= top; c *= 2) {
      if (!costs.at(length, c).valid) continue;
      if (chosen == 0 || chosen < need) chosen = c;
      if (c >= need) break;
    }
    if (chosen == 0)
      throw_unplaceable(in, std::size_t(std::find(ids.of.begin(), ids.of.end(), d) - ids.of.begin()), costs,
                        " of a power-of-two size");
    pick[d] = {chosen, costs.at(length, chosen).seconds};
  }
  // Longest first, ties by index, gathered once in that order: the placement reads them in turn
  // (at 2^20 sequences, reads at random indices inside it would be most of its time).
  std::vector<double> length(n);
  for (std::size_t i = 0; i < n; ++i) length[i] = double(in.lengths[i]);
  std::vector<Job> in_order(n);
  for (std::size_t k = 0; const std::size_t i : decreasing(length))
    in_order[k++] = {length[i], pick[ids.of[i]].second, i, pick[ids.of[i]].first};
  AlignedLoads load(in.world);  // least_loaded over each size's aligned blocks, from a tree
  std::vector<BalanceGroup> groups(n);
  for (const Job& j : in_order) {
    double busiest = 0;
    groups[j.index] = load.least(j.size, &busiest);
    load.add(groups[j.index].first_rank, j.size, j.seconds);
  }
  return groups;
}

// pow2's groups through in.costs' memo of them (BalanceCosts::pow2), when the caller shares one.
std::vector<BalanceGroup> shared_pow2_groups(const BalanceInput& in, CostTable& costs) {
  if (!in.costs) return pow2_groups(in, costs);
  BalanceCosts& memo = *in.costs;
  std::shared_future<std::vector<BalanceGroup>> made;
  std::promise<std::vector<BalanceGroup>> mine;
  {
    const std::lock_guard<std::mutex> hold(memo.lock);
    const auto same = std::find_if(memo.pow2.begin(), memo.pow2.end(), [&](const BalanceCosts::Pow2& m) {
      return m.world == in.world && m.max_tokens_per_rank == in.max_tokens_per_rank && m.lengths == in.lengths;
    });
    if (same != memo.pow2.end())
      made = same->groups;
    else
      memo.pow2.push_back({in.world, in.max_tokens_per_rank, in.lengths, mine.get_future().share()});
  }
  if (made.valid()) return made.get();  // another plan's, or (its Error) rethrown
  try {
    std::vector<BalanceGroup> groups = pow2_groups(in, costs);
    mine.set_value(groups);
    return groups;
  } catch (...) {
    mine.set_exception(std::current_exception());
    throw;
  }
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
  if (policy == BalancePolicy::dynamic && in.threads > 1 && !in.costs) {
    BalanceInput shared = in;  // a memo the baselines' thread can share (dynamic_groups)
    shared.costs = make_balance_costs();
    return balance(shared, policy);
  }
  CostTable costs(in);
  switch (policy) {
    case BalancePolicy::static_: return finish_plan(in, costs, policy, static_groups(in, costs));
    case BalancePolicy::pow2: return finish_plan(in, costs, policy, shared_pow2_groups(in, costs));
    case BalancePolicy::dynamic: {
      // The input is the caller's: on another thread, one of its own (its memory_per_rank's state).
      auto baselines = [](const BalanceInput& x, CostTable& table) {
        std::vector<std::vector<BalanceGroup>> out;
        for (auto baseline : {static_groups, shared_pow2_groups}) {
          try {
            out.push_back(baseline(x, table));
          } catch (const Error&) {  // an infeasible baseline is simply not a candidate
          }
        }
        return out;
      };
      return finish_plan(in, costs, policy, dynamic_groups(in, costs, baselines));
    }
  }
  throw Error("balance: unknown policy");
}

}  // namespace ulysses
