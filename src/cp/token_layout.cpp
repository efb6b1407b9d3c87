#include "ulysses/cp/token_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "../core/enum_names.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses {

TokenLayout token_layout(const CpConfig& c) { return find_strategy(c.cp_comm_type).token_layout(c); }

bool uses_zigzag(const CpConfig& c) { return token_layout(c) != TokenLayout::contiguous; }

constexpr EnumName<TokenLayout> kLayoutNames[] = {{TokenLayout::contiguous, "contiguous"},
                                                  {TokenLayout::zigzag, "zigzag"},
                                                  {TokenLayout::per_document, "per-document zigzag"}};

const char* layout_name(TokenLayout layout) { return enum_name(kLayoutNames, layout); }

TokenLayout per_document_layout(TokenLayout layout, const CpConfig& c) {
  return layout == TokenLayout::zigzag && c.per_document && !c.cu_seqlens.empty() ? TokenLayout::per_document : layout;
}

namespace {

thread_local SharedDocuments* innermost_documents = nullptr;
// The last number given by documents_generation or to a scope: one count for both, so that a
// scope's number is never an earlier one of other boundaries.
thread_local std::uint64_t last_generation = 0;

}  // namespace

SharedDocuments::SharedDocuments(const std::vector<std::int64_t>& cu)
    : data_(cu.data()), size_(cu.size()), outer_(innermost_documents), generation_(++last_generation) {
  innermost_documents = this;
}

SharedDocuments::~SharedDocuments() { innermost_documents = outer_; }

SharedDocuments* SharedDocuments::of(const CpConfig& config) {
  SharedDocuments* s = innermost_documents;
  if (s == nullptr) return nullptr;
  // A scope without documents serves the configs without them: the rows of a plan share its
  // ranks' tokens and pairs as well (a2a+p2p's factorisations of one size, the strategies of
  // one layout), which a plan over many lengths asks for every (length, size).
  if (config.cu_seqlens.empty()) return s->size_ == 0 ? s : nullptr;
  const bool held = config.cu_seqlens.data() == s->data_ && config.cu_seqlens.size() == s->size_;
  return held ? s : nullptr;
}

const std::string& SharedDocuments::error(std::int64_t seq) {
  const auto it = errors_.find(seq);
  if (it != errors_.end()) return it->second;
  return errors_[seq] = cu_seqlens_error({data_, size_}, seq);
}

const std::vector<std::int64_t>& SharedDocuments::counts(const Key& key,
                                                         const std::function<std::vector<std::int64_t>()>& compute) {
  const auto it = counts_.find(key);
  if (it != counts_.end()) return it->second;
  return counts_[key] = compute();
}

std::uint64_t documents_generation(const CpConfig& config) {
  if (const SharedDocuments* shared = SharedDocuments::of(config)) return shared->generation();
  struct Seen {
    std::vector<std::int64_t> cu;
    std::uint64_t generation = 0;
  };
  thread_local Seen seen;
  if (seen.generation == 0 || seen.cu != config.cu_seqlens)
    seen.cu = config.cu_seqlens, seen.generation = ++last_generation;
  return seen.generation;
}

std::string documents_error(const CpConfig& config, std::int64_t seq) {
  if (SharedDocuments* shared = SharedDocuments::of(config)) return shared->error(seq);
  return cu_seqlens_error(config.cu_seqlens, seq);
}

