// Data × context parallel training of the small GPT on variable-length steps. Every rank holds
// the full weights. Each step's sequences (batch × seq, --lengths, or whole documents under a
// token budget) get CP groups from the balancer (balancer.hpp: static is dp replicas of
// world/dp ranks, sequences dealt round-robin); one all-to-all(v) deals every sequence from the
// rank that loaded it to its group's members (deal.hpp); each rank runs its groups' sequences
// in increasing index (those of one group and length together, as one batch), each group on
// its own cached sub-communicator (groups.hpp) with the configured strategy at its size. Then
// ONE gradient all-reduce over the world: each rank's loss is already divided by the GLOBAL
// count of valid tokens, so the sum is exactly the single-process gradient of the whole step,
// whatever dp, the groups or the policy (the factor-of-cp bug DeepSpeed and Megatron both
// shipped cannot happen); global-norm clipping and AdamW then run identically on every rank,
// so the weights never drift apart.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <map>
#include <vector>

#include "train/attention_ops.hpp"
#include "train/data.hpp"
#include "train/deal.hpp"
#include "train/gpt.hpp"
#include "train/groups.hpp"
#include "train/train_config.hpp"
#include "ulysses/plan/balancer.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses::train {

struct StepResult {
  std::int64_t step = 0;    // the step just taken (1-based)
  double loss = 0;          // mean over every token of every rank
  double accuracy = -1;     // retrieval answers right (synthetic task), else -1
  double grad_norm = 0;     // before clipping
  double seconds = 0;       // wall time of the step (slowest rank)
  double peak_rss = 0;      // the RSS high-water mark so far, bytes (the largest over ranks)
  CpStats attention;        // this rank's attention time split, summed over layers
  std::int64_t tokens = 0;  // tokens of the step's sequences (no padding)
  std::int64_t sequences = 0;
  std::vector<double> idle_s;  // each rank's: the step's wall time minus its busy time (its
                               // sequences' compute and communication that was not waiting)
  double predicted_s = 0;      // the balancer's predicted step time (TrainConfig::calibrate: this machine's)
  double model_flops = 0;      // GptConfig::train_flops summed over the step's sequences
};

// What evaluate() measured on held-out batches.
struct Evaluation {
  double loss = -1;      // mean over the held-out labels, nats per byte; -1: nothing held out
  double accuracy = -1;  // retrieval answers right (synthetic task), else -1
  double bits_per_byte() const;
};

class Trainer {
 public:
  // Collective. Validates everything first; every rank throws the same Error on bad input.
  Trainer(Communicator& comm, TrainConfig config, DataSource data);

  StepResult step();  // collective: one optimizer step
  // Collective: forward + backward + gradient all-reduce on the step `data_step`, no update.
  // Returns the mean loss; gradients() then holds the global gradient.
  double compute_gradients(std::int64_t data_step);
  // Collective, no update: the loss (and the retrieval accuracy of the synthetic task) on
  // `batches` held-out batches (DataSource::held_out_batch); text without a held-out tail, or
  // batches 0: nothing measured.
  Evaluation evaluate(std::int64_t batches);

  // Collective. Rank 0 writes <dir>/checkpoint.bin atomically (temp file, then rename) with
  // a checksum; the previous checkpoint stays intact until the new one is complete.
  void save(const std::string& dir) const;
  // Collective. Every rank reads and verifies <dir>/checkpoint.bin; a truncated, corrupted or
  // mismatching checkpoint is refused with a clear Error on every rank.
  void load(const std::string& dir);
  // Not collective: the configuration stored in a checkpoint (to resume without flags).
  static TrainConfig checkpoint_config(const std::string& dir);

  std::int64_t current_step() const { return step_; }
  const std::vector<float>& parameters() const { return model_.params; }
  const std::vector<float>& gradients() const { return model_.grads; }
  const TrainConfig& config() const { return cfg_; }
  // The rates and links measured at start (TrainConfig::calibrate), else empty; gemm_flops
  // is this model's rate for all of a token's work but attention (layers_rate).
  const std::optional<Calibration>& calibration() const { return calibration_; }

  // A step as every rank plans it before any data moves, resolved once and then carried to the
  // deal and the runs: its sequences, their groups, the strategy resized to each group size,
  // where every member's tokens lie, and the runs (sequences of one group and length, computed
  // as one batch) in execution order.
  struct Run {
    BalanceGroup group;
    std::vector<int> sequences;
  };
  struct StepPlan {
    std::vector<SequenceLayout> sequences;
    BalancePlan plan;
    std::map<int, CpConfig> configs;    // by group size: the strategy at that size, causal
    std::vector<Placement> placements;  // by sequence: its group and every member's chunks
    std::vector<Run> runs;
    std::int64_t targets = 0;  // labels in the loss, all sequences
  };
  // Collective (one agreement): the plan of step `data_step`; every rank throws the same Error
  // for an empty step, a step without labels, or a plan the strategy or the memory cap refuses.
  StepPlan plan_step(std::int64_t data_step, bool held_out);

 private:
  struct Sums {
    double loss = 0, correct = 0, answers = 0;  // this rank's, until reduced
    double busy_s = 0;
    CpStats attention;
  };
  // Collective: deals the step out and runs this rank's sequences (forward, and backward when
  // training, gradients accumulated); then all-reduces the gradients (training) and the sums.
  Sums run_step(const StepPlan& plan, std::int64_t data_step, bool held_out, bool train);
  void run_sequences(const Run& run, const StepPlan& plan, const std::map<int, Shard>& shards, float scale, bool train,
                     Sums& sums);
  BalanceInput balance_input(const std::vector<SequenceLayout>& sequences) const;
  // Forward + backward FLOPs per token of the projections, the MLP and the LM head, all layers.
  double gemm_flops_per_token() const;
  // Collective: the FLOP/s at which this model runs a token's work other than attention
  // (trainer.cpp says why it is timed on the model), the slowest rank's.
  double layers_rate();
  // Resolves `p`'s group configurations and placements and checks each sequence against the
  // strategy and the memory cap (throws the Error every rank then agrees on).
  void place_sequences(StepPlan& p) const;
  CpAttention& attention_for(const BalanceGroup& group, const CpConfig& config);

  Communicator& comm_;
  TrainConfig cfg_;
  DataSource data_;
  Gpt<float> model_;
  GroupCache groups_;
  std::optional<Calibration> calibration_;
  std::map<std::pair<int, int>, std::unique_ptr<CpAttention>> attention_;  // by (first_rank, size)
  std::vector<float> m_, v_;
  std::vector<std::uint8_t> decay_;
  std::int64_t step_ = 0;
};

}  // namespace ulysses::train
