#include "report.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mpi.h>
#include <new>

#include "ulysses/error.hpp"

namespace ulysses::cli {

void on_every_rank(Communicator& comm, const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::bad_alloc&) {
    err = "out of memory";
  } catch (const std::exception& e) {  // ulysses::Error, and std::ios_base::failure & co.
    err = e.what();
  }
  comm.agree(err);
}

void abort_job(int rank, const std::string& why) {
  std::fprintf(stderr, "ulysses: error on rank %d: %s\n", rank, why.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

void on_root(Communicator& comm, const std::function<void()>& fn) {
  on_every_rank(comm, [&] {
    if (comm.rank() == 0) fn();
  });
}

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

CpConfig parse_strategy(const std::string& strategy, const std::string& cp_sizes, int ranks) {
  const Strategy& chosen = find_strategy(strategy);
  CpConfig cfg;
  cfg.cp_comm_type = chosen.name();
  if (!cp_sizes.empty()) {
    int inner = 0, outer = 0;
    const char* end = cp_sizes.data() + cp_sizes.size();
    const auto [comma, e1] = std::from_chars(cp_sizes.data(), end, inner);
    const auto [last, e2] = comma < end && *comma == ',' ? std::from_chars(comma + 1, end, outer)
                                                          : std::from_chars_result{comma, std::errc::invalid_argument};
    if (e1 != std::errc() || e2 != std::errc() || last != end || inner < 1 || outer < 1)
      throw Error(fmt::format("--cp-sizes must be INNER,OUTER (two positive integers), got '{}'", cp_sizes.substr(0, 40)));
    if (!chosen.hierarchical()) {
      std::string takers;
      for (const Strategy* t : strategies())
        if (t->hierarchical()) takers += (takers.empty() ? "" : " or ") + std::string(t->name());
      throw Error(fmt::format("--cp-sizes applies to --strategy {} only", takers));
    }
    cfg.hierarchical_context_parallel_sizes = {inner, outer};
  } else if (chosen.hierarchical()) {
    throw Error(fmt::format("--strategy {} needs --cp-sizes INNER,OUTER with INNER * OUTER == {} (ranks)", chosen.name(),
                            ranks));
  }
  return cfg;
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
