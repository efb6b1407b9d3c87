// The strategy registry, the defaults of the Strategy interface, and CpGroup.
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "strategies/builtin.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/cp/token_layout.hpp"
#include "ulysses/cp/ulysses_heads.hpp"

namespace ulysses {

namespace {

std::vector<std::unique_ptr<Strategy>>& registry() {
  static std::vector<std::unique_ptr<Strategy>> r = [] {
    std::vector<std::unique_ptr<Strategy>> built_in;
    built_in.push_back(make_a2a_strategy());  // one line per built-in strategy, in help order
    built_in.push_back(make_p2p_strategy());
    built_in.push_back(make_all_gather_strategy());
    built_in.push_back(make_a2a_p2p_strategy());
    return built_in;
  }();
  return r;
}

}  // namespace

std::vector<const Strategy*> strategies() {
  std::vector<const Strategy*> out;
  for (const auto& s : registry()) out.push_back(s.get());
  return out;
}

std::string strategy_names(std::string_view separator) {
  std::string out;
  for (const auto& s : registry()) out += (out.empty() ? "" : std::string(separator)) + std::string(s->name());
  return out;
}

const Strategy& find_strategy(std::string_view name) {
  for (const auto& s : registry())
    if (s->name() == name) return *s;
  std::string known = strategy_names(", ");
  if (const std::size_t last = known.rfind(", "); last != std::string::npos) known.replace(last, 2, " or ");
  throw Error(fmt::format("unknown cp_comm_type '{}': expected {}", name.substr(0, 40), known));
}

void register_strategy(std::unique_ptr<Strategy> strategy) {
  if (!strategy) throw Error("register_strategy: null strategy");
  for (const auto& s : registry())
    if (s->name() == strategy->name())
      throw Error(fmt::format("register_strategy: cp_comm_type '{}' is already registered", strategy->name()));
  registry().push_back(std::move(strategy));
}

void Strategy::validate(const CpConfig&, int, const Shape& q, std::int64_t kv_heads) const {
  check_gqa_groups(q.h, kv_heads);
}

void Strategy::validate_heads(const CpConfig&, int, std::int64_t, std::int64_t) const {}

CpConfig Strategy::config_for_size(const CpConfig& config, int) const { return config; }

RankHeads Strategy::heads_of(const CpConfig&, int, int, std::int64_t heads, std::int64_t kv_heads) const {
  return {{0, heads}, {0, kv_heads}};
}

TokenLayout Strategy::token_layout(const CpConfig& c) const {
  const TokenLayout layout = c.causal && c.zigzag && !c.q_offset ? TokenLayout::zigzag : TokenLayout::contiguous;
  return traits_.per_document_zigzag ? per_document_layout(layout, c) : layout;
}

bool is_cross(const CpConfig& config, std::int64_t q_seq, std::int64_t kv_seq) {
  return kv_seq != q_seq || config.q_offset.has_value();
}

bool is_cross(const CpConfig& config, const std::vector<std::vector<SeqChunk>>& q_chunks,
              const std::vector<std::vector<SeqChunk>>& kv_chunks) {
  auto length = [](const std::vector<std::vector<SeqChunk>>& chunks) {
    std::int64_t n = 0;
    for (const auto& c : chunks) n += total_tokens(c);
    return n;
  };
  return is_cross(config, length(q_chunks), length(kv_chunks));
}

std::int64_t Strategy::work(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                            std::int64_t kv_heads) const {
  const AttentionParams params = attention_params(config);
  std::int64_t pairs = 0;
  for (const SeqChunk& c : rank_chunks(config, cp, rank, q.s))
    pairs += visible_pairs(params, {params.q_offset + c.begin, c.length}, {0, kv_seq});
  return pairs * q.b * heads_of(config, cp, rank, q.h, kv_heads).q.count;
}

Strategy::TrafficKey Strategy::traffic_key(const CpConfig&, int, int rank, const Shape&, std::int64_t,
                                           std::int64_t) const {
  return {rank};
}

std::vector<Strategy::TrafficKey> Strategy::traffic_keys(const CpConfig& config, int cp, const Shape& q,
                                                         std::int64_t kv_seq, std::int64_t kv_heads) const {
  std::vector<TrafficKey> keys(std::size_t(std::max(cp, 0)));
  for (int r = 0; r < cp; ++r) keys[std::size_t(r)] = traffic_key(config, cp, r, q, kv_seq, kv_heads);
  return keys;
}

CommVolume Strategy::keyed_traffic(const CpConfig& config, int cp, int rank, const TrafficKey&, const Shape& q,
                                   std::int64_t kv_seq, std::int64_t kv_heads, DType dtype) const {
  return traffic(config, cp, rank, q, kv_seq, kv_heads, dtype);
}

namespace {

// The last whole document's length and its visible pairs against all the keys, and where the
// last chunk ended (the index of the boundary ending its document).
struct WholeDocument {
  std::int64_t length = -1, pairs = 0;
  std::size_t next = 0;
};

// visible_pairs of the queries `q` against all `seq` keys of `config`'s documents (no q_offset):
// a document wholly in `q` sees only its own keys, so it has the pairs of any other whole one of
// its length, and a run of equal lengths costs a comparison a document, not visible_pairs' walk.
std::int64_t pairs_against_all(const CpConfig& config, const SeqChunk& q, std::int64_t seq, WholeDocument& last,
                               std::size_t& cursor) {
  const std::vector<std::int64_t>& cu = config.cu_seqlens;
  const Window w{config.window_left, config.window_right};
  const std::int64_t end = q.begin + q.length;
  // The document holding p is [cu[i − 1], cu[i]): from the last chunk's, a search when q lies
  // before it (zigzag's mirror chunks) or far after it.
  std::size_t& i = last.next;
  if (i == 0 || cu[i - 1] > q.begin || q.begin - cu[i - 1] > q.length)
    i = std::size_t(std::upper_bound(cu.begin(), cu.end(), q.begin) - cu.begin());
  while (cu[i] <= q.begin) ++i;
  std::int64_t n = 0;
  for (std::int64_t p = q.begin; p < end;) {
    if (p == cu[i - 1] && cu[i] <= end) {  // whole: it and the next ones of its length in q
      if (cu[i] - p != last.length)
        last.length = cu[i] - p, last.pairs = visible_pairs(cu, config.causal, {p, cu[i] - p}, {0, seq}, w, cursor);
      std::size_t j = i + 1;
      while (j < cu.size() && cu[j] <= end && cu[j] - cu[j - 1] == last.length) ++j;
      n += std::int64_t(j - i) * last.pairs;
      p = cu[j - 1], i = j;
    } else {
      const std::int64_t to = std::min(cu[i], end);
      n += visible_pairs(cu, config.causal, {p, to - p}, {0, seq}, w, cursor);
      p = to;
    }
    while (i < cu.size() && cu[i] <= p) ++i;  // past empty documents
  }
  return n;
}

std::vector<std::int64_t> computed_pairs(const CpConfig& config, int cp, std::int64_t seq, std::int64_t kv_seq) {
  if (config.causal && !config.q_offset && kv_seq == seq && token_layout(config) == TokenLayout::per_document)
    return per_document_pairs(config, cp, seq);
  // The mask from the config: attention_params would copy the documents' boundaries.
  const std::int64_t q_offset = config.q_offset.value_or(0);
  std::vector<std::int64_t> pairs(std::size_t(std::max(cp, 0)));
  std::size_t cursor = 0;  // the chunks come in position order under per-document zigzag
  if (!config.q_offset && kv_seq == seq && !config.cu_seqlens.empty() &&
      token_layout(config) != TokenLayout::per_document && documents_error(config, seq).empty()) {
    WholeDocument last;  // a rank's chunk or two (contiguous, zigzag) over many documents
    for_each_rank_chunk(config, cp, seq, [&](int r, const SeqChunk& c) {
      pairs[std::size_t(r)] += pairs_against_all(config, c, seq, last, cursor);
    });
    return pairs;
  }
  for_each_rank_chunk(config, cp, seq, [&](int r, const SeqChunk& c) {
    pairs[std::size_t(r)] += visible_pairs(config.cu_seqlens, config.causal, {q_offset + c.begin, c.length},
                                           {0, kv_seq}, {config.window_left, config.window_right}, cursor);
  });
  return pairs;
}

}  // namespace

std::vector<std::int64_t> pairs_of_ranks(const CpConfig& config, int cp, std::int64_t seq, std::int64_t kv_seq) {
  // Shared between the rows of a plan: the key holds every input of computed_pairs but the
  // documents (so a key found was computed without throwing: its checks read only the key).
  if (SharedDocuments* shared = SharedDocuments::of(config)) {
    const SharedDocuments::Key key{1,
                                   std::int64_t(token_layout(config)),
                                   cp,
                                   seq,
                                   kv_seq,
                                   config.causal,
                                   config.q_offset.has_value(),
                                   config.q_offset.value_or(0),
                                   config.window_left,
                                   config.window_right};
    return shared->counts(key, [&] { return computed_pairs(config, cp, seq, kv_seq); });
  }
  return computed_pairs(config, cp, seq, kv_seq);
}

std::vector<std::int64_t> Strategy::work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                                  std::int64_t kv_heads) const {
  std::vector<std::int64_t> w(std::size_t(std::max(cp, 0)));
  for (int r = 0; r < cp; ++r) w[std::size_t(r)] = work(config, cp, r, q, kv_seq, kv_heads);
  return w;
}

