// The bfloat16 engine on Intel AMX tiles (the "amx-bf16" GemmEngine of engine.hpp).
//
// One TDPBF16PS multiplies a 16 × 32 bf16 tile A by a 32 × 16 bf16 tile B (stored as 16 rows
// of 16 bf16 pairs: the VNNI layout) into a 16 × 16 float32 tile C. Every call configures all
// 8 tiles as 16 rows × 64 bytes and pads its operands with zeros to whole tiles, so one
// configuration serves every shape; row and column tails are handled when C is read or
// written. Register blocking (as oneDNN's brgemm): tiles 0..3 hold a 2 × 2 block of C, 4..5
// two A tiles and 6..7 two B tiles, so each tile load feeds two multiplications.
//
// Packed images (pack_bt, pack_b): both are laid out in blocks of 32 keys of 32 · D bf16,
// D = d rounded up to 32, so key j0 (a multiple of 32) starts at byte j0 · D · 2 in either.
//   pack_bt (Kᵀ, the B of scores; inner dimension d): per 16 keys, D/32 tiles of
//     [16 pairs of d][16 keys][2]: tile c of keys [16t, 16t + 16) at byte 32·D·t + 1024·c.
//   pack_b (V, the B of pv; inner dimension keys): per 32 keys, D/16 tiles of
//     [16 key pairs][16 columns of d][2]: tile n of keys [32k, 32k + 32) at 64·D·k + 1024·n.
// Every tile is 1 KiB contiguous, so tile loads stream whole cache lines.
//
// This file is also compiled without ISA flags against a software tile model
// (tests/emulation/amx_emulation.hpp, -DULYSSES_AMX_EMULATION). The algorithm is written
// once in plain C++ / GCC vector extensions; the hot vector loops around the tiles (P rounded
// to bf16, the Pᵀ pairs, the 16 × 16 32-bit transposes) also
// have an AVX-512 version under #ifndef ULYSSES_AMX_EMULATION, next to the portable one it
// must equal (bit for bit, but for denormal P: see round_p_rows), so that the emulated
// build keeps checking the algorithm the native build runs.
#ifdef ULYSSES_AMX_EMULATION
#include "amx_emulation.hpp"
#else
// GCC 12's AVX-512 intrinsics start their masked builtins from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports at every inlined use (a false positive): silenced for the
// header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "amx_tiles.hpp"
#include "bf16_lanes.hpp"
#include "engines.hpp"
#include "ulysses/core/bf16.hpp"

