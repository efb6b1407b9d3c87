// Attention over a sharded KV cache (kv_cache.hpp), for inference: a prompt prefilled into the
// cache, then one token per step decoded against it.
//
// Every function here is collective over the cache's group (comm.size() == cache.cp(), this
// rank cache.rank()) and checks nothing across ranks: the caller validates a request once, at
// its prefill, and every decode step after it moves only its data. The decode step's one
// collective per layer is why: a step is latency-bound, and agreement would double its messages.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

// What the collectives of the calls given these stats cost: how many, and their seconds.
struct CachedAttentionStats {
  std::int64_t collectives = 0;
  double comm_s = 0;
};

// How a prompt fills the cache (its names are not the strategies': these are prefill paths
// built from the strategies' pieces, not the strategies):
//   ulysses  the a2a strategy's all-to-alls: one seq_to_head of q, k, v, causal flash attention
//            on this rank's heads, one head_to_seq of the output. The heads layout keeps the
//            head-sharded K and V the transpose brought; interleaved sends each token's K and V
//            to its owner in one more all-to-all(v).
//   ring     the p2p strategy's ring (pass-KV: K and V travel, each rank keeps its queries);
//            then one all-to-all(v) moves the K and V into the layout: to their heads' ranks
//            (heads) or to their owners (interleaved).
enum class Prefill : int { ulysses = 0, ring = 1 };
Prefill parse_prefill(std::string_view name);  // "ulysses" | "ring"; Error otherwise
const char* to_string(Prefill prefill);

// Collective. The prefill of one layer into an empty cache layer: rank r holds prompt tokens
// [Σ_{i<r} rank_tokens[i], +rank_tokens[r]) (contiguous, in rank order, at least one each) as
// q [1, n_r, heads, d], k and v [1, n_r, kv_heads, d], RoPE applied; out [1, n_r, heads, d]
// gets their causal attention.
void prefill(Communicator& comm, KvCache& cache, Prefill how, std::int64_t layer,
             const std::vector<std::int64_t>& rank_tokens, const TensorView& q, const TensorView& k,
             const TensorView& v, const TensorView& out, CachedAttentionStats* stats = nullptr);

// Collective. A prompt over a cache that holds tokens already (a conversation's next turn, the
// next chunk of a chunked prefill): rank_tokens, q, k, v and out as for prefill, the tokens at
// positions after the cached ones, each seeing every cached token and the new ones before it.
//   heads        Ulysses over the cache: the transposes of prefill, the new K and V heads
//                appended, each rank's queries attending its heads of the whole cache;
//   interleaved  pass-Q: K and V of the new tokens to their owners (one all-to-all(v)), every
//                query to every rank (one all-gather), attended over each shard, the partial
//                (out, lse) rows back to their ranks (one all-to-all(v)) and merged by LSE. The
//                cache never travels: pass-Q moves less than passing K and V when the new tokens
//                are a small part of the context.
void extend(Communicator& comm, KvCache& cache, std::int64_t layer, const std::vector<std::int64_t>& rank_tokens,
            const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
            CachedAttentionStats* stats = nullptr);

// Collective. Decodes one token at position cache.tokens(layer) of `layer`: q [1, 1, heads, d],
// k and v [1, 1, kv_heads, d] are the token's, the same on every rank (each computes the
// token's projections: one row). Appends k and v where the layout keeps them, then attends:
//   heads        each rank its query heads over its KV heads; one all-gather(v) of the outputs;
//   interleaved  each rank every head over its shard (an empty shard gives lse = −inf); one
//                all-gather of the partial (out, lse), merged by LSE in rank order.
// out [1, 1, heads, d] dense gets the same values on every rank.
void decode_attention(Communicator& comm, KvCache& cache, std::int64_t layer, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& out, CachedAttentionStats* stats = nullptr);

// Collective. One decode step of B concurrent requests, each over its own cache (the caches of
// one shape and layout, at any lengths): row b of q [1, B, heads, d], k and v [1, B, kv_heads, d]
// and out is request b's token, at position caches[b]->tokens(layer). As decode_attention, with
// one collective for all B (their blocks side by side): a step's message count does not grow
// with the requests, only its bytes. Row b's values equal decoding request b alone.
void decode_attention(Communicator& comm, const std::vector<KvCache*>& caches, std::int64_t layer, const TensorView& q,
                      const TensorView& k, const TensorView& v, const TensorView& out,
                      CachedAttentionStats* stats = nullptr);

// The local decode kernel every rank runs over its rows is decode_attention_forward
// (attention.hpp): a kernel of the device's table, like the prefill's flash attention.

}  // namespace ulysses
