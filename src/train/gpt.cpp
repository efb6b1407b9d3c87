#include "train/gpt.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace ulysses::train {

std::string GptConfig::error() const {
  for (auto [name, v] : {std::pair{"vocab", vocab}, {"layers", layers}, {"width", width}, {"heads", heads},
                         {"kv_heads", kv_heads}, {"head_dim", head_dim}, {"hidden", hidden}})
    if (v <= 0) return fmt::format("{} must be positive, got {}", name, v);
  if (heads % kv_heads != 0) return fmt::format("heads ({}) must be divisible by kv_heads ({})", heads, kv_heads);
  if (head_dim % 2 != 0) return fmt::format("head_dim ({}) must be even for RoPE", head_dim);
  if (vocab > 256) return fmt::format("vocab ({}) must be at most 256 (byte-level)", vocab);
  return "";
}

i64 GptConfig::num_params() const { return ParamLayout(*this).total; }

ParamLayout::ParamLayout(const GptConfig& c) {
  i64 at = 0;
  auto take = [&](i64 n) { const i64 o = at; at += n; return o; };
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
Gpt<T>::Gpt(const GptConfig& c)
    : config(c), layout(c), params(std::size_t(layout.total)), grads(std::size_t(layout.total)),
      acts_(std::size_t(c.layers)) {}

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
    fill(L.wo, c.heads * c.head_dim * c.width, std::sqrt(3.0 / double(c.heads * c.head_dim)) / std::sqrt(2.0 * double(c.layers)));
    fill(L.w1, c.width * c.hidden, s_in);
    fill(L.w3, c.width * c.hidden, s_in);
    fill(L.w2, c.hidden * c.width, std::sqrt(3.0 / double(c.hidden)) / std::sqrt(2.0 * double(c.layers)));
  }
  ones(layout.rmsf, c.width);
  fill(layout.lm_head, c.width * c.vocab, s_in);
}

template <class T>
T Gpt<T>::forward(AttentionOp<T>& att, const int* tokens, const int* labels, const i64* pos, i64 B, i64 n,
                  T grad_scale, int* argmax) {
  const GptConfig& c = config;
  const i64 N = B * n, C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim, F = c.hidden;
  N_ = N;
  B_ = B;
  n_ = n;
  tokens_.assign(tokens, tokens + N);
  pos_rows_.resize(std::size_t(N));
  for (i64 r = 0; r < N; ++r) pos_rows_[std::size_t(r)] = pos[r % n];
  const T* P = params.data();
  std::vector<T> x(std::size_t(N * C)), tmp(std::size_t(N * C));
  embedding_forward(x.data(), tokens, P + layout.wte, N, C);
  for (i64 l = 0; l < c.layers; ++l) {
    LayerActs& A = acts_[std::size_t(l)];
    const auto& L = layout.layer[std::size_t(l)];
    A.x = x;
    A.xn1.resize(std::size_t(N * C));
    A.rstd1.resize(std::size_t(N));
    A.q.resize(std::size_t(N * QD));
    A.k.resize(std::size_t(N * KD));
    A.v.resize(std::size_t(N * KD));
    A.att.resize(std::size_t(N * QD));
    A.xn2.resize(std::size_t(N * C));
    A.rstd2.resize(std::size_t(N));
    A.a.resize(std::size_t(N * F));
    A.g.resize(std::size_t(N * F));
    A.h.resize(std::size_t(N * F));
    rmsnorm_forward(A.xn1.data(), A.rstd1.data(), x.data(), P + L.rms1, N, C);
    matmul_forward(A.q.data(), A.xn1.data(), P + L.wq, N, C, QD);
    matmul_forward(A.k.data(), A.xn1.data(), P + L.wk, N, C, KD);
    matmul_forward(A.v.data(), A.xn1.data(), P + L.wv, N, C, KD);
    rope_forward(A.q.data(), pos_rows_.data(), N, c.heads, c.head_dim);
    rope_forward(A.k.data(), pos_rows_.data(), N, c.kv_heads, c.head_dim);
    att.forward(int(l), A.att.data(), A.q.data(), A.k.data(), A.v.data());
    matmul_forward(tmp.data(), A.att.data(), P + L.wo, N, QD, C);
    A.x2.resize(std::size_t(N * C));
    for (i64 i = 0; i < N * C; ++i) A.x2[std::size_t(i)] = x[std::size_t(i)] + tmp[std::size_t(i)];
    rmsnorm_forward(A.xn2.data(), A.rstd2.data(), A.x2.data(), P + L.rms2, N, C);
    matmul_forward(A.a.data(), A.xn2.data(), P + L.w1, N, C, F);
    matmul_forward(A.g.data(), A.xn2.data(), P + L.w3, N, C, F);
    swiglu_forward(A.h.data(), A.a.data(), A.g.data(), N * F);
    matmul_forward(tmp.data(), A.h.data(), P + L.w2, N, F, C);
    for (i64 i = 0; i < N * C; ++i) x[std::size_t(i)] = A.x2[std::size_t(i)] + tmp[std::size_t(i)];
  }
  x_final_ = x;
  xf_.resize(std::size_t(N * C));
  rstdf_.resize(std::size_t(N));
  rmsnorm_forward(xf_.data(), rstdf_.data(), x.data(), P + layout.rmsf, N, C);
  std::vector<T> logits(std::size_t(N * c.vocab));
  matmul_forward(logits.data(), xf_.data(), P + layout.lm_head, N, C, c.vocab);
  dlogits_.resize(logits.size());
  return crossentropy_forward_backward(dlogits_.data(), logits.data(), labels, N, c.vocab, grad_scale, argmax);
}