StrategyMemory Strategy::memory(const CpConfig&, int cp, const Shape& q, std::int64_t kv_seq, std::int64_t kv_heads,
                                DType dtype) const {
  const double es = double(dtype_size(dtype)), d = double(q.d);
  const double tokens = double(q.b) * double((q.s + cp - 1) / cp),
               kv_tokens = double(q.b) * double((kv_seq + cp - 1) / cp);
  const double kv = es * 2 * kv_tokens * double(kv_heads) * d;  // this rank's K and V
  const double out = 4 * tokens * double(q.h) * (d + 1);        // out and lse, float32
  const double kept = es * tokens * double(q.h) * d + kv + out;
  return {kept + 3 * kv + out, kept, 3.5 * kept};
}

double planned_memory_bytes(const Strategy& strategy, const PlanInput& in, const CpConfig& config) {
  const double tokens = double(busiest_tokens(in)), kv_tokens = double(busiest_kv_tokens(in));
  const double caller = 2 * (tokens * double(in.heads) + kv_tokens * double(in.kv_heads)) * double(in.batch) *
                        double(in.head_dim) * double(dtype_size(in.dtype));  // q, out; k, v
  const Shape q{in.batch, in.seq, in.heads, in.head_dim};
  return caller + strategy.memory(config, in.cp, q, kv_seq_of(in), in.kv_heads, in.dtype).forward;
}

