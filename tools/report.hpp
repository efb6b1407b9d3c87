// Small helpers the CLI commands share: per-rank facts gathered to rank 0, atomic files, errors
// agreed across ranks.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "ulysses/output_file.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/context_parallel.hpp"

namespace ulysses::cli {

// Collective. Runs fn on every rank, then agrees on the exception it threw on any rank (a
// ulysses::Error, std::bad_alloc as "out of memory", any std::exception by its what()), so every
// rank stops with the same ulysses::Error (an input file may be unreadable on one rank only).
void on_every_rank(Communicator& comm, const std::function<void()>& fn);
// Collective. The same for work only rank 0 does (printing, writing files): its error stops
// every rank, with the same message and exit code. The others wait for it with no deadline
// (the watchdog is suspended: rank 0's work may be long by design).
void on_root(Communicator& comm, const std::function<void()>& fn);

// Not collective. For an exception that may have reached this rank alone: prints
// "ulysses: error on rank R: <why>" and ends every rank of the job (MPI_Abort, exit code 3),
// so that no other rank waits forever in a collective.
[[noreturn]] void abort_job(int rank, const std::string& why);

// Peak resident set size of this process, in bytes.
std::int64_t peak_rss_bytes();

// Collective. Rank 0 gets one JSON object per rank: {"rank", "bytes_sent": {op: n},
// "messages": {op: n}, "calls": {op: n}, "peak_rss_bytes"}; other ranks get an empty array.
nlohmann::json gather_rank_stats(Communicator& comm, const std::vector<std::string>& ops);

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

// True when all of `text` is one integer (no sign but '-', no spaces), stored in `value`.
bool parse_int64(std::string_view text, std::int64_t& value);

// Parses --cu-seqlens: "0,1000,5000,8192", or a file holding them: FILE.npy (1-D, integer
// values) or text (numbers separated by commas, spaces or newlines). Throws Error naming the
// flag and the bad entry; the library checks the values against the sequence.
std::vector<std::int64_t> parse_cu_seqlens(const std::string& arg);
// `arg` when --cu-seqlens names a file (not a list of numbers), else "".
std::string cu_seqlens_file(const std::string& arg);

// Parses --window "L" or "L,R" (FlashAttention's window_size: L alone means (L, 0); -1 leaves a
// side unbounded) into {left, right}. Throws Error naming the flag; the library checks the values.
std::pair<std::int64_t, std::int64_t> parse_window(const std::string& arg);

// "12.3 MB" style.
std::string human_bytes(double bytes);

// Median of a non-empty list.
double median(std::vector<double> values);

// Adds --timeout SECONDS: the deadline of every blocking wait (Communicator::set_timeout).
void add_timeout_option(CLI::App* command, double& seconds);

}  // namespace ulysses::cli
