// What both bf16 engines (engine_bf16_avx512.cpp, engine_bf16_amx.cpp) share: the namespace
// of the build (ULYSSES_KERNEL_NS: native, or emulated in the tests), their integer names, a
// vector of 16 32-bit lanes, its unaligned load and store, the rounding of float32 bits to
// bf16, and the per-thread scratch of their operands. GCC vector extensions only, so each engine's native and emulated builds compile
// the same code; internal linkage, so each instruction set's object keeps its own copy and
// defines no weak symbol (tests/isa_symbols_test.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#ifndef ULYSSES_KERNEL_NS
#define ULYSSES_KERNEL_NS native
#endif

namespace ulysses::kernels {
namespace {

using i64 = std::int64_t;
using u32 = std::uint32_t;
using bf16 = std::uint16_t;

typedef std::uint32_t v16u __attribute__((vector_size(64)));

inline v16u load16(const void* p) {
  v16u x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline void store16(void* p, v16u x) { std::memcpy(p, &x, sizeof x); }

// float32 bits → the bf16 of them in the top 16 bits of each lane: round to nearest even,
// NaN stays a (quiet) NaN. ulysses::float_to_bf16, 16 lanes at a time.
inline v16u round_to_bf16_high(v16u u) {
  const v16u rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const v16u quiet_nan = u | 0x00400000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// A scratch buffer for one thread (thread_local), 64-byte aligned, grown on demand in steps
// of 64 KiB and never shrunk.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(data_, kAlign); }

  template <class T>
  T* get(i64 count) {
    const std::size_t bytes = std::size_t(count) * sizeof(T);
    if (bytes > size_) {
      ::operator delete(data_, kAlign);
      data_ = nullptr;
      size_ = std::size_t((i64(bytes) + kGrain - 1) / kGrain * kGrain);
      data_ = ::operator new(size_, kAlign);
    }
    return static_cast<T*>(data_);
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  static constexpr i64 kGrain = 64 << 10;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace
}  // namespace ulysses::kernels