namespace ulysses::kernels::ULYSSES_KERNEL_NS {

namespace {

typedef bf16 v16h __attribute__((vector_size(32)));

constexpr i64 kTile = 16;         // rows of every tile, and f32 columns of a C tile
constexpr i64 kTileBytes = 1024;  // 16 rows × 64 bytes
constexpr i64 kChunk = 32;        // bf16 of the inner dimension per A tile (16 pairs)

inline i64 ceil_div(i64 x, i64 y) { return (x + y - 1) / y; }
inline i64 round_up(i64 x, i64 y) { return ceil_div(x, y) * y; }
inline i64 padded_d(i64 d) { return round_up(d, kChunk); }

// ---- tiles ----------------------------------------------------------------------------

using amx_tiles::kFullTiles;

// The configuration is per thread and other engines may run on this thread in between
// calls, so every entry point loads it (LDTILECFG is cheap next to one call's work).
inline void configure_tiles() { _tile_loadconfig(&kFullTiles); }

// GCC's tileloadd is an asm that takes its address as a plain register operand, with no
// memory input and no clobber (and before GCC 12 tilestored had no clobber either): the
// compiler does not know that a tile load reads memory, so it may sink vector stores to a
// buffer below the tile loads of it, or hoist the stores that overwrite it above them. This
// compiler barrier (no instruction) goes wherever vector code and tiles meet in memory:
// after a scratch is written and before it is tile-loaded, after its tile loads and before
// it is overwritten, and around a tile store into a buffer that vector code then reads. The
// emulated tiles are ordinary function calls the compiler sees through: nothing to do.
inline void tile_fence() {
#ifndef ULYSSES_AMX_EMULATION
  asm volatile("" ::: "memory");
#endif
}

// The real intrinsics paste the tile number into the instruction text, so it must be a
// literal: these switches turn a constant int into one (they fold away when inlined).
[[gnu::always_inline]] inline void tile_load(int t, const void* p, i64 stride) {
  switch (t) {
    case 0: _tile_loadd(0, p, stride); break;
    case 1: _tile_loadd(1, p, stride); break;
    case 2: _tile_loadd(2, p, stride); break;
    case 3: _tile_loadd(3, p, stride); break;
    case 4: _tile_loadd(4, p, stride); break;
    case 5: _tile_loadd(5, p, stride); break;
    case 6: _tile_loadd(6, p, stride); break;
    default: _tile_loadd(7, p, stride); break;
  }
}

// (C tiles only: 0..3.)
[[gnu::always_inline]] inline void tile_store(int t, void* p, i64 stride) {
  switch (t) {
    case 0: _tile_stored(0, p, stride); break;
    case 1: _tile_stored(1, p, stride); break;
    case 2: _tile_stored(2, p, stride); break;
    default: _tile_stored(3, p, stride); break;
  }
}

[[gnu::always_inline]] inline void tile_zero(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    default: _tile_zero(3); break;
  }
}

// C(i, j) += A(i) · B(j): C(i, j) is tile 2i + j, A(i) tile 4 + i, B(j) tile 6 + j.
[[gnu::always_inline]] inline void tile_dp(int i, int j) {
  switch (2 * i + j) {
    case 0: _tile_dpbf16ps(0, 4, 6); break;
    case 1: _tile_dpbf16ps(1, 4, 7); break;
    case 2: _tile_dpbf16ps(2, 5, 6); break;
    default: _tile_dpbf16ps(3, 5, 7); break;
  }
}

inline int c_tile(int i, int j) { return 2 * i + j; }

// The tiles of one operand along a block loop: tile i (or j) of chunk c at
// p + i · next + c · step bytes, rows `stride` bytes apart.
struct TileWalk {
  const std::byte* p;
  i64 next, step, stride;
};

template <class T>
inline TileWalk walk(const T* p, i64 next, i64 step, i64 stride) {
  return {reinterpret_cast<const std::byte*>(p), next, step, stride};
}

// The block loop: C(i, j) += Σ_c A(i, c) · B(j, c) for `chunks` chunks, over an MB × NB block
// of tiles; SKIP01: C(0, 1) is wholly past a causal diagonal and not multiplied (the only
// tile of a block that can be, once blocks are clipped to the rows that see some key: see
// scores). Two running pointers and four loop invariants, so the loop holds in registers.
template <int MB, int NB, bool SKIP01 = false>
[[gnu::always_inline]] inline void accumulate(i64 chunks, TileWalk a, TileWalk b) {
  const std::byte* pa = a.p;
  const std::byte* pb = b.p;
  for (i64 c = 0; c < chunks; ++c, pa += a.step, pb += b.step) {
    tile_load(4, pa, a.stride);
    if constexpr (MB == 2) tile_load(5, pa + a.next, a.stride);
    tile_load(6, pb, b.stride);
    if constexpr (NB == 2) tile_load(7, pb + b.next, b.stride);
    tile_dp(0, 0);
    if constexpr (NB == 2 && !SKIP01) tile_dp(0, 1);
    if constexpr (MB == 2) tile_dp(1, 0);
    if constexpr (MB == 2 && NB == 2) tile_dp(1, 1);
  }
}

// Runs f(MB, NB) with the block shape as compile-time constants (edge blocks are 1 wide).
template <class F>
inline void with_block_shape(i64 mb, i64 nb, F&& f) {
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (mb == 2) {
    if (nb == 2)
      f(Two{}, Two{});
    else
      f(Two{}, One{});
  } else {
    if (nb == 2)
      f(One{}, Two{});
    else
      f(One{}, One{});
  }
}

// A 16 × 16 float32 window of a caller's matrix: rows × cols of it are inside the matrix.
struct CWindow {
  float* p;
  i64 ld, rows, cols;
  bool whole() const { return rows == kTile && cols == kTile; }
};

inline CWindow window(float* base, i64 ld, i64 row0, i64 nrows, i64 col0, i64 ncols) {
  return {base + row0 * ld + col0, ld, std::min(kTile, nrows - row0), std::min(kTile, ncols - col0)};
}

// An accumulating C tile starts from the caller's values when the window is whole (loaded in
// place) and from zero otherwise (the partial sums are added on the way out).
inline void c_begin(int t, const CWindow& w) {
  if (w.whole())
    tile_load(t, w.p, w.ld * 4);
  else
    tile_zero(t);
}

// A whole tile into a 16 × 16 buffer that vector code reads next (fenced: see tile_fence).
inline void tile_to_buffer(int t, float* buf) {
  tile_fence();  // earlier reads of buf stay above the store
  tile_store(t, buf, kTile * 4);
  tile_fence();  // later reads of buf stay below it
}

// Writes C tile t to its window: straight from the tile when the window is whole (an
// accumulating op loaded the window into the tile first), else through a buffer, adding
// (ACCUMULATE: pv, pt_b) or storing (scores; the softmax applies the scale, so there is no
// pass over the scores here) only the valid part.
template <bool ACCUMULATE>
inline void c_write(int t, const CWindow& w) {
  if (w.whole()) {
    tile_store(t, w.p, w.ld * 4);
    return;
  }
  alignas(64) float buf[kTile * kTile];
  tile_to_buffer(t, buf);
  for (i64 r = 0; r < w.rows; ++r)
    for (i64 c = 0; c < w.cols; ++c) {
      float& dst = w.p[r * w.ld + c];
      dst = ACCUMULATE ? dst + buf[r * kTile + c] : buf[r * kTile + c];
    }
}

// ---- scratch (Scratch: bf16_lanes.hpp; 64-byte aligned, so tile rows are cache lines) ----

thread_local Scratch a_scratch;  // the A operand of the current call (Q, P or Pᵀ as bf16)
thread_local Scratch b_scratch;  // pt_b's B in VNNI pairs

// ---- bf16 conversion and pair packing -----------------------------------------------

// bf16 pairs (lo, hi) of two float32 rows, 16 lanes: the VNNI word of rows 2t and 2t + 1.
inline v16u pair_rounded(const float* lo, const float* hi) {
  return (round_to_bf16_high(load16(lo)) >> 16) | (round_to_bf16_high(load16(hi)) & 0xffff0000u);
}

// bf16 pairs (lo, hi) of two bf16 rows, 16 lanes.
inline v16u pair_bf16(const bf16* lo, const bf16* hi) {
  v16h a, b;
  std::memcpy(&a, lo, sizeof a);
  std::memcpy(&b, hi, sizeof b);
  return __builtin_convertvector(a, v16u) | (__builtin_convertvector(b, v16u) << 16);
}

// One step of the 16 × 16 transpose: swaps bit B of the row index with bit B of the column
// index, for the rows r (bit B clear) and r | B.
template <int B, bool HIGH, std::size_t... C>
inline v16u butterfly(v16u lo, v16u hi, std::index_sequence<C...>) {
  if constexpr (HIGH)
    return __builtin_shufflevector(lo, hi, ((C & B) ? 16 + C : (C | B))...);
  else
    return __builtin_shufflevector(lo, hi, ((C & B) ? 16 + (C ^ B) : C)...);
}

template <int B>
inline void transpose_step(v16u (&x)[16]) {
  constexpr auto lanes = std::make_index_sequence<16>{};
  for (int r = 0; r < 16; ++r) {
    if (r & B) continue;
    const v16u lo = x[r], hi = x[r | B];
    x[r] = butterfly<B, false>(lo, hi, lanes);
    x[r | B] = butterfly<B, true>(lo, hi, lanes);
  }
}

// x[r][c] ← x[c][r] for 32-bit lanes: 4 × 16 two-source shuffles.
inline void transpose16x16(v16u (&x)[16]) {
#ifndef ULYSSES_AMX_EMULATION
  // The same transpose as the portable butterflies below, in the four shuffles that need no
  // index vector and no copy of a destroyed source (unpack 32, unpack 64, then two rounds
  // of 128-bit lane shuffles; each one µop on port 5). Lane L of a register holds columns
  // 4L..4L + 3.
  __m512i u[16], v[16];
  for (int r = 0; r < 16; r += 2) {  // u[r]: (x[r][c], x[r + 1][c]) pairs, c = 4L, 4L + 1 (lo) or + 2, + 3 (hi)
    u[r] = _mm512_unpacklo_epi32(__m512i(x[r]), __m512i(x[r + 1]));
    u[r + 1] = _mm512_unpackhi_epi32(__m512i(x[r]), __m512i(x[r + 1]));
  }
  for (int g = 0; g < 16; g += 4) {  // v[g + c], lane L: rows g..g + 3 of column 4L + c
    v[g + 0] = _mm512_unpacklo_epi64(u[g], u[g + 2]);
    v[g + 1] = _mm512_unpackhi_epi64(u[g], u[g + 2]);
    v[g + 2] = _mm512_unpacklo_epi64(u[g + 1], u[g + 3]);
    v[g + 3] = _mm512_unpackhi_epi64(u[g + 1], u[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    // a0 = lanes (0, 1) of row groups 0, 1; a1 = lanes (2, 3) of them; b0, b1: groups 2, 3.
    const __m512i a0 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x44), a1 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xee);
    const __m512i b0 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x44),
                  b1 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xee);
    x[c] = v16u(_mm512_shuffle_i32x4(a0, b0, 0x88));       // lane 0 of the four groups: column c
    x[4 + c] = v16u(_mm512_shuffle_i32x4(a0, b0, 0xdd));   // lane 1: column 4 + c
    x[8 + c] = v16u(_mm512_shuffle_i32x4(a1, b1, 0x88));   // lane 2
    x[12 + c] = v16u(_mm512_shuffle_i32x4(a1, b1, 0xdd));  // lane 3
  }
