#include "report.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mpi.h>
#include <new>

#include "ulysses/error.hpp"
#include "ulysses/input_file.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses::cli {

namespace {
// Suspends a communicator's watchdog while in scope (restored on any exit, exceptions too).
class NoDeadline {
 public:
  explicit NoDeadline(Communicator& comm) : comm_(comm), timeout_(comm.timeout()) { comm.set_timeout(0); }
  ~NoDeadline() { comm_.set_timeout(timeout_); }
  NoDeadline(const NoDeadline&) = delete;
  NoDeadline& operator=(const NoDeadline&) = delete;

 private:
  Communicator& comm_;
  double timeout_;
};
}  // namespace

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
  // The other ranks wait for rank 0 alone, whose work may outlast any timeout by design (the
  // float64 reference of a large --check): no deadline on that one wait. A rank 0 that dies
  // meanwhile still ends the job through the launcher.
  const NoDeadline unbounded(comm);
  on_every_rank(comm, [&] {
    if (comm.rank() == 0) fn();
  });
}

void add_timeout_option(CLI::App* command, double& seconds) {
  command
      ->add_option("--timeout", seconds,
                   "seconds any rank may wait for a collective or a message before the job ends with a message "
                   "naming the operation, the rank and its peer or group (0 = wait forever)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
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

bool parse_int64(std::string_view text, std::int64_t& value) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

std::pair<std::int64_t, std::int64_t> parse_window(const std::string& arg) {
  const std::size_t comma = arg.find(',');
  std::pair<std::int64_t, std::int64_t> w{0, 0};
  const bool ok = comma == std::string::npos ? parse_int64(arg, w.first)
                                             : parse_int64(std::string_view(arg).substr(0, comma), w.first) &&
                                                   parse_int64(std::string_view(arg).substr(comma + 1), w.second);
  if (!ok)
    throw Error(
        fmt::format("--window: '{}' is neither LEFT nor LEFT,RIGHT (integers, -1: unbounded)", arg.substr(0, 40)));
  return w;
}

namespace {

std::vector<std::int64_t> parse_integer_list(const std::string& text, const std::string& where) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while ((pos = text.find_first_not_of(", \t\r\n", pos)) != std::string::npos) {
    const std::size_t end = std::min(text.find_first_of(", \t\r\n", pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    std::int64_t v = 0;
    if (!parse_int64(item, v))
      throw Error(fmt::format("--cu-seqlens: '{}' in {} is not an integer", item.substr(0, 40), where));
    out.push_back(v);
    pos = end;
  }
  if (out.empty()) throw Error(fmt::format("--cu-seqlens: no numbers in {}", where));
  return out;
}

}  // namespace

std::string cu_seqlens_file(const std::string& arg) {
  return arg.empty() || std::isdigit(static_cast<unsigned char>(arg[0])) || arg[0] == '-' ? "" : arg;
}

std::vector<std::int64_t> parse_cu_seqlens(const std::string& arg) {
  if (cu_seqlens_file(arg).empty()) return parse_integer_list(arg, "the list");
  check_regular_input("--cu-seqlens", arg);
  if (arg.ends_with(".npy")) {
    NpyIntArray a;
    try {
      a = read_npy_integers(arg);
    } catch (const Error& e) {
      throw Error(fmt::format("--cu-seqlens: {}", e.what()));
    }
    if (a.shape.size() != 1)
      throw Error(fmt::format("--cu-seqlens: {} must be 1-D, got {} dimensions", arg, a.shape.size()));
    return a.data;
  }
  return parse_integer_list(read_input_within_memory("--cu-seqlens", arg), arg);
}

namespace {

// The strategies declaring `flag`, "a or b", and one of its declarations.
std::pair<std::string, StrategyOption> declarations(const std::string& flag) {
  std::string owners;
  StrategyOption option;
  for (const Strategy* s : strategies())
    for (const StrategyOption& o : s->options())
      if (o.flag == flag) {
        owners += (owners.empty() ? "" : " or ") + std::string(s->name());
        option = o;
      }
  return {owners, option};
}

// The integers of `text` for `o`: as many as its metavar names, each in [1, most].
std::vector<std::int64_t> option_values(const StrategyOption& o, const std::string& text) {
  const std::size_t count = std::size_t(std::count(o.metavar.begin(), o.metavar.end(), ',')) + 1;
  const std::int64_t most = o.most > 0 ? o.most : std::numeric_limits<int>::max();
  static const char* const counts[] = {"a positive integer", "two positive integers", "three positive integers"};
  const std::string what = count <= 3 ? counts[count - 1] : fmt::format("{} positive integers", count);
  std::vector<std::int64_t> values;
  bool ok = true;
  for (std::size_t pos = 0; ok;) {
    const std::size_t comma = text.find(',', pos);
    std::int64_t v = 0;
    ok = parse_int64(std::string_view(text).substr(pos, comma == std::string::npos ? comma : comma - pos), v) &&
         v >= 1 && v <= most;
    values.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!ok || values.size() != count)
    throw Error(fmt::format("--{} must be {} ({}{}), got '{}'", o.flag, o.metavar, what,
                            o.most > 0 ? fmt::format(", at most {}", o.most) : "", text.substr(0, 40)));
  return values;
}

}  // namespace

void add_strategy_options(CLI::App* command, StrategyOptionTexts& given) {
  for (const Strategy* s : strategies())
    for (const StrategyOption& o : s->options())
      if (!given.count(o.flag)) {
        const auto [owners, option] = declarations(o.flag);
        command->add_option("--" + o.flag, given[o.flag], fmt::format("{}: {}", owners, o.help))->type_name(o.metavar);
      }
}

CpConfig parse_strategy(const std::string& strategy, const StrategyOptionTexts& given, int ranks) {
  const Strategy& chosen = find_strategy(strategy);
  CpConfig cfg;
  cfg.cp_comm_type = chosen.name();
  for (const auto& [flag, text] : given) {
    if (text.empty()) continue;
    const auto [owners, option] = declarations(flag);
    const std::vector<std::int64_t> values = option_values(option, text);
    const std::vector<StrategyOption> own = chosen.options();
    const auto it = std::find_if(own.begin(), own.end(), [&](const StrategyOption& o) { return o.flag == flag; });
    if (it == own.end()) throw Error(fmt::format("--{} applies to --strategy {} only", flag, owners));
    set_option(*it, cfg, values);
  }
  for (const StrategyOption& o : chosen.options())
    if (!o.required.empty() && (!given.count(o.flag) || given.at(o.flag).empty()))
      throw Error(fmt::format("--strategy {} needs --{} {} with {}", chosen.name(), o.flag, o.metavar,
                              fmt::format(fmt::runtime(o.required), ranks)));
  return cfg;
}

bool no_option_given(const CpConfig& cfg, const StrategyOptionTexts& given) {
  for (const StrategyOption& o : find_strategy(cfg.cp_comm_type).options())
    if (given.count(o.flag) && !given.at(o.flag).empty()) return false;
  return true;
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
