// The watchdog's parts that need no hung job (watchdog_test.sh ends real hung jobs): settings,
// shared with splits; step labels; the deadline loop; collectives completing under a deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "ulysses/core/error.hpp"
#include "worlds.hpp"

using namespace ulysses;

TEST(Watchdog, RefusesNegativeAndNonFiniteTimeouts) {
  Watchdog dog;
  EXPECT_EQ(dog.timeout(), Watchdog::kDefaultTimeout);
  EXPECT_THROW(dog.set_timeout(-1), Error);
  EXPECT_THROW(dog.set_timeout(std::numeric_limits<double>::quiet_NaN()), Error);
  EXPECT_THROW(dog.set_timeout(std::numeric_limits<double>::infinity()), Error);
  dog.set_timeout(0);
  EXPECT_EQ(dog.timeout(), 0);
}

TEST(Watchdog, WaitReturnsWhenDoneAndGivesUpAfterTheTimeout) {
  Watchdog dog(0.05);
  int polls = 0;
  EXPECT_TRUE(dog.wait([&] { return ++polls >= 3; }));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(dog.wait([] { return false; }));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.05);
  EXPECT_LT(waited, 1.0);
}

COMM_TEST(Watchdog, SplitsShareTheSettingAndTheSteps) {
  Communicator& world = comm;
  world.set_timeout(42);
  std::unique_ptr<Communicator> sub = world.split(world.rank() % 2, world.rank());
  EXPECT_EQ(sub->timeout(), 42);
  {
    const WatchdogStep outer(world, "train step 7");
    const WatchdogStep inner(*sub, "ring forward step 1 of 2");
    EXPECT_EQ(world.watchdog().steps(), "train step 7 / ring forward step 1 of 2");
    EXPECT_EQ(world.watchdog().message("rank 0", "allreduce"),
              "ulysses watchdog: rank 0 waited 42 s (the timeout) for allreduce, during train step 7 / ring forward "
              "step 1 of 2; ending the job");
  }
  EXPECT_EQ(world.watchdog().steps(), "");
  EXPECT_EQ(world.watchdog().message("rank 0", "x"),
            "ulysses watchdog: rank 0 waited 42 s (the timeout) for x; ending the job");
}

COMM_TEST(Watchdog, CollectivesAndMessagesCompleteUnderADeadline) {
  Communicator& world = comm;
  world.set_timeout(60);
  double x = 1;
  world.allreduce_sum(&x, 1);
  EXPECT_EQ(x, world.size());
  const std::vector<std::int64_t> ranks = world.allgather_value(world.rank());
  for (int r = 0; r < world.size(); ++r) EXPECT_EQ(ranks[std::size_t(r)], r);
  int got = -1;
  const int right = (world.rank() + 1) % world.size(), left = (world.rank() + world.size() - 1) % world.size();
  const int mine = world.rank();
  Request recv = world.irecv({&got, sizeof(got)}, left, 3);
  world.isend({&mine, sizeof(mine)}, right, 3).wait();
  recv.wait();
  EXPECT_EQ(got, left);
  world.barrier();
}
