// The decode kernel: per query head, softmax(scale · K q) · V over the cached rows. Each thread
// streams its own range of rows once (every query head of a KV head reads the row while it is
// in L1), in blocks whose scores are kept so the running maximum rescales once a block; the
// threads' partial results are merged by their LSE at the end.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

#include "exp_poly.hpp"
#include "ulysses/attention.hpp"
#include "flash_common.hpp"
#include "ulysses/error.hpp"

namespace ulysses {
namespace {

// The row loops are compiled for AVX2 with FMA beside the baseline, chosen at load time (the
// library is built for any x86-64; the flash kernels dispatch per ISA the same way).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KERNEL_CLONES
#endif

constexpr std::int64_t kBlock = 64;         // rows whose scores are held at once
constexpr std::int64_t kRowsPerPart = 256;  // fewer rows than this per thread are not worth a thread

// One thread's partial result over rows [r0, r1): acc[q_heads·d] unnormalised, m and l per head.
struct Partial {
  std::vector<float> acc, m, l;
};

// a · b over d floats in eight lanes (one vector of FMAs, the lanes summed once at the end);
// always inlined so the AVX2 clone of block gets it in AVX2.
[[gnu::always_inline]] inline float dot(const float* __restrict a, const float* __restrict b, std::int64_t d) {
  float lanes[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= d; i += 8)
#pragma omp simd
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < d; ++i) s += a[i] * b[i];
  for (const float x : lanes) s += x;
  return s;
}

struct Problem {
  const TensorView *q, *k, *v;
  std::int64_t q_heads, q_first, kv_first, group, d;
  float scale;
  std::vector<std::int64_t> k_at, v_at;  // query head i's KV head: its offset in a row of k, of v
  Problem(const TensorView* q, const TensorView* k, const TensorView* v, std::int64_t q_first, std::int64_t kv_first,
          std::int64_t group, float scale)
      : q(q), k(k), v(v), q_heads(q->shape.h), q_first(q_first), kv_first(kv_first), group(group), d(q->shape.d),
        scale(scale) {
    for (std::int64_t i = 0; i < q_heads; ++i) {
      k_at.push_back(((q_first + i) / group - kv_first) * k->stride_h);
      v_at.push_back(((q_first + i) / group - kv_first) * v->stride_h);
    }
  }
};

// s[t] = e^(s[t] − mx) for t < n, vectorised as the kernels' own exp (simd_engine.hpp's vexp):
// 2^k · e^r, k = round(x · log2 e) by the 1.5·2^23 rounding constant, r = x − k·ln 2 in two
// parts (|r| <= ln2/2), e^r by exp_poly.hpp (2e-9 relative). x is clamped at −87 so 2^k stays a
// normal float; e^−87 is below anything a sum of weights that includes 1 can notice.
[[gnu::always_inline]] inline void exp_block(float* s, std::int64_t n, float mx) {
#pragma omp simd
  for (std::int64_t t = 0; t < n; ++t) {
    const float x = std::max(s[t] - mx, -87.0f);
    const float km = x * 1.44269504088896341f + 12582912.0f;
    const float k = km - 12582912.0f;
    const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
    const std::uint32_t bits = (std::bit_cast<std::uint32_t>(km) << 23) + (127u << 23);
    s[t] = kernels::exp_poly(r) * std::bit_cast<float>(bits);
  }
}

// Rows [t0, t0 + n) for every query head. Row by row, every head of a row while it is in L1:
// a row's KV heads lie side by side, so the cache streams in address order (head by head, each
// pass would read a strided quarter of every row, which the prefetchers do not keep up with).
// Pointers step by the views' strides: an index per row (a 64-bit division for the GQA head) cost
// more than the row's bytes.
KERNEL_CLONES void block(const Problem& p, std::int64_t t0, std::int64_t n, Partial& part, float* scores) {
  const std::int64_t d = p.d, h = p.q_heads, ks = p.k->stride_s, vs = p.v->stride_s;
  const float* __restrict k0 = p.k->f32(0, t0, 0);
  const float* __restrict v0 = p.v->f32(0, t0, 0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t i = 0; i < h; ++i)
      scores[i * kBlock + t] = p.scale * dot(p.q->f32(0, 0, i), k0 + t * ks + p.k_at[std::size_t(i)], d);
  for (std::int64_t i = 0; i < h; ++i) {
    float* __restrict s = scores + i * kBlock;
    float* __restrict acc = part.acc.data() + i * d;
    float mx = part.m[std::size_t(i)];
    for (std::int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
    const float rescale = std::exp(part.m[std::size_t(i)] - mx);  // 0 on the first block (m = −inf)
    float l = part.l[std::size_t(i)] * rescale;
    for (std::int64_t j = 0; j < d; ++j) acc[j] *= rescale;
    exp_block(s, n, mx);
    for (std::int64_t t = 0; t < n; ++t) l += s[t];
    part.m[std::size_t(i)] = mx;
    part.l[std::size_t(i)] = l;
  }
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t i = 0; i < h; ++i) {
      const float w = scores[i * kBlock + t];
      const float* __restrict row = v0 + t * vs + p.v_at[std::size_t(i)];
      float* __restrict acc = part.acc.data() + i * d;
#pragma omp simd
      for (std::int64_t j = 0; j < d; ++j) acc[j] += w * row[j];
    }
}

void rows_range(const Problem& p, std::int64_t r0, std::int64_t r1, Partial& part) {
  const float ninf = -std::numeric_limits<float>::infinity();
  part.acc.assign(std::size_t(p.q_heads * p.d), 0.0f);
  part.m.assign(std::size_t(p.q_heads), ninf);
  part.l.assign(std::size_t(p.q_heads), 0.0f);
  std::vector<float> scores(std::size_t(p.q_heads * kBlock));
  for (std::int64_t t = r0; t < r1; t += kBlock) block(p, t, std::min(kBlock, r1 - t), part, scores.data());
}

// The CPU's kernel: threads split the rows, their partials merged by LSE in order.
void decode_cpu(const TensorView& out, const TensorView& lse, const Problem& p) {
  const std::int64_t rows = p.k->shape.s, d = p.d;
  const int parts = int(std::clamp<std::int64_t>(rows / kRowsPerPart, 1, omp_get_max_threads()));
  std::vector<Partial> partial(static_cast<std::size_t>(parts));
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int t = 0; t < parts; ++t) rows_range(p, rows * t / parts, rows * (t + 1) / parts, partial[std::size_t(t)]);
  for (std::int64_t i = 0; i < p.q_heads; ++i) {  // merge the parts in order: the same bits every run
    float m = -std::numeric_limits<float>::infinity();
    for (const Partial& pt : partial) m = std::max(m, pt.m[std::size_t(i)]);
    float* o = out.f32(0, 0, i);
    std::fill_n(o, d, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) {  // no row: nothing seen
      *lse.f32(0, 0, i) = m;
      continue;
    }
    float l = 0;
    for (const Partial& pt : partial) {
      const float w = std::exp(pt.m[std::size_t(i)] - m);
      l += w * pt.l[std::size_t(i)];
      for (std::int64_t j = 0; j < d; ++j) o[j] += w * pt.acc[std::size_t(i * d + j)];
    }
    for (std::int64_t j = 0; j < d; ++j) o[j] /= l;
    *lse.f32(0, 0, i) = m + std::log(l);
  }
}

