#include "train/log.hpp"

#include <sys/stat.h>

#include <charconv>

#include "ulysses/io/input_file.hpp"

namespace ulysses::train {

namespace {

// The step of one line `{"step": N, ...}`, or -1 when it is not one.
std::int64_t step_of(std::string_view line) {
  constexpr std::string_view kOpen = "{\"step\": ";
  if (!line.starts_with(kOpen)) return -1;
  std::int64_t step = -1;
  const auto [end, ec] = std::from_chars(line.data() + kOpen.size(), line.data() + line.size(), step);
  return ec == std::errc() && end < line.data() + line.size() && *end == ',' ? step : -1;
}

}  // namespace

std::size_t log_bytes_through_step(std::string_view log, std::int64_t step) {
  std::size_t kept = 0;
  std::int64_t previous = -1;
  while (kept < log.size()) {
    const std::size_t newline = log.find('\n', kept);
    if (newline == std::string_view::npos) break;  // a line cut short
    const std::int64_t s = step_of(log.substr(kept, newline - kept));
    if (s < 0 || s > step || s <= previous) break;  // not a step's line, past the checkpoint, or a repeat
    previous = s;
    kept = newline + 1;
  }
  return kept;
}

std::uint64_t log_bytes_to_keep(const std::string& path, std::int64_t resumed_step) {
  struct stat st {};
  if (resumed_step < 0 || ::stat(path.c_str(), &st) != 0) return 0;
  return log_bytes_through_step(read_input_within_memory("--log", path), resumed_step);
}

}  // namespace ulysses::train
