#include "ulysses/plan/presets.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

template <class T>
const T& find_named(const std::vector<T>& all, const std::string& name, const char* what) {
  for (const T& p : all)
    if (lower(p.name) == lower(name)) return p;
  std::string known;
  for (const T& p : all) known += (known.empty() ? "" : ", ") + p.name;
  throw Error(fmt::format("unknown {} '{}' (known: {})", what, name.substr(0, 40), known));
}

// Launch, step synchronisation and the LSE merge of a Python ring (ring-flash-attention's
// out/lse update: about six float32 passes over a step's output) on a GPU: fitted to its 8xH800
// zigzag at 85-90 % of ideal (docs/planner.md).
KernelModel gpu_kernel(double kv_half, double causal_half, double head_dim_half) {
  return {.kv_half = kv_half,
          .causal_half = causal_half,
          .head_dim_half = head_dim_half,
          .backward_ratio = 2.9,
          .call_s = 50e-6,
          .merge_passes = 6,
          .memory_bandwidth = 0};
}

}  // namespace

const std::vector<KernelPreset>& kernel_presets() {
  static const std::vector<KernelPreset> all{
      {"fa3", 0.663, gpu_kernel(205, 280, 54.5),
       "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608), H100 SXM5 BF16 forward: head dim 128 "
       "467-648 TFLOP/s (non-causal) and 292-616 (causal) from 512 to 16k tokens; head dim 64: 497, 256: 756 at "
       "16k; backward 561 at 16k"},
      {"fa2", 0.376, gpu_kernel(100, 235, 20),
       "FlashAttention-2 as measured in the FlashAttention-3 paper on H100 SXM5 BF16 forward: head dim 128 "
       "309-370 TFLOP/s (non-causal), 191-335 (causal) from 512 to 16k; head dim 64: 324 at 16k; backward 322"},
  };
  return all;
}

const std::vector<GpuPreset>& gpu_presets() {
  // Dense peaks (no sparsity) and memory from NVIDIA's datasheets. kernel_scale: FlashAttention-2
  // reaches 50-73 % of A100's peak (FlashAttention-2 paper, arXiv:2307.08691) against 38 % of
  // H100's; 0.65 / 0.376 fitted on ring-flash-attention's and long-context-attention's 8xA100.
  static const std::vector<GpuPreset> all{
      {"A100", 312e12, 19.5e12, 80e9, 2.039e12, "fa2", 0.65 / 0.376, "nvlink3", "A100 SXM4 80GB datasheet"},
      {"A800", 312e12, 19.5e12, 80e9, 2.039e12, "fa2", 0.65 / 0.376, "nvlink3-a800",
       "A800 SXM4 80GB: A100's compute and memory, NVLink 400 GB/s"},
      {"H100", 989e12, 67e12, 80e9, 3.35e12, "fa3", 1, "nvlink4", "H100 SXM5 datasheet"},
      {"H800", 989e12, 67e12, 80e9, 3.35e12, "fa3", 1, "nvlink4-h800", "H800 SXM5: H100 compute, NVLink 400 GB/s"},
      {"H20", 148e12, 44e12, 96e9, 4.0e12, "fa3", 1, "nvlink4",
       "H20 as NVIDIA's partners list it (148 TFLOP/s BF16 dense, 44 FP32, 96 GB HBM3 at 4.0 TB/s, NVLink "
       "900 GB/s); kernel: FlashAttention-3's H100 curve and efficiency (assumed)"},
      {"H200", 989e12, 67e12, 141e9, 4.8e12, "fa3", 1, "nvlink4", "H200 SXM datasheet"},
      {"B200", 2250e12, 75e12, 180e9, 8e12, "fa3", 0.9, "nvlink5",
       "HGX B200 datasheet per GPU; kernel: FlashAttention-3's curve at 0.9 of its H100 efficiency (assumed)"},
      {"L20", 119.5e12, 59.8e12, 48e9, 0.864e12, "fa2", 0.82 / 0.376, "pcie4",
       "L20 datasheet (PCIe Gen4, no NVLink); kernel efficiency 0.82 fitted on long-context-attention's 8xL20 rings"},
      {"L40S", 362e12, 91.6e12, 48e9, 0.864e12, "fa2", 0.5 / 0.376, "pcie4",
       "L40S datasheet (PCIe Gen4, no NVLink); kernel efficiency 0.5 assumed"},
  };
  return all;
}

