// MpiSession's start, observed through MPI_Initialized / MPI_Finalized: one scenario a process,
// as MPI starts at most once in one.
//   test_comm_session alone      started without a launcher: MPI waits for the first MPI
//                                communicator, the job world before it is a world of one
//   test_comm_session throws     the same, left by an exception: MPI still finalised once
//   test_comm_session now        Start::now (the default) initialises at once, as it always did
//   mpirun -n N test_comm_session launched   under a launcher: initialised at once, world of N
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/comm/mpi_communicator.hpp"
#include "ulysses/core/error.hpp"

namespace {

using namespace ulysses;

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  if (!ok) ++failures;
}

bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

// The sum of every rank's (rank + 1) over `comm`, and what it must be.
void check_sum(Communicator& comm, const std::string& what) {
  double x = comm.rank() + 1;
  comm.allreduce_sum(&x, 1);
  const int n = comm.size();
  check(x == n * (n + 1) / 2.0, what + ": allreduce gives " + std::to_string(x));
}

// Before any MPI communicator: nothing started, and the job's world is this process alone.
void check_waiting(const MpiSession& session) {
  check(!started_by_mpi_launcher(), "no launcher variable is set");
  check(!initialized() && !mpi_running(), "MPI waits");
  check(session.world_rank() == 0, "rank 0 of a world of one");
  const std::unique_ptr<Communicator> job = make_job_communicator();
  check(std::string(job->backend()) == "local" && job->size() == 1 && job->rank() == 0, "the job is a world of one");
  check_sum(*job, "the world of one");
  job->agree("");
  std::string agreed;
  try {
    job->agree("this rank's error");
  } catch (const Error& e) {
    agreed = e.what();
  }
  check(agreed.find("this rank's error") != std::string::npos, "its agreement is itself: " + agreed);
  (void)make_communicator("local");
  check(!initialized(), "the job's world and a local one start no MPI");
}

// The first MPI communicator starts MPI, once; the next ones find it started.
void check_started() {
  const std::unique_ptr<Communicator> world = make_communicator("mpi");
  check(initialized() && mpi_running(), "an MPI communicator started MPI");
  int provided = -1;
  MPI_Query_thread(&provided);
  check(provided == MPI_THREAD_SINGLE, "at MPI_Init's thread level (single)");
  check(std::string(world->backend()) == "mpi" && world->size() == 1, "MPI's world is this process");
  check_sum(*world, "MPI's world of one");
  const std::unique_ptr<Communicator> again = make_communicator("mpi"), self = make_self_communicator(*world);
  check(again->size() == 1 && self->size() == 1, "more MPI communicators, MPI started once");
  check(std::string(make_job_communicator()->backend()) == "mpi", "the job's world is MPI's once MPI runs");
}

void alone(int& argc, char**& argv) {
  {
    const MpiSession session(argc, argv, MpiSession::Start::when_needed);
    check_waiting(session);
    check_started();
    check(!finalized(), "not finalised while the session lives");
  }
  check(finalized(), "finalised when the session ends");
}

void throws(int& argc, char**& argv) {
  try {
    const MpiSession session(argc, argv, MpiSession::Start::when_needed);
    const std::unique_ptr<Communicator> world = make_communicator("mpi");
    throw std::runtime_error("the command failed");
  } catch (const std::runtime_error&) {
    check(finalized(), "finalised when an exception leaves the session");
  }
}

void now(int& argc, char**& argv) {
  const MpiSession session(argc, argv);
  check(initialized(), "Start::now initialises at construction");
}

void launched(int& argc, char**& argv) {
  const MpiSession session(argc, argv, MpiSession::Start::when_needed);
  check(started_by_mpi_launcher(), "the launcher's variables are seen");
  check(initialized(), "under a launcher MPI starts at construction");
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  check(session.world_rank() == rank, "world_rank is MPI's");
  const std::unique_ptr<Communicator> job = make_job_communicator();
  check(std::string(job->backend()) == "mpi" && job->size() == size && job->rank() == rank,
        "the job is MPI's world of " + std::to_string(size));
  check_sum(*job, "MPI's world");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "alone")
    alone(argc, argv);
  else if (scenario == "throws")
    throws(argc, argv);
  else if (scenario == "now")
    now(argc, argv);
  else if (scenario == "launched")
    launched(argc, argv);
  else {
    std::fprintf(stderr, "usage: test_comm_session alone|throws|now|launched\n");
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
