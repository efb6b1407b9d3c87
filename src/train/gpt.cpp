#include "train/gpt.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "train/gemm.hpp"

namespace ulysses::train {

std::string GptConfig::error() const {
  for (auto [name, v] : {std::pair{"vocab", vocab},
                         {"layers", layers},
                         {"width", width},
                         {"heads", heads},
                         {"kv_heads", kv_heads},
                         {"head_dim", head_dim},
                         {"hidden", hidden}})
    if (v <= 0) return fmt::format("{} must be positive, got {}", name, v);
  if (heads % kv_heads != 0) return fmt::format("heads ({}) must be divisible by kv_heads ({})", heads, kv_heads);
  if (head_dim % 2 != 0) return fmt::format("head_dim ({}) must be even for RoPE", head_dim);
  if (vocab > 256) return fmt::format("vocab ({}) must be at most 256 (byte-level)", vocab);
  return "";
}

i64 GptConfig::swiglu_hidden(i64 width) { return ((8 * width + 2) / 3 + 3) / 4 * 4; }

i64 GptConfig::num_params() const { return ParamLayout(*this).total; }

double GptConfig::train_flops(i64 len) const {
  const double C = double(width), QD = double(heads * head_dim), KD = double(kv_heads * head_dim), F = double(hidden);
  const double s = double(len), L = double(layers);
  const double gemms = 2.0 * s * (L * (C * QD + 2 * C * KD + QD * C + 3 * C * F) + C * double(vocab));
  const double attention = L * 2.0 * s * s * QD;
  return 3.0 * (gemms + attention);
}

ParamLayout::ParamLayout(const GptConfig& c) {
  i64 at = 0;
  auto take = [&](i64 n) {
    const i64 o = at;
    at += n;
    return o;
  };
  const i64 C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim, F = c.hidden;
  wte = take(c.vocab * C);
  for (i64 l = 0; l < c.layers; ++l) {
    Layer L;
    L.rms1 = take(C);
    L.wq = take(C * QD);
    L.wk = take(C * KD);
    L.wv = take(C * KD);
    L.wo = take(QD * C);
    L.rms2 = take(C);
    L.w1 = take(C * F);
    L.w3 = take(C * F);
    L.w2 = take(F * C);
    layer.push_back(L);
  }
  rmsf = take(C);
  lm_head = take(C * c.vocab);
  total = at;
}

template <class T>
Gpt<T>::Gpt(const GptConfig& c, MemoryOptions m, bool bf16)
    : config(c), memory(m), bf16_matmuls(bf16 && std::is_same_v<T, float>), layout(c),
      params(std::size_t(layout.total)), grads(std::size_t(layout.total)), acts_(std::size_t(c.layers)) {}

template <class T>
void Gpt<T>::linear_forward(T* out, const T* inp, i64 w, i64 N, i64 IC, i64 OC) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16_matmuls) return matmul_forward_bf16(out, inp, params16_.data() + w, N, IC, OC);
  matmul_forward(out, inp, params.data() + w, N, IC, OC);
}

template <class T>
void Gpt<T>::linear_backward(T* dinp, const T* dout, const T* inp, i64 w, i64 N, i64 IC, i64 OC) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16_matmuls) return matmul_backward_bf16(dinp, grads.data() + w, dout, inp, params16_.data() + w, N, IC, OC);
  matmul_backward(dinp, grads.data() + w, dout, inp, params.data() + w, N, IC, OC);
}

template <class T>
void Gpt<T>::init_params(std::uint64_t seed) {
  // splitmix64 stream: the same values on every rank and in float and double.
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto uniform = [&]() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return double(z >> 11) / double(1ull << 53) * 2.0 - 1.0;  // [-1, 1)
  };
  const GptConfig& c = config;
  auto fill = [&](i64 off, i64 n, double scale) {
    for (i64 i = 0; i < n; ++i) params[std::size_t(off + i)] = T(float(uniform() * scale));
  };
  auto ones = [&](i64 off, i64 n) { std::fill_n(params.begin() + off, n, T(1)); };
  const double s_in = std::sqrt(3.0 / double(c.width));  // uniform with variance 1/fan_in
  fill(layout.wte, c.vocab * c.width, 1.0);
  for (const auto& L : layout.layer) {
    ones(L.rms1, c.width);
    ones(L.rms2, c.width);
    fill(L.wq, c.width * c.heads * c.head_dim, s_in);
    fill(L.wk, c.width * c.kv_heads * c.head_dim, s_in);
    fill(L.wv, c.width * c.kv_heads * c.head_dim, s_in);
    fill(L.wo, c.heads * c.head_dim * c.width,
         std::sqrt(3.0 / double(c.heads * c.head_dim)) / std::sqrt(2.0 * double(c.layers)));
    fill(L.w1, c.width * c.hidden, s_in);
    fill(L.w3, c.width * c.hidden, s_in);
    fill(L.w2, c.hidden * c.width, std::sqrt(3.0 / double(c.hidden)) / std::sqrt(2.0 * double(c.layers)));
  }
  ones(layout.rmsf, c.width);
  fill(layout.lm_head, c.width * c.vocab, s_in);
}

