#include "train/memory.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include "kernels/peak.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses::train {

namespace {

constexpr double kFloat = 4;
// Measured: a rank of `ulysses train` before its model (MPI with shared-memory transport,
// OpenBLAS, oneDNN, the program): VmHWM of a width-8 run on 1 and 2 ranks, 19.7-19.9 MiB, and
// 2.4 MiB more since libulysses links oneDNN (a 1-layer run at s 64: 21.9 -> 24.3 MiB). bf16's
// GEMMs add oneDNN's generated kernels and scratchpads: 3.0 MiB more there (27.3 MiB).
constexpr double kBaselineBytes = 22.4 * (1 << 20), kBf16GemmBytes = 3.0 * (1 << 20);

// One rank's transients in the backward, in contexts: fitted to one one-rank run of
// train_memory_test.sh.
constexpr double kOneRankTransient = 0.5;

// One layer's attention on the busiest rank in `dtype`: its strategy's model (Strategy::memory)
// on cp > 1 ranks; on one rank ContextParallelAttention's plain flash attention, which keeps
// q, k, v, out and lse (each counted at `dtype` width), and half a context of transients.
StrategyMemory memory_of(const TrainConfig& c, int cp, DType dtype) {
  const GptConfig& m = c.model;
  const Shape q{c.batch, c.seq, m.heads, m.head_dim};
  if (cp > 1) return find_strategy(c.cp.cp_comm_type).memory(c.cp, cp, q, c.seq, m.kv_heads, dtype);
  const double per_token = 2 * double(m.heads * m.head_dim) + 2 * double(m.kv_heads * m.head_dim) + double(m.heads);
  const double kept = double(dtype_size(dtype)) * double(c.batch) * double(c.seq) * per_token;
  return {kept, kept, kOneRankTransient * kept};
}

// bf16 on a CPU without a bf16 engine (kernel_converts): the kernels work on
// float32 copies (q, k, v and dout: about one float32 context) and the transients are float32
// contexts; at cp = 1 the bf16 dq adds per-thread float32 dQ copies of all heads. In float32
// contexts, fitted to the a2a, p2p and all_gather shapes of train_memory_test.sh at bf16, within 4 %.
constexpr double kConvertedContexts = 1.0, kConvertedOneRankContexts = 2.4;

}  // namespace

std::string MemoryEstimate::describe() const {
  return fmt::format("{} (weights {}, activations {}, attention {}, baseline {})", format_bytes(total()),
                     format_bytes(weights), format_bytes(activations), format_bytes(attention), format_bytes(baseline));
}

