// What the CLI's commands report: per-rank facts gathered to rank 0 (bytes, messages, peak
// memory) and their human-readable forms.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Peak resident set size of this process, in bytes.
std::int64_t peak_rss_bytes();

// Collective. Rank 0 gets one JSON object per rank: {"rank", "bytes_sent": {op: n},
// "messages": {op: n}, "calls": {op: n}, "peak_rss_bytes"}; other ranks get an empty array.
nlohmann::json gather_rank_stats(Communicator& comm, const std::vector<std::string>& ops);

// "12.3 MB" style.
std::string human_bytes(double bytes);

// Median of a non-empty list.
double median(std::vector<double> values);

}  // namespace ulysses::cli
