// The planner: for a model shape, a sequence length and a cluster, which context-parallel
// strategy to use and what it costs, from 2 CPUs to thousands of GPUs.
//
// Communication volumes are the exact formulas of comm_volume.hpp (checked to the byte
// against real runs); times the α–β link model of cost_model.hpp. Compute is the attention
// core on the busiest rank: 4·d FLOPs per visible (query, key) pair it computes
// (Strategy::work: its heads and tokens under the causal mask and the documents; backward
// 2.5×) at peak × efficiency. The ring (p2p, and the outer ring of a2a+p2p) hides each step's
// transfer behind that step's compute; all-to-all and all-gather are barriers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ulysses/cp/cost_model.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

class Strategy;

struct PlanRow {
  // The strategy's configuration with the input's window, without its documents (a copy a row of
  // millions of boundaries): planned_config adds them back.
  CpConfig config;
  std::string name;  // "a2a", "a2a+p2p [2,8]", ...
  bool valid = false;
  std::string reason;  // why invalid, or ""
  // One layer, each counter's busiest rank (every rank's when tokens and heads split evenly).
  std::int64_t forward_bytes_per_rank = 0, backward_bytes_per_rank = 0;
  std::int64_t forward_messages = 0, backward_messages = 0;
  double head_imbalance = 1;    // the busiest rank's query heads over the average (uneven Ulysses splits)
  double work_imbalance = 1;    // the busiest rank's attention work over the average (Strategy::work:
                                // heads, tokens, the causal mask, documents)
  double compute_s = 0;         // per layer, forward + backward, on the busiest rank
  double comm_s = 0;            // per layer, all transfers
  double hidden_s = 0;          // of comm_s, hidden behind compute
  double memory_bytes = 0;      // attention working set per rank, one layer
  double predicted_step_s = 0;  // all layers, forward + backward
};

struct Plan {
  std::vector<PlanRow> rows;  // every registered strategy's plan_configs (a2a+p2p at every factorisation) of cp
  int best = -1;              // index of the recommendation (-1: nothing valid)
  std::string recommendation;
};

// The attention work the planner counts for rank `rank` of `strategy` under `config` (a row's
// config): Strategy::work against the k/v (in.kv_seq; queries at in.q_offset).
std::int64_t rank_work(const PlanInput& in, const Strategy& strategy, const CpConfig& config, int rank);

// Two strategies whose predicted step times differ by less than this are a tie: the model's
// error between strategies on the published measurements it was fitted on: the median, over
// pairs of strategies measured in one published configuration, of how far their predicted ratio
// is from the measured one (docs/planner.md).
inline constexpr double kPlanTieBand = 0.067;

// When two rows' predicted step times are a tie, and what decides one. The default is the
// published GPU measurements' band; a calibrated plan measures its own (measured_tie_band).
// Memory decides a tie only when the user caps it (--max-memory): on the published tables a tie
// that memory or the first-listed row decided picked the measured fastest in 8 of 15
// configurations against 10 for the predicted faster, and on this machine's grid it cost 5-32 %
// (docs/planner.md).
struct TieBand {
  double band = kPlanTieBand;  // rows whose predicted times differ by less (relative) are a tie
  std::string source;          // where the band was measured ("": the published measurements)
  // Within the band: true, the row with under 0.9x the memory wins, then the first listed; false,
  // the predicted faster wins (memory is not what runs short).
  bool memory_decides = false;
};

// Throws Error unless band is finite and not negative (1 or more: every pair of rows ties).
void check_tie_band(const TieBand& tie);

