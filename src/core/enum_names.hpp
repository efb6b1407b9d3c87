// The names of an enum's values, one table for both directions: a name, its value and the error
// that lists the accepted names are written once, so they cannot drift apart.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "ulysses/core/error.hpp"

namespace ulysses {

template <class E>
using EnumName = std::pair<E, const char*>;

// The name of `value` in `names`; "?" for a value that is not there.
template <class E, std::size_t N>
const char* enum_name(const EnumName<E> (&names)[N], E value) {
  for (const auto& [v, name] : names)
    if (v == value) return name;
  return "?";
}

// The value `text` names in `names`; else throws Error "<what> '<text>': expected a, b or c".
template <class E, std::size_t N>
E parse_enum(const EnumName<E> (&names)[N], std::string_view text, std::string_view what) {
  std::string expected;
  for (std::size_t i = 0; i < N; ++i) {
    if (text == names[i].second) return names[i].first;
    expected += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(names[i].second);
  }
  throw Error(fmt::format("{} '{}': expected {}", what, text, expected));
}

}  // namespace ulysses