namespace {

SeqChunk chunk(const HeadRange& r) { return {r.first, r.count}; }

// The layout of `config` for `seq` tokens on cp ranks. Throws Error unless every rank gets at
// least one token (plain zigzag: two chunks of at least one) and per-document cu_seqlens cut seq.
TokenLayout checked_layout(const CpConfig& config, int cp, std::int64_t seq) {
  const TokenLayout layout = token_layout(config);
  if (layout != TokenLayout::zigzag && seq < cp)
    throw Error(
        fmt::format("sequence length ({}) must be at least cp ({}): every rank holds at least one token", seq, cp));
  if (layout == TokenLayout::zigzag && seq < 2 * std::int64_t(cp))
    throw Error(
        fmt::format("sequence length ({}) must be at least 2*cp ({}) for cp_comm_type {} with a causal "
                    "mask: the zigzag layout cuts it into 2*cp chunks of at least one token",
                    seq, 2 * std::int64_t(cp), config.cp_comm_type));
  if (layout == TokenLayout::per_document)
    if (const std::string e = documents_error(config, seq); !e.empty()) throw Error(e);
  return layout;
}

// How many ranks of [lo, hi) lie in the cyclic run of `count` ranks from `first` (mod cp).
std::int64_t in_run(std::int64_t cp, std::int64_t first, std::int64_t count, std::int64_t lo, std::int64_t hi) {
  auto overlap = [&](std::int64_t a, std::int64_t b) {
    return std::max<std::int64_t>(0, std::min(b, hi) - std::max(a, lo));
  };
  return overlap(first, std::min(first + count, cp)) + overlap(0, first + count - cp);
}

// One document's cut under per-document zigzag: chunks of `base` tokens, one longer for the
// ranks of the run `heads` (their first chunk) and of the run `tails` (their mirror chunk).
struct DocumentCut {
  std::int64_t begin, base;
  std::int64_t heads_first, heads, tails_first, tails;
};

// Calls f(cut) for every document in order. The longer chunks are dealt so that the ranks
// ahead by one token always form the cyclic run [backward, forward): first chunks forward
// from `forward`, mirror chunks backward from `backward` − 1 (one document alone is zigzag).
template <typename F>
void for_each_document_cut(const std::vector<std::int64_t>& cu, int cp, F&& f) {
  const std::int64_t parts = 2 * std::int64_t(cp);
  std::int64_t forward = 0, backward = 0;
  for (std::size_t i = 1; i < cu.size(); ++i) {
    const std::int64_t n = cu[i] - cu[i - 1], heads = std::min<std::int64_t>(n % parts, cp), tails = n % parts - heads;
    const DocumentCut cut{cu[i - 1], n / parts, forward, heads, (backward - tails + cp) % cp, tails};
    f(cut);
    forward = (forward + heads) % cp;
    backward = cut.tails_first;
  }
}

// Documents of one length one after another, `count` of them, the first cut as `first`: each
// next one cut alike, its longer chunks' runs moved on by the last one's (nth_cut).
struct DocumentRun {
  DocumentCut first;
  std::int64_t count, length;
};

// The j-th document of `run`: for_each_document_cut's cut of it.
DocumentCut nth_cut(const DocumentRun& run, std::int64_t j, std::int64_t cp) {
  const DocumentCut& d = run.first;
  const std::int64_t laps = j % cp;  // the runs move by heads (tails) a document, mod cp
  return {d.begin + j * run.length,
          d.base,
          (d.heads_first + laps * d.heads) % cp,
          d.heads,
          ((d.tails_first - laps * d.tails) % cp + cp) % cp,
          d.tails};
}

// for_each_document_cut a run of equal lengths at a time: f(run) for every maximal run, in order.
// 16M one-token documents (--docs 16777216x1) are one run, whose ranks' counts cost O(cp).
template <typename F>
void for_each_document_run(const std::vector<std::int64_t>& cu, int cp, F&& f) {
  const std::int64_t parts = 2 * std::int64_t(cp);
  std::int64_t forward = 0, backward = 0;
  for (std::size_t i = 1; i < cu.size();) {
    const std::int64_t n = cu[i] - cu[i - 1], heads = std::min<std::int64_t>(n % parts, cp), tails = n % parts - heads;
    std::size_t j = i + 1;
    while (j < cu.size() && cu[j] - cu[j - 1] == n) ++j;
    const std::int64_t count = std::int64_t(j - i), laps = count % cp;
    f(DocumentRun{{cu[i - 1], n / parts, forward, heads, (backward - tails + cp) % cp, tails}, count, n});
    forward = (forward + laps * heads) % cp;
    backward = ((backward - laps * tails) % cp + cp) % cp;
    i = j;
  }
}

// Rank `rank`'s chunks of every document: chunk `rank` after the first chunks of the ranks
// below it, chunk 2·cp−1−rank after all first chunks and the mirror chunks of the ranks above.
std::vector<SeqChunk> per_document_chunks(const std::vector<std::int64_t>& cu, int cp, int rank) {
  std::vector<SeqChunk> out;
  auto add = [&](std::int64_t begin, std::int64_t length) {
    if (length == 0) return;
    if (!out.empty() && out.back().begin + out.back().length == begin)
      out.back().length += length;  // adjacent: one chunk, one kernel call
    else
      out.push_back({begin, length});
  };
  const std::int64_t r = rank, parts = 2 * std::int64_t(cp);
  for_each_document_cut(cu, cp, [&](const DocumentCut& d) {
    add(d.begin + r * d.base + in_run(cp, d.heads_first, d.heads, 0, r),
        d.base + in_run(cp, d.heads_first, d.heads, r, r + 1));
    add(d.begin + (parts - 1 - r) * d.base + d.heads + in_run(cp, d.tails_first, d.tails, r + 1, cp),
        d.base + in_run(cp, d.tails_first, d.tails, r, r + 1));
  });
  return out;
}

// Items in parts [first, first + count) of even_part(n, parts, ·), which lie back to back.
std::int64_t items_in_parts(std::int64_t n, std::int64_t parts, std::int64_t first, std::int64_t count) {
  if (count == 0) return 0;
  const HeadRange last = even_part(n, parts, first + count - 1);
  return last.first + last.count - even_part(n, parts, first).first;
}

// rank_chunks and tokens_held under a layout checked_layout returned: the functions over every
// rank check once, not a rank (the planner asks all cp ranks of every row it prices).
std::vector<SeqChunk> chunks_in(TokenLayout layout, const CpConfig& config, int cp, int rank, std::int64_t seq) {
  if (layout == TokenLayout::contiguous) return {chunk(even_part(seq, cp, rank))};
  if (layout == TokenLayout::per_document) return per_document_chunks(config.cu_seqlens, cp, rank);
  const std::int64_t parts = 2 * std::int64_t(cp);
  return {chunk(even_part(seq, parts, rank)), chunk(even_part(seq, parts, parts - 1 - rank))};
}

std::int64_t held_in(TokenLayout layout, const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq) {
  if (layout == TokenLayout::contiguous) return items_in_parts(seq, cp, first_rank, ranks);
  if (layout == TokenLayout::per_document) {
    std::int64_t n = 0;
    const std::int64_t lo = first_rank, hi = first_rank + ranks;
    for_each_document_cut(config.cu_seqlens, cp, [&](const DocumentCut& d) {
      n += 2 * d.base * ranks + in_run(cp, d.heads_first, d.heads, lo, hi) + in_run(cp, d.tails_first, d.tails, lo, hi);
    });
    return n;
  }
  // Chunks [first, first + ranks) and their mirror images [2cp − first − ranks, 2cp − first).
  const std::int64_t parts = 2 * std::int64_t(cp);
  return items_in_parts(seq, parts, first_rank, ranks) + items_in_parts(seq, parts, parts - first_rank - ranks, ranks);
}

}  // namespace

