// The bfloat16 engine for AVX512_BF16 without AMX (Zen 4 / Zen 5, Cooper Lake): the
// "avx512bf16-bf16" GemmEngine of engine.hpp, built on VDPBF16PS.
//
// One VDPBF16PS (_mm512_dpbf16_ps(acc, a, b)) does, for each of 16 float32 lanes,
// acc += a.lo·b.lo + a.hi·b.hi over the two bf16 halves of the lane's 32-bit word. So the
// inner dimension is walked in PAIRS: a step multiplies the pair (A[r][2t], A[r][2t + 1]) of
// each row by 16 columns of pairs (B[2t][c], B[2t + 1][c]) (the VNNI layout).
//
// Micro-kernel (as simd_engine.hpp, on pairs): a register block of MR = 6 rows × NV = 4
// vectors of 16 columns of C (24 zmm accumulators); per pair step it loads NV vectors of B,
// broadcasts one 32-bit pair of A per row (vpbroadcastd) and issues 6·NV VDPBF16PS. Blocks at
// the edges have fewer rows (1..6) and vectors (1..4), each shape fully unrolled.
//
// Packed images (pack_bt, pack_b). D = d rounded up to 16 (bf16 per key); both images are
// round_up(n, 64) · D bf16, key j0 (a multiple of 64) at byte j0 · D · 2 in either:
//   pack_bt (Kᵀ, the B of scores; inner dimension d): panels of NR = 64 keys, each
//     [D/2 pairs of d][64 keys] of 32-bit words; word (t, j) of the panel of key j0 is
//     (K[j0 + j][2t], K[j0 + j][2t + 1]) (lo, hi), zero past d or past n. (A 32-bit transpose
//     of K's rows: the pair is already a word of K's row.)
//   pack_b (V, the B of pv; inner dimension keys): [key pairs][D columns] of words; word
//     (q, c) is (V[2q][c], V[2q + 1][c]), zero past d or past n.
// The A operands: scores reads Q's rows in place (a pair is a word of the row; odd d goes
// through a zero-padded copy); pv rounds P (float32) to bf16 rows in scratch (row-major bf16
// rows are already pairs); pt_b rounds P into Pᵀ pairs [m/2][k] of words (P[2t][j],
// P[2t + 1][j]) and packs its B (the caller's bf16 rows [m][d]) into [m/2][D] words, both in
// per-thread scratch per call. Rounding is to nearest even, NaN stays a NaN (as
// ulysses::float_to_bf16).
//
// Hardware VDPBF16PS treats bf16 denormal inputs as zero and flushes denormal results to
// zero whatever MXCSR says; the emulation below does not (it differs only there).
//
// This file is compiled twice: natively for the library with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mfma -mavx512bf16, and in the tests with
// -DULYSSES_KERNEL_NS=emulated -DULYSSES_BF16_EMULATION and no ISA flags. So all vector code
// is GCC vector extensions, except the one instruction without a vector-extension form
// (dpbf16 below). Everything stays in an anonymous namespace, with no std:: algorithms, so
// the native object defines no weak symbols (tests/isa_symbols_test.sh).
#if defined(ULYSSES_BF16_EMULATION)
// vdpbf16ps in plain vector code
#elif defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#else
#error "engine_bf16_avx512.cpp needs -mavx512f -mavx512bf16 (or -DULYSSES_BF16_EMULATION)"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "bf16_lanes.hpp"
#include "engines.hpp"

