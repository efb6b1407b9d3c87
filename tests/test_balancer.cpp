// The balancer (balancer.hpp): its execution model against an independent simulation, dynamic
// against the brute-force optimum of small instances and against static and pow2, determinism,
// and bad input; the calibration the trainer gives it (calibrate.hpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>

#include "ulysses/plan/balancer.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"
#include "ulysses/comm/mpi_communicator.hpp"
#include "plan/balance_detail.hpp"

namespace {

using namespace ulysses;

BalanceInput small_model(int world, std::vector<std::int64_t> lengths) {
  BalanceInput in;
  in.lengths = std::move(lengths);
  in.world = world;
  in.model.heads = 8;
  in.model.kv_heads = 8;
  in.model.head_dim = 64;
  in.model.layers = 2;
  in.gemm_flops_per_token = 6.0 * 12 * 512 * 512 * 2;
  return in;
}

// Every sequence's cost at every size, straight from sequence_cost (-1: not runnable).
std::vector<std::vector<double>> cost_table(const BalanceInput& in) {
  std::vector<std::vector<double>> t(in.lengths.size(), std::vector<double>(std::size_t(in.world) + 1, -1));
  for (std::size_t i = 0; i < in.lengths.size(); ++i)
    for (int c = 1; c <= in.world; ++c)
      if (const SequenceCost s = sequence_cost(in, in.lengths[i], c); s.valid) t[i][std::size_t(c)] = s.seconds;
  return t;
}

// Branch and bound over every assignment of a contiguous group to each sequence (in index order,
// as they execute): the least step time of the execution model.
struct BruteForce {
  const std::vector<std::vector<double>>& t;
  int world;
  std::vector<double> least_area;  // per sequence, from i on: the sum of min_c c·t(c)
  double best;

  void search(std::size_t i, std::vector<double>& free) {
    const double now = *std::max_element(free.begin(), free.end());
    if (now >= best) return;
    if (i == t.size()) {
      best = now;
      return;
    }
    double sum = 0;
    for (double f : free) sum += f;
    if ((sum + least_area[i]) / world >= best) return;
    for (int c = 1; c <= world; ++c) {
      if (t[i][std::size_t(c)] < 0) continue;
      for (int f = 0; f + c <= world; ++f) {
        std::vector<double> next = free;
        const double end = *std::max_element(free.begin() + f, free.begin() + f + c) + t[i][std::size_t(c)];
        std::fill(next.begin() + f, next.begin() + f + c, end);
        search(i + 1, next);
      }
    }
  }
};

double optimum(const BalanceInput& in, double upper) {
  const auto t = cost_table(in);
  BruteForce b{t, in.world, std::vector<double>(t.size() + 1, 0.0), upper * (1 + 1e-9)};
  for (std::size_t i = t.size(); i-- > 0;) {
    double a = -1;
    for (int c = 1; c <= in.world; ++c)
      if (t[i][std::size_t(c)] >= 0 && (a < 0 || c * t[i][std::size_t(c)] < a)) a = c * t[i][std::size_t(c)];
    b.least_area[i] = b.least_area[i + 1] + a;
  }
  std::vector<double> free(std::size_t(in.world), 0.0);
  b.search(0, free);
  return b.best;
}

// Lengths from a fixed generator: mostly short, some long (a long tail), in loader order.
std::vector<std::int64_t> random_lengths(std::mt19937_64& rng, int n) {
  std::vector<std::int64_t> out;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    out.push_back(std::int64_t(64ull << (r % 8)) + std::int64_t((r >> 8) % 64));
  }
  return out;
}

