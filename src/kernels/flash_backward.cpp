// Flash attention backward (FlashAttention-2's algorithm) on the CPU.
//
//   D = rowsum(dO ∘ O)                       (once, before the tiles)
//   per tile: P = exp(scale·Q·Kᵀ − lse);  dV += Pᵀ·dO;  dP = dO·Vᵀ;  dS = scale·P ∘ (dP − D);
//             dK += dSᵀ·Q;  dQ += dS·K                 (5 GEMMs: the level's engine.hpp)
//
// K and V are packed once per (batch, KV head): Kᵀ and Vᵀ for the two score GEMMs, K for
// dS·K. Work is split by key blocks: a task owns one (batch, KV head, key block) and loops
// over the query heads of its GQA group and the query blocks that can see it, so dK and dV
// are private to the task. dQ is shared by the key blocks of a head; two schedules keep it
// race-free:
//   - enough (batch, KV head) pairs for the threads, and a float32 dq: a thread takes all key
//     blocks of a pair and accumulates into dq directly;
//   - otherwise (few heads per rank — the Ulysses case — or a bf16 dq): every thread takes
//     key blocks of any pair and accumulates dQ in a private float32 copy; the copies are
//     summed (and rounded to dq's dtype) at the end.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flash_common.hpp"
#include "isa.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

void flash_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse, const AttentionParams& params) {
  check_attention_call(q, k, v, out, lse, params);
  if (!(dk.shape == k.shape) || !(dv.shape == k.shape) || !(dout.shape == q.shape) || !(dq.shape == q.shape))
    throw Error("attention backward: dk, dv must have k's shape and dout, dq q's shape");
  if (q.device != Device::cpu) return device_kernels(q.device)->backward(dq, dk, dv, dout, q, k, v, out, lse, params);
  kernels::flash_backward(kernels::active_level(), dq, dk, dv, dout, q, k, v, out, static_cast<const float*>(lse.data),
                          params);
}

