#include "ulysses/plan/calibrate_kernel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <functional>
#include <vector>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

namespace {

// One timed forward: q_len queries against kv_len keys on `heads` heads, non-causal.
struct KernelShape {
  std::int64_t q_len, kv_len, heads;
};

// Seconds of one forward call at `shape` on this rank (median of 5 after a warm-up).
double forward_seconds(const Communicator& comm, KernelShape shape, std::int64_t d, DType dtype) {
  Tensor q({1, shape.q_len, shape.heads, d}, dtype), o(q.shape(), dtype), k({1, shape.kv_len, shape.heads, d}, dtype),
      v(k.shape(), dtype);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
  const Tensor lse = lse_tensor(q.shape());
  const AttentionParams p{.causal = false};
  return local_median_seconds(comm,
                              [&] { flash_attention_forward(o.view(), lse.view(), q.view(), k.view(), v.view(), p); });
}

// Solves the 3×3 system a·x = b by Cramer's rule; false when it is singular.
bool solve3(const std::array<std::array<double, 3>, 3>& a, const std::array<double, 3>& b, std::array<double, 3>& x) {
  auto det = [](const std::array<std::array<double, 3>, 3>& m) {
    return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
           m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
  };
  const double d = det(a);
  if (!(std::abs(d) > 0) || !std::isfinite(d)) return false;
  for (int c = 0; c < 3; ++c) {
    auto m = a;
    for (int r = 0; r < 3; ++r) m[std::size_t(r)][std::size_t(c)] = b[std::size_t(r)];
    x[std::size_t(c)] = det(m) / d;
  }
  return true;
}

// The median of `runs` timings of `run` by `seconds`, after a warm-up.
double median_seconds(const std::function<double()>& seconds, int runs, const std::function<void()>& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < std::max(runs, 1); ++i) {
    const double t0 = seconds();
    run();
    t.push_back(seconds() - t0);
  }
  std::nth_element(t.begin(), t.begin() + std::ptrdiff_t(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// Seconds of one causal forward of `queries` tokens at position 0 against kv_len keys on `heads`
// heads: the queries see only the first keys, so the call's other work is packing K and V.
double pack_call_seconds(std::int64_t queries, std::int64_t kv_len, std::int64_t heads, std::int64_t d, DType dtype,
                         const std::function<double()>& seconds, int runs, bool causal = true) {
  Tensor q({1, queries, heads, d}, dtype), o(q.shape(), dtype), k({1, kv_len, heads, d}, dtype), v(k.shape(), dtype);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
  const Tensor lse = lse_tensor(q.shape());
  const AttentionParams p{.causal = causal};
  return median_seconds(seconds, runs,
                        [&] { flash_attention_forward(o.view(), lse.view(), q.view(), k.view(), v.view(), p); });
}

// A call's K/V pack (KernelModel::kv_pack_s_per_byte) in seconds, for kv_len keys on `heads` heads.
double pack_seconds(const KernelModel& m, double kv_len, double heads, std::int64_t d, DType dtype) {
  return m.kv_pack_s_per_byte * 2 * kv_len * heads * double(d) * double(dtype_size(dtype));
}

}  // namespace

void calibrate_pack(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                    int runs, KernelModel& model) {
  // 16 (32) MiB of float32 K/V at head dim 64 (128): the middle of the grid's sizes, where the
  // pack runs at about 0.3-0.5 ns per byte on this machine (0.1-0.2 in the cache, 4 MiB).
  const std::int64_t queries = 16, keys = 8192, heads = 4;
  std::array<double, 2> t{pack_call_seconds(queries, keys, heads, head_dim, dtype, seconds, runs),
                          pack_call_seconds(queries, queries, heads, head_dim, dtype, seconds, runs)};
  comm.allreduce_max(t.data(), 2);  // the slowest rank's
  const double bytes = 2.0 * double(keys - queries) * double(heads * head_dim) * double(dtype_size(dtype));
  if (t[0] > t[1] && std::isfinite(t[0])) model.kv_pack_s_per_byte = (t[0] - t[1]) / bytes;
}

CacheFit fit_cache_term(const KernelModel& m, std::int64_t head_dim, double element_bytes, double cache_bytes,
                        const KernelTiming& fits, const KernelTiming& past) {
  const double per_key = 2 * double(head_dim) * element_bytes;
  for (double x : {per_key, cache_bytes, fits.seconds, fits.flops, fits.kv_len, past.seconds, past.flops, past.kv_len})
    if (!(x > 0) || !std::isfinite(x)) return {};
  if (fits.kv_len * per_key > cache_bytes || past.kv_len * per_key <= cache_bytes) return {};
  // Seconds per FLOP at the long-block rate: the kernel curve divided out.
  auto unit = [&](const KernelTiming& t) {
    return t.seconds / t.flops * block_efficiency(m, head_dim, 1, t.kv_len, false);
  };
  const double factor = unit(past) / unit(fits), share = 1 - cache_bytes / per_key / past.kv_len;
  const double extra = (factor - 1) / share;
  if (!(extra > 0) || !std::isfinite(extra)) return {};
  return {cache_bytes, std::min(extra, 4.0)};
}

double parse_cache_size(const std::string& text, double fallback) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return fallback;
  }
  const std::string unit = text.substr(used, text.find_first_of(" \n", used) - used);
  const double scale = unit.empty() ? 1 : unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 0;
  return v * scale > 0 && std::isfinite(v * scale) ? v * scale : fallback;
}

