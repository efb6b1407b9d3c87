// A software model of the Intel AMX tile intrinsics the bf16 engine uses, so that
// src/kernels/engine_bf16_amx.cpp can be compiled and checked on CPUs without AMX (the tests
// build it with -DULYSSES_AMX_EMULATION -DULYSSES_KERNEL_NS=emulated and no ISA flags).
//
// The model follows the architectural semantics (Intel SDM, palette 1): 8 tiles of at most
// 16 rows × 64 bytes, shaped by the last LDTILECFG of the thread; loads and stores move
// rows × colsb bytes (a load zeroes the rest of the tile); TDPBF16PS requires the shapes to
// agree and distinct registers. Everything the hardware would fault on (#GP/#UD) or silently
// get wrong aborts here with a message instead, so a misconfigured kernel fails in the tests
// rather than on the first AMX machine it meets.
//
// Arithmetic: TDPBF16PS multiplies bf16 pairs exactly in float32 and accumulates in float32
// with round-to-nearest-even, bf16 input denormals read as zero and denormal results flushed
// to zero (the instruction ignores MXCSR). The hardware's internal order of the two additions
// per pair is not modelled exactly: results may differ from a real AMX unit in the last bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace amx_emu {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct State {
  bool configured = false;
  std::uint8_t rows[kTiles] = {};
  std::uint16_t colsb[kTiles] = {};
  alignas(64) unsigned char tile[kTiles][kMaxRows][kMaxColsb] = {};
  std::int64_t dp_count = 0;  // TDPBF16PS executed by this thread (tests check skipping)
};

inline State& state() {
  thread_local State s;
  return s;
}

[[noreturn]] inline void fail(const char* op, const char* what, int t = -1) {
  if (t >= 0)
    std::fprintf(stderr, "amx emulation: %s(tmm%d): %s\n", op, t, what);
  else
    std::fprintf(stderr, "amx emulation: %s: %s\n", op, what);
  std::abort();
}

// A tile operand must be a register of the configured palette with a non-empty shape.
inline void check_tile(const char* op, int t) {
  if (t < 0 || t >= kTiles) fail(op, "no such tile register", t);
  const State& s = state();
  if (!s.configured) fail(op, "tiles used before _tile_loadconfig (or after _tile_release)", t);
  if (s.rows[t] == 0) fail(op, "tile not configured (rows = 0)", t);
}

inline void loadconfig(const void* config) {
  if (config == nullptr) fail("_tile_loadconfig", "null config");
  unsigned char c[64];
  std::memcpy(c, config, 64);
  State& s = state();
  if (c[0] != 1) fail("_tile_loadconfig", "palette_id must be 1");
  if (c[1] != 0) fail("_tile_loadconfig", "start_row must be 0");
  for (int i = 2; i < 16; ++i)
    if (c[i] != 0) fail("_tile_loadconfig", "reserved bytes 2..15 must be zero");
  for (int t = 0; t < 16; ++t) {
    std::uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    const std::uint8_t rows = c[48 + t];
    if (t >= kTiles) {
      if (colsb != 0 || rows != 0) fail("_tile_loadconfig", "palette 1 has only 8 tiles", t);
      continue;
    }
    if (colsb > kMaxColsb || rows > kMaxRows) fail("_tile_loadconfig", "shape beyond 16 rows x 64 bytes", t);
    if ((colsb == 0) != (rows == 0)) fail("_tile_loadconfig", "one of rows/colsb is zero, not both", t);
    s.rows[t] = rows;
    s.colsb[t] = colsb;
  }
  std::memset(s.tile, 0, sizeof s.tile);  // LDTILECFG zeroes every tile
  s.configured = true;
}

inline void release() {
  State& s = state();
  s.configured = false;
  std::memset(s.rows, 0, sizeof s.rows);
  std::memset(s.colsb, 0, sizeof s.colsb);
  std::memset(s.tile, 0, sizeof s.tile);
}

inline void zero(int t) {
  check_tile("_tile_zero", t);
  std::memset(state().tile[t], 0, sizeof state().tile[t]);
}

inline void loadd(int t, const void* base, long stride) {
  check_tile("_tile_loadd", t);
  if (base == nullptr) fail("_tile_loadd", "null base", t);
  State& s = state();
  std::memset(s.tile[t], 0, sizeof s.tile[t]);  // bytes past rows × colsb read as zero
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(s.tile[t][r], static_cast<const unsigned char*>(base) + r * stride, s.colsb[t]);
}

inline void stored(int t, void* base, long stride) {
  check_tile("_tile_stored", t);
  if (base == nullptr) fail("_tile_stored", "null base", t);
  State& s = state();
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(static_cast<unsigned char*>(base) + r * stride, s.tile[t][r], s.colsb[t]);
}

// bf16 bits → float32, denormals read as zero (as the hardware does).
inline float bf16_daz(std::uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float flush_denormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

// C[M×N] f32 += A[M × 2K] bf16 · B, B given as K rows of N bf16 pairs (the VNNI layout).
inline void dpbf16ps(int c, int a, int b) {
  const char* op = "_tile_dpbf16ps";
  check_tile(op, c);
  check_tile(op, a);
  check_tile(op, b);
  if (c == a || c == b || a == b) fail(op, "the three tile operands must be distinct registers", c);
  State& s = state();
  const int m = s.rows[c], n = s.colsb[c] / 4, k = s.colsb[a] / 4;
  if (s.colsb[c] % 4 != 0 || s.colsb[a] % 4 != 0 || s.colsb[b] % 4 != 0)
    fail(op, "colsb of every operand must be a multiple of 4", c);
  if (s.rows[a] != m) fail(op, "rows of A differ from rows of C", a);
  if (s.colsb[b] != s.colsb[c]) fail(op, "colsb of B differs from colsb of C", b);
  if (s.rows[b] != k) fail(op, "rows of B differ from colsb(A)/4 (the pairs of the inner dimension)", b);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float acc;
      std::memcpy(&acc, &s.tile[c][i][4 * j], 4);
      for (int kk = 0; kk < k; ++kk) {
        std::uint16_t a2[2], b2[2];
        std::memcpy(a2, &s.tile[a][i][4 * kk], 4);
        std::memcpy(b2, &s.tile[b][kk][4 * j], 4);
        acc += bf16_daz(a2[0]) * bf16_daz(b2[0]);  // each product is exact in float32
        acc += bf16_daz(a2[1]) * bf16_daz(b2[1]);
      }
      acc = flush_denormal(acc);
      std::memcpy(&s.tile[c][i][4 * j], &acc, 4);
    }
  }
  ++s.dp_count;
}

}  // namespace amx_emu

// The intrinsics' names. The real ones take tile numbers as literal tokens; these take any int.
#define _tile_loadconfig(config) ::amx_emu::loadconfig(config)
#define _tile_release() ::amx_emu::release()
#define _tile_zero(t) ::amx_emu::zero(t)
#define _tile_loadd(t, base, stride) ::amx_emu::loadd((t), (base), (stride))
#define _tile_stored(t, base, stride) ::amx_emu::stored((t), (base), (stride))
#define _tile_dpbf16ps(c, a, b) ::amx_emu::dpbf16ps((c), (a), (b))