namespace kernels {

namespace {

constexpr std::int64_t kBlockKBackward = 128;

struct BackwardTile {
  std::vector<float> p, dp, dk, dv;
  BackwardTile(std::int64_t d)
      : p(std::size_t(kBlockQ * kBlockKBackward)), dp(std::size_t(kBlockQ * kBlockKBackward)),
        dk(std::size_t(kBlockKBackward * d)), dv(std::size_t(kBlockKBackward * d)) {}
};

struct BackwardArgs {
  const KernelLevel& level;
  const GemmEngine& e;
  TensorView dk, dv, dout, q, k;
  PackedHeads kt, vt, kb;  // Kᵀ, Vᵀ (scores), K (dS·K)
  const float* lse;
  const float* delta;  // D, [b, h, sq]
  AttentionParams params;
  float scale;
};

// P = exp(scale·S − lse) in place over the visible keys of each row, 0 elsewhere. The forward's
// lse = m + log l is >= every rounded scale·S of the row (l >= 1), and exp_shifted_sum clamps
// the argument at 0 besides, so P <= 1 even where S is recomputed with other roundings (a bf16
// forward, a merged ring lse): exp never overflows. Where |lse| >= 2^24 its float32 rounding
// (>= 1) swallows log l: P is then exact for one-hot rows and up to l times too large for a
// row spread over l tied keys (finite; FlashAttention's float32 lse has the same limit).
void probabilities(const BackwardArgs& a, float* p, const float* lse, std::int64_t i0, std::int64_t mq, std::int64_t j0,
                   std::int64_t nk) {
  for (std::int64_t i = 0; i < mq; ++i) {
    float* prow = p + i * kBlockKBackward;
    const KeyRange r = in_block(visible_keys(a.params, i0 + i, a.k.shape.s), j0, nk);
    std::fill(prow, prow + r.lo, 0.0f);
    if (lse[i0 + i] == kNegInf)
      std::fill(prow + r.lo, prow + r.hi, 0.0f);  // row sees no key at all
    else
      a.level.vec.exp_shifted_sum(prow + r.lo, prow + r.lo, r.hi - r.lo, a.scale, lse[i0 + i]);
    std::fill(prow + r.hi, prow + nk, 0.0f);
  }
}

// The query rows [first, last) that see a key of [j0, j0 + nk): contiguous, because both ends
// of a row's visible keys never decrease with the row.
std::pair<std::int64_t, std::int64_t> rows_seeing(const AttentionParams& p, std::int64_t sq, std::int64_t sk,
                                                  std::int64_t j0, std::int64_t nk) {
  auto first_row = [&](auto&& pred) {  // first row in [0, sq) with pred true (pred is monotone)
    std::int64_t lo = 0, hi = sq;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (pred(visible_keys(p, mid, sk)))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  };
  const std::int64_t first = first_row([&](KeyRange r) { return r.hi > j0; });
  const std::int64_t last = first_row([&](KeyRange r) { return r.lo >= j0 + nk; });
  return {first, std::max(first, last)};
}

// One task: keys [j0, j0 + nk) of KV head g in batch bb. dq_acc is where dQ accumulates.
void backward_task(BackwardTile& t, const BackwardArgs& a, const TensorView& dq_acc, std::int64_t bb, std::int64_t g,
                   std::int64_t j0, std::int64_t nk) {
  const std::int64_t d = a.q.shape.d, sq = a.q.shape.s, H = a.q.shape.h, Hkv = a.k.shape.h;
  const std::int64_t group = H / Hkv, bk = kBlockKBackward, off = a.e.packed_offset(j0, d);
  const std::byte* kt = a.kt.at(bb, g, Hkv) + off;
  const std::byte* vt = a.vt.at(bb, g, Hkv) + off;
  const std::byte* kb = a.kb.at(bb, g, Hkv) + off;
  std::fill(t.dk.begin(), t.dk.end(), 0.0f);
  std::fill(t.dv.begin(), t.dv.end(), 0.0f);
  const auto [first, last] = rows_seeing(a.params, sq, a.k.shape.s, j0, nk);  // query blocks outside are skipped
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    const float* lse = a.lse + (bb * H + h) * sq;
    const float* delta = a.delta + (bb * H + h) * sq;
    for (std::int64_t i0 = first / kBlockQ * kBlockQ; i0 < last; i0 += kBlockQ) {
      const std::int64_t mq = std::min(kBlockQ, sq - i0);
      const std::int64_t diag = tile_diagonal(a.params, i0, j0);
      const void* q = a.q.row(bb, i0, h);
      const void* dout = a.dout.row(bb, i0, h);
      a.e.scores(mq, nk, d, q, a.q.stride_s, kt, t.p.data(), bk, diag);
      probabilities(a, t.p.data(), lse, i0, mq, j0, nk);
      a.e.pt_b(nk, d, mq, t.p.data(), bk, dout, a.dout.stride_s, t.dv.data(), d, diag);
      a.e.scores(mq, nk, d, dout, a.dout.stride_s, vt, t.dp.data(), bk, diag);
      for (std::int64_t i = 0; i < mq; ++i)  // dS = scale·P ∘ (dP − D), written over dP
        a.level.vec.softmax_grad(&t.p[std::size_t(i * bk)], &t.dp[std::size_t(i * bk)], nk, a.scale, delta[i0 + i]);
      a.e.pt_b(nk, d, mq, t.dp.data(), bk, q, a.q.stride_s, t.dk.data(), d, diag);
      a.e.pv(mq, d, nk, t.dp.data(), bk, kb, dq_acc.f32(bb, i0, h), dq_acc.stride_s, diag);
    }
  }
  for (std::int64_t c = 0; c < nk; ++c) {
    store_row(a.dk, bb, j0 + c, g, &t.dk[std::size_t(c * d)]);
    store_row(a.dv, bb, j0 + c, g, &t.dv[std::size_t(c * d)]);
  }
}

// D = rowsum(dO ∘ O), [b, h, sq].
std::vector<float> row_dot(const TensorView& dout, const TensorView& out) {
  const Shape& s = out.shape;
  std::vector<float> delta(static_cast<std::size_t>(s.b * s.h * s.s));
#pragma omp parallel
  {
    std::vector<float> o(std::size_t(s.d)), g(std::size_t(s.d));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t bb = 0; bb < s.b; ++bb)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t i = 0; i < s.s; ++i) {
          load_row(out, bb, i, h, o.data());
          load_row(dout, bb, i, h, g.data());
          float acc = 0.0f;
          for (std::int64_t x = 0; x < s.d; ++x) acc += o[std::size_t(x)] * g[std::size_t(x)];
          delta[std::size_t((bb * s.h + h) * s.s + i)] = acc;
        }
  }
  return delta;
}