void calibrate_cache(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                     int runs, KernelModel& model) {
  std::string text;
  std::ifstream("/sys/devices/system/cpu/cpu0/cache/index2/size") >> text;
  const double cache = parse_cache_size(text, 2.0 * 1024 * 1024);
  const double es = double(dtype_size(dtype)), per_key = 2 * double(head_dim) * es;
  const std::int64_t queries = 256, fits = std::max<std::int64_t>(std::int64_t(cache / per_key / 2), 64),
                     past = std::int64_t(8 * cache / per_key);
  // Each call less its own pack, timed at the same K/V (16 causal queries at position 0 see only
  // the first keys): the pack per byte grows past the cache too, and a rate calibrated at
  // another size left it in the compute.
  std::array<double, 4> t{};
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t keys = i == 0 ? fits : past;
    t[2 * i] = pack_call_seconds(queries, keys, 1, head_dim, dtype, seconds, runs, false);
    t[2 * i + 1] = pack_call_seconds(16, keys, 1, head_dim, dtype, seconds, runs, true);
  }
  comm.allreduce_max(t.data(), 4);  // the slowest rank's
  std::array<KernelTiming, 2> k;
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t keys = i == 0 ? fits : past;
    k[i] = {t[2 * i] - t[2 * i + 1], attention_forward_flops(1, queries, keys, 1, head_dim, false), double(keys)};
  }
  const CacheFit f = fit_cache_term(model, head_dim, es, cache, k[0], k[1]);
  model.cache_bytes = f.cache_bytes;
  model.past_cache_extra = f.past_cache_extra;
}

double fit_causal_half(double len, double full_s, double diag_s, double pack_s) {
  for (double x : {len, full_s, diag_s})
    if (!(x > 0) || !std::isfinite(x)) return 0;
  if (!(pack_s >= 0) || !std::isfinite(pack_s) || !(full_s > pack_s) || !(diag_s > pack_s)) return 0;
  // Seconds per visible pair: the full block's len², the diagonal's len (len + 1) / 2.
  const double full = (full_s - pack_s) / (len * len), diag = (diag_s - pack_s) / (len * (len + 1) / 2);
  const double efficiency = full / diag;  // len / (len + causal_half)
  if (!(efficiency < 1)) return 0;
  return std::min(len * (1 / efficiency - 1), 8192.0);
}

void calibrate_causal_half(Communicator& comm, std::int64_t head_dim, DType dtype,
                           const std::function<double()>& seconds, int runs, KernelModel& model) {
  const std::int64_t len = 512, heads = 4;
  std::array<double, 3> t{pack_call_seconds(len, len, heads, head_dim, dtype, seconds, runs, false),
                          pack_call_seconds(len, len, heads, head_dim, dtype, seconds, runs, true),
                          pack_call_seconds(16, len, heads, head_dim, dtype, seconds, runs, true)};
  comm.allreduce_max(t.data(), 3);  // the slowest rank's
  model.causal_half = fit_causal_half(double(len), t[0], t[1], t[2]);
}

