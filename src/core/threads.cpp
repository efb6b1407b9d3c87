#include "ulysses/threads.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <thread>

extern "C" void openblas_set_num_threads(int);

namespace ulysses {

int default_threads(Communicator& comm) {
  const int ranks_on_node = comm.ranks_on_this_node();
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  int allowed = cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = CPU_COUNT(&set);
  return std::max(1, std::min(cores / std::max(1, ranks_on_node), allowed));
}

void set_threads(int n) {
  omp_set_num_threads(std::max(1, n));
  openblas_set_num_threads(1);
}

}  // namespace ulysses
