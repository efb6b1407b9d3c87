// This machine's attention-kernel curve (kernel_model.hpp) for `plan --calibrate`: the same
// model the GPU presets carry, fitted from the local kernels timed at two key-block lengths.
#pragma once

#include <cstdint>

#include "ulysses/communicator.hpp"
#include "ulysses/cost_model.hpp"

namespace ulysses {

// Collective over `comm`: the forward rate of a non-causal call of 256 queries against 128 and
// against 2048 keys (2 heads of head_dim, in dtype), every rank at once, the slowest rank's
// rates, fitted to rate(L) = rate_∞ × L / (L + kv_half): kv_half, clamped to [0, 8192] (a
// noisy pair that says the short block is faster gives 0, the flat model). Backward 2.5× as
// the calibrated attention rate counts it; no per-call costs (one process per rank, no launch).
KernelModel calibrate_kernel(Communicator& comm, std::int64_t head_dim, DType dtype);

// Scales a calibrated cluster's rate (measured on calibrate()'s causal 2048-token block) to the
// long-block rate the kernel model multiplies, and installs `kernel`.
void apply_calibrated_kernel(Cluster& cluster, const KernelModel& kernel, std::int64_t head_dim);

}  // namespace ulysses