namespace ulysses::kernels::ULYSSES_KERNEL_NS {

namespace {

constexpr int W = 16, NV = 4, MR = 6, NR = NV * W;
static_assert(kKeyAlign % NR == 0, "score panels of NR keys must tile the key blocks");

typedef float vf __attribute__((vector_size(64)));
using vu = v16u;
typedef bf16 vh __attribute__((vector_size(32)));

inline i64 imin(i64 a, i64 b) { return a < b ? a : b; }
inline i64 iclamp(i64 x, i64 lo, i64 hi) { return x < lo ? lo : x > hi ? hi : x; }
inline i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }
inline i64 padded_d(i64 d) { return round_up(d, W); }

inline vf loadf(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void storef(float* p, vf x) { std::memcpy(p, &x, sizeof x); }

template <std::size_t... I>
inline vu splat_lanes(u32 x, std::index_sequence<I...>) {
  return vu{((void)I, x)...};
}
inline vu splat(u32 x) { return splat_lanes(x, std::make_index_sequence<W>{}); }

// One bf16 pair (p[0], p[1]) in every lane: vpbroadcastd from memory.
inline vu broadcast_pair(const bf16* p) {
  u32 w;
  std::memcpy(&w, p, 4);
  return splat(w);
}

// acc + a.lo·b.lo + a.hi·b.hi per 32-bit lane: VDPBF16PS.
inline vf dpbf16(vf acc, vu a, vu b) {
#ifdef ULYSSES_BF16_EMULATION
  // bf16 → float32 is a shift into the top half; the products of two bf16 are exact in
  // float32. The order of the two additions is the SDM's (odd/high pair first).
  const vf a_lo = (vf)(a << 16), a_hi = (vf)(a & 0xffff0000u);
  const vf b_lo = (vf)(b << 16), b_hi = (vf)(b & 0xffff0000u);
  return (acc + a_hi * b_hi) + a_lo * b_lo;
#else
  return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
#endif
}

// ---- bf16 rounding ------------------------------------------------------------------

// round_to_bf16_high (bf16_lanes.hpp) for one float (ulysses::float_to_bf16, kept local: no
// weak symbol here).
inline bf16 round_to_bf16(float f) {
  u32 u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16(u >> 16);
}

// ---- the micro-kernel -------------------------------------------------------------------

// acc[r][v] += Σ_t A(r, t) · B(t, v): A(r, t) is the bf16 pair at a + r·a_rs + t·a_ts
// (strides in bf16 elements), B(t, v) the 16 words at b + t·ldb + v·W.
// pairs >= 1, so the loop is a do-while (a loop that may run zero times leaves two versions of
// the accumulators to merge after it, which the compiler does through the stack).
template <int R, int NB>
[[gnu::always_inline]] inline void dp_block(i64 pairs, const bf16* a, i64 a_rs, i64 a_ts, const u32* b, i64 ldb,
                                            vf (&acc)[R][NB]) {
  i64 t = 0;
  do {
    vu bv[NB];
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) bv[v] = load16(b + t * ldb + v * W);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const vu x = broadcast_pair(a + r * a_rs + t * a_ts);
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) acc[r][v] = dpbf16(acc[r][v], x, bv[v]);
    }
  } while (++t < pairs);
}

// f(R, NB) with R ∈ [1, MR] rows and NB ∈ [1, NV] vectors as compile-time constants.
template <class F>
inline void with_vectors(i64 nb, F&& f) {
  switch (nb) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

template <class F>
inline void with_shape(i64 mr, i64 nb, F&& f) {
  auto rows = [&](auto R) { with_vectors(nb, [&](auto NB) { f(R, NB); }); };
  switch (mr) {
    case 6: return rows(std::integral_constant<int, 6>{});
    case 5: return rows(std::integral_constant<int, 5>{});
    case 4: return rows(std::integral_constant<int, 4>{});
    case 3: return rows(std::integral_constant<int, 3>{});
    case 2: return rows(std::integral_constant<int, 2>{});
    default: return rows(std::integral_constant<int, 1>{});
  }
}

// Every loop over the accumulators is unrolled, and the partial-width case is a separate path
// through a float buffer: an index the compiler cannot resolve would keep the whole block in
// memory (spilled after the dot products, reloaded to store).
template <int R, int NB>
[[gnu::always_inline]] inline void load_block(const float* c, i64 ldc, vf (&acc)[R][NB]) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) acc[r][v] = loadf(c + r * ldc + v * W);
}
template <int R, int NB>
[[gnu::always_inline]] inline void store_block(float* c, i64 ldc, const vf (&acc)[R][NB]) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) storef(c + r * ldc + v * W, acc[r][v]);
}