namespace {
template <class T>
void zeroed(Buffer<T>& v, i64 n) {
  v.assign(std::size_t(n), T(0));
}
// fn(first row, rows) over [0, N) in tiles of `tile` rows.
template <class Fn>
void for_tiles(i64 N, i64 tile, Fn&& fn) {
  for (i64 r0 = 0; r0 < N; r0 += tile) fn(r0, std::min(tile, N - r0));
}
}  // namespace

template <class T>
T Gpt<T>::forward(AttentionOp<T>& att, const int* tokens, const int* labels, const i64* pos, i64 B, i64 n, T grad_scale,
                  int* argmax) {
  const GptConfig& c = config;
  const i64 N = B * n, C = c.width;
  // A step of another size first frees the last one's kept state: growing each buffer in place
  // would hold its old and new copies at once, and the freed smaller ones do not fit the larger
  // (a sequence of 1031 tokens after the 1024-token calibration peaked 1.2x the model's).
  if (N != N_) {
    for (LayerActs& a : acts_) a = LayerActs{};
    work_ = LayerActs{};
    for (auto* v : {&x_final_, &xf_, &rstdf_, &dlogits_}) Buffer<T>().swap(*v);
  }
  N_ = N;
  B_ = B;
  n_ = n;
  tokens_.assign(tokens, tokens + N);
  labels_.assign(labels, labels + N);
  grad_scale_ = grad_scale;
  std::vector<i64> pos_rows(static_cast<std::size_t>(N));
  for (i64 r = 0; r < N; ++r) pos_rows[std::size_t(r)] = pos[r % n];
  rope_.build(pos_rows.data(), N, c.head_dim);
  if constexpr (std::is_same_v<T, float>)  // the weights changed since the last step
    if (bf16_matmuls) round_to_bf16(params16_, params.data(), layout.total);
  Buffer<T> x(std::size_t(N * C));
  embedding_forward(x.data(), tokens, params.data() + layout.wte, N, C);
  for (i64 l = 0; l < c.layers; ++l) {
    LayerActs& kept = acts_[std::size_t(l)];
    kept.x = x;
    layer_forward(att, l, kept.x.data(), memory.checkpoint_activations ? work_ : kept, x.data());
    if (memory.checkpoint_activations) att.release(int(l));
  }
  x_final_ = std::move(x);
  xf_.resize(std::size_t(N * C));
  rstdf_.resize(std::size_t(N));
  rmsnorm_forward(xf_.data(), rstdf_.data(), x_final_.data(), params.data() + layout.rmsf, N, C);
  return loss_forward(labels, grad_scale, argmax);
}

// x_out = the layer of x; A gets what its backward reads. x_out may not alias x.
template <class T>
void Gpt<T>::layer_forward(AttentionOp<T>& att, i64 l, const T* x, LayerActs& A, T* x_out) {
  const GptConfig& c = config;
  const i64 N = N_, C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim;
  const auto& L = layout.layer[std::size_t(l)];
  const T* P = params.data();
  for (auto [v, cols] : {std::pair{&A.xn1, C},
                         {&A.rstd1, 1},
                         {&A.q, QD},
                         {&A.k, KD},
                         {&A.v, KD},
                         {&A.att, QD},
                         {&A.x2, C},
                         {&A.xn2, C},
                         {&A.rstd2, 1}})
    v->resize(std::size_t(N * cols));
  rmsnorm_forward(A.xn1.data(), A.rstd1.data(), x, P + L.rms1, N, C);
  linear_forward(A.q.data(), A.xn1.data(), L.wq, N, C, QD);
  linear_forward(A.k.data(), A.xn1.data(), L.wk, N, C, KD);
  linear_forward(A.v.data(), A.xn1.data(), L.wv, N, C, KD);
  rope_forward(A.q.data(), rope_, N, c.heads, c.head_dim);
  rope_forward(A.k.data(), rope_, N, c.kv_heads, c.head_dim);
  att.forward(int(l), A.att.data(), A.q.data(), A.k.data(), A.v.data());
  for (auto* v : {&A.q, &A.k, &A.v}) Buffer<T>().swap(*v);  // the op keeps what its backward needs
  linear_forward(x_out, A.att.data(), L.wo, N, QD, C);
  for (i64 i = 0; i < N * C; ++i) A.x2[std::size_t(i)] = x[i] + x_out[i];
  rmsnorm_forward(A.xn2.data(), A.rstd2.data(), A.x2.data(), P + L.rms2, N, C);
  mlp_forward(A, L, x_out);
  for (i64 i = 0; i < N * C; ++i) x_out[i] += A.x2[std::size_t(i)];
}

