// The decode kernel's pass for AVX2 + FMA: 8-float vectors, 16 registers (8 for the accumulators).
#define DECODE_W 8
#define DECODE_ACC 8
#define DECODE_FN decode_rows_avx2
#include "decode_rows_body.hpp"