KernelFit fit_kernel_times(const std::vector<KernelTiming>& timings) {
  // t = call_s + F·a + (F / kv)·b with a = 1 / rate_∞ and b = a·kv_half: linear in (call_s, a, b),
  // fitted by least squares on the relative error (each row over its own time), so the short
  // calls weigh as much as the long ones.
  std::array<std::array<double, 3>, 3> ata{};
  std::array<double, 3> atb{}, x{};
  int rows = 0;
  for (const KernelTiming& t : timings) {
    if (!(t.seconds > 0) || !(t.flops > 0) || !(t.kv_len > 0) || !std::isfinite(t.seconds + t.flops + t.kv_len))
      continue;
    rows += 1;
    const std::array<double, 3> row{1 / t.seconds, t.flops / t.seconds, t.flops / t.kv_len / t.seconds};
    for (std::size_t i = 0; i < 3; ++i) {
      atb[i] += row[i];
      for (std::size_t j = 0; j < 3; ++j) ata[i][j] += row[i] * row[j];
    }
  }
  KernelFit f;
  if (rows < 3 || !solve3(ata, atb, x) || !(x[1] > 0)) return f;
  f.call_s = std::max(0.0, x[0]);
  f.kv_half = std::clamp(x[2] / x[1], 0.0, 8192.0);  // a fit that says short blocks run faster: the flat model
  return f;
}

KernelModel calibrate_kernel(Communicator& comm, std::int64_t head_dim, DType dtype) {
  // Two key lengths at 256 queries give the curve; two short calls give the fixed cost per call.
  constexpr std::array<KernelShape, 4> shapes{{{256, 128, 2}, {256, 2048, 2}, {64, 64, 1}, {16, 16, 1}}};
  std::array<double, 4> t{};
  for (std::size_t i = 0; i < shapes.size(); ++i) t[i] = forward_seconds(comm, shapes[i], head_dim, dtype);
  comm.allreduce_max(t.data(), 4);  // the slowest rank's times
  KernelModel m;
  calibrate_pack(
      comm, head_dim, dtype, [&] { return comm.now(); }, 7, m);
  calibrate_stream(
      comm, head_dim, dtype, [&] { return comm.now(); }, 5, m);
  // The curve and the fixed cost are fitted to the calls' compute: their packs and streams are
  // priced apart.
  std::vector<KernelTiming> timings;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const KernelShape& s = shapes[i];
    const double bytes = 2.0 * double((s.q_len + s.kv_len) * s.heads * head_dim) * double(dtype_size(dtype));
    timings.push_back(
        {t[i] - pack_seconds(m, double(s.kv_len), double(s.heads), head_dim, dtype) - stream_seconds(m, bytes),
         attention_forward_flops(1, s.q_len, s.kv_len, s.heads, head_dim, false), double(s.kv_len)});
  }
  const KernelFit fit = fit_kernel_times(timings);
  m.kv_half = fit.kv_half;
  m.call_s = fit.call_s;
  m.ring_pair_calls = true;  // this library's ring: a call per visible chunk pair
  calibrate_merge(
      comm, head_dim, [&] { return comm.now(); }, 15, m);
  return m;
}

void calibrate_merge(Communicator& comm, std::int64_t head_dim, const std::function<double()>& seconds, int runs,
                     KernelModel& model) {
  const std::int64_t tokens = 4096, heads = 4;  // 4 MiB at d 64: past the caches, as the grid's outputs are
  Tensor acc({1, tokens, heads, head_dim}, DType::f32), part(acc.shape(), DType::f32);
  Tensor acc_lse = lse_tensor(acc.shape()), part_lse = lse_tensor(acc.shape());
  for (auto [t, seed] : {std::pair{&acc, 1}, {&part, 2}, {&acc_lse, 3}, {&part_lse, 4}})
    fill_uniform(t->view(), std::uint64_t(seed));
  const DeviceOps& ops = device_ops(Device::cpu);
  const double bytes = double(tokens * heads * head_dim) * 4;
  // Medians of many runs: under other processes' load a few runs of a millisecond moved the
  // merge's rate 3-8x between calibrations.
  auto median_of_runs = [&](const std::function<void()>& run) { return median_seconds(seconds, runs, run); };
  std::array<double, 2> t{median_of_runs([&] { ops.merge(acc.view(), acc_lse.view(), part.view(), part_lse.view()); }),
                          median_of_runs([&] { std::memcpy(acc.data(), part.data(), std::size_t(bytes)); })};
  comm.allreduce_max(t.data(), 2);  // the slowest rank's
  // The merge as passes over its output at the rate a copy reads and writes (two passes).
  if (!(t[0] > 0) || !(t[1] > 0)) return;
  model.memory_bandwidth = 2 * bytes / t[1];
  model.merge_passes = t[0] * model.memory_bandwidth / bytes;
}

