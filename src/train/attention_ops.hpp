// The two attention cores the model can run on.
#pragma once

#include <memory>
#include <vector>

#include "train/gpt.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/kernels/reference_attention.hpp"

namespace ulysses::train {

// Distributed, causal: one ContextParallelAttention; each layer's forward context is kept
// until that layer's backward (all layers are in flight at once). The model is float32; with
// dtype bf16 (--dtype bf16) q, k, v and dout are rounded to bfloat16 on the way in, so the
// attention runs on the bf16 kernels and its contexts are kept in bf16 (half the bytes), and
// out, dq, dk, dv come back as float32.
class CpAttention : public AttentionOp<float> {
 public:
  CpAttention(Communicator& comm, const CpConfig& cp, const GptConfig& model, i64 batch, i64 local_tokens,
              DType dtype = DType::f32);
  // The shapes of the next forwards: `batch` sequences of which this rank holds `local_tokens`
  // each (a variable-length step runs sequences of many lengths through one group's op).
  void reshape(i64 batch, i64 local_tokens);
  void forward(int layer, float* out, const float* q, const float* k, const float* v) override;
  void backward(int layer, float* dq, float* dk, float* dv, const float* dout) override;
  void release(int layer) override { contexts_[std::size_t(layer)] = CpContext(); }
  CpStats stats() const;  // summed over layers, last step
  // The packed documents of the next forwards (cu_seqlens over the global sequence; empty: one).
  void set_documents(std::vector<std::int64_t> cu_seqlens) { documents_ = std::move(cu_seqlens); }

 private:
  Shape q_, kv_;
  DType dtype_;
  // bf16 only: one layer's q | k | v | out in the forward, dq | dk | dv | dout in the backward.
  std::vector<std::uint16_t> q16_, k16_, v16_, o16_;
  ContextParallelAttention attention_;
  std::vector<CpContext> contexts_;  // per layer, from its forward
  std::vector<CpStats> stats_;       // per layer, forward + backward
  std::vector<std::int64_t> documents_;
};

// Float64, one process: the reference attention (for the finite-difference check).
class ReferenceAttention : public AttentionOp<double> {
 public:
  ReferenceAttention(const GptConfig& model, i64 batch, i64 tokens);
  void forward(int layer, double* out, const double* q, const double* k, const double* v) override;
  void backward(int layer, double* dq, double* dk, double* dv, const double* dout) override;

 private:
  Shape q_, kv_;
  std::vector<RefTensor> saved_;  // q, k, v per layer
};

}  // namespace ulysses::train
