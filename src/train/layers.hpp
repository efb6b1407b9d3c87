// The training demo's layers, llm.c style: one plain forward and one backward function per
// layer, arguments in the order outputs, saved buffers, inputs, weights, sizes. Templated on
// the scalar so the whole model also runs in float64 for the finite-difference check.
// Activations are row-major [N, C] with N = tokens on this rank (b-major, then position).
// Backward functions ACCUMULATE (+=) into input and weight gradients.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace ulysses::train {

using i64 = std::int64_t;

// C[m, n] (+)= op(A) · op(B), row-major with explicit leading dimensions (BLAS, one thread).
inline void gemm(bool ta, bool tb, i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, float* c,
                 i64 ldc, bool accumulate) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.0f, a, int(lda), b, int(ldb), accumulate ? 1.0f : 0.0f, c, int(ldc));
}
inline void gemm(bool ta, bool tb, i64 m, i64 n, i64 k, const double* a, i64 lda, const double* b, i64 ldb, double* c,
                 i64 ldc, bool accumulate) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.0, a, int(lda), b, int(ldb), accumulate ? 1.0 : 0.0, c, int(ldc));
}

// Splits [0, n) into one contiguous range per OpenMP thread (the same split every call, so
// results are bit-for-bit reproducible) and runs fn(begin, end) on each.
template <class Fn>
void parallel_ranges(i64 n, Fn&& fn) {
#pragma omp parallel
  {
    const i64 t = omp_get_thread_num(), T = omp_get_num_threads();
    const i64 begin = n * t / T, end = n * (t + 1) / T;
    if (begin < end) fn(begin, end);
  }
}

// out[N, OC] = inp[N, IC] · w[IC, OC]; threads take row ranges.
template <class T>
void matmul_forward(T* out, const T* inp, const T* w, i64 N, i64 IC, i64 OC) {
  parallel_ranges(N, [&](i64 r0, i64 r1) {
    gemm(false, false, r1 - r0, OC, IC, inp + r0 * IC, IC, w, OC, out + r0 * OC, OC, false);
  });
}
// dinp += dout · wᵀ (threads take rows); dw += inpᵀ · dout (threads take columns of dw, so no
// two threads add into the same weight).
template <class T>
void matmul_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, i64 N, i64 IC, i64 OC) {
  parallel_ranges(N, [&](i64 r0, i64 r1) {
    gemm(false, true, r1 - r0, IC, OC, dout + r0 * OC, OC, w, OC, dinp + r0 * IC, IC, true);
  });
  parallel_ranges(OC, [&](i64 c0, i64 c1) {
    gemm(true, false, IC, c1 - c0, N, inp, IC, dout + c0, OC, dw + c0, OC, true);
  });
}

// out = inp / rms(inp) * w;  rstd[N] saved.
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, i64 N, i64 C) {
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T ss = 0;
    for (i64 i = 0; i < C; ++i) ss += x[i] * x[i];
    const T r = T(1) / std::sqrt(ss / T(C) + T(1e-5));
    rstd[n] = r;
    for (i64 i = 0; i < C; ++i) out[n * C + i] = x[i] * r * w[i];
  }
}
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, i64 N, i64 C) {
  for (i64 n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* g = dout + n * C;
    const T r = rstd[n];
    T dot = 0;  // Σ g·w·x
    for (i64 i = 0; i < C; ++i) {
      dot += g[i] * w[i] * x[i];
      dw[i] += g[i] * x[i] * r;
    }
    for (i64 i = 0; i < C; ++i) dinp[n * C + i] += r * g[i] * w[i] - r * r * r * x[i] * dot / T(C);
  }
}

