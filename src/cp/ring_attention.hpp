// Ring attention (cp_comm_type "p2p") over a communicator, on chunked sequences.
//
// Every ring member holds some chunks of the global sequence (SeqChunk: positions), the same
// rows for Q and for K/V; members may hold different numbers of rows (buffers are sized for
// the largest, each message for its member). Cross-attention: the K/V chunks are over s_k and
// each member's query chunks its own (over s, shifted by q_offset to their key positions). K and V travel around the ring at their native
// KV-head count:
// at step i a rank holds the K/V of member (me − i) mod R, the transfer for step i+1 is
// posted before step i is computed, and every (Q chunk, KV chunk) pair that the causal mask
// (and the documents) do not hide entirely runs through the local flash kernel with the chunks' global
// positions as offsets; partial results are merged by their LSE. With zigzag chunks every
// rank does the same work at every step.
//
// Backward: every pair uses the final merged O and LSE; dQ stays home; each rank's dK/dV
// contribution joins the accumulator travelling one step behind K/V, which arrives back at
// its owner after R hops (accumulated in float32 whatever the wire dtype).
//
// Dtypes: Q, K, V (and dO) stay in their storage dtype, which is also the wire's and the
// kernels' (bf16 runs on the level's bf16 engine); every partial O, the LSE and every dQ/dK/dV
// are float32, and so are their merges and sums across steps. Rounding a partial to bf16 at
// each step would add one bf16 rounding per ring step, an error growing with the ring size
// (ring-flash-attention #42); the caller rounds the final O and gradients once.
//
// The same code serves the outer ring of a2a+p2p, where a member's chunks are those of its
// whole inner group.
//
// Sliding windows (halo_attention.cpp): when the window bounds the band of keys on both sides
// (window_left >= 0, and causal or window_right >= 0), there is no ring. Each member sends
// every other member exactly the rows of its K/V that the other's query chunks can see (per
// chunk, the hull of their bands: with contiguous chunks and W <= s/cp, the last W rows to the
// next member, one message), while the own chunks are computed; the float32 dK/dV of those
// rows go back to their owner in the backward. Bytes ∝ W, not s.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/cost_model.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses {

// --per-document 0|1 (CpConfig::per_document), declared by both ring strategies: with packed
// documents under zigzag, the ring's layout is per-document zigzag (per_document_layout) unless 0.
StrategyOption per_document_option();

struct RingSaved {
  TensorView q, out;                             // [b, n, h, d], q in `wire`, out float32; storage owned by the caller
  Tensor kv;                                     // own K then V in `wire`: [2b, own rows, h_kv, d]
  std::vector<Tensor> lse;                       // per local chunk (lse_tensor)
  std::vector<std::vector<SeqChunk>> chunks;     // per ring member: its K/V rows
  std::vector<SeqChunk> queries;                 // this member's query rows at their key positions
  AttentionParams params;                        // causal and scale; offsets are per chunk
  DType wire = DType::f32;                       // q's, k's and v's: the kernels' compute dtype
  int me = 0;                                    // this member
  std::vector<std::vector<SeqChunk>> halo_rows;  // halo exchange: the rows of each member held
  std::vector<Tensor> halos;                     // their K then V in `wire`, [2b, rows, h_kv, d]
};

// Collective over `ring`. q, k, v: views of one dtype (float32 or bf16: the wire's and the
// kernels'), out: a float32 view; q and out must outlive the backward. chunks[r] are the K/V
// rows of member r, `queries` this member's query rows at their global key positions
// (chunks[me] for self-attention; cross-attention: shifted by q_offset, and no window).
void ring_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, const TensorView& q,
                            const TensorView& k, const TensorView& v, const std::vector<std::vector<SeqChunk>>& chunks,
                            const std::vector<SeqChunk>& queries, const AttentionParams& params, CpStats& stats);

// `chunks` moved by `offset` positions (a cross-attention's queries to their key positions).
std::vector<SeqChunk> shifted(std::vector<SeqChunk> chunks, std::int64_t offset);

// Collective over `ring`. dout in q's dtype; dq, dk, dv: float32 views, overwritten.
void ring_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats);

// True when `params`' window bounds the keys on both sides: the halo exchange replaces the ring.
bool uses_halo(const AttentionParams& params);
// The same from the config: attention_params would copy the documents' boundaries (the planner
// asks for every rank).
bool uses_halo(const CpConfig& config);

// The rows of `keys` (a member's chunks) that the chunks `queries` can see under a bounded
// window: per key chunk, the hull of the queries' bands inside it, in the keys' order.
std::vector<SeqChunk> halo_rows(const std::vector<SeqChunk>& queries, const std::vector<SeqChunk>& keys,
                                const AttentionParams& params);