// c[R rows, cols] += A · B over `pairs` pairs (cols in ((NB − 1)·W, NB·W]; columns past
// cols are computed and dropped).
template <int R, int NB>
void accumulate_block(i64 pairs, const bf16* a, i64 a_rs, i64 a_ts, const u32* b, i64 ldb, float* c, i64 ldc,
                      i64 cols) {
  if (pairs <= 0) return;
  vf acc[R][NB];
  if (cols == NB * W) {
    load_block(c, ldc, acc);
    dp_block<R, NB>(pairs, a, a_rs, a_ts, b, ldb, acc);
    return store_block(c, ldc, acc);
  }
  float tmp[R * NB * W] = {};
  for (int r = 0; r < R; ++r) std::copy_n(c + r * ldc, cols, tmp + r * NB * W);
  load_block(tmp, NB * W, acc);
  dp_block<R, NB>(pairs, a, a_rs, a_ts, b, ldb, acc);
  store_block(tmp, NB * W, acc);
  for (int r = 0; r < R; ++r) std::copy_n(tmp + r * NB * W, cols, c + r * ldc);
}

// s[R rows, cols] = A · B over pairs >= 1 (half a head dimension, rounded up).
template <int R, int NB>
void scores_block(i64 pairs, const bf16* a, i64 lda, const u32* panel, float* s, i64 lds, i64 cols) {
  vf acc[R][NB];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) acc[r][v] = vf{};
  dp_block<R, NB>(pairs, a, lda, 2, panel, NR, acc);
  if (cols == NB * W) return store_block(s, lds, acc);
  float tmp[R * NB * W];
  store_block(tmp, NB * W, acc);
  for (int r = 0; r < R; ++r) std::copy_n(tmp + r * NB * W, cols, s + r * lds);
}

// ---- scratch (Scratch: bf16_lanes.hpp) ---------------------------------------------------

thread_local Scratch a_scratch;  // the A operand of the current call (Q, P or Pᵀ as bf16)
thread_local Scratch b_scratch;  // pt_b's B in pairs

// ---- pair packing -------------------------------------------------------------------

// out[c] = (lo[c], hi[c]) for c < cols, zero for c in [cols, width); a null row is zero.
void pair_rows(const bf16* lo, const bf16* hi, i64 cols, i64 width, u32* out) {
  i64 c = 0;
  if (lo && hi) {
    for (; c + W <= cols; c += W) {
      vh x, y;
      std::memcpy(&x, lo + c, sizeof x);
      std::memcpy(&y, hi + c, sizeof y);
      store16(out + c, __builtin_convertvector(x, vu) | (__builtin_convertvector(y, vu) << 16));
    }
  }
  if (lo || hi)
    for (; c < cols; ++c) out[c] = (lo ? u32(lo[c]) : 0u) | (hi ? u32(hi[c]) << 16 : 0u);
  for (; c < width; ++c) out[c] = 0;
}

// out[j] = (bf16(lo[j]), bf16(hi[j])) for j < cols; a null hi row is zero.
void pair_rows_rounded(const float* lo, const float* hi, i64 cols, u32* out) {
  i64 j = 0;
  if (hi) {
    for (; j + W <= cols; j += W)
      store16(out + j, (round_to_bf16_high(load16(lo + j)) >> 16) | (round_to_bf16_high(load16(hi + j)) & 0xffff0000u));
    for (; j < cols; ++j) out[j] = u32(round_to_bf16(lo[j])) | u32(round_to_bf16(hi[j])) << 16;
  } else {
    for (; j + W <= cols; j += W) store16(out + j, round_to_bf16_high(load16(lo + j)) >> 16);
    for (; j < cols; ++j) out[j] = round_to_bf16(lo[j]);
  }
}

// out[0, cols) = bf16(src[0, cols)), zero in [cols, width).
void round_row(const float* src, i64 cols, i64 width, bf16* out) {
  i64 j = 0;
  for (; j + W <= cols; j += W) {
    const vh h = __builtin_convertvector(round_to_bf16_high(load16(src + j)) >> 16, vh);
    std::memcpy(out + j, &h, sizeof h);
  }
  for (; j < cols; ++j) out[j] = round_to_bf16(src[j]);
  for (; j < width; ++j) out[j] = 0;
}