#else
  transpose_step<1>(x);
  transpose_step<2>(x);
  transpose_step<4>(x);
  transpose_step<8>(x);
#endif
}

// One VNNI tile of bf16 rows [nrows][ncols] (row stride ld): out[t][c] = (rows[2t][c],
// rows[2t + 1][c]) for t < 16, c < 16, zero past the matrix.
inline void pack_pairs_tile(const bf16* rows, i64 ld, i64 nrows, i64 ncols, u32* out) {
  if (nrows >= 32 && ncols >= 16) {
    for (int t = 0; t < 16; ++t) store16(out + 16 * t, pair_bf16(rows + 2 * t * ld, rows + (2 * t + 1) * ld));
    return;
  }
  alignas(64) bf16 tmp[32][16] = {};
  for (i64 r = 0; r < std::min<i64>(nrows, 32); ++r)
    std::memcpy(tmp[r], rows + r * ld, std::size_t(std::clamp<i64>(ncols, 0, 16)) * 2);
  for (int t = 0; t < 16; ++t) store16(out + 16 * t, pair_bf16(tmp[2 * t], tmp[2 * t + 1]));
}

// VNNI image of bf16 rows [nrows][ncols] over the row index: per 32 rows, `col_tiles` tiles
// of 16 columns, `blocks` blocks of 32 rows (zero past nrows); pack_b's layout, and pt_b's B.
void pack_pairs(const bf16* rows, i64 ld, i64 nrows, i64 ncols, i64 blocks, i64 col_tiles, u32* out) {
  for (i64 k = 0; k < blocks; ++k)
    for (i64 n = 0; n < col_tiles; ++n)
      pack_pairs_tile(rows + 32 * k * ld + 16 * n, ld, nrows - 32 * k, ncols - 16 * n, out + (k * col_tiles + n) * 256);
}