StreamFit fit_stream_term(double bytes_per_head, double ref_heads, double ref_s, double heads_a, double a_s,
                          double heads_b, double b_s) {
  for (double x : {bytes_per_head, ref_heads, ref_s, heads_a, a_s, heads_b, b_s})
    if (!(x > 0) || !std::isfinite(x)) return {};
  if (!(ref_heads < heads_a && heads_a < heads_b)) return {};
  // Each call's seconds beyond the reference's per head: what its larger working set added.
  const double excess_a = a_s - heads_a / ref_heads * ref_s, excess_b = b_s - heads_b / ref_heads * ref_s;
  const double bytes_a = heads_a * bytes_per_head, bytes_b = heads_b * bytes_per_head;
  const double slope = (excess_b - excess_a) / (bytes_b - bytes_a);
  if (!(slope > 0) || !std::isfinite(slope) || !(excess_b > 0)) return {};
  const double cache = std::clamp(bytes_a - excess_a / slope, ref_heads * bytes_per_head, bytes_b);
  if (!(cache < bytes_b)) return {};
  return {excess_b / (bytes_b - cache), cache};  // through b's point: the larger, steadier excess
}

void calibrate_stream(Communicator& comm, std::int64_t head_dim, DType dtype, const std::function<double()>& seconds,
                      int runs, KernelModel& model) {
  const std::int64_t len = 512;
  constexpr std::array<std::int64_t, 3> heads{2, 8, 32};
  std::array<double, 3> t{};
  for (std::size_t i = 0; i < heads.size(); ++i)
    t[i] = pack_call_seconds(len, len, heads[i], head_dim, dtype, seconds, runs, false);
  comm.allreduce_max(t.data(), 3);                                                   // the slowest rank's
  const double per_head = 4.0 * double(len * head_dim) * double(dtype_size(dtype));  // q, out, K, V
  const StreamFit f = fit_stream_term(per_head, double(heads[0]), t[0], double(heads[1]), t[1], double(heads[2]), t[2]);
  model.stream_s_per_byte = f.s_per_byte;
  model.stream_cache_bytes = f.cache_bytes;
}

namespace {

// attention_rates' block: its FLOPs and its working set (q, out, K, V) at head_dim and element_bytes.
double rate_block_flops(std::int64_t head_dim) {
  return attention_forward_flops(1, kRateTokens, kRateTokens, kRateHeads, head_dim, true);
}
double rate_block_bytes(std::int64_t head_dim, double element_bytes) {
  return 4.0 * double(kRateTokens * kRateHeads * head_dim) * element_bytes;
}

}  // namespace

double kernel_peak_of_rate(const KernelModel& k, double rate, std::int64_t head_dim, double element_bytes) {
  const double flops = rate_block_flops(head_dim), t = flops / rate;
  const double stream = std::min(stream_seconds(k, rate_block_bytes(head_dim, element_bytes)), t / 2);
  return flops / (t - stream) / block_efficiency(k, head_dim, kRateTokens, kRateTokens, true);
}

double rate_of_kernel_peak(const KernelModel& k, double peak, std::int64_t head_dim, double element_bytes) {
  const double flops = rate_block_flops(head_dim);
  const double t = flops / (peak * block_efficiency(k, head_dim, kRateTokens, kRateTokens, true));
  return flops / (t + std::min(stream_seconds(k, rate_block_bytes(head_dim, element_bytes)), t));
}

void apply_calibrated_kernel(Cluster& cluster, const KernelModel& kernel, std::int64_t head_dim, double element_bytes) {
  const double backward_ratio = cluster.kernel.backward_ratio;  // calibrate()'s, measured with the rate
  cluster.kernel = kernel;
  cluster.kernel.backward_ratio = backward_ratio;
  cluster.peak_flops = kernel_peak_of_rate(kernel, cluster.peak_flops, head_dim, element_bytes);
}

}  // namespace ulysses
