// CPU seconds, the clock beside wall time on a shared host: wall time counts the spells other
// processes held the cores, CPU time only the work of this process (or thread). A rank waiting
// for its peer spins, so the wait still counts.
#pragma once

namespace ulysses {

double process_cpu_seconds();  // every thread of this process
double thread_cpu_seconds();   // the calling thread

}  // namespace ulysses
