// GEMMs through oneDNN's matmul primitive, row-major like cblas: C[m, n] (+)= op(A) · op(B).
// The bf16 form takes bfloat16 A and B and accumulates and writes float32 C (on AVX512_BF16
// with vdpbf16ps, on AMX with tiles, on AVX-512 oneDNN converts; on AVX2, where oneDNN has no
// bf16 matmul, the inputs are widened to float32 first, exactly); it is the trainer's GEMM
// under --dtype bf16 because it was the fastest library measured for that (docs/perf.md,
// "GEMM libraries"; OpenBLAS 0.3.21 as Debian builds it has no bf16 GEMM). The float32 form is
// here for that comparison.
//
// Threads: oneDNN runs on OpenMP. Called inside a parallel region it runs on the calling
// thread alone (the trainer's layers split rows or columns over threads themselves), outside
// one on all of OpenMP's threads. Each thread keeps its own primitives by shape (creating one
// costs far more than a small GEMM), so calls from several threads at once are safe.
#pragma once

#include <cstdint>
#include <string>

namespace ulysses::kernels {

void onednn_gemm_f32(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                     const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate);
void onednn_gemm_bf16(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a,
                      std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float* c, std::int64_t ldc,
                      bool accumulate);

// The implementation oneDNN picks for a bf16 GEMM of this shape ("brg:avx512_core_bf16",
// "gemm:jit", …): what the reports print beside the rates.
std::string onednn_bf16_implementation(std::int64_t m, std::int64_t n, std::int64_t k);

}  // namespace ulysses::kernels
