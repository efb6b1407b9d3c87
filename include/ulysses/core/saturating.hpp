// Saturating position arithmetic for masks: windows, offsets and key ranges.
//
// A window side (window_left/right) may be any int64 up to INT64_MAX, so `pos + right + 1` and
// `pos − left` can leave the int64 range. Clamped to it they stay exact for the masks: every
// position (q_offset + i, k_offset + j) is itself an int64 (check_offsets), so a bound past
// INT64_MAX or below INT64_MIN is past every key on that side, as its clamped value is. No
// signed overflow anywhere (UBSan, scripts/sanitize, checks it).
#pragma once

#include <cstdint>
#include <limits>

namespace ulysses {

inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

inline std::int64_t sat_sub(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::max() : std::numeric_limits<std::int64_t>::min();
}

}  // namespace ulysses
