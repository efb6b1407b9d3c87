// A small decoder-only transformer for the training demo (llm.c style):
//   token embedding → L × [RMSNorm → Q,K,V projections → RoPE (global positions) →
//   context-parallel attention → output projection → residual → RMSNorm → SwiGLU MLP →
//   residual] → RMSNorm → LM head → cross-entropy.
// Every rank holds all weights and n = s/cp tokens of each of the B sequences; only the
// attention talks to other ranks. Templated on the scalar: float for training, double for
// the finite-difference gradient check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/layers.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses::train {

// Activations live in the host's block pool (ulysses/core/tensor.hpp) beside the attention's tensors,
// not in malloc's heap: a step's buffers come and go in sizes that change with its sequences, and
// the heap, which keeps freed memory resident between steps (train_command.cpp), held freed
// blocks of one length that the next could not use (a pareto step on one rank peaked 1.12x the
// model's). The pool maps large blocks, reuses near sizes and holds no more than its busiest
// moment needed.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(host_allocator().allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) { host_allocator().deallocate(p, n * sizeof(T)); }
  friend bool operator==(const PoolAllocator&, const PoolAllocator&) { return true; }
  friend bool operator!=(const PoolAllocator&, const PoolAllocator&) { return false; }
};
template <class T>
using Buffer = std::vector<T, PoolAllocator<T>>;

struct GptConfig {
  i64 vocab = 256, layers = 2, width = 64, heads = 4, kv_heads = 2, head_dim = 16, hidden = 172;
  // "" when valid, else the first problem (names the values).
  std::string error() const;
  i64 num_params() const;
  // Model FLOPs of one training step on one sequence of `len` tokens: the forward's GEMMs (2
  // per weight per token: projections, MLP, LM head), its causal attention (2·len²·QD per layer,
  // half of the 4·len²·QD of Q·Kᵀ and P·V), and a backward of twice the forward. Recompute
  // (activation checkpointing, the flash backward's scores) is not model work: excluded.
  double train_flops(i64 len) const;
  bool operator==(const GptConfig&) const = default;
  // The default SwiGLU hidden size for `width` (LLaMA's sizing): 8/3 · width, rounded up to a
  // multiple of 4 (172 at width 64, 344 at 128, 1368 at 512).
  static i64 swiglu_hidden(i64 width);
};

// How the activations are kept; each technique gives the same loss and gradients
// as none, to rounding (the tiles sum in another order).
struct MemoryOptions {
  bool checkpoint_activations = false;  // keep each layer's input only; recompute the layer (its
                                        // attention forward included) in the backward
  bool tiled_mlp = false;               // the [rows, hidden] SwiGLU intermediates exist one tile at a time
  bool tiled_loss = false;              // the [rows, vocab] logits exist one tile at a time
  i64 tile_rows = 1024;                 // rows of a tile
  bool operator==(const MemoryOptions&) const = default;
};

// Offsets of every weight in the one parameter slab (and the same for gradients).
struct ParamLayout {
  struct Layer {
    i64 rms1, wq, wk, wv, wo, rms2, w1, w3, w2;
  };
  i64 wte = 0, rmsf = 0, lm_head = 0, total = 0;
  std::vector<Layer> layer;
  explicit ParamLayout(const GptConfig& c);
};

// The attention core, [B, n, H, D] / [B, n, Hkv, D] row-major (bshd) on this rank.
template <class T>
class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  // Keeps what its backward needs (the model drops q, k, v once this returns).
  virtual void forward(int layer, T* out, const T* q, const T* k, const T* v) = 0;
  virtual void backward(int layer, T* dq, T* dk, T* dv, const T* dout) = 0;
  // The layer's forward state is not needed (it will be recomputed): drop it.
  virtual void release(int /*layer*/) {}
};

template <class T>
class Gpt {
 public:
  // bf16_matmuls (float only): the projections and the MLP multiply in bfloat16 with float32
  // accumulation (train/gemm.hpp); the LM head, the master weights and the gradients stay float32.
  explicit Gpt(const GptConfig& c, MemoryOptions memory = {}, bool bf16_matmuls = false);
  void init_params(std::uint64_t seed);  // deterministic, identical on every rank

  // tokens, labels: [B·n] for this rank's rows; pos: [n] global positions of those rows.
  // Returns the SUM of this rank's token losses; keeps what backward needs. grad_scale is
  // the loss's normalisation (1 / tokens over all ranks). argmax (optional) gets predictions.
  T forward(AttentionOp<T>& att, const int* tokens, const int* labels, const i64* pos, i64 B, i64 n, T grad_scale,
            int* argmax = nullptr);
  // Accumulates d(loss)/d(params) into grads (zero them first).
  void backward(AttentionOp<T>& att);

  GptConfig config;
  MemoryOptions memory;
  bool bf16_matmuls;
  ParamLayout layout;
  std::vector<T> params, grads;

 private:
  // One layer's forward state: its input x and what its backward reads (a, g, h stay empty
  // under tiled_mlp; q, k, v only live until the attention forward, whose op keeps its own
  // copies: the backward needs xn1 and dq, dk, dv only).
  struct LayerActs {
    Buffer<T> x, xn1, rstd1, q, k, v, att, x2, xn2, rstd2, a, g, h;
  };
  // The layer's gradient temporaries, allocated per layer of the backward.
  struct LayerGrads {
    Buffer<T> dx2, dxn2, dh, da, dg, datt, dq, dk, dv, dxn1;
  };
  void layer_forward(AttentionOp<T>& att, i64 l, const T* x, LayerActs& A, T* x_out);
  void layer_backward(AttentionOp<T>& att, i64 l, const T* x, const LayerActs& A, LayerGrads& G, Buffer<T>& dx);
  void mlp_forward(LayerActs& A, const typename ParamLayout::Layer& L, T* out);
  void mlp_backward(const LayerActs& A, const typename ParamLayout::Layer& L, LayerGrads& G, const T* dout);
  // out[N, OC] = inp[N, IC] · the weight at slab offset w, and its backward (+= into dinp and
  // the weight's gradient): in bf16 under bf16_matmuls.
  void linear_forward(T* out, const T* inp, i64 w, i64 N, i64 IC, i64 OC);
  void linear_backward(T* dinp, const T* dout, const T* inp, i64 w, i64 N, i64 IC, i64 OC);
  T loss_forward(const int* labels, T grad_scale, int* argmax);
  void loss_backward(T* dxf);
  std::vector<LayerActs> acts_;  // per layer (only x under checkpoint_activations)
  LayerActs work_;               // the recomputed layer under checkpoint_activations
  Buffer<T> x_final_, xf_, rstdf_, dlogits_;
  std::vector<std::uint16_t> params16_;  // bf16_matmuls: the weights rounded, once per forward
  std::vector<int> labels_;
  T grad_scale_ = 1;
  std::vector<int> tokens_;
  RopeTable<T> rope_;  // this step's rotary cosines and sines
  i64 N_ = 0, B_ = 0, n_ = 0;
};

}  // namespace ulysses::train