// ---- pack_bt / pack_b / sizes -----------------------------------------------------------

// The images are made of 32-key blocks; the caller pads and offsets in kKeyAlign keys.
static_assert(kKeyAlign % 32 == 0, "packed images are made of blocks of 32 keys");

i64 packed_bytes(i64 n, i64 d) { return round_up(n, kKeyAlign) * padded_d(d) * 2; }
i64 packed_offset(i64 j0, i64 d) { return j0 * padded_d(d) * 2; }

// Kᵀ for scores. Seen as 32-bit words, K's row j holds the pairs (K[j][2p], K[j][2p + 1]):
// a B tile is the 16 × 16 transpose of 16 keys' words p ∈ [16c, 16c + 16).
void pack_bt(const void* rows, i64 ld, i64 n, i64 d, void* packed) {
  const auto* k = static_cast<const bf16*>(rows);
  auto* out = static_cast<u32*>(packed);
  const i64 chunks = padded_d(d) / kChunk, key_tiles = round_up(n, kKeyAlign) / kTile;
  for (i64 t = 0; t < key_tiles; ++t) {
    for (i64 c = 0; c < chunks; ++c) {
      const bf16* src = k + kTile * t * ld + kChunk * c;
      const i64 keys = n - kTile * t, dims = d - kChunk * c;
      v16u x[16];
      if (keys >= kTile && dims >= kChunk) {
        for (int r = 0; r < 16; ++r) x[r] = load16(src + r * ld);
      } else {  // a tail: read through a zero-padded copy
        alignas(64) bf16 tmp[16][32] = {};
        for (i64 r = 0; r < std::min<i64>(keys, 16); ++r)
          std::memcpy(tmp[r], src + r * ld, std::size_t(std::min<i64>(dims, 32)) * 2);
        for (int r = 0; r < 16; ++r) x[r] = load16(tmp[r]);
      }
      transpose16x16(x);
      u32* tile = out + (t * chunks + c) * 256;
      for (int r = 0; r < 16; ++r) store16(tile + 16 * r, x[r]);
    }
  }
}

