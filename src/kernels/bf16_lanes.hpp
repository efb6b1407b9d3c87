// What both bf16 engines (engine_bf16_avx512.cpp, engine_bf16_amx.cpp) share: the namespace
// of the build (ULYSSES_KERNEL_NS: native, or emulated in the tests), their integer names, a
// vector of 16 32-bit lanes, its unaligned load and store, the rounding of float32 bits to
// bf16, and the per-thread scratch of their operands (scratch.hpp). GCC vector extensions only, so each engine's native and emulated builds compile
// the same code; internal linkage, so each instruction set's object keeps its own copy and
// defines no weak symbol (tests/isa_symbols_test.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "scratch.hpp"

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

}  // namespace
}  // namespace ulysses::kernels
