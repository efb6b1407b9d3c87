// The training checkpoint, <dir>/checkpoint.bin: the run's configuration and step, the
// parameters and AdamW's two moments. The format (magic, text header, float32 arrays, checksum)
// is this file's alone; Trainer::save and Trainer::load add the collective agreement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/train_config.hpp"

namespace ulysses::train {

struct Checkpoint {
  TrainConfig config;
  std::int64_t step = 0;
  std::vector<float> params, m, v;
};

// Not collective. Reads and verifies <dir>/checkpoint.bin: throws Error ("corrupt checkpoint
// <path>: why") for a truncated, padded or corrupted file, a header field out of its range, a
// parameter count that does not match the model, or a non-finite value.
Checkpoint read_checkpoint(const std::string& dir);

// Not collective. Writes a checkpoint of `config` at `step` (params, m and v of one size) to
// <dir>/checkpoint.bin atomically (temp file, then rename; the folder is created): the
// previous checkpoint stays intact until the new one is complete.
void write_checkpoint(const std::string& dir, const TrainConfig& config, std::int64_t step,
                      const std::vector<float>& params, const std::vector<float>& m, const std::vector<float>& v);

}  // namespace ulysses::train
