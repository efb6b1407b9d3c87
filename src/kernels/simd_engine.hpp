// The float32 engine and vector ops, written once over a vector of W floats (GCC vector
// extensions) and compiled once per instruction set: engine_simd_avx2.cpp (W = 8, -mavx2
// -mfma) and engine_simd_avx512.cpp (W = 16, -mavx512f …). Tests compile the AVX-512 file a
// second time without ISA flags (namespace `emulated`): GCC then lowers the same vectors to
// narrower instructions, so that code path is checked on CPUs without AVX-512.
//
// Micro-kernel (llama.cpp / BLIS style): a register block of MR = 6 rows × NV vectors of C;
// per step of the inner dimension it loads NV vectors of B, broadcasts 6 scalars of A and
// issues 6·NV FMAs, so the accumulators never leave registers (AVX2: 12 of 16 ymm; AVX-512:
// 24 of 32 zmm). A may be read transposed (Pᵀ, dSᵀ of the backward) with no packing: a
// broadcast loads one scalar wherever it is. Kᵀ and Vᵀ for the scores are packed once per
// head into panels [d][NV·W].
//
// Before including: ULYSSES_SIMD_LANES (W), ULYSSES_SIMD_NV, ULYSSES_KERNEL_NS, ULYSSES_SIMD_NAME.
// GCC 12's AVX-512 min/max wrappers trip a false -W(maybe-)uninitialized inside the header
// (their undefined pass-through operand, `__m512 __Y = __Y`).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "engines.hpp"
#include "exp_poly.hpp"

namespace ulysses::kernels::ULYSSES_KERNEL_NS {

namespace {

constexpr int W = ULYSSES_SIMD_LANES, NV = ULYSSES_SIMD_NV, MR = 6, NR = NV * W;
typedef float vf __attribute__((vector_size(W * 4)));
typedef std::int32_t vi __attribute__((vector_size(W * 4)));
typedef std::uint32_t vu __attribute__((vector_size(W * 4)));

inline vf load(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void store(float* p, vf x) { std::memcpy(p, &x, sizeof x); }
template <std::size_t... I>
inline vf splat_lanes(float x, std::index_sequence<I...>) {
  return vf{((void)I, x)...};
}
inline vf splat(float x) { return splat_lanes(x, std::make_index_sequence<W>{}); }  // one vbroadcastss
// x86's min/max return the second operand when either is NaN, exactly like these ternaries;
// GCC emits compare + blend for the ternaries, so use the one-instruction form where the
// file's flags have it (the emulated build keeps the ternaries).
#if defined(__AVX512F__) && ULYSSES_SIMD_LANES == 16
inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)b, (__m512)a); }
inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)b, (__m512)a); }
#elif defined(__AVX__) && ULYSSES_SIMD_LANES == 8
inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)b, (__m256)a); }
inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)b, (__m256)a); }
#else
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
#endif

// ---- the micro-kernel -------------------------------------------------------------------

// acc[r][v] += Σ_kk A(r, kk) · b[kk·ldb + v·W …], A(r, kk) = a[r·lda + kk] (or a[kk·lda + r]
// when TRANS_A).
// k >= 1, so the loop is a do-while: after a loop that may run zero times the compiler merges
// two versions of the 24 accumulators, and it does so through the stack.
template <int R, int NB, bool TRANS_A>
inline void fma_block(std::int64_t k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                      vf (&acc)[R][NB]) {
  std::int64_t kk = 0;
  do {
    vf bv[NB];
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) bv[v] = load(b + kk * ldb + v * W);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const vf x = splat(TRANS_A ? a[kk * lda + r] : a[r * lda + kk]);
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) acc[r][v] += x * bv[v];
    }
  } while (++kk < k);
}

// f(std::integral_constant<int, R>) for R = mr ∈ [1, MR]: every row count gets a fully
// unrolled kernel.
template <class F>
inline void with_rows(std::int64_t mr, F&& f) {
  switch (mr) {
    case 6: return f(std::integral_constant<int, 6>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

// Every loop over the accumulators is unrolled: an index the compiler cannot resolve would
// keep the whole block in memory (spilled after the FMAs, reloaded to store).
template <int R, int NB>
inline void store_block(float* c, std::int64_t ldc, const vf (&acc)[R][NB]) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) store(c + r * ldc + v * W, acc[r][v]);
}

// c[R rows, NB·W columns] += A · B, A and B as in fma_block.
template <int R, int NB, bool TRANS_A>
inline void accumulate_block(std::int64_t k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                             float* c, std::int64_t ldc) {
  if (k <= 0) return;
  vf acc[R][NB];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) acc[r][v] = load(c + r * ldc + v * W);
  fma_block<R, NB, TRANS_A>(k, a, lda, b, ldb, acc);
  store_block(c, ldc, acc);
}