TEST(Balancer, PredictionsFollowTheExecutionModel) {
  // Sequence 1 shares rank 1 with sequence 0 and so waits for it; sequence 2 runs beside.
  BalanceInput in = small_model(3, {4096, 2048, 512});
  const std::vector<BalanceGroup> groups{{0, 2}, {1, 2}, {0, 1}};
  const BalancePlan p = predict_plan(in, groups);
  const double t0 = sequence_cost(in, 4096, 2).seconds, t1 = sequence_cost(in, 2048, 2).seconds,
               t2 = sequence_cost(in, 512, 1).seconds;
  EXPECT_DOUBLE_EQ(p.rank_seconds[0], t0 + t2);
  EXPECT_DOUBLE_EQ(p.rank_seconds[1], t0 + t1);
  EXPECT_DOUBLE_EQ(p.rank_seconds[2], t0 + t1);  // waited t0 for rank 1
  EXPECT_DOUBLE_EQ(p.rank_busy_seconds[2], t1);
  EXPECT_DOUBLE_EQ(p.step_seconds, std::max(t0 + t2, t0 + t1));
  EXPECT_EQ(p.sequences_of(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.sequences_of(0), (std::vector<int>{0, 2}));
}

TEST(Balancer, CostIsThePlannersRowPlusTheGemms) {
  BalanceInput in = small_model(4, {8192});
  for (int c : {1, 2, 4}) {
    PlanInput m = in.model;
    m.seq = 8192;
    m.cp = c;
    double row = -1;
    for (const PlanRow& r : make_plan(m).rows)
      if (r.name == "a2a") row = r.predicted_step_s;
    const SequenceCost s = sequence_cost(in, 8192, c);
    ASSERT_TRUE(s.valid);
    EXPECT_DOUBLE_EQ(s.seconds, row + in.gemm_flops_per_token * 8192.0 / c / (989e12 * 0.5)) << c;
    EXPECT_EQ(s.bytes == 0, c == 1);  // a group of one communicates nothing
  }
  // Ulysses needs a head per rank: 8 heads cannot go on 16 ranks; a ring can.
  in.world = 16;
  EXPECT_FALSE(sequence_cost(in, 8192, 16).valid);
  in.cp_comm_type = "p2p";
  EXPECT_TRUE(sequence_cost(in, 8192, 16).valid);
  EXPECT_FALSE(sequence_cost(in, 8, 16).valid);  // more ranks than tokens
}

TEST(Balancer, StaticDealsRoundRobin) {
  BalanceInput in = small_model(4, {1024, 2048, 4096});
  in.dp = 2;
  const BalancePlan p = balance(in, BalancePolicy::static_);
  EXPECT_EQ(p.groups, (std::vector<BalanceGroup>{{0, 2}, {2, 2}, {0, 2}}));
  EXPECT_DOUBLE_EQ(p.step_seconds, sequence_cost(in, 1024, 2).seconds + sequence_cost(in, 4096, 2).seconds);
}

TEST(Balancer, Pow2GivesTheNextPowerOfTwoOfTheTokensPerRank) {
  BalanceInput in = small_model(8, {16384, 512, 3000, 1024});
  in.max_tokens_per_rank = 1024;
  const BalancePlan p = balance(in, BalancePolicy::pow2);
  std::vector<int> sizes;
  for (const BalanceGroup& g : p.groups) sizes.push_back(g.size);
  EXPECT_EQ(sizes, (std::vector<int>{8, 1, 4, 1}));  // 16 capped at 8; 3000 / 1024 -> 3 -> 4
  for (const BalanceGroup& g : p.groups) EXPECT_EQ(g.first_rank % g.size, 0);
}

TEST(Balancer, DynamicIsNearTheBruteForceOptimumAndNeverBehindTheBaselines) {
  std::mt19937_64 rng(25);
  struct Case {
    int world, n;
  };
  std::vector<BalanceInput> cases;
  for (Case c : {Case{2, 10}, {3, 8}, {4, 7}, {4, 6}, {5, 5}, {6, 5}, {8, 5}, {8, 4}})
    for (int k = 0; k < 3; ++k) cases.push_back(small_model(c.world, random_lengths(rng, c.n)));
  // Long tails: one long sequence and many short ones, in front, behind and in the middle.
  cases.push_back(small_model(2, {16384, 512, 512, 512, 512, 512, 512, 512, 512}));
  cases.push_back(small_model(4, {512, 512, 512, 16384, 512, 512, 512, 512}));
  cases.push_back(small_model(8, {1024, 1024, 32768, 1024, 8192}));
  cases.push_back(small_model(3, {512, 512, 512, 512, 512, 8192}));
  double worst = 1;
  for (const BalanceInput& in : cases) {
    const BalancePlan d = balance(in, BalancePolicy::dynamic);
    const double best = optimum(in, d.step_seconds);
    worst = std::max(worst, d.step_seconds / best);
    EXPECT_LE(d.step_seconds, 1.05 * best) << in.world << " ranks: " << describe_lengths(in.lengths);
    for (BalancePolicy base : {BalancePolicy::static_, BalancePolicy::pow2})
      EXPECT_LE(d.step_seconds, balance(in, base).step_seconds * (1 + 1e-12)) << policy_name(base);
  }
  std::printf("dynamic / optimum: worst %.4f over %zu instances\n", worst, cases.size());
}

TEST(Balancer, DynamicSplitsTheLongTail) {
  // 2 ranks, 1x16384 + 32x512: the long one on both ranks, the short ones one rank each.
  std::vector<std::int64_t> lengths{16384};
  lengths.insert(lengths.end(), 32, 512);
  BalanceInput in = small_model(2, lengths);
  const BalancePlan d = balance(in, BalancePolicy::dynamic);
  EXPECT_EQ(d.groups[0], (BalanceGroup{0, 2}));
  for (std::size_t i = 1; i < d.groups.size(); ++i) EXPECT_EQ(d.groups[i].size, 1);
  in.dp = 2;
  EXPECT_LT(d.step_seconds, balance(in, BalancePolicy::static_).step_seconds);
  in.dp = 1;
  EXPECT_LT(d.step_seconds, balance(in, BalancePolicy::static_).step_seconds);
}

// Fingerprint of dynamic plans on random inputs at worlds 8..1024 (8 or 4 ranks a node).
std::uint64_t dynamic_fingerprint() {
  std::mt19937_64 rng(37);
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t x) { h = (h ^ x) * 1099511628211ull; };
  struct Case {
    int world, n, per_node;
  };
  for (Case c : {Case{8, 40, 8},
                 {12, 30, 4},
                 {16, 24, 8},
                 {64, 40, 8},
                 {100, 50, 4},
                 {256, 64, 8},
                 {1024, 96, 8},
                 {1024, 300, 8}})
    for (int k = 0; k < 2; ++k) {
      BalanceInput in = small_model(c.world, random_lengths(rng, c.n));
      in.model.cluster.ranks_per_node = c.per_node;
      const BalancePlan d = balance(in, BalancePolicy::dynamic);
      for (const BalanceGroup& g : d.groups) mix(std::uint64_t(g.first_rank) << 20 | std::uint64_t(g.size));
      std::uint64_t bits = 0;
      std::memcpy(&bits, &d.step_seconds, sizeof bits);
      mix(bits);
    }
  return h;
}

// The search reads placements in classes (balance_detail::same_window_end): this fingerprint was
// taken from the search that scored every placement on its own, and must not move.
TEST(Balancer, DynamicPlansAreThoseOfThePlacementByPlacementSearch) {
  EXPECT_EQ(dynamic_fingerprint(), 0xa6c394bb80a0aa18ull);
}

// Every placement of a class reads its class's first window bit for bit (the same busiest
// member, the same sum in order), the classes cover the placements in order, and a class takes
// every later placement in its run: free times of R runs give at most R + (crossing windows)
// classes a size, and a world with nothing placed one class a size.
TEST(Balancer, PlacementClassesReadTheSameWindows) {
  using namespace balance_detail;
  std::mt19937_64 rng(11);
  std::vector<std::uint32_t> run_end;
  for (int trial = 0; trial < 200; ++trial) {
    const int world = 1 + int(rng() % 70);
    Cluster cluster;
    cluster.ranks_per_node = 1 << (rng() % 4);
    std::vector<double> free(std::size_t(world), 0.0);
    for (int r = 0; r < world;) {  // runs of one time, some equal to their neighbours' in value
      const int len = 1 + int(rng() % 9);
      const double t = trial % 3 == 0 ? 0.0 : 0.1 * double(rng() % 4) + 0.3;
      for (int x = r; x < std::min(world, r + len); ++x) free[std::size_t(x)] = t;
      r += len;
    }
    run_ends(free, run_end);
    for (int size = 1; size <= world; ++size) {
      const std::vector<int> firsts = placements(cluster, world, size);
      std::size_t classes = 0;
      for (std::size_t p = 0; p < firsts.size(); ++classes) {
        const std::size_t q = same_window_end(firsts, p, size, run_end);
        ASSERT_GT(q, p);
        const auto window = [&](std::size_t k) { return free.begin() + firsts[k]; };
        for (std::size_t k = p; k < q; ++k) {
          ASSERT_EQ(*std::max_element(window(k), window(k) + size), *std::max_element(window(p), window(p) + size));
          ASSERT_EQ(std::accumulate(window(k), window(k) + size, 0.0),
                    std::accumulate(window(p), window(p) + size, 0.0));
        }
        const bool one_run = std::all_of(window(p), window(p) + size, [&](double t) { return t == *window(p); });
        if (one_run && q < firsts.size())  // the next placement leaves the run
          EXPECT_FALSE(std::all_of(window(p), window(q) + size, [&](double t) { return t == *window(p); }))
              << world << " " << size << " " << p;
        p = q;
      }
      if (trial % 3 == 0) EXPECT_EQ(classes, firsts.empty() ? 0u : 1u) << world << " ranks, size " << size;
    }
  }
}

