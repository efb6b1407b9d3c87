// The data movement of one device, behind one table (oneDNN's and OpenBLAS' dispatch: one
// contract, an implementation per device). The strategies, the all-to-all's pack/unpack and
// the sharding helpers never touch tensor memory themselves: they build views and call these,
// so a device whose memory the host cannot read (a GPU) is one more table, registered by its
// backend, plus its Allocator, kernels and communicator. The CPU's table is built in.
//
// Every operation takes views on the table's device (d contiguous, the other strides free)
// and returns when its writes are visible to the next operation on that device.
#pragma once

#include <array>
#include <cstddef>
#include <span>

#include "ulysses/core/error.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

struct ViewCopy {
  TensorView src, dst;  // same shape; dtypes may differ (converted through float32)
};

struct DeviceOps {
  Device device = Device::cpu;
  Allocator* allocator = nullptr;  // where Tensors on this device live
  // Every dst = src, the copies' rows spread over the device's threads together: the
  // all-to-all's pack and unpack are one call each. The destinations must not overlap.
  void (*copy)(std::span<const ViewCopy> copies) = nullptr;
  // Every element of dst = value.
  void (*fill)(const TensorView& dst, float value) = nullptr;
  // dst += src, float32 views of one shape.
  void (*accumulate)(const TensorView& dst, const TensorView& src) = nullptr;
  // dst = Σ srcs in the order given, added in float32 from 0 (any dtypes): a head that several
  // ranks hold gets the sum of their gradients.
  void (*sum)(const TensorView& dst, std::span<const TensorView> srcs) = nullptr;
  // Merges the partial attention result (part, part_lse) into (acc, acc_lse) by their
  // log-sum-exp: acc, part float32 [b, n, h, d]; the lse float32 bhsd [b, n, h, 1] (merge.hpp).
  void (*merge)(const TensorView& acc, const TensorView& acc_lse, const TensorView& part,
                const TensorView& part_lse) = nullptr;
  // Bytes between this device's memory and the host's, for a communicator that reaches only
  // host memory (it stages through host buffers).
  void (*to_host)(void* host, const void* src, std::size_t bytes) = nullptr;
  void (*from_host)(void* dst, const void* host, std::size_t bytes) = nullptr;
};

// The table of `device`; throws Error when no backend registered one.
const DeviceOps& device_ops(Device device);
// The allocator of `device` (device_ops(device).allocator).
Allocator& device_allocator(Device device);
// Makes `ops` the table of ops.device (replacing the previous one; the CPU's can be replaced
// too, for tests). `ops` must outlive its use. Not thread-safe against concurrent lookups:
// backends register at start-up.
void register_device_ops(const DeviceOps& ops);

// One registered table per device (this one's, the kernels'): what a backend adds at start-up.
template <class Table>
class PerDevice {
 public:
  static constexpr std::size_t kDevices = 8;  // Device values a table can be registered for
  // The table of `device`, or null.
  const Table* find(Device device) const {
    const auto i = std::size_t(device);
    return i < kDevices ? at_[i] : nullptr;
  }
  void set(const Table& table) {
    const auto i = std::size_t(table.device);
    if (i >= kDevices) throw Error("a device table's device is out of range");
    at_[i] = &table;
  }

 private:
  std::array<const Table*, kDevices> at_{};
};

// The table of the views' device, after checking they all are on it (Error otherwise).
const DeviceOps& ops_for(std::initializer_list<const TensorView*> views);

}  // namespace ulysses