std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq) {
  if (cp < 1 || rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in [0, cp = {})", rank, cp));
  return chunks_in(checked_layout(config, cp, seq), config, cp, rank, seq);
}

void check_rank_chunks(const CpConfig& config, int cp, std::int64_t seq) {
  if (cp < 1) throw Error(fmt::format("rank 0 is not in [0, cp = {})", cp));
  checked_layout(config, cp, seq);
}

std::int64_t tokens_held(const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq) {
  if (first_rank < 0 || ranks < 0 || first_rank > cp - ranks)
    throw Error(fmt::format("ranks [{}, {}) are not in [0, cp = {})", first_rank, first_rank + ranks, cp));
  return held_in(checked_layout(config, cp, seq), config, cp, first_rank, ranks, seq);
}

namespace {

// How many of the positions t in [0, n) of a cyclic sweep over cp ranks fall on ranks [lo, hi).
std::int64_t swept(std::int64_t n, std::int64_t cp, std::int64_t lo, std::int64_t hi) {
  return n / cp * (hi - lo) + std::max<std::int64_t>(0, std::min(hi, n % cp) - lo);
}

// Calls f(r) for the ranks of the cyclic run of `count` ranks from `first` (mod cp), rising or
// falling: the ranks that wrapped past cp − 1 are the lowest.
template <typename F>
void for_each_run_rank(std::int64_t cp, std::int64_t first, std::int64_t count, bool rising, F&& f) {
  const std::int64_t wrapped = std::max<std::int64_t>(0, first + count - cp), end = std::min(first + count, cp);
  if (rising) {
    for (std::int64_t r = 0; r < wrapped; ++r) f(r);
    for (std::int64_t r = first; r < end; ++r) f(r);
    return;
  }
  for (std::int64_t r = end; r-- > first;) f(r);
  for (std::int64_t r = wrapped; r-- > 0;) f(r);
}

}  // namespace

namespace {

// tokens_of_ranks under per-document zigzag: the longer chunks of consecutive documents continue
// each other's runs (for_each_document_cut): the first chunks' sweep forward from rank 0, the
// mirror chunks' backward from rank cp − 1. A run of equal lengths adds its count times one's.
std::vector<std::int64_t> per_document_tokens(const std::vector<std::int64_t>& cu, int cp) {
  std::int64_t base = 0, heads = 0, tails = 0;
  for_each_document_run(cu, cp, [&](const DocumentRun& run) {
    base += run.count * run.first.base;
    heads += run.count * run.first.heads;
    tails += run.count * run.first.tails;
  });
  std::vector<std::int64_t> n(static_cast<std::size_t>(cp));
  for (std::int64_t r = 0; r < cp; ++r)
    n[std::size_t(r)] = 2 * base + swept(heads, cp, r, r + 1) + swept(tails, cp, cp - 1 - r, cp - r);
  return n;
}

}  // namespace

std::vector<std::int64_t> tokens_of_ranks(const CpConfig& config, int cp, std::int64_t seq) {
  const TokenLayout layout = checked_layout(config, cp, seq);
  if (layout != TokenLayout::per_document) {
    auto compute = [&] {
      std::vector<std::int64_t> n(std::size_t(std::max(cp, 0)));
      for (int r = 0; r < cp; ++r) n[std::size_t(r)] = held_in(layout, config, cp, r, 1, seq);
      return n;
    };
    // Shared between the rows of a plan: the key is what is asked (2: tokens without documents),
    // the layout, cp and seq.
    if (SharedDocuments* shared = SharedDocuments::of(config))
      return shared->counts({2, std::int64_t(layout), cp, seq}, compute);
    return compute();
  }
  // Shared between the rows of a plan: the key is what is asked (0: tokens), cp and seq.
  if (SharedDocuments* shared = SharedDocuments::of(config))
    return shared->counts({0, cp, seq}, [&] { return per_document_tokens(config.cu_seqlens, cp); });
  return per_document_tokens(config.cu_seqlens, cp);
}

void for_each_rank_chunk(const CpConfig& config, int cp, std::int64_t seq,
                         const std::function<void(int, const SeqChunk&)>& f) {
  if (const TokenLayout layout = checked_layout(config, cp, seq); layout != TokenLayout::per_document) {
    for (int r = 0; r < cp; ++r)
      for (const SeqChunk& c : chunks_in(layout, config, cp, r, seq)) f(r, c);
    return;
  }
  const std::int64_t parts = 2 * std::int64_t(cp);
  for_each_document_cut(config.cu_seqlens, cp, [&](const DocumentCut& d) {
    // per_document_chunks' pieces of this document; with base 0 only the runs' ranks hold one.
    auto first = [&](std::int64_t r) {
      f(int(r), {d.begin + r * d.base + in_run(cp, d.heads_first, d.heads, 0, r),
                 d.base + in_run(cp, d.heads_first, d.heads, r, r + 1)});
    };
    auto mirror = [&](std::int64_t r) {
      f(int(r), {d.begin + (parts - 1 - r) * d.base + d.heads + in_run(cp, d.tails_first, d.tails, r + 1, cp),
                 d.base + in_run(cp, d.tails_first, d.tails, r, r + 1)});
    };
    // In position order: first chunks rise with the rank, mirror chunks fall.
    if (d.base > 0) {
      for (std::int64_t r = 0; r < cp; ++r) first(r);
      for (std::int64_t r = cp; r-- > 0;) mirror(r);
      return;
    }
    for_each_run_rank(cp, d.heads_first, d.heads, true, first);
    for_each_run_rank(cp, d.tails_first, d.tails, false, mirror);
  });
}

namespace {

// Calls f(member, chunk) for the members of `width` ranks along one document's ranks lo..hi − 1
// rising (or hi − 1..lo falling), whose chunks lie back to back from `begin`, chunk rank r
// starting at start(r) (rising: its first position; falling: one past its last): one
// chunk a member met.
template <typename Start, typename F>
void member_runs(std::int64_t lo, std::int64_t hi, std::int64_t width, bool rising, Start&& start, F&& f) {
  if (lo >= hi) return;
  const std::int64_t m_lo = lo / width, m_hi = (hi - 1) / width;
  for (std::int64_t i = 0; i <= m_hi - m_lo; ++i) {
    const std::int64_t m = rising ? m_lo + i : m_hi - i, a = std::max(lo, m * width), b = std::min(hi, (m + 1) * width);
    const std::int64_t x = rising ? start(a) : start(b), y = rising ? start(b) : start(a);
    f(int(m), SeqChunk{std::min(x, y), std::abs(y - x)});
  }
}

}  // namespace

void for_each_member_chunk(const CpConfig& config, int cp, int width, std::int64_t seq,
                           const std::function<void(int, const SeqChunk&)>& f) {
  if (checked_layout(config, cp, seq) != TokenLayout::per_document)
    return for_each_rank_chunk(config, cp, seq, [&](int r, const SeqChunk& c) { f(r / width, c); });
  const std::int64_t parts = 2 * std::int64_t(cp), w = width;
  for_each_document_cut(config.cu_seqlens, cp, [&](const DocumentCut& d) {
    // Where rank r's first chunk starts, and where its mirror chunk ends (ranks r..cp − 1's
    // mirror chunks lie below it): both as rank_chunks places them.
    auto first = [&](std::int64_t r) { return d.begin + r * d.base + in_run(cp, d.heads_first, d.heads, 0, r); };
    auto mirror_end = [&](std::int64_t r) {
      return d.begin + (parts - r) * d.base + d.heads + in_run(cp, d.tails_first, d.tails, r, cp);
    };
    if (d.base > 0) {
      member_runs(0, cp, w, true, first, f);
      member_runs(0, cp, w, false, mirror_end, f);
      return;
    }
    // One token a rank of the runs: ranks wrapped past cp − 1 come first rising, last falling.
    const std::int64_t hw = std::max<std::int64_t>(0, d.heads_first + d.heads - cp),
                       tw = std::max<std::int64_t>(0, d.tails_first + d.tails - cp);
    member_runs(0, hw, w, true, first, f);
    member_runs(d.heads_first, std::min<std::int64_t>(d.heads_first + d.heads, cp), w, true, first, f);
    member_runs(d.tails_first, std::min<std::int64_t>(d.tails_first + d.tails, cp), w, false, mirror_end, f);
    member_runs(0, tw, w, false, mirror_end, f);
  });
}

namespace {

// Per-rank sums of functions linear in the rank over runs of ranks: f(r) = a + b·r added on
// [lo, hi) in O(1), every rank's total read at the end in O(cp).
struct LinearSums {
  std::vector<std::int64_t> a, b;  // differences of the constant and the slope
  explicit LinearSums(int cp) : a(std::size_t(cp) + 1), b(std::size_t(cp) + 1) {}
  void add(std::int64_t lo, std::int64_t hi, std::int64_t a0, std::int64_t b0) {
    a[std::size_t(lo)] += a0, a[std::size_t(hi)] -= a0, b[std::size_t(lo)] += b0, b[std::size_t(hi)] -= b0;
  }
  void read_into(std::vector<std::int64_t>& out) const {
    std::int64_t x = 0, y = 0;
    for (std::size_t r = 0; r < out.size(); ++r) out[r] += (x += a[r]) + std::int64_t(r) * (y += b[r]);
  }
};

// A document's tokens [o0, o0 + count) (offsets in the document) on ranks r0, r0 + step, ...: adds
// f(o) = a + b·o over the offsets [lo, hi) of them, as a function of the rank.
// `times` such documents on the same ranks add `times` times as much.
struct TokenRun {
  std::int64_t o0, count, r0, step, times;
  void add(LinearSums& sums, std::int64_t lo, std::int64_t hi, std::int64_t a, std::int64_t b) const {
    lo = std::max(lo, o0), hi = std::min(hi, o0 + count);
    if (lo >= hi) return;
    const std::int64_t r_lo = r0 + step * (lo - o0), r_hi = r0 + step * (hi - 1 - o0);  // o = o0 + step·(r − r0)
    sums.add(std::min(r_lo, r_hi), std::max(r_lo, r_hi) + 1, times * (a + b * (o0 - step * r0)), times * b * step);
  }
};

// The keys a token at offset o of a document of n tokens sees under a causal mask: [max(0, o − L),
// o + 1) (a window unbounded or as long as the document: from 0), as linear pieces of o.
void add_token_pairs(LinearSums& sums, const TokenRun& run, std::int64_t n, std::int64_t left) {
  run.add(sums, 0, n, 1, 1);
  if (left >= 0 && left < n) run.add(sums, left + 1, n, left, -1);
}

// `times` documents of n tokens cut into single tokens (shorter than 2·cp) whose `count` chunks
// from offset o start at rank `first`: first chunks' tokens rise with the rank along the run
// (the ranks past cp − 1 wrapped to the front), mirror chunks' fall (for_each_run_rank's orders).
void add_chunk_tokens(LinearSums& sums, std::int64_t cp, std::int64_t first, std::int64_t count, std::int64_t o,
                      bool rising, std::int64_t n, std::int64_t left, std::int64_t times) {
  const std::int64_t wrapped = std::max<std::int64_t>(0, first + count - cp), end = std::min(first + count, cp);
  const TokenRun low = rising ? TokenRun{o, wrapped, 0, 1, times}
                              : TokenRun{o + end - first, wrapped, wrapped - 1, -1, times},
                 high = rising ? TokenRun{o + wrapped, end - first, first, 1, times}
                               : TokenRun{o, end - first, end - 1, -1, times};
  add_token_pairs(sums, low, n, left);
  add_token_pairs(sums, high, n, left);
}

// Calls f(rank, times) for the ranks (start + j·step) mod cp of j in [0, count), each once with
// how many j land on it: O(min(count, cp)), the ranks repeating every cp / gcd(step, cp).
template <typename F>
void for_each_orbit_rank(std::int64_t cp, std::int64_t start, std::int64_t step, std::int64_t count, F&& f) {
  const std::int64_t period = count > 1 ? cp / std::gcd(step, cp) : 1, laps = count / period, rest = count % period;
  std::int64_t r = start;
  for (std::int64_t j = 0; j < std::min(count, period); ++j, r = r + step >= cp ? r + step - cp : r + step)
    f(r, laps + (j < rest ? 1 : 0));
}

// A run of documents shorter than 2·cp: each document's first chunks start `heads` ranks on
// from the last one's, its mirror chunks `tails` ranks back; documents starting on the same
// rank add alike, so each such rank once, times how many start there.
void add_run_tokens(LinearSums& sums, const DocumentRun& run, std::int64_t cp, std::int64_t left) {
  const DocumentCut& d = run.first;
  if (d.heads > 0)
    for_each_orbit_rank(cp, d.heads_first, d.heads % cp, run.count, [&](std::int64_t first, std::int64_t times) {
      add_chunk_tokens(sums, cp, first, d.heads, 0, true, run.length, left, times);
    });
  if (d.tails > 0)
    for_each_orbit_rank(cp, d.tails_first, (cp - d.tails % cp) % cp, run.count,
                        [&](std::int64_t first, std::int64_t times) {
                          add_chunk_tokens(sums, cp, first, d.tails, d.heads, false, run.length, left, times);
                        });
}

}  // namespace

std::vector<std::int64_t> per_document_pairs(const CpConfig& config, int cp, std::int64_t seq) {
  if (checked_layout(config, cp, seq) != TokenLayout::per_document || !config.causal)
    throw Error("per_document_pairs: the layout is not per-document zigzag under a causal mask");
  const Window w{config.window_left, config.window_right};
  const std::vector<std::int64_t>& cu = config.cu_seqlens;
  LinearSums sums(cp);
  std::vector<std::int64_t> pairs(static_cast<std::size_t>(cp));
  std::size_t cursor = 0;
  const std::int64_t parts = 2 * std::int64_t(cp);
  for_each_document_run(cu, cp, [&](const DocumentRun& run) {
    if (run.first.base == 0) return add_run_tokens(sums, run, cp, w.left);
    for (std::int64_t j = 0; j < run.count; ++j) {
      const DocumentCut d = nth_cut(run, j, cp);
      for (std::int64_t r = 0; r < cp; ++r)  // rank_chunks' two chunks of this document
        for (const SeqChunk c :
             {SeqChunk{d.begin + r * d.base + in_run(cp, d.heads_first, d.heads, 0, r),
                       d.base + in_run(cp, d.heads_first, d.heads, r, r + 1)},
              SeqChunk{d.begin + (parts - 1 - r) * d.base + d.heads + in_run(cp, d.tails_first, d.tails, r + 1, cp),
                       d.base + in_run(cp, d.tails_first, d.tails, r, r + 1)}})
          pairs[std::size_t(r)] += visible_pairs(cu, config.causal, c, {0, seq}, w, cursor);
    }
  });
  sums.read_into(pairs);
  return pairs;
}

std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq) {
  std::vector<std::vector<SeqChunk>> c;
  if (cp < 1) return c;
  const TokenLayout layout = checked_layout(config, cp, seq);
  for (int r = 0; r < cp; ++r) c.push_back(chunks_in(layout, config, cp, r, seq));
  return c;
}

}  // namespace ulysses