// Ranks, as groups fill it at random (long runs, then every rank its own time, then long runs
// again): its times are those of a plain vector filled alike, and a scan reads a placement of each
// size only where the placements it skips since the last it read hold the same window, bit for bit
// (the same busiest member, the same sum in order); with nothing placed, one a size.
TEST(Balancer, RanksScanOneWindowAClass) {
  using namespace balance_detail;
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    const int world = 1 + int(rng() % 300);
    Cluster cluster;
    cluster.ranks_per_node = 1 << (rng() % 4);
    Ranks ranks(world);
    std::vector<double> plain(std::size_t(world), 0.0);
    for (int step = 0; step < 600; ++step) {
      const int size = 1 + int(rng() % std::uint64_t(step % 200 < 100 ? world : std::min(world, 3)));
      const int first = int(rng() % std::uint64_t(world - size + 1));
      const double t = step % 200 < 100 ? 0.25 * double(rng() % 3) : double(rng() % 1000) / 7.0;
      ranks.fill(first, size, t);
      std::fill(plain.begin() + first, plain.begin() + first + size, t);
      ASSERT_EQ(ranks.times(), plain);
      for (int c = 1; c <= world; c += 1 + int(rng() % 7)) {
        const std::vector<int> firsts = placements(cluster, world, c);
        std::vector<std::size_t> read;
        ranks.scan(firsts, c, [&](std::size_t p) { return read.push_back(p), false; });
        ASSERT_FALSE(firsts.empty() ? !read.empty() : read.empty() || read.front() != 0);
        read.push_back(firsts.size());
        for (std::size_t k = 0; k + 1 < read.size(); ++k)
          for (std::size_t q = read[k] + 1; q < read[k + 1]; ++q) {
            const auto a = plain.begin() + firsts[read[k]], b = plain.begin() + firsts[q];
            ASSERT_EQ(*std::max_element(b, b + c), *std::max_element(a, a + c)) << world << " " << c << " " << q;
            ASSERT_EQ(std::accumulate(b, b + c, 0.0), std::accumulate(a, a + c, 0.0));
          }
      }
    }
  }
  Ranks fresh(64);
  std::size_t read = 0;
  fresh.scan(placements(Cluster{}, 64, 4), 4, [&](std::size_t) { return ++read, false; });
  EXPECT_EQ(read, 1u);
}

// A scan that passes over blocks reads every placement a skip does not rule out: each one it
// leaves has a first rank whose block's least time (computed here) the skip rules out, or (while
// runs are long) the window of the last one it read, bit for bit. first_least is the first rank
// of the least time.
TEST(Balancer, RanksSkipOnlyBlocksRuledOut) {
  using namespace balance_detail;
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 12; ++trial) {
    const int world = 1 + int(rng() % 300);
    Cluster cluster;
    cluster.ranks_per_node = 1 << (rng() % 4);
    Ranks ranks(world);
    std::vector<double> plain(std::size_t(world), 0.0);
    for (int step = 0; step < 400; ++step) {
      const int size = 1 + int(rng() % std::uint64_t(step % 200 < 60 ? world : std::min(world, 3)));
      const int first = int(rng() % std::uint64_t(world - size + 1));
      const double t = step % 200 < 60 ? 0.25 * double(rng() % 3) : double(rng() % 1000) / 7.0;
      ranks.fill(first, size, t);
      std::fill(plain.begin() + first, plain.begin() + first + size, t);
      ASSERT_EQ(ranks.first_least(), std::size_t(std::min_element(plain.begin(), plain.end()) - plain.begin()));
      const double cut = double(rng() % 1000) / 7.0;
      const auto block_least = [&](int r) {
        const auto b = plain.begin() + r / int(Ranks::kBlock) * int(Ranks::kBlock);
        return *std::min_element(b, std::min(plain.end(), b + int(Ranks::kBlock)));
      };
      for (int c = 1; c <= world; c += 1 + int(rng() % 7)) {
        const std::vector<int> firsts = placements(cluster, world, c);
        std::vector<bool> read(firsts.size(), false);
        ranks.scan(
            firsts, c, [&](double x) { return x > cut; }, [&](std::size_t p) { return read[p] = true, false; });
        std::size_t last = firsts.size();
        for (std::size_t p = 0; p < firsts.size(); ++p) {
          if (read[p]) {
            last = p;
            continue;
          }
          if (block_least(firsts[p]) > cut) continue;
          ASSERT_LT(last, firsts.size()) << world << " " << c << " " << p;
          const auto a = plain.begin() + firsts[last], b = plain.begin() + firsts[p];
          ASSERT_EQ(*std::max_element(b, b + c), *std::max_element(a, a + c)) << world << " " << c << " " << p;
          ASSERT_EQ(std::accumulate(b, b + c, 0.0), std::accumulate(a, a + c, 0.0));
        }
      }
    }
  }
}

// A scan that reads blocks at once hands them the placements the scan placement by placement
// reads, in order: while classes are kept each through f, else a block's through one call, its
// placements' first ranks in one block of kBlock ranks.
TEST(Balancer, RanksBlockScanReadsThePlacementsOfThePlainScan) {
  using namespace balance_detail;
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 12; ++trial) {
    const int world = 1 + int(rng() % 300);
    Cluster cluster;
    cluster.ranks_per_node = 1 << (rng() % 4);
    Ranks ranks(world);
    for (int step = 0; step < 300; ++step) {
      const int size = 1 + int(rng() % std::uint64_t(step % 150 < 40 ? world : std::min(world, 3)));
      const int first = int(rng() % std::uint64_t(world - size + 1));
      ranks.fill(first, size, step % 150 < 40 ? 0.25 * double(rng() % 3) : double(rng() % 1000) / 7.0);
      const double cut = double(rng() % 1000) / 7.0;
      const auto skip = [&](double x) { return x > cut; };
      for (int c = 1; c <= world; c += 1 + int(rng() % 7)) {
        const std::vector<int> firsts = placements(cluster, world, c);
        std::vector<std::size_t> plain, blocks;
        ranks.scan(firsts, c, skip, [&](std::size_t p) { return plain.push_back(p), false; });
        ranks.scan(
            firsts, c, skip, [&](std::size_t p) { return blocks.push_back(p), false; },
            [&](std::size_t p, std::size_t q) {
              EXPECT_LT(p, q);
              EXPECT_EQ(std::size_t(firsts[p]) / Ranks::kBlock, std::size_t(firsts[q - 1]) / Ranks::kBlock);
              for (; p < q; ++p) blocks.push_back(p);
              return false;
            });
        ASSERT_EQ(blocks, plain) << world << " " << c;
      }
    }
  }
}

// Free times for the one-rank picks' tests: a few values, some a rounding apart, so that ends and
// totals tie often and their rounding decides.
std::vector<double> near_times(std::mt19937_64& rng, std::size_t n, double most) {
  std::vector<double> x(n);
  for (double& v : x) v = most * double(rng() % 5) / 4 * (1 + 0x1p-52 * double(rng() % 3));
  return x;
}

