#include "ulysses/core/tensor.hpp"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "enum_names.hpp"
#include "ulysses/core/bf16.hpp"
#include "ulysses/core/checked.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

const char* to_string(DType dtype) { return dtype == DType::f32 ? "f32" : "bf16"; }

constexpr EnumName<Layout> kLayoutNames[] = {{Layout::bshd, "bshd"}, {Layout::sbhd, "sbhd"}, {Layout::bhsd, "bhsd"}};

const char* to_string(Layout layout) { return enum_name(kLayoutNames, layout); }

const char* to_string(Device device) { return device == Device::cpu ? "cpu" : "unknown device"; }

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw Error(fmt::format("unknown dtype '{}': expected f32 or bf16", name));
}

Layout parse_layout(std::string_view name) { return parse_enum(kLayoutNames, name, "unknown layout"); }

std::string Shape::str() const { return fmt::format("[{}, {}, {}, {}]", b, s, h, d); }

std::int64_t Shape::numel() const {
  if (b < 0 || s < 0 || h < 0 || d < 0) throw Error(fmt::format("tensor shape {} has a negative size", str()));
  std::int64_t n = 0;
  if (__builtin_mul_overflow(b, s, &n) || __builtin_mul_overflow(n, h, &n) || __builtin_mul_overflow(n, d, &n) ||
      n > kMaxElements)
    throw Error(fmt::format("tensor shape {} is too large: more than 2^56 elements", str()));
  return n;
}

TensorView TensorView::dense(void* data, DType dtype, Shape shape, Layout layout, Device device) {
  TensorView v{data, dtype, shape, 0, 0, 0, device};
  switch (layout) {
    case Layout::bshd:
      v.stride_h = shape.d;
      v.stride_s = shape.h * shape.d;
      v.stride_b = shape.s * v.stride_s;
      break;
    case Layout::sbhd:
      v.stride_h = shape.d;
      v.stride_b = shape.h * shape.d;
      v.stride_s = shape.b * v.stride_b;
      break;
    case Layout::bhsd:
      v.stride_s = shape.d;
      v.stride_h = shape.s * shape.d;
      v.stride_b = shape.h * v.stride_h;
      break;
  }
  return v;
}

bool TensorView::is_dense(Layout layout) const {
  TensorView d = dense(data, dtype, shape, layout, device);
  return d.stride_b == stride_b && d.stride_s == stride_s && d.stride_h == stride_h;
}

TensorView rows(const TensorView& v, std::int64_t row, std::int64_t n) {
  TensorView r = v;
  r.data = v.row(0, row, 0);
  r.shape.s = n;
  return r;
}

void load_row(const TensorView& v, std::int64_t b, std::int64_t s, std::int64_t h, float* out) {
  if (v.dtype == DType::f32) {
    std::memcpy(out, v.f32(b, s, h), std::size_t(v.shape.d) * 4);
  } else {
    const std::uint16_t* p = v.bf16(b, s, h);
    for (std::int64_t i = 0; i < v.shape.d; ++i) out[i] = bf16_to_float(p[i]);
  }
}

void store_row(const TensorView& v, std::int64_t b, std::int64_t s, std::int64_t h, const float* in) {
  if (v.dtype == DType::f32) {
    std::memcpy(v.f32(b, s, h), in, std::size_t(v.shape.d) * 4);
  } else {
    std::uint16_t* p = v.bf16(b, s, h);
    for (std::int64_t i = 0; i < v.shape.d; ++i) p[i] = float_to_bf16(in[i]);
  }
}

namespace {
// f(b, s, h, row) for every row of `sh`, in parallel; `row` is a per-thread scratch of d floats.
template <class F>
void parallel_rows(const Shape& sh, F f) {
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(sh.d));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t s = 0; s < sh.s; ++s)
        for (std::int64_t h = 0; h < sh.h; ++h) f(b, s, h, row.data());
  }
}
}  // namespace

void copy(const TensorView& src, const TensorView& dst) {
  if (!(src.shape == dst.shape))
    throw Error(fmt::format("copy: shapes differ, {} vs {}", src.shape.str(), dst.shape.str()));
  const ViewCopy c{src, dst};
  ops_for({&src, &dst}).copy({&c, 1});
}