// c[R rows, n columns] += A · B for any n: blocks of NV vectors, then single vectors, then a
// scalar tail (head dims that are not a multiple of W).
template <int R, bool TRANS_A>
void accumulate_rows(std::int64_t n, std::int64_t k, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                     float* c, std::int64_t ldc) {
  std::int64_t j = 0;
  for (; j + NR <= n; j += NR) accumulate_block<R, NV, TRANS_A>(k, a, lda, b + j, ldb, c + j, ldc);
  for (; j + W <= n; j += W) accumulate_block<R, 1, TRANS_A>(k, a, lda, b + j, ldb, c + j, ldc);
  for (int r = 0; r < R && j < n; ++r)
    for (std::int64_t kk = 0; kk < k; ++kk) {
      const float x = TRANS_A ? a[kk * lda + r] : a[r * lda + kk];
      for (std::int64_t jj = j; jj < n; ++jj) c[r * ldc + jj] += x * b[kk * ldb + jj];
    }
}

// ---- the engine -------------------------------------------------------------------------

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

std::int64_t packed_bytes(std::int64_t n, std::int64_t d) { return round_up(n, kKeyAlign) * d * 4; }
std::int64_t packed_offset(std::int64_t j0, std::int64_t d) { return j0 * d * 4; }

// Panels of NR keys, each [d][NR]: the B of the scores, read one contiguous vector per step.
void pack_bt(const void* rows, std::int64_t ld, std::int64_t n, std::int64_t d, void* packed) {
  const float* src = static_cast<const float*>(rows);
  float* dst = static_cast<float*>(packed);
  for (std::int64_t p = 0; p < round_up(n, kKeyAlign) / NR; ++p, dst += NR * d)
    for (std::int64_t j = 0; j < NR; ++j) {
      const std::int64_t key = p * NR + j;
      for (std::int64_t x = 0; x < d; ++x) dst[x * NR + j] = key < n ? src[key * ld + x] : 0.0f;
    }
}

// Dense rows [n][d]: the B of pv, so the key block a tile reads is contiguous.
void pack_b(const void* rows, std::int64_t ld, std::int64_t n, std::int64_t d, void* packed) {
  const float* src = static_cast<const float*>(rows);
  float* dst = static_cast<float*>(packed);
  for (std::int64_t key = 0; key < round_up(n, kKeyAlign); ++key)
    for (std::int64_t x = 0; x < d; ++x) dst[key * d + x] = key < n ? src[key * ld + x] : 0.0f;
}

