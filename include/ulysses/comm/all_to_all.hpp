// The distributed transpose of DeepSpeed-Ulysses (seed section 2), as a differentiable pair.
//
//   seq_to_head:  rank r holds [b, n_r, h, d] of every tensor (sequence-sharded; the n_r may
//                 differ between ranks). Each tensor says which of its heads every rank gets
//                 (SeqShard::heads); those heads go to rank j, and the received parts are
//                 concatenated along the sequence in rank order: rank j ends with
//                 [b, s, heads[j].count, d], s = Σ n_r.
//   head_to_seq:  the adjoint (and, without shared heads, the inverse): split along the
//                 sequence, concatenate along heads; a head several ranks hold is summed.
//
// Several tensors (Q, K, V — or dQ, dK, dV) travel in ONE all-to-all(v). The head-sharded side
// is one buffer, FusedHeads, laid out [s, b, H, d] with H the sum of every tensor's local
// heads: tensor t owns heads [head_offset(t), head_offset(t) + local_heads(t)). Rank r's rows
// [Σ_{i<r} n_i, Σ_{i<=r} n_i) are exactly the block it sends or receives, so the head-sharded
// side needs no packing pass at all; only the sequence-sharded side is packed or unpacked.
// Blocks are sized exactly: ranks holding more tokens or more heads send or receive more
// bytes, nothing is padded.
//
// GQA: ranks may share a KV head (fewer KV heads than ranks, ulysses_heads.hpp):
// the pack reads the source head for each rank that needs it (DeepSpeed ALST's
// repeat_interleave, never materialised) and the adjoint sums the copies' gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/core/ranges.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

// One tensor on the sequence-sharded side: view [b, n_r, h, d]; heads[j] are the heads rank j
// gets (one entry per rank, the same on every rank; ranges may overlap).
struct SeqShard {
  TensorView view;
  std::vector<HeadRange> heads;
};

class FusedHeads {
 public:
  FusedHeads() = default;
  // local_heads[t] heads of tensor t on this rank; rank_tokens[r] rows came from rank r
  // (the full sequence is their sum). storage: null for a buffer of its own on `device`, else
  // caller memory on `device` of at least bytes_for(...) that outlives this object's use
  // (scratch the caller lends).
  FusedHeads(DType dtype, std::int64_t batch, std::vector<std::int64_t> rank_tokens, std::int64_t head_dim,
             std::vector<std::int64_t> local_heads, void* storage = nullptr, Device device = Device::cpu);
  static std::size_t bytes_for(DType dtype, std::int64_t batch, const std::vector<std::int64_t>& rank_tokens,
                               std::int64_t head_dim, const std::vector<std::int64_t>& local_heads);

  // [b, s, local_heads(t), d] strided view of tensor t.
  TensorView part(int t) const;
  int num_parts() const { return int(local_heads_.size()); }
  std::int64_t local_heads(int t) const { return local_heads_[t]; }
  std::int64_t head_offset(int t) const;
  std::int64_t total_heads() const { return total_heads_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  const std::vector<std::int64_t>& rank_tokens() const { return rank_tokens_; }
  std::int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return whole_.dtype; }
  Device device() const { return whole_.device; }
  // The whole buffer as a dense [s, b, H, d] (sbhd) view.
  TensorView whole() const { return whole_; }
  std::size_t nbytes() const { return std::size_t(whole_.shape.numel()) * dtype_size(whole_.dtype); }
  // A copy with the same parts in another dtype (float32 results → a bf16 wire, and back).
  FusedHeads converted(DType dtype) const;

 private:
  Tensor buffer_;  // empty when the storage is the caller's
  TensorView whole_;
  std::vector<std::int64_t> local_heads_, rank_tokens_;
  std::int64_t total_heads_ = 0, batch_ = 0, seq_ = 0, head_dim_ = 0;
};

// Collective. Forward transpose of all `inputs` in one all-to-all (counted as "seq_to_head").
// Every input must have the same b, n_r, d and dtype on a rank, and every rank the same heads
// lists; ranks learn each other's n_r from one small all-gather (under "validate"). Returns the
// head-sharded buffer, the ranks' rows in rank order.
FusedHeads seq_to_head(Communicator& comm, std::span<const SeqShard> inputs);

// Collective. Adjoint of seq_to_head (counted as "head_to_seq"): writes every output view
// [b, n_r, h, d]; heads held by several ranks are summed. `in` must match the outputs: its
// local heads are the outputs' heads[rank], its rank_tokens()[rank] their n_r.
void head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs);

// The nonblocking halves, for pipelines that compute while a transpose travels (Ulysses with
// overlap_chunks, one transpose per chunk of heads). They skip the checks and the all-gather
// of n_r: the caller ran them once, for the whole tensors (check_transpose). Counted as
// seq_to_head / head_to_seq like the blocking ones (bytes and messages at posting).
class PendingTranspose {
 public:
  PendingTranspose() = default;
  PendingTranspose(Request request, std::function<void()> finish)
      : request_(std::move(request)), finish_(std::move(finish)) {}
  // Completes the transfer (under the watchdog) and, for head_to_seq, unpacks. Idempotent.
  void wait();
  // Drives the transfer's progress; call it between pieces of compute.
  void test() { request_.test(); }

 private:
  Request request_;
  std::function<void()> finish_;  // owns the buffers in flight
};

// Not collective. seq_to_head's checks on this rank, `shards` as its inputs (or the outputs
// of head_to_seq): why they cannot be transposed ("" when they can), and what every rank must
// agree on (dtype, b, h, d and the head lists; not n_r), for a caller that folds them into its
// own agreement (Communicator::agree_all) instead of paying for a second one.
struct TransposeCheck {
  std::string error, description;
};
TransposeCheck local_transpose_check(std::span<const SeqShard> shards, int cp, const char* op);

// Collective. seq_to_head's and head_to_seq's checks and agreement, in one small all-gather
// (Communicator::agree_all): `shards` as the inputs of seq_to_head (or the outputs of
// head_to_seq), `local_error` a failure the caller found on this rank. Returns every rank's n_r.
std::vector<std::int64_t> check_transpose(Communicator& comm, std::span<const SeqShard> shards, const char* op,
                                          const std::string& local_error = "");

// Collective. Posts seq_to_head of `inputs` (rank_tokens: every rank's n_r); `out` is valid
// after the returned transfer's wait(). The inputs may change once this returns (they are packed).
// storage: null, or caller memory `out` is placed in (FusedHeads' constructor).
PendingTranspose post_seq_to_head(Communicator& comm, std::span<const SeqShard> inputs,
                                  const std::vector<std::int64_t>& rank_tokens, FusedHeads& out,
                                  void* storage = nullptr);
// Collective. Posts head_to_seq: `in` must stay alive and unchanged, and the outputs are
// written, until the returned transfer's wait(). Heads that no rank's range names (another
// chunk's) are left as they are.
PendingTranspose post_head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs);

}  // namespace ulysses
