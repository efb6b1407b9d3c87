#include "ulysses/calibrate_kernel.hpp"

#include <algorithm>

#include "ulysses/attention.hpp"
#include "ulysses/calibrate.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

namespace {

// Seconds per forward FLOP of 256 queries against `keys` keys, non-causal, on this rank.
double seconds_per_flop(const Communicator& comm, std::int64_t keys, std::int64_t d, DType dtype) {
  const std::int64_t sq = 256, h = 2;
  Tensor q({1, sq, h, d}, dtype), o(q.shape(), dtype), k({1, keys, h, d}, dtype), v(k.shape(), dtype);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
  const Tensor lse = lse_tensor(q.shape());
  const AttentionParams p{.causal = false};
  const double s = local_median_seconds(comm, [&] {
    flash_attention_forward(o.view(), lse.view(), q.view(), k.view(), v.view(), p);
  });
  return s / attention_forward_flops(1, sq, keys, h, d, false);
}

}  // namespace

KernelModel calibrate_kernel(Communicator& comm, std::int64_t head_dim, DType dtype) {
  constexpr double short_len = 128, long_len = 2048;
  double per_flop[2] = {seconds_per_flop(comm, std::int64_t(short_len), head_dim, dtype),
                        seconds_per_flop(comm, std::int64_t(long_len), head_dim, dtype)};
  comm.allreduce_max(per_flop, 2);
  // rate ratio ρ = r(128) / r(2048) = (128/(128+h)) / (2048/(2048+h)), solved for h.
  const double rho = per_flop[1] / per_flop[0];
  KernelModel m;
  if (rho < 1 && rho * long_len > short_len)
    m.kv_half = std::clamp(short_len * long_len * (1 - rho) / (rho * long_len - short_len), 0.0, 8192.0);
  return m;
}

void apply_calibrated_kernel(Cluster& cluster, const KernelModel& kernel, std::int64_t head_dim) {
  cluster.kernel = kernel;
  cluster.peak_flops /= block_efficiency(kernel, head_dim, 2048, 2048, true);
}

}  // namespace ulysses
