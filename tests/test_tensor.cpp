// Tensors (tensor.hpp): blocks return to the allocator they came from, views know their
// device, the LSE layout, and the first non-finite element named.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/tensor.hpp"

using namespace ulysses;

namespace {

// A counting allocator: every Tensor block goes through the allocator it was made with.
class CountingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(std::size_t bytes) override {
    ++live;
    return host_allocator().allocate(bytes);
  }
  void deallocate(void* p, std::size_t bytes) override {
    --live;
    host_allocator().deallocate(p, bytes);
  }
  void fill_zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  int live = 0;
};

TEST(Tensor, BlocksReturnToTheirAllocatorAndViewsKnowTheDevice) {
  CountingAllocator counting;
  {
    Tensor a({1, 4, 2, 8}, DType::f32, Layout::bshd, counting),
        b = Tensor::uninitialized({1, 4, 2, 8}, DType::bf16, Layout::sbhd, counting);
    EXPECT_EQ(counting.live, 2);
    EXPECT_EQ(a.view().device, Device::cpu);
    EXPECT_EQ(a.f32()[5], 0.0f);  // zero-initialised through the allocator
    Tensor moved = std::move(a);
    EXPECT_EQ(counting.live, 2);
  }
  EXPECT_EQ(counting.live, 0);
}

// The host pool hands a freed block to a slightly smaller request (up to an eighth to spare) and
// takes it back under its real size; a request much smaller or larger gets a block of its own.
// Sizes no other test in this process uses, so that the pool holds only this test's blocks.
TEST(Tensor, HostPoolReusesANearSizeAndKeepsTheRealSize) {
  Allocator& pool = host_allocator();
  const std::size_t big = (std::size_t(7) << 20) + 3 * 4096;
  void* a = pool.allocate(big);
  pool.deallocate(a, big);
  void* b = pool.allocate(big - 64 * 4096);  // within an eighth: the same block
  EXPECT_EQ(b, a);
  pool.deallocate(b, big - 64 * 4096);
  void* c = pool.allocate(big);  // back under its real size: it still serves the full request
  EXPECT_EQ(c, a);
  void* d = pool.allocate(big / 2);  // nothing free near half the size: a new block
  EXPECT_NE(d, a);
  std::memset(c, 1, big);  // both usable in full (ASan checks the bounds)
  std::memset(d, 2, big / 2);
  pool.deallocate(d, big / 2);
  pool.deallocate(c, big);
}

TEST(Tensor, LseIsBhsdFloat32) {
  const Tensor lse = lse_tensor({2, 5, 3, 64});
  EXPECT_EQ(lse.shape(), (Shape{2, 5, 3, 1}));
  EXPECT_EQ(lse.dtype(), DType::f32);
  const TensorView v = lse.view();  // element (b, s, h) at b·h·s + h·s + s, as the kernels write it
  EXPECT_EQ(v.offset(1, 4, 2), 1 * 3 * 5 + 2 * 5 + 4);
}

TEST(NonFinite, TheFirstBadElementIsNamed) {
  Tensor t(Shape{1, 3, 2, 4});
  EXPECT_EQ(nonfinite_error("q", t.view()), "");
  t.f32()[1 * 8 + 1 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
  t.f32()[2 * 8] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nonfinite_error("q", t.view()), "q has a non-finite value (nan) at [0, 1, 1, 2]");
}

}  // namespace
