#include "ulysses/core/ranges.hpp"

#include <algorithm>

namespace ulysses {

HeadRange even_part(std::int64_t n, std::int64_t parts, std::int64_t i) {
  const std::int64_t base = n / parts, extra = n % parts;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

std::int64_t part_holding(std::int64_t n, std::int64_t parts, std::int64_t x) {
  const std::int64_t base = n / parts, extra = n % parts, long_items = extra * (base + 1);
  return x < long_items ? x / (base + 1) : extra + (x - long_items) / base;
}

std::int64_t chunk_row(const std::vector<SeqChunk>& chunks, std::size_t i) {
  std::int64_t r = 0;
  for (std::size_t j = 0; j < i; ++j) r += chunks[j].length;
  return r;
}

std::int64_t total_tokens(const std::vector<SeqChunk>& chunks) { return chunk_row(chunks, chunks.size()); }

std::vector<std::int64_t> token_positions(const std::vector<SeqChunk>& chunks) {
  std::vector<std::int64_t> pos;
  for (const SeqChunk& c : chunks)
    for (std::int64_t i = 0; i < c.length; ++i) pos.push_back(c.begin + i);
  return pos;
}

}  // namespace ulysses
