// The decode kernel: per query head, softmax(scale · K q) · V over the cached rows. The threads
// split the rows; each streams its range once through the active ISA's pass (decode_rows.hpp),
// and their partial results are merged by their LSE in a fixed order.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "decode_rows.hpp"
#include "flash_common.hpp"
#include "isa.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {
namespace {

using kernels::DecodeJob;
using kernels::DecodePartial;

constexpr std::int64_t kRowsPerPart = 256;  // fewer rows than this per thread are not worth a thread

// The call as pointers and strides, its query heads in runs that share one KV head.
DecodeJob job_of(const TensorView& q, const TensorView& k, const TensorView& v, const DecodeParams& p, float scale) {
  DecodeJob job{q.f32(0, 0, 0), k.f32(0, 0, 0), v.f32(0, 0, 0), q.shape.h,  q.shape.d, q.stride_h,
                k.stride_s,     k.stride_h,     v.stride_s,     v.stride_h, scale,     {}};
  for (std::int64_t i = 0; i < q.shape.h;) {
    const std::int64_t kv = (p.q_first + i) / p.group, end = std::min(q.shape.h, (kv + 1) * p.group - p.q_first);
    job.runs.push_back({i, end - i, kv - p.kv_first});
    i = end;
  }
  job.prefetch_block = kernels::decode_prefetches_block(p.group);
  return job;
}

kernels::DecodeRowsFn rows_fn() {
  switch (kernels::active_isa()) {
    case kernels::Isa::portable: return kernels::decode_rows_portable;
    case kernels::Isa::avx2: return kernels::decode_rows_avx2;
    default: return kernels::decode_rows_avx512;  // avx512 and amx (AVX-512 for float32)
  }
}

// The CPU's kernel: threads split the rows, their partials merged by LSE in order.
void decode_cpu(const TensorView& out, const TensorView& lse, const DecodeJob& job, std::int64_t rows) {
  const std::int64_t d = job.d;
  const int parts = int(std::clamp<std::int64_t>(rows / kRowsPerPart, 1, omp_get_max_threads()));
  const kernels::DecodeRowsFn pass = rows_fn();
  std::vector<DecodePartial> partial(static_cast<std::size_t>(parts));
  for (DecodePartial& pt : partial) {
    pt.acc.assign(std::size_t(job.q_heads * d), 0.0f);
    pt.m.assign(std::size_t(job.q_heads), -std::numeric_limits<float>::infinity());
    pt.l.assign(std::size_t(job.q_heads), 0.0f);
  }
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
  for (int t = 0; t < parts; ++t) pass(job, rows * t / parts, rows * (t + 1) / parts, partial[std::size_t(t)]);
  for (std::int64_t i = 0; i < job.q_heads; ++i) {  // merge the parts in order: the same bits every run
    float m = -std::numeric_limits<float>::infinity();
    for (const DecodePartial& pt : partial) m = std::max(m, pt.m[std::size_t(i)]);
    float* o = out.f32(0, 0, i);
    std::fill_n(o, d, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) {  // no row: nothing seen
      *lse.f32(0, 0, i) = m;
      continue;
    }
    float l = 0;
    for (const DecodePartial& pt : partial) {
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
  decode_cpu(out, lse, job_of(q, k, v, params, scale), k.shape.s);
}

}  // namespace ulysses
