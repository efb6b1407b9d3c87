// Measuring this machine: the rates and links the planner's and the balancer's cost models need
// to predict for it instead of for the default GPU cluster (planner.hpp's Cluster).
//
// Each rate is timed on the rank's current threads (set_threads) with every rank measuring at
// once, as they compute at once in a step; the collective calibrate() then agrees on the slowest
// rank's numbers, so every rank plans identically and for the rank a step waits on.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/plan/plan_inference.hpp"
#include "ulysses/plan/planner.hpp"

namespace ulysses {

// Not collective: the share of a transfer of transfer_s seconds hidden behind compute of
// compute_s when both run at once and take both_s: (compute + transfer − both) / min(compute,
// transfer), clamped to [0, 1] (1: the shorter one wholly hidden; 0: they add up). 1, the
// uncalibrated default (Link::overlap), when a time is not positive or not finite.
double overlap_fraction(double compute_s, double transfer_s, double both_s);

// Not collective: the seconds `run` takes on this rank, the median of 5 calls after a warm-up (on
// a shared machine the load changes from second to second: more calls, a steadier rate).
double local_median_seconds(const Communicator& comm, const std::function<void()>& run);

// Not collective: the local flash attention kernels on this rank on a causal self-attention
// (2048 tokens, 2 heads of head_dim), `seconds` the clock: the forward's FLOP/s
// (attention_forward_flops over its seconds) and the backward's seconds over the forward's
// (KernelModel::backward_ratio), medians of 5 after a warm-up.
constexpr std::int64_t kRateTokens = 2048, kRateHeads = 2;  // attention_rates' causal block
struct AttentionRates {
  double forward = 0;
  double backward_ratio = 0;
};
AttentionRates attention_rates(std::int64_t head_dim, DType dtype, const std::function<double()>& seconds);

// Not collective: FLOP/s of the forward and backward together, counted as the planner counts
// them (3.5 × attention_forward_flops), from attention_rates.
double attention_rate(const Communicator& comm, std::int64_t head_dim, DType dtype);

// Not collective: FLOP/s of this rank's BLAS on a linear layer [rows, in] · [in, out], forward
// and backward (6 · rows · in · out FLOPs), the threads splitting it as the training demo's
// layers do (rows forward and for the input gradient, columns for the weight gradient).
double gemm_rate(const Communicator& comm, std::int64_t rows, std::int64_t in, std::int64_t out);

// Not collective: bytes/s of the decode kernel (decode_attention_forward) over a float32 cache of
// at least `bytes` (K and V of kv_heads heads of head_dim, each head's rows contiguous as the KV
// cache holds them; `heads` query rows), on this rank's threads, the fastest of 7 passes: a decode
// step's read of its cache here, every rank reading at once as they do in a step. Also the
// plain read of the same bytes (32 float lanes a thread), for the kernel's fraction of it.
struct DecodeRate {
  double kernel_bytes_s = 0, read_bytes_s = 0, bytes = 0;
};
DecodeRate decode_rate(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, double bytes);

// Collective. The seconds of one decode step's gather here: the median of 40 allgatherv's of a
// rank's partial (out, lse) of `heads` heads, each after a decode kernel pass over a 1 MiB cache
// (the ranks reach it as a step's layers do, with the skew between them), on the decode probes'
// clock, the slowest rank's. Polling ranks count the wait for a late peer.
double decode_gather_seconds(Communicator& comm, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

// Collective. The seconds one request adds to a layer of a decode step beyond its cache's read,
// per layout: decode_attention itself (the step's own code: the request's row appended, its
// kernel call, its block unpacked or merged, its bytes in the gather) over 33 requests against
// 1, each cache holding one row a rank, the median of 15 such differences over 32, on the decode
// probes' clock, the slowest rank's. `unsharded` on this rank alone (cp = 1), `heads` and
// `interleaved` over comm (0 where the layout cannot hold these heads, and on one rank).
DecodeModel::RequestCost decode_request_seconds(Communicator& comm, std::int64_t heads, std::int64_t kv_heads,
                                                std::int64_t head_dim);

// Not collective: FLOP/s of one row [1, in] through each product [in, out] listed (BLAS on this
// thread, each weight matrix its own, read warm; 20 rows in turn), the median of 7 on the decode
// probes' clock (this thread's CPU time on one thread): a decode step's row.
double row_rate(const std::vector<std::pair<std::int64_t, std::int64_t>>& products);

struct Calibration {
  // Links fitted (send/recv inside and between nodes, every rank sending across at once, the
  // all-to-all inside a node), ranks_per_node measured, peak_flops the attention forward's rate at
  // efficiency 1, kernel.backward_ratio the backward's seconds over the forward's. Each link's
  // overlap: an 8 MiB ring hop (every rank sending on, as a ring does) timed alone, four forward
  // calls of head_dim timed alone (sized to the hop, Request::test() between them as the ring's
  // progress callback does) and both at once (overlap_fraction), with overlap_calls 4; 1 where no
  // ring crosses it.
  Cluster cluster;
  double gemm_flops = 0;  // gemm_rate of the layer calibrate() was given (0: none)
};

// Collective over `comm`. Measures the attention rate at head_dim in dtype, gemm_rate(1024,
// gemm_in, gemm_out) (unless gemm_in is 0: gemm_flops 0) and the links, and returns the slowest
// rank's rates (the same on every rank). Throws Error on every rank when the nodes do not hold the same number of contiguous
// ranks (mpirun --map-by slot), which the planner's placement assumes.
Calibration calibrate(Communicator& comm, std::int64_t head_dim, DType dtype, std::int64_t gemm_in = 0,
                      std::int64_t gemm_out = 0);

}  // namespace ulysses