// least_single is greedy_child's one-rank visit in turn: the first rank of least (bound, total),
// with its bound, total, end and area term, bit for bit.
TEST(Balancer, LeastSingleIsTheFirstLeastOfTheRankByRankScan) {
  using namespace balance_detail;
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 20000; ++trial) {
    const std::size_t n = 1 + rng() % kLeastBlock;
    const double most = std::ldexp(0.5 + unit(rng), int(rng() % 8) - 4), world = double(1 + rng() % 4096);
    const double total = most * world * unit(rng), seconds = most * unit(rng) * (trial % 2 ? 1 : 1e-6);
    const double rest = most * world * unit(rng);
    const bool area_bound = trial % 3 != 0;
    const std::vector<double> x = near_times(rng, n, most);
    std::size_t at = 0;
    double bound = 0, t = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const double end = x[j] + seconds, next_most = std::max(most, end);
      const double tj = total + end * 1 - std::accumulate(&x[j], &x[j] + 1, 0.0);
      const double bj = area_bound ? std::max(next_most, (tj + rest) / world) : next_most;
      if (j == 0 || bj < bound || (bj == bound && tj < t)) at = j, bound = bj, t = tj;
    }
    const SinglePick s = least_single(x.data(), n, most, total, seconds, rest, world, area_bound);
    ASSERT_EQ(s.at, at) << trial;
    ASSERT_EQ(s.bound, bound);
    ASSERT_EQ(s.total, t);
    ASSERT_EQ(s.end, x[at] + seconds);
    ASSERT_EQ(s.area, area_bound ? (t + rest) / world : 0.0);
  }
}

// least_end is lpt_choice's one-rank visit in turn: the first rank of the least end, and whether a
// rank holds the least load.
TEST(Balancer, LeastEndIsTheFirstLeastEndOfTheRankByRankScan) {
  using namespace balance_detail;
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 20000; ++trial) {
    const std::size_t n = 1 + rng() % kLeastBlock;
    const double most = std::ldexp(0.5 + unit(rng), int(rng() % 8) - 4);
    const double seconds = most * unit(rng) * (trial % 2 ? 1 : 1e-9);
    const std::vector<double> x = near_times(rng, n, most);
    const double least = trial % 4 == 0 ? -1.0 : *std::min_element(x.begin(), x.end());
    std::size_t at = 0;
    for (std::size_t j = 1; j < n; ++j)
      if (x[j] + seconds < x[at] + seconds) at = j;
    const EndPick e = least_end(x.data(), n, seconds, least);
    ASSERT_EQ(e.at, at) << trial;
    ASSERT_EQ(e.end, x[at] + seconds);
    ASSERT_EQ(e.holds_least, std::find(x.begin(), x.end(), least) != x.end());
  }
}

// The floor of a one-rank total (least_single_total) is below the total greedy_child computes
// at every free time in [0, most], over random states and near the binades' edges, and is
// reached by some free times (else it would skip nothing).
TEST(Balancer, OneRankTotalFloorHoldsAndIsReached) {
  using namespace balance_detail;
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::size_t known = 0, reached = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const double most = std::ldexp(0.5 + unit(rng), int(rng() % 20) - 10);
    const double world = double(1 + rng() % 4096);
    double total = most * (1 + (world - 1) * unit(rng));
    if (trial % 4 == 0) total = std::ldexp(1.0, std::ilogb(total) + 1) * (1 - 1e-15 * double(rng() % 64));
    if (trial % 4 == 1) total = std::ldexp(1.0, std::ilogb(total)) * (1 + 1e-15 * double(rng() % 64));
    const double seconds = most * std::ldexp(unit(rng), -int(rng() % 30));
    const double floor = least_single_total(total, most, seconds);
    known += floor >= 0;
    bool hit = false;
    for (int k = 0; k < 200; ++k) {
      const double x = k == 0 ? 0.0 : k == 1 ? most : most * unit(rng);
      const double end = x + seconds;
      const double t = total + end * 1 - std::accumulate(&x, &x + 1, 0.0);  // greedy_child's, at size 1
      if (floor >= 0) ASSERT_GE(t, floor) << total << " " << most << " " << seconds << " " << x;
      hit = hit || t == floor;
    }
    reached += hit;
  }
  EXPECT_GT(known, 2000u);
  EXPECT_GT(reached, known / 2);
  EXPECT_EQ(least_single_total(0.0, 0.0, 1.0), -1.0);  // nothing placed: no floor
}

// AlignedLoads against least_loaded over each power-of-two size's aligned blocks of a plain
// vector, as random blocks fill it: the same block, the same busiest load, the same loads.
TEST(Balancer, AlignedLoadsGiveTheLeastLoadedBlock) {
  using namespace balance_detail;
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 1 + int(rng() % 200);
    int top = 1;
    while (2 * top <= world) top *= 2;
    AlignedLoads tree(world);
    std::vector<double> load(std::size_t(world), 0.0);
    for (int step = 0; step < 300; ++step) {
      for (int c = 1; c <= top; c *= 2) {
        std::vector<int> blocks;
        for (int f = 0; f + c <= world; f += c) blocks.push_back(f);
        double want = 0, got = 0;
        const BalanceGroup a = least_loaded(load, blocks, c, &want), b = tree.least(c, &got);
        ASSERT_EQ(b.first_rank, a.first_rank) << world << " " << c << " " << step;
        ASSERT_EQ(b.size, c);
        ASSERT_EQ(got, want);
      }
      const int c = 1 << (rng() % std::uint64_t(std::ilogb(top) + 1));
      const int first = c * int(rng() % std::uint64_t(world / c));
      const double seconds = trial % 2 ? double(rng() % 4) : double(rng() % 1000) / 7.0;  // ties, then few
      tree.add(first, c, seconds);
      for (int r = first; r < first + c; ++r) load[std::size_t(r)] += seconds;
      for (int r = 0; r < world; ++r) ASSERT_EQ(tree.load(r), load[std::size_t(r)]);
    }
  }
}

TEST(Balancer, Deterministic) {
  std::mt19937_64 rng(7);
  BalanceInput in = small_model(8, random_lengths(rng, 40));
  for (BalancePolicy p : {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic}) {
    const BalancePlan a = balance(in, p), b = balance(BalanceInput(in), p);
    EXPECT_EQ(a.groups, b.groups) << policy_name(p);
    EXPECT_EQ(a.rank_seconds, b.rank_seconds) << policy_name(p);
  }
}

TEST(Balancer, MemoryCapRaisesTheGroupSize) {
  BalanceInput in = small_model(4, {8192, 512, 512});
  in.memory_per_rank = [](std::int64_t len, int cp) { return 1000.0 * double((len + cp - 1) / cp); };
  in.max_memory = 2.1e6;  // 8192 tokens need 4 ranks (2.048e6), 2 would need 4.096e6
  const BalancePlan d = balance(in, BalancePolicy::dynamic);
  EXPECT_EQ(d.groups[0].size, 4);
  for (double m : d.rank_memory) EXPECT_LE(m, in.max_memory);
  EXPECT_DOUBLE_EQ(*std::max_element(d.rank_memory.begin(), d.rank_memory.end()), 2.048e6);
}

