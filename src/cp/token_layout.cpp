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
    if (const std::string e = cu_seqlens_error(config.cu_seqlens, seq); !e.empty()) throw Error(e);
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

}  // namespace

std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq) {
  if (cp < 1 || rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in [0, cp = {})", rank, cp));
  const TokenLayout layout = checked_layout(config, cp, seq);
  if (layout == TokenLayout::contiguous) return {chunk(even_part(seq, cp, rank))};
  if (layout == TokenLayout::per_document) return per_document_chunks(config.cu_seqlens, cp, rank);
  const std::int64_t parts = 2 * std::int64_t(cp);
  return {chunk(even_part(seq, parts, rank)), chunk(even_part(seq, parts, parts - 1 - rank))};
}

std::int64_t tokens_held(const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq) {
  if (first_rank < 0 || ranks < 0 || first_rank > cp - ranks)
    throw Error(fmt::format("ranks [{}, {}) are not in [0, cp = {})", first_rank, first_rank + ranks, cp));
  const TokenLayout layout = checked_layout(config, cp, seq);
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

namespace {

// How many of the positions t in [0, n) of a cyclic sweep over cp ranks fall on ranks [lo, hi).
std::int64_t swept(std::int64_t n, std::int64_t cp, std::int64_t lo, std::int64_t hi) {
  return n / cp * (hi - lo) + std::max<std::int64_t>(0, std::min(hi, n % cp) - lo);
}

}  // namespace

std::vector<std::int64_t> tokens_of_ranks(const CpConfig& config, int cp, std::int64_t seq) {
  const TokenLayout layout = checked_layout(config, cp, seq);
  std::vector<std::int64_t> n(std::size_t(std::max(cp, 0)));
  if (layout != TokenLayout::per_document) {
    for (int r = 0; r < cp; ++r) n[std::size_t(r)] = tokens_held(config, cp, r, 1, seq);
    return n;
  }
  // The longer chunks of consecutive documents continue each other's runs (for_each_document_cut):
  // the first chunks' sweep forward from rank 0, the mirror chunks' backward from rank cp − 1.
  std::int64_t base = 0, heads = 0, tails = 0;
  for_each_document_cut(config.cu_seqlens, cp, [&](const DocumentCut& d) {
    base += d.base;
    heads += d.heads;
    tails += d.tails;
  });
  for (std::int64_t r = 0; r < cp; ++r)
    n[std::size_t(r)] = 2 * base + swept(heads, cp, r, r + 1) + swept(tails, cp, cp - 1 - r, cp - r);
  return n;
}

void for_each_rank_chunk(const CpConfig& config, int cp, std::int64_t seq,
                         const std::function<void(int, const SeqChunk&)>& f) {
  if (checked_layout(config, cp, seq) != TokenLayout::per_document) {
    for (int r = 0; r < cp; ++r)
      for (const SeqChunk& c : rank_chunks(config, cp, r, seq)) f(r, c);
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
    if (d.base > 0) {
      for (std::int64_t r = 0; r < cp; ++r) {
        first(r);
        mirror(r);
      }
      return;
    }
    for (std::int64_t i = 0; i < d.heads; ++i) first((d.heads_first + i) % cp);
    for (std::int64_t i = 0; i < d.tails; ++i) mirror((d.tails_first + i) % cp);
  });
}

std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq) {
  std::vector<std::vector<SeqChunk>> c;
  for (int r = 0; r < cp; ++r) c.push_back(rank_chunks(config, cp, r, seq));
  return c;
}

}  // namespace ulysses