const std::vector<FabricPreset>& fabric_presets() {
  // Per rank, per direction. NVLink: links x 25 GB/s per direction (NVIDIA). PCIe: x16 lanes at
  // 80 % of the raw rate; 8 GPUs under 4 switches (2 each) on 2 sockets. Without peer-to-peer
  // between them, what leaves a switch goes through the host: long-context-attention's 8xL20
  // table (docs/planner.md) measures an all-to-all at about 4.5 GB/s a rank within a socket's 4,
  // 1.5 GB/s over both sockets, and a ring's blocks across the sockets at about 7 GB/s.
  // InfiniBand/RoCE: the port's line rate, one port per GPU.
  static const std::vector<FabricPreset> all{
      {"nvlink3", {300e9, 2e-6}, 0, 0, 0, 0, 0, "A100: 12 NVLink 3 links, 600 GB/s both directions"},
      {"nvlink3-a800", {200e9, 2e-6}, 0, 0, 0, 0, 0, "A800: NVLink 400 GB/s both directions"},
      {"nvlink4", {450e9, 2e-6}, 0, 0, 0, 0, 0, "H100/H200: 18 NVLink 4 links, 900 GB/s both directions"},
      {"nvlink4-h800", {200e9, 2e-6}, 0, 0, 0, 0, 0, "H800: NVLink 400 GB/s both directions"},
      {"nvlink5", {900e9, 2e-6}, 0, 0, 0, 0, 0, "B200: 18 NVLink 5 links, 1.8 TB/s both directions"},
      {"pcie4",
       {25.6e9, 5e-6},
       1.5e9,
       2,
       4,
       4.5e9,
       7e9,
       "PCIe 4.0 x16: 32 GB/s raw per direction; all-to-all and cross-socket rates fitted on "
       "long-context-attention's 8xL20 table"},
      {"pcie5",
       {51.2e9, 5e-6},
       3e9,
       2,
       4,
       9e9,
       14e9,
       "PCIe 5.0 x16: 64 GB/s raw per direction; pcie4's fits x2 (assumed)"},
      {"ib-hdr", {25e9, 5e-6}, 0, 0, 0, 0, 0, "InfiniBand HDR 200 Gb/s per GPU"},
      {"ib-ndr", {50e9, 5e-6}, 0, 0, 0, 0, 0, "InfiniBand NDR 400 Gb/s per GPU"},
      {"ib-xdr", {100e9, 5e-6}, 0, 0, 0, 0, 0, "InfiniBand XDR 800 Gb/s per GPU"},
      {"roce-100", {12.5e9, 8e-6}, 0, 0, 0, 0, 0, "RoCE 100 Gb/s per GPU"},
      {"roce-200", {25e9, 8e-6}, 0, 0, 0, 0, 0, "RoCE 200 Gb/s per GPU"},
      {"roce-400", {50e9, 8e-6}, 0, 0, 0, 0, 0, "RoCE 400 Gb/s per GPU"},
  };
  return all;
}

const KernelPreset& find_kernel_preset(const std::string& name) { return find_named(kernel_presets(), name, "kernel"); }
const GpuPreset& find_gpu_preset(const std::string& name) { return find_named(gpu_presets(), name, "GPU"); }
const FabricPreset& find_fabric_preset(const std::string& name) { return find_named(fabric_presets(), name, "fabric"); }

void apply_gpu(Cluster& c, const GpuPreset& gpu, const KernelPreset& kernel, DType dtype) {
  c.peak_flops = dtype == DType::f32 ? gpu.f32_flops : gpu.bf16_flops;
  const double scale = kernel.name == gpu.kernel ? gpu.kernel_scale : 1.0;
  c.efficiency = std::min(1.0, kernel.efficiency * scale);
  c.kernel = kernel.kernel;
  c.kernel.memory_bandwidth = gpu.memory_bandwidth;
}

void apply_intra_fabric(Cluster& c, const FabricPreset& f) {
  c.intra = f.link;
  c.alltoall_intra = f.alltoall_bandwidth > 0 ? Link{f.alltoall_bandwidth, f.link.latency} : Link{0, 0};
  c.switch_ranks = f.switch_ranks;
  c.socket_ranks = f.socket_ranks;
  c.alltoall_socket = Link{f.socket_alltoall_bandwidth, f.socket_alltoall_bandwidth > 0 ? f.link.latency : 0};
  c.cross_socket = Link{f.cross_socket_bandwidth, f.cross_socket_bandwidth > 0 ? f.link.latency : 0};
}

}  // namespace ulysses