// out = w2 · swiglu(w1 · xn2, w3 · xn2), whole or a tile of rows at a time (nothing kept).
template <class T>
void Gpt<T>::mlp_forward(LayerActs& A, const typename ParamLayout::Layer& L, T* out) {
  const i64 N = N_, C = config.width, F = config.hidden;
  auto rows = [&](i64 r0, i64 n, T* a, T* g, T* h) {
    linear_forward(a, A.xn2.data() + r0 * C, L.w1, n, C, F);
    linear_forward(g, A.xn2.data() + r0 * C, L.w3, n, C, F);
    swiglu_forward(h, a, g, n * F);
    linear_forward(out + r0 * C, h, L.w2, n, F, C);
  };
  if (!memory.tiled_mlp) {
    for (auto* v : {&A.a, &A.g, &A.h}) v->resize(std::size_t(N * F));
    rows(0, N, A.a.data(), A.g.data(), A.h.data());
    return;
  }
  const i64 tile = std::min(memory.tile_rows, N);
  Buffer<T> a(std::size_t(tile * F)), g(a.size());
  for_tiles(N, tile, [&](i64 r0, i64 n) { rows(r0, n, a.data(), g.data(), a.data()); });
}

// The summed loss of the rows (and dlogits_ for the backward unless tiled).
template <class T>
T Gpt<T>::loss_forward(const int* labels, T grad_scale, int* argmax) {
  const i64 N = N_, C = config.width, V = config.vocab;
  const T* head = params.data() + layout.lm_head;
  if (!memory.tiled_loss) {
    Buffer<T> logits(std::size_t(N * V));
    matmul_forward(logits.data(), xf_.data(), head, N, C, V);
    dlogits_.resize(logits.size());
    return crossentropy_forward_backward(dlogits_.data(), logits.data(), labels, N, V, grad_scale, argmax);
  }
  const i64 tile = std::min(memory.tile_rows, N);
  Buffer<T> logits(std::size_t(tile * V));
  T total = 0;
  for_tiles(N, tile, [&](i64 r0, i64 n) {
    matmul_forward(logits.data(), xf_.data() + r0 * C, head, n, C, V);
    total += crossentropy_forward_backward<T>(nullptr, logits.data(), labels + r0, n, V, grad_scale,
                                              argmax ? argmax + r0 : nullptr);
  });
  return total;
}

// dxf += d(loss)/d(xf), and the LM head's gradient; the logits recomputed per tile if tiled.
template <class T>
void Gpt<T>::loss_backward(T* dxf) {
  const i64 N = N_, C = config.width, V = config.vocab;
  const T* head = params.data() + layout.lm_head;
  T* dhead = grads.data() + layout.lm_head;
  if (!memory.tiled_loss) {
    matmul_backward(dxf, dhead, dlogits_.data(), xf_.data(), head, N, C, V);
    Buffer<T>().swap(dlogits_);  // not needed any more: below the layers' backward peak
    return;
  }
  const i64 tile = std::min(memory.tile_rows, N);
  Buffer<T> logits(std::size_t(tile * V)), dlogits(logits.size());
  for_tiles(N, tile, [&](i64 r0, i64 n) {
    matmul_forward(logits.data(), xf_.data() + r0 * C, head, n, C, V);
    crossentropy_forward_backward(dlogits.data(), logits.data(), labels_.data() + r0, n, V, grad_scale_);
    matmul_backward(dxf + r0 * C, dhead, dlogits.data(), xf_.data() + r0 * C, head, n, C, V);
  });
}

template <class T>
void Gpt<T>::backward(AttentionOp<T>& att) {
  const GptConfig& c = config;
  const i64 N = N_, C = c.width;
  Buffer<T> dx(std::size_t(N * C), T(0));
  {
    Buffer<T> dxf(std::size_t(N * C), T(0));
    loss_backward(dxf.data());
    rmsnorm_backward(dx.data(), grads.data() + layout.rmsf, dxf.data(), x_final_.data(), params.data() + layout.rmsf,
                     rstdf_.data(), N, C);
  }
  Buffer<T> scratch(memory.checkpoint_activations ? std::size_t(N * C) : 0);  // the recompute's output
  for (i64 l = c.layers - 1; l >= 0; --l) {
    const LayerActs& kept = acts_[std::size_t(l)];
    if (memory.checkpoint_activations) layer_forward(att, l, kept.x.data(), work_, scratch.data());
    LayerGrads G;  // freed before the next layer's recompute runs
    layer_backward(att, l, kept.x.data(), memory.checkpoint_activations ? work_ : kept, G, dx);
  }
  embedding_backward(grads.data() + layout.wte, dx.data(), tokens_.data(), N, C);
}

