// The float64 oracle: textbook softmax attention, one query row at a time.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ulysses/core/error.hpp"
#include "ulysses/kernels/reference_attention.hpp"

namespace ulysses {

RefTensor RefTensor::from(const TensorView& view) {
  RefTensor r(view.shape);
  std::vector<float> row(static_cast<std::size_t>(view.shape.d));
  for (std::int64_t b = 0; b < view.shape.b; ++b)
    for (std::int64_t s = 0; s < view.shape.s; ++s)
      for (std::int64_t h = 0; h < view.shape.h; ++h) {
        load_row(view, b, s, h, row.data());
        for (std::int64_t d = 0; d < view.shape.d; ++d) r.at(b, s, h, d) = row[std::size_t(d)];
      }
  return r;
}

namespace {

// Written without documents.hpp, to stay independent of what it checks: two positions share a
// document unless a boundary lies between them. The window in 128-bit integers, exact for any
// int64 window (the kernels saturate instead, saturating.hpp).
bool visible(const AttentionParams& p, std::int64_t i, std::int64_t j) {
  const std::int64_t qi = p.q_offset + i, kj = p.k_offset + j;
  if (p.causal && kj > qi) return false;
  if (p.window_left >= 0 && __int128(kj) < __int128(qi) - p.window_left) return false;
  if (p.window_right >= 0 && __int128(kj) > __int128(qi) + p.window_right) return false;
  for (std::int64_t boundary : p.cu_seqlens)
    if (std::min(qi, kj) < boundary && boundary <= std::max(qi, kj)) return false;
  return true;
}

double scale_of(const AttentionParams& p, std::int64_t d) {
  return p.scale ? double(*p.scale) : 1.0 / std::sqrt(double(d));
}

// Softmax probabilities of query row i of head h against every key; returns the row's lse.
double probabilities(std::vector<double>& prob, const RefTensor& q, const RefTensor& k, const AttentionParams& p,
                     std::int64_t b, std::int64_t h, std::int64_t i) {
  const std::int64_t sk = k.shape.s, D = q.shape.d, g = h / (q.shape.h / k.shape.h);
  const double scale = scale_of(p, D);
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < sk; ++j) {
    prob[std::size_t(j)] = -std::numeric_limits<double>::infinity();
    if (!visible(p, i, j)) continue;  // a masked key's score is never used: no dot product for it
    double dot = 0;
    for (std::int64_t x = 0; x < D; ++x) dot += q.at(b, i, h, x) * k.at(b, j, g, x);
    prob[std::size_t(j)] = dot * scale;
    mx = std::max(mx, prob[std::size_t(j)]);
  }
  if (std::isinf(mx)) {  // no visible key
    std::fill(prob.begin(), prob.end(), 0.0);
    return mx;
  }
  double sum = 0;
  for (double& x : prob) sum += (x = std::exp(x - mx));
  for (double& x : prob) x /= sum;
  return mx + std::log(sum);
}

}  // namespace

void reference_attention_forward(RefTensor& out, std::vector<double>& lse, const RefTensor& q, const RefTensor& k,
                                 const RefTensor& v, const AttentionParams& params) {
  const Shape& s = q.shape;
  out = RefTensor(s);
  lse.assign(std::size_t(s.b * s.h * s.s), 0.0);
#pragma omp parallel
  {
    std::vector<double> prob(static_cast<std::size_t>(k.shape.s));
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < s.b; ++b)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t i = 0; i < s.s; ++i) {
          const std::int64_t g = h / (s.h / k.shape.h);
          lse[std::size_t((b * s.h + h) * s.s + i)] = probabilities(prob, q, k, params, b, h, i);
          for (std::int64_t j = 0; j < k.shape.s; ++j) {
            if (prob[std::size_t(j)] == 0.0) continue;  // adds nothing, as in the backward
            for (std::int64_t x = 0; x < s.d; ++x) out.at(b, i, h, x) += prob[std::size_t(j)] * v.at(b, j, g, x);
          }
        }
  }
}

void reference_attention_backward(RefTensor& dq, RefTensor& dk, RefTensor& dv, const RefTensor& dout,
                                  const RefTensor& q, const RefTensor& k, const RefTensor& v,
                                  const AttentionParams& params) {
  const Shape& s = q.shape;
  const std::int64_t sk = k.shape.s, D = s.d, group = s.h / k.shape.h;
  const double scale = scale_of(params, D);
  dq = RefTensor(s);
  dk = RefTensor(k.shape);
  dv = RefTensor(k.shape);
  // Parallel over (batch, KV head): dk and dv of a KV head are written by one thread only.
#pragma omp parallel
  {
    std::vector<double> prob(static_cast<std::size_t>(sk)), dp(static_cast<std::size_t>(sk));
#pragma omp for collapse(2) schedule(dynamic)
    for (std::int64_t b = 0; b < s.b; ++b)
      for (std::int64_t g = 0; g < k.shape.h; ++g)
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
          for (std::int64_t i = 0; i < s.s; ++i) {
            probabilities(prob, q, k, params, b, h, i);
            double delta = 0;  // Σ_j P_ij dP_ij = rowsum(dO ∘ O)
            for (std::int64_t j = 0; j < sk; ++j) {
              dp[std::size_t(j)] = 0;
              if (prob[std::size_t(j)] == 0.0) continue;  // adds nothing to delta; its ds is skipped below
              double acc = 0;
              for (std::int64_t x = 0; x < D; ++x) acc += dout.at(b, i, h, x) * v.at(b, j, g, x);
              dp[std::size_t(j)] = acc;
              delta += prob[std::size_t(j)] * acc;
            }
            for (std::int64_t j = 0; j < sk; ++j) {
              const double pj = prob[std::size_t(j)];
              if (pj == 0.0) continue;
              const double ds = pj * (dp[std::size_t(j)] - delta) * scale;
              for (std::int64_t x = 0; x < D; ++x) {
                dv.at(b, j, g, x) += pj * dout.at(b, i, h, x);
                dq.at(b, i, h, x) += ds * k.at(b, j, g, x);
                dk.at(b, j, g, x) += ds * q.at(b, i, h, x);
              }
            }
          }
  }
}

double relative_error(const TensorView& x, const RefTensor& ref) {
  if (!(x.shape == ref.shape))
    throw Error("relative_error: shapes differ, " + x.shape.str() + " vs " + ref.shape.str());
  RefTensor got = RefTensor::from(x);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.data.size(); ++i) {
    const double e = got.data[i] - ref.data[i];
    num += e * e;
    den += ref.data[i] * ref.data[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

}  // namespace ulysses