// The message of the Error `f` throws ("" if none), checked identical on every rank.
template <class F>
std::string error_of(F&& f) {
  std::string what;
  try {
    f();
  } catch (const Error& e) {
    what = e.what();
  }
  MpiCommunicator world;
  EXPECT_NO_THROW(world.agree_identical("the balancer's error", what));
  return what;
}

TEST(Balancer, BadInputNamesTheRule) {
  auto has = [](const std::string& what, const std::string& part) {
    EXPECT_NE(what.find(part), std::string::npos) << what;
  };
  has(error_of([] { balance(small_model(2, {}), BalancePolicy::dynamic); }), "the step has no sequences");
  has(error_of([] { balance(small_model(2, {8, 0}), BalancePolicy::pow2); }), "sequence 1 has length 0");
  has(error_of([] {
        BalanceInput in = small_model(4, {8});
        in.dp = 3;
        balance(in, BalancePolicy::static_);
      }),
      "dp 3 does not divide the world size 4");
  for (BalancePolicy p : {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic}) {
    const std::string what = error_of([p] {
      BalanceInput in = small_model(8, {512, 1024, 8192});
      in.memory_per_rank = [](std::int64_t len, int cp) { return 1000.0 * double((len + cp - 1) / cp); };
      in.max_memory = 1e6;
      balance(in, p);
    });
    has(what, "sequence 2 (8192 tokens) fits no");
    if (p != BalancePolicy::static_) has(what, "needs 1024000 bytes per rank even on 8 rank(s)");
  }
  has(error_of([] {
        BalanceInput in = small_model(2, {8});
        in.cp_comm_type = "ring";
        balance(in, BalancePolicy::dynamic);
      }),
      "ring");
  has(error_of([] {
        BalanceInput in = small_model(2, {8});
        in.gemm_flops_rate = -1;
        balance(in, BalancePolicy::dynamic);
      }),
      "gemm_flops_rate must be finite and >= 0");
  has(error_of([] {
        BalanceInput in = small_model(2, {8});
        in.threads = 0;
        balance(in, BalancePolicy::dynamic);
      }),
      "threads must be >= 1, got 0");
  has(error_of([] { parse_policy("best"); }), "'best': expected static, pow2 or dynamic");
  has(error_of([] { predict_plan(small_model(2, {8, 8}), {{0, 2}, {1, 2}}); }), "sequence 1's group [1, 3)");
}

// Plans with one BalanceCosts shared across worlds (the largest first, so the memo holds sizes
// above the smaller worlds) and policies, against each call pricing its own: the same plans and
// errors, bit for bit.
TEST(Balancer, SharedCostsGiveThePlansOfFreshCosts) {
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 6; ++trial) {
    BalanceInput in = small_model(32, random_lengths(rng, 12 + int(rng() % 40)));
    in.cp_comm_type = std::vector<std::string>{"a2a", "p2p", "all_gather", "a2a+p2p"}[trial % 4];
    in.model.cluster.ranks_per_node = 1 << (rng() % 4);
    if (trial % 3 == 2) {
      in.memory_per_rank = [](std::int64_t len, int cp) { return 1000.0 * double((len + cp - 1) / cp); };
      in.max_memory = 4e6;
    }
    BalanceInput shared = in;
    shared.costs = make_balance_costs();
    for (int world : {32, 4, 16, 2, 8}) {
      in.world = shared.world = world;
      in.dp = shared.dp = 1 << (rng() % 2);
      for (BalancePolicy p : {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic}) {
        std::string fresh_error, shared_error;
        BalancePlan a, b;
        try {
          a = balance(in, p);
        } catch (const Error& e) {
          fresh_error = e.what();
        }
        try {
          b = balance(shared, p);
        } catch (const Error& e) {
          shared_error = e.what();
        }
        const std::string where = fmt::format("trial {} world {} {}", trial, world, policy_name(p));
        EXPECT_EQ(fresh_error, shared_error) << where;
        EXPECT_EQ(a.groups, b.groups) << where;
        for (auto v : {&BalancePlan::sequence_seconds, &BalancePlan::rank_seconds, &BalancePlan::rank_memory,
                       &BalancePlan::rank_bytes})
          EXPECT_EQ(a.*v, b.*v) << where;  // bit for bit: the same expressions of the same costs
        EXPECT_EQ(a.step_seconds, b.step_seconds) << where;
      }
    }
  }
}

// The plans of one step at several worlds under every policy, all at once on threads of their own
// sharing one BalanceCosts, each dynamic plan building its candidates on 1-3 threads, against
// each plan priced alone on one thread: the same plans and errors, bit for bit (the threads race
// to price a pair first, which a TSan build checks).
TEST(Balancer, PlansAtOnceSharingCostsAreThoseOfOnePlanAtATime) {
  std::mt19937_64 rng(43);
  constexpr int kWorlds[] = {64, 4, 32, 2, 17};
  constexpr BalancePolicy kAll[] = {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic};
  for (int trial = 0; trial < 4; ++trial) {
    BalanceInput in = small_model(64, random_lengths(rng, 20 + int(rng() % 60)));
    in.cp_comm_type = std::vector<std::string>{"a2a", "p2p", "all_gather", "a2a+p2p"}[trial % 4];
    in.model.cluster.ranks_per_node = 1 << (rng() % 4);
    auto plan = [](BalanceInput x, int world, BalancePolicy p, int threads) {
      x.world = world;
      x.threads = threads;
      try {
        return std::make_pair(balance(x, p), std::string());
      } catch (const Error& e) {
        return std::make_pair(BalancePlan(), std::string(e.what()));
      }
    };
    BalanceInput shared = in;
    shared.costs = make_balance_costs();
    std::vector<std::pair<BalancePlan, std::string>> alone, together(std::size(kWorlds) * 3);
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < std::size(kWorlds); ++k)
      for (std::size_t p = 0; p < 3; ++p) {
        alone.push_back(plan(in, kWorlds[k], kAll[p], 1));
        const int inner = 1 + int(rng() % 3);
        std::pair<BalancePlan, std::string>* out = &together[3 * k + p];
        const int world = kWorlds[k];
        const BalancePolicy policy = kAll[p];
        threads.emplace_back(
            [&shared, &plan, out, world, policy, inner] { *out = plan(shared, world, policy, inner); });
      }
    for (std::thread& t : threads) t.join();
    for (std::size_t t = 0; t < alone.size(); ++t) {
      const BalancePlan &a = alone[t].first, &b = together[t].first;
      const std::string where = fmt::format("trial {} world {} {}", trial, kWorlds[t / 3], policy_name(kAll[t % 3]));
      EXPECT_EQ(alone[t].second, together[t].second) << where;
      EXPECT_EQ(a.groups, b.groups) << where;
      for (auto v : {&BalancePlan::sequence_seconds, &BalancePlan::rank_seconds, &BalancePlan::rank_memory,
                     &BalancePlan::rank_bytes})
        EXPECT_EQ(a.*v, b.*v) << where;
      EXPECT_EQ(a.step_seconds, b.step_seconds) << where;
    }
  }
}