// V for pv: VNNI pairs of consecutive keys, D/16 column tiles per 32 keys.
void pack_b(const void* rows, i64 ld, i64 n, i64 d, void* packed) {
  pack_pairs(static_cast<const bf16*>(rows), ld, n, d, round_up(n, kKeyAlign) / 32, padded_d(d) / kTile,
             static_cast<u32*>(packed));
}

// ---- scores -----------------------------------------------------------------------------

struct Rows {
  const bf16* base;
  i64 ld;  // elements
};

// Q as A tiles: in place when whole tiles fit the caller's rows, else a zero-padded copy
// [16·⌈m/16⌉][D].
Rows scores_a(const bf16* a, i64 lda, i64 m, i64 d) {
  if (m % kTile == 0 && d % kChunk == 0) return {a, lda};
  const i64 rows = round_up(m, kTile), dp = padded_d(d);
  bf16* copy = a_scratch.get<bf16>(rows * dp);
  for (i64 i = 0; i < rows; ++i) {
    bf16* row = copy + i * dp;
    const i64 valid = i < m ? d : 0;
    if (valid) std::memcpy(row, a + i * lda, std::size_t(valid) * 2);
    std::memset(row + valid, 0, std::size_t(dp - valid) * 2);
  }
  return {copy, dp};
}

// Row tile r (rows [16r, 16r + 16)) sees some key of key tile t when 16t <= diag + 16r + 15.
inline bool tile_visible(i64 r, i64 t, i64 diag) { return kTile * t <= diag + kTile * r + kTile - 1; }

