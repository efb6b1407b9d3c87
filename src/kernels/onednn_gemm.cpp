#include "onednn_gemm.hpp"

#include <algorithm>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "ulysses/core/bf16.hpp"

namespace ulysses::kernels {

namespace {

using i64 = std::int64_t;
using dt = dnnl::memory::data_type;

dnnl::engine& cpu() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Row-major op(X)[rows, cols] stored with leading dimension ld: transposed means the strides swap.
dnnl::memory::desc matrix(dt type, i64 rows, i64 cols, i64 ld, bool transposed) {
  return {{rows, cols}, type, transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1}};
}

dnnl::matmul::primitive_desc describe(dt in, bool ta, bool tb, i64 m, i64 n, i64 k, i64 lda, i64 ldb, i64 ldc,
                                      bool accumulate) {
  dnnl::primitive_attr attr;
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc d(matrix(in, m, k, lda, ta), matrix(in, k, n, ldb, tb), matrix(dt::f32, m, n, ldc, false));
  return {d, attr, cpu()};
}

using Key = std::tuple<dt, bool, bool, i64, i64, i64, i64, i64, i64, bool>;

struct Gemm {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

void run(dt in, bool ta, bool tb, i64 m, i64 n, i64 k, const void* a, i64 lda, const void* b, i64 ldb, float* c,
         i64 ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum (oneDNN wants k > 0)
    if (!accumulate)
      for (i64 i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  thread_local std::map<Key, Gemm> cache;
  thread_local dnnl::stream stream(cpu());
  const Key key{in, ta, tb, m, n, k, lda, ldb, ldc, accumulate};
  auto it = cache.find(key);
  if (it == cache.end()) {
    dnnl::matmul::primitive_desc pd = describe(in, ta, tb, m, n, k, lda, ldb, ldc, accumulate);
    it = cache.emplace(key, Gemm{pd, dnnl::matmul(pd)}).first;
  }
  const Gemm& g = it->second;
  dnnl::memory ma(g.pd.src_desc(), cpu(), const_cast<void*>(a)), mb(g.pd.weights_desc(), cpu(), const_cast<void*>(b)),
      mc(g.pd.dst_desc(), cpu(), c);
  g.primitive.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  stream.wait();
}

// Whether this CPU has a bf16 matmul in oneDNN: Debian's oneDNN implements one only from
// AVX-512 up, and on AVX2 refuses to create the primitive.
bool bf16_matmul_available() {
  static const bool available = [] {
    try {
      describe(dt::bf16, false, false, 16, 16, 16, 16, 16, 16, false);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return available;
}

// A stored row-major matrix of `rows` rows with leading dimension ld (cols used) widened to
// float32 in the same layout: the bf16 GEMM's fallback. Products of bf16 values are exact in
// float32, so the result is the bf16 GEMM's contract (bf16 inputs, float32 accumulation).
std::vector<float> widened(const std::uint16_t* x, i64 rows, i64 cols, i64 ld) {
  std::vector<float> w(std::size_t(rows > 0 ? (rows - 1) * ld + cols : 0));
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) w[std::size_t(r * ld + c)] = bf16_to_float(x[r * ld + c]);
  return w;
}

}  // namespace

void onednn_gemm_f32(bool ta, bool tb, i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, float* c,
                     i64 ldc, bool accumulate) {
  run(dt::f32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void onednn_gemm_bf16(bool ta, bool tb, i64 m, i64 n, i64 k, const std::uint16_t* a, i64 lda, const std::uint16_t* b,
                      i64 ldb, float* c, i64 ldc, bool accumulate) {
  if (bf16_matmul_available()) return run(dt::bf16, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  const std::vector<float> a32 = widened(a, ta ? k : m, ta ? m : k, lda), b32 = widened(b, tb ? n : k, tb ? k : n, ldb);
  run(dt::f32, ta, tb, m, n, k, a32.data(), lda, b32.data(), ldb, c, ldc, accumulate);
}

std::string onednn_bf16_implementation(i64 m, i64 n, i64 k) {
  if (!bf16_matmul_available())
    return std::string("f32 ") + describe(dt::f32, false, false, m, n, k, k, n, n, false).impl_info_str() +
           " (no bf16 matmul here)";
  return describe(dt::bf16, false, false, m, n, k, k, n, n, false).impl_info_str();
}

}  // namespace ulysses::kernels
