// The configuration of a training run (`ulysses train`'s options): what the trainer runs, the
// memory model predicts and the checkpoint records, in a header of its own so that the memory
// model and the checkpoint format need not include the trainer.
#pragma once

#include <cstdint>
#include <vector>

#include "train/data.hpp"
#include "train/gpt.hpp"
#include "ulysses/plan/balancer.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses::train {

struct TrainConfig {
  GptConfig model;
  CpConfig cp;  // cp_comm_type and sizes (at cp = world / dp); the mask is always causal
  int dp = 1;   // data-parallel replicas of the static policy (must divide the world)
  BalancePolicy balance = BalancePolicy::static_;
  // The step: batch × seq unless lengths (--lengths) or tokens_per_step (whole documents).
  std::vector<std::int64_t> lengths;
  std::int64_t tokens_per_step = 0;
  MemoryOptions memory;   // how activations are kept (no effect on the numbers, to rounding)
  double max_memory = 0;  // bytes per rank the run may need (memory.hpp's prediction); 0: no cap
  // --dtype: bf16 runs the attention on the bf16 kernels and the projections and the MLP as
  // bf16 GEMMs with float32 accumulation; master weights, gradients, AdamW and the LM head stay
  // float32 (mixed precision).
  DType dtype = DType::f32;
  // Measure this machine once at start (calibrate.hpp, collective) and give the balancer its
  // rates and links, so predicted step times are this machine's; false: the planner's default
  // GPU cluster model.
  bool calibrate = false;
  std::int64_t batch = 4, seq = 512, steps = 300, warmup = 20;
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, clip = 1.0f;
  std::uint64_t seed = 0;
  StepShape shape() const { return {batch, seq, lengths, tokens_per_step}; }
  // What a checkpoint must agree on to be resumed (not cp: a run may resume on other ranks).
  bool same_run(const TrainConfig& o) const {
    return model == o.model && batch == o.batch && seq == o.seq && warmup == o.warmup && lr == o.lr &&
           beta1 == o.beta1 && beta2 == o.beta2 && eps == o.eps && weight_decay == o.weight_decay && clip == o.clip &&
           seed == o.seed && dtype == o.dtype;
  }
};

}  // namespace ulysses::train
