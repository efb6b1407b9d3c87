// The distributed transpose of DeepSpeed-Ulysses (seed section 2), as a differentiable pair.
//
//   seq_to_head:  each rank holds [b, s/cp, h, d] of every tensor (sequence-sharded).
//                 Split along heads into cp parts, part j goes to rank j; the received parts
//                 are concatenated along the sequence: each rank ends with [b, s, h/cp, d].
//   head_to_seq:  the adjoint (and, without replication, the inverse): split along the
//                 sequence, concatenate along heads.
//
// Several tensors (Q, K, V — or dQ, dK, dV) travel in ONE all-to-all. The head-sharded side
// is one buffer, FusedHeads, laid out [s, b, H, d] with H the sum of every tensor's local
// heads: tensor t owns heads [head_offset(t), head_offset(t) + local_heads(t)). This is also
// exactly the all-to-all's own block order ([cp, s/cp, b, H, d]), so the head-sharded side
// needs no packing pass at all; only the sequence-sharded side is packed or unpacked.
//
// GQA with fewer KV heads than ranks: a tensor may ask for each of its heads to be repeated
// `replicas` times before the transpose (repeat_interleave along heads, as DeepSpeed ALST);
// the adjoint then sums the replicas' gradients. Nothing is materialised: the pack reads the
// source head directly.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ulysses/communicator.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

// One tensor on the sequence-sharded side: view [b, s/cp, h, d]; each head is sent
// `replicas` times, so h * replicas must be divisible by cp.
struct SeqShard {
  TensorView view;
  int replicas = 1;
};

class FusedHeads {
 public:
  FusedHeads() = default;
  // local_heads[t] heads of tensor t per rank; seq is the full (gathered) sequence length.
  FusedHeads(DType dtype, std::int64_t batch, std::int64_t seq, std::int64_t head_dim,
             std::vector<std::int64_t> local_heads);

  // [b, s, local_heads(t), d] strided view of tensor t.
  TensorView part(int t) const;
  int num_parts() const { return int(local_heads_.size()); }
  std::int64_t local_heads(int t) const { return local_heads_[t]; }
  std::int64_t head_offset(int t) const;
  std::int64_t total_heads() const { return total_heads_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  std::int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return buffer_.dtype(); }
  // The whole buffer as a dense [s, b, H, d] (sbhd) view.
  TensorView whole() const { return buffer_.view(); }
  std::size_t nbytes() const { return buffer_.nbytes(); }
  // A copy with the same parts in another dtype (bf16 wire data → float32 compute, and back).
  FusedHeads converted(DType dtype) const;

 private:
  Tensor buffer_;
  std::vector<std::int64_t> local_heads_;
  std::int64_t total_heads_ = 0, batch_ = 0, seq_ = 0, head_dim_ = 0;
};

// Collective. Forward transpose of all `inputs` in one all-to-all (counted as "seq_to_head").
// Every input must have the same b, s/cp, d and dtype; returns the head-sharded buffer with
// seq = cp * s/cp. Ranks' blocks are concatenated in rank order along the sequence.
FusedHeads seq_to_head(Communicator& comm, std::span<const SeqShard> inputs);

// Collective. Adjoint of seq_to_head (counted as "head_to_seq"): writes every output view
// [b, s/cp, h, d]; replicated heads are summed. `in` must match the outputs' shapes.
void head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs);

}  // namespace ulysses
