#include "ulysses/core/cpu_clock.hpp"

#include <ctime>

namespace ulysses {

namespace {

double seconds_of(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

double process_cpu_seconds() { return seconds_of(CLOCK_PROCESS_CPUTIME_ID); }
double thread_cpu_seconds() { return seconds_of(CLOCK_THREAD_CPUTIME_ID); }

}  // namespace ulysses
