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

namespace ulysses::train {

struct GptConfig {
  i64 vocab = 256, layers = 2, width = 64, heads = 4, kv_heads = 2, head_dim = 16, hidden = 172;
  // "" when valid, else the first problem (names the values).
  std::string error() const;
  i64 num_params() const;
  bool operator==(const GptConfig&) const = default;
};

// Offsets of every weight in the one parameter slab (and the same for gradients).
struct ParamLayout {
  struct Layer { i64 rms1, wq, wk, wv, wo, rms2, w1, w3, w2; };
  i64 wte = 0, rmsf = 0, lm_head = 0, total = 0;
  std::vector<Layer> layer;
  explicit ParamLayout(const GptConfig& c);
};

// The attention core, [B, n, H, D] / [B, n, Hkv, D] row-major (bshd) on this rank.
template <class T>
class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  virtual void forward(int layer, T* out, const T* q, const T* k, const T* v) = 0;
  virtual void backward(int layer, T* dq, T* dk, T* dv, const T* dout) = 0;
};

template <class T>
class Gpt {
 public:
  explicit Gpt(const GptConfig& c);
  void init_params(std::uint64_t seed);  // deterministic, identical on every rank

  // tokens, labels: [B·n] for this rank's rows; pos: [n] global positions of those rows.
  // Returns the SUM of this rank's token losses; keeps what backward needs. grad_scale is
  // the loss's normalisation (1 / tokens over all ranks). argmax (optional) gets predictions.
  T forward(AttentionOp<T>& att, const int* tokens, const int* labels, const i64* pos, i64 B, i64 n, T grad_scale,
            int* argmax = nullptr);
  // Accumulates d(loss)/d(params) into grads (zero them first).
  void backward(AttentionOp<T>& att);

  GptConfig config;
  ParamLayout layout;
  std::vector<T> params, grads;

 private:
  struct LayerActs { std::vector<T> x, xn1, rstd1, q, k, v, att, x2, xn2, rstd2, a, g, h; };
  std::vector<LayerActs> acts_;
  std::vector<T> x_final_, xf_, rstdf_, dlogits_;
  std::vector<int> tokens_;
  std::vector<i64> pos_rows_;
  i64 N_ = 0, B_ = 0, n_ = 0;
};

}  // namespace ulysses::train
