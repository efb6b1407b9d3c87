// `ulysses train`: a small GPT trained on long sequences, sharded along the sequence.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "options.hpp"
#include "ulysses/cp/cp_config.hpp"

namespace ulysses::cli {

struct TrainOptions {
  std::string strategy = CpConfig().cp_comm_type, data, log, save, resume, svg, trace;
  std::map<std::string, std::string> strategy_options;  // the text of each strategy's option (StrategyOption)
  std::optional<std::string> lengths;                   // --lengths SPEC (lengths.hpp); none: --batch x --seq
  std::string balance = "static";                       // static | pow2 | dynamic (balancer.hpp)
  int dp = 1;                                           // data-parallel replicas (static: cp = world / dp)
  std::int64_t tokens_per_step = 0;                     // with --data: whole documents up to this many tokens a step
  bool pack = false;                                    // --data as documents packed into each sequence
  bool checkpoint_activations = false, tiled_mlp = false, tiled_loss = false;  // memory techniques
  std::int64_t tile_rows = 1024;
  std::string max_memory;  // per rank, e.g. "2GiB"; empty: no cap
  std::string dtype;       // "f32" | "bf16"; empty: f32, or the checkpoint's when resuming
  std::string doc_separator = "\n";
  std::int64_t steps = 400, seq = 1024, batch = 4, layers = 2, width = 64, heads = 4, kv_heads = 2, head_dim = 16,
               hidden = 0, warmup = 20, save_every = 0, eval_batches = 8;
  // hidden 0: GptConfig::swiglu_hidden(width)
  std::int64_t eval_every = -1;  // held-out loss every K steps (with --data); -1: a tenth of the run
  double holdout = 0.05;         // with --data: the fraction of its bytes, from the end, never trained on
  float lr = 3e-3f;
  std::uint64_t seed = 0;
  int threads = 0;
  BackendOptions backend;          // --comm, --ranks
  double timeout = 300;            // seconds any wait may take (the watchdog; rank 0's work alone is exempt)
  std::vector<std::string> given;  // the options named on the command line (--resume checks them)
};

void add_train_command(CLI::App& app, TrainOptions& opt);

// Collective over MPI_COMM_WORLD. Returns the exit code; throws ulysses::Error (agreed).
int run_train(const TrainOptions& opt);

}  // namespace ulysses::cli
