// The kernel contract: what one instruction-set level supplies to the flash attention loops.
//
// flash_forward.cpp and flash_backward.cpp hold the algorithm once (tiles, online softmax,
// masks, scheduling); a level supplies the tile GEMMs for each operand dtype and the float32
// vector ops of the softmax (oneDNN/OpenBLAS style: one contract, several implementations,
// one table per level in isa.cpp, chosen once from CPUID; see isa.hpp).
//
// A GemmEngine computes the three tile GEMMs of flash attention, always accumulating in
// float32, for operands stored in `dtype`:
//   scores:  S[m, n]  = A[m, d] · Bᵀ              (S = Q·Kᵀ forward and backward, dP = dO·Vᵀ)
//   pv:      O[m, d] += P[m, k] · B[k, d]         (O += P·V, dQ += dS·K)
//   pt_b:    C[k, d] += Pᵀ[k, m] · B[m, d]        (dV += Pᵀ·dO, dK += dSᵀ·Q)
// A (scores) and B (pt_b) are read in place from the caller's tensors: rows of d contiguous
// `dtype` elements, `ld` elements apart. The B of scores and pv are a per-(batch, KV head)
// image of K or V made once by pack_bt / pack_b (the keys are reused s/64 times, so the
// packing is paid once). P and dS are float32 (the engine may round them to its dtype:
// bf16 engines do, FlashAttention's contract). The softmax scale is not the GEMMs' business:
// the vector ops apply it (one FMA with the shift), so score tiles are stored as they come
// out of the registers or tiles, without a scaling pass.
#pragma once

#include <cstdint>

#include "ulysses/core/tensor.hpp"

namespace ulysses::kernels {

// Passed as `diag` when every row sees every key. Otherwise row i of a tile sees keys
// [0, diag + i] of it (a causal mask is a prefix); the engine may skip work past it.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 62;

// Key blocks always start at multiples of this (tile sizes are multiples of it).
constexpr std::int64_t kKeyAlign = 64;

struct GemmEngine {
  const char* name;  // "avx512-f32", "amx-bf16", …: what the reports print
  DType dtype;       // of A (scores), B (pt_b) and the packed K/V images

  // Bytes of the packed image of n keys of head_dim d (either packing), and the byte offset
  // of key j0 (a multiple of kKeyAlign) inside it.
  std::int64_t (*packed_bytes)(std::int64_t n, std::int64_t d);
  std::int64_t (*packed_offset)(std::int64_t j0, std::int64_t d);
  // rows: [n][d] of dtype, row stride ld elements. Padding past n is zero.
  void (*pack_bt)(const void* rows, std::int64_t ld, std::int64_t n, std::int64_t d, void* packed);
  void (*pack_b)(const void* rows, std::int64_t ld, std::int64_t n, std::int64_t d, void* packed);

  // s[m, n] = a[m, d] · bᵀ, bt = packed_bt image at key j0 (n <= 256, m <= 64).
  // With a diagonal, scores past it may be left unwritten (the caller masks them).
  void (*scores)(std::int64_t m, std::int64_t n, std::int64_t d, const void* a, std::int64_t lda, const void* bt,
                 float* s, std::int64_t lds, std::int64_t diag);
  // o[m, d] += p[m, k] · b[k, d], b = pack_b image at key j0. p[i, j] == 0 for j > diag + i.
  void (*pv)(std::int64_t m, std::int64_t d, std::int64_t k, const float* p, std::int64_t ldp, const void* b, float* o,
             std::int64_t ldo, std::int64_t diag);
  // c[k, d] += p[m, k]ᵀ · b[m, d]; b rows of dtype, ldb elements apart, read in place.
  // p[i, j] == 0 for j > diag + i.
  void (*pt_b)(std::int64_t k, std::int64_t d, std::int64_t m, const float* p, std::int64_t ldp, const void* b,
               std::int64_t ldb, float* c, std::int64_t ldc, std::int64_t diag);
};

// The float32 vector ops of the softmax.
struct VectorOps {
  // out[i] = exp(min(scale·x[i], shift) − shift), returns Σ out. scale·x[i] is rounded to
  // float first, exactly as row_max rounds it, so the argument is <= 0 (out <= 1: exp never
  // overflows, whatever the magnitudes) and exactly 0 where scale·x[i] is the row max (out = 1).
  // ≤ 2 ulp of exp of the rounded argument; an argument below −87, −inf and NaN included,
  // gives 0.
  float (*exp_shifted_sum)(const float* x, float* out, std::int64_t n, float scale, float shift);
  // max(init, scale·x[0..n)).
  float (*row_max)(const float* x, std::int64_t n, float init, float scale);
  // The softmax's gradient over dP in place: dp[i] = (scale·p[i])·(dp[i] − delta).
  void (*softmax_grad)(const float* p, float* dp, std::int64_t n, float scale, float delta);
};

// One instruction-set level: its float32 engine, its bfloat16 engine (null: bf16 inputs are
// converted to float32 and run on the f32 engine), and its vector ops.
struct KernelLevel {
  const char* name;  // "amx", "avx512", "avx2", "portable" (or "emulated-…" in tests)
  const GemmEngine* f32;
  const GemmEngine* bf16;
  VectorOps vec;
};

}  // namespace ulysses::kernels
