// Flash attention forward (FlashAttention-2's algorithm) on the CPU.
//
// For each (batch, head, query block of kBlockQ rows), walk the key blocks keeping a running
// row max m and row sum l:  S = scale·Q·Kᵀ;  m' = max(m, rowmax S);  P = exp(S − m');
// l = e^{m−m'}·l + rowsum P;  O = e^{m−m'}·O + P·V;  finally O /= l, lse = m + log l.
// The two GEMMs are tile_gemm.hpp's (AVX2 micro-kernels, or BLAS); the softmax pass is ours.
// Key blocks entirely above the causal diagonal are skipped.
#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "flash_common.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/error.hpp"
#include "tile_gemm.hpp"
#include "vexp.hpp"

namespace ulysses {

float effective_scale(const AttentionParams& params, std::int64_t head_dim) {
  return params.scale != 0.0f ? params.scale : 1.0f / std::sqrt(float(head_dim));
}

double attention_forward_flops(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h,
                               std::int64_t d, bool causal) {
  double f = 4.0 * double(b) * double(sq) * double(sk) * double(h) * double(d);
  return causal ? f / 2 : f;
}

void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out) {
  auto fail = [](const std::string& m) { throw Error("attention: " + m); };
  for (const TensorView* t : {&q, &k, &v, &out})
    if (t->dtype != DType::f32) fail("the local kernels take float32 views (convert bf16 first)");
  const Shape& s = q.shape;
  if (s.b <= 0 || s.s < 0 || s.h <= 0 || s.d <= 0) fail(fmt::format("q has an invalid shape {}", s.str()));
  if (s.d > 1024) fail(fmt::format("head_dim {} exceeds the supported maximum 1024", s.d));
  if (k.shape.b != s.b || k.shape.d != s.d || k.shape.h <= 0)
    fail(fmt::format("k must be [{}, sk, h_kv, {}], got {}", s.b, s.d, k.shape.str()));
  if (!(v.shape == k.shape)) fail(fmt::format("v must be {} like k, got {}", k.shape.str(), v.shape.str()));
  if (!(out.shape == s)) fail(fmt::format("out must be {} like q, got {}", s.str(), out.shape.str()));
  if (s.h % k.shape.h != 0)
    fail(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({})", s.h, k.shape.h));
}

namespace {

using namespace kernels;

struct Tile {
  std::vector<float> s, o, m, l;
  explicit Tile(std::int64_t bk, std::int64_t d)
      : s(std::size_t(kBlockQ * bk)), o(std::size_t(kBlockQ * d)), m(kBlockQ), l(kBlockQ) {}
};

// One query block [i0, i0 + mq) of one (batch, head).
void forward_block(Tile& t, const TensorView& out, float* lse_row, const TensorView& q,
                   const TensorView& k, const TensorView& v, const float* packed_k, const AttentionParams& p,
                   float scale, std::int64_t bb, std::int64_t h, std::int64_t g, std::int64_t i0,
                   std::int64_t mq) {
  const std::int64_t d = q.shape.d, sk = k.shape.s, bk = block_k(d);
  std::fill(t.o.begin(), t.o.end(), 0.0f);
  std::fill(t.m.begin(), t.m.end(), kNegInf);
  std::fill(t.l.begin(), t.l.end(), 0.0f);
  const std::int64_t kend = visible_keys(p, i0 + mq - 1, sk);  // keys any row of the block sees
  for (std::int64_t j0 = 0; j0 < kend; j0 += bk) {
    const std::int64_t nk = std::min(bk, kend - j0);
    // With a causal mask, row i sees keys up to diag + i of this block.
    const std::int64_t diag = p.causal ? p.q_offset + i0 - p.k_offset - j0 : kNoDiagonal;
    qk_scores(mq, nk, d, scale, q.f32(bb, i0, h), q.stride_s, k.f32(bb, j0, g), k.stride_s,
              packed_k ? packed_k + j0 * d : nullptr, t.s.data(), bk, diag);
    for (std::int64_t i = 0; i < mq; ++i) {
      float* srow = &t.s[std::size_t(i * bk)];
      // Row i sees the first n keys of this block (n <= 0: none; the causal mask is a prefix).
      const std::int64_t n = std::max<std::int64_t>(0, std::min(nk, visible_keys(p, i0 + i, sk) - j0));
      const float mx = row_max(srow, n, t.m[i]);
      std::fill(srow + n, srow + nk, 0.0f);
      if (n == 0 || mx == kNegInf) {  // nothing new for this row: P = 0, state unchanged
        std::fill(srow, srow + n, 0.0f);
        continue;
      }
      const float alpha = std::exp(t.m[i] - mx);
      const float sum = exp_shifted_sum(srow, srow, n, mx);
      t.l[i] = alpha * t.l[i] + sum;
      t.m[i] = mx;
      if (alpha != 1.0f)
        for (std::int64_t x = 0; x < d; ++x) t.o[std::size_t(i * d + x)] *= alpha;
    }
    pv_accumulate(mq, d, nk, t.s.data(), bk, v.f32(bb, j0, g), v.stride_s, t.o.data(), d, diag);
  }
  for (std::int64_t i = 0; i < mq; ++i) {
    float* o = out.f32(bb, i0 + i, h);
    const float inv = t.l[i] > 0.0f ? 1.0f / t.l[i] : 0.0f;
    for (std::int64_t x = 0; x < d; ++x) o[x] = t.o[std::size_t(i * d + x)] * inv;
    lse_row[i] = t.l[i] > 0.0f ? t.m[i] + std::log(t.l[i]) : kNegInf;
  }
}

}  // namespace

void flash_attention_forward(const TensorView& out, float* lse, const TensorView& q,
                             const TensorView& k, const TensorView& v,
                             const AttentionParams& params) {
  check_attention_shapes(q, k, v, out);
  const std::int64_t B = q.shape.b, sq = q.shape.s, H = q.shape.h, d = q.shape.d;
  const std::int64_t group = H / k.shape.h;
  const float scale = effective_scale(params, d);
  const std::int64_t nqb = (sq + kBlockQ - 1) / kBlockQ;
  const std::int64_t tasks = B * H * nqb;
  // Kᵀ of every (batch, KV head) packed once for the AVX2 micro-kernel: one pass over K,
  // against the s/64 times each key block is used.
  const std::int64_t Hkv = k.shape.h, per_head = packed_kt_size(k.shape.s, d);
  Tensor packed = uses_packed_kt() ? Tensor::uninitialized({B * Hkv, 1, 1, per_head}) : Tensor();
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bb = 0; bb < (packed.data() ? B : 0); ++bb)
    for (std::int64_t g = 0; g < Hkv; ++g)
      pack_kt(k.f32(bb, 0, g), k.stride_s, k.shape.s, d, packed.f32() + (bb * Hkv + g) * per_head);
#pragma omp parallel
  {
    Tile tile(block_k(d), d);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      // Last query blocks first: under a causal mask they are the most expensive.
      const std::int64_t qb = nqb - 1 - task % nqb, bh = task / nqb, bb = bh / H, h = bh % H;
      const std::int64_t i0 = qb * kBlockQ, mq = std::min(kBlockQ, sq - i0);
      const float* pk = packed.data() ? packed.f32() + (bb * Hkv + h / group) * per_head : nullptr;
      forward_block(tile, out, lse + (bb * H + h) * sq + i0, q, k, v, pk, params, scale, bb, h, h / group, i0, mq);
    }
  }
}

}  // namespace ulysses
