// DP × CP training on variable-length steps: under every balance policy and every dp that
// divides the world, the losses and weight gradients equal one rank training the whole global
// batch (fixed batches, --lengths of several lengths that divide nothing, whole documents
// under a token budget, packed documents); and every bad input gives the same error on every
// rank before any data moves.
#include <optional>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>

#include "mpi_helpers.hpp"
#include "train_test_util.hpp"
#include "train/memory.hpp"
#include "train/trainer.hpp"
#include "ulysses/core/lengths.hpp"

using namespace ulysses;
using namespace ulysses::train;

namespace {

constexpr BalancePolicy kPolicies[] = {BalancePolicy::static_, BalancePolicy::pow2, BalancePolicy::dynamic};

// The small model on batches of 4, a few steps of the default 300-step schedule.
TrainConfig tiny(const std::string& strategy) {
  TrainConfig t = train_test::small_config({strategy, {}, true, std::nullopt});
  t.batch = 4;
  t.steps = 300;
  t.warmup = 2;
  t.seed = 5;
  return t;
}

// Documents of 9 to max_len + 8 bytes, one per line, written once per job (rank 0) and read by all.
std::string documents_file(Communicator& comm, const std::string& name, int count, int max_len) {
  std::int64_t pid = getpid();
  comm.broadcast(&pid, sizeof(pid), 0);
  const std::string path = fmt::format("/tmp/ulysses_test_dp_{}_{}.txt", pid, name);
  if (comm.rank() == 0) {
    std::ofstream f(path);
    for (int i = 0; i < count; ++i) f << std::string(std::size_t(8 + (i * 7) % max_len), char('a' + i % 26)) << "b\n";
  }
  comm.barrier();
  return path;
}

// The balancer branch may not have implemented a policy yet: its error says so, on every rank.
bool implemented(Communicator& world, const TrainConfig& c, const std::function<DataSource()>& data) {
  try {
    Trainer t(world, c, data());
    t.plan_step(0, false);
  } catch (const Error& e) {
    if (std::string(e.what()).find("not implemented yet") != std::string::npos) return false;
    throw;
  }
  return true;
}

// The first step's gradient and three steps' losses of `c` against one rank (dp 1, static):
// every policy, every dp dividing the world, the given strategies.
void expect_like_one_rank(TrainConfig c, const std::function<DataSource()>& data,
                          const std::vector<std::string>& strategies) {
  MpiCommunicator world, self(MPI_COMM_SELF);
  TrainConfig one_cfg = c;
  one_cfg.cp = {"a2a", {}, true, std::nullopt};
  std::vector<float> g1;
  std::vector<double> ref;
  {
    Trainer one(self, one_cfg, data());
    one.compute_gradients(0);
    g1 = one.gradients();
    for (int i = 0; i < 3; ++i) ref.push_back(one.step().loss);
  }
  for (const BalancePolicy policy : kPolicies)
    for (int dp = 1; dp <= world.size(); ++dp) {
      if (world.size() % dp != 0) continue;
      for (const std::string& strategy : strategies) {
        c.cp = {strategy, {}, true, std::nullopt};
        c.dp = dp;
        c.balance = policy;
        SCOPED_TRACE(fmt::format("{} policy, dp {}, {} on {} ranks", policy_name(policy), dp, strategy, world.size()));
        if (!implemented(world, c, data)) continue;  // covered once the balancer branch merges
        Trainer t(world, c, data());
        t.compute_gradients(0);
        EXPECT_LT(train_test::relative_distance(t.gradients(), g1), 1e-5) << "weight gradients differ from one rank";
        double worst = 0;
        for (int i = 0; i < 3; ++i) {
          const StepResult r = t.step();
          worst = std::max(worst, std::abs(r.loss - ref[std::size_t(i)]) / ref[std::size_t(i)]);
          ASSERT_EQ(r.idle_s.size(), std::size_t(world.size()));
        }
        EXPECT_LT(worst, 1e-5) << "losses differ from one rank";
      }
    }
}

TEST(DpTimesCp, FixedBatchesTrainLikeOneRank) {
  expect_like_one_rank(tiny("a2a"), [] { return DataSource::synthetic(); }, {"a2a", "p2p"});
}

TEST(DpTimesCp, SequencesOfManyLengthsTrainLikeOneRank) {
  // Lengths that divide by nothing, two of one length (one batch on their group), one long.
  TrainConfig c = tiny("p2p");
  c.lengths = parse_lengths("97,2x64,131,70");
  expect_like_one_rank(c, [] { return DataSource::synthetic(); }, {"p2p", "all_gather"});
}

TEST(DpTimesCp, WholeDocumentsUnderATokenBudgetTrainLikeOneRank) {
  MpiCommunicator world;
  const std::string path = documents_file(world, "whole", 40, 40);
  TrainConfig c = tiny("p2p");
  c.tokens_per_step = 120;
  {
    const DataSource d = DataSource::documents(path, "\n");
    for (std::int64_t step = 0; step < 4; ++step) {
      const std::vector<SequenceLayout> seqs = d.step_layout(c.shape(), c.seed, step, false);
      std::int64_t tokens = 0;
      for (const SequenceLayout& l : seqs) {
        tokens += l.length;
        const Batch b = d.sequence(l, c.seed, step, false);
        EXPECT_EQ(b.labels.back(), kNoLabel) << "a document's last token predicts nothing";
        EXPECT_EQ(b.targets(), l.targets);
        EXPECT_EQ(b.tokens[std::size_t(l.length - 1)], 'b');  // each document whole: its own line, its end
      }
      EXPECT_LE(tokens, 120);
      EXPECT_GT(seqs.size(), 2u);
    }
  }
  expect_like_one_rank(c, [&] { return DataSource::documents(path, "\n"); }, {"p2p"});
}

TEST(DpTimesCp, PackedSequencesOfTwoLengthsTrainLikeOneRank) {
  MpiCommunicator world;
  const std::string path = documents_file(world, "packed", 60, 40);
  TrainConfig c = tiny("p2p");
  c.lengths = {150, 90};
  {
    const DataSource d = DataSource::packed_documents(path, "\n");
    for (const SequenceLayout& l : d.step_layout(c.shape(), c.seed, 0, false)) {
      const Batch b = d.sequence(l, c.seed, 0, false);
      EXPECT_EQ(b.cu_seqlens, l.cu_seqlens) << "the layout every rank knows is the loaded sequence's";
      EXPECT_EQ(b.targets(), l.targets);
      EXPECT_GT(l.cu_seqlens.size(), 3u);
    }
  }
  expect_like_one_rank(c, [&] { return DataSource::packed_documents(path, "\n"); }, {"p2p", "a2a"});
}

TEST(DpTimesCp, StepsReportEveryRanksIdleTimeAndTheirTokens) {
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.lengths = parse_lengths("1x200,3x64");
  Trainer t(world, c, DataSource::synthetic());
  const StepResult r = t.step();
  EXPECT_EQ(r.tokens, 392);
  EXPECT_EQ(r.sequences, 4);
  ASSERT_EQ(r.idle_s.size(), std::size_t(world.size()));
  for (double idle : r.idle_s) {
    EXPECT_GE(idle, 0.0);
    EXPECT_LE(idle, r.seconds);
  }
}

TEST(DpTimesCp, AStepPlanCarriesEachGroupsConfigurationAndEveryMembersTokens) {
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.lengths = parse_lengths("97,2x64,131");
  c.balance = BalancePolicy::dynamic;
  Trainer t(world, c, DataSource::synthetic());
  const Trainer::StepPlan p = t.plan_step(0, false);
  ASSERT_EQ(p.placements.size(), p.sequences.size());
  for (std::size_t i = 0; i < p.sequences.size(); ++i) {
    const Placement& place = p.placements[i];
    EXPECT_EQ(place.group.first_rank, p.plan.groups[i].first_rank);
    ASSERT_EQ(int(place.chunks.size()), p.plan.groups[i].size);
    ASSERT_EQ(p.configs.count(place.group.size), 1u) << "no configuration for a group of " << place.group.size;
    EXPECT_TRUE(p.configs.at(place.group.size).causal);
    std::vector<int> owners(std::size_t(p.sequences[i].length), 0);  // every token on exactly one member
    for (int r = place.group.first_rank; r < place.group.first_rank + place.group.size; ++r)
      for (std::int64_t q : token_positions(place.of(r))) ++owners.at(std::size_t(q));
    EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), std::int64_t(owners.size())) << "sequence " << i;
  }
}

