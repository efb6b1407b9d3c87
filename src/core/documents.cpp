#include "ulysses/documents.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace ulysses {

std::string cu_seqlens_error(std::span<const std::int64_t> cu, std::int64_t seq) {
  if (cu.empty()) return "";
  if (cu.front() != 0) return fmt::format("cu_seqlens must start at 0, got {}", cu.front());
  for (std::size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return fmt::format("cu_seqlens must not decrease, got cu_seqlens[{}] = {} after {}", i, cu[i], cu[i - 1]);
  if (cu.back() != seq)
    return fmt::format("cu_seqlens must end at the sequence length {}, got {}", seq, cu.back());
  return "";
}

Document document_of(std::span<const std::int64_t> cu, std::int64_t pos) {
  if (cu.empty()) return {0, std::numeric_limits<std::int64_t>::max()};
  // The last boundary <= pos starts pos's document (skipping empty documents), the next ends it.
  const auto next = std::upper_bound(cu.begin(), cu.end(), pos);
  const std::int64_t end = next == cu.end() ? cu.back() : *next;
  return {*(next - 1), end};
}

Document visible_keys(std::span<const std::int64_t> cu, bool causal, std::int64_t pos, const SeqChunk& keys) {
  const Document doc = document_of(cu, pos);
  const std::int64_t lo = std::max(doc.begin, keys.begin);
  std::int64_t hi = std::min(doc.end, keys.begin + keys.length);
  if (causal) hi = std::min(hi, pos + 1);
  return {lo, std::max(lo, hi)};
}

namespace {

// Queries [a, b) against keys [k0, k1) of one document: all pairs, or under a causal mask
// Σ_p clamp(p − k0 + 1, 0, k1 − k0), summed in closed form.
std::int64_t pairs_in_document(std::int64_t a, std::int64_t b, std::int64_t k0, std::int64_t k1, bool causal) {
  if (a >= b || k0 >= k1) return 0;
  if (!causal) return (b - a) * (k1 - k0);
  std::int64_t n = 0;
  const std::int64_t lo = std::max(a, k0), hi = std::min(b, k1);  // rows seeing a growing prefix
  if (lo < hi) n += (hi - lo) * ((lo - k0 + 1) + (hi - k0)) / 2;
  const std::int64_t full = std::max(a, k1);  // rows seeing every key
  if (full < b) n += (b - full) * (k1 - k0);
  return n;
}

}  // namespace

std::int64_t visible_pairs(std::span<const std::int64_t> cu, bool causal, const SeqChunk& q, const SeqChunk& k) {
  const std::int64_t q1 = q.begin + q.length, k1 = k.begin + k.length;
  if (q.length <= 0 || k.length <= 0) return 0;
  std::int64_t n = 0;
  // One document at a time, from the one holding the chunk's first query.
  for (std::int64_t p = q.begin; p < q1;) {
    const Document doc = document_of(cu, p);
    const std::int64_t end = std::min(doc.end, q1);
    n += pairs_in_document(p, end, std::max(doc.begin, k.begin), std::min(doc.end, k1), causal);
    p = end;
  }
  return n;
}

std::vector<std::int64_t> cu_seqlens_of(std::span<const std::int64_t> lengths) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

}  // namespace ulysses
