#include "ulysses/plan/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

namespace {

// Parses "<number><unit>" (spaces allowed) against a unit table.
double parse_quantity(const std::string& text, const std::map<std::string, double>& units, const char* what) {
  const std::string shown = text.size() <= 40 ? text : text.substr(0, 37) + "...";
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    throw Error(fmt::format("{} '{}' does not start with a number", what, shown));
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }), unit.end());
  if (unit == "µs") unit = "us";
  auto it = units.find(unit);
  if (it == units.end()) {
    std::string known;
    for (const auto& [u, f] : units) known += (known.empty() ? "" : ", ") + u;
    throw Error(fmt::format("{} '{}': unknown unit '{}' (use one of {})", what, shown, unit.substr(0, 40), known));
  }
  const double scaled = value * it->second;
  if (!(scaled > 0) || !std::isfinite(scaled))
    throw Error(fmt::format("{} '{}' must be positive and finite", what, shown));
  return scaled;
}

// The busiest rank's query heads over the average: an uneven Ulysses head split makes one
// rank compute longer than the others (1 when the heads split evenly).
double head_imbalance(const PlanInput& in, const Strategy& strategy, const CpConfig& cfg) {
  std::int64_t most = 0, total = 0;
  for (int r = 0; r < in.cp; ++r) {
    const std::int64_t n = strategy.heads_of(cfg, in.cp, r, in.heads, in.kv_heads).q.count;
    most = std::max(most, n);
    total += n;
  }
  return double(most) * in.cp / double(total);
}

// The input's documents' boundaries lent to the configuration a row is priced with, and taken
// back when it is priced (thrown or not): one copy for all the rows, where each row's own was
// 128 MB for 16M documents, faulted in and copied again by every pass that took the config.
class LentDocuments {
 public:
  LentDocuments(CpConfig& cfg, std::vector<std::int64_t>& cu) : cfg_(cfg), cu_(cu) { std::swap(cfg_.cu_seqlens, cu_); }
  ~LentDocuments() { std::swap(cfg_.cu_seqlens, cu_); }
  LentDocuments(const LentDocuments&) = delete;
  LentDocuments& operator=(const LentDocuments&) = delete;

 private:
  CpConfig& cfg_;
  std::vector<std::int64_t>& cu_;
};

// The documents' boundaries of `in`, empty without documents.
std::vector<std::int64_t> documents_cu(const PlanInput& in) {
  return in.documents.empty() ? std::vector<std::int64_t>{} : cu_seqlens_of(in.documents);
}

// `config` priced on `in`, whose documents' boundaries are `cu` (empty: none, `config`'s own
// kept). The row keeps the configuration without the documents (PlanRow::config).
PlanRow evaluate(const PlanInput& in, const Strategy& strategy, const CpConfig& config, std::vector<std::int64_t>& cu,
                 RowDetail detail = RowDetail::all) {
  const bool all = detail == RowDetail::all;
  PlanRow r;
  r.config = config;
  r.config.window_left = in.window_left;
  r.config.window_right = in.window_right;
  r.config.q_offset = in.q_offset;
  if (!in.documents.empty()) r.config.cu_seqlens = {};
  if (all) r.name = strategy.config_name(r.config);
  CpConfig cfg = r.config;
  std::optional<LentDocuments> lent;
  if (!in.documents.empty()) lent.emplace(cfg, cu);
  const Shape q{in.batch, in.seq, in.heads, in.head_dim};
  try {
    validate_cp_config(cfg, in.cp, q, in.kv_heads, kv_seq_of(in));
  } catch (const Error& e) {
    r.reason = e.what();
    return r;
  }
  r.valid = true;
  const CommVolume v = predicted_comm_volume(cfg, in.cp, q, in.kv_heads, in.dtype, kv_seq_of(in));
  r.forward_bytes_per_rank = v.total_forward_bytes();
  r.backward_bytes_per_rank = v.total_backward_bytes();
  if (all) {
    for (const auto& [op, n] : v.forward_messages) r.forward_messages += n;
    for (const auto& [op, n] : v.backward_messages) r.backward_messages += n;
  }

  const double rate = in.cluster.peak_flops * in.cluster.efficiency;
  if (all) r.head_imbalance = head_imbalance(in, strategy, cfg);
  double most = 0, total = 0;
  for (const std::int64_t n :
       strategy.work_of_ranks(cfg, in.cp, {in.batch, in.seq, in.heads, in.head_dim}, kv_seq_of(in), in.kv_heads)) {
    most = std::max(most, double(n));
    total += double(n);
  }
  r.work_imbalance = total > 0 ? most * in.cp / total : 1.0;
  const double fwd = 4.0 * double(in.head_dim) * most / rate;
  const double bwd = has_backward(in) ? in.cluster.kernel.backward_ratio * fwd : 0.0;
  CommVolume sent = v;
  if (!has_backward(in))  // a forward alone sends no backward bytes
    for (auto* m : {&sent.backward_bytes, &sent.backward_messages})
      for (auto& [op, n] : *m) n = 0;
  const StrategyCost c = strategy.cost(in, cfg, sent, fwd, bwd);
  r.compute_s = c.compute_s >= 0 ? c.compute_s : fwd + bwd;
  if (!has_backward(in)) r.backward_bytes_per_rank = r.backward_messages = 0;
  r.comm_s = c.comm_s;
  r.hidden_s = c.hidden_s;
  if (all) r.memory_bytes = planned_memory_bytes(strategy, in, cfg);
  r.predicted_step_s = double(in.layers) * (r.compute_s + r.comm_s - r.hidden_s);
  return r;
}

