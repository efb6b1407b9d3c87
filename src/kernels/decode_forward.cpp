// The decode kernel: per query head, softmax(scale · K q) · V over the cached rows. Each thread
// streams its own range of rows once, in address order, in blocks whose scores are kept so the
// running maximum rescales once a block; the threads' partial results are merged by their LSE at
// the end. The query heads of a GQA group go together: each K and V vector is loaded once for
// all of them (with h/h_kv heads a KV head, per-head passes would do h/h_kv times the loads and
// FMA chains per cached byte).
// The vector helpers are always inlined into the AVX2 clone: no vector crosses a call, so GCC's
// note that a 32-byte vector argument changes the ABI without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
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

typedef float v8 __attribute__((vector_size(32)));
constexpr std::int64_t W = 8;  // floats a vector

[[gnu::always_inline]] inline v8 load(const float* p) {
  v8 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
[[gnu::always_inline]] inline void store(float* p, const v8& x) { std::memcpy(p, &x, sizeof x); }

// [Σ a, Σ b, Σ c, Σ d] in the low four lanes: a tree of shuffled adds, not four sums of lanes.
[[gnu::always_inline]] inline v8 sum4(const v8& a, const v8& b, const v8& c, const v8& d) {
  const v8 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  const v8 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
  const v8 x = __builtin_shufflevector(ab, cd, 0, 2, 4, 6, 8, 10, 12, 14) +
               __builtin_shufflevector(ab, cd, 1, 3, 5, 7, 9, 11, 13, 15);
  return __builtin_shufflevector(x, x, 0, 2, 4, 6, 0, 2, 4, 6) + __builtin_shufflevector(x, x, 1, 3, 5, 7, 1, 3, 5, 7);
}

typedef std::uint32_t u8 __attribute__((vector_size(32)));

// e^x for x <= 0, the kernels' own exp (simd_engine.hpp's vexp): 2^k · e^r, k = round(x · log2 e)
// by the 1.5·2^23 rounding constant, r = x − k·ln 2 in two parts (|r| <= ln2/2), e^r by
// exp_poly.hpp (2e-9 relative). x is clamped at −87 so 2^k stays a normal float; e^−87 is below
// anything a sum of weights that includes 1 can notice.
[[gnu::always_inline]] inline v8 exp8(const v8& in) {
  const v8 x = in > -87.0f ? in : v8{} - 87.0f;
  const v8 km = x * 1.44269504088896341f + 12582912.0f;
  const v8 k = km - 12582912.0f;
  const v8 r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  return kernels::exp_poly(r) * (v8)(((u8)km << 23) + (127u << 23));
}

// Query heads [j, j + n) of this call that share one KV head, at k_at / v_at in a row of k / v;
// n is 4, 2 or 1 (a GQA group is cut into such units): the heads one loaded K or V vector serves.
struct Unit {
  std::int64_t j, n, k_at, v_at;
};

struct Problem {
  const TensorView *q, *k, *v;
  std::int64_t q_heads, d;
  float scale;
  std::vector<Unit> units;
  Problem(const TensorView* q, const TensorView* k, const TensorView* v, const DecodeParams& p, float scale)
      : q(q), k(k), v(v), q_heads(q->shape.h), d(q->shape.d), scale(scale) {
    for (std::int64_t i = 0; i < q_heads;) {  // each run of heads on one KV head, cut into 4s, 2s and 1s
      const std::int64_t kv = (p.q_first + i) / p.group, end = std::min(q_heads, (kv + 1) * p.group - p.q_first);
      for (const std::int64_t n : {4, 2, 1})
        for (; end - i >= n; i += n)
          units.push_back({i, n, (kv - p.kv_first) * k->stride_h, (kv - p.kv_first) * v->stride_h});
    }
  }
};

// The scores of one row (k at the unit's KV head) for the unit's G heads: each K vector is loaded
// once for the G heads, two vectors a step in 2·G chains of FMAs, the dots' lanes summed by one
// tree. The loads walk the cache in address order (a row's heads, then the next row): measured
// here, any other order (a tile of rows per head, even with software prefetches) read DRAM at
// half the rate, as the hardware prefetchers stop following. d's tail a float at a time.
template <int G>
[[gnu::always_inline]] inline void row_scores(const Problem& p, const Unit& u, const float* k, std::int64_t t,
                                              float* scores) {
  const std::int64_t d = p.d, qs = p.q->stride_h;
  const float* q = p.q->f32(0, 0, u.j);
  v8 acc[2][4] = {};
  std::int64_t c = 0;
  for (; c + 2 * W <= d; c += 2 * W) {
    const v8 k0 = load(k + c), k1 = load(k + c + W);
    for (int g = 0; g < G; ++g) {
      acc[0][g] += load(q + g * qs + c) * k0;
      acc[1][g] += load(q + g * qs + c + W) * k1;
    }
  }
  for (; c + W <= d; c += W)
    for (int g = 0; g < G; ++g) acc[0][g] += load(q + g * qs + c) * load(k + c);
  v8 s = sum4(acc[0][0] + acc[1][0], acc[0][1] + acc[1][1], acc[0][2] + acc[1][2], acc[0][3] + acc[1][3]);
  for (; c < d; ++c)
    for (int g = 0; g < G; ++g) s[g] += q[g * qs + c] * k[c];
  for (int g = 0; g < G; ++g) scores[(u.j + g) * kBlock + t] = p.scale * s[g];
}

// acc[g] += w_g · v over the unit's G heads for one row v (at the unit's KV head): each V vector is
// loaded once for the G heads, in a constant-stride walk like row_scores'.
template <int G>
[[gnu::always_inline]] inline void row_pv(const Problem& p, const Unit& u, const float* v, std::int64_t t,
                                          const float* scores, float* acc) {
  const std::int64_t d = p.d;
  float w[G];
  for (int g = 0; g < G; ++g) w[g] = scores[(u.j + g) * kBlock + t];
  float* a = acc + u.j * d;
  std::int64_t c = 0;
  for (; c + W <= d; c += W) {
    const v8 vv = load(v + c);
    for (int g = 0; g < G; ++g) store(a + g * d + c, load(a + g * d + c) + w[g] * vv);
  }
  for (; c < d; ++c)
    for (int g = 0; g < G; ++g) a[g * d + c] += w[g] * v[c];
}

// Every head's running maximum, sum and accumulator brought up to this block's scores, and its
// scores replaced by their weights e^(s − m), eight at a time (a short block's last few in one
// vector padded with zeros, whose weights are not kept).
[[gnu::always_inline]] inline void softmax_block(const Problem& p, std::int64_t n, Partial& part, float* scores) {
  const std::int64_t whole = n / W * W, tail = n - whole;
  for (std::int64_t i = 0; i < p.q_heads; ++i) {
    float* __restrict s = scores + i * kBlock;
    float* __restrict acc = part.acc.data() + i * p.d;
    const float before = part.m[std::size_t(i)];
    v8 m8 = v8{} + before;
    for (std::int64_t t = 0; t < whole; t += W) m8 = m8 > load(s + t) ? m8 : load(s + t);
    float mx = std::max({m8[0], m8[1], m8[2], m8[3], m8[4], m8[5], m8[6], m8[7]});
    for (std::int64_t t = whole; t < n; ++t) mx = std::max(mx, s[t]);
    const float rescale = std::exp(before - mx);  // 0 on the first block (m = −inf)
    for (std::int64_t j = 0; j < p.d; ++j) acc[j] *= rescale;
    v8 l8 = {};
    for (std::int64_t t = 0; t < whole; t += W) {
      const v8 e = exp8(load(s + t) - mx);
      store(s + t, e);
      l8 += e;
    }
    float l = part.l[std::size_t(i)] * rescale + sum4(l8, l8, l8, l8)[0];
    if (tail > 0) {
      v8 x = {};
      std::memcpy(&x, s + whole, std::size_t(tail) * sizeof(float));
      const v8 e = exp8(x - mx);
      std::memcpy(s + whole, &e, std::size_t(tail) * sizeof(float));
      for (std::int64_t t = 0; t < tail; ++t) l += e[t];
    }
    part.m[std::size_t(i)] = mx;
    part.l[std::size_t(i)] = l;
  }
}

// Rows [t0, t0 + n) for every query head: the scores row by row, then the running maximum, sum
// and rescale per head once a block, then the weighted V rows row by row.
KERNEL_CLONES void block(const Problem& p, std::int64_t t0, std::int64_t n, Partial& part, float* scores) {
  const float* k0 = p.k->f32(0, t0, 0);
  const float* v0 = p.v->f32(0, t0, 0);
  const std::int64_t ks = p.k->stride_s, vs = p.v->stride_s;
  for (std::int64_t t = 0; t < n; ++t)
    for (const Unit& u : p.units) {
      const float* k = k0 + t * ks + u.k_at;
      if (u.n == 4) row_scores<4>(p, u, k, t, scores);
      if (u.n == 2) row_scores<2>(p, u, k, t, scores);
      if (u.n == 1) row_scores<1>(p, u, k, t, scores);
    }
  softmax_block(p, n, part, scores);
  for (std::int64_t t = 0; t < n; ++t)
    for (const Unit& u : p.units) {
      const float* v = v0 + t * vs + u.v_at;
      if (u.n == 4) row_pv<4>(p, u, v, t, scores, part.acc.data());
      if (u.n == 2) row_pv<2>(p, u, v, t, scores, part.acc.data());
      if (u.n == 1) row_pv<1>(p, u, v, t, scores, part.acc.data());
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
  decode_cpu(out, lse, Problem(&q, &k, &v, params, scale));
}

}  // namespace ulysses
