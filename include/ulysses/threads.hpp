// Threads inside a rank (OpenMP).
#pragma once

#include "ulysses/communicator.hpp"

namespace ulysses {

// Collective over `comm`. The node's cores divided by the ranks of `comm` on this node
// (at least 1), and never more than the cores this process may run on (its affinity mask,
// which mpirun's binding may restrict): the default never oversubscribes.
int default_threads(Communicator& comm);

// Sets the OpenMP thread count used by the kernels (n >= 1) and pins BLAS to one thread,
// because the kernels call BLAS from inside their own parallel regions.
void set_threads(int n);

}  // namespace ulysses
