#include "ulysses/core/documents.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "ulysses/core/saturating.hpp"

namespace ulysses {

std::string cu_seqlens_error(std::span<const std::int64_t> cu, std::int64_t seq) {
  if (cu.empty()) return "";
  if (cu.front() != 0) return fmt::format("cu_seqlens must start at 0, got {}", cu.front());
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return fmt::format("cu_seqlens must not decrease, got cu_seqlens[{}] = {} after {}", i, cu[i], cu[i - 1]);
  if (cu.back() != seq) return fmt::format("cu_seqlens must end at the sequence length {}, got {}", seq, cu.back());
  return "";
}

Document document_of(std::span<const std::int64_t> cu, std::int64_t pos) {
  if (cu.empty()) return {0, std::numeric_limits<std::int64_t>::max()};
  // The last boundary <= pos starts pos's document (skipping empty documents), the next ends it.
  const auto next = std::upper_bound(cu.begin(), cu.end(), pos);
  const std::int64_t end = next == cu.end() ? cu.back() : *next;
  return {*(next - 1), end};
}

Document visible_keys(std::span<const std::int64_t> cu, bool causal, std::int64_t pos, const SeqChunk& keys,
                      Window window) {
  const Document doc = document_of(cu, pos);
  std::int64_t lo = std::max(doc.begin, keys.begin);
  std::int64_t hi = std::min(doc.end, sat_add(keys.begin, keys.length));
  if (causal) hi = std::min(hi, sat_add(pos, 1));
  if (window.left >= 0) lo = std::max(lo, sat_sub(pos, window.left));
  if (window.right >= 0) hi = std::min(hi, sat_add(sat_add(pos, window.right), 1));
  return {lo, std::max(lo, hi)};
}

namespace {

// Σ_{t=0}^{n-1} max(0, c + slope·t) for slope in {-1, 0, 1}, in closed form.
std::int64_t positive_sum(std::int64_t n, std::int64_t c, int slope) {
  if (n <= 0) return 0;
  if (slope == 0) return n * std::max<std::int64_t>(c, 0);
  if (slope > 0) {  // terms t < -c are not positive
    const std::int64_t t0 = std::clamp<std::int64_t>(-c, 0, n);
    return (n - t0) * c + (t0 + n - 1) * (n - t0) / 2;
  }
  const std::int64_t t1 = std::clamp<std::int64_t>(c, 0, n);  // terms t >= c are not positive
  return t1 * c - t1 * (t1 - 1) / 2;
}

// Queries [a, b) against keys [k0, k1) of one document: Σ_p max(0, hi(p) − lo(p)) with
// hi(p) = min(k1, p + right + 1) and lo(p) = max(k0, p − left), where causal means right = 0
// and an unbounded side is one wide enough never to bind. hi − lo is linear between the two
// points where hi stops and lo starts moving, so each piece is summed in closed form.
std::int64_t pairs_in_document(std::int64_t a, std::int64_t b, std::int64_t k0, std::int64_t k1, bool causal,
                               Window w) {
  if (a >= b || k0 >= k1) return 0;
  // A side wider than the chunks is the same as one just wide enough never to bind: clamped so
  // that the arithmetic below stays in range (and exact) for windows up to INT64_MAX.
  const std::int64_t span = std::max<std::int64_t>(0, std::max(sat_sub(b, k0), sat_sub(k1, a)));
  const std::int64_t left = w.left >= 0 ? std::min(w.left, span) : span;
  const std::int64_t right = causal ? 0 : w.right >= 0 ? std::min(w.right, span) : span;
  const std::int64_t hi_stops = sat_sub(sat_sub(k1, right), 1),
                     lo_starts = sat_add(k0, left);  // hi = k1 from here; lo = p − left
  std::int64_t cuts[] = {a, std::clamp(hi_stops, a, b), std::clamp(lo_starts, a, b), b};
  std::sort(cuts + 1, cuts + 3);
  std::int64_t n = 0;
  for (int i = 0; i < 3; ++i) {
    const std::int64_t p = cuts[i];
    if (p >= cuts[i + 1]) continue;
    const std::int64_t hi = std::min(k1, sat_add(sat_add(p, right), 1)), lo = std::max(k0, sat_sub(p, left));
    const int slope = (p < hi_stops ? 1 : 0) - (p >= lo_starts ? 1 : 0);
    n += positive_sum(cuts[i + 1] - p, hi - lo, slope);
  }
  return n;
}

// document_of(cu, pos) from the document starting at cu[cursor], moved to pos's: a few steps
// forward, else a search.
Document document_from(std::span<const std::int64_t> cu, std::int64_t pos, std::size_t& cursor) {
  if (cu.empty() || pos < cu.front()) return document_of(cu, pos);
  constexpr int kSteps = 16;
  int steps = 0;
  if (cursor < cu.size() && cu[cursor] <= pos)
    while (cursor + 1 < cu.size() && cu[cursor + 1] <= pos && steps++ < kSteps) ++cursor;
  if (cursor >= cu.size() || cu[cursor] > pos || (cursor + 1 < cu.size() && cu[cursor + 1] <= pos))
    cursor = std::size_t(std::upper_bound(cu.begin(), cu.end(), pos) - cu.begin()) - 1;
  return {cu[cursor], cursor + 1 < cu.size() ? cu[cursor + 1] : cu.back()};
}

}  // namespace

std::int64_t visible_pairs(std::span<const std::int64_t> cu, bool causal, const SeqChunk& q, const SeqChunk& k,
                           Window window) {
  std::size_t cursor = 0;
  return visible_pairs(cu, causal, q, k, window, cursor);
}

std::int64_t visible_pairs(std::span<const std::int64_t> cu, bool causal, const SeqChunk& q, const SeqChunk& k,
                           Window window, std::size_t& cursor) {
  const std::int64_t q1 = sat_add(q.begin, q.length), k1 = sat_add(k.begin, k.length);
  if (q.length <= 0 || k.length <= 0) return 0;
  std::int64_t n = 0;
  // One document at a time, from the one holding the chunk's first query.
  for (std::int64_t p = q.begin; p < q1;) {
    const Document doc = document_from(cu, p, cursor);
    const std::int64_t end = std::min(doc.end, q1);
    n += pairs_in_document(p, end, std::max(doc.begin, k.begin), std::min(doc.end, k1), causal, window);
    p = end;
  }
  return n;
}

std::vector<std::int64_t> cu_seqlens_of(std::span<const std::int64_t> lengths) {
  std::vector<std::int64_t> cu{0};
  cu.reserve(lengths.size() + 1);
  for (std::int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

}  // namespace ulysses
