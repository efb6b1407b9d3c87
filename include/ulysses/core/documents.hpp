// Packed documents: FlashAttention's varlen contract (cu_seqlens) over a global sequence.
//
// Long-context training packs several documents into one sequence. cu_seqlens holds their
// cumulative lengths, {0, n0, n0 + n1, ..., s}: document i is the global positions
// [cu_seqlens[i], cu_seqlens[i + 1]). A query sees only the keys of its own document (and, with
// a causal mask, none after itself), so nothing attends — and no gradient flows — across a
// boundary. Empty documents (equal neighbours) are allowed; an empty cu_seqlens means one
// document, the whole sequence. Positions are global, so every strategy and every rank passes
// the same cu_seqlens, whatever tokens it holds.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ulysses/core/ranges.hpp"

namespace ulysses {

struct Document {
  std::int64_t begin = 0, end = 0;  // global positions [begin, end)
};

// "" when cu_seqlens is empty or starts at 0, never decreases and ends at `seq`; otherwise
// what is wrong, naming the first bad entry.
std::string cu_seqlens_error(std::span<const std::int64_t> cu_seqlens, std::int64_t seq);

// The document holding global position `pos` (0 <= pos < cu_seqlens.back()); with an empty
// cu_seqlens, [0, INT64_MAX).
Document document_of(std::span<const std::int64_t> cu_seqlens, std::int64_t pos);

// A sliding window over global positions, FlashAttention's window_size = (left, right): query
// position p sees key j only if p − left <= j <= p + right; -1 leaves that side unbounded.
struct Window {
  std::int64_t left = -1, right = -1;
  bool bounded() const { return left >= 0 || right >= 0; }
};

// The keys [lo, hi) of a chunk that query position `pos` sees, as global positions clipped to
// the chunk `keys`: its document's, inside its window, and with `causal` none after it
// (hi <= lo: none). Both ends never decrease with `pos`.
Document visible_keys(std::span<const std::int64_t> cu_seqlens, bool causal, std::int64_t pos, const SeqChunk& keys,
                      Window window = {});

// Visible (query, key) pairs between a query chunk and a key chunk, per (batch, head): the
// attention work they cost, exactly (closed form per document).
std::int64_t visible_pairs(std::span<const std::int64_t> cu_seqlens, bool causal, const SeqChunk& q, const SeqChunk& k,
                           Window window = {});
// The same for query chunks asked in position order: `cursor` (0 before the first) keeps the
// document the last one started in, so the next one's is found by stepping forward, not by a
// search (the planner counts every rank's chunks: millions a plan). Any order stays exact.
std::int64_t visible_pairs(std::span<const std::int64_t> cu_seqlens, bool causal, const SeqChunk& q, const SeqChunk& k,
                           Window window, std::size_t& cursor);

// Document lengths → cu_seqlens ({3, 5} → {0, 3, 8}).
std::vector<std::int64_t> cu_seqlens_of(std::span<const std::int64_t> lengths);

}  // namespace ulysses
