// A job that hangs on purpose, for the watchdog's test (watchdog_test.sh): the last rank
// misses one operation and sleeps, the others wait for it under a short timeout. The
// watchdog must end the whole job with one line naming the operation, the waiting rank, its
// peer or group and the step.
// usage: watchdog_hang TIMEOUT_S collective|recv|ialltoallv
//   collective  the last rank skips an all-reduce
//   recv        the last rank never sends the message rank 0 waits for
//   ialltoallv  the last rank skips a nonblocking all-to-all the others wait for
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ulysses/comm/mpi_communicator.hpp"

using namespace ulysses;

namespace {

void skip_collective(Communicator& comm, bool skipper) {
  double x = 1;
  if (!skipper) comm.allreduce_sum(&x, 1, "loss_sum");
}

void missing_message(Communicator& comm) {  // the last rank sends nothing
  std::vector<char> buf(64);
  if (comm.rank() == 0) comm.irecv(buf, comm.size() - 1, 5).wait();
}

void skip_ialltoallv(Communicator& comm, bool skipper) {
  const std::size_t n = std::size_t(comm.size());
  std::vector<char> send(n * 8), recv(n * 8);
  std::vector<std::size_t> bytes(n, 8), offsets(n);
  for (std::size_t j = 0; j < n; ++j) offsets[j] = 8 * j;
  if (!skipper) comm.ialltoallv(send, bytes, offsets, recv, bytes, offsets, "seq_to_head").wait();
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: watchdog_hang TIMEOUT_S collective|recv|ialltoallv\n");
    return 2;
  }
  MpiCommunicator world;
  world.set_timeout(std::atof(argv[1]));
  const std::string mode = argv[2];
  const bool skipper = world.rank() == world.size() - 1;
  // A sub-communicator obeys the world's watchdog and names the world's step.
  std::unique_ptr<Communicator> all = world.split(0, world.rank());
  const WatchdogStep step(world, "test step 3");
  world.barrier();  // every rank is here: what follows is the hang
  if (mode == "collective") skip_collective(*all, skipper);
  if (mode == "recv") missing_message(*all);
  if (mode == "ialltoallv") skip_ialltoallv(*all, skipper);
  if (skipper) sleep(600);  // the stuck rank: only the watchdog's abort ends it
  std::fprintf(stderr, "rank %d: not reached: the watchdog did not fire\n", world.rank());
  return 3;
}
