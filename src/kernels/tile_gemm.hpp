// The two GEMMs of a forward tile, S = α·Q·Kᵀ and O += P·V, at the tile sizes flash attention
// uses (64 query rows × ≤ 256 keys × d). OpenBLAS re-packs both operands on every such call;
// the AVX2+FMA micro-kernels (6×16 register blocks, 12 accumulators) read Q, P and V in place
// and pack only Kᵀ, once per key block. The portable path is OpenBLAS. Dispatch follows
// vexp.hpp (force_isa in tests runs both).
#pragma once

#include <cstdint>

namespace ulysses::kernels {

// Kᵀ packed for the AVX2 path: panels of 16 keys, each [k][16] (zero padded past n keys).
// Floats needed for n keys: round_up(n, 16) · k. Pack a whole head once per call, then slice:
// the panels of keys [j0, …) start at packed + (j0 / 16) · 16 · k (j0 a multiple of 16).
std::int64_t packed_kt_size(std::int64_t n, std::int64_t k);
void pack_kt(const float* kmat, std::int64_t ldk, std::int64_t n, std::int64_t k, float* packed);
bool uses_packed_kt();  // false: the portable path reads K in place and needs no packing

// s[m, n] = alpha · q[m, k] · kᵀ, where kmat is [n, k] (row stride ldk) and `packed` its
// pack_kt image (used by the AVX2 path only; may be null on the portable path).
// Causal trimming: row i only needs keys [0, diag + i + 1); the AVX2 path may leave the scores
// past that unwritten (callers mask them) and skips those keys' zero probabilities in P·V.
// Pass kNoDiagonal when every row sees every key.
constexpr std::int64_t kNoDiagonal = std::int64_t(1) << 62;
void qk_scores(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* q, std::int64_t ldq,
               const float* kmat, std::int64_t ldk, const float* packed, float* s, std::int64_t lds,
               std::int64_t diag = kNoDiagonal);
// o[m, n] += p[m, k] · v[k, n] (row strides ldp, ldv, ldo); p[i, j] must be 0 for j > diag + i.
void pv_accumulate(std::int64_t m, std::int64_t n, std::int64_t k, const float* p, std::int64_t ldp, const float* v,
                   std::int64_t ldv, float* o, std::int64_t ldo, std::int64_t diag = kNoDiagonal);

void qk_scores_avx2(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* q, std::int64_t ldq,
                    const float* packed, float* s, std::int64_t lds, std::int64_t diag);
void pv_accumulate_avx2(std::int64_t m, std::int64_t n, std::int64_t k, const float* p, std::int64_t ldp,
                        const float* v, std::int64_t ldv, float* o, std::int64_t ldo, std::int64_t diag);

}  // namespace ulysses::kernels