void scores(i64 m, i64 n, i64 d, const void* a, i64 lda, const void* bt, float* s, i64 lds, i64 diag) {
  if (m <= 0 || n <= 0) return;
  if (d <= 0) {  // an empty inner dimension: every score is 0
    for (i64 i = 0; i < m; ++i) std::fill(s + i * lds, s + i * lds + n, 0.0f);
    return;
  }
  configure_tiles();
  const Rows q = scores_a(static_cast<const bf16*>(a), lda, m, d);
  tile_fence();  // a copy of Q in a_scratch is tile-loaded below
  const auto* b_base = static_cast<const std::byte*>(bt);
  const i64 dp = padded_d(d), chunks = dp / kChunk, row_tiles = ceil_div(m, kTile), key_tiles = ceil_div(n, kTile);
  for (i64 r0 = 0; r0 < row_tiles; r0 += 2) {
    const i64 mb = std::min<i64>(2, row_tiles - r0);
    for (i64 t0 = 0; t0 < key_tiles; t0 += 2) {
      // Visibility grows with the row and shrinks with the key, so (last row, first key
      // tile) is the block's most visible tile and (first row, last key tile) its least.
      if (!tile_visible(r0 + mb - 1, t0, diag)) break;  // this block and every later one are past the diagonal
      i64 ra = r0, ma = mb;                             // the rows of the block that see some of its keys
      if (ma == 2 && !tile_visible(r0, t0, diag)) ra = r0 + 1, ma = 1;
      i64 nb = std::min<i64>(2, key_tiles - t0);
      if (nb == 2 && !tile_visible(ra + ma - 1, t0 + 1, diag)) nb = 1;  // the second key tile is past it for both rows
      // What is left dead is at most C(0, 1): not multiplied, not stored.
      const bool skip01 = ma == 2 && nb == 2 && !tile_visible(ra, t0 + 1, diag);
      const TileWalk at = walk(q.base + ra * kTile * q.ld, kTile * q.ld * 2, kChunk * 2, q.ld * 2);
      const TileWalk bt_walk = walk(b_base + t0 * 32 * dp, 32 * dp, kTileBytes, 64);
      with_block_shape(ma, nb, [&](auto MB, auto NB) {
        auto finish = [&](auto SKIP01) {
          for (int i = 0; i < MB; ++i)
            for (int j = 0; j < NB; ++j)
              if (!(SKIP01 && i == 0 && j == 1)) tile_zero(c_tile(i, j));
          accumulate<MB, NB, SKIP01>(chunks, at, bt_walk);
          for (int i = 0; i < MB; ++i)
            for (int j = 0; j < NB; ++j)
              if (!(SKIP01 && i == 0 && j == 1))
                c_write<false>(c_tile(i, j), window(s, lds, (ra + i) * kTile, m, (t0 + j) * kTile, n));
        };
        if constexpr (MB == 2 && NB == 2) {
          if (skip01)
            finish(std::true_type{});
          else
            finish(std::false_type{});
        } else {
          finish(std::false_type{});
        }
      });
    }
  }
}

// ---- pv ---------------------------------------------------------------------------------

// Rows [i0, i0 + rows) of P, keys [0, keys), rounded to bf16 as A tiles [rows][ld] (rows past
// m and keys past k are zero).
//
// Native: VCVTNE2PS2BF16 rounds exactly as float_to_bf16 (nearest even, NaN quieted by
// setting bit 6 of the bf16) except that it reads float32 denormals as zero, where
// float_to_bf16 makes a bf16 denormal (or zero) of them. TDPBF16PS reads bf16 denormals as
// zero, so the tile products, and every result of this engine, are the same either way.
void round_p_rows(const float* p, i64 ldp, i64 m, i64 k, i64 i0, i64 rows, i64 keys, bf16* out, i64 ld) {
  for (i64 r = 0; r < rows; ++r) {
    bf16* dst = out + r * ld;
    const i64 i = i0 + r, valid = i < m ? std::min(k, keys) : 0;
    const float* src = p + i * ldp;
    i64 j = 0;
#ifndef ULYSSES_AMX_EMULATION
    for (; j + 32 <= valid; j += 32)  // second source → the low 16 bf16
      _mm512_storeu_si512(dst + j,
                          __m512i(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j))));
    for (; j + 16 <= valid; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), __m256i(_mm512_cvtneps_pbh(_mm512_loadu_ps(src + j))));
#else
    for (; j + 16 <= valid; j += 16) {
      const v16h h = __builtin_convertvector(round_to_bf16_high(load16(src + j)) >> 16, v16h);
      std::memcpy(dst + j, &h, sizeof h);
    }
#endif
    for (; j < valid; ++j) dst[j] = float_to_bf16(src[j]);
    std::fill(dst + j, dst + keys, bf16(0));
  }
}

