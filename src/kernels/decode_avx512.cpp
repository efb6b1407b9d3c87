// The decode kernel's pass for AVX-512: 16-float vectors, 32 registers (16 for the accumulators).
#define DECODE_W 16
#define DECODE_ACC 16
#define DECODE_FN decode_rows_avx512
#include "decode_rows_body.hpp"
