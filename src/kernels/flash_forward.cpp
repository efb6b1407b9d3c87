// Flash attention forward (FlashAttention-2's algorithm) on the CPU.
//
// For each (batch, head, query block of kBlockQ rows), walk the key blocks keeping a running
// row max m and row sum l:  S = scale·Q·Kᵀ;  m' = max(m, rowmax S);  P = exp(S − m');
// l = e^{m−m'}·l + rowsum P;  O = e^{m−m'}·O + P·V;  finally O /= l, lse = m + log l.
// The two GEMMs are the level's engine (engine.hpp); the softmax pass is here, with the
// level's vector ops. Key blocks no row of the query block sees (above the causal diagonal,
// outside its documents or its sliding window) are skipped.
//
// Finite in, finite out (softmax_row): for finite q, k, v whose raw scores q·k (and the
// GEMM's partial sums) are finite in float32, out and lse are finite; exp never sees a
// positive argument. They are accurate (to the float32 rounding of the scaled scores, as
// float32 PyTorch) while |scale·q·k| < FLT_MAX, and O's accumulator needs sk·max|v| < FLT_MAX.
#include <fmt/format.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "flash_common.hpp"
#include "isa.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/bf16.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

float effective_scale(const AttentionParams& params, std::int64_t head_dim) {
  return params.scale.value_or(1.0f / std::sqrt(float(head_dim)));
}

double attention_forward_flops(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t d,
                               bool causal) {
  double f = 4.0 * double(b) * double(sq) * double(sk) * double(h) * double(d);
  return causal ? f / 2 : f;
}

void check_attention_shapes(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out) {
  auto fail = [](const std::string& m) { throw Error("attention: " + m); };
  // The kernel table is chosen per device (a backend registers its own), then (on the CPU) per ISA.
  for (const TensorView* t : {&k, &v, &out})
    if (t->device != q.device)
      fail(fmt::format("q is on {}, another tensor on {}", to_string(q.device), to_string(t->device)));
  if (q.device != Device::cpu && device_kernels(q.device) == nullptr)
    fail(fmt::format("no attention kernels for device {}", to_string(q.device)));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    fail(fmt::format("q, k and v must share one dtype, got {}, {}, {}", to_string(q.dtype), to_string(k.dtype),
                     to_string(v.dtype)));
  const Shape& s = q.shape;
  if (s.b <= 0 || s.s < 0 || s.h <= 0 || s.d <= 0) fail(fmt::format("q has an invalid shape {}", s.str()));
  if (s.d > 1024) fail(fmt::format("head_dim {} exceeds the supported maximum 1024", s.d));
  if (k.shape.b != s.b || k.shape.d != s.d || k.shape.h <= 0)
    fail(fmt::format("k must be [{}, sk, h_kv, {}], got {}", s.b, s.d, k.shape.str()));
  if (!(v.shape == k.shape)) fail(fmt::format("v must be {} like k, got {}", k.shape.str(), v.shape.str()));
  if (!(out.shape == s)) fail(fmt::format("out must be {} like q, got {}", s.str(), out.shape.str()));
  if (s.h % k.shape.h != 0) fail(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({})", s.h, k.shape.h));
}

namespace {
PerDevice<AttentionKernels>& registered_kernels() {
  static PerDevice<AttentionKernels> k;
  return k;
}
}  // namespace

const AttentionKernels* device_kernels(Device device) { return registered_kernels().find(device); }

void register_attention_kernels(const AttentionKernels& kernels) { registered_kernels().set(kernels); }

const char* kernel_isa() { return kernels::active_level().name; }

bool kernel_converts(DType dtype) { return kernels::engine_for(kernels::active_level(), dtype) == nullptr; }

std::string kernel_engine(DType dtype) {
  const kernels::KernelLevel& l = kernels::active_level();
  if (const kernels::GemmEngine* e = kernels::engine_for(l, dtype)) return e->name;
  return std::string(l.f32->name) + " (" + to_string(dtype) + " converted)";
}

namespace {
void check_lse(const TensorView& lse, const TensorView& q) {
  const Shape want{q.shape.b, q.shape.s, q.shape.h, 1};
  if (lse.dtype != DType::f32 || !(lse.shape == want) || !lse.is_dense(Layout::bhsd) || lse.device != q.device ||
      lse.data == nullptr)
    throw Error(
        fmt::format("attention: lse must be a dense float32 {} bhsd tensor on q's device (lse_tensor(q.shape)), "
                    "got {} {}",
                    want.str(), to_string(lse.dtype), lse.shape.str()));
}
}  // namespace

void check_documents(const AttentionParams& params, const TensorView& q, const TensorView& k) {
  if (params.cu_seqlens.empty()) return;
  const std::int64_t end = params.cu_seqlens.back();
  if (q.shape.b != 1)
    throw Error(fmt::format("attention: cu_seqlens (packed documents) needs batch 1, got {}", q.shape.b));
  if (std::string e = cu_seqlens_error(params.cu_seqlens, end); !e.empty()) throw Error("attention: " + e);
  if (params.q_offset < 0 || params.k_offset < 0 || params.q_offset + q.shape.s > end ||
      params.k_offset + k.shape.s > end)
    throw Error(fmt::format("attention: queries [{}, {}) and keys [{}, {}) must lie inside cu_seqlens' [0, {})",
                            params.q_offset, params.q_offset + q.shape.s, params.k_offset, params.k_offset + k.shape.s,
                            end));
}

void check_window(const AttentionParams& params) {
  for (const auto& [name, value] : {std::pair{"left", params.window_left}, std::pair{"right", params.window_right}})
    if (value < -1)
      throw Error(fmt::format("attention: window_{} must be -1 (unbounded) or >= 0, got {}", name, value));
}

void check_offsets(const AttentionParams& params, const TensorView& q, const TensorView& k) {
  for (const auto& [name, offset, n] :
       {std::tuple{"q_offset", params.q_offset, q.shape.s}, std::tuple{"k_offset", params.k_offset, k.shape.s}})
    if (std::int64_t end; __builtin_add_overflow(offset, n, &end))
      throw Error(fmt::format("attention: {} {} + {} rows passes the largest position (int64)", name, offset, n));
}

void check_scale(const AttentionParams& params) {
  if (params.scale && !(std::isfinite(*params.scale) && *params.scale > 0.0f))
    throw Error(
        fmt::format("attention: scale must be finite and > 0 (unset: 1/sqrt(head_dim)), got {}", *params.scale));
}

void check_attention_call(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                          const TensorView& lse, const AttentionParams& params) {
  check_attention_shapes(q, k, v, out);
  check_lse(lse, q);
  check_offsets(params, q, k);
  check_documents(params, q, k);
  check_window(params);
  check_scale(params);
}

void flash_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v, const AttentionParams& params) {
  check_attention_call(q, k, v, out, lse, params);
  if (q.device != Device::cpu) return device_kernels(q.device)->forward(out, lse, q, k, v, params);
  kernels::flash_forward(kernels::active_level(), out, static_cast<float*>(lse.data), q, k, v, params);
}