MemoryEstimate predict_memory(const TrainConfig& c, int cp) {
  const GptConfig& m = c.model;
  const MemoryOptions& o = c.memory;
  const double n = double((c.seq + cp - 1) / cp), N = double(c.batch) * n;
  const double C = double(m.width), F = double(m.hidden), V = double(m.vocab), L = double(m.layers);
  const double QD = double(m.heads * m.head_dim), KD = double(m.kv_heads * m.head_dim);
  const double tm = o.tiled_mlp ? std::min(double(o.tile_rows), N) : N, tl = std::min(double(o.tile_rows), N);
  const bool ckpt = o.checkpoint_activations;
  MemoryEstimate e;
  const double P = double(m.num_params());
  const bool bf16 = c.dtype == DType::bf16;
  // bf16 GEMMs on oneDNN's dot product, or through float32 copies where the FMA is faster (gemm.hpp)
  const bool dot = bf16 && kernels::compute_unit(DType::bf16) == kernels::PeakUnit::bf16_dot;
  // + the all-reduce's receive buffer; + the weights' bf16 copy for the bf16 GEMMs
  e.weights = P * (4 * kFloat + 1) + (cp > 1 ? P * kFloat : 0.0) + (bf16 ? 2 * P : 0.0);
  e.baseline = kBaselineBytes + (dot ? kBf16GemmBytes : 0.0);
  // One layer's forward state besides its input (gpt.hpp LayerActs: q, k, v are dropped once
  // the attention op holds its copies), floats.
  const double layer = N * (3 * C + 2 + QD) + (o.tiled_mlp ? 0.0 : 3 * N * F);
  const double kept = L * N * C + (ckpt ? 1 : L) * layer + N * (2 * C + 1);     // + x_final, xf, rstdf
  const double data = double(c.batch * c.seq) * 9 + N * (13 + 8 + 16) + n * 8;  // bytes: batch, shard, copies
  // Forward's end: the logits (and their gradient unless tiled) on top of what is kept.
  const double fwd_end = kept + (o.tiled_loss ? tl * V : 2 * N * V);
  // The top layer's backward: dx and the layer's gradient temporaries (gpt.hpp LayerGrads),
  // the recompute's output, the MLP's recomputed tile.
  // Under bf16 the largest GEMM's rounded copies of its inputs (the MLP's down projection: h and
  // dout) come on top: half a float each for the dot product, a float each and the weight's
  // float32 copy on the float32 route.
  const double gemm_copies = !bf16 ? 0.0 : dot ? tm * (F + C) / 2 : tm * (F + C) + C * F;
  const double bwd = kept + N * C + N * (3 * C + 2 * QD + 2 * KD) + 3 * tm * F + (ckpt ? N * C : 0.0) +
                     (o.tiled_mlp ? 3 * tm * F : 0.0) + gemm_copies;
  e.activations = kFloat * std::max(fwd_end, bwd) + data;
  // Contexts in flight (all layers', or the recomputed one's), and the strategy's buffers in
  // the backward (head-sharded dout and gradients, send buffers; the ring's K/V and dK/dV in
  // flight: StrategyMemory::backward, fitted to the measured peaks). Converted, those are
  // float32 contexts.
  const StrategyMemory mem = memory_of(c, cp, c.dtype);
  const double f32_context = memory_of(c, cp, DType::f32).kept;
  const double converted_transient = cp == 1 ? kConvertedOneRankContexts : kConvertedContexts;
  e.attention =
      mem.kept * (ckpt ? 1 : L) +
      (kernel_converts(c.dtype) ? f32_context * (mem.backward / mem.kept + converted_transient) : mem.backward);
  if (c.dtype == DType::bf16) e.attention += 2.0 * N * (2 * QD + 2 * KD);  // CpAttention's bf16 q | k | v | out
  return e;
}

std::int64_t longest_sequence(TrainConfig c, int cp, double cap) {
  const std::int64_t unit = 2 * cp;
  auto fits = [&](std::int64_t units) {
    c.seq = units * unit;
    return predict_memory(c, cp).total() <= cap;
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;
  while (fits(hi) && hi < (std::int64_t(1) << 40)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * unit;
}

double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      double kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) * 1024;
}

double parse_bytes(const std::string& text) {
  // Plain decimal digits with an optional fraction, then an optional unit: strtod alone would
  // also read hexadecimal ("0x10" as 16 bytes), exponents, "inf" and "nan".
  std::size_t i = 0, digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
  if (i < text.size() && text[i] == '.')
    for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]));) ++i, ++digits;
  const double x = digits > 0 ? std::strtod(text.substr(0, i).c_str(), nullptr) : 0.0;
  std::string unit = text.substr(i);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char ch) { return std::isspace(ch); }), unit.end());
  static const std::pair<const char*, double> units[] = {
      {"", 1},     {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12}};
  for (const auto& [name, scale] : units)
    if (digits > 0 && unit == name && x > 0 && std::isfinite(x * scale)) return x * scale;
  throw Error(fmt::format("'{}' is not a memory size (decimal digits and a unit, like 2GiB, 512MiB, 1.5GB)", text));
}

std::string format_bytes(double b) {
  if (b >= 1073741824.0) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  return fmt::format("{:.1f} MiB", b / 1048576.0);
}

}  // namespace ulysses::train
