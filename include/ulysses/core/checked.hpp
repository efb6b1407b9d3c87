// Overflow-checked size arithmetic. Every product of tensor sizes goes through these, so a
// hostile or mistyped size gives an Error naming it instead of a wrapped count and a heap
// overflow. Not collective; throws ulysses::Error.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace ulysses {

// The largest element count of one tensor the library accepts: 2^56 (256 Pi elements), so
// byte counts and the sums of a few tensors' bytes stay far from int64 overflow.
inline constexpr std::int64_t kMaxElements = std::int64_t(1) << 56;

// a * b for non-negative a and b; throws Error "<what>: ... overflows" when it does not fit.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what);
// The product of non-negative factors, checked the same way (1 for none).
std::int64_t checked_product(std::initializer_list<std::int64_t> factors, std::string_view what);

}  // namespace ulysses
