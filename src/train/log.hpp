// The training log (train --log): JSON lines, one per step, each opening with {"step": N.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ulysses::train {

// The bytes of `log` that a run resumed at checkpoint step `step` keeps: its complete lines up
// to the first one past `step` (written by a run killed after its checkpoint, and about to be
// written again), the first that does not follow its predecessor's step (a repeat) or the first
// that is not a step's line (one cut short by the kill).
std::size_t log_bytes_through_step(std::string_view log, std::int64_t step);

// Not collective. What a run keeps of its log file `path` before appending: nothing for a fresh
// run (`resumed_step` < 0), else log_bytes_through_step of the file (0 when there is none).
std::uint64_t log_bytes_to_keep(const std::string& path, std::int64_t resumed_step);

}  // namespace ulysses::train
