// The values of the CLI's shared options, parsed: --strategy and the options strategies declare, --cu-seqlens,
// --window, --timeout, --comm and --ranks. Each throws Error naming the flag; the library checks the values.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulysses/cp/cp_config.hpp"

namespace ulysses::cli {

// The text given for each option the registered strategies declare (StrategyOption), by flag;
// "" when not given.
using StrategyOptionTexts = std::map<std::string, std::string>;
// Adds --<flag> for every option of every registered strategy, once per flag, writing `given`.
void add_strategy_options(CLI::App* command, StrategyOptionTexts& given);
// Parses --strategy and the options given into a CpConfig (throws Error with the flag's name):
// each option's integers as its metavar says, only for a strategy that declares it; an
// option the strategy requires must be given (a2a+p2p's --cp-sizes INNER,OUTER).
CpConfig parse_strategy(const std::string& strategy, const StrategyOptionTexts& given, int ranks);
// True when the strategy of `cfg` was given none of its options (the planner may choose them).
bool no_option_given(const CpConfig& cfg, const StrategyOptionTexts& given);
// The options of the strategy of `cfg` set in it, as its command line gives them:
// " --overlap-chunks 4" ("" when none is set).
std::string option_flags(const CpConfig& cfg);

// True when all of `text` is one integer (no sign but '-', no spaces), stored in `value`.
bool parse_int64(std::string_view text, std::int64_t& value);

// Parses --cu-seqlens: "0,1000,5000,8192", or a file holding them: FILE.npy (1-D, integer
// values) or text (numbers separated by commas, spaces or newlines). Throws Error naming the
// flag and the bad entry; the library checks the values against the sequence.
std::vector<std::int64_t> parse_cu_seqlens(const std::string& arg);
// `arg` when --cu-seqlens names a file (not a list of numbers), else "".
std::string cu_seqlens_file(const std::string& arg);

// Parses --window "L" or "L,R" (FlashAttention's window_size: L alone means (L, 0); -1 leaves a
// side unbounded) into {left, right}. Throws Error naming the flag, and for a right side under a
// causal mask (it hides those keys); the library checks the values.
std::pair<std::int64_t, std::int64_t> parse_window(const std::string& arg, bool causal);

// Adds the subcommand `name` to `app`: on every command a repeated option takes its last value.
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description);

// Adds --timeout SECONDS: the deadline of every blocking wait (Communicator::set_timeout).
void add_timeout_option(CLI::App* command, double& seconds);

// Which communicator a command runs on (make_communicator's backend) and, for ranks as threads
// of this process, how many.
struct BackendOptions {
  std::string comm = "mpi";
  int ranks = 0;  // 0: not given
};
// The most --ranks one process runs as threads: far more than this machine's cores already
// measures nothing but the scheduler, and a typo (--ranks 40000) should not start that many.
inline constexpr int kMaxLocalRanks = 256;
// Adds --comm BACKEND and --ranks N.
void add_backend_options(CLI::App* command, BackendOptions& backend);
// Not collective. The ranks to start as threads (0: none, the MPI job's processes are the
// ranks) for `backend` in an MPI job of mpi_ranks processes; throws Error for --ranks without
// --comm local, and for --comm local under a launcher that started more than one process.
int local_ranks(const BackendOptions& backend, int mpi_ranks);

}  // namespace ulysses::cli
