// DeepSpeed-Ulysses (cp_comm_type "a2a") as an explicit forward/backward pair.
//
// forward:  seq_to_head(q, k, v)  →  flash forward on [b, s, h/cp, d]  →  head_to_seq(o)
// backward: seq_to_head(dO)       →  flash backward                     →  head_to_seq(dq, dk, dv)
// The backward is composed from the primitives' adjoints; nothing is hand-fused.
#pragma once

#include <vector>

#include "ulysses/all_to_all.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/communicator.hpp"
#include "ulysses/context_parallel.hpp"

namespace ulysses {

struct UlyssesSaved {
  FusedHeads qkv;           // head-sharded q | k | v in the wire dtype, [s, b, h/cp + 2·h_kv'/cp, d]
  FusedHeads out;           // float32 head-sharded output
  std::vector<float> lse;   // [b, h/cp, s]
  int kv_replicas = 1;      // each KV head sent this many times (GQA with h_kv < cp)
  AttentionParams params;
  DType dtype = DType::f32;  // storage / wire dtype
};

// Collective. Inputs already validated (see context_parallel.cpp).
void ulysses_attention_forward(Communicator& comm, const TensorView& out, UlyssesSaved& saved,
                               const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, int kv_replicas, CpStats& stats);

void ulysses_attention_backward(Communicator& comm, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView& dout,
                                const UlyssesSaved& saved, CpStats& stats);

}  // namespace ulysses
