// Ring attention (cp_comm_type "p2p") over a communicator, on chunked sequences.
//
// Every ring member holds some chunks of the global sequence (SeqChunk: positions), the same
// rows for Q and for K/V; members may hold different numbers of rows (buffers are sized for
// the largest, each message for its member). K and V travel around the ring at their native
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
// The same code serves the outer ring of a2a+p2p, where a member's chunks are those of its
// whole inner group.
#pragma once

#include <vector>

#include "ulysses/attention.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/cp_config.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses {

struct RingSaved {
  TensorView q, out;           // float32 [b, n, h, d]; storage owned by the caller
  Tensor kv;                   // float32 own K then V: [2b, own rows, h_kv, d]
  std::vector<Tensor> lse;     // per local chunk (lse_tensor)
  std::vector<std::vector<SeqChunk>> chunks;  // per ring member
  AttentionParams params;      // causal and scale; offsets are per chunk
  DType wire = DType::f32;
};

// Collective over `ring`. q, k, v, out: float32 views; chunks[r] are the rows of member r.
void ring_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, const TensorView& q,
                            const TensorView& k, const TensorView& v,
                            const std::vector<std::vector<SeqChunk>>& chunks, const AttentionParams& params,
                            DType wire, CpStats& stats);

// Collective over `ring`. dq, dk, dv, dout: float32 views; dq/dk/dv are overwritten.
void ring_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats);

}  // namespace ulysses