namespace {
std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void fill_uniform(const TensorView& view, std::uint64_t seed, std::int64_t s_offset) {
  parallel_rows(view.shape, [&](std::int64_t b, std::int64_t s, std::int64_t h, float* row) {
    const std::uint64_t base =
        mix(mix(mix(mix(seed) ^ std::uint64_t(b)) ^ std::uint64_t(s + s_offset)) ^ std::uint64_t(h));
    for (std::int64_t d = 0; d < view.shape.d; ++d) {
      const std::uint64_t r = mix(base ^ std::uint64_t(d));
      row[d] = float(double(r >> 40) / double(1ull << 24) * 2.0 - 1.0);
    }
    store_row(view, b, s, h, row);
  });
}

std::string nonfinite_error(const char* name, const TensorView& v) {
  const Shape& sh = v.shape;
  std::vector<float> row(static_cast<std::size_t>(sh.d));
  for (std::int64_t b = 0; b < sh.b; ++b)
    for (std::int64_t s = 0; s < sh.s; ++s)
      for (std::int64_t h = 0; h < sh.h; ++h) {
        load_row(v, b, s, h, row.data());
        for (std::int64_t d = 0; d < sh.d; ++d)
          if (!std::isfinite(row[std::size_t(d)]))
            return fmt::format("{} has a non-finite value ({}) at [{}, {}, {}, {}]", name, row[std::size_t(d)], b, s, h,
                               d);
      }
  return "";
}

std::string shape_error(const char* name, const TensorView& view, const Shape& expected) {
  if (view.shape == expected) return "";
  return fmt::format("{} must be {}, got {}", name, expected.str(), view.shape.str());
}

namespace {
std::atomic<std::int64_t> g_in_use{0}, g_peak{0};

// The host allocator: freed large blocks are kept by size and handed out again. Bounded;
// blocks below 64 KiB go straight to malloc. Large blocks round to whole pages so that near
// sizes share pool entries. What it holds (handed out + kept) never passes the most it has had
// handed out at once: a block that no kept one fits first releases kept ones, so the process
// holds what its busiest moment needs (what the memory models count), not that plus blocks of
// the sizes an earlier phase used (the forward's all-to-all buffers during the backward: 1.08x
// a training step's predicted peak).
class BlockPool final : public Allocator {
 public:
  static constexpr std::size_t kMinBytes = 64 << 10, kMaxPooled = std::size_t(2) << 30;
  static constexpr std::size_t kHugeAdviceBytes = 8 << 20;  // four huge pages or more
  Device device() const override { return Device::cpu; }
  void* allocate(std::size_t bytes) override {
    const std::size_t size = rounded(bytes);
    void* p = take(size);
    if (!p) {
      if (size >= kMinBytes) release_above_high_water(size);
      p = obtain(size);
    }
    if (!p) throw Error(fmt::format("out of memory allocating {} bytes", bytes));
    if (size >= kMinBytes) note_out(std::int64_t(size));
    return p;
  }
  void deallocate(void* p, std::size_t bytes) override {
    if (rounded(bytes) >= kMinBytes) note_out(-std::int64_t(rounded(bytes)));
    give(p, rounded(bytes));
  }
  void fill_zero(void* p, std::size_t bytes) override { std::memset(p, 0, bytes); }
  ~BlockPool() override {
    for (auto& [n, list] : free_)
      for (void* p : list) drop(p, n);
  }