// Throws unless the document lengths (if any) are non-negative and add up to seq, at batch 1.
void check_documents(const PlanInput& in) {
  if (in.documents.empty()) return;
  if (in.batch != 1)
    throw Error(fmt::format("documents are packed along one sequence: batch must be 1, got {}", in.batch));
  for (std::int64_t n : in.documents)
    if (n < 0) throw Error(fmt::format("document lengths must not be negative, got {}", n));
  std::uint64_t sum = 0;  // cu_seqlens_of(in.documents).back(), without its vector (wrapping alike)
  for (const std::int64_t n : in.documents) sum += std::uint64_t(n);
  const auto total = std::int64_t(sum);
  if (total != in.seq)
    throw Error(fmt::format("the document lengths add up to {}, not the sequence length {}", total, in.seq));
}

// Which strategy's ranks share the documents' work most evenly, and how the recommended one does.
std::string balance_note(const Plan& p) {
  const PlanRow* even = nullptr;
  for (const PlanRow& r : p.rows)
    if (r.valid && (even == nullptr || r.work_imbalance < even->work_imbalance)) even = &r;
  const PlanRow& b = p.rows[std::size_t(p.best)];
  return fmt::format("; these documents are best balanced by {} (busiest rank {:.2f}x the mean work; {}: {:.2f}x)",
                     even->name, even->work_imbalance, b.name, b.work_imbalance);
}

const PlanRow* row_named(const Plan& p, const std::string& name) {
  for (const PlanRow& r : p.rows)
    if (r.name == name) return &r;
  return nullptr;
}

// When nothing is valid, why not: each strategy's first row's reason, in registry order, once
// each (a shape too short for any strategy says so once; no strategy's rule stands for all).
std::string invalid_reasons(const Plan& p) {
  std::vector<std::string> seen_types, reasons;
  for (const PlanRow& r : p.rows) {
    if (std::find(seen_types.begin(), seen_types.end(), r.config.cp_comm_type) != seen_types.end()) continue;
    seen_types.push_back(r.config.cp_comm_type);
    if (std::find(reasons.begin(), reasons.end(), r.reason) == reasons.end()) reasons.push_back(r.reason);
  }
  return fmt::format("{}", fmt::join(reasons, "; "));
}

// A decode step as the planner prices it: one query token per sequence at the end of a cache of
// seq tokens (cross-attention of 1 token against s_k = seq, forward only); other modes as given.
PlanInput mode_input(const PlanInput& in) {
  if (in.mode != PlanMode::decode) return in;
  PlanInput d = in;
  d.kv_seq = kv_seq_of(in);
  d.q_offset = d.kv_seq - 1;
  d.seq = 1;
  d.documents.clear();
  return d;
}

// mode_input(in), copied into `decode` only when it differs from `in` (decode): the other modes
// price `in` itself, whose millions of document lengths a copy would fault in again.
const PlanInput& mode_input(const PlanInput& in, PlanInput& decode) {
  if (in.mode != PlanMode::decode) return in;
  decode = mode_input(in);
  return decode;
}

