// `ulysses attention`: one distributed attention forward (and backward), checked and reported.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "options.hpp"
#include "ulysses/cp/cp_config.hpp"

namespace ulysses::cli {

struct AttentionOptions {
  std::string q, k, v, dout;                 // global inputs (.npy); empty = random
  std::string out, dq, dk, dv, json, trace;  // outputs written by rank 0
  std::string strategy = CpConfig().cp_comm_type;
  std::map<std::string, std::string> strategy_options;  // the text of each strategy's option (StrategyOption)
  std::string cu_seqlens;                               // packed documents: a list or a file
  std::string window;                                   // sliding window "L" or "L,R"
  std::string dtype = "f32", layout = "bshd";
  bool causal = false, backward = false, check = false, no_zigzag = false;
  bool allow_nonfinite = false;  // compute with NaN/Inf inputs instead of refusing them
  std::optional<float> scale;    // absent: 1/sqrt(head_dim)
  std::int64_t batch = 1, seq = 1024, heads = 8, kv_heads = 0, head_dim = 64;
  std::uint64_t seed = 0;
  int repeat = 0, threads = 0;
  BackendOptions backend;                // --comm, --ranks
  double timeout = 300;                  // seconds any wait may take (the watchdog; rank 0's work alone is exempt)
  std::int64_t kv_seq = 0;               // random inputs: cross-attention's k/v length; 0 = --seq
  std::optional<std::int64_t> q_offset;  // cross-attention, causal: key position of query 0
  std::vector<std::string> given;        // the flags on the command line
};

void add_attention_command(CLI::App& app, AttentionOptions& opt);

// Collective over MPI_COMM_WORLD. Returns the process exit code; throws ulysses::Error
// (agreed on every rank) for bad input.
int run_attention(const AttentionOptions& opt);

}  // namespace ulysses::cli
