// Ranges of tokens and heads: the vocabulary every layer above the core shares (the kernels'
// document masks, the all-to-all's head split, the strategies' token layouts), kept apart from
// the rules that choose them (token_layout.hpp, ulysses_heads.hpp) so the kernels never see the
// communicator; and the one cut both rules make.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ulysses {

// Tokens [begin, begin + length) of a global sequence.
struct SeqChunk {
  std::int64_t begin = 0;   // first global position
  std::int64_t length = 0;  // tokens
  bool operator==(const SeqChunk&) const = default;
};

// Source heads [first, first + count) of one tensor.
struct HeadRange {
  std::int64_t first = 0;
  std::int64_t count = 0;
  bool operator==(const HeadRange&) const = default;
};

// The query and KV heads one rank holds (ulysses_heads.hpp).
struct RankHeads {
  HeadRange q, kv;
};
// Every rank's query and KV heads, in rank order (ulysses_head_split).
struct HeadSplit {
  std::vector<HeadRange> q, kv;
};

// Part i of n items cut into `parts` contiguous parts whose sizes differ by at most one, the
// first n % parts one larger (torch.tensor_split): tokens over ranks, heads over ranks.
HeadRange even_part(std::int64_t n, std::int64_t parts, std::int64_t i);
// Which part of even_part(n, parts, ·) item x falls in.
std::int64_t part_holding(std::int64_t n, std::int64_t parts, std::int64_t x);

// The local row where chunk i starts (the lengths of the chunks before it).
std::int64_t chunk_row(const std::vector<SeqChunk>& chunks, std::size_t i);
// The tokens `chunks` hold: the local length of a rank's tensors.
std::int64_t total_tokens(const std::vector<SeqChunk>& chunks);
// Global position of every local token, in local order.
std::vector<std::int64_t> token_positions(const std::vector<SeqChunk>& chunks);

}  // namespace ulysses