void pv(i64 m, i64 d, i64 k, const float* p, i64 ldp, const void* b, float* o, i64 ldo, i64 diag) {
  if (m <= 0 || d <= 0 || k <= 0) return;
  configure_tiles();
  const auto* b_base = static_cast<const std::byte*>(b);
  const i64 dp = padded_d(d), chunks = ceil_div(k, kChunk), kp = chunks * kChunk;
  const i64 row_tiles = ceil_div(m, kTile), col_tiles = ceil_div(d, kTile);
  bf16* pb = a_scratch.get<bf16>(2 * kTile * kp);
  for (i64 r0 = 0; r0 < row_tiles; r0 += 2) {
    const i64 mb = std::min<i64>(2, row_tiles - r0);
    // Keys past the block's last row's diagonal have P = 0 in every row: not multiplied.
    const i64 last_row = std::min(m, (r0 + mb) * kTile) - 1;
    if (diag + last_row < 0) continue;
    const i64 live_chunks = std::min(chunks, (diag + last_row) / kChunk + 1);
    tile_fence();  // the tile loads of the previous block's pb stay above its overwriting
    round_p_rows(p, ldp, m, k, r0 * kTile, mb * kTile, live_chunks * kChunk, pb, kp);
    tile_fence();  // and these stores above the tile loads of it
    const TileWalk at = walk(pb, kTile * kp * 2, kChunk * 2, kp * 2);
    for (i64 n0 = 0; n0 < col_tiles; n0 += 2) {
      const i64 nb = std::min<i64>(2, col_tiles - n0);
      const TileWalk bw = walk(b_base + n0 * kTileBytes, kTileBytes, 64 * dp, 64);
      with_block_shape(mb, nb, [&](auto MB, auto NB) {
        auto win = [&](int i, int j) { return window(o, ldo, (r0 + i) * kTile, m, (n0 + j) * kTile, d); };
        for (int i = 0; i < MB; ++i)
          for (int j = 0; j < NB; ++j) c_begin(c_tile(i, j), win(i, j));
        accumulate<MB, NB>(live_chunks, at, bw);
        for (int i = 0; i < MB; ++i)
          for (int j = 0; j < NB; ++j) c_write<true>(c_tile(i, j), win(i, j));
      });
    }
  }
}

// ---- pt_b -------------------------------------------------------------------------------

// Pᵀ as the two A tiles of keys [j0, j0 + 32) and rows [i0, i0 + 32) of P: tile h row jj
// holds the bf16 pairs (P[i0 + 2t][j0 + 16h + jj], P[i0 + 2t + 1][…]), t < 16: the pairs of
// two P rows are the VNNI words, then a 32-bit transpose puts keys on the rows.
void pack_pt_tiles(const float* p, i64 ldp, i64 m, i64 k, i64 i0, i64 j0, u32* out) {
  const float* src = p + i0 * ldp + j0;
  i64 ld = ldp;
  alignas(64) float tmp[32][32];
  if (i0 + 32 > m || j0 + 32 > k) {  // a tail: read through a zero-padded copy
    const i64 rows = std::min<i64>(32, m - i0), cols = std::min<i64>(32, k - j0);
    for (i64 r = 0; r < 32; ++r) {
      const i64 valid = r < rows ? cols : 0;
      if (valid) std::memcpy(tmp[r], src + r * ldp, std::size_t(valid) * 4);
      std::fill(tmp[r] + valid, tmp[r] + 32, 0.0f);
    }
    src = &tmp[0][0];
    ld = 32;
  }
#ifndef ULYSSES_AMX_EMULATION
  // pair_rounded: both rows rounded by one VCVTNE2PS2BF16 (row 2t in the low half, row
  // 2t + 1 in the high half; denormals as in round_p_rows), then one VPERMW interleaves the
  // halves into the (row 2t, row 2t + 1) pairs of each column.
  typedef short v32s __attribute__((vector_size(64)));
  constexpr v32s kInterleave = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = __m512i(kInterleave);
  const i64 row_bytes = ld * 4, three_rows = 3 * row_bytes;
  auto pair = [&](const char* lo, const char* hi) {
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
    return v16u(_mm512_permutexvar_epi16(interleave, __m512i(both)));
  };
#endif
  for (int h = 0; h < 2; ++h) {
    v16u x[16];
#ifndef ULYSSES_AMX_EMULATION
    const char* rows = reinterpret_cast<const char*>(src + 16 * h);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {  // rows 4g..4g + 3 at rows + {0, 1, 2, 3} · row_bytes
      x[2 * g] = pair(rows, rows + row_bytes);
      x[2 * g + 1] = pair(rows + 2 * row_bytes, rows + three_rows);
      rows += 4 * row_bytes;
      // Opaque to the optimizer: one running pointer and two strides in the addressing
      // modes, rather than 32 row pointers precomputed into (and spilled from) registers.
      asm("" : "+r"(rows));
    }
#else
    for (int t = 0; t < 16; ++t) x[t] = pair_rounded(src + 2 * t * ld + 16 * h, src + (2 * t + 1) * ld + 16 * h);
#endif
    transpose16x16(x);
    for (int jj = 0; jj < 16; ++jj) store16(out + h * 256 + 16 * jj, x[jj]);
  }
}

