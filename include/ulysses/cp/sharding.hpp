// Global tensors and the tokens each rank holds: shard a global input, write a shard back,
// gather every rank's shard into the global tensor, fill a shard with what a global random
// tensor would hold there. Which tokens and heads a rank holds are their own rules
// (token_layout.hpp, ulysses_heads.hpp), included here for the code that shards by them.
#pragma once

#include <cstdint>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/core/ranges.hpp"
#include "ulysses/core/tensor.hpp"
#include "ulysses/cp/token_layout.hpp"
#include "ulysses/cp/ulysses_heads.hpp"

namespace ulysses {

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

// Collective. Every rank passes its shard (its own token count, the same b, h, d, any dtype and
// layout everywhere) and every rank's chunks (rank_chunks of each rank); `root` gets the
// global float32 bshd tensor [b, s, h, d], s = Σ of all chunk lengths, in sequence order; the
// other ranks get an empty Tensor. The shards count under "report" (the shape check under
// "validate"), apart from the attention's own traffic. Throws the same Error on every rank
// when a shard does not hold its rank's tokens or b, h or d differ between ranks.
Tensor gather_global(Communicator& comm, const TensorView& shard,
                     const std::vector<std::vector<SeqChunk>>& chunks_per_rank, int root = 0);

}  // namespace ulysses
