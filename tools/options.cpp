#include "options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "ulysses/error.hpp"
#include "ulysses/input_file.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses::cli {

void add_timeout_option(CLI::App* command, double& seconds) {
  command
      ->add_option("--timeout", seconds,
                   "seconds any rank may wait for a collective or a message before the job ends with a message "
                   "naming the operation, the rank and its peer or group (0 = wait forever)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
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
      throw Error(
          fmt::format("--cp-sizes must be INNER,OUTER (two positive integers), got '{}'", cp_sizes.substr(0, 40)));
    if (!chosen.hierarchical()) {
      std::string takers;
      for (const Strategy* t : strategies())
        if (t->hierarchical()) takers += (takers.empty() ? "" : " or ") + std::string(t->name());
      throw Error(fmt::format("--cp-sizes applies to --strategy {} only", takers));
    }
    cfg.hierarchical_context_parallel_sizes = {inner, outer};
  } else if (chosen.hierarchical()) {
    throw Error(fmt::format("--strategy {} needs --cp-sizes INNER,OUTER with INNER * OUTER == {} (ranks)",
                            chosen.name(), ranks));
  }
  return cfg;
}

}  // namespace ulysses::cli
