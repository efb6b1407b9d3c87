#include "train/attention_ops.hpp"

#include <algorithm>

namespace ulysses::train {

namespace {
CpConfig causal(CpConfig c) {
  c.causal = true;
  return c;
}
TensorView view(const float* p, const Shape& s) {
  return TensorView::dense(const_cast<float*>(p), DType::f32, s, Layout::bshd);
}
}  // namespace

CpAttention::CpAttention(Communicator& comm, const CpConfig& cp, const GptConfig& m, i64 batch, i64 local_tokens)
    : q_{batch, local_tokens, m.heads, m.head_dim}, kv_{batch, local_tokens, m.kv_heads, m.head_dim},
      attention_(comm, causal(cp)), contexts_(std::size_t(m.layers)), stats_(std::size_t(m.layers)) {}

void CpAttention::forward(int layer, float* out, const float* q, const float* k, const float* v) {
  const std::size_t l = std::size_t(layer);
  contexts_[l] = attention_.forward(view(out, q_), view(q, q_), view(k, kv_), view(v, kv_), documents_);
  stats_[l] = contexts_[l].stats();
}

void CpAttention::backward(int layer, float* dq, float* dk, float* dv, const float* dout) {
  const std::size_t l = std::size_t(layer);
  stats_[l] += attention_.backward(contexts_[l], view(dq, q_), view(dk, kv_), view(dv, kv_), view(dout, q_));
  contexts_[l] = CpContext();  // its memory is not needed any more
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