void zero(const TensorView& t) {
  const Shape& s = t.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bb = 0; bb < s.b; ++bb)
    for (std::int64_t i = 0; i < s.s; ++i)
      for (std::int64_t h = 0; h < s.h; ++h) std::memset(t.row(bb, i, h), 0, std::size_t(s.d) * dtype_size(t.dtype));
}

// Every key block of every (batch, KV head) pair, one pair per thread at a time: dQ goes
// straight into dq (float32).
void backward_by_pairs(const BackwardArgs& a, const TensorView& dq, std::int64_t nkb) {
  const std::int64_t B = a.q.shape.b, Hkv = a.k.shape.h, sk = a.k.shape.s;
  zero(dq);
#pragma omp parallel
  {
    BackwardTile tile(a.q.shape.d);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t pair = 0; pair < B * Hkv; ++pair)
      for (std::int64_t kb = 0; kb < nkb; ++kb) {
        const std::int64_t j0 = kb * kBlockKBackward;
        backward_task(tile, a, dq, pair / Hkv, pair % Hkv, j0, std::min(kBlockKBackward, sk - j0));
      }
  }
}

// Key blocks spread over all threads, each with a private float32 dQ, summed into dq.
void backward_by_key_blocks(const BackwardArgs& a, const TensorView& dq, std::int64_t nkb) {
  const std::int64_t B = a.q.shape.b, Hkv = a.k.shape.h, sk = a.k.shape.s;
  const Shape qs = a.q.shape;
  std::vector<Tensor> partial(static_cast<std::size_t>(omp_get_max_threads()));
#pragma omp parallel
  {
    const int me = omp_get_thread_num();
    partial[std::size_t(me)] = Tensor(qs);
    const TensorView mine = partial[std::size_t(me)].view();
    BackwardTile tile(qs.d);
    // Static: the same tasks land on the same thread every call, so the private sums are
    // added in the same order and results are bit-for-bit reproducible (training resumes).
#pragma omp for schedule(static)
    for (std::int64_t task = 0; task < B * Hkv * nkb; ++task) {
      const std::int64_t pair = task / nkb, j0 = (task % nkb) * kBlockKBackward;
      backward_task(tile, a, mine, pair / Hkv, pair % Hkv, j0, std::min(kBlockKBackward, sk - j0));
    }
    std::vector<float> row(std::size_t(qs.d));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t bb = 0; bb < qs.b; ++bb)
      for (std::int64_t i = 0; i < qs.s; ++i)
        for (std::int64_t h = 0; h < qs.h; ++h) {
          std::fill(row.begin(), row.end(), 0.0f);
          for (const Tensor& p : partial) {
            if (p.data() == nullptr) continue;  // a thread the runtime did not start
            const float* src = p.view().f32(bb, i, h);
            for (std::int64_t x = 0; x < qs.d; ++x) row[std::size_t(x)] += src[x];
          }
          store_row(dq, bb, i, h, row.data());
        }
  }
}

}  // namespace

void flash_backward(const KernelLevel& level, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const float* lse, const AttentionParams& params) {
  const GemmEngine* e = engine_for(level, q.dtype);
  if (e == nullptr || dout.dtype != q.dtype) {  // compute in float32 (dO must match the engine)
    const Tensor q32 = copy_of(q, DType::f32), k32 = copy_of(k, DType::f32), v32 = copy_of(v, DType::f32),
                 dout32 = copy_of(dout, DType::f32);
    return flash_backward(level, dq, dk, dv, dout32.view(), q32.view(), k32.view(), v32.view(), out, lse, params);
  }
  const std::vector<float> delta = row_dot(dout, out);
  const BackwardArgs a{level,
                       *e,
                       dk,
                       dv,
                       dout,
                       q,
                       k,
                       pack_heads(*e, e->pack_bt, k),
                       pack_heads(*e, e->pack_bt, v),
                       pack_heads(*e, e->pack_b, k),
                       lse,
                       delta.data(),
                       params,
                       effective_scale(params, q.shape.d)};
  const std::int64_t nkb = (k.shape.s + kBlockKBackward - 1) / kBlockKBackward;
  const int threads = omp_get_max_threads();
  const bool by_pairs = (q.shape.b * k.shape.h >= 2 * threads || threads == 1) && dq.dtype == DType::f32;
  if (by_pairs)
    backward_by_pairs(a, dq, nkb);
  else
    backward_by_key_blocks(a, dq, nkb);
}

}  // namespace kernels

}  // namespace ulysses
