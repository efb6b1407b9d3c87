// `ulysses plan`: choose a context-parallel strategy and predict its cost.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "options.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/plan/plan_inference.hpp"
#include "ulysses/plan/planner.hpp"

namespace ulysses::cli {

struct PlanOptions {
  std::int64_t seq = 0, batch = 1, heads = 0, kv_heads = 0, head_dim = 128, layers = 1;
  int cp = 8, ranks_per_node = 8;
  std::string intra_bw = "450GB/s", intra_lat = "2us", inter_bw = "50GB/s", inter_lat = "5us", dtype = "bf16";
  double tflops = 989, efficiency = 0.5;
  bool calibrate = false, scaling = false, no_causal = false;
  std::string json, svg;
  std::string docs;  // packed documents: lengths, "1000,5000" or "16x1024"
  // --train: the longest sequence `ulysses train` fits per rank in --max-memory, per cp.
  bool train = false;
  std::int64_t width = 0, hidden = 0;  // 0: heads x head_dim, and train's (8/3 width, to a multiple of 4)
  std::int64_t vocab = 256;            // --mode decode with --width: the LM head's (train's byte-level 256)
  std::int64_t tile_rows = 1024;
  std::string max_memory = "2GiB";
  std::string window;                    // sliding window "L" or "L,R"
  std::int64_t kv_seq = 0;               // cross-attention: k/v length; 0 = --seq
  std::optional<std::int64_t> q_offset;  // cross-attention, causal: key position of query 0
  // --lengths: balance a variable-length step over --world ranks (0: 2, 4, ... 1024).
  std::string lengths, cp_comm_type = CpConfig().cp_comm_type;
  int world = 0, dp = 1;
  std::int64_t max_tokens_per_rank = 0;
  BackendOptions backend;  // --comm, --ranks
  double timeout = 300;    // seconds any wait may take (--calibrate's collectives)
  bool max_memory_given = false;
  // Presets (ulysses/plan/presets.hpp) and what a step computes; explicit flags override a preset.
  std::string gpu, kernel, intra_fabric, inter_fabric, mode = "train";
  std::set<std::string> given;  // the options named on the command line ("--tflops", ...)
  // Inference: device memory bandwidth (decode reads the cache at it; default: the GPU's, else
  // H100's) and the tokens already cached under a prefill's new ones (-1: none, no turn table).
  std::string memory_bw;
  std::int64_t cached = -1;
  // --calibrate --grid quick|full: every strategy of a grid of shapes run for real, each row's
  // fastest of grid_runs interleaved runs against its prediction (plan_grid.cpp).
  std::string grid;
  int grid_runs = 3;
  std::string grid_clock = "cpu";  // cpu: process CPU time (a loaded machine); wall: seconds
};

void add_plan_command(CLI::App& app, PlanOptions& opt);

// A checked planner input and the header's lines naming the presets it used and the explicit
// flags that won over them ("" without presets).
struct PlanRequest {
  PlanInput in;
  std::string presets;
  DecodeModel row;  // --mode decode with --width: the model around the attention (width 0: none)
};
// Not collective. The options as a planner input, checked (throws Error). Calibration plans for
// this machine: cp = its ranks, all on one node, float32.
PlanRequest plan_request(const PlanOptions& opt, int ranks);
// How a run is timed. wall: elapsed seconds. cpu: the process's CPU seconds, which on a machine
// shared with other work leave out the time the rank waited for a core; a rank that waits for
// its peer spins, so while every process gets the same share of the cores a step's CPU seconds
// are its wall seconds on a quiet machine (for steps whose transfers the CPUs make: shared
// memory, not a network's wire time).
enum class StepClock { wall, cpu };
// Collective over `comm`: runs the strategy `cfg` at in's shape `runs` times (forward and
// backward; forward alone in the forward and prefill modes) and returns each run's seconds on
// the slowest rank, the same on every rank.
std::vector<double> measure_runs(Communicator& comm, const PlanInput& in, const CpConfig& cfg, int runs,
                                 StepClock clock = StepClock::wall);
// What measure_runs needs per rank at its largest over in's valid rows: q, k, v, out, dout and
// the gradients, and the most any strategy's working set holds.
double measured_memory(const PlanInput& in);

// Collective over MPI_COMM_WORLD when calibrating; otherwise rank 0 does the work.
int run_plan(const PlanOptions& opt);
// `ulysses plan --calibrate --grid`: the planner against measured steps over a grid of shapes
// (plan_grid.cpp). Collective over MPI_COMM_WORLD.
int run_plan_grid(const PlanOptions& opt);
// Rank 0 alone: the table of `ulysses plan --train`.
int run_plan_train(const PlanOptions& opt);
// `ulysses plan --lengths`: each balance policy's plan and predictions (plan_lengths.cpp).
// Collective over MPI_COMM_WORLD when calibrating; otherwise rank 0 does the work.
int run_plan_lengths(const PlanOptions& opt);
// Not collective. An option the mode (--train, --lengths, a plan of --seq; --calibrate) would
// leave without effect is an Error naming it, never silently ignored. `ranks`: this job's.
void check_plan_option_effects(const PlanOptions& opt, int ranks);
// Collective. This machine's attention rate and links (ulysses/plan/calibrate.hpp), on the default
// threads, into in.cluster.
void calibrate_cluster(Communicator& comm, PlanInput& in);
// Collective (plan_grid.cpp). in.cluster, calibrated, in CPU seconds: the attention rate measured
// so, the links and the fixed cost per call scaled by the load (wall rate over CPU rate), the
// merge timed again.
void cpu_time_cluster(Communicator& comm, PlanInput& in);
// Collective (plan_grid.cpp). attention_rates in CPU seconds, every rank at once, the slowest
// rank's forward rate and backward ratio kept.
AttentionRates cpu_attention_rates(Communicator& comm, std::int64_t head_dim);
// Collective (plan_grid.cpp). FLOP/s in CPU seconds of the forward of the last
// kPrefillProbeQueries queries of a causal prompt of `keys` tokens (`heads` heads) against all
// of it: a long prefill's rate, its key stream past the core's cache as the prompt's is, less
// the call's K/V pack at pack_s_per_byte (KernelModel::kv_pack_s_per_byte). The median of 3 after
// a warm-up, every rank at once, the slowest kept.
inline constexpr std::int64_t kPrefillProbeQueries = 512;
double cpu_prefill_rate(Communicator& comm, std::int64_t head_dim, std::int64_t heads, std::int64_t keys,
                        double pack_s_per_byte);
// Collective. What a decode step costs here: the decode kernel's read rate over a cache of at least
// 256 MiB a rank (into in.cluster.kernel.memory_bandwidth) and, with a width, the row's rate; the
// slowest rank's, on every rank; then the prefill's figures (calibrate_prefill). Returns the
// header's lines.
std::string calibrate_decode(Communicator& comm, PlanInput& in, DecodeModel& row);
// Collective. The prefill's figures (DecodeModel::prefill_*) in CPU seconds, every rank at once,
// the slowest rank's: the forward kernel's rate on the prompt's key length (cpu_prefill_rate, the
// busiest Ulysses rank's heads) over the kernel curve's efficiency at that block, and, with a width, the model's own layers over the busiest rank's prompt
// rows (at most 16384) with the attention left out (train::prefill_row_seconds). Returns the
// header's line.
std::string calibrate_prefill(Communicator& comm, const PlanInput& in, DecodeModel& row);
// Rank 0 alone (plan_inference_report.cpp): print the decode layouts' table (plan_decode) and
// return it as JSON; the same for a turn of in.seq tokens over `cached` (plan_turn).
nlohmann::json report_decode(const PlanInput& in, const DecodeModel& row = {});
nlohmann::json report_turn(const PlanInput& in, std::int64_t cached);

}  // namespace ulysses::cli
