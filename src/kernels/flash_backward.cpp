// Flash attention backward (FlashAttention-2's algorithm) on the CPU.
//
//   D = rowsum(dO ∘ O)                       (once, before the tiles)
//   per tile: P = exp(scale·Q·Kᵀ − lse);  dV += Pᵀ·dO;  dP = dO·Vᵀ;  dS = P ∘ (dP − D);
//             dK += scale·dSᵀ·Q;  dQ += scale·dS·K                    (5 GEMMs, BLAS)
//
// Work is split by key blocks: a task owns one (batch, KV head, key block) and loops over the
// query heads of its GQA group and the query blocks that can see it, so dK and dV are
// private to the task. dQ is shared by the key blocks of a head; two schedules keep it
// race-free:
//   - enough (batch, KV head) pairs for the threads: a thread takes all key blocks of a pair
//     and writes dQ directly;
//   - otherwise (few heads per rank — the Ulysses case): every thread takes key blocks of
//     any pair and accumulates dQ privately; the private copies are summed at the end.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flash_common.hpp"
#include "vexp.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/error.hpp"

namespace ulysses {

namespace {

using namespace kernels;

constexpr std::int64_t kBlockKBackward = 128;

struct BackwardTile {
  std::vector<float> p, dp, dk, dv;
  BackwardTile(std::int64_t d)
      : p(std::size_t(kBlockQ * kBlockKBackward)), dp(std::size_t(kBlockQ * kBlockKBackward)),
        dk(std::size_t(kBlockKBackward * d)), dv(std::size_t(kBlockKBackward * d)) {}
};

struct BackwardArgs {
  TensorView dq, dk, dv, dout, q, k, v;
  const float* lse;
  const float* delta;  // D, [b, h, sq]
  AttentionParams params;
  float scale;
};

// One task: keys [j0, j0 + nk) of KV head g in batch bb. dq_acc is where dQ accumulates.
void backward_task(BackwardTile& t, const BackwardArgs& a, const TensorView& dq_acc,
                   std::int64_t bb, std::int64_t g, std::int64_t j0, std::int64_t nk) {
  const std::int64_t d = a.q.shape.d, sq = a.q.shape.s, H = a.q.shape.h;
  const std::int64_t group = H / a.k.shape.h, bk = kBlockKBackward;
  std::fill(t.dk.begin(), t.dk.end(), 0.0f);
  std::fill(t.dv.begin(), t.dv.end(), 0.0f);
  // First query row that sees key j0 (all rows when not causal).
  std::int64_t first = 0;
  if (a.params.causal) first = std::max<std::int64_t>(0, a.params.k_offset + j0 - a.params.q_offset);
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    const float* lse = a.lse + (bb * H + h) * sq;
    const float* delta = a.delta + (bb * H + h) * sq;
    for (std::int64_t i0 = first / kBlockQ * kBlockQ; i0 < sq; i0 += kBlockQ) {
      const std::int64_t mq = std::min(kBlockQ, sq - i0);
      const float* q = a.q.f32(bb, i0, h);
      const float* dout = a.dout.f32(bb, i0, h);
      gemm(false, true, mq, nk, d, a.scale, q, a.q.stride_s, a.k.f32(bb, j0, g), a.k.stride_s,
           0.0f, t.p.data(), bk);
      for (std::int64_t i = 0; i < mq; ++i) {
        float* prow = &t.p[std::size_t(i * bk)];
        const std::int64_t n =
            std::max<std::int64_t>(0, std::min(nk, visible_keys(a.params, i0 + i, a.k.shape.s) - j0));
        if (lse[i0 + i] == kNegInf) std::fill(prow, prow + n, 0.0f);  // row sees no key at all
        else exp_shifted_sum(prow, prow, n, lse[i0 + i]);
        std::fill(prow + n, prow + nk, 0.0f);
      }
      gemm(true, false, nk, d, mq, 1.0f, t.p.data(), bk, dout, a.dout.stride_s, 1.0f, t.dv.data(), d);
      gemm(false, true, mq, nk, d, 1.0f, dout, a.dout.stride_s, a.v.f32(bb, j0, g), a.v.stride_s,
           0.0f, t.dp.data(), bk);
      for (std::int64_t i = 0; i < mq; ++i) {  // dS = P ∘ (dP − D), written over dP
        const float* prow = &t.p[std::size_t(i * bk)];
        float* row = &t.dp[std::size_t(i * bk)];
        const float di = delta[i0 + i];
        for (std::int64_t c = 0; c < nk; ++c) row[c] = prow[c] * (row[c] - di);
      }
      gemm(true, false, nk, d, mq, a.scale, t.dp.data(), bk, q, a.q.stride_s, 1.0f, t.dk.data(), d);
      gemm(false, false, mq, d, nk, a.scale, t.dp.data(), bk, a.k.f32(bb, j0, g), a.k.stride_s, 1.0f,
           dq_acc.f32(bb, i0, h), dq_acc.stride_s);
    }
  }
  for (std::int64_t c = 0; c < nk; ++c) {
    std::memcpy(a.dk.f32(bb, j0 + c, g), &t.dk[std::size_t(c * d)], std::size_t(d) * 4);
    std::memcpy(a.dv.f32(bb, j0 + c, g), &t.dv[std::size_t(c * d)], std::size_t(d) * 4);
  }
}

// D = rowsum(dO ∘ O), [b, h, sq].
std::vector<float> row_dot(const TensorView& dout, const TensorView& out) {
  const Shape& s = out.shape;
  std::vector<float> delta(static_cast<std::size_t>(s.b * s.h * s.s));
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bb = 0; bb < s.b; ++bb)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.s; ++i) {
        const float* o = out.f32(bb, i, h);
        const float* g = dout.f32(bb, i, h);
        float acc = 0.0f;
        for (std::int64_t x = 0; x < s.d; ++x) acc += o[x] * g[x];
        delta[std::size_t((bb * s.h + h) * s.s + i)] = acc;
      }
  return delta;
}

