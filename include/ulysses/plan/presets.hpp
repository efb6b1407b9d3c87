// Named devices and fabrics for the planner (`ulysses plan --gpu H100 --intra-fabric nvlink4`):
// a GPU's dense peak per dtype, memory, memory bandwidth and attention-kernel curve
// (kernel_model.hpp), and a link's rate and latency, each with its source. docs/planner.md lists
// them; values without a published measurement behind them say "assumed".
#pragma once

#include <string>
#include <vector>

#include "ulysses/cp/cost_model.hpp"

namespace ulysses {

struct KernelPreset {
  std::string name;  // "fa2", "fa3"
  double efficiency = 0.5;
  KernelModel kernel;
  std::string source;
};

struct GpuPreset {
  std::string name;
  double bf16_flops = 0, f32_flops = 0;  // dense peak per GPU
  double memory_bytes = 0, memory_bandwidth = 0;
  std::string kernel;         // its default KernelPreset
  double kernel_scale = 1;    // that kernel's efficiency on this GPU relative to where it was measured
  std::string intra, source;  // its usual intra-node fabric
};

struct FabricPreset {
  std::string name;
  Link link;
  // An all-to-all's achieved bandwidth per rank over a whole node (0: the link's), and how many
  // ranks sit on one switch below the link they share (0: none shared, NVSwitch).
  double alltoall_bandwidth = 0;
  int switch_ranks = 0;
  // Ranks under one CPU socket (0: one tier), an all-to-all's rate per rank within one, and a
  // point-to-point flow's between sockets (Cluster::socket_ranks).
  int socket_ranks = 0;
  double socket_alltoall_bandwidth = 0, cross_socket_bandwidth = 0;
  std::string source;
};

const std::vector<KernelPreset>& kernel_presets();
const std::vector<GpuPreset>& gpu_presets();
const std::vector<FabricPreset>& fabric_presets();
// By name, case-insensitive; throws Error naming the known ones.
const KernelPreset& find_kernel_preset(const std::string& name);
const GpuPreset& find_gpu_preset(const std::string& name);
const FabricPreset& find_fabric_preset(const std::string& name);

// The cluster a GPU preset (and its default or the named kernel) implies for `dtype`: peak,
// efficiency, kernel curve and memory bandwidth; links untouched.
void apply_gpu(Cluster& cluster, const GpuPreset& gpu, const KernelPreset& kernel, DType dtype);
// The intra-node links a fabric implies: point-to-point, all-to-all and the shared switch.
void apply_intra_fabric(Cluster& cluster, const FabricPreset& fabric);

}  // namespace ulysses
