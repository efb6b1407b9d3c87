// The probe loops of peak.cpp, one per instruction set; each file is compiled with its own ISA
// flags and is called only where CPUID says it may run. Each returns a checksum (so the loop is
// kept) after `iters` rounds of kPeakChains independent accumulator updates.
#pragma once

#include <cstdint>

namespace ulysses::kernels::peak_loops {

// 12 chains: enough to hide a 4-cycle FMA latency on two ports (8 in flight) with room left.
inline constexpr int kChains = 12;

float fma_avx2(std::int64_t iters);       // vfmadd231ps ymm: 8 lanes · 2 FLOPs per instruction
float fma_avx512(std::int64_t iters);     // vfmadd231ps zmm: 16 lanes · 2
float dpbf16_avx512(std::int64_t iters);  // vdpbf16ps zmm: 16 lanes · 2 pairs · 2
float tdpbf16_amx(std::int64_t iters);    // 4 × tdpbf16ps: 4 · 16·16·32·2

}  // namespace ulysses::kernels::peak_loops
