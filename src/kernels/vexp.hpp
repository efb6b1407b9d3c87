// Vectorised exp for the softmax: out[i] = exp(x[i] - shift), returning the sum of out.
//
// Range reduction e^x = 2^n · e^r with |r| <= ln2/2, a degree-6 polynomial for e^r
// (≤ 2 ulp against std::exp on [-87, 88]); anything below -87 (including -inf, the masked
// scores) gives exactly 0, never NaN. Two implementations with identical arithmetic: a
// portable one and an AVX2+FMA one chosen at start-up when the CPU has it.
#pragma once

#include <cstdint>

namespace ulysses::kernels {

enum class Isa { portable, avx2 };

Isa active_isa();
void force_isa(Isa isa);  // tests only: run the other path; ignored if the CPU lacks AVX2
const char* to_string(Isa isa);

float exp_shifted_sum(const float* x, float* out, std::int64_t n, float shift);

// max(init, x[0..n)) — the softmax's running row max, vectorised like the exp.
float row_max(const float* x, std::int64_t n, float init);
float row_max_portable(const float* x, std::int64_t n, float init);
float row_max_avx2(const float* x, std::int64_t n, float init);

float exp_shifted_sum_portable(const float* x, float* out, std::int64_t n, float shift);
float exp_shifted_sum_avx2(const float* x, float* out, std::int64_t n, float shift);

}  // namespace ulysses::kernels