// Which term separates the recommended row `b` from the runner-up `n`: the busiest rank's share
// of the work (load balance), the kernel's rate at the blocks each runs, or exposed communication.
std::string deciding_term(const PlanInput& in, const PlanRow& b, const PlanRow& n) {
  const double layers = double(in.layers);
  const double compute = layers * (n.compute_s - b.compute_s);
  const double exposed = layers * ((n.comm_s - n.hidden_s) - (b.comm_s - b.hidden_s));
  if (std::abs(exposed) >= std::abs(compute))
    return fmt::format("exposed communication: {:+.3g} ms per step", exposed * 1e3);
  if (n.work_imbalance > 1.01 * b.work_imbalance)
    return fmt::format("load balance: the busiest rank has {:.2f}x the mean work against {:.2f}x", n.work_imbalance,
                       b.work_imbalance);
  return fmt::format("kernel efficiency at the block length: compute {:+.3g} ms per step", compute * 1e3);
}

// A causal ring over contiguous chunks (--no-zigzag) beside the zigzag one: same bytes, uneven
// work (the last rank computes the most), longer kernel blocks. Empty when the layout changes
// neither the balance nor the time (documents that each fill a rank's chunk balance either way,
// and then the longer blocks make the contiguous ring the faster).
std::optional<PlanRow> contiguous_twin(const PlanInput& in, const Strategy& strategy, const PlanRow& zigzag,
                                       std::vector<std::int64_t>& cu) {
  if (!in.causal || !uses_zigzag(zigzag.config)) return std::nullopt;
  CpConfig c = zigzag.config;
  c.zigzag = false;
  PlanRow r = evaluate(in, strategy, c, cu);
  const bool same_time = std::abs(r.predicted_step_s - zigzag.predicted_step_s) <= 1e-3 * zigzag.predicted_step_s;
  if (!r.valid || (r.work_imbalance < 1.001 * zigzag.work_imbalance && same_time)) return std::nullopt;
  r.name += " --no-zigzag";
  return r;
}

// Rows whose working set is over in.max_memory_bytes become invalid, the reason saying by how
// much: a strategy that does not fit is no choice however fast. Returns how many.
int refuse_by_memory(const PlanInput& in, Plan& p) {
  int n = 0;
  if (!(in.max_memory_bytes > 0)) return n;
  for (PlanRow& r : p.rows)
    if (r.valid && r.memory_bytes > in.max_memory_bytes) {
      r.valid = false;
      r.reason = fmt::format("memory: needs {:.4g} MB per rank, over the cap of {:.4g} MB", r.memory_bytes / 1e6,
                             in.max_memory_bytes / 1e6);
      ++n;
    }
  return n;
}

}  // namespace

PlanMode parse_plan_mode(const std::string& text) {
  static const std::map<std::string, PlanMode> modes{{"train", PlanMode::train},
                                                     {"forward", PlanMode::forward},
                                                     {"prefill", PlanMode::prefill},
                                                     {"decode", PlanMode::decode}};
  const auto it = modes.find(text);
  if (it == modes.end())
    throw Error(fmt::format("unknown mode '{}' (use one of train, forward, prefill, decode)", text.substr(0, 40)));
  return it->second;
}

double parse_bandwidth(const std::string& text) {
  static const std::map<std::string, double> units{{"B/s", 1.0},       {"KB/s", 1e3},    {"MB/s", 1e6},
                                                   {"GB/s", 1e9},      {"TB/s", 1e12},   {"Gb/s", 1e9 / 8},
                                                   {"Tb/s", 1e12 / 8}, {"Mb/s", 1e6 / 8}};
  const double v = parse_quantity(text, units, "bandwidth");
  // Slower than 1 B/s, a step's bytes over it pass a double's range (1e-300B/s priced inf).
  if (v < 1) throw Error(fmt::format("bandwidth '{}' is below 1 B/s", text.substr(0, 40)));
  return v;
}

