// The AMX probe loop (peak_loops.hpp); compiled with -mamx-tile -mamx-bf16 -mavx512f. Tiles
// 0..3 hold a 2×2 block of 16×16 float32 C tiles, 4..5 two A tiles, 6..7 two B tiles, loaded
// once: every round is four TDPBF16PS (the blocking of the amx-bf16 engine), 16·16·32·2 FLOPs
// each. The caller holds Linux's tile permission (isa.cpp asks for it when it detects AMX).
#include <immintrin.h>

#include "amx_tiles.hpp"
#include "peak_loops.hpp"

namespace ulysses::kernels::peak_loops {

float tdpbf16_amx(std::int64_t iters) {
  // Small non-zero operands: the sums stay far from overflow and denormals for any iters.
  alignas(64) std::uint16_t ab[512];
  alignas(64) float c[4][256];
  for (std::uint16_t& x : ab) x = 0x3a80;  // 2^-10
  asm volatile("" ::: "memory");           // tileloadd is asm without a memory input: keep these stores
  _tile_loadconfig(&amx_tiles::kFullTiles);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  _tile_release();
  asm volatile("" ::: "memory");  // the tile stores are asm without a memory output
  return c[0][0] + c[1][0] + c[2][0] + c[3][0];
}

}  // namespace ulysses::kernels::peak_loops
