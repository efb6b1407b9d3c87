#include "ulysses/core/threads.hpp"

#include <omp.h>

#include <algorithm>

extern "C" void openblas_set_num_threads(int);

namespace ulysses {

void set_threads(int n) {
  omp_set_num_threads(std::max(1, n));
  openblas_set_num_threads(1);
}

}  // namespace ulysses