// One row of a validation run: its predicted and measured seconds (measured <= 0: not run).
struct ValidatedRow {
  double predicted_s = 0, measured_s = 0;
};
// The model's error between strategies on rows measured on this machine, as kPlanTieBand is on
// the published ones: over every pair of rows measured in one shape (`shapes`: each shape's
// rows), how far their predicted ratio is from the measured one (max(x, 1/x) - 1 of predicted
// ratio over measured ratio); the median over all pairs, and how many. {0, 0} without a pair.
// Throws Error for a measured row whose predicted or measured seconds are not positive and
// finite.
struct MeasuredBand {
  double band = 0;
  int pairs = 0;
};
MeasuredBand measured_tie_band(const std::vector<std::vector<ValidatedRow>>& shapes);
// The tie band of a plan calibrated on this machine: `measured`'s band, its source naming the
// pairs and `where` they were run; memory decides a tie only when `memory_capped` (--max-memory:
// the user says memory is short here). Without a pair, the published band.
TieBand calibrated_tie_band(const MeasuredBand& measured, const std::string& where, bool memory_capped);

// The most ranks the planner models (its per-rank formulas run once per rank).
inline constexpr int kMaxPlanRanks = 1 << 16;
// "" when make_plan accepts `in`, else why not: non-positive sizes, heads % kv_heads != 0, cp
// above kMaxPlanRanks, an infinite compute rate or one below 1 FLOP/s, or sizes whose byte counts or whose work per rank
// (visible (query, key) pairs times heads) would not fit 64 bits.
std::string plan_input_error(const PlanInput& in);
// Throws Error with plan_input_error's message for impossible inputs; `tie`: when two rows are
// a tie and what decides it (check_tie_band's Error for a bad one).
Plan make_plan(const PlanInput& in, const TieBand& tie);
Plan make_plan(const PlanInput& in);  // the published measurements' band
// Throws what make_plan throws for `in` (plan_input_error's message, documents that do not add
// up to seq) without pricing a row: a check costs nothing at any cp.
void check_plan_input(const PlanInput& in);
// Which of a row's fields are filled: all, or those a step's time and bytes are (valid, reason,
// config, the bytes, the imbalance of work, compute, comm, hidden and predicted_step_s: what the
// balancer prices a sequence by, ~10^5 rows a plan) — not the name, messages, head imbalance or
// memory, which the balancer does not read.
enum class RowDetail { all, step };
// make_plan's rows of one strategy alone (its plan_configs at in.cp): what the balancer prices a
// sequence with, without the other strategies' rows. Throws as make_plan does.
std::vector<PlanRow> strategy_rows(const PlanInput& in, const Strategy& strategy, RowDetail detail = RowDetail::all);
// The configuration `row` of a plan of `in` was priced with, documents included: what runs it.
CpConfig planned_config(const PlanInput& in, const PlanRow& row);

// The variant of a validated `config` (Strategy::tunings) whose predicted step time on `in` is
// the lowest, the first listed on a tie; `config` itself when its strategy has none or one is
// invalid. Impossible inputs throw as make_plan does.
CpConfig plan_tuning(const PlanInput& in, const CpConfig& config);

// One strategy's tuning on `in`: the variant of its configuration plan_tuning chooses (a2a's
// overlap_chunks: 1 to 8, clamped by ulysses_overlap_chunks, the fewest on a tie) and the
// exposed communication per layer (forward + backward) it predicts against the untuned one's
// (the first of Strategy::tunings).
struct TuningPlan {
  CpConfig config;
  double exposed_s = 0, plain_exposed_s = 0;
};
// Every registered strategy whose tunings are valid on `in`, in registry order: the planner's
// advice on the options it would choose. Impossible inputs throw as make_plan does.
std::vector<TuningPlan> plan_tunings(const PlanInput& in);

// "train" | "forward" | "prefill" | "decode" → PlanMode; throws Error naming the known ones.
PlanMode parse_plan_mode(const std::string& text);

// "450GB/s", "400Gb/s", "1.2TB/s", "900MB/s" → bytes/s; "2us", "5 µs", "1ms", "800ns" → s.
// Throws Error naming the text and the accepted units, or a bandwidth below 1 B/s or a latency
// above 1000 s (past them a step's time may pass a double's range).
double parse_bandwidth(const std::string& text);
double parse_latency(const std::string& text);

}  // namespace ulysses
