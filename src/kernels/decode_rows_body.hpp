// The body of decode_rows.hpp's pass, included once per instruction set with DECODE_W (floats a
// vector), DECODE_ACC (vector registers the p·v accumulators may take) and DECODE_FN (the name
// it defines) set; everything else has internal linkage, so each ISA's object keeps its own.
//
// The order: per KV head, its rows in blocks of kBlock, every query head reading that KV head
// over the block before the next block. The cache holds each KV head's rows contiguously
// (kv_cache.hpp: [h_kv, s, d]), so each thread reads two sequential streams per KV head, K and
// V. The memory runs at its rate only while the loop keeps asking for them: a pass that read a
// K block for one query head and then served the group's other heads from L1 left the memory
// idle meanwhile (compute and read time added: 0.46 of the read rate under GQA, docs/perf.md
// v28). So each K row is loaded once for the group's heads (their dots of W/G rows × G heads
// summed by one tree of shuffles into one vector of scores), and the p·v accumulators of up to
// four heads stay in registers over the block, each V vector loaded once for them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "decode_rows.hpp"
#include "exp_poly.hpp"

namespace ulysses::kernels {
namespace {

constexpr int W = DECODE_W;
// Rows a block: a multiple of W. The K and V streams are read in turns of a block: 64-row blocks
// (16 KiB a head at d = 64) read DRAM at 0.6–0.8 of the rate 32-row ones did here (MHA).
constexpr std::int64_t kBlock = 32;
typedef float vf __attribute__((vector_size(W * 4)));
typedef std::uint32_t vu __attribute__((vector_size(W * 4)));

[[gnu::always_inline]] inline vf load(const float* p) {
  vf r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
[[gnu::always_inline]] inline void store(float* p, const vf& x) { std::memcpy(p, &x, sizeof x); }

// e^x for x <= 0, the kernels' own exp (simd_engine.hpp's vexp): 2^k · e^r, k = round(x · log2 e)
// by the 1.5·2^23 rounding constant, r = x − k·ln 2 in two parts, e^r by exp_poly.hpp (2e-9
// relative). x is clamped at −87 so 2^k stays a normal float.
[[gnu::always_inline]] inline vf expv(const vf& in) {
  const vf x = in > -87.0f ? in : vf{} - 87.0f;
  const vf km = x * 1.44269504088896341f + 12582912.0f;
  const vf k = km - 12582912.0f;
  const vf r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  return exp_poly(r) * (vf)(((vu)km << 23) + (127u << 23));
}

// How far ahead of the row it reads each stream (K in scores_of, V in pv_of) asks for its lines
// (prefetcht0). The pass does about 8 cycles of work per 128-byte row at d = 32: a core's
// out-of-order window then holds a few rows' loads, not the dozens of lines in flight that
// DRAM's latency needs, and the hardware prefetchers restart at every 4 KiB page, one block of K
// or V at d = 32. How far ahead depends on the core (isa.hpp's decode_prefetch): on Intel
// Sapphire Rapids, reading 16 GB/s a core, a kilobyte ahead (8 rows at d = 32, 2 at 128) measured
// best of 0.5–16 KiB at 32k context (docs/perf.md v38): a block ahead ran slower there, the lines
// arriving before they were needed and, at d = 128, pushing the block being read out of L1. On
// AMD Zen 5, reading 40 GB/s a core, a block ahead (the same row of the stream's next block)
// measured best of 1–32 KiB where a KV head serves four query heads or more: a kilobyte is 26 ns
// of its read, less than one DRAM latency, and the pass at GQA 8/2 d = 128 reached 0.68 of the
// read with it against 0.86 a block ahead (half a block 0.71, two blocks 0.83; docs/perf.md v50).
constexpr std::int64_t kPrefetchBytes = 1024;

// Every line of the row a kilobyte or a block further on in the stream (the next block's rows
// near a block's end: each KV head's rows are contiguous). Past the end it asks for lines nobody
// reads, a kilobyte or a block a stream and call; a prefetch never faults.
template <int NV>
[[gnu::always_inline]] inline void prefetch_ahead(const DecodeJob& job, const float* row, std::int64_t stride) {
  constexpr std::int64_t kilobyte = std::max<std::int64_t>(1, kPrefetchBytes / (NV * W * 4));
  const float* next = row + (job.prefetch_block ? kBlock : kilobyte) * stride;
  for (int c = 0; c < NV * W; c += 64 / 4) __builtin_prefetch(next + c, 0, 3);
}

// x's lanes folded by op in log2(W) shuffles: every lane ends with the fold of all of them. A
// scalar loop over the lanes is a chain of W dependent maxes or adds (64 cycles at W = 16), and
// softmax_of ran two of them per head and block (the pass in L2: 5–12 % faster folded).
template <class Op>
[[gnu::always_inline]] inline float fold(vf x, Op op) {
#if DECODE_W == 16
  x = op(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
#else
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6));
#endif
  return x[0];
}
[[gnu::always_inline]] inline vf vmax(const vf& a, const vf& b) { return a > b ? a : b; }
[[gnu::always_inline]] inline vf vadd(const vf& a, const vf& b) { return a + b; }

// Lane i of the result is the sum of x[i]'s lanes: a tree of shuffled adds (W − 1 adds in all).
[[gnu::always_inline]] inline vf lane_sums(const vf (&x)[W]) {
#if DECODE_W == 16
  vf y[8], z[4], u[2];
  for (int i = 0; i < 8; ++i)
    y[i] =
        __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
        __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    z[i] = __builtin_shufflevector(y[2 * i], y[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(y[2 * i], y[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    u[i] = __builtin_shufflevector(z[2 * i], z[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(z[2 * i], z[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(u[0], u[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(u[0], u[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
  vf y[4], z[2];
  for (int i = 0; i < 4; ++i)
    y[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    z[i] = __builtin_shufflevector(y[2 * i], y[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(y[2 * i], y[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

// Query heads [j, j + G) over the block's n rows at k (row stride ks): scores[g · kBlock + t],
// scaled. Each K row is loaded once for the G heads (their q held in G·NV registers), so the K
// stream is read evenly through the whole pass; the W dots of R = W/G rows × G heads are summed
// by one tree (lane g·R + r: head g, row r). Rows past n repeat row n − 1: their scores land in
// the buffer's padding and are never used.
template <int G, int NV>
[[gnu::always_inline]] inline void scores_of(const DecodeJob& job, std::int64_t j, const float* k, std::int64_t n,
                                             float* scores) {
  constexpr int R = W / G;
  vf q[G][NV];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NV; ++c) q[g][c] = load(job.q + (j + g) * job.q_stride_h + c * W);
  for (std::int64_t t = 0; t < n; t += R) {
    vf dots[W];
    for (int r = 0; r < R; ++r) {
      const float* row = k + std::min(t + r, n - 1) * job.k_stride_s;
      prefetch_ahead<NV>(job, k + (t + r) * job.k_stride_s, job.k_stride_s);
      for (int g = 0; g < G; ++g) {
        vf a = q[g][0] * load(row);
        for (int c = 1; c < NV; ++c) a += q[g][c] * load(row + c * W);
        dots[g * R + r] = a;
      }
    }
    alignas(64) float s[W];
    store(s, lane_sums(dots) * job.scale);
    for (int g = 0; g < G; ++g) std::memcpy(scores + g * kBlock + t, s + g * R, R * sizeof(float));
  }
}

// Heads [j, j + count): the running maximum, sum and accumulator brought up to the block's n
// scores, and the scores replaced by their weights e^(s − m), a vector at a time (the lanes past
// n of the last vector are computed and not kept).
inline void softmax_of(const DecodeJob& job, std::int64_t j, int count, std::int64_t n, DecodePartial& part,
                       float* scores) {
  const std::int64_t whole = n / W * W;
  for (int g = 0; g < count; ++g) {
    float* s = scores + g * kBlock;
    const std::size_t i = std::size_t(j + g);
    vf m = vf{} + part.m[i];
    for (std::int64_t t = 0; t < whole; t += W) m = m > load(s + t) ? m : load(s + t);
    float mx = fold(m, vmax);
    for (std::int64_t t = whole; t < n; ++t) mx = std::max(mx, s[t]);
    const float rescale = std::exp(part.m[i] - mx);  // 0 on the first block (m = −inf)
    float* acc = part.acc.data() + i * std::size_t(job.d);
    for (std::int64_t c = 0; c < job.d; ++c) acc[c] *= rescale;
    vf l = {};
    for (std::int64_t t = 0; t < whole; t += W) {
      const vf e = expv(load(s + t) - mx);
      store(s + t, e);
      l += e;
    }
    float sum = fold(l, vadd);
    if (whole < n) {
      const vf e = expv(load(s + whole) - mx);
      store(s + whole, e);
      for (std::int64_t t = whole; t < n; ++t) sum += e[t - whole];
    }
    part.m[i] = mx;
    part.l[i] = part.l[i] * rescale + sum;
  }
}

// acc of heads [j, j + G) += Σ_t w_t · v_t over the block's n rows at v (row stride vs): the G·NV
// accumulators in registers for the whole block, each V vector loaded once for the G heads.
template <int G, int NV, bool kOneLoad = false>
[[gnu::always_inline]] inline void pv_of(const DecodeJob& job, std::int64_t j, const float* v, std::int64_t n,
                                         const float* scores, DecodePartial& part) {
  float* a = part.acc.data() + j * job.d;
  vf acc[G][NV];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NV; ++c) acc[g][c] = load(a + g * job.d + c * W);
  for (std::int64_t t = 0; t < n; ++t) {
    const float* row = v + t * job.v_stride_s;
    prefetch_ahead<NV>(job, row, job.v_stride_s);
    vf x[NV];
    for (int c = 0; c < NV; ++c) {
      x[c] = load(row + c * W);
#if defined(__AVX__)
      // One load a vector for all G heads where asked (heads_pairs at 3–4 pairs): left to itself
      // the compiler folds a load into each head's FMA, G loads a vector, and at 8 heads a KV
      // head the load ports (shared with every pair's prefetches) set the pace. Elsewhere the
      // folded loads measured no slower (one head: a load and an FMA in one instruction).
      if constexpr (kOneLoad) asm("" : "+v"(x[c]));
#endif
    }
    for (int g = 0; g < G; ++g) {
      const vf w = vf{} + scores[g * kBlock + t];
      for (int c = 0; c < NV; ++c) acc[g][c] += w * x[c];
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NV; ++c) store(a + g * job.d + c * W, acc[g][c]);
}

template <int G, int NV>
void heads_block(const DecodeJob& job, std::int64_t j, const float* k, const float* v, std::int64_t n,
                 DecodePartial& part, float* scores) {
  scores_of<G, NV>(job, j, k, n, scores);
  softmax_of(job, j, G, n, part, scores);
  pv_of<G, NV>(job, j, v, n, scores, part);
}

// Four to eight heads of one KV head whose p·v accumulators (4·NV vectors) pass the registers'
// budget and a pair's fit (d = 128 on AVX-512): every pair's scores, then every pair's p·v. The
// later pairs read the block's K and V from L1 either way; pair after pair (scores, p·v, scores,
// p·v) they re-read K after V's 16 KiB had streamed through L1 behind it, here each re-read follows
// its own stream's, so the block's lines are still there (the pass in L2: 3–7 % faster; in
// `generate` 0.79 of the read against 0.76, docs/perf.md v44). Up to four pairs: a group of 8
// (Llama-3-70B) taken as two sets of two pairs re-read the block's 32 KiB after the next block's
// 32 KiB of prefetches had passed through the 48 KiB L1 (0.64–0.68 of the read → 0.75–0.79 as
// four pairs, docs/perf.md v53). Every pair prefetches: asked for by the first pair alone, the next
// block's lines arrived at 0.5 of the read. Each head's scores, softmax and p·v are the same
// operations in the same order: the same bits. Only where a block's K and V fill most of L1: at
// d = 32 (AVX2, 8 KiB a block) the pairs measured no faster.
constexpr std::int64_t kL1Bytes = 48 << 10;  // the L1 data cache of this project's x86 hosts
constexpr int kMaxPairs = 4;
template <int NV>
void heads_pairs(const DecodeJob& job, std::int64_t j, int pairs, const float* k, const float* v, std::int64_t n,
                 DecodePartial& part, float* scores) {
  for (int p = 0; p < pairs; ++p) scores_of<2, NV>(job, j + 2 * p, k, n, scores + 2 * p * kBlock);
  softmax_of(job, j, 2 * pairs, n, part, scores);
  for (int p = 0; p < pairs; ++p)
    if (pairs > 2)
      pv_of<2, NV, true>(job, j + 2 * p, v, n, scores + 2 * p * kBlock, part);
    else
      pv_of<2, NV>(job, j + 2 * p, v, n, scores + 2 * p * kBlock, part);
}

// One head of any d (not a whole number of vectors): a float at a time.
void head_block_any(const DecodeJob& job, std::int64_t j, const float* k, const float* v, std::int64_t n,
                    DecodePartial& part, float* scores) {
  const float* q = job.q + j * job.q_stride_h;
  for (std::int64_t t = 0; t < n; ++t) {
    float s = 0;
    for (std::int64_t c = 0; c < job.d; ++c) s += q[c] * k[t * job.k_stride_s + c];
    scores[t] = s * job.scale;
  }
  softmax_of(job, j, 1, n, part, scores);
  float* a = part.acc.data() + j * job.d;
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t c = 0; c < job.d; ++c) a[c] += scores[t] * v[t * job.v_stride_s + c];
}

template <int G>
void heads_block_g(int nv, const DecodeJob& job, std::int64_t j, const float* k, const float* v, std::int64_t n,
                   DecodePartial& part, float* scores) {
  switch (nv) {
    case 1: return heads_block<G, 1>(job, j, k, v, n, part, scores);
    case 2: return heads_block<G, 2>(job, j, k, v, n, part, scores);
    case 4: return heads_block<G, 4>(job, j, k, v, n, part, scores);
    case 8: return heads_block<G, 8>(job, j, k, v, n, part, scores);
    default: return heads_block<G, 16>(job, j, k, v, n, part, scores);
  }
}

// Vectors a row of d floats takes when the kernels' templates cover it (1, 2, 4, 8 or 16 whole
// vectors), else 0: the float-at-a-time head.
int vectors_of(std::int64_t d) {
  for (const int nv : {1, 2, 4, 8, 16})
    if (d == std::int64_t(nv) * W) return nv;
  return 0;
}

// Heads [j, end) on one KV head over one block: as many at a time (4, 2 or 1) as the
// accumulators' registers hold, four to eight as pairs (heads_pairs) where only a pair's fit. Returns
// nothing; part and scores updated.
void run_block(const DecodeJob& job, int nv, std::int64_t j, std::int64_t end, const float* k, const float* v,
               std::int64_t n, DecodePartial& part, float* scores) {
  while (j < end) {
    if (nv == 0) {
      head_block_any(job, j++, k, v, n, part, scores);
      continue;
    }
    if (end - j >= 4 && nv == DECODE_ACC / 2 && 2 * kBlock * job.d * 4 > kL1Bytes / 2) {
      const int pairs = int(std::min<std::int64_t>(kMaxPairs, (end - j) / 2));
      heads_pairs<DECODE_ACC / 2>(job, j, pairs, k, v, n, part, scores);
      j += 2 * pairs;
      continue;
    }
    const int g = end - j >= 4 && 4 * nv <= DECODE_ACC ? 4 : end - j >= 2 && 2 * nv <= DECODE_ACC ? 2 : 1;
    if (g == 4) heads_block_g<4>(nv, job, j, k, v, n, part, scores);
    if (g == 2) heads_block_g<2>(nv, job, j, k, v, n, part, scores);
    if (g == 1) heads_block_g<1>(nv, job, j, k, v, n, part, scores);
    j += g;
  }
}

// Rows from a KV head's row r0 to the end of its block when blocks lie on a kBlock-row grid
// counted from the tensor's first row (head 0, row 0), not from each thread's r0: a cache with
// capacity for 32784 tokens starts its head 1 half a 4 KiB page in, and blocks counted from the
// head would each straddle two pages (docs/perf.md v38); the allocator's large blocks start on a
// page, so the tensor's grid is the memory's. From the strides, not the address: the same blocks,
// and so the same bits, wherever the tensor lives (tests/test_device_ops.cpp). Rows not packed (a
// stride past d) keep kBlock: their blocks are not one run of memory anyway.
std::int64_t first_block(const DecodeJob& job, std::int64_t kv, std::int64_t r0) {
  if (job.k_stride_s != job.d || job.k_stride_h % job.k_stride_s != 0) return kBlock;
  return kBlock - (kv * (job.k_stride_h / job.k_stride_s) + r0) % kBlock;
}

}  // namespace

void DECODE_FN(const DecodeJob& job, std::int64_t r0, std::int64_t r1, DecodePartial& part) {
  alignas(64) float scores[2 * kMaxPairs * kBlock] = {};
  const int nv = vectors_of(job.d);
  for (const DecodeRun& run : job.runs) {  // per KV head: its K and V rows, each streamed once
    const float *k = job.k + run.kv * job.k_stride_h, *v = job.v + run.kv * job.v_stride_h;
    for (std::int64_t t = r0, n = first_block(job, run.kv, r0); t < r1; t += n, n = kBlock) {
      n = std::min(n, r1 - t);
      run_block(job, nv, run.j, run.j + run.n, k + t * job.k_stride_s, v + t * job.v_stride_s, n, part, scores);
    }
  }
}

}  // namespace ulysses::kernels
