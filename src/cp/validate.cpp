#include "validate.hpp"

#include <fmt/format.h>

#include "ulysses/error.hpp"

namespace ulysses {

void agree_identical(Comm& comm, const std::vector<std::int64_t>& signature, const std::string& what,
                     std::string (*describe)(const std::vector<std::int64_t>&)) {
  const std::size_t n = signature.size();
  std::vector<std::int64_t> all(n * std::size_t(comm.size()));
  comm.allgather(signature.data(), all.data(), n * sizeof(std::int64_t), "validate");
  auto sig = [&](int r) {
    return std::vector<std::int64_t>(all.begin() + std::ptrdiff_t(n * r),
                                     all.begin() + std::ptrdiff_t(n * (r + 1)));
  };
  for (int r = 1; r < comm.size(); ++r) {
    if (sig(r) != sig(0))
      throw Error(fmt::format("{} differ between ranks: rank 0 has {}, rank {} has {}", what,
                              describe(sig(0)), r, describe(sig(r))));
  }
}

std::string shape_error(const char* name, const TensorView& view, const Shape& expected) {
  if (view.shape == expected) return "";
  return fmt::format("{} must be {}, got {}", name, expected.str(), view.shape.str());
}

}  // namespace ulysses
