// The decode kernel's pass for any x86-64 (or other) CPU: 8-float GCC vectors, which the compiler
// lowers to the baseline's (two SSE registers each on x86-64). The vector helpers are always
// inlined: no vector crosses a call, so GCC's note that a 32-byte vector argument changes the ABI
// without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#define DECODE_W 8
#define DECODE_ACC 8
#define DECODE_FN decode_rows_portable
#include "decode_rows_body.hpp"
