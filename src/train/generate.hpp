// Inference with the training demo's GPT over a KV cache sharded across a context-parallel
// group (kv_cache.hpp, cached_attention.hpp): the prompt prefilled (Ulysses' all-to-alls or
// the ring), then one token per step. Every rank holds all weights and the whole
// prompt; the prefill splits the prompt's tokens contiguously over the ranks, a decode step runs
// the new token's (one-row) projections and MLP on every rank and shards only its attention, so
// every rank computes the same logits and the same next token without being told it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/gpt.hpp"
#include "train/memory.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/infer/kv_cache.hpp"

namespace ulysses::train {

struct GenerateConfig {
  KvLayout layout = KvLayout::heads;
  Prefill prefill = Prefill::ulysses;
  std::int64_t capacity = 0;  // tokens the cache holds: prompt + new tokens
  float temperature = 0;      // 0: greedy (argmax), else sampled from softmax(logits / temperature)
  std::uint64_t seed = 0;     // the sampler's, the same on every rank
};

// "" when a request of `prompt_tokens` prompt tokens and `new_tokens` new ones can run on the
// model at cp ranks under `config` (a prompt of at most `max_positions` tokens, the length the
// model was trained at; 0: no bound), else the one problem, naming the numbers (and, for a
// layout that cannot hold the heads, what would work). Not collective: the same on every rank.
std::string generate_error(const GptConfig& model, const GenerateConfig& config, int cp, std::int64_t prompt_tokens,
                           std::int64_t new_tokens, std::int64_t max_positions);

// The requests whose KV caches rank `rank` holds at once at its busiest: of the sets `held`
// (indices into `requests`, each a moment's; serve.hpp's held_together), the one whose caches'
// kv_bytes_formula sum the most (the first such), and that sum.
struct KvPeak {
  std::vector<std::size_t> requests;
  std::int64_t bytes = 0;
};
KvPeak peak_kv(const GptConfig& model, const std::vector<GenerateConfig>& requests,
               const std::vector<std::vector<std::size_t>>& held, int cp, int rank);

// What one rank of `generate` needs at its peak, by the allocations: weights = the checkpoint's
// parameters and their optimizer moments (read with them, kept while it runs); attention = the
// KV caches held at once at the busiest moment (peak_kv over `held`: a request's cache is
// allocated whole and zeroed at its first prefill and returned after its last token); activations
// = the largest of the prefill of `longest_prompt` tokens (one layer's rows of this rank, the
// transposed q, k, v and output of its heads, and under interleaved the scatter of the rank's new
// K and V rows to their owners), the checkpoint's file held while it is parsed, and
// `scratch` bytes (the bandwidth probe's buffer); baseline = the process's (memory.hpp). Not
// collective.
MemoryEstimate predict_generate_memory(const GptConfig& model, const std::vector<GenerateConfig>& requests,
                                       const std::vector<std::vector<std::size_t>>& held, int cp, int rank,
                                       std::int64_t longest_prompt, double scratch);

// Not collective: this process's CPU seconds per prompt token of a prefill's work around the
// attention (the norms, the q/k/v/out projections, the rotary table, the SwiGLU MLP, the
// residuals and their buffers, the embedding), the median of 3 passes of `rows` tokens through
// every layer of `model` (constant weights) with the attention replaced by a copy of the queries:
// the row term of the planner's time to first token (plan --calibrate --mode decode).
double prefill_row_seconds(const GptConfig& model, std::int64_t rows);

class Generator {
 public:
  // Not collective. `params` (the model's parameter slab, ParamLayout) must outlive this.
  Generator(Communicator& comm, const GptConfig& model, const std::vector<float>& params, const GenerateConfig& config);
  // Collective. Clears the cache (allocating it, whole and zeroed, when it holds none) and runs
  // `prompt` (the same on every rank; generate_error must have passed) through the model; returns
  // the last position's logits, the same on every rank.
  std::vector<float> prefill(const std::vector<int>& prompt);
  // Collective. A next turn of `tokens` (the same on every rank, at least one a rank) over what
  // the cache holds: Ulysses over the cache (heads) or pass-Q (interleaved); returns the last
  // position's logits, the same on every rank. Error when it does not fit the capacity.
  std::vector<float> extend(const std::vector<int>& tokens);
  // Collective. Runs `token` at the next position; returns its logits (the same on every rank).
  std::vector<float> decode(int token);
  // Collective. One decode step of concurrent requests, each its own Generator (one model,
  // parameters and layout; their caches at any lengths): request i runs tokens[i] at its next
  // position. Their rows go through the layers together, and their attention takes one
  // collective per layer for all of them (decode_attention over their caches), so a step's
  // messages do not grow with the requests. Returns each request's logits, equal to decoding it
  // alone; every request's stats() are the step's.
  static std::vector<std::vector<float>> decode(const std::vector<Generator*>& requests,
                                                const std::vector<int>& tokens);
  // Not collective. The next token from logits: argmax, or a sample under the configured
  // temperature (the sampler's state advances identically on every rank).
  int next_token(const std::vector<float>& logits);
  // Called before the first layer of a prompt (prefill or next turn; done = 0) and after each
  // layer, with the layers done and all of them: progress on a long prefill, timed from its own
  // start (a request may be prefilled long after its hook was set). On whichever ranks set it;
  // nothing by default.
  void on_prompt_layer(std::function<void(std::int64_t done, std::int64_t layers)> fn) { on_layer_ = std::move(fn); }
  // Not collective. The cache, from the first prefill until release(); Error when none is held.
  const KvCache& cache() const;
  bool holds_cache() const { return cache_.has_value(); }
  // Not collective. Returns the cache's memory (the request has its tokens); a next prefill
  // allocates it again.
  void release() { cache_.reset(); }
  // The collectives of the last prefill or decode call, and their time.
  const CachedAttentionStats& stats() const { return stats_; }

 private:
  // The layer on N rows of x (in place) at positions pos; attend(l, q, k, v, out) is its attention.
  template <class Attend>
  void layer(std::int64_t l, std::vector<float>& x, const std::vector<std::int64_t>& pos, Attend&& attend);
  std::vector<float> logits(const float* x);  // the final norm and the LM head of one row
  // Runs `tokens` at the positions after the cached ones: a prefill into an empty cache, else
  // an extension of it.
  std::vector<float> run_prompt(const std::vector<int>& tokens);
  KvCacheShape cache_shape() const;
  KvCache& held();  // cache(), writable

  Communicator& comm_;
  GptConfig model_;
  ParamLayout layout_;
  const std::vector<float>& params_;
  GenerateConfig config_;
  std::optional<KvCache> cache_;  // from the first prefill until release()
  CachedAttentionStats stats_;
  std::uint64_t sampler_;
  std::function<void(std::int64_t, std::int64_t)> on_layer_;
};

}  // namespace ulysses::train
