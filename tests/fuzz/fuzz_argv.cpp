// libFuzzer target: argument vectors of every subcommand (the input's lines are the words
// after `ulysses`). Parsing and the agreement's local part (every option's value, input files
// described by contents) must accept or throw CLI::ParseError / ulysses::Error, never crash;
// the parsed values then go through the commands' non-collective value parsers. No MPI job
// runs per input: nothing here is collective.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agreement.hpp"
#include "commands.hpp"
#include "options.hpp"
#include "train/memory.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/tensor.hpp"

namespace {

std::vector<std::string> words_of(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words{"ulysses"};
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n')
      words.push_back(std::exchange(word, std::string()));
    else
      word += char(data[i]);
  }
  words.push_back(word);
  return words;
}

// What the commands do with the values before any collective (their value parsers).
void parse_values(const CLI::App& app, const ulysses::cli::Commands& c) {
  using namespace ulysses;
  const cli::AttentionOptions& a = c.attention;
  const cli::TrainOptions& t = c.train;
  const cli::PlanOptions& p = c.plan;
  if (app.got_subcommand("attention")) {
    cli::parse_strategy(a.strategy, a.strategy_options, 4);
    parse_dtype(a.dtype);
    parse_layout(a.layout);
    if (!a.window.empty()) cli::parse_window(a.window, a.causal);
  }
  if (app.got_subcommand("train")) {
    cli::parse_strategy(t.strategy, t.strategy_options, 4);
    if (!t.max_memory.empty()) train::parse_bytes(t.max_memory);
  }
  if (app.got_subcommand("plan")) {
    parse_bandwidth(p.intra_bw);
    parse_latency(p.intra_lat);
    parse_bandwidth(p.inter_bw);
    parse_latency(p.inter_lat);
    if (!p.window.empty()) cli::parse_window(p.window, !p.no_causal);
    train::parse_bytes(p.max_memory);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;
  std::vector<std::string> words = words_of(data, size);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  CLI::App app{"ulysses"};
  ulysses::cli::Commands commands;
  ulysses::cli::add_commands(app, commands);
  try {
    app.parse(int(argv.size()), argv.data());
    for (const ulysses::cli::OptionValue& v : ulysses::cli::option_values(*app.get_subcommands().front()))
      if (v.name.empty()) __builtin_trap();  // every option contributes a named line
    parse_values(app, commands);
  } catch (const CLI::ParseError&) {
  } catch (const ulysses::Error&) {
  }
  return 0;
}
