// The seed's claims 4 (causal load balance) and 5 (kernel efficiency per call shape), measured
// on one process with every core (seed_kernels.cpp says how).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/core/tensor.hpp"

namespace ulysses::seed {

struct BalanceRow {
  std::string layout;  // "p2p contiguous", "p2p zigzag", "a2a"
  int cp = 0;
  std::vector<double> seconds;      // per rank: its forward + backward kernels, replayed alone
  std::vector<std::int64_t> pairs;  // per rank: (query, key) pairs inside the mask it computes
};
// Causal global q = k = v of shape s (MHA) at each cp; per rank the best of `rounds`.
std::vector<BalanceRow> measure_balance(const Shape& s, const std::vector<int>& cps, int rounds);

struct KernelRow {
  int cp = 0;
  double ulysses_gflops = 0, ring_gflops = 0, zigzag_gflops = 0;  // 0: the shape does not exist
};
// Non-causal forward GFLOP/s of the one call shape each strategy makes at cp, for the global
// shape s; the best of five rounds over every call shape, each timing at least min_seconds.
std::vector<KernelRow> measure_kernel_efficiency(const Shape& s, const std::vector<int>& cps, double min_seconds);

}  // namespace ulysses::seed