 private:
  // Large blocks are mapped, not taken from malloc's heap: a released one goes back to the
  // system at once, and the heap's other blocks cannot pin it there (with the trainer's
  // mallopt, a freed heap block stays resident until the heap above it is free too).
  static void* obtain(std::size_t bytes) {
    if (bytes < kMinBytes) return std::aligned_alloc(64, bytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    // Blocks of several huge pages ask for them (the hosts run transparent huge pages in
    // "madvise" mode): a stream through a block past the caches, a decode step's read of its KV
    // cache, walks one TLB entry per 2 MiB instead of per 4 KiB (measured on one core: a 256 MiB
    // read at 18.2-18.6 GB/s against 10.1), and a new block faults in 512x fewer times. A block
    // is written whole before it is read (tensors are zeroed or filled), so what is resident
    // stays what the memory model counts. Advice only: a kernel without it keeps small pages.
    if (bytes >= kHugeAdviceBytes) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  }
  static void drop(void* p, std::size_t bytes) {
    if (bytes < kMinBytes) return std::free(p);
    munmap(p, bytes);
  }
  static std::size_t rounded(std::size_t bytes) {
    const std::size_t r = bytes < kMinBytes ? (bytes + 63) / 64 * 64 : (bytes + 4095) / 4096 * 4096;
    return r == 0 ? 64 : r;
  }
  void* take(std::size_t bytes) {
    if (bytes < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest free block with at most an eighth to spare, not only one of the same size:
    // a step's pieces differ by a sequence or so (a batch of 512 split as 171, 171, 170), and an
    // exact-size pool would keep the earlier pieces' blocks while the last one allocated all of
    // its own (measured: peak RSS 1.28x the model's instead of 1.10x).
    auto it = free_.lower_bound(bytes);
    while (it != free_.end() && it->second.empty()) ++it;
    if (it == free_.end() || it->first > bytes + bytes / 8) return nullptr;
    const std::size_t size = it->first;
    void* p = it->second.back();
    it->second.pop_back();
    pooled_ -= size;
    if (size != bytes) larger_[p] = size;  // given back under the size it really has
    return p;
  }
  void note_out(std::int64_t delta) {
    std::lock_guard<std::mutex> lock(mu_);
    out_ += delta;
    high_water_ = std::max(high_water_, out_);
  }
  // Frees kept blocks, largest first, until a new block of `bytes` fits under the high-water.
  void release_above_high_water(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::int64_t limit = std::max(high_water_, out_ + std::int64_t(bytes));
    for (auto it = free_.rbegin(); it != free_.rend(); ++it)
      while (!it->second.empty() && out_ + std::int64_t(pooled_ + bytes) > limit) {
        drop(it->second.back(), it->first);
        it->second.pop_back();
        pooled_ -= it->first;
      }
  }
  void give(void* p, std::size_t bytes) {
    if (bytes >= kMinBytes && bytes <= kMaxPooled) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto real = larger_.find(p); real != larger_.end()) bytes = real->second, larger_.erase(real);
      // Make room by releasing other sizes, largest first: the newest size is the one in use.
      for (auto it = free_.rbegin(); pooled_ + bytes > kMaxPooled && it != free_.rend(); ++it) {
        if (it->first == bytes) continue;
        while (!it->second.empty() && pooled_ + bytes > kMaxPooled) {
          drop(it->second.back(), it->first);
          it->second.pop_back();
          pooled_ -= it->first;
        }
      }
      if (pooled_ + bytes <= kMaxPooled) {
        free_[bytes].push_back(p);
        pooled_ += bytes;
        return;
      }
    }
    drop(p, bytes);
  }

  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size
  std::unordered_map<void*, std::size_t> larger_;   // blocks handed out for a smaller size
  std::size_t pooled_ = 0;
  std::int64_t out_ = 0, high_water_ = 0;  // bytes of pooled sizes handed out: now, and the most at once
};

}  // namespace

Allocator& host_allocator() {
  static BlockPool pool;
  return pool;
}

std::int64_t tensor_bytes_in_use() { return g_in_use.load(); }
std::int64_t tensor_bytes_peak() { return g_peak.load(); }
void reset_tensor_bytes_peak() { g_peak.store(g_in_use.load()); }

void Tensor::Free::operator()(void* p) const {
  g_in_use -= std::int64_t(bytes);
  allocator->deallocate(p, bytes);
}

Tensor::Tensor(Shape shape, DType dtype, Layout layout, Allocator& allocator)
    : Tensor(shape, dtype, layout, allocator, true) {}

Tensor::Tensor(Shape shape, DType dtype, Layout layout, Device device)
    : Tensor(shape, dtype, layout, device_allocator(device), true) {}

Tensor copy_of(const TensorView& src, DType dtype) {
  Tensor t = Tensor::uninitialized(src.shape, dtype, Layout::bshd, src.device);
  copy(src, t.view());
  return t;
}

Tensor lse_tensor(const Shape& q, Device device) {
  return Tensor::uninitialized({q.b, q.s, q.h, 1}, DType::f32, Layout::bhsd, device);
}

Tensor Tensor::uninitialized(Shape shape, DType dtype, Layout layout, Allocator& allocator) {
  return Tensor(shape, dtype, layout, allocator, false);
}

Tensor Tensor::uninitialized(Shape shape, DType dtype, Layout layout, Device device) {
  return Tensor(shape, dtype, layout, device_allocator(device), false);
}

TensorView Tensor::view() const { return TensorView::dense(data(), dtype_, shape_, layout_, device()); }

Tensor::Tensor(Shape shape, DType dtype, Layout layout, Allocator& allocator, bool zero)
    : shape_(shape), dtype_(dtype), layout_(layout) {
  const std::size_t bytes = std::max<std::size_t>(nbytes(), 1);
  void* p = allocator.allocate(bytes);
  if (zero) allocator.fill_zero(p, bytes);
  data_ = std::unique_ptr<void, Free>(p, Free{&allocator, bytes});
  const std::int64_t now = (g_in_use += std::int64_t(bytes));
  std::int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace ulysses
