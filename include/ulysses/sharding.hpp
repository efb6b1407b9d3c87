// Which tokens and which heads each rank holds: contiguous chunks or zigzag (the strategy's
// token_layout), the head split of Ulysses, and helpers to shard and unshard global tensors, so
// nobody reorders zigzag chunks by hand (RoPE needs each token's global position:
// token_positions gives it).
//
// Tokens. A sequence of s tokens is cut into parts whose lengths differ by at most one, the
// first ones one longer (torch.tensor_split's rule), so s need not divide by anything:
//   a2a                     contiguous: s cut into cp parts, rank r holds part r. Ulysses is
//                           balanced by heads, so it never needs zigzag.
//   p2p, all_gather, a2a+p2p  contiguous without a causal mask; with one, zigzag: s cut into
//                           2·cp chunks, rank r holds chunks r and 2·cp−1−r (in that order), so
//                           every rank does the same causal work (up to the odd token).
//   p2p, a2a+p2p with packed documents (cu_seqlens) under zigzag, unless per_document is
//                           false: per-document zigzag, every document cut into 2·cp chunks
//                           and rank r holding chunks r and 2·cp−1−r of each, documents in
//                           order. Zigzag balances one causal document, not several; this
//                           balances each. A document's chunks differ by at most one token; its
//                           n % 2·cp longer ones are dealt round robin over the ranks, first
//                           chunks forward from where the previous document stopped, mirror
//                           chunks backward, so one document is exactly zigzag and documents
//                           shorter than 2·cp spread one token per rank. A rank may hold no
//                           token of a short document; adjacent chunks of a rank are merged.
// Ranks' token counts differ by at most one either way. Every rank holds at least one token
// (zigzag: two chunks of at least one), so s >= cp (s >= 2·cp under plain zigzag); shorter
// sequences are refused rather than leaving ranks empty.
#pragma once

#include <cstdint>
#include <vector>

#include "ulysses/all_to_all.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/cp_config.hpp"
#include "ulysses/ranges.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

// Which tokens a rank holds (rank_chunks has the exact rule for any s).
enum class TokenLayout {
  contiguous,    // s cut into cp parts; rank r holds part r
  zigzag,        // s cut into 2·cp chunks; rank r holds chunks r and 2·cp−1−r: equal causal work per rank
  per_document,  // every document cut so: equal causal work per rank whatever the documents
};

// The layout of `config` (its strategy's token_layout).
TokenLayout token_layout(const CpConfig& config);
// True unless the layout is contiguous.
bool uses_zigzag(const CpConfig& config);
// "contiguous", "zigzag" or "per-document zigzag".
const char* layout_name(TokenLayout layout);
// What a ring strategy's zigzag becomes for `config`: per_document with packed documents
// (cu_seqlens) and config.per_document, else `layout` unchanged.
TokenLayout per_document_layout(TokenLayout layout, const CpConfig& config);

// The chunks rank `rank` of `cp` holds for a global sequence of `seq` tokens, in local order:
// the single source of truth of every strategy's token layout. Throws Error when seq < cp
// (seq < 2·cp under plain zigzag), naming the values, or when the per-document layout's
// cu_seqlens are not a valid cut of seq (cu_seqlens_error's message).
std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq);

// How many tokens ranks [first_rank, first_rank + ranks) hold together (their rank_chunks'
// lengths), in O(1) (per-document zigzag: O(documents)): the traffic formulas ask it for every rank.
std::int64_t tokens_held(const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq);

// rank_chunks of every rank, in rank order.
std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq);

// Heads. A Ulysses all-to-all over `group` ranks gives rank `rank` these query and KV heads of
// `heads` query heads in GQA groups over `kv_heads` KV heads (parts cut as for tokens):
//   kv_heads >= group: whole GQA groups: the KV heads cut into `group` parts, each rank with
//                      all the query heads of its KV heads (h = 6 on 4 ranks: 2, 2, 1, 1);
//   kv_heads <  group: each KV head shared by one part of the ranks cut into kv_heads parts,
//                      which split its group's query heads; each rank holds that KV head.
// A query head always lands on a rank holding its KV head, so the local attention is plain
// GQA, and an even split (heads % group == 0 with kv_heads % group == 0 or group % kv_heads ==
// 0) is the seed's h/group heads per rank. Precondition: heads % kv_heads == 0 and heads >=
// group (Strategy::validate's rule: every rank of the all-to-all gets a head).
RankHeads ulysses_heads(int group, int rank, std::int64_t heads, std::int64_t kv_heads);

// The KV heads all ranks of the group hold together: kv_heads when whole groups split,
// `group` when the KV heads are shared (each rank holds one).
std::int64_t ulysses_kv_heads_held(int group, std::int64_t kv_heads);

// Every rank's ulysses_heads, as the all-to-all takes them (SeqShard::heads).
HeadSplit ulysses_head_split(int group, std::int64_t heads, std::int64_t kv_heads);
// The most heads any rank gets in `ranges` (the busiest rank's share).
std::int64_t most_heads(const std::vector<HeadRange>& ranges);

// Overlapped Ulysses (CpConfig::overlap_chunks): how many chunks the pipeline cuts every
// rank's heads into. A chunk is whole GQA groups (it needs its KV head), so `requested` is
// clamped to the fewest KV heads a rank holds: 1 when KV heads are shared (kv_heads < group).
int ulysses_overlap_chunks(int requested, int group, std::int64_t kv_heads);
// Chunk i of `chunks` of every rank's heads in `split` (ulysses_head_split; chunks no more than
// ulysses_overlap_chunks): each rank's KV heads cut like tokens, with their query heads.
HeadSplit ulysses_head_chunk(const HeadSplit& split, int chunks, int i);

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
