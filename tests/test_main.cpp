// GoogleTest under MPI: every rank runs every test; the job fails if any rank fails.
// Tests must reach their collectives on every rank, so they use EXPECT_* (not ASSERT_*)
// between collective calls.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>

#include "ulysses/comm/mpi_communicator.hpp"
#include "ulysses/core/threads.hpp"
#include "worlds.hpp"

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--local") == 0) ulysses::testing::local_worlds() = true;  // worlds.hpp
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one rank's full report is enough; the others print only failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  {
    ulysses::MpiCommunicator world;
    ulysses::set_threads(ulysses::default_threads(world));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  if (failed) std::fprintf(stderr, "rank %d: tests FAILED\n", rank);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
