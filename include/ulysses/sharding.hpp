// Which tokens each rank holds: contiguous chunks or zigzag (the strategy's token_layout),
// and helpers to shard and unshard global tensors, so nobody reorders zigzag chunks by hand
// (RoPE needs each token's global position: token_positions gives it).
//
//   a2a                     contiguous: rank r holds [r·s/cp, (r+1)·s/cp). Ulysses is
//                           balanced by heads, so it never needs zigzag.
//   p2p, all_gather, a2a+p2p  contiguous without a causal mask; with one, zigzag: the sequence
//                           is cut into 2·cp chunks and rank r holds chunks r and 2·cp−1−r (in
//                           that order), so every rank does the same causal work.
#pragma once

#include <cstdint>
#include <vector>

#include "ulysses/communicator.hpp"
#include "ulysses/cp_config.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

struct SeqChunk {
  std::int64_t begin = 0;   // first global position
  std::int64_t length = 0;  // tokens
  bool operator==(const SeqChunk&) const = default;
};

bool uses_zigzag(const CpConfig& config);

// The chunks rank `rank` of `cp` holds for a global sequence of `seq` tokens, in local order.
// Throws Error when seq is not divisible by cp (2·cp under zigzag), naming the values.
std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq);

// rank_chunks of every rank, in rank order.
std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq);

// The local row where chunk i starts (the lengths of the chunks before it).
std::int64_t chunk_row(const std::vector<SeqChunk>& chunks, std::size_t i);

// Global position of every local token, in local order.
std::vector<std::int64_t> token_positions(const std::vector<SeqChunk>& chunks);

// Copies the rows of `global` [b, s, h, d] that `chunks` name into `local` [b, Σlen, h, d].
void shard_sequence(const TensorView& global, const TensorView& local, const std::vector<SeqChunk>& chunks);
// The inverse: writes `local` back into its rows of `global`.
void unshard_sequence(const TensorView& local, const TensorView& global, const std::vector<SeqChunk>& chunks);

// A new tensor [b, Σlen, h, d] in `dtype` and `layout` holding the rows of `global` that
// `chunks` name: this rank's shard of a global input, whatever the strategy.
Tensor shard_of(const TensorView& global, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout);

// Fills `local` [b, Σlen, h, d] with its rows of what fill_uniform(global, seed) would give
// the global tensor, without building it: random inputs that do not depend on cp.
void fill_uniform_shard(const TensorView& local, std::uint64_t seed, const std::vector<SeqChunk>& chunks);

// Collective. Every rank passes its shard (same shape everywhere, any dtype and layout) and
// every rank's chunks (rank_chunks of each rank); `root` gets the global float32 bshd tensor
// [b, s, h, d], s = Σ of all chunk lengths, in sequence order; the other ranks get an empty
// Tensor. The shards count under "report" (the shape check under "validate"), apart from
// the attention's own traffic. Throws the same Error on every rank when a shard does not
// hold its rank's tokens or the shapes differ between ranks.
Tensor gather_global(Communicator& comm, const TensorView& shard,
                     const std::vector<std::vector<SeqChunk>>& chunks_per_rank, int root = 0);

}  // namespace ulysses
