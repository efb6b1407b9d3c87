// Data-parallel-free, context-parallel training of the small GPT: every rank holds the full
// weights and s/cp tokens of every sequence; after the backward the weight gradients are
// summed over the CP group (each rank's loss is already divided by the GLOBAL token count, so
// the sum is exactly the single-process gradient — the factor-of-cp bug DeepSpeed and
// Megatron both shipped cannot happen); global-norm clipping and AdamW then run identically
// on every rank, so the weights never drift apart.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/attention_ops.hpp"
#include "train/data.hpp"
#include "train/gpt.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses::train {

struct TrainConfig {
  GptConfig model;
  CpConfig cp;  // cp_comm_type and sizes; the mask is always causal
  MemoryOptions memory;  // how activations are kept (no effect on the numbers, to rounding)
  double max_memory = 0;  // bytes per rank the run may need (memory.hpp's prediction); 0: no cap
  // The attention's dtype (--dtype): bf16 runs it on the bf16 kernels; weights, gradients,
  // AdamW and every GEMM stay float32 (mixed precision).
  DType dtype = DType::f32;
  std::int64_t batch = 4, seq = 512, steps = 300, warmup = 20;
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, clip = 1.0f;
  std::uint64_t seed = 0;
  // What a checkpoint must agree on to be resumed (not cp: a run may resume on other ranks).
  bool same_run(const TrainConfig& o) const;
};

struct StepResult {
  std::int64_t step = 0;          // the step just taken (1-based)
  double loss = 0;                // mean over every token of every rank
  double accuracy = -1;           // retrieval answers right (synthetic task), else -1
  double grad_norm = 0;           // before clipping
  double seconds = 0;             // wall time of the step (slowest rank)
  double peak_rss = 0;            // the RSS high-water mark so far, bytes (the largest over ranks)
  CpStats attention;              // this rank's attention time split, summed over layers
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
  // Collective: forward + backward + gradient all-reduce on the batch of `data_step`, no
  // update. Returns the mean loss; gradients() then holds the global gradient.
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
  // FLOPs of one training step over all ranks (matmuls 6·params·tokens + attention).
  double flops_per_step() const;

 private:
  struct Local {
    std::vector<int> tokens, labels;
    std::vector<std::uint8_t> scored;
    std::vector<std::int64_t> positions;   // RoPE's: within each packed document
    std::vector<std::int64_t> cu_seqlens;  // the batch's documents
    std::int64_t targets = 0;              // labels in the loss, over all ranks
  };
  Local shard(const Batch& b) const;
  double forward_backward(const Local& data, double* correct_and_count);

  Communicator& comm_;
  TrainConfig cfg_;
  DataSource data_;
  Gpt<float> model_;
  std::vector<SeqChunk> chunks_;
  std::vector<std::int64_t> positions_;
  std::unique_ptr<CpAttention> attention_;
  std::vector<float> m_, v_;
  std::vector<std::uint8_t> decay_;
  std::int64_t step_ = 0;
};

}  // namespace ulysses::train
