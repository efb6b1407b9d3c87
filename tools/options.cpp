#include "options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/npy.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses::cli {

CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description) {
  CLI::App* command = app.add_subcommand(name, description);
  command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  return command;
}

void add_timeout_option(CLI::App* command, double& seconds) {
  command
      ->add_option("--timeout", seconds,
                   "seconds any rank may wait for a collective or a message before the job ends with a message "
                   "naming the operation, the rank and its peer or group (0 = wait forever)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

void add_backend_options(CLI::App* command, BackendOptions& backend) {
  command
      ->add_option("--comm", backend.comm,
                   "the communicator: mpi (the processes mpirun started) or local (--ranks ranks as threads of "
                   "this one process, no mpirun)")
      ->capture_default_str()
      ->check(CLI::IsMember(communicator_backends()));
  command
      ->add_option("--ranks", backend.ranks, fmt::format("with --comm local: how many ranks (1 to {})", kMaxLocalRanks))
      ->check(CLI::Range(1, kMaxLocalRanks));
}

int local_ranks(const BackendOptions& backend, int mpi_ranks) {
  const bool local = backend.comm == "local";
  if (!local && backend.ranks > 0)
    throw Error(fmt::format("--ranks {} needs --comm local: over MPI the launcher starts the ranks (mpirun -n {})",
                            backend.ranks, backend.ranks));
  if (local && mpi_ranks > 1)
    throw Error(
        fmt::format("--comm local runs its ranks as threads of one process, but the launcher started {} processes: "
                    "run it without mpirun, or use --comm mpi",
                    mpi_ranks));
  return local ? std::max(backend.ranks, 1) : 0;
}

bool parse_int64(std::string_view text, std::int64_t& value) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

std::pair<std::int64_t, std::int64_t> parse_window(const std::string& arg, bool causal) {
  const std::size_t comma = arg.find(',');
  std::pair<std::int64_t, std::int64_t> w{0, 0};
  const bool ok = comma == std::string::npos ? parse_int64(arg, w.first)
                                             : parse_int64(std::string_view(arg).substr(0, comma), w.first) &&
                                                   parse_int64(std::string_view(arg).substr(comma + 1), w.second);
  if (!ok)
    throw Error(
        fmt::format("--window: '{}' is neither LEFT nor LEFT,RIGHT (integers, -1: unbounded)", arg.substr(0, 40)));
  // A causal mask hides every key after the query (FlashAttention drops the right side too): a
  // right side would be printed and priced as nothing.
  if (causal && w.second > 0)
    throw Error(
        fmt::format("--window {}: the right side has no effect under a causal mask (keys after a query are "
                    "masked): give {} alone, or drop the causal mask",
                    arg.substr(0, 40), w.first));
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

// The integers of `text` for `o` (option_values_error has the rule).
std::vector<std::int64_t> option_values(const StrategyOption& o, const std::string& text) {
  std::vector<std::int64_t> values;
  bool ok = true;
  for (std::size_t pos = 0; ok;) {
    const std::size_t comma = text.find(',', pos);
    std::int64_t v = 0;
    ok = parse_int64(std::string_view(text).substr(pos, comma == std::string::npos ? comma : comma - pos), v);
    values.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  std::string error = option_values_error(o, values);
  if (!ok) error = option_values_error(o, {});  // what they must be
  if (!error.empty()) throw Error(fmt::format("--{} {}, got '{}'", o.flag, error, text.substr(0, 40)));
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
  for (const auto& entry : given) {  // not a structured binding: clang's lambdas cannot capture one
    const std::string &flag = entry.first, &text = entry.second;
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

std::string option_flags(const CpConfig& cfg) {
  std::string out;
  for (const StrategyOption& o : find_strategy(cfg.cp_comm_type).options())
    if (const std::vector<std::int64_t> v = option_value(o, cfg); !v.empty())
      out += fmt::format(" --{} {}", o.flag, fmt::join(v, ","));
  return out;
}

}  // namespace ulysses::cli
