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

std::int64_t visible_pairs(std::span<const std::int64_t> cu, bool causal, const SeqChunk& q, const SeqChunk& k) {
  if (cu.empty() && !causal) return q.length * k.length;
  std::int64_t n = 0;
  for (std::int64_t p = q.begin; p < q.begin + q.length; ++p) {
    const Document r = visible_keys(cu, causal, p, k);
    n += r.end - r.begin;
  }
  return n;
}

std::vector<std::int64_t> cu_seqlens_of(std::span<const std::int64_t> lengths) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

}  // namespace ulysses