// ---- pack_bt / pack_b / sizes -----------------------------------------------------------

i64 packed_bytes(i64 n, i64 d) { return round_up(n, kKeyAlign) * padded_d(d) * 2; }
i64 packed_offset(i64 j0, i64 d) { return j0 * padded_d(d) * 2; }

// Kᵀ for scores: panels [D/2][NR] of words (K[j][2t], K[j][2t + 1]).
void pack_bt(const void* rows, i64 ld, i64 n, i64 d, void* packed) {
  const auto* k = static_cast<const bf16*>(rows);
  auto* out = static_cast<u32*>(packed);
  const i64 half = padded_d(d) / 2, panels = round_up(n, kKeyAlign) / NR;
  for (i64 p = 0; p < panels; ++p) {
    u32* panel = out + p * NR * half;
    for (i64 jj = 0; jj < NR; ++jj) {
      const i64 key = p * NR + jj;
      if (key >= n) {
        for (i64 t = 0; t < half; ++t) panel[t * NR + jj] = 0;
        continue;
      }
      const bf16* row = k + key * ld;
      i64 t = 0;
      for (; 2 * t + 1 < d; ++t) {
        u32 w;
        std::memcpy(&w, row + 2 * t, 4);
        panel[t * NR + jj] = w;
      }
      if (2 * t < d) {  // odd d: (K[j][d − 1], 0)
        panel[t * NR + jj] = row[2 * t];
        ++t;
      }
      for (; t < half; ++t) panel[t * NR + jj] = 0;
    }
  }
}

// V for pv: [key pairs][D] of words (V[2q][c], V[2q + 1][c]).
void pack_b(const void* rows, i64 ld, i64 n, i64 d, void* packed) {
  const auto* v = static_cast<const bf16*>(rows);
  auto* out = static_cast<u32*>(packed);
  const i64 dp = padded_d(d), pairs = round_up(n, kKeyAlign) / 2;
  for (i64 q = 0; q < pairs; ++q)
    pair_rows(2 * q < n ? v + 2 * q * ld : nullptr, 2 * q + 1 < n ? v + (2 * q + 1) * ld : nullptr, d, dp,
              out + q * dp);
}

// ---- the ops ----------------------------------------------------------------------------

void scores(i64 m, i64 n, i64 d, const void* av, i64 lda, const void* bt, float* s, i64 lds, i64 diag) {
  if (m <= 0 || n <= 0) return;
  if (d <= 0) {  // an empty inner dimension: every score is 0
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) s[i * lds + j] = 0.0f;
    return;
  }
  const bf16* a = static_cast<const bf16*>(av);
  if (d % 2) {  // the last pair would read past the row: a zero-padded copy [m][d + 1]
    bf16* copy = a_scratch.get<bf16>(m * (d + 1));
    for (i64 i = 0; i < m; ++i) {
      std::memcpy(copy + i * (d + 1), a + i * lda, std::size_t(d) * 2);
      copy[i * (d + 1) + d] = 0;
    }
    a = copy;
    lda = d + 1;
  }
  const u32* panels = static_cast<const u32*>(bt);
  const i64 pairs = (d + 1) / 2, half = padded_d(d) / 2;
  // Panel by panel, every row block against it: a panel ([pairs][NR] words, 8 KiB at d = 64)
  // stays in L1 while the row blocks pass, where a row block against every panel of a 256-key
  // block would stream all of them from L2 again for each row block (the f32 engine's order).
  for (i64 j = 0; j < n; j += NR)
    for (i64 i0 = 0; i0 < m; i0 += MR) {
      const i64 mr = imin(MR, m - i0);
      const i64 seen = iclamp(diag + i0 + mr, 0, n);  // keys the block's last row sees
      if (j >= seen) continue;
      const i64 nb = (imin(NR, seen - j) + W - 1) / W, cols = imin(n - j, nb * W);
      with_shape(mr, nb, [&](auto R, auto NB) {
        scores_block<decltype(R)::value, decltype(NB)::value>(pairs, a + i0 * lda, lda, panels + j * half,
                                                              s + i0 * lds + j, lds, cols);
      });
    }
}