TEST(DpTimesCp, CalibrationTimesTheModelAndLeavesItAsItWas) {
  // Static at dp 1 plans the same groups whatever the rates, so the probe's forward + backward
  // may change nothing: the gradient and the step equal an uncalibrated run's exactly.
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.lengths = parse_lengths("97,2x64");
  Trainer plain(world, c, DataSource::synthetic());
  c.calibrate = true;
  Trainer timed(world, c, DataSource::synthetic());
  ASSERT_TRUE(timed.calibration().has_value());
  const double rate = timed.calibration()->gemm_flops;
  EXPECT_TRUE(rate > 0 && std::isfinite(rate)) << rate;
  plain.compute_gradients(0);
  timed.compute_gradients(0);
  EXPECT_EQ(timed.gradients(), plain.gradients());
  const double loss = plain.step().loss;  // collective: one trainer at a time, in the same order on every rank
  EXPECT_EQ(timed.step().loss, loss);
  EXPECT_EQ(timed.parameters(), plain.parameters());
}

// ---- bad input: the same error on every rank, before any data moves --------------------------

TEST(DpTimesCpBadInput, DpThatDoesNotDivideTheWorld) {
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.dp = world.size() + 1;
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); },
      fmt::format("--dp {} must divide the world size {}", world.size() + 1, world.size()));
}

