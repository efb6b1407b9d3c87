// Which tokens each rank holds, for any s: rank_chunks is the one rule every strategy, the
// trainer and the sharding helpers use; each strategy says which layout it runs (its
// token_layout: a sequence-sharded strategy that balances by heads keeps contiguous; a ring
// under a causal mask zigzags; one that zigzags every packed document says so in its traits).
//
// A sequence of s tokens is cut into parts whose lengths differ by at most one, the first ones
// one longer (torch.tensor_split's rule, even_part), so s need not divide by anything:
//   contiguous    s cut into cp parts, rank r holds part r.
//   zigzag        s cut into 2·cp chunks, rank r holds chunks r and 2·cp−1−r (in that order), so
//                 every rank does the same causal work (up to the odd token).
//   per_document  with packed documents (cu_seqlens), unless CpConfig::per_document is false:
//                 every document cut into 2·cp chunks and rank r holding chunks r and 2·cp−1−r
//                 of each, documents in order. Zigzag balances one causal document, not
//                 several; this balances each. A document's chunks differ by at most one token;
//                 its n % 2·cp longer ones are dealt round robin over the ranks, first chunks
//                 forward from where the previous document stopped, mirror chunks backward, so
//                 one document is exactly zigzag and documents shorter than 2·cp spread one
//                 token per rank. A rank may hold no token of a short document; adjacent chunks
//                 of a rank are merged.
// Ranks' token counts differ by at most one either way. Every rank holds at least one token
// (zigzag: two chunks of at least one), so s >= cp (s >= 2·cp under plain zigzag); shorter
// sequences are refused rather than leaving ranks empty.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ulysses/cp/cp_config.hpp"
#include "ulysses/core/ranges.hpp"

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

// Throws the Error rank_chunks(config, cp, 0, seq) would, without listing the chunks (per-document
// zigzag: rank 0's chunks of every document, twice a planned row).
void check_rank_chunks(const CpConfig& config, int cp, std::int64_t seq);

// How many tokens ranks [first_rank, first_rank + ranks) hold together (their rank_chunks'
// lengths), in O(1) (per-document zigzag: O(documents)): the traffic formulas ask it for every rank.
std::int64_t tokens_held(const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq);

// tokens_held of every rank alone, in rank order, at once: O(cp + documents), where asking
// tokens_held rank by rank costs O(documents) a rank under per-document zigzag.
std::vector<std::int64_t> tokens_of_ranks(const CpConfig& config, int cp, std::int64_t seq);

// Calls f(rank, chunk) for every rank's chunks (rank_chunks' pieces; per-document zigzag: a
// document's pieces, not joined where adjacent), per-document zigzag in position order:
// O(documents + chunks), where rank_chunks rank by rank visits every document for every rank,
// and the halo sweep reads the pieces in order without sorting them.
void for_each_rank_chunk(const CpConfig& config, int cp, std::int64_t seq,
                         const std::function<void(int, const SeqChunk&)>& f);

// for_each_rank_chunk for members of `width` consecutive ranks (cp / width of them): f(member,
// chunk) in position order, where each chunk joins the adjacent chunks of a member's ranks
// inside a document (not across documents). Per-document zigzag costs O(documents +
// chunks / width): a document's chunks rise over the ranks and fall back, so a member's ranks'
// chunks lie together; other layouts call f for every rank's chunk.
void for_each_member_chunk(const CpConfig& config, int cp, int width, std::int64_t seq,
                           const std::function<void(int, const SeqChunk&)>& f);

// Every rank's visible (query, key) pairs of its own queries against all the keys, one head,
// causal self-attention under per-document zigzag (what visible_pairs over for_each_rank_chunk gives):
// a document shorter than 2·cp puts one token on each rank of two runs, whose pairs are linear in
// the rank along a run, so it costs O(1), not O(tokens); longer ones cost O(cp) each. Throws
// Error unless config's layout is per-document zigzag under a causal mask on cp ranks for seq tokens.
std::vector<std::int64_t> per_document_pairs(const CpConfig& config, int cp, std::int64_t seq);

// Packed documents shared by the configurations priced while one lives (on this thread): the
// planner lends one vector of boundaries to every row it prices (its config's cu_seqlens, the
// buffer moved, not copied). A config whose cu_seqlens is that buffer, unchanged (its data and
// size), has its boundaries checked once a sequence length instead of at every call, and its
// ranks' tokens and pairs (tokens_of_ranks, pairs_of_ranks) computed once a layout: with 16M
// documents each is a pass over all of them, asked several times by each of ~20 rows. A scope
// made without boundaries serves the configs without them alike: a plan's rows over one
// sequence share their ranks' counts (every split of an a2a+p2p size asks the same). Whoever
// makes one must not change the boundaries while it lives; scopes nest (the innermost answers).
class SharedDocuments {
 public:
  explicit SharedDocuments(const std::vector<std::int64_t>& cu);
  ~SharedDocuments();
  SharedDocuments(const SharedDocuments&) = delete;
  SharedDocuments& operator=(const SharedDocuments&) = delete;

  // The innermost scope whose boundaries `config` holds, or nullptr.
  static SharedDocuments* of(const CpConfig& config);
  // This scope's number (documents_generation): no other scope's, nor any number given to
  // boundaries outside a scope, on this thread.
  std::uint64_t generation() const { return generation_; }
  // cu_seqlens_error of the boundaries for `seq` tokens, the first time for each seq.
  const std::string& error(std::int64_t seq);
  // What `compute` gives for `key` (the first time; later the same vector, kept).
  using Key = std::array<std::int64_t, 10>;
  const std::vector<std::int64_t>& counts(const Key& key, const std::function<std::vector<std::int64_t>()>& compute);

 private:
  const std::int64_t* data_;
  std::size_t size_;
  SharedDocuments* outer_;
  std::uint64_t generation_;
  std::map<std::int64_t, std::string> errors_;
  std::map<Key, std::vector<std::int64_t>> counts_;
};

// A number for config's document boundaries, for memos to key on instead of holding a copy:
// equal to an earlier call's (on this thread) only when the boundaries are equal to that
// call's. Inside a SharedDocuments scope holding them, the scope's number: its boundaries do
// not change while it lives, so nothing is compared (16M documents: 128 MB a call). Outside,
// they are compared in full with the last ones asked outside a scope (a copy of them is kept)
// and given a new number when they differ.
std::uint64_t documents_generation(const CpConfig& config);

// cu_seqlens_error(config.cu_seqlens, seq), once a length while a SharedDocuments holds them.
std::string documents_error(const CpConfig& config, std::int64_t seq);

// rank_chunks of every rank, in rank order.
std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq);

}  // namespace ulysses
