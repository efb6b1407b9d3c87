// This machine's attention-kernel curve (kernel_model.hpp) for `plan --calibrate`: the same
// model the GPU presets carry, fitted from the local kernels timed at several block shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// A causal diagonal block's extra work (KernelModel::causal_half) from a causal call of `len`
// queries against the same `len` keys (diag_s) and a non-causal one (full_s), both less the
// call's K/V pack and fixed cost (pack_s: a causal call of a few queries at position 0 against
// the same keys): the diagonal's rate over the full block's is len / (len + causal_half) (the
// masked half-tiles a causal block computes). 0 (no extra) when a time is not positive or
// finite, not above pack_s, or the diagonal is not slower; at most 8192. Not collective.
double fit_causal_half(double len, double full_s, double diag_s, double pack_s);
// Collective over `comm`: model.causal_half from a causal and a full call of 512 × 512 tokens on
// 4 heads and a call of 16 causal queries at position 0 against the same keys (their pack), each
// the median of `runs` timed by `seconds`, the slowest rank's (fit_causal_half).
void calibrate_causal_half(Communicator& comm, std::int64_t head_dim, DType dtype,
                           const std::function<double()>& seconds, int runs, KernelModel& model);

// Collective over `comm`: the forward of non-causal calls of 256 queries against 128 and 2048
// keys (2 heads) and of two short calls (64 × 64 and 16 × 16, 1 head) at head_dim in dtype,
// every rank at once, the slowest rank's times less their K/V packs (calibrate_pack), fitted by
// fit_kernel_times: the curve (kv_half) and the fixed cost per call (call_s: on a CPU the
// kernel's thread team and its buffers), each less its stream past the cache (calibrate_stream,
// timed first). ring_pair_calls: true (this library's ring). causal_half
// stays 0: `--grid` measures it (calibrate_causal_half) and reports it beside the plan. The
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

// The cache term (KernelModel::cache_bytes, past_cache_extra) from two non-causal calls, each
// timed less its K/V pack: `fits` against keys whose K and V of one head fit cache_bytes,
// `past` against keys well past it. Each call's seconds per FLOP over its kernel-curve
// efficiency (model's kv_half at head_dim) gives past's time factor over fits'; the extra is that
// factor less 1 over the share of past's stream beyond the cache (block_cache_factor), at most 4.
// {0, 0} (off, the flat model) when an input is not positive or finite, `fits` does not fit,
// `past` is not past, or the factor is not above 1. Not collective.
struct CacheFit {
  double cache_bytes = 0, past_cache_extra = 0;
};
CacheFit fit_cache_term(const KernelModel& model, std::int64_t head_dim, double element_bytes, double cache_bytes,
                        const KernelTiming& fits, const KernelTiming& past);

// A cache size as sysfs writes it ("2048K", "32M", "512"), in bytes; `fallback` when the text is
// not a positive size.
double parse_cache_size(const std::string& text, double fallback);

// Collective over `comm`: the cache term of this machine's kernel (fit_cache_term), the L2 of
// CPU 0 from sysfs (2 MiB when unreadable): 256 queries on 1 head against half the cache's keys
// and against 8 times them, non-causal, each the median of `runs` timed by `seconds`, the
// slowest rank's, less a call of 16 causal queries at position 0 against the same keys (its K/V
// pack at that size); model's kv_half gives the curve. Sets model.cache_bytes
// and model.past_cache_extra (both 0 when the fit is off).
void calibrate_cache(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                     int runs, KernelModel& model);

// The stream term (KernelModel::stream_s_per_byte, stream_cache_bytes) from the seconds of one
// block shape on `ref_heads` heads (ref_s) and on two larger head counts (a: heads_a, a_s; b),
// with `bytes_per_head` of working set a head: each call's excess over ref_s scaled by its heads
// lies on excess = s_per_byte × (bytes − cache), a line through the two points. The cache is at
// least the reference's bytes (it is assumed to fit) and below b's. {0, 0} (off) when an input
// is not positive or finite, the heads are not increasing, or the excess does not grow with the
// bytes. Not collective.
struct StreamFit {
  double s_per_byte = 0, cache_bytes = 0;
};
StreamFit fit_stream_term(double bytes_per_head, double ref_heads, double ref_s, double heads_a, double a_s,
                          double heads_b, double b_s);

// Collective over `comm`: the stream term of this machine's kernel (fit_stream_term) from
// non-causal calls of 512 queries against 512 keys on 2, 8 and 32 heads at head_dim in dtype
// (the ring's block at the grid's 2k tokens; 2 to 32 MiB of working set at d 128 in float32),
// each the median of `runs` timed by `seconds`, the slowest rank's.
void calibrate_stream(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                      int runs, KernelModel& model);

// The kernel model's long-block rate from a rate measured on attention_rates' causal block
// (kRateTokens, kRateHeads heads of head_dim at element_bytes): that block's efficiency and its
// stream past the cache taken out (the stream at most half the block's time). rate_of_kernel_peak
// is its inverse: the rate the model predicts for that block.
double kernel_peak_of_rate(const KernelModel& kernel, double rate, std::int64_t head_dim, double element_bytes);
double rate_of_kernel_peak(const KernelModel& kernel, double peak, std::int64_t head_dim, double element_bytes);

// Scales a calibrated cluster's rate (measured on calibrate()'s causal 2048-token block at
// element_bytes) to the long-block rate the kernel model multiplies (kernel_peak_of_rate), and
// installs `kernel` (keeping the cluster's backward_ratio, which calibrate() measured beside the rate).
void apply_calibrated_kernel(Cluster& cluster, const KernelModel& kernel, std::int64_t head_dim,
                             double element_bytes = 4);

}  // namespace ulysses