void pt_b(i64 k, i64 d, i64 m, const float* p, i64 ldp, const void* b, i64 ldb, float* c, i64 ldc, i64 diag) {
  if (m <= 0 || d <= 0 || k <= 0) return;
  configure_tiles();
  const i64 row_chunks = ceil_div(m, kChunk), key_tiles = ceil_div(k, kTile), col_tiles = ceil_div(d, kTile);
  // B in VNNI pairs over m: tile (chunk q, columns n) at (q · col_tiles + n) · 256 words.
  u32* bv = b_scratch.get<u32>(row_chunks * col_tiles * 256);
  pack_pairs(static_cast<const bf16*>(b), ldb, m, d, row_chunks, col_tiles, bv);
  // Pᵀ of one block of 32 keys: tile (chunk q, key tile h) at (2q + h) · 256 words.
  u32* at = a_scratch.get<u32>(row_chunks * 2 * 256);
  for (i64 t0 = 0; t0 < key_tiles; t0 += 2) {
    const i64 mb = std::min<i64>(2, key_tiles - t0), j0 = t0 * kTile;
    // Rows before j0 − diag see none of these keys (their P is 0): their chunks are skipped.
    const i64 first_row = std::max<i64>(0, j0 - diag);
    if (first_row >= m) break;
    const i64 q0 = first_row / kChunk;
    tile_fence();  // bv's stores, and the tile loads of the previous block's Pᵀ, stay above
    for (i64 q = q0; q < row_chunks; ++q) pack_pt_tiles(p, ldp, m, k, q * kChunk, j0, at + 2 * q * 256);
    tile_fence();  // and these stores above the tile loads of them
    const TileWalk aw = walk(at + 2 * q0 * 256, kTileBytes, 2 * kTileBytes, 64);
    for (i64 n0 = 0; n0 < col_tiles; n0 += 2) {
      const i64 nb = std::min<i64>(2, col_tiles - n0);
      const TileWalk bw = walk(bv + (q0 * col_tiles + n0) * 256, kTileBytes, col_tiles * kTileBytes, 64);
      with_block_shape(mb, nb, [&](auto MB, auto NB) {
        auto win = [&](int i, int j) { return window(c, ldc, (t0 + i) * kTile, k, (n0 + j) * kTile, d); };
        for (int i = 0; i < MB; ++i)
          for (int j = 0; j < NB; ++j) c_begin(c_tile(i, j), win(i, j));
        accumulate<MB, NB>(row_chunks - q0, aw, bw);
        for (int i = 0; i < MB; ++i)
          for (int j = 0; j < NB; ++j) c_write<true>(c_tile(i, j), win(i, j));
      });
    }
  }
}

}  // namespace

extern const GemmEngine amx_bf16;
const GemmEngine amx_bf16 = {"amx-bf16", DType::bf16, packed_bytes, packed_offset, pack_bt, pack_b, scores, pv, pt_b};

}  // namespace ulysses::kernels::ULYSSES_KERNEL_NS