// Rotary embedding ("rotate half"), in place on [N, H, D]: pairs (i, i + D/2) of each head turn
// by pos · base^(−2i/D), pos = the token's GLOBAL position. The cosines and sines are tabled once
// per step ([N][D/2] each): every layer's Q and K, forward and backward, turn by the same angles.
template <class T>
struct RopeTable {
  std::vector<T> cos, sin;
  void build(const std::int64_t* pos, i64 N, i64 D) {
    const i64 half = D / 2;
    cos.resize(std::size_t(N * half));
    sin.resize(cos.size());
    for (i64 n = 0; n < N; ++n)
      for (i64 i = 0; i < half; ++i) {
        const double angle = double(pos[n]) * std::pow(10000.0, -2.0 * double(i) / double(D));
        cos[std::size_t(n * half + i)] = T(std::cos(angle));
        sin[std::size_t(n * half + i)] = T(std::sin(angle));
      }
  }
};
template <class T>
void rope_forward(T* x, const RopeTable<T>& t, i64 N, i64 H, i64 D, bool inverse = false) {
  const i64 half = D / 2;
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < half; ++i) {
      const T c = t.cos[std::size_t(n * half + i)], sn = t.sin[std::size_t(n * half + i)], s = inverse ? -sn : sn;
      for (i64 h = 0; h < H; ++h) {
        T* v = x + (n * H + h) * D;
        const T a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = a * s + b * c;
      }
    }
}
// The rotation is orthogonal: its backward is the inverse rotation of the gradient (in place).
template <class T>
void rope_backward(T* dx, const RopeTable<T>& t, i64 N, i64 H, i64 D) {
  rope_forward(dx, t, N, H, D, true);
}

// SwiGLU: out = silu(a) ∘ g.
template <class T>
void swiglu_forward(T* out, const T* a, const T* g, i64 n) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < n; ++i) out[i] = a[i] / (T(1) + std::exp(-a[i])) * g[i];
}
template <class T>
void swiglu_backward(T* da, T* dg, const T* dout, const T* a, const T* g, i64 n) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < n; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-a[i]));
    da[i] += dout[i] * g[i] * sig * (T(1) + a[i] * (T(1) - sig));
    dg[i] += dout[i] * a[i] * sig;
  }
}

// out[n] = wte[token[n]]
template <class T>
void embedding_forward(T* out, const int* tokens, const T* wte, i64 N, i64 C) {
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < C; ++i) out[n * C + i] = wte[i64(tokens[n]) * C + i];
}
template <class T>
void embedding_backward(T* dwte, const T* dout, const int* tokens, i64 N, i64 C) {
  for (i64 n = 0; n < N; ++n)
    for (i64 i = 0; i < C; ++i) dwte[i64(tokens[n]) * C + i] += dout[n * C + i];
}

// Softmax cross-entropy. Returns Σ losses over the N rows (the caller divides by the global
// count of labels); writes dlogits = (softmax − onehot) · grad_scale (overwrites logits' grad).
// A negative label (kNoLabel: the end of a packed document) adds no loss and no gradient.
template <class T>
T crossentropy_forward_backward(T* dlogits, const T* logits, const int* labels, i64 N, i64 V, T grad_scale,
                                int* argmax = nullptr) {
  std::vector<T> row_loss(static_cast<std::size_t>(N));
#pragma omp parallel for schedule(static)
  for (i64 n = 0; n < N; ++n) {
    const T* z = logits + n * V;
    T mx = z[0];
    i64 best = 0;
    for (i64 v = 1; v < V; ++v)
      if (z[v] > mx) mx = z[v], best = v;
    T sum = 0;
    for (i64 v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const T lse = mx + std::log(sum);
    if (argmax) argmax[n] = int(best);
    if (labels[n] < 0) {
      if (dlogits) std::fill_n(dlogits + n * V, V, T(0));
      continue;
    }
    row_loss[std::size_t(n)] = lse - z[labels[n]];
    if (dlogits)
      for (i64 v = 0; v < V; ++v)
        dlogits[n * V + v] = (std::exp(z[v] - lse) - (v == labels[n] ? T(1) : T(0))) * grad_scale;
  }
  T total = 0;  // summed in row order: the same bits whatever the thread count
  for (T x : row_loss) total += x;
  return total;
}

}  // namespace ulysses::train
