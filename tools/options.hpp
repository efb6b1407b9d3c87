// The values of the CLI's shared options, parsed: --strategy and --cp-sizes, --cu-seqlens,
// --window, --timeout. Each throws Error naming the flag; the library checks the values.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulysses/cp_config.hpp"

namespace ulysses::cli {

// Parses --strategy and --cp-sizes into a CpConfig (throws Error with the flag's name):
// --cp-sizes must be INNER,OUTER and goes with a2a+p2p only, which needs it.
CpConfig parse_strategy(const std::string& strategy, const std::string& cp_sizes, int ranks);

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

// Adds --timeout SECONDS: the deadline of every blocking wait (Communicator::set_timeout).
void add_timeout_option(CLI::App* command, double& seconds);

}  // namespace ulysses::cli
