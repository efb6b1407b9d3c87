// Overflow-checked size arithmetic (checked.hpp): products that overflow are errors that name
// the tensor, and the shapes that used to wrap are refused.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "ulysses/core/checked.hpp"
#include "ulysses/core/tensor.hpp"

using namespace ulysses;
using test_util::error_of;

namespace {

TEST(Checked, ProductsThatOverflowAreErrors) {
  EXPECT_EQ(checked_product({4, 1 << 20, 2, 4}, "x"), std::int64_t(32) << 20);
  EXPECT_NE(error_of([] { checked_product({4, 1152921504606846978, 2, 4}, "q"); }).find("q: "), std::string::npos);
  EXPECT_NE(error_of([] { checked_mul(-1, 2, "q"); }).find("negative"), std::string::npos);
  // Both overflow reproducers' shapes are refused, not wrapped.
  EXPECT_EQ(error_of([] {
              (void)Shape{4, 1152921504606846978, 2, 4}.numel();
            }),
            "tensor shape [4, 1152921504606846978, 2, 4] is too large: more than 2^56 elements");
  EXPECT_NE(error_of([] { (void)Shape{1, 4611686018427387904, 8, 64}.numel(); }).find("too large"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor t(Shape{1, 1ll << 50, 64, 64}); }).find("too large"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor t(Shape{1, -3, 2, 2}); }).find("negative"), std::string::npos);
  EXPECT_EQ((Shape{2, 3, 4, 5}.numel()), 120);
}

}  // namespace