void pv(i64 m, i64 d, i64 k, const float* p, i64 ldp, const void* bv, float* o, i64 ldo, i64 diag) {
  if (m <= 0 || d <= 0 || k <= 0) return;
  const u32* b = static_cast<const u32*>(bv);
  const i64 dp = padded_d(d), ks = round_up(k, 2);
  bf16* pa = a_scratch.get<bf16>(MR * ks);  // one row block of P as bf16 rows [MR][ks]
  for (i64 i0 = 0; i0 < m; i0 += MR) {
    const i64 mr = imin(MR, m - i0);
    const i64 kk = iclamp(diag + i0 + mr, 0, k);  // later keys have P = 0 in every row
    if (kk == 0) continue;
    const i64 pairs = (kk + 1) / 2;
    for (i64 r = 0; r < mr; ++r) round_row(p + (i0 + r) * ldp, kk, 2 * pairs, pa + r * ks);
    for (i64 c = 0; c < dp; c += NR) {
      const i64 nb = imin(NV, (dp - c) / W), cols = imin(d - c, nb * W);
      with_shape(mr, nb, [&](auto R, auto NB) {
        accumulate_block<decltype(R)::value, decltype(NB)::value>(pairs, pa, ks, 2, b + c, dp, o + i0 * ldo + c, ldo,
                                                                  cols);
      });
    }
  }
}

void pt_b(i64 k, i64 d, i64 m, const float* p, i64 ldp, const void* bv, i64 ldb, float* c, i64 ldc, i64 diag) {
  if (m <= 0 || d <= 0 || k <= 0) return;
  // Key j is seen by query rows i >= j − diag; rows before first0 see no key of the call.
  const i64 first0 = iclamp(-diag, 0, m);
  if (first0 >= m) return;
  const i64 dp = padded_d(d), mpairs = (m + 1) / 2, t_begin = first0 / 2;
  // B in pairs over m: [m/2][D] words; Pᵀ in pairs over m: [m/2][k] words.
  const auto* b = static_cast<const bf16*>(bv);
  u32* bw = b_scratch.get<u32>(mpairs * dp);
  u32* at = a_scratch.get<u32>(mpairs * k);
  for (i64 t = t_begin; t < mpairs; ++t) {
    const bool odd_tail = 2 * t + 1 >= m;
    pair_rows(b + 2 * t * ldb, odd_tail ? nullptr : b + (2 * t + 1) * ldb, d, dp, bw + t * dp);
    pair_rows_rounded(p + 2 * t * ldp, odd_tail ? nullptr : p + (2 * t + 1) * ldp, k, at + t * k);
  }
  const bf16* at16 = reinterpret_cast<const bf16*>(at);
  for (i64 c0 = 0; c0 < k; c0 += MR) {
    const i64 mr = imin(MR, k - c0);
    // Key c0 is seen by query rows i >= c0 − diag; earlier rows have P = 0 there.
    const i64 first = iclamp(c0 - diag, 0, m);
    if (first >= m) break;  // and so for every later key
    const i64 t0 = first / 2, pairs = mpairs - t0;
    for (i64 col = 0; col < dp; col += NR) {
      const i64 nb = imin(NV, (dp - col) / W), cols = imin(d - col, nb * W);
      with_shape(mr, nb, [&](auto R, auto NB) {
        accumulate_block<decltype(R)::value, decltype(NB)::value>(pairs, at16 + 2 * (t0 * k + c0), 2, 2 * k,
                                                                  bw + t0 * dp + col, dp, c + c0 * ldc + col, ldc,
                                                                  cols);
      });
    }
  }
}

}  // namespace

extern const GemmEngine avx512_bf16;
const GemmEngine avx512_bf16 = {
    "avx512bf16-bf16", DType::bf16, packed_bytes, packed_offset, pack_bt, pack_b, scores, pv, pt_b};

}  // namespace ulysses::kernels::ULYSSES_KERNEL_NS