void check_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                  const TensorView& v, const DecodeParams& p) {
  auto fail = [](const std::string& m) { throw Error("decode attention: " + m); };
  for (const TensorView* t : {&out, &lse, &q, &k, &v}) {
    if (t->dtype != DType::f32) fail("every tensor must be float32");
    if (t->device != q.device)
      fail(fmt::format("q is on {}, another tensor on {}", to_string(q.device), to_string(t->device)));
  }
  const Shape& s = q.shape;
  if (s.b != 1 || s.s != 1 || s.h <= 0 || s.d <= 0) fail(fmt::format("q must be [1, 1, h, d], got {}", s.str()));
  if (!(out.shape == s)) fail(fmt::format("out must be {} like q, got {}", s.str(), out.shape.str()));
  if (!(lse.shape == Shape{1, 1, s.h, 1})) fail(fmt::format("lse must be [1, 1, {}, 1], got {}", s.h, lse.shape.str()));
  if (k.shape.b != 1 || k.shape.s < 0 || k.shape.h <= 0 || k.shape.d != s.d)
    fail(fmt::format("k must be [1, rows, h_kv, {}], got {}", s.d, k.shape.str()));
  if (!(v.shape == k.shape)) fail(fmt::format("v must be {} like k, got {}", k.shape.str(), v.shape.str()));
  const std::int64_t lo = p.q_first / std::max<std::int64_t>(p.group, 1) - p.kv_first,
                     hi = (p.q_first + s.h - 1) / std::max<std::int64_t>(p.group, 1) - p.kv_first;
  if (p.group < 1 || p.q_first < 0 || lo < 0 || hi >= k.shape.h)
    fail(fmt::format("query heads [{}, {}) at group {} read KV heads [{}, {}] of the {} held from head {}", p.q_first,
                     p.q_first + s.h, p.group, lo + p.kv_first, hi + p.kv_first, k.shape.h, p.kv_first));
}

}  // namespace

void decode_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                              const TensorView& v, const DecodeParams& params) {
  check_decode(out, lse, q, k, v, params);
  if (q.device != Device::cpu) {
    const AttentionKernels* kernels = device_kernels(q.device);
    if (kernels == nullptr || kernels->decode == nullptr)
      throw Error(fmt::format("decode attention: no decode kernel for device {}", to_string(q.device)));
    return kernels->decode(out, lse, q, k, v, params);
  }
  const float scale = params.scale != 0 ? params.scale : 1.0f / std::sqrt(float(q.shape.d));
  decode_cpu(out, lse, Problem(&q, &k, &v, params.q_first, params.kv_first, params.group, scale));
}

}  // namespace ulysses
