#include "generate_memory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "guard.hpp"
#include "rank_errors.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses::cli {

namespace {

// "the KV caches of requests 0, 2 held at once (of 4)": the attention term's requests.
std::string held_caches(const train::GptConfig& model, const std::vector<train::GenerateConfig>& requests,
                        const std::vector<std::vector<std::size_t>>& held, int cp, int rank) {
  const train::KvPeak peak = train::peak_kv(model, requests, held, cp, rank);
  return fmt::format("the KV caches of request{} {} held at once (of {})", peak.requests.size() == 1 ? "" : "s",
                     fmt::join(peak.requests, ", "), requests.size());
}

}  // namespace

train::MemoryEstimate admit_generate_memory(Communicator& comm, const train::GptConfig& model,
                                            const std::vector<train::GenerateConfig>& requests,
                                            const std::vector<std::vector<std::size_t>>& held,
                                            std::int64_t longest_prompt, double scratch,
                                            const std::string& max_memory) {
  const MemoryRoom room = memory_room(comm);
  train::MemoryEstimate busiest;
  on_every_rank(comm, [&] {
    const double cap = max_memory.empty() ? 0.0 : train::parse_bytes(max_memory);
    int worst = 0;
    for (int rank = 0; rank < comm.size(); ++rank) {  // interleaved caches differ by a row
      const train::MemoryEstimate e =
          train::predict_generate_memory(model, requests, held, comm.size(), rank, longest_prompt, scratch);
      if (e.total() > busiest.total()) busiest = e, worst = rank;
    }
    const std::string remedy =
        fmt::format("{}; use more ranks, a smaller --capacity, or fewer or shorter requests, or later arrivals",
                    held_caches(model, requests, held, comm.size(), worst));
    if (cap > 0 && busiest.total() > cap)
      throw Error(fmt::format("generate needs a predicted {} per rank, more than --max-memory {}: {}",
                              busiest.describe(), train::format_bytes(cap), remedy));
    if (const std::string refusal = room.refusal("generate", busiest.total(), busiest.describe(), remedy);
        !refusal.empty())
      throw Error(refusal);
  });
  return busiest;
}

double largest_peak_rss(Communicator& comm) {
  const std::vector<std::int64_t> all = comm.allgather_value(std::int64_t(train::peak_rss_bytes()));
  return double(*std::max_element(all.begin(), all.end()));
}

nlohmann::json memory_report(const train::MemoryEstimate& predicted, double peak_rss) {
  return {{"predicted_bytes", predicted.total()},
          {"predicted", predicted.describe()},
          {"peak_rss_bytes", peak_rss},
          {"measured_over_predicted", peak_rss / predicted.total()}};
}

void print_memory(const nlohmann::json& memory) {
  fmt::print("  memory per rank: predicted {}; measured peak RSS {} (largest over ranks; measured/predicted {:.3f})\n",
             memory["predicted"].get<std::string>(), train::format_bytes(memory["peak_rss_bytes"].get<double>()),
             memory["measured_over_predicted"].get<double>());
}

void show_prefill_progress(Communicator& comm, train::Generator& gen, std::int64_t tokens) {
  if (comm.rank() != 0 || tokens < 4096) return gen.on_prompt_layer(nullptr);
  gen.on_prompt_layer([&comm, t0 = 0.0, tokens](std::int64_t done, std::int64_t layers) mutable {
    if (done == 0) {  // the prompt starts: its clock
      t0 = comm.now();
      return;
    }
    fmt::print(stderr, "prefill of {} tokens: layer {}/{} ({} %), {:.2f} s\n", tokens, done, layers,
               100 * done / layers, comm.now() - t0);
  });
}

}  // namespace ulysses::cli
