// Helpers shared by the MPI tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ulysses/mpi_communicator.hpp"
#include "ulysses/error.hpp"

namespace ulysses::testing {

// Runs `fn`, expecting an Error on every rank whose message contains `needle`, and checks
// that all ranks saw the very same message (compared through its length and a hash).
template <class Fn>
void expect_same_error_everywhere(Communicator& comm, Fn&& fn, const std::string& needle) {
  std::string msg;
  try {
    fn();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(needle), std::string::npos) << "rank " << comm.rank() << " got: '" << msg << "'";
  std::int64_t fp[2] = {std::int64_t(msg.size()), std::int64_t(std::hash<std::string>{}(msg) >> 1)};
  std::int64_t lo[2] = {fp[0], fp[1]}, hi[2] = {fp[0], fp[1]};
  comm.allreduce_min(lo, 2);
  comm.allreduce_max(hi, 2);
  EXPECT_TRUE(lo[0] == hi[0] && lo[1] == hi[1]) << "ranks disagree on the error; rank "
                                                << comm.rank() << " has: " << msg;
}

}  // namespace ulysses::testing
