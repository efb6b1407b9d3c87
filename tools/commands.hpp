// The CLI's subcommands and their options, as `ulysses` (main.cpp) and the argv fuzzer
// (tests/fuzz/fuzz_argv.cpp) parse them: one list, so the fuzzer parses what ships.
#pragma once

#include <CLI/CLI.hpp>

#include "attention_command.hpp"
#include "generate_command.hpp"
#include "plan_command.hpp"
#include "train_command.hpp"

namespace ulysses::cli {

struct Commands {
  AttentionOptions attention;
  TrainOptions train;
  PlanOptions plan;
  GenerateOptions generate;
};

// Adds attention, train, plan and generate to `app`, exactly one required, parsed into `c`.
inline void add_commands(CLI::App& app, Commands& c) {
  app.require_subcommand(1);
  add_attention_command(app, c.attention);
  add_train_command(app, c.train);
  add_plan_command(app, c.plan);
  add_generate_command(app, c.generate);
}

}  // namespace ulysses::cli
