// How fast an attention kernel runs at the block shape a strategy hands it: the planner's
// compute, per call, instead of one rate for every shape.
//
// FlashAttention-style kernels tile queries and keys; a call pays a fixed prologue/epilogue per
// query tile (load q, rescale and write out) that its key loop amortises, and a causal diagonal
// block computes whole tiles of which half is masked. Both costs shrink relative to the work as
// the block grows, so the rate saturates: rate(L) = peak × efficiency × L / (L + L_half). The
// head dim sets how much work each tile load carries: d / (d + d_half), relative to d = 128.
// Published curves (FlashAttention-3 paper, H100; docs/planner.md names every number) fit this
// within a few percent from 512 to 16k tokens.
//
// Beyond the kernel itself: each call has a fixed cost (launch, synchronisation), and a ring
// step's partial output is merged into the running one by its log-sum-exp (memory-bound
// passes over the query block's float32 output). A call is never faster than reading its K/V
// from memory, which decides decode (one query token against a long cache).
#pragma once

#include <cstdint>

namespace ulysses {

struct KernelModel {
  double kv_half = 0;           // key-block tokens at which the per-tile overhead equals the work (0: flat)
  double causal_half = 0;       // the same for a causal diagonal block's masked half-tiles
  double head_dim_half = 0;     // d_half (0: no head-dim dependence)
  double backward_ratio = 2.5;  // backward seconds over forward at the same block (2.5× FLOPs, its own rate)
  double call_s = 0;            // fixed seconds per kernel call or ring step
  double merge_passes = 0;      // passes over a ring step's float32 output to merge it (0: none)
  double memory_bandwidth = 0;  // bytes/s of device memory (0: never memory-bound)
  // Seconds per byte of K and V a call is handed to pack them into the kernel's tile layout
  // (every key, whether its queries see it or not; the backward packs 1.5x: K twice, V once).
  // 0: none, as a GPU kernel reads K and V in place; on a CPU, calibrated.
  double kv_pack_s_per_byte = 0;
  // A CPU core streams a call's K and V once per query tile and head: while one head's K/V fits
  // the core's cache (cache_bytes) the stream is served from it; past it the keys beyond the
  // cache come from memory, each at (1 + past_cache_extra) times the in-cache time. A query that
  // sees L keys, c of them in the cache, costs 1 + extra * (1 - c / L) times its in-cache time
  // (block_cache_factor). 0: off, as a GPU kernel tiles K/V through its own shared memory.
  double cache_bytes = 0;
  double past_cache_extra = 0;
  // A CPU call packs the K/V of every (batch, KV head) before its first tile and reads q and
  // writes out once, so its working set is all of them: (2 q_len q_heads + 2 kv_len kv_heads) d
  // bytes. Past stream_cache_bytes (what stays near the core between calls) each byte more costs
  // stream_s_per_byte that the compute does not hide: the first tile of every head and query block
  // waits for a miss. A short block has few FLOPs per byte, so it pays most (stream_seconds).
  // 0: off, as a GPU kernel streams K/V tiles through its own shared memory; on a CPU, calibrated.
  double stream_s_per_byte = 0;
  double stream_cache_bytes = 0;
  // How a ring step runs its kernel: false, one call per step over the member's whole query block
  // (the GPU ring kernels the presets are fitted on); true, one call per visible pair of (query
  // chunk, key chunk), each packing its key chunk and merging its query chunk (this library's
  // ring, forward_pairs: at cp 2 under zigzag 5 calls of s/4 × s/4 causal, 8 full, not 2 of
  // s/2 × s/4). Set by the CPU calibration, which measures this library's kernel.
  bool ring_pair_calls = false;
};

// One strategy's attention calls on its busiest rank in one forward: `calls` calls of q_len
// query tokens against kv_len key tokens on q_heads query and kv_heads key/value heads (each ×
// batch); diagonal_share of the work is in causal diagonal blocks; `merge`: each call's output
// is merged into a running one by its log-sum-exp (a ring step).
struct KernelCalls {
  std::int64_t calls = 1;
  double q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0;
  double diagonal_share = 0;
  bool merge = false;
  double kv_read = 0;  // key tokens each call reads from memory (0: kv_len; a zigzag step reads both chunks)
};

// The busiest ring member's visible (query chunk, key chunk) pairs over a whole ring of `members`
// members, each holding `per_member` chunks of equal length (2 per rank under zigzag, 1
// contiguous, times the ranks whose tokens a member holds), and how many of them are a causal
// diagonal (a chunk against itself). Zigzag: member r holds chunks r and N−1−r of N; a causal
// query chunk at position p sees the p + 1 key chunks at or before it, every member
// per_member / 2 · (N + 1) pairs. Contiguous causal: the last member's, the busiest. Full: every
// pair. {0, 0} for a non-positive count.
struct RingPairs {
  double pairs = 0, diagonal = 0;
};
RingPairs ring_visible_pairs(std::int64_t members, std::int64_t per_member, bool zigzag, bool causal);

// The kernel's rate on a block of q_len × kv_len tokens relative to its rate on long blocks at
// head dim 128 (≤ 1 for d ≤ 128; positive and finite for any positive input). `diagonal`: a
// causal diagonal block, whose masked half-tiles cost too (a tile's width over the longer side:
// one query token against a long cache wastes next to nothing).
double block_efficiency(const KernelModel& model, std::int64_t head_dim, double q_len, double kv_len, bool diagonal);

// The time factor (>= 1) of a call whose queries stream kv_len keys per head at head_dim and
// element_bytes past the model's cache: 1 + extra * (1 - c / kv_len) for a full block, where c
// is the keys whose K and V fit the cache; a causal diagonal block, whose query at position p
// streams p keys, averages it over its work: 1 + extra * (1 - c / kv_len)^2. 1 when the cache
// term is off or not finite, or the keys fit.
double block_cache_factor(const KernelModel& model, std::int64_t head_dim, double element_bytes, double kv_len,
                          bool diagonal);

// The seconds a call whose working set is `bytes` spends past the compute on its stream:
// stream_s_per_byte × (bytes − stream_cache_bytes), 0 below the cache or when the term is off or
// not finite (a negative cache counts as none).
double stream_seconds(const KernelModel& model, double bytes);

struct KernelSeconds {
  double fwd = 0, bwd = 0;
};

// The forward and backward seconds of `calls` whose work takes `flat_fwd_s` at the planner's
// flat rate (peak × efficiency): the work at each call's block efficiency and its stream past the
// cache (stream_seconds; the backward at backward_ratio × both), plus the fixed, merge and K/V
// pack costs per call, at least the K/V reads. A model with nothing set returns flat_fwd_s and
// backward_ratio × flat_fwd_s.
KernelSeconds kernel_seconds(const KernelModel& model, const KernelCalls& calls, std::int64_t head_dim,
                             double element_bytes, double flat_fwd_s);

}  // namespace ulysses
