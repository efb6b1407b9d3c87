// ulysses::Error — the one exception type of the library.
//
// Every argument check throws it. Checks that depend on more than one rank are agreed
// collectively first (Communicator::agree), so when a distributed call throws, every rank of the
// communicator throws the same Error with the same message: no rank is left in a collective.
#pragma once

#include <stdexcept>
#include <string>

namespace ulysses {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ulysses
