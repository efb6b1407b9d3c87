// This machine's attention-kernel curve (kernel_model.hpp) for `plan --calibrate`: the same
// model the GPU presets carry, fitted from the local kernels timed at several block shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/cost_model.hpp"

namespace ulysses {

// One timed forward call: its seconds, its FLOPs, its key-block length.
struct KernelTiming {
  double seconds = 0, flops = 0, kv_len = 0;
};

// A call's fixed seconds and the key-block length at which the rate halves.
struct KernelFit {
  double call_s = 0, kv_half = 0;
};

// Fits t = call_s + F / rate_∞ × (1 + kv_half / kv_len) to `timings` (least squares on the
// relative error; at least three of distinct shapes). call_s is clamped at 0 and kv_half to
// [0, 8192]; timings that cannot be fitted (fewer than three, singular, a rate that is not
// positive) give {0, 0}, the flat model. Not collective.
KernelFit fit_kernel_times(const std::vector<KernelTiming>& timings);

// Collective over `comm`: the forward of non-causal calls of 256 queries against 128 and 2048
// keys (2 heads) and of two short calls (64 × 64 and 16 × 16, 1 head) at head_dim in dtype,
// every rank at once, the slowest rank's times less their K/V packs (calibrate_pack), fitted by
// fit_kernel_times: the curve (kv_half) and the fixed cost per call (call_s: on a CPU the
// kernel's thread team and its buffers). The
// LSE merge of a ring step's float32 output is timed beside a copy of the same bytes: the copy
// gives memory_bandwidth (read and written), the merge its passes at that rate (merge_passes).
// Backward 2.5× as the calibrated attention rate counts it.
KernelModel calibrate_kernel(Communicator& comm, std::int64_t head_dim, DType dtype);
// Collective over `comm`: the LSE merge of a ring step's float32 [1, 4096, 4, head_dim] output
// and a copy of the same bytes, each the median of `runs` (after a warm-up) timed by `seconds`
// (comm.now, or CPU seconds on a shared machine, where elapsed time measures the load), the
// slowest rank's: sets model.memory_bandwidth (the copy, read and written) and
// model.merge_passes (the merge at that rate). Unchanged when a time is not positive.
void calibrate_merge(Communicator& comm, std::int64_t head_dim, const std::function<double()>& seconds, int runs,
                     KernelModel& model);

// Collective over `comm`: a forward call's pack of its K and V into the kernel's tile layout
// (KernelModel::kv_pack_s_per_byte), the slowest rank's: a causal call of 16 queries at position
// 0 against 8192 keys on 4 heads (which sees only the first keys) less one against 16 keys, each
// the median of `runs` timed by `seconds`, over the K/V bytes between them. Unchanged when the
// difference is not positive.
void calibrate_pack(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                    int runs, KernelModel& model);

// Scales a calibrated cluster's rate (measured on calibrate()'s causal 2048-token block) to the
// long-block rate the kernel model multiplies, and installs `kernel`.
void apply_calibrated_kernel(Cluster& cluster, const KernelModel& kernel, std::int64_t head_dim);

}  // namespace ulysses
