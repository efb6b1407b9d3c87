// bfloat16 storage: the top 16 bits of an IEEE float32. Conversion rounds to nearest even
// and keeps NaN a NaN (a plain truncation would bias every rounding toward zero).
#pragma once

#include <cstdint>
#include <cstring>

namespace ulysses {

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

inline float bf16_to_float(std::uint16_t h) {
  std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace ulysses
