#include <gtest/gtest.h>

#include <algorithm>

#include "ulysses/core/error.hpp"
#include "ulysses/core/lengths.hpp"

namespace {

using ulysses::parse_lengths;

TEST(Lengths, RepeatsInOrder) {
  EXPECT_EQ(parse_lengths("1x16384,3x512"), (std::vector<std::int64_t>{16384, 512, 512, 512}));
  EXPECT_EQ(parse_lengths("7"), (std::vector<std::int64_t>{7}));
  EXPECT_EQ(ulysses::describe_lengths(parse_lengths("2x8,1x4,8")), "2x8,1x4,1x8");
}

TEST(Lengths, ParetoIsBoundedDeterministicAndLongTailed) {
  const auto a = parse_lengths("pareto:2000:256:32768:1.2:7");
  ASSERT_EQ(a.size(), 2000u);
  EXPECT_EQ(a, parse_lengths("pareto:2000:256:32768:1.2:7"));
  EXPECT_NE(a, parse_lengths("pareto:2000:256:32768:1.2:8"));
  EXPECT_GE(*std::min_element(a.begin(), a.end()), 256);
  EXPECT_LE(*std::max_element(a.begin(), a.end()), 32768);
  // Bounded Pareto, alpha 1.2 on [256, 32768]: P(X <= 512) = (1 - 2^-1.2) / (1 - 128^-1.2) = 0.5663.
  const auto short_ones = std::count_if(a.begin(), a.end(), [](std::int64_t l) { return l <= 512; });
  EXPECT_NEAR(double(short_ones) / 2000.0, 0.5663, 0.04);
}

TEST(Lengths, BadSpecsNameTheTerm) {
  for (const char* bad : {"", ",", "1x", "x5", "0x5", "2x0", "3x-1", "abc", "1x8,", "pareto:4:10:5:1",
                          "pareto:4:10:20:0", "pareto:4:10:20", "pareto:4:10:20:nan", "99999999999x1"}) {
    EXPECT_THROW(parse_lengths(bad), ulysses::Error) << bad;
  }
  try {
    parse_lengths("4x8,2xq");
    FAIL();
  } catch (const ulysses::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'2xq'"), std::string::npos) << e.what();
  }
}

}  // namespace
