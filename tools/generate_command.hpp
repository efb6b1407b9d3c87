// `ulysses generate`: a `train --save` checkpoint generating over a KV cache sharded across the
// ranks (train/generate.hpp): time to first token, per output token, the collectives of a step,
// the cache's bytes per rank against their formula, and the decode kernel's read rate against
// this machine's.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "options.hpp"

namespace ulysses::cli {

struct GenerateOptions {
  std::string checkpoint, prompt, json, trace;
  std::string kv_layout = "heads", prefill = "ulysses";
  std::string max_memory;          // per rank, e.g. "2GiB"; empty: only what the machine has
  std::int64_t prompt_tokens = 0;  // a synthetic prompt of this many tokens (the training task's)
  std::int64_t max_new_tokens = 32;
  std::string requests;             // concurrent requests: their prompt lengths (a lengths spec)
  std::string requests_new_tokens;  // and their new tokens (one count, or one a request)
  std::string requests_arrive;      // and the decode step each arrives at (one a request; empty: all at 0)
  std::int64_t prefill_chunk = 0;   // and their prompts prefilled this many tokens between two steps (0: whole)
  std::string turn;                 // then a second turn over the cache: a file's bytes
  std::int64_t turn_tokens = 0;     // or this many synthetic tokens
  std::int64_t capacity = 0;        // KV cache tokens; 0: prompt + new tokens
  float temperature = 0;            // 0: greedy
  std::uint64_t seed = 0;
  int threads = 0;
  BackendOptions backend;
  double timeout = 300;
};

void add_generate_command(CLI::App& app, GenerateOptions& opt);

int run_generate(const GenerateOptions& opt);

}  // namespace ulysses::cli