std::string Strategy::describe(const CpConfig&, int, std::int64_t) const { return ""; }

std::vector<CpConfig> Strategy::tunings(const CpConfig&, int, std::int64_t) const { return {}; }

std::vector<std::int64_t> option_value(const StrategyOption& option, const CpConfig& config) {
  if (option.get) return option.get(config);
  const auto it = config.options.find(option.flag);
  return it == config.options.end() ? std::vector<std::int64_t>() : it->second;
}

std::string option_values_error(const StrategyOption& o, const std::vector<std::int64_t>& values) {
  const std::size_t count = std::size_t(std::count(o.metavar.begin(), o.metavar.end(), ',')) + 1;
  const std::int64_t most = o.most > 0 ? o.most : std::numeric_limits<int>::max();
  const bool ok = values.size() == count &&
                  std::all_of(values.begin(), values.end(), [&](std::int64_t v) { return v >= o.least && v <= most; });
  if (ok) return "";
  const std::string what = o.least == 1 ? "positive integer" : fmt::format("integer in [{}, {}]", o.least, most);
  static const char* const counts[] = {"", "two ", "three "};
  const std::string n = count == 1   ? (o.least == 1 ? "a " : "an ")
                        : count <= 3 ? counts[count - 1]
                                     : fmt::format("{} ", count);
  return fmt::format("must be {} ({}{}{}{})", o.metavar, n, what, count == 1 ? "" : "s",
                     o.most > 0 && o.least == 1 ? fmt::format(", at most {}", o.most) : "");
}

void set_option(const StrategyOption& option, CpConfig& config, const std::vector<std::int64_t>& values) {
  if (const std::string e = option_values_error(option, values); !e.empty())
    throw Error(fmt::format("{} {}, got [{}]", option.name, e, fmt::join(values, ", ")));
  if (option.set)
    option.set(config, values);
  else
    config.options[option.flag] = values;
}

std::vector<CpConfig> Strategy::plan_configs(int, bool causal) const {
  return {CpConfig{std::string(name()), {}, causal, std::nullopt}};
}

std::string Strategy::config_name(const CpConfig&) const { return std::string(name()); }

Communicator& CpGroup::subgroup(const std::string& name, int color, int key) {
  for (auto& [n, c] : subgroups_)
    if (n == name) return *c;
  subgroups_.emplace_back(name, comm_.split(color, key));
  subgroups_.back().second->trace_through(comm_, name);  // on comm()'s timeline, as "<name>.<op>"
  return *subgroups_.back().second;
}

void CpGroup::absorb() {
  for (auto& [name, c] : subgroups_) comm_.absorb_counters(*c, name);
}

}  // namespace ulysses
