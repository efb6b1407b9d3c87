// The ranks of a job agree on their command line before any data moves: every rank parsed
// the same way, chose the same subcommand and was given the same value of every option (input
// files compared by their contents, not their paths). Launched with different arguments
// (mpirun's MPMD `A : B`, a wrapper script per rank), every rank stops with the same error.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Marks an option whose value names an input file (kind "file"), a directory of input files
// ("dir") or, for "file-or-list", either a file or a literal list: the agreement compares
// what the path holds (size, and a content hash), so the ranks may name different copies of
// one file. At parse time, not collective: a directory where a file is expected is refused
// naming the flag and the path.
CLI::Option* input_path(CLI::Option* option, const std::string& kind);

// What one option contributes to the agreement: `key` is compared across ranks, `shown`
// names it in the error.
struct OptionValue {
  std::string name, key, shown;
};

// Not collective. Every option of `command` but --help, with its value as this rank parsed it
// (or its default when not given). Options in per_rank_options() are left out.
std::vector<OptionValue> option_values(CLI::App& command);

// The options whose values may differ between ranks (each with its reason at the definition).
const std::vector<std::string>& per_rank_options();

// Collective over `comm`. `parse_error` is this rank's CLI::ParseError (null when its command
// line parsed; help and version requests count as outcomes too). Returns normally when every
// rank parsed alike; throws the same ulysses::Error on every rank when they did not.
void agree_parse_outcome(Communicator& comm, const std::exception_ptr& parse_error);

// Collective over `comm`, after every rank parsed: `command` is the chosen subcommand. Throws
// the same Error on every rank naming the first option that differs and both values:
// "ranks were given different --seq: rank 0 has 4096, rank 1 has 2048".
void agree_command_line(Communicator& comm, CLI::App& command);

// Not collective. One line per option of `command` but --help: "NAME KIND agreed|per-rank",
// KIND one of flag, value, file, dir, file-or-list (what the divergence test changes).
void print_options(CLI::App& command);

}  // namespace ulysses::cli
