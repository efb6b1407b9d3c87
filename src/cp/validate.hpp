// Collective validation helpers: agree across ranks before any data moves.
#pragma once

#include <string>
#include <vector>

#include "ulysses/comm.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

// Collective. Every rank passes its own signature (a few integers, same length on every
// rank). If any rank's differs from rank 0's, every rank throws the same Error:
// "<what> differ between ranks: rank 0 has <describe(sig0)>, rank k has <describe(sigk)>".
void agree_identical(Comm& comm, const std::vector<std::int64_t>& signature, const std::string& what,
                     std::string (*describe)(const std::vector<std::int64_t>&));

// "" when `view` has `expected` shape, else "<name> must be <expected>, got <actual>".
std::string shape_error(const char* name, const TensorView& view, const Shape& expected);

}  // namespace ulysses
