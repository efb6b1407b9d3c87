#include "ulysses/core/checked.hpp"

#include <fmt/format.h>

#include "ulysses/core/error.hpp"

namespace ulysses {

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (a < 0 || b < 0) throw Error(fmt::format("{}: negative size in {} x {}", what, a, b));
  if (__builtin_mul_overflow(a, b, &r)) throw Error(fmt::format("{}: {} x {} overflows 64 bits", what, a, b));
  return r;
}

std::int64_t checked_product(std::initializer_list<std::int64_t> factors, std::string_view what) {
  std::int64_t r = 1;
  for (std::int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

}  // namespace ulysses