void zero(const TensorView& t) {
  const Shape& s = t.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bb = 0; bb < s.b; ++bb)
    for (std::int64_t i = 0; i < s.s; ++i)
      for (std::int64_t h = 0; h < s.h; ++h) std::memset(t.f32(bb, i, h), 0, std::size_t(s.d) * 4);
}

}  // namespace

void flash_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const float* lse,
                              const AttentionParams& params) {
  check_attention_shapes(q, k, v, out);
  check_attention_shapes(dq, dk, dv, dout);
  if (!(dk.shape == k.shape) || !(dout.shape == q.shape))
    throw Error("attention backward: dk, dv must have k's shape and dout, dq q's shape");
  const std::vector<float> delta = row_dot(dout, out);
  const BackwardArgs a{dq, dk, dv, dout, q, k, v, lse, delta.data(), params,
                       effective_scale(params, q.shape.d)};
  const std::int64_t B = q.shape.b, Hkv = k.shape.h, sk = k.shape.s;
  const std::int64_t nkb = (sk + kBlockKBackward - 1) / kBlockKBackward;
  const int threads = omp_get_max_threads();
  zero(dq);
  if (B * Hkv >= 2 * threads || threads == 1) {
#pragma omp parallel
    {
      BackwardTile tile(q.shape.d);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t pair = 0; pair < B * Hkv; ++pair)
        for (std::int64_t kb = 0; kb < nkb; ++kb) {
          const std::int64_t j0 = kb * kBlockKBackward;
          backward_task(tile, a, dq, pair / Hkv, pair % Hkv, j0, std::min(kBlockKBackward, sk - j0));
        }
    }
    return;
  }
  // Private dQ per thread, dense bshd, summed into dq afterwards.
  const Shape qs = q.shape;
  std::vector<Tensor> partial(static_cast<std::size_t>(threads));
#pragma omp parallel
  {
    const int me = omp_get_thread_num();
    partial[std::size_t(me)] = Tensor(qs);
    const TensorView mine = partial[std::size_t(me)].view();
    BackwardTile tile(q.shape.d);
    // Static: the same tasks land on the same thread every call, so the private sums are
    // added in the same order and results are bit-for-bit reproducible (training resumes).
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < B * Hkv * nkb; ++task) {
      const std::int64_t pair = task / nkb, j0 = (task % nkb) * kBlockKBackward;
      backward_task(tile, a, mine, pair / Hkv, pair % Hkv, j0, std::min(kBlockKBackward, sk - j0));
    }
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t bb = 0; bb < qs.b; ++bb)
      for (std::int64_t i = 0; i < qs.s; ++i)
        for (std::int64_t h = 0; h < qs.h; ++h) {
          float* dst = dq.f32(bb, i, h);
          for (const Tensor& p : partial) {
            if (p.data() == nullptr) continue;  // a thread the runtime did not start
            const float* src = p.view().f32(bb, i, h);
            for (std::int64_t x = 0; x < qs.d; ++x) dst[x] += src[x];
          }
        }
  }
}

}  // namespace ulysses
