#include "train/attention_ops.hpp"

#include <algorithm>
#include <utility>

#include "ulysses/core/bf16.hpp"

namespace ulysses::train {

namespace {
CpConfig causal(CpConfig c) {
  c.causal = true;
  return c;
}
TensorView view(const float* p, const Shape& s) {
  return TensorView::dense(const_cast<float*>(p), DType::f32, s, Layout::bshd);
}
TensorView view(std::vector<std::uint16_t>& p, const Shape& s) {
  return TensorView::dense(p.data(), DType::bf16, s, Layout::bshd);
}
void to_bf16(std::vector<std::uint16_t>& dst, const float* src) {
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = float_to_bf16(src[i]);
}
void to_f32(float* dst, const std::vector<std::uint16_t>& src) {
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] = bf16_to_float(src[i]);
}
}  // namespace

CpAttention::CpAttention(Communicator& comm, const CpConfig& cp, const GptConfig& m, i64 batch, i64 local_tokens,
                         DType dtype)
    : q_{batch, local_tokens, m.heads, m.head_dim}, kv_{batch, local_tokens, m.kv_heads, m.head_dim}, dtype_(dtype),
      attention_(comm, causal(cp)), contexts_(std::size_t(m.layers)), stats_(std::size_t(m.layers)) {
  reshape(batch, local_tokens);
}

void CpAttention::reshape(i64 batch, i64 local_tokens) {
  q_ = {batch, local_tokens, q_.h, q_.d};
  kv_ = {batch, local_tokens, kv_.h, kv_.d};
  if (dtype_ != DType::bf16) return;
  q16_.resize(std::size_t(q_.numel()));
  o16_.resize(std::size_t(q_.numel()));
  k16_.resize(std::size_t(kv_.numel()));
  v16_.resize(std::size_t(kv_.numel()));
}

void CpAttention::forward(int layer, float* out, const float* q, const float* k, const float* v) {
  const std::size_t l = std::size_t(layer);
  if (dtype_ == DType::bf16) {
    to_bf16(q16_, q);
    to_bf16(k16_, k);
    to_bf16(v16_, v);
    contexts_[l] = attention_.forward(view(o16_, q_), view(q16_, q_), view(k16_, kv_), view(v16_, kv_), documents_);
    to_f32(out, o16_);
  } else {
    contexts_[l] = attention_.forward(view(out, q_), view(q, q_), view(k, kv_), view(v, kv_), documents_);
  }
  stats_[l] = contexts_[l].stats();
}

void CpAttention::backward(int layer, float* dq, float* dk, float* dv, const float* dout) {
  const std::size_t l = std::size_t(layer);
  if (dtype_ == DType::bf16) {
    to_bf16(o16_, dout);
    stats_[l] +=
        attention_.backward(std::move(contexts_[l]), view(q16_, q_), view(k16_, kv_), view(v16_, kv_), view(o16_, q_));
    to_f32(dq, q16_);
    to_f32(dk, k16_);
    to_f32(dv, v16_);
  } else {  // the context's last use: the strategy may compute in its buffers (and frees them)
    stats_[l] +=
        attention_.backward(std::move(contexts_[l]), view(dq, q_), view(dk, kv_), view(dv, kv_), view(dout, q_));
  }
}

CpStats CpAttention::stats() const {
  CpStats s;
  for (const CpStats& l : stats_) s += l;
  return s;
}

ReferenceAttention::ReferenceAttention(const GptConfig& m, i64 batch, i64 tokens)
    : q_{batch, tokens, m.heads, m.head_dim}, kv_{batch, tokens, m.kv_heads, m.head_dim},
      saved_(std::size_t(3 * m.layers)) {}

void ReferenceAttention::forward(int layer, double* out, const double* q, const double* k, const double* v) {
  RefTensor* s = &saved_[std::size_t(3 * layer)];
  s[0] = RefTensor(q_);
  s[1] = RefTensor(kv_);
  s[2] = RefTensor(kv_);
  std::copy_n(q, q_.numel(), s[0].data.begin());
  std::copy_n(k, kv_.numel(), s[1].data.begin());
  std::copy_n(v, kv_.numel(), s[2].data.begin());
  RefTensor o;
  std::vector<double> lse;
  reference_attention_forward(o, lse, s[0], s[1], s[2], AttentionParams{.causal = true});
  std::copy(o.data.begin(), o.data.end(), out);
}

void ReferenceAttention::backward(int layer, double* dq, double* dk, double* dv, const double* dout) {
  const RefTensor* s = &saved_[std::size_t(3 * layer)];
  RefTensor g(q_), rdq, rdk, rdv;
  std::copy_n(dout, q_.numel(), g.data.begin());
  reference_attention_backward(rdq, rdk, rdv, g, s[0], s[1], s[2], AttentionParams{.causal = true});
  for (std::size_t i = 0; i < rdq.data.size(); ++i) dq[i] += rdq.data[i];
  for (std::size_t i = 0; i < rdk.data.size(); ++i) dk[i] += rdk.data[i];
  for (std::size_t i = 0; i < rdv.data.size(); ++i) dv[i] += rdv.data[i];
}

}  // namespace ulysses::train
