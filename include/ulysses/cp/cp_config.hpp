// The settings of a context-parallel attention call and what one call measured.
//
// Megatron's vocabulary: cp = the communicator's size; cp_comm_type names the strategy
// (strategy.hpp lists the registered ones: a2a, p2p, all_gather, a2a+p2p);
// hierarchical_context_parallel_sizes = {inner, outer} for a2a+p2p.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ulysses {

struct CpConfig {
  std::string cp_comm_type = "a2a";
  std::vector<int> hierarchical_context_parallel_sizes;  // a2a+p2p: {inner, outer}
  bool causal = false;
  std::optional<float> scale = std::nullopt;  // softmax scale, finite and > 0; unset: 1/sqrt(d)
  // Sequence-sharded strategies under a causal mask: false keeps contiguous chunks instead of
  // zigzag, to measure the imbalance zigzag fixes (the seed's claim 4); Ulysses ignores it.
  bool zigzag = true;
  // Packed documents (FlashAttention's varlen contract, documents.hpp): boundaries over the
  // global sequence, the same on every rank; batch 1. Empty: one document.
  std::vector<std::int64_t> cu_seqlens = {};
  // Sliding window (FlashAttention's window_size = (left, right)) over global positions: query
  // i sees key j only if i − window_left <= j <= i + window_right; -1: that side unbounded.
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // a2a only: split each rank's heads into this many chunks (whole GQA groups) and pipeline,
  // the all-to-alls of one chunk travelling while another computes. Same bytes, ×chunks
  // messages. 1 = plain Ulysses. Clamped to the fewest KV heads a rank holds
  // (ulysses_overlap_chunks in ulysses_heads.hpp); below 1, or above 1 on another strategy, is an Error.
  int overlap_chunks = 1;
  // Cross-attention (k/v of s_k tokens, q of s): the global key position of query 0, so query i
  // sees keys j <= q_offset + i under a causal mask. Required with a causal mask when s_k != s
  // (there is no natural alignment); when set, every strategy keeps contiguous chunks. Unset
  // with s_k == s: self-attention.
  std::optional<std::int64_t> q_offset = std::nullopt;
  // The options of a strategy registered from outside the library (StrategyOption in
  // strategy.hpp), by flag; the same on every rank.
  std::map<std::string, std::vector<std::int64_t>> options = {};
  // Packed documents under zigzag (p2p and a2a+p2p: their option --per-document 0|1): true cuts
  // every document into 2·cp chunks and zigzags each one (TransformerEngine's thd layout,
  // PyTorch's PerDocumentHeadTail), so every rank does the same causal work whatever the
  // documents; false zigzags the whole sequence, as without documents.
  bool per_document = true;
};

// Where the time of one forward or backward went, and the attention work this rank did.
struct CpStats {
  double compute_s = 0;          // local attention kernels (and LSE merges)
  double comm_exposed_s = 0;     // blocked in communication (all of it for all-to-alls and
                                 // all-gathers; for the ring only what compute did not hide)
  std::int64_t score_pairs = 0;  // (query, key) pairs inside the mask this rank computed

  CpStats& operator+=(const CpStats& o) {
    compute_s += o.compute_s;
    comm_exposed_s += o.comm_exposed_s;
    score_pairs += o.score_pairs;
    return *this;
  }
};

}  // namespace ulysses
