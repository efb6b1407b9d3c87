// The decode kernel: per query head, softmax(scale · K q) · V over the cached rows. Each thread
// streams its own range of rows once (every query head of a KV head reads the row while it is
// in L1), in blocks whose scores are kept so the running maximum rescales once a block; the
// threads' partial results are merged by their LSE at the end.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <vector>

#include "../kernels/exp_poly.hpp"
#include "ulysses/cached_attention.hpp"

namespace ulysses {
namespace {

constexpr std::int64_t kBlock = 64;         // rows whose scores are held at once
constexpr std::int64_t kRowsPerPart = 256;  // fewer rows than this per thread are not worth a thread

// One thread's partial result over rows [r0, r1): acc[q_heads·d] unnormalised, m and l per head.
struct Partial {
  std::vector<float> acc, m, l;
};

inline float dot(const float* a, const float* b, std::int64_t d) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

struct Problem {
  const float* q;
  std::int64_t q_heads, q_first, kv_first, group, d;
  const TensorView *k, *v;
  float scale;
  const float* krow(std::int64_t t, std::int64_t i) const { return k->f32(0, t, (q_first + i) / group - kv_first); }
  const float* vrow(std::int64_t t, std::int64_t i) const { return v->f32(0, t, (q_first + i) / group - kv_first); }
};

// s[t] = e^(s[t] − mx) for t < n, vectorised as the kernels' own exp (simd_engine.hpp's vexp):
// 2^k · e^r, k = round(x · log2 e) by the 1.5·2^23 rounding constant, r = x − k·ln 2 in two
// parts (|r| <= ln2/2), e^r by exp_poly.hpp (2e-9 relative). x is clamped at −87 so 2^k stays a
// normal float; e^−87 is below anything a sum of weights that includes 1 can notice.
void exp_block(float* s, std::int64_t n, float mx) {
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

void block(const Problem& p, std::int64_t t0, std::int64_t n, Partial& part, float* scores) {
  const std::int64_t d = p.d;
  for (std::int64_t i = 0; i < p.q_heads; ++i) {
    float* s = scores + i * kBlock;
    float mx = part.m[std::size_t(i)];
    for (std::int64_t t = 0; t < n; ++t) {
      s[t] = p.scale * dot(p.q + i * d, p.krow(t0 + t, i), d);
      mx = std::max(mx, s[t]);
    }
    float* acc = part.acc.data() + i * d;
    const float rescale = std::exp(part.m[std::size_t(i)] - mx);  // 0 on the first block (m = −inf)
    float l = part.l[std::size_t(i)] * rescale;
    for (std::int64_t j = 0; j < d; ++j) acc[j] *= rescale;
    exp_block(s, n, mx);
    for (std::int64_t t = 0; t < n; ++t) {
      const float w = s[t];
      l += w;
      const float* vr = p.vrow(t0 + t, i);
#pragma omp simd
      for (std::int64_t j = 0; j < d; ++j) acc[j] += w * vr[j];
    }
    part.m[std::size_t(i)] = mx;
    part.l[std::size_t(i)] = l;
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

}  // namespace

void decode_attention_local(float* out, float* lse, const float* q, std::int64_t q_heads, std::int64_t q_first,
                            const TensorView& k, const TensorView& v, std::int64_t kv_first, std::int64_t group,
                            float scale) {
  const std::int64_t rows = k.shape.s, d = k.shape.d;
  const Problem p{q, q_heads, q_first, kv_first, group, d, &k, &v, scale};
  const int parts = int(std::clamp<std::int64_t>(rows / kRowsPerPart, 1, omp_get_max_threads()));
  std::vector<Partial> partial(static_cast<std::size_t>(parts));
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int t = 0; t < parts; ++t) rows_range(p, rows * t / parts, rows * (t + 1) / parts, partial[std::size_t(t)]);
  for (std::int64_t i = 0; i < q_heads; ++i) {  // merge the parts in order: the same bits every run
    float m = -std::numeric_limits<float>::infinity();
    for (const Partial& pt : partial) m = std::max(m, pt.m[std::size_t(i)]);
    float* o = out + i * d;
    std::fill_n(o, d, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) {  // no row: nothing seen
      lse[i] = m;
      continue;
    }
    float l = 0;
    for (const Partial& pt : partial) {
      const float w = std::exp(pt.m[std::size_t(i)] - m);
      l += w * pt.l[std::size_t(i)];
      for (std::int64_t j = 0; j < d; ++j) o[j] += w * pt.acc[std::size_t(i * d + j)];
    }
    for (std::int64_t j = 0; j < d; ++j) o[j] /= l;
    lse[i] = m + std::log(l);
  }
}

}  // namespace ulysses
