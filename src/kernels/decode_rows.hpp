// The decode kernel's inner loop, compiled once per instruction set (decode_rows_body.hpp in
// decode_forward.cpp, decode_avx2.cpp and decode_avx512.cpp) and chosen by the active ISA
// (isa.hpp), as the flash kernels' engines are: one thread's pass over rows [r0, r1) of the
// cache for every query head of the call, unnormalised, merged by LSE in decode_forward.cpp.
#pragma once

#include <cstdint>
#include <vector>

namespace ulysses::kernels {

// Query heads [j, j + n) of the call, all reading KV head kv (an index into k's and v's heads).
struct DecodeRun {
  std::int64_t j, n, kv;
};

// A call's operands as float pointers and element strides (d contiguous).
struct DecodeJob {
  const float *q, *k, *v;
  std::int64_t q_heads, d, q_stride_h, k_stride_s, k_stride_h, v_stride_s, v_stride_h;
  float scale;
  std::vector<DecodeRun> runs;  // every query head in exactly one run
  bool prefetch_block = false;  // each stream's lines asked for a block ahead, not a kilobyte (isa.hpp)
};

// One thread's partial result: acc [q_heads · d] unnormalised, running maximum m and sum l per
// head; the caller sizes it (0, −inf, 0: no row seen), so that no std::vector code is compiled
// with an ISA's flags (a weak symbol the linker could pick for the baseline's callers).
struct DecodePartial {
  std::vector<float> acc, m, l;
};

using DecodeRowsFn = void (*)(const DecodeJob& job, std::int64_t r0, std::int64_t r1, DecodePartial& part);
void decode_rows_portable(const DecodeJob& job, std::int64_t r0, std::int64_t r1, DecodePartial& part);
void decode_rows_avx2(const DecodeJob& job, std::int64_t r0, std::int64_t r1, DecodePartial& part);
void decode_rows_avx512(const DecodeJob& job, std::int64_t r0, std::int64_t r1, DecodePartial& part);

}  // namespace ulysses::kernels
