// Threads inside a rank (OpenMP). The default count, which depends on the ranks sharing a
// node, is the communicator's (default_threads in communicator.hpp).
#pragma once

namespace ulysses {

// Sets the OpenMP thread count used by the kernels (n >= 1) and pins BLAS to one thread,
// because the kernels call BLAS from inside their own parallel regions.
void set_threads(int n);

}  // namespace ulysses