// One memo shared by plans of different steps, worlds and max_tokens_per_rank at once (pow2's
// groups are memoised by all three, dynamic's baselines made on a thread of their own), and
// dynamic plans on several threads without a memo (balance() makes one for the baselines):
// each the plan made alone on one thread, bit for bit.
// A memory model that keeps state between its calls, as the CLI's does (it writes the length
// into a config it then prices): the threads of one dynamic plan must each call their own copy.
// Under TSan (scripts/sanitize thread) a shared call is a reported race; here, the plans alone.
TEST(Balancer, AStatefulMemoryModelOnManyThreadsGivesThePlansOfOnePlanAlone) {
  std::mt19937_64 rng(53);
  for (int k = 0; k < 6; ++k) {
    // Odd k: 6 ranks and a sequence that needs 5 of them, so that pow2 (4 at most) fails, and its
    // error asks the memory model on the baselines' thread too.
    BalanceInput x = small_model(k % 2 ? 6 : 8 << (rng() % 3), random_lengths(rng, 20 + int(rng() % 200)));
    if (k % 2) x.lengths.push_back(10000);
    x.memory_per_rank = [last = std::int64_t(0)](std::int64_t len, int cp) mutable {
      last = len;  // the state: read back at once, as a config's field would be
      return 1e3 * double(last) / double(cp);
    };
    x.max_memory = 1e3 * 2048.0;  // longer sequences need several ranks
    if (k % 2) EXPECT_THROW(balance(x, BalancePolicy::pow2), Error) << k;
    const BalancePlan alone = balance(x, BalancePolicy::dynamic);
    x.threads = 3;
    x.costs = make_balance_costs();
    const BalancePlan together = balance(x, BalancePolicy::dynamic);
    EXPECT_EQ(alone.groups, together.groups) << k;
    EXPECT_EQ(alone.rank_memory, together.rank_memory) << k;
    EXPECT_EQ(alone.step_seconds, together.step_seconds) << k;
  }
}

TEST(Balancer, SharedPow2GroupsAndThreadsGiveThePlansOfOnePlanAlone) {
  std::mt19937_64 rng(47);
  std::vector<BalanceInput> inputs;
  for (int k = 0; k < 14; ++k) {
    const bool again = k % 2 == 1;  // the last step again, with another max_tokens_per_rank (or world)
    BalanceInput x = again ? inputs.back() : small_model(2 << (rng() % 5), random_lengths(rng, 5 + int(rng() % 40)));
    x.max_tokens_per_rank = std::vector<std::int64_t>{0, 256, 4096}[(k + rng() % 2) % 3];
    if (again && rng() % 3 == 0) x.world /= 2;
    inputs.push_back(x);
  }
  auto plan = [](const BalanceInput& x, BalancePolicy p) {
    try {
      return std::make_pair(balance(x, p), std::string());
    } catch (const Error& e) {
      return std::make_pair(BalancePlan(), std::string(e.what()));
    }
  };
  const std::shared_ptr<BalanceCosts> memo = make_balance_costs();
  std::vector<std::pair<BalancePlan, std::string>> alone, together(3 * inputs.size());
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < inputs.size(); ++k)
    for (std::size_t t = 0; t < 3; ++t) {
      const BalancePolicy policy = t == 0 ? BalancePolicy::pow2 : BalancePolicy::dynamic;
      alone.push_back(plan(inputs[k], policy));
      BalanceInput x = inputs[k];
      x.threads = 2 + int(rng() % 2);
      if (t < 2) x.costs = memo;  // t == 2: several threads, no memo of the caller's
      threads.emplace_back([&plan, x, policy, out = &together[3 * k + t]] { *out = plan(x, policy); });
    }
  for (std::thread& t : threads) t.join();
  for (std::size_t t = 0; t < alone.size(); ++t) {
    const std::string where = fmt::format("input {} plan {}", t / 3, t % 3);
    EXPECT_EQ(alone[t].second, together[t].second) << where;
    const BalancePlan &a = alone[t].first, &b = together[t].first;
    EXPECT_EQ(a.groups, b.groups) << where;
    EXPECT_EQ(a.sequence_seconds, b.sequence_seconds) << where;
    EXPECT_EQ(a.rank_seconds, b.rank_seconds) << where;
    EXPECT_EQ(a.step_seconds, b.step_seconds) << where;
  }
}

// decreasing (a radix sort from kRadixFrom keys) is a stable sort by decreasing key: against
// std::stable_sort of the indices on random keys with ties, signed zeros, negatives, infinities
// and magnitudes far apart, on both sides of kRadixFrom.
TEST(Balancer, DecreasingIsAStableSortByDecreasingKey) {
  std::mt19937_64 rng(13);
  const std::size_t radix = balance_detail::kRadixFrom;
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), radix - 1, radix, radix + 1, 5 * radix + 3})
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<double> key(n);
      for (double& k : key) {
        const std::uint64_t r = rng();
        switch (kind) {
          case 0: k = double(r % 5) * 0.5; break;                                         // few values, many ties
          case 1: k = std::ldexp(double(r % 1000) + 1, int(r >> 40) % 200 - 100); break;  // far apart
          case 2: k = double(std::int64_t(r % 7) - 3) * 1.25; break;                      // negatives
          default: k = std::vector<double>{0.0, -0.0, 1e-300, -1e300, INFINITY, -INFINITY, 3.5}[r % 7];
        }
      }
      std::vector<std::size_t> want(n);
      std::iota(want.begin(), want.end(), std::size_t(0));
      std::stable_sort(want.begin(), want.end(), [&](std::size_t a, std::size_t b) { return key[a] > key[b]; });
      EXPECT_EQ(balance_detail::decreasing(key), want) << n << " keys of kind " << kind;
    }
}

// LazyDecreasing reads decreasing's order (by key, ties by index) a chunk at a time: read whole,
// the same order, on random keys with many ties (signed zeros among them) across chunk ends.
TEST(Balancer, LazyDecreasingIsDecreasingsOrder) {
  std::mt19937_64 rng(11);
  for (std::size_t n : {0, 1, 5, 1023, 1024, 1025, 3000, 9000})
    for (std::uint64_t distinct : {1, 3, 1000000}) {
      std::vector<double> key(n);
      for (double& k : key) {
        k = double(rng() % distinct) * 0.25;
        if (k == 0 && rng() % 2) k = -0.0;
      }
      balance_detail::LazyDecreasing lazy(key);
      std::vector<std::size_t> got;
      for (std::size_t at = 0; at < n; ++at) got.push_back(lazy[at]);
      EXPECT_EQ(got, balance_detail::decreasing(key)) << n << " keys, " << distinct << " distinct";
    }
}

