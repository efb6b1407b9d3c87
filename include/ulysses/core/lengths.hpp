// Sequence lengths of a variable-length step, from a short text spec (the CLI's --lengths and
// the planner's): a comma-separated list of terms, each
//   N x L             N sequences of L tokens ("1x16384", "32x512"; "L" alone is "1xL")
//   pareto:N:MIN:MAX:ALPHA[:SEED]
//                     N lengths from a bounded Pareto (power-law long tail) on [MIN, MAX] with
//                     tail index ALPHA > 0, drawn from SEED (default 0) with a fixed generator:
//                     the same spec gives the same lengths on every machine and rank.
// Real SFT / RL length distributions are long-tailed (most samples short, a few very long),
// which is what makes a fixed CP size wasteful; the Pareto term is the simplest model of that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses {

// Not collective. The lengths in spec order (terms concatenated). Throws Error naming the term
// and the rule for anything malformed, a length < 1, more than kMaxLengths sequences, or a
// spec that gives no sequence.
std::vector<std::int64_t> parse_lengths(const std::string& spec);

// "1x16384,32x512" style summary of `lengths` (runs of equal lengths), for logs.
std::string describe_lengths(const std::vector<std::int64_t>& lengths);

inline constexpr std::int64_t kMaxLengths = 1 << 20;

}  // namespace ulysses
