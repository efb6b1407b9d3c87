// The float32 engine for AVX2 + FMA (compiled with -mavx2 -mfma; used only when CPUID says so).
#define ULYSSES_SIMD_LANES 8
#define ULYSSES_SIMD_NV 2
#define ULYSSES_KERNEL_NS native
#define ULYSSES_SIMD_NAME "avx2"
#define ULYSSES_SIMD_ENGINE avx2_f32
#define ULYSSES_SIMD_VEC avx2_vec
#include "simd_engine.hpp"