// run_jobs runs every job whatever fails, on at most the threads it is given, and rethrows the
// first failure in job order.
TEST(Balancer, RunJobsRunsEveryJobAndRethrowsTheFirstFailure) {
  for (int threads : {1, 2, 5, 40}) {
    std::vector<int> ran(23, 0);
    std::vector<std::function<void()>> jobs;
    for (std::size_t j = 0; j < ran.size(); ++j)
      jobs.push_back([&ran, j] {
        ran[j] += 1;
        if (j == 7 || j == 19) throw std::runtime_error(fmt::format("job {}", j));
      });
    std::string what;
    try {
      balance_detail::run_jobs(jobs, threads);
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    EXPECT_EQ(what, "job 7") << threads;
    EXPECT_EQ(ran, std::vector<int>(23, 1)) << threads;
  }
}

// The step's distinct lengths in order of first appearance, and each sequence's index among
// them, against a scan of the lengths seen so far.
TEST(Balancer, LengthIdsNumberTheDistinctLengthsInOrderOfFirstAppearance) {
  std::mt19937_64 rng(47);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::int64_t> lengths(std::size_t(rng() % 300));
    for (std::int64_t& l : lengths) l = 1 + std::int64_t(rng() % (1 + rng() % 64)) * (trial % 2 ? 4096 : 1);
    const balance_detail::LengthIds ids = balance_detail::length_ids(lengths);
    std::vector<std::int64_t> seen;
    ASSERT_EQ(ids.of.size(), lengths.size());
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const auto at = std::find(seen.begin(), seen.end(), lengths[i]);
      EXPECT_EQ(ids.of[i], std::uint32_t(at - seen.begin())) << trial << " " << i;
      if (at == seen.end()) seen.push_back(lengths[i]);
    }
    EXPECT_EQ(ids.lengths, seen) << trial;
  }
}

// A size refused by its heads alone (cp_heads_error) is refused at every length with
// validate_cp_config's own message, and the balancer's costs read through that memo are
// sequence_cost's, reason and all, for every strategy, GQA split and size up to past the heads.
TEST(Balancer, HeadsErrorsAreTheRefusalsOfEveryLength) {
  std::mt19937_64 rng(53);
  for (int trial = 0; trial < 24; ++trial) {
    BalanceInput in = small_model(64, {1});
    in.cp_comm_type = std::vector<std::string>{"a2a", "p2p", "all_gather", "a2a+p2p"}[trial % 4];
    in.model.heads = 1 + std::int64_t(rng() % 24);
    in.model.kv_heads = trial % 3 == 0 ? 1 + std::int64_t(rng() % 8) : in.model.heads;  // some not dividing
    in.model.causal = trial % 2 == 0;
    if (trial % 5 == 4) in.model.window_left = 128;
    balance_detail::HeadsErrors heads(in);
    for (int size = 1; size <= 40; ++size) {
      const std::string refused = heads.of(size);
      CpConfig cfg{in.cp_comm_type, {}, in.model.causal, std::nullopt};
      cfg.window_left = in.model.window_left;
      for (std::int64_t len :
           {std::int64_t(1), std::int64_t(size), std::int64_t(rng() % 5000 + 1), std::int64_t(65536)}) {
        const std::string where = fmt::format("trial {} {} heads {}/{} size {} length {}", trial, in.cp_comm_type,
                                              in.model.heads, in.model.kv_heads, size, len);
        if (!refused.empty())
          EXPECT_EQ(error_of([&] {
                      validate_cp_config(cfg, size, {in.model.batch, len, in.model.heads, in.model.head_dim},
                                         in.model.kv_heads);
                    }),
                    refused)
              << where;
        std::string plain_error, memo_error;
        SequenceCost plain, memo;
        try {
          plain = sequence_cost(in, len, size);
        } catch (const Error& e) {
          plain_error = e.what();
        }
        try {
          memo = balance_detail::sequence_cost(in, len, size, &heads);
        } catch (const Error& e) {
          memo_error = e.what();
        }
        EXPECT_EQ(plain_error, memo_error) << where;
        EXPECT_EQ(plain.valid, memo.valid) << where;
        EXPECT_EQ(plain.reason, memo.reason) << where;
        EXPECT_EQ(plain.seconds, memo.seconds) << where;
        EXPECT_EQ(plain.bytes, memo.bytes) << where;
      }
    }
  }
}

// The balancer's rows (RowDetail::step) are the planner's full rows in every field they fill,
// for every strategy, shape, mode, window and cp, refused rows and their reasons included.
TEST(Balancer, StepRowsAreTheFullRowsNumbers) {
  std::mt19937_64 rng(61);
  for (int trial = 0; trial < 160; ++trial) {
    PlanInput m;
    m.heads = 1 + std::int64_t(rng() % 32);
    m.kv_heads = trial % 3 == 0 ? 1 + std::int64_t(rng() % 4) : m.heads;
    m.head_dim = 64 << (rng() % 2);
    m.layers = 1 + int(rng() % 4);
    m.seq = 1 + std::int64_t(rng() % 100000);
    m.cp = 1 + int(rng() % 40);
    m.causal = rng() % 4 != 0;
    m.mode = trial % 5 == 4 ? PlanMode::forward : PlanMode::train;
    if (trial % 7 == 6) m.window_left = 512;
    if (trial % 11 == 10 && m.seq > 8) m.documents = {m.seq / 2, m.seq - m.seq / 2};
    for (const Strategy* s : strategies()) {
      const std::string where =
          fmt::format("trial {} {} cp {} seq {} heads {}/{}", trial, s->name(), m.cp, m.seq, m.heads, m.kv_heads);
      std::vector<PlanRow> all, step;
      std::string all_error, step_error;
      try {
        all = strategy_rows(m, *s);
      } catch (const Error& e) {
        all_error = e.what();
      }
      try {
        step = strategy_rows(m, *s, RowDetail::step);
      } catch (const Error& e) {
        step_error = e.what();
      }
      EXPECT_EQ(all_error, step_error) << where;
      ASSERT_EQ(all.size(), step.size()) << where;
      for (std::size_t k = 0; k < all.size(); ++k) {
        const PlanRow &a = all[k], &b = step[k];
        EXPECT_EQ(a.valid, b.valid) << where;
        EXPECT_EQ(a.reason, b.reason) << where;
        EXPECT_EQ(a.config.hierarchical_context_parallel_sizes, b.config.hierarchical_context_parallel_sizes) << where;
        EXPECT_EQ(a.config.overlap_chunks, b.config.overlap_chunks) << where;
        EXPECT_EQ(a.config.zigzag, b.config.zigzag) << where;
        EXPECT_EQ(a.forward_bytes_per_rank, b.forward_bytes_per_rank) << where;
        EXPECT_EQ(a.backward_bytes_per_rank, b.backward_bytes_per_rank) << where;
        EXPECT_EQ(a.work_imbalance, b.work_imbalance) << where;
        EXPECT_EQ(a.compute_s, b.compute_s) << where;
        EXPECT_EQ(a.comm_s, b.comm_s) << where;
        EXPECT_EQ(a.hidden_s, b.hidden_s) << where;
        EXPECT_EQ(a.predicted_step_s, b.predicted_step_s) << where;
      }
    }
  }
}

