// Every implementation of the kernel contract (engine.hpp), by namespace:
//   native    compiled for the library, each file with its own instruction-set flags;
//   emulated  the AVX-512 and AMX sources compiled again without ISA flags (GCC lowers the
//             wide vector types to what the build machine has; AMX through a software tile
//             model), so tests check those paths on CPUs that cannot run them.
#pragma once

#include "engine.hpp"

namespace ulysses::kernels {

namespace native {
extern const GemmEngine blas_f32;   // engine_blas.cpp
extern const VectorOps scalar_vec;  // engine_blas.cpp
extern const GemmEngine avx2_f32;   // engine_simd_avx2.cpp
extern const VectorOps avx2_vec;
extern const GemmEngine avx512_f32;  // engine_simd_avx512.cpp
extern const VectorOps avx512_vec;
extern const GemmEngine avx512_bf16;  // engine_bf16_avx512.cpp (vdpbf16ps: AVX512_BF16)
extern const GemmEngine amx_bf16;     // engine_bf16_amx.cpp
}  // namespace native

namespace emulated {  // only in the test binaries
extern const GemmEngine avx512_f32;
extern const VectorOps avx512_vec;
extern const GemmEngine avx512_bf16;
extern const GemmEngine amx_bf16;
}  // namespace emulated

}  // namespace ulysses::kernels