// What one member's halo exchange moves: the rows of its K/V the others' bands reach (`given`,
// sent to `to` members) and the rows of theirs its band reaches (`held`, whose dK/dV go back to
// `back` members).
struct HaloCounts {
  std::int64_t given = 0, held = 0, to = 0, back = 0;
  auto operator<=>(const HaloCounts&) const = default;
};

// The halo of ring member `member` when each member holds the chunks of `width` consecutive ranks
// of `config`'s layout of `seq` tokens on cp ranks (p2p: width 1; a2a+p2p's outer ring: the inner
// size). Contiguous and zigzag layouts in closed form (halo_volume.cpp), O(1); per-document
// zigzag by a sweep over every member's chunks (members_halo_counts).
HaloCounts halo_counts(const CpConfig& config, int cp, int width, int member, std::int64_t seq);

// halo_counts of every member, at once (per-document zigzag: one sweep over every rank's chunks,
// O(chunks · log chunks) and the partners' windows by stamps, bit sets or member segments,
// whichever is cheapest; member by member only when all would be too costly).
std::vector<HaloCounts> members_halo_counts(const CpConfig& config, int cp, int width, std::int64_t seq);

// The per-document sweep's ways of counting partners: the tests hold each against the others.
enum class PartnerCount { cheapest, stamps, bits, segments };
// The sweep's work, so a test can bound it instead of timing it: the pieces it visits (each
// member's runs of adjacent chunks joined) and the partner count's steps (window entries,
// bit-set words or segments crossed).
struct SweepWork {
  std::int64_t pieces = 0, partner_steps = 0;
};
// The sweep's counts of every member with partners counted `how` (per-document zigzag, causal);
// empty for other layouts, or when `cheapest` finds every way too costly. `work`, if given, the
// sweep's work.
std::optional<std::vector<HaloCounts>> swept_halo_counts(const CpConfig& config, int cp, int width, std::int64_t seq,
                                                         PartnerCount how, SweepWork* work = nullptr);

// The same, when the documents' lengths repeat (any COUNTxLENGTH packing): the sweep of a few
// repetitions extrapolated to all of them (halo_volume.cpp). Empty when they do not repeat often
// enough to save work (or the window is unbounded).
std::optional<std::vector<HaloCounts>> periodic_halo_counts(const CpConfig& config, int cp, int width,
                                                            std::int64_t seq);

// The same by asking members: walks outwards from `me` (chunks_of(r): member r's chunks) until a
// member exchanges nothing, every member when params has documents. The reference of the closed
// form and the path of per-document layouts.
HaloCounts walked_halo_counts(int members, int me, const std::function<std::vector<SeqChunk>(int)>& chunks_of,
                              const AttentionParams& params);

// A member's counts as entries [at, at + 4) of a Strategy::TrafficKey, and back.
void put_halo_key(Strategy::TrafficKey& key, std::size_t at, const HaloCounts& h);
HaloCounts halo_of(const Strategy::TrafficKey& key, std::size_t at);

// The halo exchange's volume from a member's counts (per_token elements a row):
// "<prefix>p2p_kv" forward (`es` bytes per element, a message to each), float32
// "<prefix>p2p_dkv" backward (a message to each owner).
void add_halo_volume(CommVolume& v, const std::string& prefix, const HaloCounts& h, std::int64_t per_token,
                     std::int64_t es);

// The planner's seconds of the halo exchange's "<prefix>" counters in `v` over `link`: every
// message's latency and bytes, the forward's hidden behind the own chunks' compute.
RingSeconds halo_seconds(const Link& link, const CommVolume& v, const std::string& prefix, double fwd_s);

// Shared by the ring and the halo exchange: every (own query chunk, key chunk) pair the mask
// does not hide entirely, against K|V rows `kv` [2b, rows, h_kv, d] in q's dtype holding `keys`
// (global positions) one after another; `progress` runs between pairs.
struct PairScratch {
  Tensor o, lse;      // forward
  Tensor dq, dk, dv;  // backward
  PairScratch(const RingSaved& saved, bool backward);
};
// Partial results merged into out (and saved.lse) by their LSE.
void forward_pairs(RingSaved& saved, const TensorView& out, const TensorView& kv, const std::vector<SeqChunk>& keys,
                   PairScratch& scratch, CpStats& stats, const std::function<void()>& progress);
// dQ accumulated into dq, dK|dV of `keys` into dkv (float32 [2b, rows, h_kv, d]).
void backward_pairs(const RingSaved& saved, const TensorView& dq, const TensorView& dkv, const TensorView& dout,
                    const TensorView& kv, const std::vector<SeqChunk>& keys, PairScratch& scratch, CpStats& stats,
                    const std::function<void()>& progress);

// The halo exchange (called by the ring entry points when uses_halo; saved already holds q,
// out, the own K/V and the chunks).
void halo_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, CpStats& stats);
void halo_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats);

}  // namespace ulysses