// Pairs priced through Batches on several threads at once, taken into the table, are the
// table's own prices (sequence_cost's numbers, a memory cap among them), whichever thread priced
// each; a stateful memory model is called by one thread only (the TSan build checks).
TEST(Balancer, BatchesPricedAtOnceAreTheTablesPrices) {
  std::mt19937_64 rng(59);
  for (int trial = 0; trial < 4; ++trial) {
    BalanceInput in = small_model(32, {1});
    in.cp_comm_type = std::vector<std::string>{"a2a", "p2p", "all_gather", "a2a+p2p"}[trial];
    if (trial % 2) in.costs = make_balance_costs();
    // State between calls, as the CLI's memory model keeps: each thread must price on its own copy.
    in.memory_per_rank = [last = std::int64_t(0)](std::int64_t len, int cp) mutable {
      last = len;
      return 1000.0 * double((last + cp - 1) / cp);
    };
    in.max_memory = 2e6;
    std::vector<std::pair<std::int64_t, int>> pairs;
    for (int k = 0; k < 200; ++k) pairs.emplace_back(1 + std::int64_t(rng() % 9000), 1 + int(rng() % 40));
    balance_detail::CostTable table(in);
    table.at(pairs[0].first, pairs[0].second);  // one the table holds before the batches
    std::vector<balance_detail::CostTable::Batch> batches(3, balance_detail::CostTable::Batch(table));
    std::vector<std::vector<balance_detail::CostTable::Cost>> got(3);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        for (std::size_t k = t; k < pairs.size(); k += 3)
          got[t].push_back(batches[t].at(pairs[k].first, pairs[k].second));
      });
    for (std::thread& t : threads) t.join();
    for (const auto& b : batches) table.absorb(b);
    for (std::size_t k = 0; k < pairs.size(); ++k) {
      const SequenceCost want = sequence_cost(in, pairs[k].first, pairs[k].second);
      const balance_detail::CostTable::Cost &batch = got[k % 3][k / 3],
                                            &kept = table.at(pairs[k].first, pairs[k].second);
      EXPECT_EQ(batch.valid, want.valid) << trial << " " << k;
      EXPECT_EQ(batch.seconds, want.seconds) << trial << " " << k;
      EXPECT_EQ(kept.valid, want.valid) << trial << " " << k;
      EXPECT_EQ(kept.seconds, want.seconds) << trial << " " << k;
    }
  }
}

// A size above the world is refused with its world's reason, even once a larger world has put
// that size's cost in the shared memo.
TEST(Balancer, SharedCostsKeepTheWorldsBound) {
  BalanceInput in = small_model(16, {4096, 512});
  in.costs = make_balance_costs();
  balance(in, BalancePolicy::dynamic);
  in.world = 4;
  balance_detail::CostTable costs(in);
  EXPECT_TRUE(balance_detail::CostTable(BalanceInput(small_model(16, {4096}))).at(4096, 8).valid);
  EXPECT_FALSE(costs.at(4096, 8).valid);
  EXPECT_NE(costs.full(0, 8).reason.find("world = 4"), std::string::npos) << costs.full(0, 8).reason;
  EXPECT_TRUE(costs.at(4096, 4).valid);
}

TEST(Balancer, SharedCostsOfAnotherModelAreRefused) {
  const std::string what = error_of([] {
    BalanceInput in = small_model(8, {512, 1024});
    in.costs = make_balance_costs();
    balance(in, BalancePolicy::dynamic);
    in.model.heads = in.model.kv_heads = 16;
    balance(in, BalancePolicy::dynamic);
  });
  EXPECT_NE(what.find("the shared costs (BalanceInput::costs) were made for another model"), std::string::npos) << what;
}

// Every rank gets the same measured rates (the slowest rank's), so every rank plans alike; one
// host: every rank on one node.
TEST(Calibrate, AgreedOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const Calibration c = calibrate(comm, 64, DType::f32, 256, 512);
  EXPECT_GT(c.cluster.peak_flops, 1e8);
  EXPECT_EQ(c.cluster.efficiency, 1.0);
  EXPECT_GT(c.gemm_flops, 1e8);
  EXPECT_EQ(c.cluster.ranks_per_node, comm.size());
  double mine[4] = {c.cluster.peak_flops, c.gemm_flops, c.cluster.intra.bandwidth, c.cluster.alltoall_intra.latency};
  double most[4], least[4];
  std::copy(mine, mine + 4, most);
  for (int i = 0; i < 4; ++i) least[i] = -mine[i];
  comm.allreduce_max(most, 4);
  comm.allreduce_max(least, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(most[i], -least[i]) << "value " << i << " differs across ranks";
  // The share of a ring step's transfer hidden behind its compute: a fraction, every rank's alike.
  for (double f : {c.cluster.intra.overlap, c.cluster.inter.overlap}) {
    EXPECT_TRUE(std::isfinite(f) && f >= 0 && f <= 1) << f;
    double lo = -f, hi = f;
    comm.allreduce_max(&lo, 1);
    comm.allreduce_max(&hi, 1);
    EXPECT_EQ(hi, -lo);
  }
  EXPECT_EQ(calibrate(comm, 64, DType::f32).gemm_flops, 0.0);  // no layer: no GEMM rate
  // A balance input with the calibration predicts with its rates: the GEMMs of one token at its rate.
  BalanceInput in = small_model(1, {512});
  in.model.cluster = c.cluster;
  in.gemm_flops_rate = c.gemm_flops;
  BalanceInput no_gemms = in;
  no_gemms.gemm_flops_per_token = 0;
  EXPECT_NEAR(sequence_cost(in, 512, 1).seconds - sequence_cost(no_gemms, 512, 1).seconds,
              in.gemm_flops_per_token * 512 / c.gemm_flops, 1e-9);
}

TEST(Calibrate, BadInputIsRefusedOnEveryRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  EXPECT_NE(error_of([&] { calibrate(comm, 0, DType::f32); }).find("head_dim must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([&] { calibrate(comm, 64, DType::f32, 256, 0); }).find("[256, 0]"), std::string::npos);
}

}  // namespace