namespace kernels {

PackedHeads pack_heads(const GemmEngine& e, PackFn pack, const TensorView& x) {
  const std::int64_t B = x.shape.b, H = x.shape.h;
  PackedHeads p;
  p.per_head = (e.packed_bytes(x.shape.s, x.shape.d) + 63) / 64 * 64;
  p.storage = Tensor::uninitialized({1, 1, 1, B * H * p.per_head / 4});
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t bb = 0; bb < B; ++bb)
    for (std::int64_t g = 0; g < H; ++g)
      pack(x.row(bb, 0, g), x.stride_s, x.shape.s, x.shape.d, const_cast<std::byte*>(p.at(bb, g, H)));
  return p;
}

namespace {

struct Tile {
  std::vector<float> s, o, m, l;
  explicit Tile(std::int64_t bk, std::int64_t d)
      : s(std::size_t(kBlockQ * bk)), o(std::size_t(kBlockQ * d)), m(kBlockQ), l(kBlockQ) {}
};

struct ForwardArgs {
  const KernelLevel& level;
  const GemmEngine& e;
  TensorView out, q;
  std::int64_t sk;
  const AttentionParams& p;
  float scale;
};

// One row of a score tile: the online-softmax update of the row's m, l and O over its visible
// keys r (P = 0 elsewhere; S is raw scores; m is in scaled units). P = exp(min(scale·S, m) − m)
// with m the max of the same rounded scale·S (engine.hpp), so P <= 1 and the max's P is 1:
// l >= 1, and O = Σ P·V, alpha = e^{m−m'} <= 1 never overflow. A scaled max past FLT_MAX is
// clamped to it: the keys whose scaled score overflowed to +inf share the weight (P = 1), the
// others get ~0, and lse stays finite (finite, no longer the softmax of the exact scores).
void softmax_row(const VectorOps& vec, float* srow, KeyRange r, std::int64_t nk, float scale, float* m, float* l,
                 float* o, std::int64_t d) {
  float* s = srow + r.lo;
  const std::int64_t n = r.hi - r.lo;
  const float mx = std::min(vec.row_max(s, n, *m, scale), std::numeric_limits<float>::max());
  std::fill(srow, s, 0.0f);
  std::fill(s + n, srow + nk, 0.0f);
  if (n == 0 || mx == kNegInf) {  // nothing new for this row: P = 0, state unchanged
    std::fill(s, s + n, 0.0f);
    return;
  }
  // The max seldom moves after the first tiles: skip the call to exp when it did not.
  const float alpha = mx == *m ? 1.0f : std::exp(*m - mx);
  *l = alpha * *l + vec.exp_shifted_sum(s, s, n, scale, mx);
  *m = mx;
  if (alpha != 1.0f)
    for (std::int64_t x = 0; x < d; ++x) o[x] *= alpha;
}

// The keys any row of a query block sees, from a key-aligned start: the tiles to visit.
KeyRange block_keys(const std::array<KeyRange, kBlockQ>& rows, std::int64_t mq) {
  KeyRange r{std::numeric_limits<std::int64_t>::max(), 0};
  for (std::int64_t i = 0; i < mq; ++i)
    if (rows[std::size_t(i)].hi > rows[std::size_t(i)].lo) {
      r.lo = std::min(r.lo, rows[std::size_t(i)].lo);
      r.hi = std::max(r.hi, rows[std::size_t(i)].hi);
    }
  if (r.hi == 0) return {0, 0};
  return {r.lo / kKeyAlign * kKeyAlign, r.hi};
}

// One query block [i0, i0 + mq) of one (batch, head); pk, pv: the packed K and V of its KV head.
void forward_block(Tile& t, const ForwardArgs& a, const std::byte* pk, const std::byte* pvb, float* lse_row,
                   std::int64_t bb, std::int64_t h, std::int64_t i0, std::int64_t mq) {
  const std::int64_t d = a.q.shape.d, bk = block_k(d);
  std::fill(t.o.begin(), t.o.end(), 0.0f);
  std::fill(t.m.begin(), t.m.end(), kNegInf);
  std::fill(t.l.begin(), t.l.end(), 0.0f);
  std::array<KeyRange, kBlockQ> seen;
  for (std::int64_t i = 0; i < mq; ++i) seen[std::size_t(i)] = visible_keys(a.p, i0 + i, a.sk);
  const KeyRange keys = block_keys(seen, mq);  // tiles outside every row's document and window are skipped
  for (std::int64_t j0 = keys.lo; j0 < keys.hi; j0 += bk) {
    const std::int64_t nk = std::min(bk, keys.hi - j0);
    // With a causal mask, row i sees keys up to diag + i of this block.
    const std::int64_t diag = tile_diagonal(a.p, i0, j0);
    a.e.scores(mq, nk, d, a.q.row(bb, i0, h), a.q.stride_s, pk + a.e.packed_offset(j0, d), t.s.data(), bk, diag);
    for (std::int64_t i = 0; i < mq; ++i)
      softmax_row(a.level.vec, &t.s[std::size_t(i * bk)], in_block(seen[std::size_t(i)], j0, nk), nk, a.scale,
                  &t.m[std::size_t(i)], &t.l[std::size_t(i)], &t.o[std::size_t(i * d)], d);
    a.e.pv(mq, d, nk, t.s.data(), bk, pvb + a.e.packed_offset(j0, d), t.o.data(), d, diag);
  }
  for (std::int64_t i = 0; i < mq; ++i) {
    float* o = &t.o[std::size_t(i * d)];
    const float inv = t.l[i] > 0.0f ? 1.0f / t.l[i] : 0.0f;
    for (std::int64_t x = 0; x < d; ++x) o[x] *= inv;
    store_row(a.out, bb, i0 + i, h, o);
    lse_row[i] = t.l[i] > 0.0f ? t.m[i] + std::log(t.l[i]) : kNegInf;
  }
}

}  // namespace