// s[R rows, cols] = A · panel over d >= 1 (a head dimension).
template <int R>
void scores_block(std::int64_t d, const float* a, std::int64_t lda, const float* panel, float* s, std::int64_t lds,
                  std::int64_t cols) {
  vf acc[R][NV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  fma_block<R, NV, false>(d, a, lda, panel, NR, acc);
  if (cols == NR) return store_block(s, lds, acc);
  float tmp[R * NR];
  store_block(tmp, NR, acc);
  for (int r = 0; r < R; ++r) std::copy_n(tmp + r * NR, cols, s + r * lds);
}

void scores(std::int64_t m, std::int64_t n, std::int64_t d, const void* av, std::int64_t lda, const void* bt, float* s,
            std::int64_t lds, std::int64_t diag) {
  const float* a = static_cast<const float*>(av);
  const float* panels = static_cast<const float*>(bt);
  // Panel by panel, every row block against it: a panel ([d][NR], 16 KiB at d = 64) stays in
  // L1 while the row blocks pass, where a row block against every panel of a 256-key block
  // would stream all of them from L2 again for each row block.
  for (std::int64_t j = 0; j < n; j += NR)
    for (std::int64_t i0 = 0; i0 < m; i0 += MR) {
      const std::int64_t mr = std::min<std::int64_t>(MR, m - i0);
      if (j >= std::clamp<std::int64_t>(diag + i0 + mr, 0, n)) continue;  // past the keys the block's last row sees
      with_rows(mr, [&](auto R) {
        scores_block<decltype(R)::value>(d, a + i0 * lda, lda, panels + j * d, s + i0 * lds + j, lds,
                                         std::min<std::int64_t>(NR, n - j));
      });
    }
}

void pv(std::int64_t m, std::int64_t d, std::int64_t k, const float* p, std::int64_t ldp, const void* bv, float* o,
        std::int64_t ldo, std::int64_t diag) {
  const float* b = static_cast<const float*>(bv);
  // Keys in chunks of kKeyAlign and columns in blocks of NR, every row block against one
  // [chunk][block] piece of V (16 KiB), which stays in L1 while the row blocks pass. Each output
  // element still adds its products in key order, through O between chunks, so the sums are the
  // same to the bit.
  for (std::int64_t c0 = 0; c0 < k; c0 += kKeyAlign)
    for (std::int64_t j = 0; j < d; j += NR)
      for (std::int64_t i0 = 0; i0 < m; i0 += MR) {
        const std::int64_t mr = std::min<std::int64_t>(MR, m - i0);
        const std::int64_t kk = std::clamp<std::int64_t>(diag + i0 + mr, 0, k);  // later keys have P = 0
        const std::int64_t len = std::min(kk, c0 + kKeyAlign) - c0;
        if (len <= 0) continue;
        with_rows(mr, [&](auto R) {
          accumulate_rows<decltype(R)::value, false>(std::min<std::int64_t>(NR, d - j), len, p + i0 * ldp + c0, ldp,
                                                     b + c0 * d + j, d, o + i0 * ldo + j, ldo);
        });
      }
}

void pt_b(std::int64_t k, std::int64_t d, std::int64_t m, const float* p, std::int64_t ldp, const void* bv,
          std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t diag) {
  const float* b = static_cast<const float*>(bv);
  for (std::int64_t c0 = 0; c0 < k; c0 += MR) {
    const std::int64_t mr = std::min<std::int64_t>(MR, k - c0);
    // Key c0 is seen by query rows i >= c0 − diag; earlier rows have P = 0 there.
    const std::int64_t first = std::clamp<std::int64_t>(c0 - diag, 0, m);
    with_rows(mr, [&](auto R) {
      accumulate_rows<decltype(R)::value, true>(d, m - first, p + first * ldp + c0, ldp, b + first * ldb, ldb,
                                                c + c0 * ldc, ldc);
    });
  }
}

// ---- the vector ops ---------------------------------------------------------------------

// e^x for x <= 0: 2^n · e^r, n = round(x·log2 e), |r| <= ln2/2, and a degree-6 polynomial
// (exp_poly.hpp); exp(0) is exactly 1. x < −87 (−inf and NaN included) gives exactly 0: those
// lanes may compute garbage, which the final AND with `valid` clears, so no lower clamp is
// needed. No upper clamp either: the callers' arguments are <= 0 by construction
// (exp_shifted_sum).
// Every 512-bit operation shares the FMA's two ports on Intel cores, so the exp's operation
// count is the softmax's cost. On AVX-512 one VSCALEFPS, masked to zero past −87, does the 2^n
// and the clearing; elsewhere 2^n is built from the integer that the rounding constant leaves
// in the low bits of x·log2 e + 1.5·2^23 (a shift and an add). The products are the same (a
// power of two times p, rounded only where the result is subnormal, the same way), so both
// forms give the same bits.
inline vf vexp(vf x) {
  const vf nm = x * 1.44269504088896341f + 12582912.0f;  // n in the low bits: round to nearest
  const vf n = nm - 12582912.0f;
  vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const vf p = exp_poly(r);
#if defined(__AVX512F__) && ULYSSES_SIMD_LANES == 16
  const __mmask16 valid = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
  return (vf)_mm512_maskz_scalef_ps(valid, (__m512)p, (__m512)n);
#else
  const vi valid = x >= -87.0f;
  const vu bits = ((vu)nm << 23) + (127u << 23);  // (0x4B400000 + n) << 23 is n << 23
  return (vf)((vi)(p * (vf)bits) & valid);
#endif
}

// x with its lanes rotated down by H (lane i holds x[(i + H) % W]): one shuffle instruction.
template <int H, std::size_t... I>
inline vf rotated(vf x, std::index_sequence<I...>) {
  return __builtin_shufflevector(x, x, int((I + H) % W)...);
}

// op over the lanes, as a tree in registers: lane i meets lane i + W/2, then i + W/4, … (the
// order of a scalar pairwise sum, t[i] += t[i + w] for w = W/2, …, 1). A store and scalar
// loads would cost more than a short row's vectors: the loads of the upper halves wait for
// the vector store to retire instead of being forwarded from it.
template <class Op>
inline float lane_reduce(vf x, Op op) {
  const auto lanes = std::make_index_sequence<W>{};
  if constexpr (W == 16) x = op(x, rotated<8>(x, lanes));
  x = op(x, rotated<4>(x, lanes));
  x = op(x, rotated<2>(x, lanes));
  x = op(x, rotated<1>(x, lanes));
  return x[0];
}

float lane_sum(vf x) {
  return lane_reduce(x, [](vf a, vf b) { return a + b; });
}

// exp(min(scale·x, shift) − shift): the product is rounded to float exactly as row_max
// rounds it (the min keeps the compiler from fusing it into the subtraction), so the argument
// is <= 0 for every x and exactly 0 where scale·x is the row max, at any magnitude.
inline vf shifted(vf x, float scale, float shift) { return vmin(x * scale, splat(shift)) - shift; }

float exp_shifted_sum(const float* x, float* out, std::int64_t n, float scale, float shift) {
  vf acc = {};
  std::int64_t i = 0;
  for (; i + W <= n; i += W) {
    const vf e = vexp(shifted(load(x + i), scale, shift));
    store(out + i, e);
    acc += e;
  }
  float sum = lane_sum(acc);
  if (i < n) {  // the tail through a padded vector; only its first n − i lanes count
    float t[W] = {};
    std::copy(x + i, x + n, t);
    store(t, vexp(shifted(load(t), scale, shift)));
    for (std::int64_t j = 0; j < n - i; ++j) sum += out[i + j] = t[j];
  }
  return sum;
}

// The largest (or, with Max false, smallest) of x[0, n); NaN is passed over (vmax and vmin
// keep their first operand, as the scalar tail does). Four independent accumulators, so the
// loop runs at the loads' rate rather than at vmax's latency.
template <bool Max>
float extreme(const float* x, std::int64_t n) {
  const auto pick = [](vf a, vf b) { return Max ? vmax(a, b) : vmin(a, b); };
  const float none = Max ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  vf m0 = splat(none), m1 = m0, m2 = m0, m3 = m0;
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    m0 = pick(m0, load(x + i));
    m1 = pick(m1, load(x + i + W));
    m2 = pick(m2, load(x + i + 2 * W));
    m3 = pick(m3, load(x + i + 3 * W));
  }
  for (; i + W <= n; i += W) m0 = pick(m0, load(x + i));
  float e = lane_reduce(pick(pick(m0, m1), pick(m2, m3)), pick);
  for (; i < n; ++i) e = (Max ? x[i] > e : x[i] < e) ? x[i] : e;
  return e;
}

