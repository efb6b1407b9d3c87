#include "onednn_gemm.hpp"

#include <algorithm>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

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

}  // namespace

void onednn_gemm_f32(bool ta, bool tb, i64 m, i64 n, i64 k, const float* a, i64 lda, const float* b, i64 ldb, float* c,
                     i64 ldc, bool accumulate) {
  run(dt::f32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void onednn_gemm_bf16(bool ta, bool tb, i64 m, i64 n, i64 k, const std::uint16_t* a, i64 lda, const std::uint16_t* b,
                      i64 ldb, float* c, i64 ldc, bool accumulate) {
  run(dt::bf16, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

std::string onednn_bf16_implementation(i64 m, i64 n, i64 k) {
  return describe(dt::bf16, false, false, m, n, k, k, n, n, false).impl_info_str();
}

}  // namespace ulysses::kernels