// dx: the gradient of the layer's output in, of its input x out.
template <class T>
void Gpt<T>::layer_backward(AttentionOp<T>& att, i64 l, const T* x, const LayerActs& A, LayerGrads& G, Buffer<T>& dx) {
  const GptConfig& c = config;
  const i64 N = N_, C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim;
  const auto& L = layout.layer[std::size_t(l)];
  const T* P = params.data();
  T* W = grads.data();
  // MLP branch: out = x2 + w2·swiglu(w1·xn2, w3·xn2); the residual passes dx through.
  G.dx2 = dx;
  mlp_backward(A, L, G, dx.data());
  rmsnorm_backward(G.dx2.data(), W + L.rms2, G.dxn2.data(), A.x2.data(), P + L.rms2, A.rstd2.data(), N, C);
  // Attention branch: x2 = x + wo·attention(rope(wq·xn1), rope(wk·xn1), wv·xn1).
  for (auto [v, cols] : {std::pair{&G.datt, QD}, {&G.dq, QD}, {&G.dk, KD}, {&G.dv, KD}, {&G.dxn1, C}})
    zeroed(*v, N * cols);
  linear_backward(G.datt.data(), G.dx2.data(), A.att.data(), L.wo, N, QD, C);
  att.backward(int(l), G.dq.data(), G.dk.data(), G.dv.data(), G.datt.data());
  rope_backward(G.dq.data(), rope_, N, c.heads, c.head_dim);
  rope_backward(G.dk.data(), rope_, N, c.kv_heads, c.head_dim);
  linear_backward(G.dxn1.data(), G.dq.data(), A.xn1.data(), L.wq, N, C, QD);
  linear_backward(G.dxn1.data(), G.dk.data(), A.xn1.data(), L.wk, N, C, KD);
  linear_backward(G.dxn1.data(), G.dv.data(), A.xn1.data(), L.wv, N, C, KD);
  dx = G.dx2;
  rmsnorm_backward(dx.data(), W + L.rms1, G.dxn1.data(), x, P + L.rms1, A.rstd1.data(), N, C);
}

// G.dxn2 = d/d(xn2) of the MLP for output gradient dout, and the MLP's weight gradients; under
// tiled_mlp the intermediates are recomputed a tile at a time.
template <class T>
void Gpt<T>::mlp_backward(const LayerActs& A, const typename ParamLayout::Layer& L, LayerGrads& G, const T* dout) {
  const i64 N = N_, C = config.width, F = config.hidden;
  zeroed(G.dxn2, N * C);
  const i64 tile = memory.tiled_mlp ? std::min(memory.tile_rows, N) : N;
  for (auto* v : {&G.dh, &G.da, &G.dg}) v->resize(std::size_t(tile * F));
  auto rows = [&](i64 r0, i64 n, const T* a, const T* g, const T* h) {
    for (auto* v : {&G.dh, &G.da, &G.dg}) std::fill_n(v->begin(), n * F, T(0));
    const T* xn2 = A.xn2.data() + r0 * C;
    linear_backward(G.dh.data(), dout + r0 * C, h, L.w2, n, F, C);
    swiglu_backward(G.da.data(), G.dg.data(), G.dh.data(), a, g, n * F);
    linear_backward(G.dxn2.data() + r0 * C, G.da.data(), xn2, L.w1, n, C, F);
    linear_backward(G.dxn2.data() + r0 * C, G.dg.data(), xn2, L.w3, n, C, F);
  };
  if (!memory.tiled_mlp) {
    rows(0, N, A.a.data(), A.g.data(), A.h.data());
    return;
  }
  Buffer<T> a(std::size_t(tile * F)), g(a.size()), h(a.size());
  for_tiles(N, tile, [&](i64 r0, i64 n) {
    linear_forward(a.data(), A.xn2.data() + r0 * C, L.w1, n, C, F);
    linear_forward(g.data(), A.xn2.data() + r0 * C, L.w3, n, C, F);
    swiglu_forward(h.data(), a.data(), g.data(), n * F);
    rows(r0, n, a.data(), g.data(), h.data());
  });
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace ulysses::train
