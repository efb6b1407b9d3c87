// The memory `ulysses generate` will need per rank (train/generate.hpp's model), checked before
// anything large is allocated, and the peak it reached.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/generate.hpp"
#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Collective. The busiest rank's predicted peak, with the caches of `held` (sets of indices into
// `requests` held at once: train::held_together, or {{0}} for one request); refuses (one error, every rank) when it is
// more than `max_memory` (a byte count, "" for none) or than 90 % of what this machine has for
// each of its ranks (MemAvailable or the cgroup's limit, shared by the node's ranks; the least
// over the nodes), as train does: the model errs by up to about 10 %.
train::MemoryEstimate admit_generate_memory(Communicator& comm, const train::GptConfig& model,
                                            const std::vector<train::GenerateConfig>& requests,
                                            const std::vector<std::vector<std::size_t>>& held,
                                            std::int64_t longest_prompt, double scratch, const std::string& max_memory);

// Collective. The largest peak RSS over the ranks, in bytes.
double largest_peak_rss(Communicator& comm);

// {"predicted_bytes", "predicted", "peak_rss_bytes", "measured_over_predicted"} for --json.
nlohmann::json memory_report(const train::MemoryEstimate& predicted, double peak_rss);
// "  memory per rank: predicted …; measured peak RSS … (largest over ranks; measured/predicted r)".
void print_memory(const nlohmann::json& memory);

// Rank 0's progress on a prompt of `tokens` tokens (at least 4096: a shorter one is done before
// a line would help): "prefill: layer 3/8 (37 %), 1.52 s" to standard error after each layer.
void show_prefill_progress(Communicator& comm, train::Generator& gen, std::int64_t tokens);

}  // namespace ulysses::cli
