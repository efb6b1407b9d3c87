// The register-resident peak of this CPU's arithmetic units, measured: the ceiling that the
// benchmark's kernel and GEMM figures and the trainer's MFU are fractions of. No GEMM, kernel
// or library beats it; what separates them from it is loads, packing and the work around the
// products.
#pragma once

#include <string>

#include "ulysses/core/tensor.hpp"

namespace ulysses::kernels {

enum class PeakUnit {
  f32_fma,   // float32 FMA: AVX-512 (16 lanes) or AVX2 (8 lanes), whichever level is active
  bf16_dot,  // bfloat16 pairs into float32: vdpbf16ps (AVX512_BF16) or AMX tiles (TDPBF16PS)
};

// What measures `unit` on this CPU at the active level ("avx512 vfmadd231ps", "avx512_bf16
// vdpbf16ps", "amx tdpbf16ps"), or "" where it has none (then peak_gflops returns 0).
std::string peak_unit_name(PeakUnit unit);

// The unit that inputs of `dtype` run on at the active level: bf16_dot where the level has a
// bf16 engine, else f32_fma (bf16 converted, or float32): what the MFU of a run is over.
PeakUnit compute_unit(DType dtype);

// GFLOP/s of ONE thread on `unit`: independent accumulator chains that never touch memory,
// enough of them to cover the unit's latency, timed for about `seconds` in all (the best of 7
// windows). Not collective; 0 where the unit is missing.
double peak_gflops(PeakUnit unit, double seconds = 0.02);

}  // namespace ulysses::kernels
