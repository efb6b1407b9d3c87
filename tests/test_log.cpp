// The training log's cut on --resume (train/log.hpp): the bytes kept are exactly the lines
// through the checkpoint's step, whatever a kill or an earlier resume left behind.
#include <gtest/gtest.h>

#include <string>

#include "train/log.hpp"

using namespace ulysses;

namespace {

TEST(TrainLog, ResumeKeepsTheStepsThroughTheCheckpoint) {
  const std::string log = "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 1}\n{\"step\": 3, \"loss\": 0.5}\n";
  EXPECT_EQ(train::log_bytes_through_step(log, 2), log.find("{\"step\": 3"));
  EXPECT_EQ(train::log_bytes_through_step(log, 3), log.size());
  EXPECT_EQ(train::log_bytes_through_step(log, 0), 0u);
  EXPECT_EQ(train::log_bytes_through_step(log + "{\"step\": 4, \"lo", 9), log.size());  // a line cut by a kill
  const std::string repeated = log + "{\"step\": 2, \"loss\": 1}\n";                    // an earlier resume's repeat
  EXPECT_EQ(train::log_bytes_through_step(repeated, 3), log.size());
  EXPECT_EQ(train::log_bytes_through_step("garbage\n" + log, 3), 0u);
  EXPECT_EQ(train::log_bytes_through_step("{\"step\": 12x, \"a\": 1}\n", 20), 0u);
}

}  // namespace
