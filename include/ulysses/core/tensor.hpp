// Tensors of logical shape [b, s, h, d]: batch, sequence, heads, head dim.
//
// TensorView is a non-owning strided view (the kernels' and collectives' argument type);
// the innermost dimension d is always contiguous, the other three have element strides, so
// `bshd`, `sbhd` and fused QKV buffers are all just stride choices.
// Tensor owns 64-byte aligned, zero-initialised storage in one of the layouts, from an
// Allocator of one device (the host's block pool today; a GPU backend adds its own).
// Storage is float32 or bfloat16; all compute and accumulation is float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace ulysses {

enum class DType : int { f32 = 0, bf16 = 1 };
// bhsd is the layout of per-row statistics such as the softmax LSE ([b, h, s], d = 1).
enum class Layout : int { bshd = 0, sbhd = 1, bhsd = 2 };
// Where a tensor's memory lives. Kernels and collectives run on the device of their tensors.
enum class Device : int { cpu = 0 };

std::size_t dtype_size(DType dtype);
const char* to_string(DType dtype);
const char* to_string(Layout layout);
const char* to_string(Device device);
DType parse_dtype(std::string_view name);    // "f32" | "float32" | "bf16" | "bfloat16"
Layout parse_layout(std::string_view name);  // "bshd" | "sbhd" | "bhsd"

struct Shape {
  std::int64_t b = 0, s = 0, h = 0, d = 0;
  // b·s·h·d, checked: throws Error for a negative size or more than kMaxElements (checked.hpp).
  std::int64_t numel() const;
  bool operator==(const Shape&) const = default;
  std::string str() const;  // "[b, s, h, d]" with the numbers
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  std::int64_t stride_b = 0, stride_s = 0, stride_h = 0;  // in elements; d has stride 1
  Device device = Device::cpu;

  // A densely packed view of `data` (memory of `device`) in `layout`.
  static TensorView dense(void* data, DType dtype, Shape shape, Layout layout, Device device = Device::cpu);

  std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return b * stride_b + s * stride_s + h * stride_h;
  }
  // Typed pointer to element (b, s, h, 0). Precondition: the dtype matches.
  float* f32(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return static_cast<float*>(data) + offset(b, s, h);
  }
  std::uint16_t* bf16(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return static_cast<std::uint16_t*>(data) + offset(b, s, h);
  }
  std::byte* row(std::int64_t b, std::int64_t s, std::int64_t h) const {
    return static_cast<std::byte*>(data) + offset(b, s, h) * std::int64_t(dtype_size(dtype));
  }
  // True when this view is a dense block in `layout`.
  bool is_dense(Layout layout) const;
};

// Rows [row, row + n) of a [b, s, h, d] view: the same view, n tokens long from token `row`.
TensorView rows(const TensorView& v, std::int64_t row, std::int64_t n);

// Read one d-long row as float32 / write one float32 row in the view's dtype.
void load_row(const TensorView& view, std::int64_t b, std::int64_t s, std::int64_t h, float* out);
void store_row(const TensorView& view, std::int64_t b, std::int64_t s, std::int64_t h, const float* in);

// "" when `view` has `expected` shape, else "<name> must be <expected>, got <actual>".
std::string shape_error(const char* name, const TensorView& view, const Shape& expected);

// "" when every element of `view` is finite, else "<name> has a non-finite value (nan) at
// [b, s, h, d]" naming the first one in [b, s, h, d] order. Not collective.
std::string nonfinite_error(const char* name, const TensorView& view);

// Copy every element of src into dst (same shape and device; dtypes and strides may differ),
// through the device's table (device_ops.hpp).
void copy(const TensorView& src, const TensorView& dst);

class Tensor;
// A new dense bshd tensor on src's device holding src's elements in `dtype` (a float32
// working copy, or a saved copy of an input in its own dtype).
Tensor copy_of(const TensorView& src, DType dtype);

// Host memory only (tests, tools, the planner's probes). Fill with uniform values in [-1, 1) that depend only on (seed, b, s_offset + s, h, d):
// a shard filled with its global sequence offset equals the same slice of the full tensor.
void fill_uniform(const TensorView& view, std::uint64_t seed, std::int64_t s_offset = 0);

// The log-sum-exp of attention rows for queries of shape q [b, s, h, d]: float32 [b, h, s]
// (as a [b, s, h, 1] tensor in bhsd layout), FlashAttention's softmax_lse, on `device`.
// Uninitialised.
Tensor lse_tensor(const Shape& q, Device device = Device::cpu);

// Bytes held by all live Tensors of this process, and the peak since the last reset: the
// library's working memory, which the memory models of the strategies are checked against.
std::int64_t tensor_bytes_in_use();
std::int64_t tensor_bytes_peak();
void reset_tensor_bytes_peak();

// Memory of one device. Tensors return their blocks to the allocator that made them.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // 64-byte aligned; throws Error when out of memory.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) = 0;
  virtual void fill_zero(void* p, std::size_t bytes) = 0;
};
// The host's allocator: a caching block pool (like PyTorch's CPU caching allocator), so the
// buffers of repeated forward/backward calls are not page-faulted and zeroed every time.
Allocator& host_allocator();

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype = DType::f32, Layout layout = Layout::bshd, Allocator& allocator = host_allocator());
  // Same, but the storage is left uninitialised: for buffers that are overwritten whole
  // (receive buffers, kernel outputs), where zeroing would be a wasted pass over memory.
  static Tensor uninitialized(Shape shape, DType dtype = DType::f32, Layout layout = Layout::bshd,
                              Allocator& allocator = host_allocator());
  // The same on `device`, from its allocator (device_allocator): what code that moves data of
  // any device allocates its buffers with.
  Tensor(Shape shape, DType dtype, Layout layout, Device device);
  static Tensor uninitialized(Shape shape, DType dtype, Layout layout, Device device);

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  Device device() const {
    return data_.get_deleter().allocator ? data_.get_deleter().allocator->device() : Device::cpu;
  }
  std::size_t nbytes() const { return std::size_t(shape_.numel()) * dtype_size(dtype_); }
  void* data() const { return data_.get(); }
  float* f32() const { return static_cast<float*>(data()); }
  TensorView view() const;

 private:
  Tensor(Shape shape, DType dtype, Layout layout, Allocator& allocator, bool zero);
  struct Free {
    Free() : allocator(nullptr), bytes(0) {}
    Free(Allocator* a, std::size_t n) : allocator(a), bytes(n) {}
    Allocator* allocator;
    std::size_t bytes;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  Shape shape_;
  DType dtype_ = DType::f32;
  Layout layout_ = Layout::bshd;
};

}  // namespace ulysses