TEST(DpTimesCpBadInput, TokenBudgetSmallerThanADocument) {
  MpiCommunicator world;
  const std::string path = documents_file(world, "budget", 40, 40);
  TrainConfig c = tiny("p2p");
  c.tokens_per_step = 30;  // documents have up to 48 tokens
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::documents(path, "\n")); },
      fmt::format("--data {}: the document 5 (line 5, byte 82) has 37 token(s): --tokens-per-step 30 is smaller",
                  path));
}

TEST(DpTimesCpBadInput, EmptyBatches) {
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.batch = 0;
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer t(world, c, DataSource::synthetic()); }, "batch (0) and seq (96) must be positive");
  // Documents of one byte: none has a label to learn, refused before any step (the first named).
  std::int64_t pid = getpid();
  world.broadcast(&pid, sizeof(pid), 0);
  const std::string path = fmt::format("/tmp/ulysses_test_dp_{}_bytes.txt", pid);
  if (world.rank() == 0) std::ofstream(path) << "a\nb\nc\n";
  world.barrier();
  c = tiny("p2p");
  c.tokens_per_step = 64;  // all three documents, not one label among them
  ulysses::testing::expect_same_error_everywhere(
      world, [&] { Trainer(world, c, DataSource::documents(path, "\n")); },
      fmt::format("--data {}: the document 1 (line 1, byte 0) has 1 token(s): a document needs 2 tokens or more",
                  path));
}

TEST(DpTimesCpBadInput, LengthsThatParseToNothing) {
  MpiCommunicator world;
  ulysses::testing::expect_same_error_everywhere(
      world, [] { parse_lengths(""); }, "no sequence");
  ulysses::testing::expect_same_error_everywhere(
      world, [] { parse_lengths("0x512"); }, "--lengths term '0x512'");
}

TEST(DpTimesCpBadInput, ASequenceThatFitsNoGroupUnderTheMemoryCap) {
  MpiCommunicator world;
  for (const BalancePolicy policy : kPolicies) {
    SCOPED_TRACE(policy_name(policy));
    TrainConfig c = tiny("p2p");
    c.lengths = {96, 3000};
    c.balance = policy;
    TrainConfig one = c;
    one.batch = 1;
    one.seq = 3000;
    c.max_memory = predict_memory(one, world.size()).total() * 0.98;  // not even on every rank
    TrainConfig probe = tiny("p2p");
    probe.balance = policy;
    if (!implemented(world, probe, [] { return DataSource::synthetic(); })) continue;
    ulysses::testing::expect_same_error_everywhere(
        world, [&] { Trainer(world, c, DataSource::synthetic()).step(); }, "3000");
  }
}

}  // namespace

// Same-length sequences that the cap splits run in equal pieces (4, 3, 3 of 10, not the greedy
// 4, 4, 2): the memory model prices the largest piece.
TEST(DpTimesCp, ASplitBatchRunsInEqualPieces) {
  MpiCommunicator world;
  TrainConfig c = tiny("p2p");
  c.lengths = std::vector<std::int64_t>(10, 64);
  TrainConfig four = c;
  four.lengths.clear();
  four.batch = 4;
  four.seq = 64;
  c.max_memory = predict_memory(four, world.size()).total() * 1.001;
  Trainer t(world, c, DataSource::synthetic());
  std::vector<std::size_t> pieces;
  for (const Trainer::Run& r : t.plan_step(0, false).runs) pieces.push_back(r.sequences.size());
  EXPECT_EQ(pieces, (std::vector<std::size_t>{4, 3, 3}));
}
