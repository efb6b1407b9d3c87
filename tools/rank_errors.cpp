#include "rank_errors.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <new>

#include "ulysses/comm/mpi_communicator.hpp"

namespace ulysses::cli {

namespace {
// Suspends a communicator's watchdog while in scope (restored on any exit, exceptions too).
class NoDeadline {
 public:
  explicit NoDeadline(Communicator& comm) : comm_(comm), timeout_(comm.timeout()) { comm.set_timeout(0); }
  ~NoDeadline() { comm_.set_timeout(timeout_); }
  NoDeadline(const NoDeadline&) = delete;
  NoDeadline& operator=(const NoDeadline&) = delete;

 private:
  Communicator& comm_;
  double timeout_;
};
}  // namespace

void on_every_rank(Communicator& comm, const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::bad_alloc&) {
    err = "out of memory";
  } catch (const std::exception& e) {  // ulysses::Error, and std::ios_base::failure & co.
    err = e.what();
  }
  comm.agree(err);
}

void abort_job(int rank, const std::string& why) {
  std::fprintf(stderr, "ulysses: error on rank %d: %s\n", rank, why.c_str());
  std::fflush(stderr);
  if (!mpi_running()) std::_Exit(3);  // a process alone that never started MPI: itself is the job
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

void on_root(Communicator& comm, const std::function<void()>& fn) {
  // The other ranks wait for rank 0 alone, whose work may outlast any timeout by design (the
  // float64 reference of a large --check): no deadline on that one wait. A rank 0 that dies
  // meanwhile still ends the job through the launcher.
  const NoDeadline unbounded(comm);
  on_every_rank(comm, [&] {
    if (comm.rank() == 0) fn();
  });
}

}  // namespace ulysses::cli
