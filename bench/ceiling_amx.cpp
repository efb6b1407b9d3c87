// The AMX bfloat16 ceilings (see ceiling_amx.hpp). Tiles 0..3 hold a 2×2 block of 16×16
// float32 C tiles, 4..5 two 16×32 bf16 A tiles, 6..7 two B tiles of 16 bf16 pairs × 16
// columns, so every tile load feeds two TDPBF16PS (the blocking of the amx-bf16 engine).
//
// Compiled with -mamx-tile -mamx-bf16 -mavx512f; for a check on CPUs without AMX it also
// builds against the software tile model (-DULYSSES_AMX_EMULATION -Itests/emulation).
#ifdef ULYSSES_AMX_EMULATION
#include "amx_emulation.hpp"
#else
#include <immintrin.h>
#endif
#include <sys/syscall.h>
#include <unistd.h>

#include "ceiling_amx.hpp"
#include "kernels/amx_tiles.hpp"

namespace ulysses::bench::amx {

namespace {

using i64 = std::int64_t;
using bf16 = std::uint16_t;

void configure_tiles() { _tile_loadconfig(&kernels::amx_tiles::kFullTiles); }

// The four products of the 2×2 block.
[[gnu::always_inline]] inline void multiply_block() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// One 32×32 block of c: the k loop of a[32][k] · b_packed columns [j, j + 32).
void gemm_block(i64 k, const bf16* a, i64 lda, const bf16* b0, const bf16* b1, float* c, i64 ldc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (i64 p = 0; p < k; p += 32) {
    _tile_loadd(4, a + p, lda * 2);
    _tile_loadd(5, a + 16 * lda + p, lda * 2);
    _tile_loadd(6, b0 + p * 16, 64);  // pair block p/2 of the slab: (p/2)·32 elements
    _tile_loadd(7, b1 + p * 16, 64);
    multiply_block();
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

}  // namespace

bool request_tiles() {
#ifdef ULYSSES_AMX_EMULATION
  return true;
#else
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#endif
}

void pack_vnni(i64 k, i64 n, const bf16* rows, bf16* b_packed) {
  for (i64 r = 0; r < k; ++r)
    for (i64 j = 0; j < n; ++j) b_packed[((j / 16) * (k / 2) + r / 2) * 32 + (j % 16) * 2 + r % 2] = rows[r * n + j];
}

void tile_gemm(i64 iters, i64 m, i64 n, i64 k, const bf16* a, i64 lda, const bf16* b_packed, float* c, i64 ldc) {
  configure_tiles();
  for (i64 it = 0; it < iters; ++it)
    for (i64 i = 0; i < m; i += 32)
      for (i64 j = 0; j < n; j += 32) {
        const bf16* slab = b_packed + (j / 16) * (k / 2) * 32;  // columns [j, j + 16)
        gemm_block(k, a + i * lda, lda, slab, slab + (k / 2) * 32, c + i * ldc + j, ldc);
      }
  _tile_release();
  asm volatile("" ::: "memory");
}

}  // namespace ulysses::bench::amx
