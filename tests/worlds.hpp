// The worlds a communicator test runs on. A test binary runs its tests over MPI (every rank of
// the mpiexec job), or, given --local (ctest's "<binary>.local" entries), over ranks as threads
// in this one process: each test once on a local world of every size from 1 to kLocalRanks.
//
//   COMM_TEST(Suite, Name) { ... comm ... }      // TEST whose body runs on every rank
//   COMM_TEST_P(Fixture, Name) { ... GetParam() ... comm ... }
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/comm/local_communicator.hpp"

namespace ulysses::testing {

inline constexpr int kLocalRanks = 4;

// Set once by test_main from its command line.
inline bool& local_worlds() {
  static bool local = false;
  return local;
}

// Runs body(comm) on every rank of every world this binary tests.
template <class Body>
void on_every_world(Body&& body) {
  if (!local_worlds()) {
    const std::unique_ptr<Communicator> comm = make_communicator("mpi");
    body(*comm);
    return;
  }
  for (int n = 1; n <= kLocalRanks; ++n)
    run_local(n, [&](Communicator& comm) {
      SCOPED_TRACE("local rank " + std::to_string(comm.rank()) + " of " + std::to_string(n));
      body(comm);
    });
}

}  // namespace ulysses::testing

#define COMM_TEST(suite, name)                                                             \
  static void suite##_##name##_OnEveryRank(::ulysses::Communicator& comm);                 \
  TEST(suite, name) { ::ulysses::testing::on_every_world(&suite##_##name##_OnEveryRank); } \
  static void suite##_##name##_OnEveryRank(::ulysses::Communicator& comm)

// The body is a static member of a class derived from the fixture, so GetParam() works in it.
#define COMM_TEST_P(fixture, name)                                                                     \
  struct fixture##_##name##_OnEveryRank : fixture {                                                    \
    static void body(::ulysses::Communicator& comm);                                                   \
  };                                                                                                   \
  TEST_P(fixture, name) { ::ulysses::testing::on_every_world(&fixture##_##name##_OnEveryRank::body); } \
  void fixture##_##name##_OnEveryRank::body(::ulysses::Communicator& comm)
