#include "report.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>

namespace ulysses::cli {

std::int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return std::int64_t(u.ru_maxrss) * 1024;  // Linux reports KiB
}

nlohmann::json gather_rank_stats(Communicator& comm, const std::vector<std::string>& ops) {
  // Per rank: peak rss, then (bytes, messages, calls) per op.
  std::vector<std::int64_t> mine{peak_rss_bytes()};
  for (const std::string& op : ops) {
    auto it = comm.counters().find(op);
    const CommCounter c = it == comm.counters().end() ? CommCounter{} : it->second;
    mine.insert(mine.end(), {c.bytes_sent, c.messages, c.calls});
  }
  std::vector<std::int64_t> all(mine.size() * std::size_t(comm.size()));
  comm.gather(mine.data(), all.data(), mine.size() * sizeof(std::int64_t), 0, "report");
  nlohmann::json ranks = nlohmann::json::array();
  if (comm.rank() != 0) return ranks;
  for (int r = 0; r < comm.size(); ++r) {
    const std::int64_t* p = &all[mine.size() * std::size_t(r)];
    nlohmann::json j{{"rank", r}, {"peak_rss_bytes", p[0]}};
    for (std::size_t i = 0; i < ops.size(); ++i) {
      j["bytes_sent"][ops[i]] = p[1 + 3 * i];
      j["messages"][ops[i]] = p[2 + 3 * i];
      j["calls"][ops[i]] = p[3 + 3 * i];
    }
    ranks.push_back(j);
  }
  return ranks;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace ulysses::cli