void flash_forward(const KernelLevel& level, const TensorView& out, float* lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, const AttentionParams& params) {
  const GemmEngine* e = engine_for(level, q.dtype);
  if (e == nullptr) {  // no engine for this dtype here: compute in float32
    const Tensor q32 = copy_of(q, DType::f32), k32 = copy_of(k, DType::f32), v32 = copy_of(v, DType::f32);
    return flash_forward(level, out, lse, q32.view(), k32.view(), v32.view(), params);
  }
  const std::int64_t B = q.shape.b, sq = q.shape.s, H = q.shape.h, d = q.shape.d;
  const std::int64_t group = H / k.shape.h, Hkv = k.shape.h;
  const std::int64_t nqb = (sq + kBlockQ - 1) / kBlockQ, tasks = B * H * nqb;
  // K and V of every (batch, KV head) packed once: one pass over each, against the s/64
  // times each key block is used.
  const PackedHeads pk = pack_heads(*e, e->pack_bt, k), pv = pack_heads(*e, e->pack_b, v);
  const ForwardArgs a{level, *e, out, q, k.shape.s, params, effective_scale(params, d)};
#pragma omp parallel
  {
    Tile tile(block_k(d), d);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      // Last query blocks first: under a causal mask they are the most expensive.
      const std::int64_t qb = nqb - 1 - task % nqb, bh = task / nqb, bb = bh / H, h = bh % H;
      const std::int64_t i0 = qb * kBlockQ, mq = std::min(kBlockQ, sq - i0);
      forward_block(tile, a, pk.at(bb, h / group, Hkv), pv.at(bb, h / group, Hkv), lse + (bb * H + h) * sq + i0, bb, h,
                    i0, mq);
    }
  }
}

}  // namespace kernels

}  // namespace ulysses
