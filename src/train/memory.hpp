// What one rank of `ulysses train` needs in memory, predicted from the configuration
// and measured (the RSS high-water mark), so a user can ask "how long a sequence fits in M
// bytes per rank on cp ranks" before running. Every term follows an allocation in gpt.cpp,
// trainer.cpp or the attention strategies; the baseline (MPI, BLAS, the program) is measured.
#pragma once

#include <cstdint>
#include <string>

#include "train/train_config.hpp"

namespace ulysses::train {

struct MemoryEstimate {
  double weights = 0;      // parameters, gradients, AdamW m and v, the all-reduce's buffer
  double activations = 0;  // the model's kept and transient activations at the step's peak, data
  double attention = 0;    // attention contexts and the strategy's buffers at that peak
  double baseline = 0;     // the process before any model (MPI, OpenBLAS, code)
  double total() const { return weights + activations + attention + baseline; }
  std::string describe() const;  // "1.23 GiB (weights …, activations …, attention …, baseline …)"
};

// The busiest rank's peak for `config` on `cp` ranks.
MemoryEstimate predict_memory(const TrainConfig& config, int cp);

// The longest sequence (a multiple of 2·cp) whose prediction fits in `cap_bytes` on `cp`
// ranks, all else as in `config`; 0 when none does.
std::int64_t longest_sequence(TrainConfig config, int cp, double cap_bytes);

// This process's RSS high-water mark in bytes (VmHWM).
double peak_rss_bytes();

// "2GiB", "512 MiB", "1.5GB", "3000000": bytes; throws Error on anything else.
double parse_bytes(const std::string& text);
// 1536 MiB -> "1.50 GiB".
std::string format_bytes(double bytes);

}  // namespace ulysses::train
