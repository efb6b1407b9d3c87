// cp_comm_type "all_gather" (Llama-3 style, as in TransformerEngine): gather the full K and V
// once, reorder them into sequence order, and run every local query chunk against its causal
// prefix of keys; the backward reduce-scatters dK and dV back to their owners. The simplest
// strategy and the most memory (full K and V on every rank); nothing overlaps.
#pragma once

#include <vector>

#include "ring_attention.hpp"

namespace ulysses {

struct AllGatherSaved {
  TensorView q, out;                    // float32 [b, n, h, d]; storage owned by the caller
  Tensor kv_full;                       // float32 [2b, s, h_kv, d] in sequence order
  std::vector<std::vector<float>> lse;  // per local chunk [b, h, length]
  std::vector<std::vector<SeqChunk>> chunks;  // per rank
  AttentionParams params;
  DType wire = DType::f32;
};

void all_gather_attention_forward(Communicator& comm, const TensorView& out, AllGatherSaved& saved, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  std::vector<std::vector<SeqChunk>> chunks, const AttentionParams& params,
                                  DType wire, CpStats& stats);

void all_gather_attention_backward(Communicator& comm, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const TensorView& dout, const AllGatherSaved& saved, CpStats& stats);

}  // namespace ulysses
