// Small helpers the CLI commands share: per-rank facts gathered to rank 0, atomic files.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/comm.hpp"

namespace ulysses::cli {

// Peak resident set size of this process, in bytes.
std::int64_t peak_rss_bytes();

// Collective. Rank 0 gets one JSON object per rank: {"rank", "bytes_sent": {op: n},
// "messages": {op: n}, "calls": {op: n}, "peak_rss_bytes"}; other ranks get an empty array.
nlohmann::json gather_rank_stats(Comm& comm, const std::vector<std::string>& ops);

// Writes text to path.tmp.<pid>, then renames it into place. Throws Error on failure.
void write_file_atomic(const std::string& path, const std::string& text);

// "12.3 MB" style.
std::string human_bytes(double bytes);

// Median of a non-empty list.
double median(std::vector<double> values);

}  // namespace ulysses::cli
