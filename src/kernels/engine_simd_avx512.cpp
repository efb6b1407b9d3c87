// The float32 engine for AVX-512 (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// -mfma; used only when CPUID and the OS say so). The tests compile this file again with
// -DULYSSES_KERNEL_NS=emulated and no ISA flags.
#define ULYSSES_SIMD_LANES 16
#define ULYSSES_SIMD_NV 4
#ifndef ULYSSES_KERNEL_NS
#define ULYSSES_KERNEL_NS native
#endif
#define ULYSSES_SIMD_NAME "avx512"
#define ULYSSES_SIMD_ENGINE avx512_f32
#define ULYSSES_SIMD_VEC avx512_vec
#include "simd_engine.hpp"
