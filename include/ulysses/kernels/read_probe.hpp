// This machine's read rate: the ceiling of a pass that streams memory, which the decode kernel
// (one query row against a whole cache) is measured against, by `generate` and by
// `plan --calibrate --mode decode` alike.
#pragma once

#include <cstddef>

namespace ulysses::kernels {

// The probes' clock: this thread's CPU seconds when OpenMP runs one thread (on a shared host
// wall time would count the spells other processes held the core, which differ between a
// kernel's pass and the read's), else wall seconds.
double probe_clock();

// Seconds on probe_clock of one pass that reads `n` floats at `data`, every OpenMP thread its
// part. Each thread sums into 32 independent lanes: one running sum would wait on the adder's
// latency at every float and time that (about a fifth of what one core reads), not the memory.
// `ahead` > 0 also asks for the line that many floats on (prefetcht0), as the decode kernel does.
double read_pass_seconds(const float* data, std::size_t n, std::size_t ahead);

// The faster of a plain pass and one that prefetches 2 KiB ahead: on some hosts the prefetched
// read is faster than the hardware prefetchers' alone, and a kernel that prefetches would
// otherwise beat "the machine's" rate.
double read_seconds(const float* data, std::size_t n);

}  // namespace ulysses::kernels