template <class T>
void Gpt<T>::backward(AttentionOp<T>& att) {
  const GptConfig& c = config;
  const i64 N = N_, C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim, F = c.hidden;
  const T* P = params.data();
  T* G = grads.data();
  auto zeros = [](i64 n) { return std::vector<T>(std::size_t(n), T(0)); };
  std::vector<T> dxf = zeros(N * C), dx = zeros(N * C);
  matmul_backward(dxf.data(), G + layout.lm_head, dlogits_.data(), xf_.data(), P + layout.lm_head, N, C, c.vocab);
  rmsnorm_backward(dx.data(), G + layout.rmsf, dxf.data(), x_final_.data(), P + layout.rmsf, rstdf_.data(), N, C);
  for (i64 l = c.layers - 1; l >= 0; --l) {
    LayerActs& A = acts_[std::size_t(l)];
    const auto& L = layout.layer[std::size_t(l)];
    // MLP branch: x3 = x2 + w2·swiglu(w1·xn2, w3·xn2); the residual passes dx through.
    std::vector<T> dx2 = dx, dh = zeros(N * F), da = zeros(N * F), dg = zeros(N * F), dxn2 = zeros(N * C);
    matmul_backward(dh.data(), G + L.w2, dx.data(), A.h.data(), P + L.w2, N, F, C);
    swiglu_backward(da.data(), dg.data(), dh.data(), A.a.data(), A.g.data(), N * F);
    matmul_backward(dxn2.data(), G + L.w1, da.data(), A.xn2.data(), P + L.w1, N, C, F);
    matmul_backward(dxn2.data(), G + L.w3, dg.data(), A.xn2.data(), P + L.w3, N, C, F);
    rmsnorm_backward(dx2.data(), G + L.rms2, dxn2.data(), A.x2.data(), P + L.rms2, A.rstd2.data(), N, C);
    // Attention branch: x2 = x + wo·attention(rope(wq·xn1), rope(wk·xn1), wv·xn1).
    std::vector<T> datt = zeros(N * QD), dq = zeros(N * QD), dk = zeros(N * KD), dv = zeros(N * KD);
    std::vector<T> dxn1 = zeros(N * C);
    matmul_backward(datt.data(), G + L.wo, dx2.data(), A.att.data(), P + L.wo, N, QD, C);
    att.backward(int(l), dq.data(), dk.data(), dv.data(), datt.data());
    rope_backward(dq.data(), pos_rows_.data(), N, c.heads, c.head_dim);
    rope_backward(dk.data(), pos_rows_.data(), N, c.kv_heads, c.head_dim);
    matmul_backward(dxn1.data(), G + L.wq, dq.data(), A.xn1.data(), P + L.wq, N, C, QD);
    matmul_backward(dxn1.data(), G + L.wk, dk.data(), A.xn1.data(), P + L.wk, N, C, KD);
    matmul_backward(dxn1.data(), G + L.wv, dv.data(), A.xn1.data(), P + L.wv, N, C, KD);
    dx = dx2;
    rmsnorm_backward(dx.data(), G + L.rms1, dxn1.data(), A.x.data(), P + L.rms1, A.rstd1.data(), N, C);
  }
  embedding_backward(G + layout.wte, dx.data(), tokens_.data(), N, C);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace ulysses::train