// max(init, scale·x[0, n)): the rounded products keep the order of the raw scores (reversed
// for a negative scale), so scaling the row's largest (smallest) score once gives the max of
// the scaled row, to the bit, with no multiply per element.
float row_max(const float* x, std::int64_t n, float init, float scale) {
  const float scaled = (scale >= 0.0f ? extreme<true>(x, n) : extreme<false>(x, n)) * scale;
  return scaled > init ? scaled : init;
}

// dp = (scale·p)·(dp − delta), the products in the scalar loop's order (the same bits).
void softmax_grad(const float* p, float* dp, std::int64_t n, float scale, float delta) {
  std::int64_t i = 0;
  for (; i + W <= n; i += W) store(dp + i, scale * load(p + i) * (load(dp + i) - delta));
  for (; i < n; ++i) dp[i] = scale * p[i] * (dp[i] - delta);
}

}  // namespace

extern const GemmEngine ULYSSES_SIMD_ENGINE;
const GemmEngine ULYSSES_SIMD_ENGINE = {
    ULYSSES_SIMD_NAME "-f32", DType::f32, packed_bytes, packed_offset, pack_bt, pack_b, scores, pv, pt_b};
extern const VectorOps ULYSSES_SIMD_VEC;
const VectorOps ULYSSES_SIMD_VEC = {exp_shifted_sum, row_max, softmax_grad};

}  // namespace ulysses::kernels::ULYSSES_KERNEL_NS