double parse_latency(const std::string& text) {
  static const std::map<std::string, double> units{{"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  const double v = parse_quantity(text, units, "latency");
  // Past 1000 s a step's messages times it times the layers may pass a double's range.
  if (v > 1000) throw Error(fmt::format("latency '{}' is above 1000 s", text.substr(0, 40)));
  return v;
}

std::int64_t rank_work(const PlanInput& in, const Strategy& strategy, const CpConfig& config, int rank) {
  return strategy.work(config, in.cp, rank, {in.batch, in.seq, in.heads, in.head_dim}, kv_seq_of(in), in.kv_heads);
}

namespace {

// `config`'s tunings (Strategy::tunings) on `in`, their rows, and the fastest (the first on a
// tie); best is -1 when there are none or one is invalid.
struct Tunings {
  std::vector<CpConfig> configs;
  std::vector<PlanRow> rows;
  int best = -1;
};

// On `in` as mode_input gives it, checked by plan_input_error, its documents' boundaries `cu`.
Tunings tunings_on(const PlanInput& in, const CpConfig& config, std::vector<std::int64_t>& cu) {
  const Strategy& strategy = find_strategy(config.cp_comm_type);
  Tunings t;
  t.configs = strategy.tunings(config, in.cp, in.kv_heads);
  for (const CpConfig& c : t.configs) {
    t.rows.push_back(evaluate(in, strategy, c, cu));
    if (!t.rows.back().valid) return {};
    if (t.best < 0 || t.rows.back().predicted_step_s < t.rows[std::size_t(t.best)].predicted_step_s)
      t.best = int(t.rows.size()) - 1;
  }
  return t;
}

Tunings tunings_of(const PlanInput& in_arg, const CpConfig& config) {
  PlanInput decode;
  const PlanInput& in = mode_input(in_arg, decode);
  if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
  std::vector<std::int64_t> cu = documents_cu(in);
  const SharedDocuments shared(cu);
  return tunings_on(in, config, cu);
}

double exposed_s(const PlanRow& r) { return r.comm_s - r.hidden_s; }

}  // namespace

CpConfig plan_tuning(const PlanInput& in, const CpConfig& config) {
  const Tunings t = tunings_of(in, config);
  return t.best < 0 ? config : t.configs[std::size_t(t.best)];
}

std::vector<TuningPlan> plan_tunings(const PlanInput& in_arg) {
  std::vector<TuningPlan> out;
  PlanInput decode;
  const PlanInput& in = mode_input(in_arg, decode);
  if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
  std::vector<std::int64_t> cu;  // built once a strategy has tunings to price (a2a alone has)
  std::optional<SharedDocuments> shared;
  for (const Strategy* strategy : strategies()) {
    const CpConfig plain{std::string(strategy->name()), {}, in.causal, std::nullopt};
    if (strategy->tunings(plain, in.cp, in.kv_heads).empty()) continue;
    if (!shared) cu = documents_cu(in), shared.emplace(cu);
    const Tunings t = tunings_on(in, plain, cu);
    if (t.best < 0) continue;
    const PlanRow& best = t.rows[std::size_t(t.best)];
    out.push_back({t.configs[std::size_t(t.best)], exposed_s(best), exposed_s(t.rows.front())});
  }
  return out;
}

namespace {

// A rank's work is counted exactly, batch x its query heads x visible (query, key) pairs, in int64
// (Strategy::work), and each chunk's pairs in closed forms with products of twice its queries by
// the most keys one sees: past 64 bits they wrap and the compute comes out wrong (0 at s = 2^31 on
// 32 heads) with no sign of it. "" when they fit: a query sees at most the keys a window leaves
// it, or its document's, and under a causal mask over its own keys half of them on average; a
// rank of cp > 1 holds at most 4/cp of the work (the busiest contiguous rank 2x the mean, heads
// rounded up to a rank at most 2x), and a decode's time to first token prices the prompt on one
// rank. Documents are scanned only when the rest does not already prove it (millions of them).
std::string work_size_error(const PlanInput& in) {
  const double queries = double(in.seq), ranks = in.mode == PlanMode::decode ? 1.0 : double(in.cp);
  const double share = std::min(1.0, 4 / ranks);
  double most = double(kv_seq_of(in));
  const std::int64_t right = in.causal ? 0 : in.window_right;
  if (in.window_left >= 0 && right >= 0) most = std::min(most, double(in.window_left) + double(right) + 1);
  const bool triangle = in.causal && !in.q_offset && kv_seq_of(in) == in.seq;
  auto fits = [&](double keys) {
    constexpr double kLimit = 9.2e18;  // below 2^63
    const double mean = triangle ? std::min(keys, (queries + 1) / 2) : keys;
    return 2 * queries * keys < kLimit && share * double(in.batch) * double(in.heads) * queries * mean < kLimit;
  };
  if (fits(most)) return "";
  if (!in.documents.empty()) most = std::min(most, double(*std::max_element(in.documents.begin(), in.documents.end())));
  if (fits(most)) return "";
  return fmt::format(
      "the problem is too large to plan: a rank's work (batch x heads x queries x the keys each sees, up to {} x {} "
      "x {} x {:.0f} over {} rank(s)) does not fit 64 bits (shorten --seq, or bound the keys with --window or --docs)",
      in.batch, in.heads, in.seq, most, ranks);
}

}  // namespace

std::string plan_input_error(const PlanInput& in) {
  for (auto [name, v] : {std::pair{"seq", in.seq},
                         {"batch", in.batch},
                         {"heads", in.heads},
                         {"kv_heads", in.kv_heads},
                         {"head_dim", in.head_dim},
                         {"layers", in.layers},
                         {"cp", std::int64_t(in.cp)},
                         {"ranks_per_node", std::int64_t(in.cluster.ranks_per_node)}})
    if (v <= 0) return fmt::format("{} must be positive, got {}", name, v);
  if (in.kv_seq < 0) return fmt::format("kv_seq must be positive (or 0: seq), got {}", in.kv_seq);
  if (in.cp > kMaxPlanRanks) return fmt::format("cp must be at most {}, got {}", kMaxPlanRanks, in.cp);
  for (auto [side, w] : {std::pair{"left", in.window_left}, {"right", in.window_right}})
    if (w < -1) return fmt::format("window_{} must be -1 (unbounded) or >= 0, got {}", side, w);
  std::int64_t n = 0;
  if (__builtin_mul_overflow(in.batch, std::int64_t(64), &n) ||
      __builtin_mul_overflow(n, std::max(in.seq, in.kv_seq), &n) ||
      __builtin_mul_overflow(n, std::max(in.heads, in.kv_heads), &n) || __builtin_mul_overflow(n, in.head_dim, &n) ||
      __builtin_mul_overflow(n, in.layers, &n))
    return fmt::format(
        "the problem is too large to plan: batch x seq x heads x head_dim x layers = {} x {} x {} x {} x {} "
        "does not fit 64 bits with room for byte counts",
        in.batch, in.seq, in.heads, in.head_dim, in.layers);
  if (std::string err = work_size_error(in); !err.empty()) return err;
  if (in.causal && kv_seq_of(in) != in.seq && !in.q_offset)
    return fmt::format(
        "cross-attention with a causal mask needs q_offset (the key position of query 0): k/v hold "
        "s_k = {} tokens, q holds s = {}",
        kv_seq_of(in), in.seq);
  if (std::int64_t end; in.q_offset && __builtin_add_overflow(*in.q_offset, in.seq, &end))
    return fmt::format("q_offset {} + seq {} passes the largest position (int64)", *in.q_offset, in.seq);
  if (in.heads % in.kv_heads != 0)
    return fmt::format("heads ({}) must be divisible by kv_heads ({})", in.heads, in.kv_heads);
  if (!(in.max_memory_bytes >= 0) || !std::isfinite(in.max_memory_bytes))
    return "the memory cap must be 0 (none) or positive and finite";
  if (!(in.cluster.peak_flops > 0) || !(in.cluster.efficiency > 0) || in.cluster.efficiency > 1)
    return "the compute rate must be positive and the efficiency in (0, 1]";
  if (!std::isfinite(in.cluster.peak_flops))  // an infinite rate prices every step's compute at 0
    return fmt::format("the compute rate must be finite, got {} FLOP/s", in.cluster.peak_flops);
  // Below 1 FLOP/s a step's FLOPs over it pass a double's range (--efficiency 1e-300 priced inf).
  if (in.cluster.peak_flops * in.cluster.efficiency < 1)
    return fmt::format("the compute rate times the efficiency must be at least 1 FLOP/s, got {:.3g} x {:.3g}",
                       in.cluster.peak_flops, in.cluster.efficiency);
  return "";
}

namespace {

void check_input(const PlanInput& in) {
  if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
  check_documents(in);
}

}  // namespace

void check_plan_input(const PlanInput& in) {
  PlanInput decode;
  check_input(mode_input(in, decode));
  // A decode's time to first token plans the prompt itself (plan_decode): refused here, before
  // the decode table is printed, not after.
  if (in.mode == PlanMode::decode)
    if (const std::string err = plan_input_error(in); !err.empty()) throw Error(err);
}

namespace {

// A strategy's rows on a checked `in` whose documents' boundaries are `cu`.
std::vector<PlanRow> rows_of(const PlanInput& in, const Strategy& strategy, std::vector<std::int64_t>& cu,
                             RowDetail detail = RowDetail::all) {
  std::vector<PlanRow> rows;
  for (const CpConfig& cfg : strategy.plan_configs(in.cp, in.causal))
    rows.push_back(evaluate(in, strategy, cfg, cu, detail));
  return rows;
}

}  // namespace

std::vector<PlanRow> strategy_rows(const PlanInput& in, const Strategy& strategy, RowDetail detail) {
  check_input(in);
  std::vector<std::int64_t> cu = documents_cu(in);
  const SharedDocuments shared(cu);
  return rows_of(in, strategy, cu, detail);
}

CpConfig planned_config(const PlanInput& in, const PlanRow& row) {
  CpConfig c = row.config;
  if (in.mode != PlanMode::decode && !in.documents.empty()) c.cu_seqlens = cu_seqlens_of(in.documents);  // mode_input's
  return c;
}

namespace {

// The recommended row: the fastest, except that within the tie band a row with under 0.9x the
// memory wins when memory decides (then the first listed); -1 when nothing is valid.
int choose_best(const Plan& p, const TieBand& tie) {
  int best = -1;
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const PlanRow& r = p.rows[i];
    if (!r.valid) continue;
    if (best < 0) {
      best = int(i);
      continue;
    }
    const PlanRow& b = p.rows[std::size_t(best)];
    const bool faster = tie.memory_decides ? r.predicted_step_s < (1 - tie.band) * b.predicted_step_s
                                           : r.predicted_step_s < b.predicted_step_s;
    if (faster || (tie.memory_decides && r.predicted_step_s < (1 + tie.band) * b.predicted_step_s &&
                   r.memory_bytes < 0.9 * b.memory_bytes))
      best = int(i);
  }
  return best;
}

// The runner-up `n` against the recommended `b`: a tie inside the band, saying what decided it
// (the predicted faster, and the term that makes it so; memory, with both rows' working sets; the
// first listed), or the term that separates them.
std::string runner_up_note(const PlanInput& in, const TieBand& tie, const PlanRow& b, const PlanRow& n) {
  const double diff = 100 * (n.predicted_step_s / b.predicted_step_s - 1);
  if (std::abs(diff) >= 100 * tie.band)
    return fmt::format("; next: {} ({:+.1f}%, decided by {})", n.name, diff, deciding_term(in, b, n));
  const std::string band = tie.source.empty()
                               ? fmt::format("{:.0f}%, the model's error", 100 * tie.band)
                               : fmt::format("{:.1f}%, the model's error {}", 100 * tie.band, tie.source);
  std::string decided;
  if (b.predicted_step_s < n.predicted_step_s)
    decided = "the predicted faster wins, by " + deciding_term(in, b, n);
  else if (b.predicted_step_s == n.predicted_step_s)
    decided = "equal predictions: the first listed wins";
  else if (tie.memory_decides && b.memory_bytes < 0.9 * n.memory_bytes)
    decided =
        fmt::format("memory decides: {:.4g} MB per rank against {:.4g} MB, for {:+.1f}% predicted time",
                    b.memory_bytes / 1e6, n.memory_bytes / 1e6, 100 * (b.predicted_step_s / n.predicted_step_s - 1));
  else
    decided = "the first listed, simpler wins";
  if (!tie.memory_decides) decided += "; memory does not decide";
  return fmt::format("; {} is within {} (a tie: {})", n.name, band, decided);
}

}  // namespace

Plan make_plan(const PlanInput& in) {
  TieBand tie;
  tie.memory_decides = in.max_memory_bytes > 0;
  return make_plan(in, tie);
}

Plan make_plan(const PlanInput& in_arg, const TieBand& tie) {
  check_tie_band(tie);
  Plan p;
  PlanInput decode;
  const PlanInput& in = mode_input(in_arg, decode);
  check_input(in);
  std::vector<std::int64_t> cu = documents_cu(in);
  const SharedDocuments shared(cu);
  for (const Strategy* strategy : strategies()) {
    std::vector<PlanRow> rows = rows_of(in, *strategy, cu);
    if (const PlanRow* twin = rows.size() == 1 ? &rows.front() : nullptr; twin && twin->valid)
      if (std::optional<PlanRow> c = contiguous_twin(in, *strategy, *twin, cu)) rows.push_back(std::move(*c));
    p.rows.insert(p.rows.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
  }
  const int refused = refuse_by_memory(in, p);
  p.best = choose_best(p, tie);
  if (p.best < 0) {
    p.recommendation = "no strategy is valid for this shape: " + invalid_reasons(p);
    return p;
  }
  if (refused > 0)
    p.recommendation = fmt::format("memory decides: {} row(s) over the cap of {:.4g} MB per rank refused; ", refused,
                                   in.max_memory_bytes / 1e6);
  const PlanRow& b = p.rows[std::size_t(p.best)];
  const double exposed = b.comm_s - b.hidden_s;
  p.recommendation += fmt::format(
      "{}: {:.3g} s per step, {:.0f}% of it attention compute; {:.3g} ms of communication "
      "per layer, {:.0f}% hidden",
      b.name, b.predicted_step_s, 100 * b.compute_s / (b.compute_s + exposed), b.comm_s * 1e3,
      b.comm_s > 0 ? 100 * b.hidden_s / b.comm_s : 100.0);
  // The default strategy, when it cannot run, says why (what a user who set nothing expected).
  if (const PlanRow* d = row_named(p, CpConfig().cp_comm_type); d && !d->valid)
    p.recommendation += fmt::format("; {} is ruled out: {}", d->name, d->reason);
  int second = -1;
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (int(i) != p.best && p.rows[i].valid &&
        (second < 0 || p.rows[i].predicted_step_s < p.rows[std::size_t(second)].predicted_step_s))
      second = int(i);
  if (!in.documents.empty()) p.recommendation += balance_note(p);
  if (second >= 0) p.recommendation += runner_up_note(in, tie, b, p.rows[std::size_t(second)]);
  return p;
}

void check_tie_band(const TieBand& tie) {
  // 1 or more is a model no better than a guess: every pair ties (a loaded machine measures so).
  if (!std::isfinite(tie.band) || tie.band < 0)
    throw Error(fmt::format("the tie band must be finite and not negative, got {}", tie.band));
}

MeasuredBand measured_tie_band(const std::vector<std::vector<ValidatedRow>>& shapes) {
  std::vector<double> errors;
  for (const std::vector<ValidatedRow>& rows : shapes) {
    std::vector<const ValidatedRow*> run;
    for (const ValidatedRow& r : rows) {
      if (r.measured_s <= 0) continue;  // not run (an invalid row)
      if (!std::isfinite(r.measured_s) || !(r.predicted_s > 0) || !std::isfinite(r.predicted_s))
        throw Error(fmt::format("a measured row needs positive, finite seconds: predicted {}, measured {}",
                                r.predicted_s, r.measured_s));
      run.push_back(&r);
    }
    for (std::size_t i = 0; i < run.size(); ++i)
      for (std::size_t j = i + 1; j < run.size(); ++j) {
        const double x = (run[i]->predicted_s / run[j]->predicted_s) / (run[i]->measured_s / run[j]->measured_s);
        errors.push_back(std::max(x, 1 / x) - 1);
      }
  }
  if (errors.empty()) return {};
  const std::size_t mid = errors.size() / 2;
  std::nth_element(errors.begin(), errors.begin() + std::ptrdiff_t(mid), errors.end());
  double median = errors[mid];
  if (errors.size() % 2 == 0)
    median = (median + *std::max_element(errors.begin(), errors.begin() + std::ptrdiff_t(mid))) / 2;
  return {median, int(errors.size())};
}

TieBand calibrated_tie_band(const MeasuredBand& measured, const std::string& where, bool memory_capped) {
  if (measured.pairs <= 0) return {kPlanTieBand, "", memory_capped};
  TieBand t{measured.band,
            fmt::format("on this machine: the median over {} pairs of strategies measured {} of how far their "
                        "predicted ratio is from the measured one",
                        measured.pairs, where),
            memory_capped};
  check_tie_band(t);
  return t;
}

}  // namespace ulysses
