#include "train/attention_ops.hpp"

#include <algorithm>

namespace ulysses::train {

CpAttention::CpAttention(Communicator& comm, const CpConfig& cp, const GptConfig& m, i64 batch, i64 local_tokens)
    : q_{batch, local_tokens, m.heads, m.head_dim}, kv_{batch, local_tokens, m.kv_heads, m.head_dim} {
  CpConfig c = cp;
  c.causal = true;
  for (i64 l = 0; l < m.layers; ++l) layers_.push_back(std::make_unique<ContextParallelAttention>(comm, c));
}

void CpAttention::forward(int layer, float* out, const float* q, const float* k, const float* v) {
  auto view = [](const float* p, const Shape& s) {
    return TensorView::dense(const_cast<float*>(p), DType::f32, s, Layout::bshd);
  };
  layers_[std::size_t(layer)]->forward(view(out, q_), view(q, q_), view(k, kv_), view(v, kv_));
}

void CpAttention::backward(int layer, float* dq, float* dk, float* dv, const float* dout) {
  auto view = [](const float* p, const Shape& s) {
    return TensorView::dense(const_cast<float*>(p), DType::f32, s, Layout::bshd);
  };
  layers_[std::size_t(layer)]->backward(view(dq, q_), view(dk, kv_), view(dv, kv_), view(dout, q_));
}

CpStats CpAttention::stats() const {
  CpStats s;
  for (const auto& l : layers_)
    for (const CpStats* x : {&l->forward_stats(), &l->backward_stats()}) {
      s.compute_s += x->compute_s;
      s.comm_exposed_s += x->comm_exposed_s;
      s.score_pairs += x->score_pairs;
    }
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
  reference_attention_forward(o, lse, s[0], s[1], s[2], {true, 0.0f, 0, 0});
  std::copy(o.data.begin(), o.data.end(), out);
}

void ReferenceAttention::backward(int layer, double* dq, double* dk, double* dv, const double* dout) {
  const RefTensor* s = &saved_[std::size_t(3 * layer)];
  RefTensor g(q_), rdq, rdk, rdv;
  std::copy_n(dout, q_.numel(), g.data.begin());
  reference_attention_backward(rdq, rdk, rdv, g, s[0], s[1], s[2], {true, 0.0f, 0, 0});
  for (std::size_t i = 0; i < rdq.data.size(); ++i) dq[i] += rdq.data[i];
  for (std::size_t i = 0; i < rdk.data.size(); ++i) dk[i] += rdk.data[i];
  for (std::size_t i = 0; i < rdv.data.size(); ++i) dv[i] += rdv.data[i];
}

}  // namespace ulysses::train
