// The AMX bfloat16 ceilings of section [1]: per-thread kernels, timed by the caller (the
// register-resident peak is the library's probe, kernels/peak.hpp).
//
// ceiling_amx.cpp is compiled with -mamx-tile -mamx-bf16 -mavx512f, so it defines no inline
// function or template that another file also instantiates (no std containers, no fmt, no
// timing): the linker keeps one copy of such a function, and an AVX-512 copy would then run
// on CPUs without it. Call these only when kernels::active_isa() == kernels::Isa::amx.
#pragma once

#include <cstdint>

namespace ulysses::bench::amx {

// Linux's per-process permission for the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA)); false when the OS refuses. Idempotent.
bool request_tiles();

// b_packed (k·n elements) = rows [k][n] (row-major bf16) in the VNNI pair layout, one
// contiguous 1 KiB tile per 16 columns × 16 row pairs (as the amx-bf16 engine packs K and V):
// element (r, j) at ((j/16)·(k/2) + r/2)·32 + (j%16)·2 + r%2.
void pack_vnni(std::int64_t k, std::int64_t n, const std::uint16_t* rows, std::uint16_t* b_packed);

// `iters` times c[m][n] (float32, ldc) = a[m][k] (bf16, lda) · b_packed; m, n, k multiples
// of 32. FLOPs = iters · 2·m·n·k.
void tile_gemm(std::int64_t iters, std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a,
               std::int64_t lda, const std::uint16_t* b_packed, float* c, std::int64_t ldc);

}  // namespace ulysses::bench::amx
